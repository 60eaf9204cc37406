"""The Iceberg SQL catalog on PostgreSQL: floe and pyiceberg share one catalog database.

Needs the PostgreSQL server of scripts/test-env.sh (127.0.0.1:55432, role floe/floe,
database floe_catalog; FLOE_PG_URI overrides). The database outlives test runs, so every
test uses a catalog name of its own and removes its catalog rows at the end.
"""

from __future__ import annotations

import datetime as dt
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from conftest import (
    START_SERVERS_MSG,
    options_sql,
    norm_int,
    normalize_rows,
    run_floe_in,
    sql_values,
)

PG_URI = os.environ.get("FLOE_PG_URI", "postgres://floe:floe@127.0.0.1:55432/floe_catalog")

NS = "ns"
COLUMNS = ["id", "name", "amount", "ts", "d"]
TYPES = {"id": "long", "name": "string", "amount": "double", "ts": "timestamp", "d": "date"}
TABLE_DDL = "(id BIGINT NOT NULL, name STRING, amount DOUBLE, ts TIMESTAMP, d DATE)"
PARTITIONING = "days(ts), bucket(4, id)"

T = dt.datetime
D = dt.date
ROWS_1 = [
    {"id": 1, "name": "alice", "amount": 1.5, "ts": T(2024, 1, 2, 3, 4, 5), "d": D(2024, 1, 2)},
    {"id": 2, "name": "bob", "amount": -2.25, "ts": T(2024, 1, 2, 23, 59, 59, 123456), "d": None},
    {"id": 3, "name": None, "amount": None, "ts": T(2023, 12, 31, 12, 0, 0), "d": D(2023, 12, 31)},
]
ROWS_2 = [
    {"id": 4, "name": "éva", "amount": 1e10, "ts": T(2024, 2, 29, 10, 0, 0), "d": D(2024, 2, 29)},
    {"id": 5, "name": "dave", "amount": 0.0, "ts": T(1969, 12, 31, 23, 59, 59), "d": D(1969, 12, 31)},
]
ALL_ROWS = ROWS_1 + ROWS_2


def redacted(uri: str) -> str:
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = parts.netloc.replace(f":{parts.password}@", ":****@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def sqlalchemy_uri(uri: str) -> str:
    """postgres://... (libpq / sqlx) -> postgresql+psycopg2://... (SQLAlchemy)."""
    parts = urlsplit(uri)
    if parts.scheme not in ("postgres", "postgresql"):
        raise AssertionError(f"FLOE_PG_URI must be a postgres:// URI, got {redacted(uri)!r}")
    return urlunsplit(parts._replace(scheme="postgresql+psycopg2"))


def pg_connect():
    """A psycopg2 connection to the catalog database; FAILS the test when there is none."""
    try:
        import psycopg2
    except ImportError as e:
        pytest.fail(f"psycopg2 is missing ({e}): run scripts/test-env.sh install", pytrace=False)
    try:
        return psycopg2.connect(PG_URI, connect_timeout=3)
    except psycopg2.OperationalError as e:
        why = " ".join(str(e).split())
    # Outside the except block, so that the report is the hint alone.
    pytest.fail(
        f"{START_SERVERS_MSG}\n(PostgreSQL at {redacted(PG_URI)} is not reachable: {why})",
        pytrace=False,
    )


@dataclass
class PgLake:
    """An Iceberg SQL catalog named `name` in the PostgreSQL database, warehouse on disk."""

    name: str
    warehouse: Path

    def ddl(self) -> str:
        props = {
            "type": "iceberg",
            "catalog-type": "sql",
            "uri": PG_URI,
            "warehouse": str(self.warehouse),
        }
        return f"CREATE CATALOG {self.name} WITH ({options_sql(props)})"

    def pyiceberg(self):
        from pyiceberg.catalog.sql import SqlCatalog

        return SqlCatalog(
            self.name, uri=sqlalchemy_uri(PG_URI), warehouse=f"file://{self.warehouse}"
        )

    def delete_catalog_rows(self) -> None:
        """Remove this catalog's rows from the shared database (its files go with tmp_path)."""
        conn = pg_connect()
        try:
            with conn, conn.cursor() as cur:
                for table in ("iceberg_tables", "iceberg_namespace_properties"):
                    cur.execute("SELECT to_regclass(%s)", (table,))
                    if cur.fetchone()[0] is not None:
                        cur.execute(f"DELETE FROM {table} WHERE catalog_name = %s", (self.name,))
        finally:
            conn.close()


@pytest.fixture
def pg_lake(tmp_path: Path):
    warehouse = (tmp_path / "warehouse").resolve()
    warehouse.mkdir()
    lake = PgLake(name=f"pg_{uuid.uuid4().hex[:12]}", warehouse=warehouse)
    yield lake
    try:
        lake.delete_catalog_rows()
    except BaseException:  # an unreachable server already failed the test itself
        pass


@pytest.fixture
def floe_in(floe_bin: Path, tmp_path: Path):
    """floe_in(name, *sql): run one floe process in its own working folder `name`."""

    def run(name: str, *sql: str) -> list[dict[str, Any]]:
        cwd = tmp_path / name
        cwd.mkdir(exist_ok=True)
        return run_floe_in(floe_bin, cwd, *sql)

    return run


def select_all(table: str) -> str:
    return f"SELECT {', '.join(COLUMNS)} FROM {table} ORDER BY id"


def test_floe_and_pyiceberg_share_a_postgres_catalog(pg_lake: PgLake, floe_in):
    pg_connect().close()  # fail early, with the hint, when the server is not running
    fq = f"{pg_lake.name}.{NS}.t"

    # One floe process: catalog, namespace, partitioned table, two INSERTs, read back.
    rows = floe_in(
        "writer",
        pg_lake.ddl(),
        f"CREATE SCHEMA {pg_lake.name}.{NS}",
        f"CREATE TABLE {fq} {TABLE_DDL} PARTITIONED BY ({PARTITIONING})",
        f"INSERT INTO {fq} VALUES {sql_values(ROWS_1, COLUMNS)}",
        f"INSERT INTO {fq} VALUES {sql_values(ROWS_2, COLUMNS)}",
        select_all(fq),
    )
    # The two INSERTs each print their count; the SELECT's rows follow.
    counts, selected = rows[:2], rows[2:]
    assert [norm_int(r["count"]) for r in counts] == [len(ROWS_1), len(ROWS_2)], rows
    assert normalize_rows(selected, TYPES) == normalize_rows(ALL_ROWS, TYPES)

    # Another floe process finds the table through the catalog database alone.
    tables = floe_in("reader", pg_lake.ddl(), f"SHOW TABLES IN {pg_lake.name}.{NS}")
    assert [r.get("table_name") for r in tables] == ["t"], tables
    again = floe_in("reader", pg_lake.ddl(), select_all(fq))
    assert normalize_rows(again, TYPES) == normalize_rows(ALL_ROWS, TYPES)
    snapshots = floe_in(
        "reader", pg_lake.ddl(), f'SELECT operation FROM {pg_lake.name}.{NS}."t$snapshots"'
    )
    assert [r["operation"] for r in snapshots] == ["append", "append"], snapshots

    # pyiceberg (SQLAlchemy + psycopg2) opens the same catalog by name.
    catalog = pg_lake.pyiceberg()
    assert (NS,) in catalog.list_namespaces()
    assert catalog.list_tables(NS) == [(NS, "t")]
    table = catalog.load_table(f"{NS}.t")
    assert table.metadata_location.startswith(f"file://{pg_lake.warehouse}/"), table.metadata_location
    assert normalize_rows(table.scan().to_arrow().to_pylist(), TYPES) == normalize_rows(ALL_ROWS, TYPES)
    assert len(table.snapshots()) == 2
    spec = [(table.schema().find_field(f.source_id).name, str(f.transform)) for f in table.spec().fields]
    assert spec == [("ts", "day"), ("id", "bucket[4]")], spec
    schema = {f.name: (str(f.field_type), f.required) for f in table.schema().fields}
    assert schema == {c: (t, c == "id") for c, t in TYPES.items()}, table.schema()


def test_floe_sees_pyiceberg_commits_on_postgres(pg_lake: PgLake, floe_in):
    """The other direction: pyiceberg commits to a floe table, floe commits after it."""
    import pyarrow as pa

    pg_connect().close()
    fq = f"{pg_lake.name}.{NS}.t"
    floe_in(
        "writer",
        pg_lake.ddl(),
        f"CREATE SCHEMA {pg_lake.name}.{NS}",
        f"CREATE TABLE {fq} {TABLE_DDL} PARTITIONED BY ({PARTITIONING})",
        f"INSERT INTO {fq} VALUES {sql_values(ROWS_1, COLUMNS)}",
    )

    table = pg_lake.pyiceberg().load_table(f"{NS}.t")
    arrow_schema = table.schema().as_arrow()
    table.append(pa.Table.from_pylist(ROWS_2, schema=arrow_schema))

    floe_in("writer", pg_lake.ddl(), f"INSERT INTO {fq} VALUES {sql_values([ROWS_1[0] | {'id': 6}], COLUMNS)}")
    want = normalize_rows(ALL_ROWS + [ROWS_1[0] | {"id": 6}], TYPES)
    assert normalize_rows(floe_in("reader", pg_lake.ddl(), select_all(fq)), TYPES) == want

    table = pg_lake.pyiceberg().load_table(f"{NS}.t")
    assert normalize_rows(table.scan().to_arrow().to_pylist(), TYPES) == want
    assert len(table.snapshots()) == 3
