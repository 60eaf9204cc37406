#!/usr/bin/env bash
# Runs every test of floe, installing and starting what the tests need:
#   1. cargo fmt --check and cargo clippy (-D warnings)
#   2. cargo test: unit tests, CLI tests (tests/cli.rs) and the sqllogictest files
#   3. every script under sql/, each in a fresh folder
#   4. interop tests (tests/interop): pyiceberg and DuckDB read what floe writes, floe reads
#      what pyiceberg writes, and the REST catalog of a SeaweedFS server on 127.0.0.1
# Servers are stopped on exit. Set CARGO_TARGET_DIR to reuse a build cache.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
export CARGO_TARGET_DIR="$TARGET"

step() { printf '\n==> %s\n' "$*"; }

step "installing the test environment (Python venv with pyiceberg and DuckDB, SeaweedFS)"
scripts/test-env.sh install
scripts/test-env.sh start
trap 'scripts/test-env.sh stop' EXIT
eval "$(scripts/test-env.sh env)"

step "cargo fmt --check"
cargo fmt --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings

step "cargo test (unit, CLI, sqllogictest)"
cargo test --all-targets

FLOE_BIN="$TARGET/debug/floe"
step "sql/*.sql scripts"
for script in sql/*.sql; do
  work="$(mktemp -d)"
  echo "--- $script"
  if ! (cd "$work" && "$FLOE_BIN" -q -f "$ROOT/$script" >"$work/out.txt" 2>"$work/err.txt"); then
    cat "$work/out.txt" "$work/err.txt"
    echo "FAILED: $script"
    exit 1
  fi
  rm -rf "$work"
done

step "interop tests (pyiceberg, DuckDB, REST catalog)"
FLOE_BIN="$FLOE_BIN" "$FLOE_TEST_PYTHON" -m pytest -p no:cacheprovider -q tests/interop
