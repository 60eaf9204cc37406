"""The blog scenario on Kafka with JSON whose schema floe infers per record.

v1 payloads arrive first; then, with the same job still running (no restart), v2 payloads add
`userAgent` and `scrollDepth` (and a nested `device.os`) to page views and a new
`interaction_events` type appears. The routed tables are read back through pyiceberg and
DuckDB, not through floe.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from conftest import SqlLake, options_sql
from test_kafka import Producer, create_topic, kafka, start_floe, stop_floe  # noqa: F401

V1 = 300
V2 = 300


def v1(i: int) -> dict:
    if i % 3 == 0:
        return {"event_type": "order_events", "id": i, "amount": i * 1.5, "region": "eu"}
    return {"event_type": "page_view_events", "id": i, "url": f"/p/{i}", "device": {"w": 1280}}


def v2(i: int) -> dict:
    if i % 3 == 0:
        return {"event_type": "interaction_events", "id": i, "element": "button", "clicks": [1, 2]}
    return {
        "event_type": "page_view_events",
        "id": i,
        "url": f"/p/{i}",
        "userAgent": "Mozilla/5.0",
        "scrollDepth": 0.5,
        "device": {"w": 390, "os": "ios"},
    }


def ids_in(lake: SqlLake, table: str) -> set[int]:
    try:
        t = lake.pyiceberg().load_table(f"blog.{table}")
    except Exception:  # not created yet
        return set()
    return set(t.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist())


def wait_for(lake: SqlLake, want: dict[str, int], proc, cwd: Path, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    got: dict[str, int] = {}
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"floe exited with {proc.returncode}: {(cwd / 'floe.err').read_text()}")
        got = {t: len(ids_in(lake, t)) for t in want}
        if got == want:
            return
        time.sleep(0.5)
    raise AssertionError(f"tables hold {got} rows after {timeout} s, expected {want}")


def test_drifting_json_evolves_routed_tables_without_a_restart(kafka, floe_bin, tmp_path, lake, duck):
    topic = create_topic(kafka, partitions=2)
    producer = Producer(kafka)
    for i in range(V1):
        producer.send(topic, json.dumps(v1(i)).encode(), key=str(i).encode())
    producer.flush()

    workdir = tmp_path / "work"
    workdir.mkdir()
    options = {
        "connector": "kafka",
        "topic": topic,
        "properties.bootstrap.servers": kafka,
        "format": "json",
        "scan.startup.mode": "earliest-offset",
    }
    body = options_sql(options)
    (workdir / "job.sql").write_text(
        f"""{lake.ddl()};
CREATE SOURCE events WITH ({body});
SET 'pipeline.name' = 'blog'; SET 'checkpoint.interval' = '300ms'; SET 'state.dir' = 'state';
INSERT INTO lake.blog SELECT * FROM events ROUTE BY event_type
WITH ('partition.candidates' = 'region');
"""
    )
    proc = start_floe(floe_bin, workdir)
    try:
        orders = sum(1 for i in range(V1) if i % 3 == 0)
        wait_for(lake, {"order_events": orders, "page_view_events": V1 - orders}, proc, workdir)
        for i in range(V1, V1 + V2):
            producer.send(topic, json.dumps(v2(i)).encode(), key=str(i).encode())
        producer.flush()
        new = sum(1 for i in range(V1, V1 + V2) if i % 3 == 0)
        wait_for(
            lake,
            {
                "order_events": orders,
                "page_view_events": V1 - orders + V2 - new,
                "interaction_events": new,
            },
            proc,
            workdir,
        )
    finally:
        stop_floe(proc, workdir)

    catalog = lake.pyiceberg()
    names = sorted(t[1] for t in catalog.list_tables("blog"))
    assert names == ["interaction_events", "order_events", "page_view_events"], names

    # The new fields are optional columns, nested ones too; old rows read them as NULL.
    views = catalog.load_table("blog.page_view_events")
    schema = views.schema()
    assert str(schema.find_field("userAgent").field_type) == "string"
    assert str(schema.find_field("scrollDepth").field_type) == "double"
    assert str(schema.find_field("id").field_type) == "long"
    for name in ("userAgent", "scrollDepth", "device.os"):
        assert not schema.find_field(name).required, name
    rows = views.scan().to_arrow().to_pylist()
    old = [r for r in rows if r["id"] < V1]
    new_rows = [r for r in rows if r["id"] >= V1]
    assert old and all(r["userAgent"] is None and r["device"]["os"] is None for r in old)
    assert all(r["device"]["w"] == 1280 for r in old)
    assert new_rows and all(
        r["userAgent"] == "Mozilla/5.0" and r["scrollDepth"] == 0.5 and r["device"]["os"] == "ios"
        for r in new_rows
    )
    # Orders never carried the page-view fields, and only orders carry a region (partitioned).
    orders_table = catalog.load_table("blog.order_events")
    assert "url" not in [f.name for f in orders_table.schema().fields]
    assert [f.name for f in orders_table.spec().fields] == ["region"]
    assert not views.spec().fields
    interactions = catalog.load_table("blog.interaction_events").scan().to_arrow().to_pylist()
    assert all(r["clicks"] == [1, 2] and r["element"] == "button" for r in interactions)

    # DuckDB reads the same tables, evolved schema and all.
    for name in names:
        table = catalog.load_table(f"blog.{name}")
        n = duck.execute(f"SELECT count(*) FROM iceberg_scan('{table.metadata_location}')").fetchone()[0]
        assert n == len(table.scan().to_arrow()), name
    got = duck.execute(
        f"SELECT count(*), count(\"userAgent\") FROM iceberg_scan('{views.metadata_location}')"
    ).fetchone()
    assert got == (V1 - orders + V2 - new, V2 - new), got
