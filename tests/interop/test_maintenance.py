"""Table maintenance procedures (CALL lake.system.*), checked through pyiceberg and DuckDB:
compaction after many small checkpoints, expiry with time travel to what is kept, old
partition specs compacted into the current one, a rewrite racing pyiceberg appends, and a
running job's exactly-once across compaction, expiry and kill -9."""

from __future__ import annotations

import json
import os
import random
import subprocess
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from conftest import SqlLake, paused_before_commit, run_floe_in
from test_routing import check_tables, kill_runs, run_script, run_to_end, write_job

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


def crash_at(floe_bin: Path, workdir: Path, script: Path, failpoint: str) -> None:
    """Run `script` until FLOE_FAILPOINT=`failpoint` kills it; fail if it does not."""
    crashed = run_script(floe_bin, workdir, script, {"FLOE_FAILPOINT": failpoint})
    assert crashed.returncode != 0, f"failpoint {failpoint} did not fire:\n{crashed.stderr}"


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


def small_files_table(floe_bin: Path, lake: SqlLake, tmp_path: Path, files: int) -> Path:
    """Table lake.shop.t of `files` one-row files in two partitions; floe's working folder."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    run_floe_in(
        floe_bin,
        workdir,
        lake.ddl(),
        "CREATE SCHEMA lake.shop",
        "CREATE TABLE lake.shop.t (id BIGINT, part STRING) PARTITIONED BY (part)",
        *[f"INSERT INTO lake.shop.t VALUES ({i}, 'p{i % 2}')" for i in range(1, files + 1)],
    )
    return workdir


def test_a_rewrite_racing_pyiceberg_appends_loses_no_rows(
    floe_bin: Path, lake: SqlLake, tmp_path: Path
):
    workdir = small_files_table(floe_bin, lake, tmp_path, 20)
    catalog = lake.pyiceberg()
    # The rewrite pauses before its commit; pyiceberg appends meanwhile, so floe's first
    # commit loses and it prepares again on the table with the appends.
    proc = paused_before_commit(
        floe_bin, lake, workdir,
        "CALL lake.system.rewrite_data_files(table => 'shop.t', min_input_files => 2)",
    )
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


def plain(path: str) -> str:
    return path.removeprefix("file://").removeprefix("file:")


def referenced_by_table(table) -> set[str]:
    """What pyiceberg says the table references: metadata files, manifest lists,
    manifests and every file they list."""
    md = table.metadata
    out = {plain(table.metadata_location)} | {plain(l.metadata_file) for l in md.metadata_log}
    for snapshot in md.snapshots:
        out.add(plain(snapshot.manifest_list))
        for manifest in snapshot.manifests(table.io):
            out.add(plain(manifest.manifest_path))
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                out.add(plain(entry.data_file.file_path))
    return out


def in_flight(workdir: Path) -> set[str]:
    """The data files the job's checkpoint records will commit."""
    out = set()
    for record in (workdir / ".floe").glob("*/checkpoint.json"):
        for pending in json.loads(record.read_text())["tables"]:
            for group in pending["groups"]:
                out |= {plain(json.loads(f)["file_path"]) for f in group["files"]}
    return out


def test_orphan_removal_after_a_crash_mid_checkpoint_keeps_what_the_job_will_commit(
    floe_bin: Path, lake: SqlLake, tmp_path: Path
):
    rows = 4_000
    workdir = tmp_path / "work"
    script = orders_job(lake, workdir, rows, rate=2_000, interval="200ms")
    # Killed halfway through writing its 3rd commit's metadata file: that commit's
    # manifests, manifest list and torn metadata file are orphans; its data files are named
    # by the checkpoint record, which the next start commits.
    crash_at(floe_bin, workdir, script, "in-metadata-write:3")
    table_dir = lake.warehouse / "shop" / "orders"
    stray = table_dir / "data" / "stray.parquet"
    stray.write_bytes(b"not a table's file")
    four_days_ago = time.time() - 4 * 24 * 3600
    os.utime(stray, (four_days_ago, four_days_ago))
    young = table_dir / "data" / "young.parquet"
    young.write_bytes(b"written a moment ago")

    table = lake.pyiceberg().load_table("shop.orders")
    keep = referenced_by_table(table) | in_flight(workdir)
    assert in_flight(workdir), "the crash left no checkpoint in flight"
    on_disk = {str(p) for p in table_dir.rglob("*") if p.is_file()}
    # The copies of the job's checkpoint records are in a hidden folder, which orphan removal
    # leaves alone (as Iceberg's own action does).
    copies = {p for p in on_disk if "/.floe-state/" in p}
    assert any(p.endswith(".json") for p in copies), "the records are copied with the table"
    expected = on_disk - keep - copies
    assert str(stray) in expected and any(p.endswith(".metadata.json") for p in expected), expected

    def orphans(sql: str) -> set[str]:
        rows = run_floe_in(floe_bin, workdir, lake.ddl(), sql)
        return {plain(r["orphan_file_location"]) for r in rows}

    # The default age (3 days) finds only the old stray file.
    assert orphans("CALL lake.system.remove_orphan_files(table => 'shop.orders', dry_run => true)") == {
        str(stray)
    }
    listed = orphans(
        "CALL lake.system.remove_orphan_files(table => 'shop.orders', "
        "older_than => now() + INTERVAL '1' MINUTE, dry_run => true)"
    )
    assert listed == expected
    assert {str(p) for p in table_dir.rglob("*") if p.is_file()} == on_disk, "a dry run deletes nothing"
    removed = orphans(
        "CALL lake.system.remove_orphan_files(table => 'shop.orders', "
        "older_than => now() + INTERVAL '1' MINUTE)"
    )
    assert removed == expected
    assert {str(p) for p in table_dir.rglob("*") if p.is_file()} == on_disk - expected
    # The job starts again, commits what its record names, and ends with every row once.
    run_to_end(floe_bin, workdir, script)
    assert order_ids(lake.pyiceberg().load_table("shop.orders")) == list(range(1, rows + 1))


def test_compaction_sorts_by_the_tables_sort_order(floe_bin: Path, lake: SqlLake, tmp_path: Path):
    import pyarrow.parquet as pq
    from pyiceberg.schema import Schema
    from pyiceberg.table.sorting import NullOrder, SortDirection, SortField, SortOrder
    from pyiceberg.transforms import IdentityTransform
    from pyiceberg.types import LongType, NestedField, StringType

    catalog = lake.pyiceberg()
    catalog.create_namespace("shop")
    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "name", StringType(), required=False),
    )
    # name ascending with NULLs last, then id descending.
    order = SortOrder(
        SortField(source_id=2, transform=IdentityTransform(), null_order=NullOrder.NULLS_LAST),
        SortField(
            source_id=1,
            transform=IdentityTransform(),
            direction=SortDirection.DESC,
            null_order=NullOrder.NULLS_LAST,
        ),
    )
    catalog.create_table("shop.sorted", schema=schema, sort_order=order)
    rng = random.Random(7)
    names = ["b", "a", None, "c"]
    inserts = []
    expected = []
    for _ in range(6):
        batch = [(rng.randrange(1000), rng.choice(names)) for _ in range(20)]
        expected += batch
        values = ", ".join(
            f"({i}, {'NULL' if n is None else repr(n)})" for i, n in batch
        )
        inserts.append(f"INSERT INTO lake.shop.sorted VALUES {values}")
    workdir = tmp_path / "work"
    workdir.mkdir()
    run_floe_in(floe_bin, workdir, lake.ddl(), *inserts)
    done = call(
        floe_bin, lake, workdir, "CALL lake.system.rewrite_data_files(table => 'shop.sorted', min_input_files => 2)"
    )
    assert done["rewritten_data_files_count"] == 6 and done["added_data_files_count"] == 1, done
    table = catalog.load_table("shop.sorted")
    (path,) = [plain(f["file_path"]) for f in table.inspect.files().to_pylist()]
    got = [(r["id"], r["name"]) for r in pq.read_table(path).to_pylist()]
    want = sorted(expected, key=lambda r: (r[1] is None, r[1] or "", -r[0]))
    assert got == want


def test_procedures_on_the_rest_catalog_over_s3(rest_catalog_factory, run_floe):
    import uuid

    import boto3

    from conftest import (
        S3_ACCESS_KEY,
        S3_ENDPOINT,
        S3_REGION,
        S3_SECRET_KEY,
        drop_rest_namespace,
        rest_catalog_ddl,
        require_rest_server,
    )

    require_rest_server()
    rest = rest_catalog_factory()
    ns = f"floe_maint_{uuid.uuid4().hex[:12]}"
    ddl = rest_catalog_ddl("rest")
    try:
        run_floe(
            ddl,
            f"CREATE SCHEMA rest.{ns}",
            f"CREATE TABLE rest.{ns}.t (id BIGINT, part STRING) PARTITIONED BY (part)",
            *[f"INSERT INTO rest.{ns}.t VALUES ({i}, 'p{i % 2}')" for i in range(1, 9)],
        )
        table = rest.load_table((ns, "t"))
        location = table.metadata.location
        assert location.startswith("s3://"), location
        bucket, prefix = location.removeprefix("s3://").split("/", 1)
        s3 = boto3.client(
            "s3",
            endpoint_url=S3_ENDPOINT,
            aws_access_key_id=S3_ACCESS_KEY,
            aws_secret_access_key=S3_SECRET_KEY,
            region_name=S3_REGION,
        )
        stray_key = f"{prefix}/data/stray.parquet"
        s3.put_object(Bucket=bucket, Key=stray_key, Body=b"no table's file")
        (done,) = run_floe(
            ddl, f"CALL rest.system.rewrite_data_files(table => '{ns}.t', min_input_files => 2)"
        )
        assert done["rewritten_data_files_count"] == 8 and done["added_data_files_count"] == 2, done
        run_floe(
            ddl,
            f"CALL rest.system.expire_snapshots(table => '{ns}.t', older_than => now(), retain_last => 1)",
        )
        found = run_floe(
            ddl,
            f"CALL rest.system.remove_orphan_files(table => '{ns}.t', "
            "older_than => now() + INTERVAL '1' MINUTE)",
        )
        orphans = {r["orphan_file_location"] for r in found}
        # The compaction's losing attempts leave nothing; expiry deleted what it could
        # reach; the stray object is the one orphan.
        assert orphans == {f"s3://{bucket}/{stray_key}"}, orphans
        keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]}
        assert stray_key not in keys
        table = rest.load_table((ns, "t"))
        assert sorted(table.scan().to_arrow().column("id").to_pylist()) == list(range(1, 9))
        assert len(table.snapshots()) == 1
    finally:
        drop_rest_namespace(rest, ns, ["t"])


MAINTAINED = """
SET 'maintenance.compaction' = 'on'; SET 'maintenance.interval' = '1s';
SET 'maintenance.min-input-files' = '4'; SET 'maintenance.snapshot-retention' = '2s';
SET 'maintenance.min-snapshots' = '5'; SET 'maintenance.cpu' = '0.5';
"""


def files_per_partition(table) -> dict:
    counts: dict = {}
    for f in table.inspect.files().to_pylist():
        key = json.dumps(f["partition"], sort_keys=True, default=str)
        counts[key] = counts.get(key, 0) + 1
    return counts


def test_a_finished_jobs_next_run_maintains_what_it_wrote(
    floe_bin: Path, lake: SqlLake, tmp_path: Path
):
    # A run that only finishes what an earlier one wrote (here: all of it) commits nothing
    # new; its last maintenance run still looks at the tables the job wrote.
    rows = 6_000
    workdir = tmp_path / "work"
    script = orders_job(lake, workdir, rows, rate=3_000, interval="200ms")
    run_to_end(floe_bin, workdir, script)
    table = lake.pyiceberg().load_table("shop.orders")
    before = files_per_partition(table)
    assert min(before.values()) >= 4, before
    script.write_text(script.read_text().replace("SET 'pipeline.name'", MAINTAINED + "SET 'pipeline.name'"))
    run_to_end(floe_bin, workdir, script)
    table = lake.pyiceberg().load_table("shop.orders")
    after = files_per_partition(table)
    assert max(after.values()) < 4, (before, after)
    assert order_ids(table) == list(range(1, rows + 1))


def test_a_job_compacts_and_expires_its_table_while_killed_at_any_point(
    floe_bin: Path, lake: SqlLake, tmp_path: Path, duck
):
    rows = 30_000
    workdir = tmp_path / "work"
    script = orders_job(lake, workdir, rows, rate=3_000, interval="200ms")
    script.write_text(script.read_text().replace("SET 'pipeline.name'", MAINTAINED + "SET 'pipeline.name'"))
    # Killed just before its second maintenance commit, then at random points, then run to
    # its end.
    crash_at(floe_bin, workdir, script, "maintenance-commit:2")
    kill_runs(floe_bin, workdir, script, runs=3, after=(1.0, 3.0))
    run_to_end(floe_bin, workdir, script)
    table = lake.pyiceberg().load_table("shop.orders")
    assert order_ids(table) == list(range(1, rows + 1))
    ops = [s.summary.operation.value for s in table.snapshots()]
    assert "replace" in ops, ops
    # Maintenance kept up: a bounded job's last run leaves each partition compacted, and
    # expiry kept the snapshots few.
    per_partition = files_per_partition(table)
    assert max(per_partition.values()) < 4, per_partition
    assert len(table.snapshots()) < 60, len(table.snapshots())
    (n,) = duck.execute(f"SELECT count(*) FROM iceberg_scan('{table.metadata_location}')").fetchone()
    assert n == rows


def test_a_routed_job_maintains_every_table_it_writes(
    floe_bin: Path, lake: SqlLake, tmp_path: Path, duck
):
    workdir = tmp_path / "work"
    script = write_job(lake, workdir, rate=20_000, interval="100ms")
    script.write_text(
        script.read_text().replace(
            "WITH ('partition.candidates' = 'event_date, truncate(8, user_agent)')",
            "WITH ('partition.candidates' = 'event_date, truncate(8, user_agent)', "
            "'maintenance.compaction' = 'on', 'maintenance.interval' = '1s', "
            "'maintenance.min-input-files' = '3')",
        ).replace("SET 'pipeline.name'", "SET 'table.dml-sync' = 'true'; SET 'pipeline.name'")
        + "\nSELECT table_name, data_files, last_maintenance FROM floe.table_health ORDER BY table_name;\n"
    )
    done = subprocess.run(
        [str(floe_bin), "-q", "--format", "ndjson", "-f", str(script)],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    health = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    names = [h["table_name"] for h in health]
    assert names == [
        "analytics.dead_letters",
        "analytics.interaction_events",
        "analytics.order_events",
        "analytics.page_view_events",
    ] or names == [
        "analytics.interaction_events",
        "analytics.order_events",
        "analytics.page_view_events",
    ], health
    events = [h for h in health if h["table_name"] != "analytics.dead_letters"]
    # Every table maintained (its last run may have found nothing left to do), some compacted;
    # the files per partition below are the proof.
    assert all(h["last_maintenance"] for h in events), health
    check_tables(lake, duck)
    catalog = lake.pyiceberg()
    for name in ("interaction_events", "order_events", "page_view_events"):
        table = catalog.load_table(f"analytics.{name}")
        # Every partition, of the current spec, in fewer than 3 files.
        assert "replace" in [s.summary.operation.value for s in table.snapshots()], name
        current = table.spec().spec_id
        assert {f["spec_id"] for f in table.inspect.files().to_pylist()} == {current}, name
        assert max(files_per_partition(table).values()) < 3, (name, files_per_partition(table))


def test_a_rewrite_whose_files_another_rewrite_replaced_gives_up_cleanly(
    floe_bin: Path, lake: SqlLake, tmp_path: Path
):
    workdir = small_files_table(floe_bin, lake, tmp_path, 10)
    rewrite = "CALL lake.system.rewrite_data_files(table => 'shop.t', min_input_files => 2)"
    paused = paused_before_commit(floe_bin, lake, workdir, rewrite)
    # Another rewrite of the same files commits first.
    first = call(floe_bin, lake, workdir, rewrite)
    assert first["rewritten_data_files_count"] == 10, first
    out, err = paused.communicate(timeout=120)
    assert paused.returncode != 0, out
    assert "10 of the 10 files this rewrite read are no longer in the table" in err, err
    assert "nothing was committed" in err, err
    table = lake.pyiceberg().load_table("shop.t")
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == list(range(1, 11))
    assert [s.summary.operation.value for s in table.snapshots()].count("replace") == 1
    # The loser deleted the files it wrote: every data file on disk is the table's.
    on_disk = {str(p) for p in (lake.warehouse / "shop" / "t" / "data").rglob("*.parquet")}
    assert on_disk <= referenced_by_table(table), on_disk - referenced_by_table(table)


def test_a_jobs_small_files_are_compacted_once_old_however_few(
    floe_bin: Path, lake: SqlLake, tmp_path: Path
):
    workdir = tmp_path / "work"
    script = orders_job(lake, workdir, 6_000, rate=3_000, interval="200ms")
    # Never by count (1,000 files); by age: two or more small files, one older than 1 s.
    script.write_text(
        script.read_text().replace(
            "SET 'pipeline.name'",
            "SET 'maintenance.compaction' = 'on'; SET 'maintenance.interval' = '500ms'; "
            "SET 'maintenance.min-input-files' = '1000'; "
            "SET 'maintenance.small-file-age' = '1s'; SET 'pipeline.name'",
        )
    )
    run_to_end(floe_bin, workdir, script)
    table = lake.pyiceberg().load_table("shop.orders")
    assert order_ids(table) == list(range(1, 6_001))
    assert "replace" in [s.summary.operation.value for s in table.snapshots()]
    assert max(files_per_partition(table).values()) == 1, files_per_partition(table)


@pytest.mark.parametrize("version", [2, 3], ids=["v2", "v3"])
def test_a_job_upserting_a_keyed_table_compacts_it_while_it_deletes_rows(
    floe_bin: Path, lake: SqlLake, tmp_path: Path, duck, version: int
):
    """An upsert job deletes rows of earlier files at every checkpoint (position delete
    files in v2, deletion vectors in v3); its compaction, which reads those files meanwhile,
    carries the deletes over by key and lands."""
    rows, keys = 40_000, 2_000
    workdir = tmp_path / "work"
    workdir.mkdir()
    script = workdir / "upsert.sql"
    script.write_text(lake.ddl() + f""";
CREATE SCHEMA IF NOT EXISTS lake.shop;
CREATE TABLE IF NOT EXISTS lake.shop.latest (k BIGINT, order_id BIGINT, region STRING,
  PRIMARY KEY (k) NOT ENFORCED) PARTITIONED BY (region) WITH ('format-version' = '{version}');
CREATE SOURCE gen WITH ('connector' = 'datagen', 'profile' = 'orders',
  'number-of-rows' = '{rows}', 'rows-per-second' = '5000');
SET 'pipeline.name' = 'latest'; SET 'checkpoint.interval' = '200ms';
SET 'maintenance.compaction' = 'on'; SET 'maintenance.interval' = '500ms';
SET 'maintenance.small-file-age' = '1s'; SET 'maintenance.min-input-files' = '3';
SET 'maintenance.cpu' = '1';
INSERT INTO lake.shop.latest SELECT order_id % {keys}, order_id, region FROM gen;
""")
    run_to_end(floe_bin, workdir, script)
    table = lake.pyiceberg().load_table("shop.latest")
    got = sorted((r["k"], r["order_id"]) for r in table.scan().to_arrow().to_pylist())
    # One row per key, each its last order (order ids count from 1).
    assert got == [(i % keys, i) for i in sorted(range(rows - keys + 1, rows + 1), key=lambda i: i % keys)]
    (n,) = duck.execute(f"SELECT count(*) FROM iceberg_scan('{table.metadata_location}')").fetchone()
    assert n == keys
    history = sorted(table.snapshots(), key=lambda s: s.sequence_number)
    replaced = [s for s in history if s.summary.operation.value == "replace"]
    assert replaced, [s.summary.operation.value for s in history]
    # Some compactions landed while the job was deleting rows: they carried deletes.
    carried = [s for s in replaced if int(s.summary.additional_properties.get("added-position-deletes") or 0)]
    assert carried, [s.summary.additional_properties for s in replaced]
