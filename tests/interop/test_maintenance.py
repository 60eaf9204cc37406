"""Table maintenance procedures (CALL lake.system.*), checked through pyiceberg and DuckDB:
compaction after many small checkpoints, expiry with time travel to what is kept, old
partition specs compacted into the current one, a rewrite racing pyiceberg appends, and a
running job's exactly-once across compaction, expiry and kill -9."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pyarrow as pa

from conftest import SqlLake, run_floe_in
from test_routing import check_tables, kill_runs, run_to_end, write_job

ORDERS = """
CREATE SCHEMA IF NOT EXISTS {catalog}.shop;
CREATE TABLE IF NOT EXISTS {catalog}.shop.orders (order_id BIGINT NOT NULL, price DOUBLE,
  region STRING) PARTITIONED BY (region);
CREATE SOURCE gen WITH ('connector' = 'datagen', 'profile' = 'orders',
  'number-of-rows' = '{rows}', 'rows-per-second' = '{rate}');
SET 'pipeline.name' = 'orders'; SET 'checkpoint.interval' = '{interval}';
INSERT INTO {catalog}.shop.orders SELECT order_id, price, region FROM gen;
"""


def orders_job(lake: SqlLake, workdir: Path, rows: int, rate: int, interval: str) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    script = workdir / "orders.sql"
    script.write_text(
        lake.ddl()
        + ";\n"
        + ORDERS.format(catalog=lake.name, rows=rows, rate=rate, interval=interval)
    )
    return script


def call(floe_bin: Path, lake: SqlLake, cwd: Path, sql: str, env: dict | None = None) -> dict:
    """Run one CALL in its own floe process; its one result row."""
    if env is None:
        rows = run_floe_in(floe_bin, cwd, lake.ddl(), sql)
    else:
        done = subprocess.run(
            [str(floe_bin), "-q", "--format", "ndjson", "-c", lake.ddl(), "-c", sql],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert done.returncode == 0, f"{sql} failed:\n{done.stdout}\n{done.stderr}"
        rows = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert len(rows) == 1, rows
    return rows[0]


def order_ids(table) -> list[int]:
    return sorted(table.scan().to_arrow().column("order_id").to_pylist())


def data_files_on_disk(lake: SqlLake, table: str) -> int:
    return sum(1 for _ in (lake.warehouse / "shop" / table / "data").rglob("*.parquet"))


def test_many_small_checkpoints_compacted_then_expired(
    floe_bin: Path, lake: SqlLake, tmp_path: Path, duck
):
    rows = 3_000
    workdir = tmp_path / "work"
    run_to_end(floe_bin, workdir, orders_job(lake, workdir, rows, rate=200, interval="50ms"))
    catalog = lake.pyiceberg()
    table = catalog.load_table("shop.orders")
    snapshots_before = len(table.snapshots())
    files_before = len(table.inspect.files())
    assert snapshots_before >= 150, f"only {snapshots_before} checkpoints committed"
    assert files_before >= 300, files_before
    ids_before = order_ids(table)
    assert ids_before == list(range(1, rows + 1))
    eu_files_before = len(list(table.scan(row_filter="region = 'eu'").plan_files()))

    done = call(floe_bin, lake, workdir, "CALL lake.system.rewrite_data_files(table => 'shop.orders')")
    assert done["rewritten_data_files_count"] == files_before, done
    partitions = len({r["partition"]["region"] for r in table.inspect.files().to_pylist()})
    assert done["added_data_files_count"] == partitions, done
    assert done["rewritten_partitions_count"] == partitions, done

    table = catalog.load_table("shop.orders")
    assert table.current_snapshot().summary.operation.value == "replace"
    assert order_ids(table) == ids_before
    assert len(table.inspect.files()) == partitions
    assert len(list(table.scan(row_filter="region = 'eu'").plan_files())) == 1 < eu_files_before
    loc = table.metadata_location
    (n, total) = duck.execute(
        f"SELECT count(*), sum(order_id) FROM iceberg_scan('{loc}')"
    ).fetchone()
    assert (n, total) == (rows, rows * (rows + 1) // 2)
    # The job's exactly-once mark is still the table's (a restart resumes, adds nothing).
    run_to_end(floe_bin, workdir, workdir / "orders.sql")
    assert order_ids(catalog.load_table("shop.orders")) == ids_before

    # A second compaction finds nothing to do.
    again = call(floe_bin, lake, workdir, "CALL lake.system.rewrite_data_files('shop.orders')")
    assert again["rewritten_data_files_count"] == 0, again

    manifests = call(floe_bin, lake, workdir, "CALL lake.system.rewrite_manifests('shop.orders')")
    assert manifests["added_manifests_count"] == 1, manifests

    compacted = catalog.load_table("shop.orders").current_snapshot().snapshot_id
    run_floe_in(floe_bin, workdir, lake.ddl(), "INSERT INTO lake.shop.orders VALUES (0, 1.0, 'eu')")
    on_disk_before = data_files_on_disk(lake, "orders")
    assert on_disk_before >= files_before
    snapshots = len(catalog.load_table("shop.orders").snapshots())
    expired = call(
        floe_bin,
        lake,
        workdir,
        "CALL lake.system.expire_snapshots(table => 'shop.orders', older_than => now(), "
        "retain_last => 2)",
    )
    table = catalog.load_table("shop.orders")
    assert compacted in {s.snapshot_id for s in table.snapshots()}
    assert len(table.snapshots()) == 2
    assert expired["expired_snapshots_count"] == snapshots - 2, expired
    # Kept: the manifest rewrite (holding the compacted files) and the insert after it;
    # every small file is gone from disk.
    assert expired["deleted_data_files_count"] == files_before, expired
    assert data_files_on_disk(lake, "orders") == partitions + 1
    assert order_ids(table) == [0] + ids_before
    travelled = table.scan(snapshot_id=compacted).to_arrow()
    assert sorted(travelled.column("order_id").to_pylist()) == ids_before
    floe_rows = run_floe_in(
        floe_bin,
        workdir,
        lake.ddl(),
        f"SELECT count(*) AS n FROM lake.shop.orders FOR VERSION AS OF {compacted}",
    )
    assert floe_rows == [{"n": rows}]
    (n,) = duck.execute(f"SELECT count(*) FROM iceberg_scan('{table.metadata_location}')").fetchone()
    assert n == rows + 1


def test_old_partition_specs_compact_into_the_current_one(
    floe_bin: Path, lake: SqlLake, tmp_path: Path, duck
):
    workdir = tmp_path / "work"
    run_to_end(floe_bin, workdir, write_job(lake, workdir, rate=200_000, interval="200ms"))
    catalog = lake.pyiceberg()
    table = catalog.load_table("analytics.page_view_events")
    current = table.spec().spec_id
    specs = {f["spec_id"] for f in table.inspect.files().to_pylist()}
    assert len(specs) == 2, specs
    done = call(
        floe_bin,
        lake,
        workdir,
        "CALL lake.system.rewrite_data_files(table => 'analytics.page_view_events', "
        "min_input_files => 100)",
    )
    assert done["rewritten_data_files_count"] > 0, done
    table = catalog.load_table("analytics.page_view_events")
    assert {f["spec_id"] for f in table.inspect.files().to_pylist()} == {current}
    check_tables(lake, duck)
    # floe sees the same through its own metadata table.
    spec_ids = run_floe_in(
        floe_bin,
        workdir,
        lake.ddl(),
        'SELECT DISTINCT spec_id FROM lake.analytics."page_view_events$files"',
    )
    assert spec_ids == [{"spec_id": current}]


def test_a_rewrite_racing_pyiceberg_appends_loses_no_rows(
    floe_bin: Path, lake: SqlLake, tmp_path: Path
):
    workdir = tmp_path / "work"
    workdir.mkdir()
    run_floe_in(
        floe_bin,
        workdir,
        lake.ddl(),
        "CREATE SCHEMA lake.shop",
        "CREATE TABLE lake.shop.t (id BIGINT, part STRING) PARTITIONED BY (part)",
        *[f"INSERT INTO lake.shop.t VALUES ({i}, 'p{i % 2}')" for i in range(1, 21)],
    )
    catalog = lake.pyiceberg()
    # The rewrite pauses before its commit; pyiceberg appends meanwhile, so floe's first
    # commit loses and it prepares again on the table with the appends.
    env = {**os.environ, "FLOE_PAUSE": "maintenance-commit:3000"}
    proc = subprocess.Popen(
        [str(floe_bin), "-q", "--format", "ndjson", "-c", lake.ddl(), "-c",
         "CALL lake.system.rewrite_data_files(table => 'shop.t', min_input_files => 2)"],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    seen = []
    while not seen or "paused at maintenance-commit" not in seen[-1]:
        line = proc.stderr.readline()
        assert line, f"floe did not pause before its commit: {seen}"
        seen.append(line)
    appended = []
    for i in range(101, 106):
        table = catalog.load_table("shop.t")
        table.append(pa.table({"id": pa.array([i], pa.int64()), "part": [f"p{i % 2}"]}))
        appended.append(i)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, f"{out}\n{err}"
    table = catalog.load_table("shop.t")
    ids = sorted(table.scan().to_arrow().column("id").to_pylist())
    assert ids == list(range(1, 21)) + appended
    replace = table.current_snapshot()
    assert replace.summary.operation.value == "replace"
    parent = table.snapshot_by_id(replace.parent_snapshot_id)
    assert parent.summary.operation.value == "append"
    assert parent.summary["added-records"] == "1", "the rewrite was committed after the appends"
    # The appended files are kept as they are: 2 compacted files and 5 appended.
    assert len(table.inspect.files()) == 2 + len(appended)


def test_exactly_once_across_compaction_expiry_and_kills(
    floe_bin: Path, lake: SqlLake, tmp_path: Path
):
    rows = 40_000
    workdir = tmp_path / "work"
    script = orders_job(lake, workdir, rows, rate=4_000, interval="100ms")
    stop = threading.Event()
    maintained = []
    errors = []

    def maintain():
        # Compaction and expiry against the running job, from another process.
        while not stop.is_set():
            for sql in (
                "CALL lake.system.rewrite_data_files(table => 'shop.orders', min_input_files => 2)",
                "CALL lake.system.expire_snapshots(table => 'shop.orders', older_than => now(), "
                "retain_last => 2)",
            ):
                try:
                    maintained.append(call(floe_bin, lake, workdir, sql))
                except AssertionError as e:
                    # Until the job's first run creates the table.
                    if "does not exist" not in str(e):
                        errors.append(str(e))
            time.sleep(0.3)

    worker = threading.Thread(target=maintain)
    worker.start()
    try:
        kill_runs(floe_bin, workdir, script, runs=4, after=(1.0, 2.0))
        run_to_end(floe_bin, workdir, script)
    finally:
        stop.set()
        worker.join()
    assert not errors, errors[0]
    assert any(m.get("rewritten_data_files_count", 0) > 0 for m in maintained), maintained
    assert any(m.get("expired_snapshots_count", 0) > 0 for m in maintained), maintained
    table = lake.pyiceberg().load_table("shop.orders")
    assert order_ids(table) == list(range(1, rows + 1))
