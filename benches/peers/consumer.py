"""The peer of `cargo bench --bench kafka`: a small Python consumer as a data engineer would
write it without an engine. confluent-kafka reads the topic's partitions from their start,
each record is parsed with `json.loads`, and every checkpoint interval the rows gathered are
appended to an Iceberg table with pyiceberg (a sqlite catalog and a local warehouse, as
floe's default) and the consumer's offsets committed after the append.

    python consumer.py BROKERS TOPIC PARTITIONS EVENTS LAKE_DIR INTERVAL_SECONDS

Stops once EVENTS records are appended; prints one JSON line: events, appends, seconds (from
its start, imports included, as the bench times floe's whole process).
"""

import datetime as dt
import json
import sys
import time

START = time.monotonic()

import pyarrow as pa  # noqa: E402
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition  # noqa: E402
from pyiceberg.catalog.sql import SqlCatalog  # noqa: E402

SCHEMA = pa.schema(
    [
        ("event_id", pa.int64()),
        ("event_type", pa.string()),
        ("event_time", pa.timestamp("us")),
        ("user_id", pa.int64()),
        ("session_id", pa.string()),
        ("region", pa.string()),
        ("amount", pa.float64()),
        ("url", pa.string()),
        ("device", pa.string()),
        ("ok", pa.bool_()),
        ("tags", pa.string()),
    ]
)


def main() -> None:
    brokers, topic, partitions, events, lake, interval = sys.argv[1:7]
    partitions, events, interval = int(partitions), int(events), float(interval)
    catalog = SqlCatalog(
        "lake",
        uri=f"sqlite:///{lake}/catalog.db",
        warehouse=f"file://{lake}/warehouse",
    )
    catalog.create_namespace_if_not_exists("bench")
    table = catalog.create_table_if_not_exists("bench.events", schema=SCHEMA)

    consumer = Consumer(
        {
            "bootstrap.servers": brokers,
            "group.id": f"peer-{topic}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            # As floe's source sets it: librdkafka's default pauses a partition's fetches
            # for a second whenever its local queue is full.
            "fetch.queue.backoff.ms": 10,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    rows: list[dict] = []
    appended = appends = 0
    last = time.monotonic()
    while appended < events:
        for message in consumer.consume(num_messages=10_000, timeout=0.1):
            if message.error():
                raise RuntimeError(message.error())
            row = json.loads(message.value())
            row["event_time"] = dt.datetime.fromisoformat(row["event_time"])
            rows.append(row)
        now = time.monotonic()
        if rows and (now - last >= interval or appended + len(rows) >= events):
            table.append(pa.Table.from_pylist(rows, schema=SCHEMA))
            consumer.commit(asynchronous=False)
            appended += len(rows)
            appends += 1
            rows = []
            last = now
    consumer.close()
    print(json.dumps({"events": appended, "appends": appends, "seconds": time.monotonic() - START}))


if __name__ == "__main__":
    main()
