"""Change data capture: a Debezium JSON change stream of 100,000 keys produced to the Kafka
test broker (tansu) and applied to a table with a primary key by a floe job killed with
SIGKILL while the producer writes. The state the changes leave is computed here, key by
key, and the table read by pyiceberg, DuckDB and floe must equal it."""

from __future__ import annotations

import json
import os
import random
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from conftest import SqlLake, options_sql, run_floe_in
from test_kafka import Producer, create_topic, kafka  # noqa: F401 (fixture)

KEYS = 100_000


def debezium(op: str, before: dict | None, after: dict | None, wrapped: bool,
             table: str = "customers") -> bytes:
    event = {"before": before, "after": after, "op": op, "ts_ms": int(time.time() * 1000),
             "source": {"connector": "postgresql", "db": "shop", "table": table}}
    if wrapped:
        event = {"schema": {"type": "struct", "name": "dbserver1.shop.customers.Envelope"},
                 "payload": event}
    return json.dumps(event).encode()


def changes(rng: random.Random) -> tuple[list[tuple[bytes, bytes | None]], dict[int, tuple]]:
    """(key, value) messages: every key created (snapshot reads first), then updates and
    deletes (each delete followed by its tombstone) and some keys created again; and the
    rows they leave."""
    state: dict[int, tuple] = {}
    out: list[tuple[bytes, bytes | None]] = []

    def key(i: int) -> bytes:
        return json.dumps({"id": i}).encode()

    for i in range(KEYS):
        row = {"id": i, "name": f"c{i}", "tier": i % 3}
        state[i] = (row["name"], row["tier"])
        out.append((key(i), debezium("r" if i < 10_000 else "c", None, row, i % 5 == 0)))
    for step in range(40_000):
        i = rng.randrange(KEYS)
        if i in state and rng.random() < 0.3:
            before = {"id": i, "name": state[i][0], "tier": state[i][1]}
            del state[i]
            out.append((key(i), debezium("d", before, None, step % 5 == 0)))
            out.append((key(i), None))
        elif i in state:
            row = {"id": i, "name": f"u{step}", "tier": (state[i][1] + 1) % 3}
            state[i] = (row["name"], row["tier"])
            out.append((key(i), debezium("u", {"id": i}, row, step % 5 == 0)))
        else:
            row = {"id": i, "name": f"again{step}", "tier": 9}
            state[i] = (row["name"], row["tier"])
            out.append((key(i), debezium("c", None, row, False)))
    return out, state


@pytest.fixture(params=[2, 3], ids=["v2", "v3"])
def version(request) -> int:
    """The format version of the keyed table: position delete files (2) or deletion
    vectors (3)."""
    return request.param


def job(lake: SqlLake, topic: str, bootstrap: str, version: int = 2) -> str:
    opts = {
        "connector": "kafka",
        "topic": topic,
        "properties.bootstrap.servers": bootstrap,
        "format": "debezium-json",
        "scan.startup.mode": "earliest-offset",
        "scan.bounded.mode": "latest-offset",
    }
    body = options_sql(opts)
    return ";\n".join([
        lake.ddl(),
        "CREATE SCHEMA IF NOT EXISTS lake.shop",
        "CREATE TABLE IF NOT EXISTS lake.shop.customers (id BIGINT, name STRING, tier INT, "
        "PRIMARY KEY (id) NOT ENFORCED) PARTITIONED BY (bucket(8, id)) "
        f"WITH ('format-version' = '{version}')",
        f"CREATE SOURCE customers (id BIGINT, name STRING, tier INT) WITH ({body})",
        "SET 'pipeline.name' = 'cdc'",
        "SET 'checkpoint.interval' = '500ms'",
        "INSERT INTO lake.shop.customers SELECT * FROM customers",
    ]) + ";\n"


def produce_while_killing(kafka: str, topic: str | None, messages: list, floe_bin: Path,
                          work: Path, rng: random.Random, kills: int, every: int, pause: float,
                          window: tuple[float, float]) -> int:
    """Produce `messages` (key, value) to `topic` (or, without one, (topic, key, value)),
    pausing `pause` s every `every`, while floe runs work/job.sql and is killed `kills` times,
    each after a time in `window`; then run the job to its end (it is bounded). How many
    kills landed.

    The killed runs read the source unbounded: a bounded job ends once it has caught up,
    which it may while the producer pauses, and a kill must find it reading."""
    job = (work / "job.sql").read_text()
    bounded = "'scan.bounded.mode' = 'latest-offset'"
    assert bounded in job, "the job's last run must end by itself"
    (work / "running.sql").write_text(job.replace(f", {bounded}", ""))
    prod = Producer(kafka)

    def produce() -> None:
        for n, m in enumerate(messages):
            t, k, v = (topic, *m) if topic is not None else m
            prod.send(t, v, key=k)
            if n % every == every - 1:
                time.sleep(pause)
        prod.flush()

    producer = threading.Thread(target=produce)
    producer.start()
    landed = 0
    try:
        for wait in [rng.uniform(*window) for _ in range(kills)]:
            proc = subprocess.Popen([str(floe_bin), "-q", "-f", "running.sql"], cwd=work,
                                    stdout=subprocess.DEVNULL, stderr=open(work / "floe.err", "ab"))
            time.sleep(wait)
            if proc.poll() is None:
                proc.kill()
                landed += 1
            proc.wait()
    finally:
        producer.join(timeout=300)
    assert not producer.is_alive(), "the producer did not finish"
    done = subprocess.run([str(floe_bin), "-q", "-f", "job.sql"], cwd=work,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return landed


def test_a_debezium_stream_of_100k_keys_survives_kills_and_reads_the_same_everywhere(
    kafka, floe_bin: Path, lake: SqlLake, tmp_path: Path, duck, version: int
):
    seed = random.randrange(1 << 30)
    print(f"seed: {seed}")
    rng = random.Random(seed)
    messages, state = changes(rng)
    topic = create_topic(kafka, 4)
    work = tmp_path / "job"
    work.mkdir()
    (work / "job.sql").write_text(job(lake, topic, kafka, version))
    kills = produce_while_killing(kafka, topic, messages, floe_bin, work, rng, kills=5,
                                  every=2_000, pause=0.1, window=(1.0, 2.0))
    assert kills >= 3, f"only {kills} kills: {(work / 'floe.err').read_text()}"

    expected = sorted((k, n, t) for k, (n, t) in state.items())
    table = lake.pyiceberg().load_table("shop.customers")
    py = sorted((r["id"], r["name"], r["tier"]) for r in table.scan().to_arrow().to_pylist())
    assert len(py) == len(expected), (len(py), len(expected), seed)
    assert py == expected, f"pyiceberg: not the source's final state (seed {seed})"
    dk = sorted(duck.execute(
        f"SELECT id, name, tier FROM iceberg_scan('{table.metadata_location}')").fetchall())
    assert dk == expected, f"DuckDB: not the source's final state (seed {seed})"
    (fl,) = run_floe_in(floe_bin, work, lake.ddl(),
                        "SELECT count(*) AS n, sum(id) AS s, count(DISTINCT name) AS names "
                        "FROM lake.shop.customers")
    assert (fl["n"], fl["s"], fl["names"]) == (
        len(expected), sum(k for k, _, _ in expected), len({n for _, n, _ in expected})
    ), fl
    # Deletes are position deletes (v2) or deletion vectors (v3), never equality deletes.
    files = table.inspect.files().to_pylist()
    assert {f["content"] for f in files} <= {0, 1}, {f["content"] for f in files}
    formats = {f["file_format"] for f in files if f["content"] == 1}
    assert formats == ({"PARQUET"} if version == 2 else {"PUFFIN"}), formats
    # No dead letters: tombstones are no change, every event applied.
    names = [t[1] for t in lake.pyiceberg().list_tables("shop")]
    assert "dead_letters" not in names, names


def test_an_upsert_topic_keeps_the_last_value_of_each_key_and_tombstones_delete(
    kafka, floe_bin: Path, lake: SqlLake, tmp_path: Path, duck
):
    """'scan.upsert' = 'true': each record upserts its key (the Kafka key, JSON), a
    tombstone deletes it; a job killed while the producer writes."""
    rng = random.Random(11)
    topic = create_topic(kafka, 3)
    state: dict[str, int] = {}
    messages: list[tuple[bytes, bytes | None]] = []
    for n in range(30_000):
        sku = f"sku-{rng.randrange(5_000)}"
        key = json.dumps({"sku": sku}).encode()
        if sku in state and rng.random() < 0.2:
            del state[sku]
            messages.append((key, None))
        else:
            state[sku] = n
            messages.append((key, json.dumps({"sku": sku, "price": n}).encode()))
    opts = {
        "connector": "kafka", "topic": topic, "properties.bootstrap.servers": kafka,
        "format": "json", "scan.upsert": "true", "scan.bounded.mode": "latest-offset",
    }
    body = options_sql(opts)
    work = tmp_path / "job"
    work.mkdir()
    (work / "job.sql").write_text(";\n".join([
        lake.ddl(),
        "CREATE SCHEMA IF NOT EXISTS lake.shop",
        "CREATE TABLE IF NOT EXISTS lake.shop.prices (sku STRING, price BIGINT, "
        "PRIMARY KEY (sku) NOT ENFORCED)",
        f"CREATE SOURCE prices (sku STRING, price BIGINT, PRIMARY KEY (sku) NOT ENFORCED) "
        f"WITH ({body})",
        "SET 'pipeline.name' = 'prices'",
        "SET 'checkpoint.interval' = '300ms'",
        "INSERT INTO lake.shop.prices SELECT * FROM prices",
    ]) + ";\n")
    kills = produce_while_killing(kafka, topic, messages, floe_bin, work, rng, kills=4,
                                  every=1_000, pause=0.15, window=(0.8, 1.5))
    assert kills >= 2, (work / "floe.err").read_text()
    expected = sorted(state.items())
    table = lake.pyiceberg().load_table("shop.prices")
    py = sorted((r["sku"], r["price"]) for r in table.scan().to_arrow().to_pylist())
    assert py == expected, "pyiceberg: not the last value of each key"
    dk = sorted(duck.execute(
        f"SELECT sku, price FROM iceberg_scan('{table.metadata_location}')").fetchall())
    assert dk == expected, "DuckDB: not the last value of each key"


VALUE = {
    "type": "record", "name": "Value", "namespace": "dbserver1.shop.customers",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": ["null", "string"], "default": None},
        {"name": "tier", "type": ["null", "int"], "default": None},
    ],
}
ENVELOPE = {
    "type": "record", "name": "Envelope", "namespace": "dbserver1.shop.customers",
    "fields": [
        {"name": "before", "type": ["null", VALUE], "default": None},
        {"name": "after", "type": ["null", "dbserver1.shop.customers.Value"], "default": None},
        {"name": "source", "type": {"type": "record", "name": "Source", "namespace": "io.debezium",
                                    "fields": [{"name": "db", "type": "string"},
                                               {"name": "table", "type": "string"}]}},
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None},
    ],
}


def test_debezium_avro_through_the_registry_is_applied_by_key(
    kafka, floe_bin: Path, lake: SqlLake, tmp_path: Path, duck
):
    """'format' = 'debezium-avro-confluent': Debezium's Avro envelopes (fastavro-encoded,
    the writer schema in the registry fixture) into a keyed table; tombstones are no change,
    a truncate is a dead letter."""
    from test_avro import encode, load_fixture, register

    registry = load_fixture().serve("127.0.0.1", 0, None)
    url = f"http://127.0.0.1:{registry.server_address[1]}"
    try:
        sid = register(url, "dbserver1.shop.customers-value", ENVELOPE)
        topic = create_topic(kafka, 2)
        rng = random.Random(5)
        state: dict[int, tuple] = {}
        prod = Producer(kafka)
        source = {"db": "shop", "table": "customers"}
        for n in range(6_000):
            i = rng.randrange(1_000)
            key = json.dumps({"id": i}).encode()
            if i in state and rng.random() < 0.25:
                before = {"id": i, "name": state[i][0], "tier": state[i][1]}
                event = {"before": before, "after": None, "source": source, "op": "d", "ts_ms": n}
                del state[i]
                prod.send(topic, encode(sid, ENVELOPE, event), key=key)
                prod.send(topic, None, key=key)
            else:
                row = {"id": i, "name": f"v{n}", "tier": n % 4}
                op = "u" if i in state else "c"
                state[i] = (row["name"], row["tier"])
                event = {"before": None, "after": row, "source": source, "op": op, "ts_ms": n}
                prod.send(topic, encode(sid, ENVELOPE, event), key=key)
        truncate = {"before": None, "after": None, "source": source, "op": "t", "ts_ms": 0}
        prod.send(topic, encode(sid, ENVELOPE, truncate), key=b"t")
        prod.flush()
        opts = {
            "connector": "kafka", "topic": topic, "properties.bootstrap.servers": kafka,
            "format": "debezium-avro-confluent", "debezium-avro-confluent.url": url,
            "scan.bounded.mode": "latest-offset",
        }
        body = options_sql(opts)
        run_floe_in(
            floe_bin, tmp_path, lake.ddl(),
            "CREATE SCHEMA lake.shop",
            "CREATE TABLE lake.shop.customers (id BIGINT, name STRING, tier INT, "
            "PRIMARY KEY (id) NOT ENFORCED)",
            f"CREATE SOURCE changes WITH ({body})",
            "SET 'checkpoint.interval' = '200ms'",
            "SET 'table.dml-sync' = 'true'",
            "INSERT INTO lake.shop.customers SELECT id, name, tier FROM changes",
        )
    finally:
        registry.shutdown()
    expected = sorted((k, n, t) for k, (n, t) in state.items())
    table = lake.pyiceberg().load_table("shop.customers")
    py = sorted((r["id"], r["name"], r["tier"]) for r in table.scan().to_arrow().to_pylist())
    assert py == expected
    dk = sorted(duck.execute(
        f"SELECT id, name, tier FROM iceberg_scan('{table.metadata_location}')").fetchall())
    assert dk == expected
    dead = lake.pyiceberg().load_table("shop.dead_letters").scan().to_arrow().to_pylist()
    assert [d["error"] for d in dead if "truncate" in d["error"]], dead
    assert len(dead) == 1, dead


# ------------------------------------------------------------------ a whole database, routed

DB_KEYS = {"customers": ["id"], "orders": ["order_id"], "stock": ["sku", "shop"]}


def database_changes(rng: random.Random, n: int):
    """(topic suffix, key, value) messages of a database of four tables: customers (key id;
    after half the changes its rows carry a new column, email), orders (key order_id), stock
    (a two-column key) and audit (no primary key: inserts only, and one update, which no key
    can place). Then the rows each keyed table is left with, the audit rows, and the messages
    that must be dead letters (the keyless update, and stock rows whose key lost a column)."""
    state: dict[str, dict[tuple, dict]] = {t: {} for t in DB_KEYS}
    audit: list[dict] = []
    out: list[tuple[str, bytes | None, bytes | None]] = []
    dead = 0

    def send(table: str, key: dict | None, op: str, before, after) -> None:
        k = json.dumps(key).encode() if key is not None else None
        out.append((table, k, debezium(op, before, after, rng.random() < 0.2, table)))

    def row(table: str, k: tuple, step: int) -> dict:
        if table == "customers":
            r = {"id": k[0], "name": f"c{step}", "tier": step % 3}
            if step >= n // 2:
                r["email"] = f"c{k[0]}@{step}"
            return r
        if table == "orders":
            return {"order_id": k[0], "customer": k[0] % 97, "amount": step * 0.5}
        return {"sku": k[0], "shop": k[1], "qty": step % 50}

    for step in range(n):
        table = rng.choice(["customers", "orders", "stock", "audit"])
        if table == "audit":
            entry = {"seq": step, "what": f"event {step}"}
            audit.append(entry)
            send("audit", None, "c", None, entry)
            continue
        k = (rng.randrange(500),) if table != "stock" else (f"s{rng.randrange(50)}", f"p{rng.randrange(4)}")
        key = dict(zip(DB_KEYS[table], k))
        rows = state[table]
        if k in rows and rng.random() < 0.25:
            send(table, key, "d", dict(rows.pop(k)), None)
            out.append((table, json.dumps(key).encode(), None))
        elif k in rows:
            r = row(table, k, step)
            send(table, key, "u", dict(rows[k]), r)
            rows[k] = r
        else:
            r = row(table, k, step)
            send(table, key, "c", None, r)
            rows[k] = r
    # The keyless table's update cannot be placed; a key that lost a column is another key.
    send("audit", None, "u", audit[0], {**audit[0], "what": "changed"})
    dead += 1
    for i in range(3):
        send("stock", {"sku": f"s{i}"}, "c", None, {"sku": f"s{i}", "shop": "p9", "qty": 1})
        dead += 1
    return out, state, audit, dead


def test_a_whole_database_routed_by_source_table_with_a_schema_change_and_kills(
    kafka, floe_bin: Path, lake: SqlLake, tmp_path: Path, duck
):
    """One job mirrors every table of a database: topics by pattern, ROUTE BY
    __source_table, each table created on first sight with its source table's key (from the
    message keys), one evolving mid-stream, killed while the changes arrive. Every keyed
    table equals its source's final state key by key (pyiceberg, DuckDB), the keyless table
    holds its inserts, and what cannot be applied is a dead letter."""
    seed = int(os.environ.get("FLOE_TEST_SEED") or random.randrange(1 << 30))
    print(f"seed: {seed}")
    rng = random.Random(seed)
    messages, state, audit, dead = database_changes(rng, 30_000)
    prefix = f"db_{uuid.uuid4().hex[:8]}"
    for table in ["customers", "orders", "stock", "audit"]:
        create_topic(kafka, 2, f"{prefix}.inventory.{table}")
    messages = [(f"{prefix}.inventory.{t}", k, v) for t, k, v in messages]
    opts = {
        "connector": "kafka",
        "topic-pattern": f"{prefix}\\.inventory\\..*",
        "properties.bootstrap.servers": kafka,
        "format": "debezium-json",
        "scan.startup.mode": "earliest-offset",
        "scan.bounded.mode": "latest-offset",
    }
    body = options_sql(opts)
    work = tmp_path / "job"
    work.mkdir()
    (work / "job.sql").write_text(";\n".join([
        lake.ddl(),
        "CREATE SCHEMA IF NOT EXISTS lake.mirror",
        f"CREATE SOURCE inventory WITH ({body})",
        "SET 'pipeline.name' = 'mirror'",
        "SET 'checkpoint.interval' = '300ms'",
        "INSERT INTO lake.mirror SELECT * FROM inventory ROUTE BY __source_table",
    ]) + ";\n")
    kills = produce_while_killing(kafka, None, messages, floe_bin, work, rng, kills=4,
                                  every=1_500, pause=0.1, window=(1.0, 2.5))
    assert kills >= 2, f"only {kills} kills: {(work / 'floe.err').read_text()}"

    catalog = lake.pyiceberg()
    names = sorted(t[1] for t in catalog.list_tables("mirror"))
    assert names == ["audit", "customers", "dead_letters", "orders", "stock"], names
    for table, key in DB_KEYS.items():
        t = catalog.load_table(f"mirror.{table}")
        schema = t.schema()
        assert sorted(schema.find_field(i).name for i in schema.identifier_field_ids) == sorted(key), table
        assert "__source_table" not in [f.name for f in schema.fields], table
        columns = [f.name for f in schema.fields]
        want = sorted(
            tuple(r.get(c) for c in columns) for r in state[table].values()
        )
        got = sorted(tuple(r[c] for c in columns) for r in t.scan().to_arrow().to_pylist())
        assert len(got) == len(want), (table, len(got), len(want), seed)
        assert got == want, f"{table}: not the source's final state (seed {seed})"
        n = duck.execute(f"SELECT count(*) FROM iceberg_scan('{t.metadata_location}')").fetchone()[0]
        assert n == len(want), (table, n)
    customers = catalog.load_table("mirror.customers")
    assert customers.schema().find_field("email") is not None
    assert len(customers.schemas()) >= 2, "customers evolved when email appeared"
    audit_rows = catalog.load_table("mirror.audit").scan().to_arrow().to_pylist()
    assert sorted(r["seq"] for r in audit_rows) == [a["seq"] for a in audit]
    assert catalog.load_table("mirror.audit").schema().identifier_field_ids == []
    letters = catalog.load_table("mirror.dead_letters").scan().to_arrow().to_pylist()
    assert len(letters) == dead, [l["error"] for l in letters]
    errors = sorted(l["error"] for l in letters)
    assert sum("no primary key" in e for e in errors) == 1, errors
    assert sum("primary key (sku)" in e for e in errors) == 3, errors


def avro_envelope(table: str, value: dict) -> dict:
    """Debezium's Avro envelope for rows of `value` (a record schema) of `table`."""
    ns = f"dbserver1.inventory.{table}"
    return {
        "type": "record", "name": "Envelope", "namespace": ns,
        "fields": [
            {"name": "before", "type": ["null", value], "default": None},
            {"name": "after", "type": ["null", f"{ns}.{value['name']}"], "default": None},
            {"name": "source", "type": {"type": "record", "name": "Source", "namespace": "io.debezium",
                                        "fields": [{"name": "db", "type": "string"},
                                                   {"name": "table", "type": "string"}]}},
            {"name": "op", "type": "string"},
        ],
    }


def test_a_whole_database_of_debezium_avro_is_routed_by_source_table(
    kafka, floe_bin: Path, lake: SqlLake, tmp_path: Path, duck
):
    """The same with Debezium's Avro converter: keys and values are Avro records in the
    registry; each table is created keyed by its message keys' fields, and a new version of
    one table's value schema (a column added) evolves it."""
    from test_avro import encode, load_fixture, register

    opt = lambda n, t: {"name": n, "type": ["null", t], "default": None}  # noqa: E731
    customer_v1 = {"type": "record", "name": "Value", "fields": [
        {"name": "id", "type": "long"}, opt("name", "string")]}
    customer_v2 = {"type": "record", "name": "Value", "fields": [
        {"name": "id", "type": "long"}, opt("name", "string"), opt("email", "string")]}
    order_value = {"type": "record", "name": "Value", "fields": [
        {"name": "order_id", "type": "long"}, opt("amount", "double")]}
    keys = {"customers": {"type": "record", "name": "Key", "fields": [{"name": "id", "type": "long"}]},
            "orders": {"type": "record", "name": "Key", "fields": [{"name": "order_id", "type": "long"}]}}
    registry = load_fixture().serve("127.0.0.1", 0, None)
    url = f"http://127.0.0.1:{registry.server_address[1]}"
    prefix = f"adb_{uuid.uuid4().hex[:8]}"
    try:
        topics = {t: create_topic(kafka, 2, f"{prefix}.inventory.{t}") for t in keys}
        ids = {
            ("customers", 1): register(url, "customers-value-1", avro_envelope("customers", customer_v1)),
            ("customers", 2): register(url, "customers-value-2", avro_envelope("customers", customer_v2)),
            ("orders", 1): register(url, "orders-value", avro_envelope("orders", order_value)),
        }
        key_ids = {t: register(url, f"{t}-key", s) for t, s in keys.items()}
        rng = random.Random(11)
        state: dict[str, dict[int, dict]] = {"customers": {}, "orders": {}}
        prod = Producer(kafka)
        n = 4_000
        for step in range(n):
            table = rng.choice(["customers", "orders"])
            k = rng.randrange(300)
            name = "id" if table == "customers" else "order_id"
            version = 2 if table == "customers" and step >= n // 2 else 1
            schema = avro_envelope(table, customer_v2 if version == 2 else
                                   (customer_v1 if table == "customers" else order_value))
            if table == "customers":
                row = {"id": k, "name": f"c{step}"} | ({"email": f"{k}@{step}"} if version == 2 else {})
            else:
                row = {"order_id": k, "amount": step * 0.5}
            source = {"db": "inventory", "table": table}
            key = encode(key_ids[table], keys[table], {name: k})
            rows = state[table]
            if k in rows and rng.random() < 0.2:
                event = {"before": rows.pop(k), "after": None, "source": source, "op": "d"}
                prod.send(topics[table], encode(ids[(table, version)], schema, event), key=key)
                prod.send(topics[table], None, key=key)
            else:
                op = "u" if k in rows else "c"
                event = {"before": None, "after": row, "source": source, "op": op}
                prod.send(topics[table], encode(ids[(table, version)], schema, event), key=key)
                rows[k] = row
        prod.flush()
        opts = {
            "connector": "kafka", "topic-pattern": f"{prefix}\\.inventory\\..*",
            "properties.bootstrap.servers": kafka,
            "format": "debezium-avro-confluent", "debezium-avro-confluent.url": url,
            "scan.bounded.mode": "latest-offset",
        }
        body = options_sql(opts)
        run_floe_in(
            floe_bin, tmp_path, lake.ddl(),
            "CREATE SCHEMA lake.mirror",
            f"CREATE SOURCE inventory WITH ({body})",
            "SET 'checkpoint.interval' = '200ms'",
            "SET 'table.dml-sync' = 'true'",
            "INSERT INTO lake.mirror SELECT * FROM inventory ROUTE BY __source_table",
        )
    finally:
        registry.shutdown()
    catalog = lake.pyiceberg()
    assert sorted(t[1] for t in catalog.list_tables("mirror")) == ["customers", "orders"]
    for table, key in (("customers", "id"), ("orders", "order_id")):
        t = catalog.load_table(f"mirror.{table}")
        schema = t.schema()
        assert [schema.find_field(i).name for i in schema.identifier_field_ids] == [key], table
        columns = [f.name for f in schema.fields]
        want = sorted(tuple(r.get(c) for c in columns) for r in state[table].values())
        got = sorted(tuple(r[c] for c in columns) for r in t.scan().to_arrow().to_pylist())
        assert got == want, f"{table}: not the source's final state"
        n = duck.execute(f"SELECT count(*) FROM iceberg_scan('{t.metadata_location}')").fetchone()[0]
        assert n == len(want), (table, n)
    assert catalog.load_table("mirror.customers").schema().find_field("email") is not None
