"""What the Kinesis source tests share: a kinesalite stream driven with boto3, a floe job
run as a process that can be stopped or killed, and readers of what the job committed.

The server is the one scripts/test-env.sh starts (FLOE_KINESIS, default
http://127.0.0.1:4567). A test that cannot reach it fails with how to start it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from conftest import START_SERVERS_MSG, SqlLake, options_sql

KINESIS = os.environ.get("FLOE_KINESIS", "http://127.0.0.1:4567")
REGION = "us-east-1"
# kinesalite takes any credentials; floe is given them as options, never from a chain.
KEY_ID = "testing"
SECRET = "testing"


def client():
    import boto3
    from botocore.config import Config

    return boto3.client(
        "kinesis",
        endpoint_url=KINESIS,
        region_name=REGION,
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=SECRET,
        config=Config(retries={"max_attempts": 2}, connect_timeout=2, read_timeout=10),
    )


def require_kinesis():
    """A boto3 client, or a failure (never a skip) saying how to start the server."""
    from botocore.exceptions import BotoCoreError, ClientError

    k = client()
    try:
        k.list_streams(Limit=1)
    except (BotoCoreError, ClientError) as e:
        pytest.fail(f"no Kinesis server at {KINESIS} ({e}); {START_SERVERS_MSG}", pytrace=False)
    return k


@dataclass
class Put:
    """Where a record landed."""

    shard: str
    sequence: str


class Stream:
    """A fresh stream with a unique name, deleted by `delete`."""

    def __init__(self, k, shards: int, prefix: str = "floe-test"):
        self.k = k
        self.name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        k.create_stream(StreamName=self.name, ShardCount=shards)
        self.wait_active()

    def wait_active(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            desc = self.k.describe_stream_summary(StreamName=self.name)
            if desc["StreamDescriptionSummary"]["StreamStatus"] == "ACTIVE":
                return
            time.sleep(0.05)
        raise AssertionError(f"stream {self.name} did not become ACTIVE in {timeout}s")

    def put(self, records: list[tuple[str, bytes]]) -> list[Put]:
        """Put (partition key, data) records in order, 500 a call; where each landed."""
        out: list[Put] = []
        for i in range(0, len(records), 500):
            chunk = records[i : i + 500]
            resp = self.k.put_records(
                StreamName=self.name,
                Records=[{"PartitionKey": key, "Data": data} for key, data in chunk],
            )
            assert resp.get("FailedRecordCount", 0) == 0, resp
            out += [Put(r["ShardId"], r["SequenceNumber"]) for r in resp["Records"]]
        return out

    def shards(self) -> list[dict[str, Any]]:
        return self.k.list_shards(StreamName=self.name)["Shards"]

    def open_shards(self) -> list[dict[str, Any]]:
        return [s for s in self.shards() if "EndingSequenceNumber" not in s["SequenceNumberRange"]]

    def split(self, shard: dict[str, Any]) -> None:
        """Split `shard` at the middle of its hash key range."""
        lo = int(shard["HashKeyRange"]["StartingHashKey"])
        hi = int(shard["HashKeyRange"]["EndingHashKey"])
        self.k.split_shard(
            StreamName=self.name, ShardToSplit=shard["ShardId"], NewStartingHashKey=str((lo + hi) // 2 + 1)
        )
        time.sleep(0.1)
        self.wait_active()

    def merge(self, a: dict[str, Any], b: dict[str, Any]) -> None:
        self.k.merge_shards(StreamName=self.name, ShardToMerge=a["ShardId"], AdjacentShardToMerge=b["ShardId"])
        time.sleep(0.1)
        self.wait_active()

    def read_all(self) -> list[dict[str, Any]]:
        """Every record of every shard, with its shard, read from the trim horizon."""
        out = []
        for s in self.shards():
            it = self.k.get_shard_iterator(
                StreamName=self.name, ShardId=s["ShardId"], ShardIteratorType="TRIM_HORIZON"
            )["ShardIterator"]
            while it:
                resp = self.k.get_records(ShardIterator=it, Limit=10000)
                out += [dict(r, ShardId=s["ShardId"]) for r in resp["Records"]]
                if not resp["Records"] and resp.get("MillisBehindLatest", 0) == 0:
                    break
                it = resp.get("NextShardIterator")
        return out

    def delete(self) -> None:
        try:
            self.k.delete_stream(StreamName=self.name)
        except Exception:
            pass


def source_ddl(name: str, stream: str, columns: str, **options: str) -> str:
    """CREATE SOURCE for `stream` on the test server; extra options as keyword arguments
    with '_' for '.' and '__' for '-' (scan_startup_mode='latest')."""
    props = {
        "connector": "kinesis",
        "stream": stream,
        "aws.region": REGION,
        "aws.endpoint": KINESIS,
        "aws.access-key-id": KEY_ID,
        "aws.secret-access-key": SECRET,
        "format": "json",
    }
    props.update({k.replace("__", "-").replace("_", "."): v for k, v in options.items()})
    body = options_sql(props)
    return f"CREATE SOURCE {name} ({columns}) WITH ({body})"


class FloeJob:
    """`floe -f job.sql` in `workdir`: a continuous job that runs until stopped or killed.
    Each run's output goes to run-N.log in the folder, shown when something fails."""

    def __init__(self, floe: Path, workdir: Path, statements: list[str]):
        self.floe = floe
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "job.sql").write_text(";\n".join(statements) + ";\n")
        self.proc: subprocess.Popen | None = None
        self.runs = 0

    def start(self) -> None:
        assert not self.alive(), "the job is running already"
        self.runs += 1
        log = open(self.workdir / f"run-{self.runs}.log", "w")
        self.proc = subprocess.Popen(
            [str(self.floe), "-q", "-f", "job.sql"],
            cwd=self.workdir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no final checkpoint, nothing cleaned up."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM: a final checkpoint, then exit 0."""
        assert self.proc is not None
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"floe did not stop within {timeout}s\n{self.logs()}")
        assert rc == 0, f"floe exited with {rc}\n{self.logs()}"

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"floe did not finish within {timeout}s\n{self.logs()}")

    def logs(self) -> str:
        parts = []
        for n in range(1, self.runs + 1):
            text = (self.workdir / f"run-{n}.log").read_text(errors="replace")
            parts.append(f"--- floe run {n} ---\n{text[-4000:]}")
        return "\n".join(parts)

    def checkpoint(self) -> dict[str, Any] | None:
        """The job's last checkpoint record, if it wrote one."""
        files = list((self.workdir / ".floe").glob("*/checkpoint.json"))
        return json.loads(files[0].read_text()) if files else None


def wait_for(what: str, check: Callable[[], bool], timeout: float, job: FloeJob | None = None) -> None:
    """Poll `check` until true; fail with `what` (and the job's logs) after `timeout`, or as
    soon as the job has died."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception as e:  # the table may not exist yet
            last = e
        if job is not None and job.proc is not None and not job.alive():
            raise AssertionError(f"floe exited while waiting for {what}\n{job.logs()}")
        time.sleep(0.3)
    logs = job.logs() if job else ""
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last})\n{logs}")


def wait_for_rows(lake: SqlLake, ident: str, total: int, timeout: float, job: FloeJob) -> None:
    """Wait until `ident` has `total` rows; fail at once when it has more."""

    def check() -> bool:
        n = count(lake, ident)
        assert n <= total, f"{ident} has {n} rows, more than the {total} records produced"
        return n == total

    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except AssertionError:
            raise
        except Exception:  # the table may not exist yet
            pass
        if not job.alive():
            raise AssertionError(f"floe exited while waiting for {total} rows\n{job.logs()}")
        if time.monotonic() > deadline:
            n = count(lake, ident)
            raise AssertionError(f"timed out after {timeout}s with {n} of {total} rows\n{job.logs()}")
        time.sleep(0.3)


def read_table(lake: SqlLake, ident: str):
    """The table as a pyarrow Table, loaded afresh."""
    return lake.pyiceberg().load_table(ident).scan().to_arrow()


def count(lake: SqlLake, ident: str) -> int:
    return read_table(lake, ident).num_rows


def rows_in_write_order(lake: SqlLake, ident: str) -> list[dict[str, Any]]:
    """The rows in the order floe wrote them: by commit (data sequence number), then by
    position in the data file. A job writes one data file per checkpoint of an
    unpartitioned table, and the rows of a file in the order its source returned them."""
    import pyarrow.parquet as pq

    table = lake.pyiceberg().load_table(ident)
    entries = table.inspect.entries().to_pylist()
    files: dict[int, list[str]] = {}
    for e in entries:
        if e["data_file"]["content"] == 0 and e["status"] != 2:
            files.setdefault(e["sequence_number"], []).append(e["data_file"]["file_path"])
    rows: list[dict[str, Any]] = []
    for seq in sorted(files):
        paths = files[seq]
        assert len(paths) == 1, f"commit {seq} added {len(paths)} data files; the order between them is unknown"
        rows += pq.read_table(paths[0].removeprefix("file://")).to_pylist()
    return rows


class Producer(threading.Thread):
    """Puts keyed JSON records {"id", "k", "n"} in the background: `n` counts up per key,
    so a key's records must come out in `n` order. `pause` between batches of `batch`."""

    def __init__(self, stream: Stream, total: int, keys: int, batch: int, pause: float, first_id: int = 0):
        super().__init__(daemon=True)
        self.stream, self.total, self.keys, self.batch, self.pause = stream, total, keys, batch, pause
        self.next_id = first_id
        self.counters = [0] * keys
        self.error: BaseException | None = None
        self.sent = 0
        # Records are made and put under one lock, so each key's n follows the put order
        # when the test puts records of its own while the thread runs.
        self.lock = threading.Lock()

    def records(self, n: int) -> list[tuple[str, bytes]]:
        out = []
        for _ in range(n):
            k = self.next_id % self.keys
            out.append((f"key-{k}", json.dumps({"id": self.next_id, "k": f"key-{k}", "n": self.counters[k]}).encode()))
            self.counters[k] += 1
            self.next_id += 1
        return out

    def put_now(self, n: int) -> None:
        """Put `n` more records at once (from any thread)."""
        with self.lock:
            self.stream.put(self.records(n))

    def run(self) -> None:
        try:
            while self.sent < self.total:
                n = min(self.batch, self.total - self.sent)
                self.put_now(n)
                self.sent += n
                time.sleep(self.pause)
        except BaseException as e:  # reported by join_checked
            self.error = e

    def join_checked(self, timeout: float = 120) -> None:
        self.join(timeout)
        assert not self.is_alive(), "the producer did not finish"
        if self.error is not None:
            raise self.error
