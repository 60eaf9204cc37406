#!/usr/bin/env bash
# Runs every test of floe, installing and starting what the tests need (SeaweedFS,
# PostgreSQL and the tansu Kafka broker, see scripts/test-env.sh):
#   1. cargo fmt --check, cargo clippy (-D warnings) and cargo doc (links resolve)
#   2. cargo test: unit tests, CLI tests (tests/cli.rs) and the sqllogictest files
#   3. every script under sql/, each in a fresh folder (after seeding the Kafka topic that
#      sql/kafka.sql reads and the Kinesis stream that sql/kinesis.sql reads)
#   4. interop tests (tests/interop): pyiceberg and DuckDB read what floe writes, floe reads
#      what pyiceberg writes, the REST catalog of a SeaweedFS server on 127.0.0.1, the SQL
#      catalog on a PostgreSQL server on 127.0.0.1, the Kafka source against tansu and the
#      Kinesis source against kinesalite
#   5. REPL tests (tests/repl): the interactive shell in a pseudo-terminal (pexpect), run by
#      the same pytest invocation as 4
# Servers are stopped on exit. Set CARGO_TARGET_DIR to reuse a build cache.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
export CARGO_TARGET_DIR="$TARGET"

step() { printf '\n==> %s\n' "$*"; }

step "installing the test environment (Python venv with pyiceberg, DuckDB, boto3, fastavro and moto, SeaweedFS, PostgreSQL, tansu, kinesalite)"
scripts/test-env.sh install
scripts/test-env.sh start
trap 'scripts/test-env.sh stop' EXIT
eval "$(scripts/test-env.sh env)"

step "cargo fmt --check"
cargo fmt --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings

step "cargo doc (every doc link resolves)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --quiet

step "cargo test (unit, CLI, sqllogictest)"
cargo test

FLOE_BIN="$TARGET/debug/floe"
step "seeding the Kafka topics that sql/kafka.sql and sql/avro.sql read"
"$FLOE_TEST_PYTHON" scripts/kafka-seed.py --bootstrap "$FLOE_KAFKA"
"$FLOE_TEST_PYTHON" scripts/avro-seed.py --bootstrap "$FLOE_KAFKA" --registry "$FLOE_SCHEMA_REGISTRY"

step "sql/*.sql scripts"
"$FLOE_TEST_PYTHON" scripts/seed-kinesis.py
for script in sql/*.sql; do
  # Each script runs in a fresh folder holding a copy of sql/ (scripts name their data
  # files relative to the repository root, as a user runs them).
  work="$(mktemp -d)"
  cp -r sql "$work/sql"
  echo "--- $script"
  if ! (cd "$work" && "$FLOE_BIN" -q -f "$script" >"$work/out.txt" 2>"$work/err.txt"); then
    cat "$work/out.txt" "$work/err.txt"
    echo "FAILED: $script"
    exit 1
  fi
  rm -rf "$work"
done

step "interop tests (pyiceberg, DuckDB, REST catalog, PostgreSQL catalog, Kafka, Kinesis) and REPL tests (pexpect)"
FLOE_BIN="$FLOE_BIN" "$FLOE_TEST_PYTHON" -m pytest -p no:cacheprovider -q tests/interop tests/repl
