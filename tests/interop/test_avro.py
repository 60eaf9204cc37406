"""Avro in the Confluent wire format from Kafka (tansu), with a schema registry.

No Confluent-compatible registry installs here, so the registry is the small fixture in
scripts/schema-registry.py, served by this test. The records are encoded by fastavro (an
independent Avro implementation), not by floe. What floe writes is read back with pyiceberg.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import importlib.util
import io
import json
import struct
import subprocess
import urllib.request
import uuid
from pathlib import Path

import fastavro

from conftest import MetricsJob, SqlLake, free_port, options_sql
from test_kafka import Producer, create_topic, kafka  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]


def load_fixture():
    spec = importlib.util.spec_from_file_location("schema_registry", ROOT / "scripts" / "schema-registry.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


V1 = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "order_id", "type": "long", "doc": "the order's id"},
        {"name": "quantity", "type": "int"},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3}},
        {"name": "ordered_at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
        {
            "name": "buyer",
            "type": {
                "type": "record",
                "name": "Buyer",
                "fields": [{"name": "name", "type": "string", "doc": "the buyer's name"}],
            },
        },
    ],
}
# v2: a new optional field, and quantity promoted from int to long.
V2 = {
    **V1,
    "fields": [
        {**f, "type": "long"} if f["name"] == "quantity" else f for f in V1["fields"]
    ]
    + [{"name": "coupon", "type": ["null", "string"], "default": None}],
}
BASE = dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc)


def register(url: str, subject: str, schema: dict, user_info: str | None = None) -> int:
    body = json.dumps({"schema": json.dumps(schema)}).encode()
    headers = {"Content-Type": "application/vnd.schemaregistry.v1+json"}
    if user_info:
        headers["Authorization"] = "Basic " + base64.b64encode(user_info.encode()).decode()
    req = urllib.request.Request(f"{url}/subjects/{subject}/versions", data=body, headers=headers)
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.load(r)["id"]


def encode(schema_id: int, schema: dict, record: dict) -> bytes:
    out = io.BytesIO()
    out.write(b"\x00" + struct.pack(">I", schema_id))
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def order(i: int, v2: bool) -> dict:
    r = {
        "order_id": i,
        "quantity": (5_000_000_000 + i) if v2 else i % 7 + 1,
        "status": "PAID" if i % 2 else "NEW",
        "price": decimal.Decimal(f"{i}.125"),
        "ordered_at": BASE + dt.timedelta(minutes=i),
        "note": None if i % 3 else f"note {i}",
        "ref": uuid.UUID(int=i),
        "buyer": {"name": f"b{i % 4}"},
    }
    if v2:
        r["coupon"] = f"C{i}"
    return r


def avro_source(topic: str, bootstrap: str, url: str | None, columns: str = "", **extra: str) -> str:
    """CREATE SOURCE orders for `topic`, read to its end: Avro in the Confluent wire format
    with the registry at `url`, or as `extra` says."""
    options = {
        "connector": "kafka",
        "topic": topic,
        "properties.bootstrap.servers": bootstrap,
        **({"format": "avro-confluent", "avro-confluent.url": url} if url else {}),
        "scan.startup.mode": "earliest-offset",
        "scan.bounded.mode": "latest-offset",
        **extra,
    }
    body = options_sql(options)
    return f"CREATE SOURCE orders {columns} WITH ({body})"


def test_avro_records_land_with_exact_types_and_evolve_with_the_registry(kafka, floe_bin, tmp_path, lake: SqlLake):
    registry = load_fixture().serve("127.0.0.1", 0, "floe:secret")
    url = f"http://127.0.0.1:{registry.server_address[1]}"
    try:
        # Register as a producer does, with the fixture's basic auth.
        v1 = register(url, "orders-value", V1, "floe:secret")
        v2 = register(url, "orders-value", V2, "floe:secret")
        assert v1 != v2

        topic = create_topic(kafka, partitions=2)
        producer = Producer(kafka)
        for i in range(200):
            producer.send(topic, encode(v1, V1, order(i, False)), key=str(i).encode())
        producer.send(topic, b"\x00\x00\x00\x03\xe7garbage", key=b"unknown-id")  # id 999
        producer.send(topic, b"not avro at all", key=b"no-magic")
        producer.send(topic, b"\x00" + struct.pack(">I", v1) + b"\x02", key=b"cut-short")
        for i in range(200, 300):
            producer.send(topic, encode(v2, V2, order(i, True)), key=str(i).encode())
        producer.flush()

        source = avro_source(topic, kafka, url, "(_key STRING)", **{"avro-confluent.basic-auth.user-info": "floe:secret"})
        run_job(floe_bin, tmp_path, lake, source, "avro")
    finally:
        registry.shutdown()

    catalog = lake.pyiceberg()
    table = catalog.load_table("avro.orders")
    schema = table.schema()
    types = {f.name: str(f.field_type) for f in schema.fields if f.name != "buyer"}
    assert types == {
        "order_id": "long",
        "quantity": "long",  # int in v1, widened when v2 promoted it
        "status": "string",
        "price": "decimal(12, 3)",
        "ordered_at": "timestamptz",
        "note": "string",
        "ref": "uuid",
        "_key": "string",
        "coupon": "string",
    }, types
    assert schema.find_field("order_id").doc == "the order's id"
    assert schema.find_field("buyer.name").doc == "the buyer's name"
    rows = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["order_id"])
    assert [r["order_id"] for r in rows] == list(range(300))
    first, last = rows[1], rows[250]
    assert first["quantity"] == 2 and first["coupon"] is None and first["status"] == "PAID"
    assert first["price"] == decimal.Decimal("1.125")
    assert first["ordered_at"] == BASE + dt.timedelta(minutes=1)
    assert last["quantity"] == 5_000_000_250 and last["coupon"] == "C250"
    assert rows[3]["note"] == "note 3" and rows[1]["note"] is None
    ref = rows[7]["ref"]
    assert (ref if isinstance(ref, uuid.UUID) else uuid.UUID(bytes=ref)) == uuid.UUID(int=7)

    dead = catalog.load_table("avro.dead_letters").scan().to_arrow().to_pylist()
    errors = sorted(r["error"] for r in dead)
    assert len(errors) == 3, errors
    assert any("schema id 999 is unknown to the registry" in e for e in errors), errors
    assert any("not in the Confluent wire format" in e for e in errors), errors
    assert any("offset" in e and "cannot decode" in e for e in errors), errors


def test_a_registry_that_is_down_is_retried_not_dead_lettered(kafka, floe_bin, tmp_path, lake: SqlLake):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    topic = create_topic(kafka, partitions=1)
    # The records name schema 1 of a registry that is not running yet.
    producer = Producer(kafka)
    for i in range(50):
        producer.send(topic, encode(1, V1, order(i, False)))
    producer.flush()
    script = job_script(tmp_path, lake, avro_source(topic, kafka, url), "down")
    registry = None
    try:
        with MetricsJob(floe_bin, script, tmp_path) as job:
            job.wait_for('state="retrying"', timeout=60)
            # The registry comes up, with the schema under id 1: the job goes on and finishes.
            registry = load_fixture().serve("127.0.0.1", port)
            assert register(url, "orders-value", V1) == 1
            job.finish(timeout=120)
    finally:
        if registry:
            registry.shutdown()
    table = lake.pyiceberg().load_table("down.orders")
    assert len(table.scan().to_arrow()) == 50
    assert "dead_letters" not in [t[1] for t in lake.pyiceberg().list_tables("down")]


def job_script(cwd: Path, lake: SqlLake, source: str, name: str) -> Path:
    """A script routing `source` (a CREATE SOURCE orders) into table `orders` of namespace
    `name`, as job `name`."""
    script = cwd / "job.sql"
    script.write_text(
        f"""{lake.ddl()};
{source};
SET 'pipeline.name' = '{name}'; SET 'checkpoint.interval' = '200ms'; SET 'state.dir' = 'state';
INSERT INTO lake.{name} SELECT * FROM orders ROUTE BY 'orders';
"""
    )
    return script


def run_job(floe_bin: Path, cwd: Path, lake: SqlLake, source: str, name: str, env=None) -> None:
    """Run [`job_script`] to its end."""
    script = job_script(cwd, lake, source, name)
    done = subprocess.run(
        [str(floe_bin), "-q", "-f", str(script)], cwd=cwd, capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr


def check_orders_table(table, ids: range) -> None:
    """The orders as v1 then v2 wrote them, with exact types."""
    types = {f.name: str(f.field_type) for f in table.schema().fields}
    for name, t in {
        "order_id": "long",
        "quantity": "long",
        "status": "string",
        "price": "decimal(12, 3)",
        "ordered_at": "timestamptz",
        "coupon": "string",
    }.items():
        assert types[name] == t, types
    rows = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["order_id"])
    assert [r["order_id"] for r in rows] == list(ids)
    assert rows[1]["price"] == decimal.Decimal("1.125") and rows[1]["coupon"] is None


def test_avro_in_the_glue_wire_format_with_the_glue_registry(kafka, floe_bin, tmp_path, lake: SqlLake):
    """The Glue Schema Registry served by moto; records framed as the Glue serializer does
    (version byte 3, compression none or zlib, the schema version UUID), bodies by fastavro."""
    import os
    import zlib

    from conftest import MOTO_URI as moto, glue_client

    glue = glue_client()
    registry = f"reg-{uuid.uuid4().hex[:8]}"
    glue.create_registry(RegistryName=registry)
    v1 = glue.create_schema(
        RegistryId={"RegistryName": registry},
        SchemaName="orders",
        DataFormat="AVRO",
        Compatibility="NONE",
        SchemaDefinition=json.dumps(V1),
    )["SchemaVersionId"]
    v2 = glue.register_schema_version(
        SchemaId={"RegistryName": registry, "SchemaName": "orders"}, SchemaDefinition=json.dumps(V2)
    )["SchemaVersionId"]

    def glue_record(version: str, schema: dict, record: dict, compress: bool) -> bytes:
        body = io.BytesIO()
        fastavro.schemaless_writer(body, fastavro.parse_schema(schema), record)
        data = zlib.compress(body.getvalue()) if compress else body.getvalue()
        return bytes([3, 5 if compress else 0]) + uuid.UUID(version).bytes + data

    topic = create_topic(kafka, partitions=2)
    producer = Producer(kafka)
    for i in range(100):
        producer.send(topic, glue_record(v1, V1, order(i, False), compress=i % 2 == 1))
    producer.send(topic, glue_record(str(uuid.uuid4()), V1, order(0, False), compress=False))
    for i in range(100, 150):
        producer.send(topic, glue_record(v2, V2, order(i, True), compress=i % 3 == 0))
    producer.flush()

    source = avro_source(
        topic,
        kafka,
        None,
        **{
            "format": "avro-glue",
            "avro-glue.region": "us-east-1",
            "avro-glue.endpoint": moto,
            "avro-glue.registry": registry,
        },
    )
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_EC2_METADATA_DISABLED": "true"}
    run_job(floe_bin, tmp_path, lake, source, "glue", env)
    catalog = lake.pyiceberg()
    check_orders_table(catalog.load_table("glue.orders"), range(150))
    dead = catalog.load_table("glue.dead_letters").scan().to_arrow().to_pylist()
    assert len(dead) == 1 and f"is unknown to {registry}" in dead[0]["error"], dead

