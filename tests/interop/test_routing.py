"""ROUTE BY seen from other Iceberg implementations: the tables floe creates and evolves while
routing are read by pyiceberg and DuckDB, also after the job was killed mid-stream."""

from __future__ import annotations

import os
import random
import subprocess
import time
from pathlib import Path

from conftest import SqlLake

ROWS = 40_000

ROUTED_JOB = """
CREATE SOURCE events WITH ('connector' = 'datagen', 'profile' = 'events',
  'number-of-rows' = '{rows}', 'events.drift-at' = '{drift}', 'rows-per-second' = '{rate}');
SET 'pipeline.name' = 'routed'; SET 'checkpoint.interval' = '{interval}';
INSERT INTO {catalog}.analytics SELECT *, CAST(event_time AS DATE) AS event_date FROM events
ROUTE BY event_type || '_events'
WITH ('partition.candidates' = 'event_date, truncate(8, user_agent)');
"""


def write_job(
    lake: SqlLake, workdir: Path, rate: int, interval: str, namespace: str = "analytics"
) -> Path:
    """workdir/job.sql: `lake`'s DDL and the routed job into `lake.<namespace>`."""
    workdir.mkdir(parents=True, exist_ok=True)
    script = workdir / "job.sql"
    job = ROUTED_JOB.format(
        rows=ROWS, drift=ROWS // 2, rate=rate, interval=interval, catalog=lake.name
    )
    script.write_text(
        lake.ddl() + ";\n" + job.replace(f"{lake.name}.analytics", f"{lake.name}.{namespace}")
    )
    return script


def kill_runs(
    floe_bin: Path, workdir: Path, script: Path, runs: int, after: tuple[float, float]
) -> None:
    """Start `script` `runs` times, each killed (SIGKILL) a random `after` seconds in;
    fail unless all but one were still running when killed."""
    rng = random.Random()
    kills = 0
    for _ in range(runs):
        child = subprocess.Popen(
            [str(floe_bin), "-q", "-f", str(script)],
            cwd=workdir,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(*after))
        if child.poll() is None:
            child.kill()
            kills += 1
        child.wait()
    assert kills >= runs - 1, f"the job ended before it could be killed ({kills} kills)"


def run_script(
    floe_bin: Path, workdir: Path, script: Path, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run `floe -q -f script` in `workdir` (with `env` added to the environment)."""
    return subprocess.run(
        [str(floe_bin), "-q", "-f", str(script)],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def run_to_end(floe_bin: Path, workdir: Path, script: Path) -> None:
    done = run_script(floe_bin, workdir, script)
    assert done.returncode == 0, f"floe failed:\n{done.stdout}\n{done.stderr}"


def check_tables(lake: SqlLake, duck) -> None:
    catalog = lake.pyiceberg()
    names = sorted(t[1] for t in catalog.list_tables("analytics"))
    assert names == ["interaction_events", "order_events", "page_view_events"], names

    total = 0
    ids: set[int] = set()
    for name in names:
        table = catalog.load_table(f"analytics.{name}")
        rows = table.scan().to_arrow()
        total += rows.num_rows
        ids.update(rows.column("event_id").to_pylist())
        # DuckDB reads the same table (with its evolved schema and specs) the same way.
        n = duck.execute(
            f"SELECT count(*) FROM iceberg_scan('{table.metadata_location}')"
        ).fetchone()[0]
        assert n == rows.num_rows, (name, n, rows.num_rows)
    assert total == ROWS and len(ids) == ROWS, (total, len(ids))

    page_views = catalog.load_table("analytics.page_view_events")
    schema = page_views.schema()
    for column in ("user_agent", "scroll_depth"):
        assert not schema.find_field(column).required, column
    assert "element" not in [f.name for f in schema.fields], "only interactions carry element"
    assert len(page_views.specs()) == 2, "truncate(8, user_agent) was added when it appeared"
    rows = page_views.scan().to_arrow().to_pylist()
    before = [r for r in rows if r["event_id"] <= ROWS // 2]
    after = [r for r in rows if r["event_id"] > ROWS // 2]
    assert before and all(r["user_agent"] is None for r in before)
    assert after and all(r["user_agent"] is not None for r in after)
    interactions = catalog.load_table("analytics.interaction_events").scan().to_arrow()
    assert min(interactions.column("event_id").to_pylist()) > ROWS // 2


def test_routed_tables_are_read_by_pyiceberg_and_duckdb(
    floe_bin: Path, lake: SqlLake, tmp_path: Path, duck
):
    workdir = tmp_path / "work"
    script = write_job(lake, workdir, rate=200_000, interval="200ms")
    run_to_end(floe_bin, workdir, script)
    check_tables(lake, duck)


def test_killed_during_evolving_checkpoints_then_restarted(
    floe_bin: Path, lake: SqlLake, tmp_path: Path, duck
):
    workdir = tmp_path / "work"
    script = write_job(lake, workdir, rate=15_000, interval="100ms")
    kill_runs(floe_bin, workdir, script, runs=4, after=(0.2, 0.7))
    run_to_end(floe_bin, workdir, script)
    check_tables(lake, duck)


def test_routing_with_evolution_on_the_rest_catalog(floe_bin: Path, tmp_path: Path, rest_catalog_factory):
    """The same commit path on the REST catalog (SeaweedFS): schema and spec changes and data
    in one commit, read back by pyiceberg."""
    import uuid

    from conftest import rest_catalog_ddl, require_rest_server

    require_rest_server()
    ns = f"routed_{uuid.uuid4().hex[:10]}"
    workdir = tmp_path / "work"
    workdir.mkdir()
    script = workdir / "job.sql"
    script.write_text(
        rest_catalog_ddl("rest")
        + ";\n"
        + ROUTED_JOB.format(rows=ROWS // 4, drift=ROWS // 8, rate=100_000, interval="300ms", catalog="rest")
        .replace("rest.analytics", f"rest.{ns}")
    )
    run_to_end(floe_bin, workdir, script)
    catalog = rest_catalog_factory()
    names = sorted(t[1] for t in catalog.list_tables(ns))
    assert names == ["interaction_events", "order_events", "page_view_events"], names
    page_views = catalog.load_table(f"{ns}.page_view_events")
    assert page_views.schema().find_field("user_agent") is not None
    assert len(page_views.specs()) == 2
    total = sum(catalog.load_table(f"{ns}.{n}").scan().to_arrow().num_rows for n in names)
    assert total == ROWS // 4


def test_object_store_files_close_beyond_the_buffer(floe_bin: Path, tmp_path: Path, rest_catalog_factory):
    """On an object store a file's bytes are held in memory until a part's worth is uploaded,
    so open files count against 'route.buffer-size': with a small buffer, tables get several
    files in one checkpoint (on a local disk they get one, see tests/many_tables.rs), and
    every row is there once."""
    import uuid

    from conftest import rest_catalog_ddl, require_rest_server

    require_rest_server()
    ns = f"buffered_{uuid.uuid4().hex[:10]}"
    rows = 600_000  # more than a routed job gathers before routing (262,144)
    workdir = tmp_path / "work"
    workdir.mkdir()
    script = workdir / "job.sql"
    script.write_text(
        rest_catalog_ddl("rest")
        + f""";
CREATE SOURCE orders WITH ('connector' = 'datagen', 'profile' = 'orders', 'number-of-rows' = '{rows}');
SET 'pipeline.name' = 'buffered'; SET 'checkpoint.interval' = '1h';
INSERT INTO rest.{ns} SELECT * FROM orders ROUTE BY 't' || CAST(order_id % 4 AS VARCHAR)
WITH ('route.buffer-size' = '64kb');
"""
    )
    run_to_end(floe_bin, workdir, script)
    catalog = rest_catalog_factory()
    names = sorted(t[1] for t in catalog.list_tables(ns))
    assert names == ["t0", "t1", "t2", "t3"], names
    total = 0
    for name in names:
        table = catalog.load_table(f"{ns}.{name}")
        assert len(table.snapshots()) == 1, name
        files = list(table.scan().plan_files())
        assert len(files) > 1, f"{name}: {len(files)} file(s)"
        ids = table.scan().to_arrow().column("order_id").to_pylist()
        assert len(ids) == len(set(ids)), name
        total += len(ids)
    assert total == rows


def test_row_groups_of_open_files_are_read_by_pyiceberg_and_duckdb(
    floe_bin: Path, lake: SqlLake, tmp_path: Path, duck
):
    """With little memory for many rows, a routed job writes each table's gathered rows as row
    groups of one open file per checkpoint: other readers see every row of those files."""
    import pyarrow.parquet as pq

    rows = 600_000  # more than a routed job gathers before routing (262,144)
    workdir = tmp_path / "work"
    workdir.mkdir()
    script = workdir / "job.sql"
    script.write_text(
        lake.ddl()
        + f""";
CREATE SOURCE orders WITH ('connector' = 'datagen', 'profile' = 'orders', 'number-of-rows' = '{rows}');
SET 'pipeline.name' = 'row-groups'; SET 'checkpoint.interval' = '1h';
INSERT INTO {lake.name}.grouped SELECT * FROM orders ROUTE BY 't' || CAST(order_id % 4 AS VARCHAR)
WITH ('route.buffer-size' = '64kb');
"""
    )
    run_to_end(floe_bin, workdir, script)
    catalog = lake.pyiceberg()
    total = 0
    for name in ["t0", "t1", "t2", "t3"]:
        table = catalog.load_table(f"grouped.{name}")
        files = list(table.scan().plan_files())
        assert len(files) == 1, f"{name}: {len(files)} files"
        path = files[0].file.file_path.removeprefix("file://")
        assert pq.ParquetFile(path).metadata.num_row_groups > 1, name
        ids = table.scan().to_arrow().column("order_id").to_pylist()
        assert len(ids) == len(set(ids)) == rows // 4, name
        n = duck.execute(
            f"SELECT count(DISTINCT order_id) FROM iceberg_scan('{table.metadata_location}')"
        ).fetchone()[0]
        assert n == rows // 4, (name, n)
        total += len(ids)
    assert total == rows
