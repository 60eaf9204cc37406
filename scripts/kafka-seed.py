#!/usr/bin/env python3
"""Seed the Kafka topic that sql/kafka.sql reads: 1,000 JSON orders and one bad record.

    eval "$(scripts/test-env.sh env)"
    "$FLOE_TEST_PYTHON" scripts/kafka-seed.py [--bootstrap 127.0.0.1:9092] [--topic floe-example-orders]

The records are the same on every run (keys, values, partitions and timestamps). A topic that
exists already is left as it is, so running this twice does not double the data. Needs the
confluent-kafka package (installed by scripts/test-env.sh install).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from seeding import Sender, new_topic

ORDERS = 1000
PARTITIONS = 3
# 2024-05-01T00:00:00Z; order i is 5 i minutes later (over four days).
BASE_MS = 1_714_521_600_000
CUSTOMERS = ["ann", "bob", "cho", "dia", "eve"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", default=os.environ.get("FLOE_KAFKA", "127.0.0.1:9092"))
    ap.add_argument("--topic", default="floe-example-orders")
    args = ap.parse_args()

    if not new_topic(args.bootstrap, args.topic, PARTITIONS):
        return 0
    sender = Sender(args.bootstrap)
    for i in range(ORDERS):
        customer = CUSTOMERS[i % len(CUSTOMERS)]
        # Every tenth order is a refund (a negative amount); the example filters them out.
        amount = round((i % 97) * 1.25 + 0.5, 2) * (-1 if i % 10 == 9 else 1)
        value = json.dumps({"order_id": i, "amount": amount, "status": "paid"})
        sender.send(
            args.topic,
            customer.encode(),
            value.encode(),
            partition=i % PARTITIONS,
            timestamp=BASE_MS + i * 300_000,
        )
    # A record that is not JSON: it goes to the dead-letter table.
    sender.send(args.topic, b"bad", b"order 1000: not json", partition=0, timestamp=BASE_MS)
    return sender.finish(
        args.topic, f"topic {args.topic} on {args.bootstrap}: {ORDERS + 1} records in {PARTITIONS} partitions"
    )


if __name__ == "__main__":
    sys.exit(main())
