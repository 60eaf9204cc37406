"""The AWS Glue Data Catalog as floe's catalog: moto serves Glue (scripts/moto-server.py, with
UpdateTable honouring VersionId as AWS does), SeaweedFS serves S3, and pyiceberg's GlueCatalog
reads what floe writes on the same endpoints.

moto keeps its catalog in memory for as long as it runs: every test uses namespaces and a
warehouse folder of its own.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conftest import (
    MOTO_KEY,
    MOTO_REGION,
    MOTO_URI,
    S3_ACCESS_KEY,
    S3_ENDPOINT,
    S3_REGION,
    S3_SECRET_KEY,
    START_SERVERS_MSG,
    glue_client,
    norm_int,
    normalize_rows,
    options_sql,
    paused_before_commit,
    run_floe_in,
    sql_values,
)
from test_postgres_catalog import COLUMNS, ROWS_1, ROWS_2, TABLE_DDL, TYPES
from test_routing import ROWS, kill_runs, run_to_end, write_job

def require_glue() -> None:
    """Fail (never skip) when moto or SeaweedFS is not running."""
    import urllib.request

    for what, url in (("moto (Glue)", f"{MOTO_URI}/moto-api/"), ("SeaweedFS (S3)", S3_ENDPOINT)):
        try:
            urllib.request.urlopen(url, timeout=3).close()
        except urllib.error.HTTPError:
            pass  # it answered
        except Exception as e:
            pytest.fail(f"{START_SERVERS_MSG}\n({what} at {url} is not reachable: {e})", pytrace=False)


@dataclass
class GlueLake:
    """A floe catalog named `name` on moto's Glue, its tables under `warehouse` on SeaweedFS."""

    name: str
    warehouse: str

    def props(self) -> dict[str, str]:
        return {
            "type": "iceberg",
            "catalog-type": "glue",
            "warehouse": self.warehouse,
            "glue.endpoint": MOTO_URI,
            "glue.region": MOTO_REGION,
            "glue.access-key-id": MOTO_KEY,
            "glue.secret-access-key": MOTO_KEY,
            "s3.endpoint": S3_ENDPOINT,
            "s3.access-key-id": S3_ACCESS_KEY,
            "s3.secret-access-key": S3_SECRET_KEY,
            "s3.region": S3_REGION,
            "s3.path-style-access": "true",
        }

    def ddl(self) -> str:
        return f"CREATE CATALOG {self.name} WITH ({options_sql(self.props())})"

    def pyiceberg(self):
        from pyiceberg.catalog.glue import GlueCatalog

        # The same endpoints and keys, as pyiceberg names them.
        return GlueCatalog(
            self.name, **{k: v for k, v in self.props().items() if k.startswith(("glue.", "s3."))}
        )


@pytest.fixture
def glue_lake() -> GlueLake:
    require_glue()
    run = uuid.uuid4().hex[:10]
    return GlueLake(name="g", warehouse=f"s3://warehouse-s3/glue-{run}")


def fresh_ns(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def floe_in(floe_bin: Path, cwd: Path, *sql: str) -> list[dict[str, Any]]:
    cwd.mkdir(parents=True, exist_ok=True)
    return run_floe_in(floe_bin, cwd, *sql)


def test_floe_and_pyiceberg_share_a_glue_catalog(floe_bin: Path, tmp_path: Path, glue_lake: GlueLake):
    ns = fresh_ns("shop")
    fq = f"g.{ns}.t"
    rows = floe_in(
        floe_bin,
        tmp_path / "writer",
        glue_lake.ddl(),
        f"CREATE SCHEMA g.{ns}",
        f"CREATE TABLE {fq} {TABLE_DDL} PARTITIONED BY (days(ts), bucket(4, id))",
        f"INSERT INTO {fq} VALUES {sql_values(ROWS_1, COLUMNS)}",
        f"INSERT INTO {fq} VALUES {sql_values(ROWS_2, COLUMNS)}",
        f"SELECT {', '.join(COLUMNS)} FROM {fq} ORDER BY id",
    )
    counts, selected = rows[:2], rows[2:]
    assert [norm_int(r["count"]) for r in counts] == [3, 2], rows
    assert normalize_rows(selected, TYPES) == normalize_rows(ROWS_1 + ROWS_2, TYPES)

    # Another floe process finds the table through Glue alone: listing, metadata tables,
    # time travel to the first snapshot.
    reader = tmp_path / "reader"
    tables = floe_in(floe_bin, reader, glue_lake.ddl(), f"SHOW TABLES IN g.{ns}")
    assert [r["table_name"] for r in tables] == ["t"], tables
    snapshots = floe_in(
        floe_bin, reader, glue_lake.ddl(),
        f'SELECT snapshot_id, operation FROM g.{ns}."t$snapshots" ORDER BY committed_at',
    )
    assert [r["operation"] for r in snapshots] == ["append", "append"], snapshots
    first = snapshots[0]["snapshot_id"]
    (old,) = floe_in(
        floe_bin, reader, glue_lake.ddl(), f"SELECT count(*) AS n FROM {fq} FOR VERSION AS OF {first}"
    )
    assert norm_int(old["n"]) == 3, old

    # pyiceberg's GlueCatalog opens the same table.
    catalog = glue_lake.pyiceberg()
    assert (ns,) in catalog.list_namespaces()
    assert catalog.list_tables(ns) == [(ns, "t")]
    table = catalog.load_table(f"{ns}.t")
    assert table.metadata_location.startswith(f"{glue_lake.warehouse}/{ns}.db/t/metadata/")
    got = table.scan().to_arrow().to_pylist()
    assert normalize_rows(got, TYPES) == normalize_rows(ROWS_1 + ROWS_2, TYPES)
    spec = [(table.schema().find_field(f.source_id).name, str(f.transform)) for f in table.spec().fields]
    assert spec == [("ts", "day"), ("id", "bucket[4]")], spec

    # The Glue table is an Iceberg table as iceberg-java lays it out, columns included.
    glue = glue_client().get_table(DatabaseName=ns, Name="t")["Table"]
    assert glue["Parameters"]["table_type"] == "ICEBERG"
    assert glue["Parameters"]["metadata_location"] == table.metadata_location
    assert glue["Parameters"]["previous_metadata_location"] != table.metadata_location
    columns = [(c["Name"], c["Type"]) for c in glue["StorageDescriptor"]["Columns"]]
    assert columns == [
        ("id", "bigint"), ("name", "string"), ("amount", "double"), ("ts", "timestamp"), ("d", "date")
    ], columns

    # A missing table and an existing namespace are named as such, and the session goes on.
    done = subprocess.run(
        [str(floe_bin), "-q", "-c", glue_lake.ddl(), "-c", f"SELECT * FROM g.{ns}.missing"],
        cwd=reader, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode != 0 and "not found" in done.stderr, done.stderr
    done = subprocess.run(
        [str(floe_bin), "-q", "-c", glue_lake.ddl(), "-c", f"CREATE SCHEMA g.{ns}"],
        cwd=reader, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode != 0 and "exists already" in done.stderr, done.stderr


def test_floe_and_pyiceberg_commit_to_one_glue_table_in_turn(
    floe_bin: Path, tmp_path: Path, glue_lake: GlueLake
):
    """pyiceberg commits to a floe table (its own UpdateTable), floe commits after it, a
    format v1 table included (iceberg-rust's own commit through floe's catalog)."""
    import pyarrow as pa

    ns = fresh_ns("turns")
    work = tmp_path / "w"
    for version in ("1", "2"):
        floe_in(
            floe_bin, work, glue_lake.ddl(),
            f"CREATE SCHEMA IF NOT EXISTS g.{ns}",
            f"CREATE TABLE g.{ns}.v{version} {TABLE_DDL} WITH ('format-version' = '{version}')",
            f"INSERT INTO g.{ns}.v{version} VALUES {sql_values(ROWS_1, COLUMNS)}",
        )
        table = glue_lake.pyiceberg().load_table(f"{ns}.v{version}")
        table.append(pa.Table.from_pylist(ROWS_2, schema=table.schema().as_arrow()))
        extra = [ROWS_1[0] | {"id": 6}]
        floe_in(floe_bin, work, glue_lake.ddl(), f"INSERT INTO g.{ns}.v{version} VALUES {sql_values(extra, COLUMNS)}")
        want = normalize_rows(ROWS_1 + ROWS_2 + extra, TYPES)
        got = floe_in(floe_bin, work, glue_lake.ddl(), f"SELECT * FROM g.{ns}.v{version} ORDER BY id")
        assert normalize_rows(got, TYPES) == want, version
        table = glue_lake.pyiceberg().load_table(f"{ns}.v{version}")
        assert normalize_rows(table.scan().to_arrow().to_pylist(), TYPES) == want, version
        assert len(table.snapshots()) == 3, version


def test_update_table_refuses_a_stale_version():
    """The server floe's tests run on refuses an UpdateTable whose VersionId is not the
    table's current one, as AWS Glue does (what every concurrency test below relies on)."""
    require_glue()
    glue = glue_client()
    ns = fresh_ns("versions")
    glue.create_database(DatabaseInput={"Name": ns})
    table = {"Name": "t", "Parameters": {"k": "0"}}
    glue.create_table(DatabaseName=ns, TableInput=table)
    version = glue.get_table(DatabaseName=ns, Name="t")["Table"]["VersionId"]
    glue.update_table(DatabaseName=ns, TableInput=table | {"Parameters": {"k": "1"}}, VersionId=version)
    with pytest.raises(glue.exceptions.ConcurrentModificationException):
        glue.update_table(DatabaseName=ns, TableInput=table | {"Parameters": {"k": "2"}}, VersionId=version)
    assert glue.get_table(DatabaseName=ns, Name="t")["Table"]["Parameters"] == {"k": "1"}


def test_a_commit_beaten_by_another_writer_is_planned_again(
    floe_bin: Path, tmp_path: Path, glue_lake: GlueLake
):
    """A floe DELETE paused before its commit while pyiceberg appends to the table: floe's
    commit finds the table moved on, plans again on the new table, and pyiceberg's rows stay."""
    import pyarrow as pa

    ns = fresh_ns("race")
    work = tmp_path / "w"
    floe_in(
        floe_bin, work, glue_lake.ddl(),
        f"CREATE SCHEMA g.{ns}",
        f"CREATE TABLE g.{ns}.t {TABLE_DDL} WITH ('format-version' = '2')",
        f"INSERT INTO g.{ns}.t VALUES {sql_values(ROWS_1, COLUMNS)}",
    )
    delete = paused_before_commit(floe_bin, glue_lake, work, f"DELETE FROM g.{ns}.t WHERE id = 1")
    table = glue_lake.pyiceberg().load_table(f"{ns}.t")
    table.append(pa.Table.from_pylist(ROWS_2, schema=table.schema().as_arrow()))
    out, err = delete.communicate(timeout=120)
    assert delete.returncode == 0, err
    want = normalize_rows(ROWS_1[1:] + ROWS_2, TYPES)
    table = glue_lake.pyiceberg().load_table(f"{ns}.t")
    assert normalize_rows(table.scan().to_arrow().to_pylist(), TYPES) == want
    history = sorted(table.snapshots(), key=lambda s: s.sequence_number)
    assert [s.summary.operation.value for s in history] == ["append", "append", "delete"]


def test_routed_job_killed_and_restarted_on_glue(floe_bin: Path, tmp_path: Path, glue_lake: GlueLake):
    """Tables created on first sight, schemas and specs evolved, the job killed four times
    and run to its end: every event once, as pyiceberg reads it through Glue."""
    ns = fresh_ns("routed")
    workdir = tmp_path / "work"
    script = write_job(glue_lake, workdir, rate=15_000, interval="100ms", namespace=ns)
    kill_runs(floe_bin, workdir, script, runs=4, after=(0.2, 0.7))
    run_to_end(floe_bin, workdir, script)

    catalog = glue_lake.pyiceberg()
    names = sorted(t[1] for t in catalog.list_tables(ns))
    assert names == ["interaction_events", "order_events", "page_view_events"], names
    ids: list[int] = []
    for name in names:
        ids += catalog.load_table(f"{ns}.{name}").scan().to_arrow().column("event_id").to_pylist()
    assert len(ids) == ROWS and len(set(ids)) == ROWS, (len(ids), len(set(ids)))
    page_views = catalog.load_table(f"{ns}.page_view_events")
    assert page_views.schema().find_field("user_agent") is not None
    assert len(page_views.specs()) == 2, "truncate(8, user_agent) was added when it appeared"
    # Glue's columns followed the evolved schema.
    glue = glue_client().get_table(DatabaseName=ns, Name="page_view_events")["Table"]
    columns = [c["Name"] for c in glue["StorageDescriptor"]["Columns"]]
    assert columns == [f.name for f in page_views.schema().fields], columns


def run_at_once(floe_bin: Path, scripts: list[Path]) -> None:
    """Run floe on each of `scripts` at the same time; each must finish."""
    procs = [
        subprocess.Popen(
            [str(floe_bin), "-q", "-f", str(script)], cwd=script.parent,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for script in scripts
    ]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, f"floe failed:\n{out}\n{err}"


def test_two_jobs_evolve_the_same_glue_tables_at_once(floe_bin: Path, tmp_path: Path, glue_lake: GlueLake):
    """Two floe processes route the same events into one namespace at once, each creating
    the tables, adding columns and partition fields as the events drift, and committing
    every 100 ms: their commits race on Glue's VersionId and are merged and retried.
    Nothing is lost and nothing is written twice."""
    ns = fresh_ns("shared")
    scripts = []
    for tag in ("x", "y"):
        work = tmp_path / tag
        script = write_job(glue_lake, work, rate=10_000, interval="100ms", namespace=ns)
        text = script.read_text().replace("SELECT *,", f"SELECT *, '{tag}' AS job,")
        script.write_text(text.replace("'pipeline.name' = 'routed'", f"'pipeline.name' = 'routed-{tag}'"))
        scripts.append(script)
    run_at_once(floe_bin, scripts)

    catalog = glue_lake.pyiceberg()
    names = sorted(t[1] for t in catalog.list_tables(ns))
    assert names == ["interaction_events", "order_events", "page_view_events"], names
    ids: dict[str, list[int]] = {"x": [], "y": []}
    commits = 0
    for name in names:
        table = catalog.load_table(f"{ns}.{name}")
        commits += len(table.snapshots())
        rows = table.scan().to_arrow()
        for job, event in zip(rows.column("job").to_pylist(), rows.column("event_id").to_pylist()):
            ids[job].append(event)
    for job, got in ids.items():
        assert sorted(got) == list(range(1, ROWS + 1)), f"{job}: {len(got)} rows, {len(set(got))} distinct"
    assert commits >= 20, f"only {commits} commits: the jobs hardly raced"
    page_views = catalog.load_table(f"{ns}.page_view_events")
    assert page_views.schema().find_field("user_agent") is not None
    assert len(page_views.specs()) == 2, [str(s) for s in page_views.specs().values()]


def test_two_jobs_typing_one_field_differently_on_glue(floe_bin: Path, tmp_path: Path, glue_lake: GlueLake):
    """Two jobs create one table at once and add the same field, a number in one and text in
    the other: neither fails, and every record is a row or a dead letter, never both."""
    n = 4_000
    ns = fresh_ns("typed")
    scripts = []
    for tag, value in (("x", "{i}"), ("y", '"text {i}"')):
        work = tmp_path / tag
        (work / "in").mkdir(parents=True)
        lines = (f'{{"t": "typed", "job": "{tag}", "seq": {i}, "v{i // 500}": {value.format(i=i)}}}' for i in range(n))
        (work / "in" / "events.json").write_text("\n".join(lines) + "\n")
        script = work / "job.sql"
        script.write_text(
            glue_lake.ddl()
            + f""";
CREATE SCHEMA IF NOT EXISTS g.{ns};
CREATE SOURCE events WITH ('connector' = 'filesystem', 'path' = '{work / "in"}', 'format' = 'json');
SET 'pipeline.name' = 'typed-{tag}'; SET 'checkpoint.interval' = '50ms';
INSERT INTO g.{ns} SELECT * FROM events ROUTE BY t;
"""
        )
        scripts.append(script)
    run_at_once(floe_bin, scripts)

    catalog = glue_lake.pyiceberg()
    typed = catalog.load_table(f"{ns}.typed").scan().to_arrow().to_pylist()
    dead = catalog.load_table(f"{ns}.dead_letters").scan().to_arrow().to_pylist()
    assert dead, "the two types met: one job's rows are dead letters"
    assert len(typed) + len(dead) == 2 * n, (len(typed), len(dead))
    kept = {(r["job"], r["seq"]) for r in typed}
    assert len(kept) == len(typed), "no row twice"


def test_crashes_maintenance_and_changes_on_glue(floe_bin: Path, tmp_path: Path, glue_lake: GlueLake):
    """A job killed while it writes a metadata file (the torn file is never current), run to
    its end: every order once. Then the maintenance procedures and a MERGE commit through
    Glue, and the table reads the same in floe and pyiceberg after each."""
    from test_maintenance import call, crash_at, order_ids, orders_job

    rows = 2_000
    ns = fresh_ns("maint")
    workdir = tmp_path / "work"
    script = orders_job(glue_lake, workdir, rows, rate=400, interval="50ms")
    script.write_text(script.read_text().replace("g.shop", f"g.{ns}"))
    crash_at(floe_bin, workdir, script, "in-metadata-write")
    run_to_end(floe_bin, workdir, script)
    catalog = glue_lake.pyiceberg()
    table = catalog.load_table(f"{ns}.orders")
    ids = list(range(1, rows + 1))
    assert order_ids(table) == ids
    files = len(table.inspect.files())
    assert files > 3, files

    done = call(floe_bin, glue_lake, workdir, f"CALL g.system.rewrite_data_files(table => '{ns}.orders')")
    assert done["rewritten_data_files_count"] == files, done
    table = catalog.load_table(f"{ns}.orders")
    assert table.current_snapshot().summary.operation.value == "replace"
    assert order_ids(table) == ids
    expired = call(
        floe_bin, glue_lake, workdir,
        f"CALL g.system.expire_snapshots(table => '{ns}.orders', older_than => now(), retain_last => 1)",
    )
    assert expired["deleted_data_files_count"] == files, expired
    # The torn metadata file the crash left is an orphan, found on S3 and removed.
    orphans = run_floe_in(
        floe_bin, workdir, glue_lake.ddl(),
        f"CALL g.system.remove_orphan_files(table => '{ns}.orders', older_than => now())",
    )
    assert any(o["orphan_file_location"].endswith(".metadata.json") for o in orphans), orphans
    table = catalog.load_table(f"{ns}.orders")
    assert len(table.snapshots()) == 1 and order_ids(table) == ids

    # Row-level changes on a v2 table commit through Glue too.
    merged = run_floe_in(
        floe_bin, workdir, glue_lake.ddl(),
        f"MERGE INTO g.{ns}.orders t USING (VALUES (1, 9.5), ({rows + 1}, 1.0)) AS s(id, price) "
        "ON t.order_id = s.id WHEN MATCHED THEN UPDATE SET price = s.price "
        "WHEN NOT MATCHED THEN INSERT VALUES (s.id, s.price, 'eu')",
    )
    assert norm_int(merged[0]["count"]) == 2, merged
    table = catalog.load_table(f"{ns}.orders")
    got = {r["order_id"]: r["price"] for r in table.scan().to_arrow().to_pylist()}
    assert len(got) == rows + 1 and got[1] == 9.5 and got[rows + 1] == 1.0


def test_credentials_from_the_aws_chain_and_secrets_masked(floe_bin: Path, tmp_path: Path, glue_lake: GlueLake):
    """Without 'glue.access-key-id' the AWS chain's credentials are used (here the
    environment's); SHOW CATALOGS never shows a secret; a dead endpoint is named."""
    props = {k: v for k, v in glue_lake.props().items() if not k.startswith("glue.") or k == "glue.endpoint"}
    ddl = f"CREATE CATALOG g WITH ({options_sql(props)})"
    ns = fresh_ns("chain")
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": MOTO_KEY,
        "AWS_SECRET_ACCESS_KEY": MOTO_KEY,
        "AWS_REGION": MOTO_REGION,
    }
    done = subprocess.run(
        [str(floe_bin), "-q", "--format", "ndjson", "-c", ddl, "-c", f"CREATE SCHEMA g.{ns}",
         "-c", f"SHOW SCHEMAS IN g"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env,
    )
    assert done.returncode == 0, done.stderr
    assert ns in done.stdout, done.stdout

    shown = run_floe_in(floe_bin, tmp_path, glue_lake.ddl(), "SHOW CATALOGS")
    options = next(r["options"] for r in shown if r["catalog_name"] == "g")
    assert "glue.secret-access-key=****" in options and "s3.secret-access-key=****" in options, options
    assert "adminsecret" not in options and "glue.access-key-id=testing" in options, options

    dead = glue_lake.ddl().replace(MOTO_URI, "http://127.0.0.1:9")
    done = subprocess.run(
        [str(floe_bin), "-q", "-c", dead], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0, done.stdout
    assert "cannot use the AWS Glue Data Catalog at http://127.0.0.1:9" in done.stderr, done.stderr
