"""The Kinesis source across resharding and crashes, against kinesalite and pyiceberg.

- split and merge during ingestion: every record lands exactly once, every key's records
  in the order they were produced, and no record of a child shard is written before the
  last record of its parents (read in the order floe wrote them: by commit, then by
  position in the commit's data file);
- kill -9 at random moments, several times, with a split in between: exactly the
  produced records in the end.
"""

from __future__ import annotations

import random
import time

import pytest

from conftest import SqlLake
from kinesis_stream import (
    FloeJob,
    Producer,
    Stream,
    read_table,
    require_kinesis,
    rows_in_write_order,
    source_ddl,
    wait_for_rows,
)


@pytest.fixture
def new_stream():
    """new_stream() -> a stream of one shard, deleted after the test. Lazy, so that a
    missing server fails inside the test (FAILED, not a setup ERROR)."""
    made: list[Stream] = []

    def make() -> Stream:
        made.append(Stream(require_kinesis(), 1))
        return made[-1]

    yield make
    for s in made:
        s.delete()


def keyed_job(lake: SqlLake, stream: Stream, interval: str) -> list[str]:
    return [
        lake.ddl(),
        "CREATE SCHEMA IF NOT EXISTS lake.ks",
        "CREATE TABLE IF NOT EXISTS lake.ks.events (id BIGINT, k STRING, n BIGINT, shard STRING, seq STRING)",
        source_ddl(
            "events",
            stream.name,
            "id BIGINT, k STRING, n BIGINT, _shard STRING, _sequence STRING",
            scan_shard__discovery_interval="1s",
        ),
        "SET 'pipeline.name' = 'keyed'",
        f"SET 'checkpoint.interval' = '{interval}'",
        "INSERT INTO lake.ks.events SELECT id, k, n, _shard, _sequence FROM events",
    ]


def assert_exactly(lake: SqlLake, total: int) -> None:
    ids = sorted(read_table(lake, "ks.events").column("id").to_pylist())
    assert len(ids) == total, f"{len(ids)} rows for {total} records"
    assert ids == list(range(total)), "some record is missing or written twice"


def test_split_and_merge_keep_every_key_in_order(floe_bin, lake, new_stream, tmp_path):
    stream = new_stream()
    producer = Producer(stream, total=3000, keys=32, batch=50, pause=0.05)
    # A backlog bigger than one poll (8192 records) in the first shard, then a split and
    # more records in its children, all before the job starts: a reader that did not wait
    # for the parent to drain would interleave parent and children at once.
    stream.put(producer.records(12000))
    stream.split(stream.open_shards()[0])
    stream.put(producer.records(3000))
    job = FloeJob(floe_bin, tmp_path / "job", keyed_job(lake, stream, "300ms"))
    job.start()
    producer.start()
    # While the job runs: split one child, then merge one of its halves with its neighbour.
    time.sleep(1.0)
    low, high = sorted(stream.open_shards(), key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]))
    stream.split(low)
    time.sleep(1.0)
    producer.put_now(200)  # into both halves of `low`, whatever the producer's pace
    upper_half_of_low = max(
        (s for s in stream.open_shards() if s.get("ParentShardId") == low["ShardId"]),
        key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]),
    )
    stream.merge(upper_half_of_low, high)
    producer.join_checked()
    producer.put_now(200)  # into the merged shard
    total = producer.next_id
    wait_for_rows(lake, "ks.events", total, 90, job)
    job.stop()

    assert_exactly(lake, total)
    shards = stream.shards()
    assert len(shards) == 6, [s["ShardId"] for s in shards]
    rows = rows_in_write_order(lake, "ks.events")
    position: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        position.setdefault(r["shard"], []).append(i)
    assert set(position) == {s["ShardId"] for s in shards}, "every shard holds records"

    # Per key, in the order written: n counts up.
    last_n: dict[str, int] = {}
    for r in rows:
        assert r["n"] > last_n.get(r["k"], -1), f"key {r['k']}: n={r['n']} written after n={last_n[r['k']]}"
        last_n[r["k"]] = r["n"]
    # Per shard, in the order written: sequence numbers go up.
    last_seq: dict[str, int] = {}
    for r in rows:
        assert int(r["seq"]) > last_seq.get(r["shard"], -1), f"shard {r['shard']} out of order"
        last_seq[r["shard"]] = int(r["seq"])
    # A child's first record is written after its parents' last.
    for s in shards:
        for parent in filter(None, [s.get("ParentShardId"), s.get("AdjacentParentShardId")]):
            assert max(position[parent]) < min(position[s["ShardId"]]), f"{s['ShardId']} read before {parent} drained"


def test_killed_and_restarted_job_writes_each_record_once(floe_bin, lake, new_stream, tmp_path):
    stream = new_stream()
    producer = Producer(stream, total=16000, keys=16, batch=100, pause=0.08)
    stream.put(producer.records(4000))
    job = FloeJob(floe_bin, tmp_path / "job", keyed_job(lake, stream, "200ms"))
    seed = random.randrange(1 << 30)
    print(f"kill schedule seed: {seed}")
    rng = random.Random(seed)
    producer.start()
    kills = 0
    split = False
    while producer.is_alive() or kills < 3:
        job.start()
        time.sleep(rng.uniform(0.4, 2.0))
        assert job.alive(), f"floe exited early\n{job.logs()}"
        job.kill()
        kills += 1
        if kills == 2 and not split:
            # Reshard while the job is down: the restart resumes a drained-parent state.
            stream.split(stream.open_shards()[0])
            split = True
    producer.join_checked()
    total = producer.next_id
    job.start()
    wait_for_rows(lake, "ks.events", total, 90, job)
    job.stop()
    print(f"killed {kills} times")
    assert kills >= 3
    assert_exactly(lake, total)
    assert len(stream.shards()) == 3
