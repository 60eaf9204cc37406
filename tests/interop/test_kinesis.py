"""The Kinesis source against a real Kinesis-compatible server (kinesalite), checked with
boto3 on the producing side and pyiceberg on the table side.

- records with declared and metadata columns land in an Iceberg table, bad ones in
  <ns>.dead_letters; a preview reads them without a job;
- 'latest' starts at the job's first start, and keeps that start across a kill;
- 'at-timestamp' starts at a given time;
- 'scan.bounded.mode' = 'latest' ends the job at the records present when it started,
  while a producer keeps writing.

Resharding and kill -9 tests are in test_kinesis_resharding.py.
"""

from __future__ import annotations

import datetime as dt
import json
import time

import pytest

from conftest import SqlLake
from kinesis_stream import (
    FloeJob,
    Producer,
    Stream,
    count,
    read_table,
    require_kinesis,
    source_ddl,
    wait_for,
    wait_for_rows,
)


@pytest.fixture
def streams():
    """make(shards) -> a new stream, deleted after the test. Lazy, so that a missing server
    fails inside the test (FAILED, not a setup ERROR)."""
    made: list[Stream] = []

    def make(shards: int) -> Stream:
        s = Stream(require_kinesis(), shards)
        made.append(s)
        return s

    yield make
    for s in made:
        s.delete()


@pytest.fixture
def job_dir(tmp_path):
    return tmp_path / "job"


CLICK_COLUMNS = (
    "user_id BIGINT, url STRING, _shard STRING, _sequence STRING, _partition_key STRING, _arrival_time TIMESTAMP"
)


def job_sql(lake: SqlLake, source: str, table_columns: str, select: str) -> list[str]:
    """A continuous job from `source` into lake.web.clicks, checkpointing every 300 ms."""
    return [
        lake.ddl(),
        "CREATE SCHEMA IF NOT EXISTS lake.web",
        f"CREATE TABLE IF NOT EXISTS lake.web.clicks ({table_columns})",
        source,
        "SET 'pipeline.name' = 'clicks'",
        "SET 'checkpoint.interval' = '300ms'",
        f"INSERT INTO lake.web.clicks {select}",
    ]


def clicks_job(lake: SqlLake, stream: Stream, **options: str) -> list[str]:
    return job_sql(
        lake,
        source_ddl("clicks", stream.name, CLICK_COLUMNS, **options),
        "user_id BIGINT, url STRING, shard STRING, seq STRING, pkey STRING, arrived TIMESTAMP",
        "SELECT user_id, url, _shard, _sequence, _partition_key, _arrival_time FROM clicks",
    )


def click(i: int) -> tuple[str, bytes]:
    return (f"user-{i % 50}", json.dumps({"user_id": i, "url": f"/page/{i}"}).encode())


def test_records_and_metadata_land_in_iceberg_bad_ones_in_dead_letters(floe_bin, lake, streams, job_dir, run_lake):
    stream = streams(3)
    job = FloeJob(floe_bin, job_dir, clicks_job(lake, stream))
    job.start()
    before = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    good = [click(i) for i in range(300)]
    puts = stream.put(good[:150])
    bad = [("bad", b"not json"), ("bad", b'{"user_id": "seven"}'), ("bad", b"[1, 2]")]
    bad_puts = stream.put(bad)
    puts += stream.put(good[150:])
    after = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)

    wait_for_rows(lake, "web.clicks", 300, 60, job)
    wait_for("3 dead letters", lambda: count(lake, "web.dead_letters") == 3, 30, job)
    job.stop()

    rows = {r["user_id"]: r for r in read_table(lake, "web.clicks").to_pylist()}
    assert len(rows) == 300
    assert {p.shard for p in puts} == {s["ShardId"] for s in stream.shards()}, "records spread over every shard"
    for (key, data), put in zip(good, puts):
        r = rows[json.loads(data)["user_id"]]
        assert (r["url"], r["shard"], r["seq"], r["pkey"]) == (json.loads(data)["url"], put.shard, put.sequence, key)
        slack = dt.timedelta(seconds=2)
        assert before - slack <= r["arrived"] <= after + slack, r["arrived"]

    letters = read_table(lake, "web.dead_letters").to_pylist()
    by_payload = {bytes(d["payload"]): d for d in letters}
    for (_, data), put in zip(bad, bad_puts):
        d = by_payload[data]
        assert d["source"] == "clicks" and d["source_partition"] == put.shard
        assert put.sequence in d["error"], d["error"]
        assert d["target_table"] == "lake.web.clicks"

    # Preview: the same source, no job.
    preview = run_lake(
        source_ddl("clicks", stream.name, CLICK_COLUMNS),
        "SELECT user_id, url, _shard, _sequence, _partition_key FROM clicks LIMIT 5",
    )
    assert len(preview) == 5
    by_seq = {p.sequence: p for p in puts}
    for p in preview:
        assert by_seq[p["_sequence"]].shard == p["_shard"]
        assert p["url"] == f"/page/{p['user_id']}"


def test_latest_starts_when_the_job_first_started_even_after_a_kill(floe_bin, lake, streams, job_dir):
    stream = streams(2)
    stream.put([click(i) for i in range(0, 50)])  # before the job: never read
    job = FloeJob(floe_bin, job_dir, clicks_job(lake, stream, scan_startup_mode="latest"))
    job.start()
    # The first checkpoint holds the shards' start (at-timestamp:<first start>).
    wait_for("a first checkpoint", lambda: job.checkpoint() is not None, 30, job)
    positions = job.checkpoint()["sources"]["clicks"]
    assert all(v.startswith("at-timestamp:") for v in positions.values()), positions
    time.sleep(0.05)
    stream.put([click(i) for i in range(100, 120)])
    wait_for_rows(lake, "web.clicks", 20, 30, job)
    job.kill()
    stream.put([click(i) for i in range(200, 230)])  # while the job is down: read after restart
    job.start()
    wait_for_rows(lake, "web.clicks", 50, 30, job)
    job.stop()
    ids = sorted(r["user_id"] for r in read_table(lake, "web.clicks").to_pylist())
    assert ids == list(range(100, 120)) + list(range(200, 230))


def test_at_timestamp_starts_at_the_given_time(lake, streams, run_lake):
    stream = streams(1)
    stream.put([click(i) for i in range(10)])
    time.sleep(0.1)
    start = int(time.time() * 1000)
    time.sleep(0.1)
    stream.put([click(i) for i in range(10, 15)])
    ddl = source_ddl(
        "clicks", stream.name, CLICK_COLUMNS, scan_startup_mode="at-timestamp", scan_startup_timestamp=str(start)
    )
    rows = run_lake(ddl, "SELECT user_id FROM clicks LIMIT 100")
    assert sorted(r["user_id"] for r in rows) == list(range(10, 15))


def test_bounded_latest_stops_at_the_records_present_at_start(floe_bin, lake, streams, job_dir):
    stream = streams(2)
    producer = Producer(stream, total=6000, keys=8, batch=20, pause=0.01)
    first = producer.records(400)
    stream.put(first)  # present at start: all of them must be read
    producer.start()  # keeps writing while the job runs, and after it ended
    columns = "id BIGINT, k STRING, n BIGINT, _arrival_time TIMESTAMP"
    statements = job_sql(
        lake,
        source_ddl("clicks", stream.name, columns, scan_bounded_mode="latest"),
        "id BIGINT, k STRING, n BIGINT, arrived TIMESTAMP",
        "SELECT id, k, n, _arrival_time FROM clicks",
    )
    job = FloeJob(floe_bin, job_dir, statements)
    job.start()
    assert job.wait(60) == 0, job.logs()
    still_writing = producer.is_alive()
    producer.join_checked()
    assert still_writing, "the producer ended before the job: the bound was not tested"

    read = read_table(lake, "web.clicks").to_pylist()
    ids = [r["id"] for r in read]
    assert len(ids) == len(set(ids)), "a record was read twice"
    assert set(range(400)) <= set(ids), "records present at start are missing"
    # Exactly the records that arrived up to a time: every record not read arrived after
    # every record read (arrival times are the server's, in milliseconds).
    everything = stream.read_all()
    read_ids = set(ids)
    unread = [r for r in everything if json.loads(r["Data"])["id"] not in read_ids]
    assert unread, "the job read everything: the producer wrote nothing after its start"
    def millis(t: dt.datetime) -> int:
        if t.tzinfo is None:
            t = t.replace(tzinfo=dt.timezone.utc)
        return round(t.timestamp() * 1000)

    last_read = max(millis(r["arrived"]) for r in read)
    first_unread = min(millis(r["ApproximateArrivalTimestamp"]) for r in unread)
    assert last_read < first_unread, (last_read, first_unread)
