#!/usr/bin/env python3
"""Seed the Kafka topic that sql/avro.sql reads: Avro orders in the Confluent wire format.

    eval "$(scripts/test-env.sh env)"
    "$FLOE_TEST_PYTHON" scripts/avro-seed.py [--bootstrap 127.0.0.1:9092]
        [--registry http://127.0.0.1:8081] [--topic floe-example-avro]

Registers sql/avro/order-v1.avsc and order-v2.avsc (v2 adds `coupon` and promotes `quantity`
from int to long) with the schema registry (the fixture scripts/test-env.sh starts), then
writes 500 orders with v1, one record naming a schema id the registry does not know, and 500
orders with v2, encoded by fastavro. Schemas are registered on every run (the fixture keeps
them in memory); a topic that exists already is left as it is.
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import io
import json
import os
import struct
import sys
import urllib.request
from pathlib import Path

import fastavro
from seeding import Sender, new_topic

SCHEMAS = Path(__file__).resolve().parent.parent / "sql" / "avro"
PER_VERSION = 500
BASE = dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc)
CUSTOMERS = ["ann", "bob", "cho", "dia", "eve"]


def register(registry: str, subject: str, schema: str) -> int:
    req = urllib.request.Request(
        f"{registry}/subjects/{subject}/versions",
        data=json.dumps({"schema": schema}).encode(),
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)["id"]


def encode(schema_id: int, schema: dict, record: dict) -> bytes:
    out = io.BytesIO()
    out.write(b"\x00" + struct.pack(">I", schema_id))
    fastavro.schemaless_writer(out, schema, record)
    return out.getvalue()


def order(i: int, v2: bool) -> dict:
    r = {
        "order_id": i,
        "customer": CUSTOMERS[i % len(CUSTOMERS)],
        "quantity": (3_000_000_000 + i) if v2 and i % 100 == 0 else i % 5 + 1,
        "status": ["NEW", "PAID", "SHIPPED"][i % 3],
        "total": decimal.Decimal(i % 200) + decimal.Decimal("0.99"),
        "ordered_at": BASE + dt.timedelta(minutes=7 * i),
        "note": "gift" if i % 11 == 0 else None,
    }
    if v2:
        r["coupon"] = "SPRING" if i % 4 == 0 else None
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", default=os.environ.get("FLOE_KAFKA", "127.0.0.1:9092"))
    ap.add_argument("--registry", default=os.environ.get("FLOE_SCHEMA_REGISTRY", "http://127.0.0.1:8081"))
    ap.add_argument("--topic", default="floe-example-avro")
    args = ap.parse_args()

    texts = [(SCHEMAS / f"order-v{v}.avsc").read_text() for v in (1, 2)]
    ids = [register(args.registry, f"{args.topic}-value", t) for t in texts]
    schemas = [fastavro.parse_schema(json.loads(t)) for t in texts]

    if not new_topic(args.bootstrap, args.topic, 2):
        return 0
    sender = Sender(args.bootstrap)
    for i in range(PER_VERSION):
        sender.send(args.topic, str(i).encode(), encode(ids[0], schemas[0], order(i, False)))
    # A record naming a schema the registry does not know: a dead letter.
    sender.send(args.topic, b"unknown", b"\x00" + struct.pack(">I", 4242) + b"\x02\x06abc")
    for i in range(PER_VERSION, 2 * PER_VERSION):
        sender.send(args.topic, str(i).encode(), encode(ids[1], schemas[1], order(i, True)))
    return sender.finish(
        args.topic, f"topic {args.topic}: {2 * PER_VERSION + 1} Avro records, schemas {ids} at {args.registry}"
    )


if __name__ == "__main__":
    sys.exit(main())
