"""Interop tests: tables floe writes are real Iceberg, and floe reads tables others write.

Independent readers/writers: pyiceberg 0.12 (SqlCatalog on sqlite, RestCatalog on SeaweedFS)
and DuckDB's iceberg extension. See conftest.py for how to run.
"""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from conftest import (
    SqlLake,
    drop_rest_namespace,
    norm_int,
    normalize_rows,
    require_rest_server,
    rest_catalog_ddl,
    sql_values,
)

NS = "ns"
COLUMNS = ["id", "name", "amount", "ts", "d"]
TYPES = {"id": "long", "name": "string", "amount": "double", "ts": "timestamp", "d": "date"}
TABLE_DDL_COLUMNS = "(id BIGINT NOT NULL, name STRING, amount DOUBLE, ts TIMESTAMP, d DATE)"

T = dt.datetime
D = dt.date

ROWS_1 = [
    {"id": 1, "name": "alice", "amount": 1.5, "ts": T(2024, 1, 2, 3, 4, 5), "d": D(2024, 1, 2)},
    {"id": 2, "name": "bob", "amount": -2.25, "ts": T(2024, 1, 2, 23, 59, 59, 123456), "d": D(2024, 1, 1)},
    {"id": 3, "name": "carol", "amount": None, "ts": T(2024, 1, 3, 0, 0, 0), "d": None},
    {"id": 4, "name": None, "amount": 1e10, "ts": T(2023, 12, 31, 12, 0, 0), "d": D(2023, 12, 31)},
]
ROWS_2 = [
    {"id": 5, "name": "alice", "amount": 0.0, "ts": T(2024, 2, 29, 10, 0, 0), "d": D(2024, 2, 29)},
    {"id": 6, "name": "dave", "amount": 3.75, "ts": T(2024, 1, 3, 8, 30, 0), "d": D(2024, 1, 3)},
    {"id": 7, "name": "éva", "amount": 100.125, "ts": T(1970, 1, 1, 0, 0, 0), "d": D(1970, 1, 1)},
    {"id": 8, "name": "bo", "amount": 7.5, "ts": T(2024, 1, 2, 12, 0, 0), "d": D(2024, 1, 2)},
]
# Values where transforms are easy to get wrong (negative days/hashes, short strings).
EDGE_ROWS = [
    {"id": -1, "name": "z", "amount": 0.5, "ts": T(1969, 12, 31, 23, 59, 59), "d": D(1969, 12, 31)},
    {"id": 2**40 + 3, "name": "xy", "amount": 2.5, "ts": T(2038, 1, 19, 3, 14, 8), "d": D(2038, 1, 19)},
]
ALL_ROWS = ROWS_1 + ROWS_2


def expected(rows: list[dict[str, Any]], types: dict[str, str] = TYPES) -> list[dict[str, Any]]:
    return normalize_rows(rows, types)


def select_all_sql(table: str, columns: list[str] = COLUMNS) -> str:
    return f"SELECT {', '.join(columns)} FROM {table} ORDER BY id"


def create_floe_table(
    run_lake, partition: str = "days(ts)", table: str = "t", batches=(ROWS_1, ROWS_2)
) -> str:
    """Create lake.ns.<table> with floe; one INSERT (= one snapshot) per batch.

    The first batch runs in the same invocation as the DDL, later ones in their own
    invocations (tables must survive the process)."""
    fq = f"lake.{NS}.{table}"
    first, *rest = batches
    run_lake(
        f"CREATE SCHEMA lake.{NS}",
        f"CREATE TABLE {fq} {TABLE_DDL_COLUMNS} PARTITIONED BY ({partition})",
        f"INSERT INTO {fq} VALUES {sql_values(first, COLUMNS)}",
    )
    for batch in rest:
        run_lake(f"INSERT INTO {fq} VALUES {sql_values(batch, COLUMNS)}")
    return fq


def local_path(uri: str) -> Path:
    parsed = urlparse(uri)
    if parsed.scheme not in ("", "file"):
        raise AssertionError(f"expected a local file URI, got {uri!r}")
    return Path(parsed.path if parsed.scheme else uri)


def assert_schema_types(table) -> None:
    schema = table.schema()
    got = {f.name: (str(f.field_type), f.required) for f in schema.fields}
    want = {c: (t, c == "id") for c, t in TYPES.items()}
    assert got == want, f"schema mismatch:\n{schema}"


def assert_partition_values_match_transforms(table) -> None:
    """Every data file's partition tuple must equal pyiceberg's transform of each row in it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = table.schema()
    specs = table.specs()
    tasks = list(table.scan().plan_files())
    assert tasks, "table has no data files"
    for task in tasks:
        data_file = task.file
        spec = specs[data_file.spec_id]
        arrow = pq.read_table(local_path(data_file.file_path))
        by_id = {}
        for i, f in enumerate(arrow.schema):
            fid = (f.metadata or {}).get(b"PARQUET:field_id")
            if fid is not None:
                by_id[int(fid)] = arrow.column(i)
        for pos, pfield in enumerate(spec.fields):
            source = schema.find_field(pfield.source_id)
            col = by_id.get(pfield.source_id)
            if col is None:
                col = arrow.column(source.name)
            if pa.types.is_timestamp(col.type):
                col = col.cast(pa.timestamp("us")).cast(pa.int64())
            elif pa.types.is_date32(col.type):
                col = col.cast(pa.int32())
            fn = pfield.transform.transform(source.field_type)
            want = {None if v is None else fn(v) for v in col.to_pylist()}
            got = data_file.partition[pos]
            assert want == {got}, (
                f"{data_file.file_path}: partition field {pfield.name} ({pfield.transform}) "
                f"is {got!r} but its rows transform to {sorted(want, key=repr)!r}"
            )


# --------------------------------------------------------------------------- (a)


def test_pyiceberg_reads_floe_table(run_lake, lake: SqlLake):
    fq = create_floe_table(run_lake)

    # floe reads its own table back (also checks the ndjson contract).
    floe_rows = run_lake(select_all_sql(fq))
    assert [norm_int(r.get("id")) for r in floe_rows] == sorted(r["id"] for r in ALL_ROWS)
    assert normalize_rows(floe_rows, TYPES) == expected(ALL_ROWS)

    table = lake.pyiceberg().load_table(f"{NS}.t")
    assert table.metadata_location.startswith("file:///"), table.metadata_location
    assert normalize_rows(table.scan().to_arrow().to_pylist(), TYPES) == expected(ALL_ROWS)

    assert len(table.snapshots()) == 2, [s.model_dump() for s in table.snapshots()]
    snapshot_ops = [s.summary.operation.value if s.summary else None for s in table.snapshots()]
    assert snapshot_ops == ["append", "append"], snapshot_ops

    fields = [(schema_name(table, f.source_id), str(f.transform)) for f in table.spec().fields]
    assert fields == [("ts", "day")], table.spec()
    assert_schema_types(table)
    assert_partition_values_match_transforms(table)


def schema_name(table, field_id: int) -> str:
    return table.schema().find_column_name(field_id)


@pytest.mark.parametrize(
    "partition, source, transform",
    [
        ("days(ts)", "ts", "day"),
        ("bucket(4, id)", "id", "bucket[4]"),
        ("truncate(2, name)", "name", "truncate[2]"),
        ("name", "name", "identity"),
    ],
)
def test_floe_partition_transforms(run_lake, lake: SqlLake, partition, source, transform):
    batches = (ROWS_1, ROWS_2 + EDGE_ROWS)
    create_floe_table(run_lake, partition=partition, batches=batches)
    table = lake.pyiceberg().load_table(f"{NS}.t")
    fields = [(schema_name(table, f.source_id), str(f.transform)) for f in table.spec().fields]
    assert fields == [(source, transform)], table.spec()
    rows = ROWS_1 + ROWS_2 + EDGE_ROWS
    assert normalize_rows(table.scan().to_arrow().to_pylist(), TYPES) == expected(rows)
    assert_partition_values_match_transforms(table)


# --------------------------------------------------------------------------- (b)


def test_duckdb_reads_floe_table(run_lake, lake: SqlLake, duck):
    create_floe_table(run_lake)
    table = lake.pyiceberg().load_table(f"{NS}.t")
    loc = table.metadata_location.replace("'", "''")
    cur = duck.execute(f"SELECT {', '.join(COLUMNS)} FROM iceberg_scan('{loc}') ORDER BY id")
    names = [d[0] for d in cur.description]
    rows = [dict(zip(names, r)) for r in cur.fetchall()]
    assert normalize_rows(rows, TYPES) == expected(ALL_ROWS)
    (n_snap,) = duck.execute(f"SELECT count(*) FROM iceberg_snapshots('{loc}')").fetchone()
    assert n_snap == 2


# --------------------------------------------------------------------------- (c)


def test_floe_reads_pyiceberg_table(run_lake, lake: SqlLake):
    import pyarrow as pa
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import DayTransform, IdentityTransform
    from pyiceberg.types import DoubleType, LongType, NestedField, StringType, TimestampType

    catalog = lake.pyiceberg()
    catalog.create_namespace(NS)
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "name", StringType(), required=False),
        NestedField(3, "amount", DoubleType(), required=False),
        NestedField(4, "ts", TimestampType(), required=False),
    )
    spec = PartitionSpec(
        PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="name"),
        PartitionField(source_id=4, field_id=1001, transform=DayTransform(), name="ts_day"),
    )
    table = catalog.create_table(f"{NS}.events", schema=schema, partition_spec=spec)

    appends = [
        [
            {"id": 1, "name": "a", "amount": 1.0, "ts": T(2024, 1, 1, 10, 0, 0)},
            {"id": 2, "name": "b", "amount": 2.0, "ts": T(2024, 1, 1, 11, 0, 0)},
        ],
        [
            {"id": 3, "name": "a", "amount": None, "ts": T(2024, 1, 2, 0, 0, 1)},
            {"id": 4, "name": "c", "amount": 4.5, "ts": T(2024, 1, 3, 23, 59, 59)},
        ],
        [
            {"id": 5, "name": "b", "amount": 5.25, "ts": T(2024, 1, 3, 12, 0, 0)},
            {"id": 6, "name": "a", "amount": -6.0, "ts": T(2024, 1, 4, 0, 0, 0)},
        ],
    ]
    for batch in appends:
        table.append(pa.Table.from_pylist(batch, schema=table.schema().as_arrow()))

    with table.update_schema() as update:
        update.add_column("note", StringType())
    table = catalog.load_table(f"{NS}.events")
    last = [
        {"id": 7, "name": "b", "amount": 7.0, "ts": T(2024, 1, 3, 1, 0, 0), "note": "seven"},
        {"id": 8, "name": "d", "amount": None, "ts": T(2024, 1, 5, 6, 0, 0), "note": None},
        {"id": 9, "name": "a", "amount": 9.5, "ts": T(2024, 1, 1, 9, 0, 0), "note": "nine"},
    ]
    table.append(pa.Table.from_pylist(last, schema=table.schema().as_arrow()))
    table = catalog.load_table(f"{NS}.events")
    assert len(table.snapshots()) == 4

    types = {"id": "long", "name": "string", "amount": "double", "ts": "timestamp", "note": "string"}
    all_rows = [{**r, "note": None} for batch in appends for r in batch] + last
    want = normalize_rows(all_rows, types)
    assert normalize_rows(table.scan().to_arrow().to_pylist(), types) == want  # sanity

    fq = f"lake.{NS}.events"
    got = run_lake(f"SELECT id, name, amount, ts, note FROM {fq} ORDER BY id")
    assert [norm_int(r.get("id")) for r in got] == list(range(1, 10))
    assert normalize_rows(got, types) == want

    (count,) = run_lake(f"SELECT count(*) AS n FROM {fq}")
    assert norm_int(count["n"]) == len(all_rows) == 9

    got_b = run_lake(f"SELECT id, name, amount, ts, note FROM {fq} WHERE name = 'b' ORDER BY id")
    assert normalize_rows(got_b, types) == [r for r in want if r["name"] == "b"]

    got_day = run_lake(
        f"SELECT id FROM {fq} WHERE ts >= TIMESTAMP '2024-01-03 00:00:00' "
        f"AND ts < TIMESTAMP '2024-01-04 00:00:00' ORDER BY id"
    )
    assert [norm_int(r["id"]) for r in got_day] == [4, 5, 7]


# --------------------------------------------------------------------------- (d)


def test_floe_metadata_tables(run_lake, lake: SqlLake):
    fq = create_floe_table(run_lake)
    table = lake.pyiceberg().load_table(f"{NS}.t")

    (snaps,) = run_lake(f'SELECT count(*) AS n FROM lake.{NS}."t$snapshots"')
    assert norm_int(snaps["n"]) == len(table.snapshots()) == 2

    files = table.inspect.files()
    assert files.num_rows > 0
    (nfiles,) = run_lake(f'SELECT count(*) AS n FROM lake.{NS}."t$files"')
    assert norm_int(nfiles["n"]) == files.num_rows, files.select(["file_path"]).to_pylist()


# --------------------------------------------------------------------------- (e)


def test_rest_catalog_roundtrip(rest_catalog_factory, run_floe):
    require_rest_server()  # fails with "start the test servers: ..." when it is down
    rest_catalog = rest_catalog_factory()
    ns = f"floe_it_{uuid.uuid4().hex[:12]}"
    ddl = rest_catalog_ddl("rest")
    fq = f"rest.{ns}.t"
    try:
        run_floe(
            ddl,
            f"CREATE SCHEMA rest.{ns}",
            f"CREATE TABLE {fq} {TABLE_DDL_COLUMNS} PARTITIONED BY (days(ts))",
            f"INSERT INTO {fq} VALUES {sql_values(ROWS_1, COLUMNS)}",
        )
        run_floe(ddl, f"INSERT INTO {fq} VALUES {sql_values(ROWS_2, COLUMNS)}")

        got = run_floe(ddl, select_all_sql(fq))
        assert normalize_rows(got, TYPES) == expected(ALL_ROWS)

        (snaps,) = run_floe(ddl, f'SELECT count(*) AS n FROM rest.{ns}."t$snapshots"')
        assert norm_int(snaps["n"]) == 2

        table = rest_catalog.load_table((ns, "t"))
        assert table.metadata_location.startswith("s3://"), table.metadata_location
        assert len(table.snapshots()) == 2
        assert normalize_rows(table.scan().to_arrow().to_pylist(), TYPES) == expected(ALL_ROWS)
        assert_schema_types(table)
        fields = [(schema_name(table, f.source_id), str(f.transform)) for f in table.spec().fields]
        assert fields == [("ts", "day")], table.spec()
    finally:
        drop_rest_namespace(rest_catalog, ns, ["t"])
