#!/usr/bin/env python3
"""Create the Kinesis stream that sql/kinesis.sql reads, and fill it.

    scripts/test-env.sh install && scripts/test-env.sh start
    eval "$(scripts/test-env.sh env)"
    "$FLOE_TEST_PYTHON" scripts/seed-kinesis.py      # then: floe -f sql/kinesis.sql

The stream 'clicks' on $FLOE_KINESIS (default http://127.0.0.1:4567) is made afresh: two
shards, 600 click records, a split of one shard, 400 more records (in its children too),
and two records that are not JSON (they go to the dead-letter table). Needs boto3.
"""

from __future__ import annotations

import json
import os
import sys
import time

import boto3

STREAM = "clicks"
ENDPOINT = os.environ.get("FLOE_KINESIS", "http://127.0.0.1:4567")


def wait(k, status: str | None) -> None:
    for _ in range(300):
        try:
            s = k.describe_stream_summary(StreamName=STREAM)["StreamDescriptionSummary"]["StreamStatus"]
        except k.exceptions.ResourceNotFoundException:
            s = None
        if s == status:
            return
        time.sleep(0.05)
    sys.exit(f"stream {STREAM} did not reach state {status} on {ENDPOINT}")


def put(k, first: int, n: int) -> None:
    records = [
        {"PartitionKey": f"user-{i % 40}", "Data": json.dumps({"user_id": i % 40, "url": f"/page/{i % 13}"}).encode()}
        for i in range(first, first + n)
    ]
    for i in range(0, len(records), 500):
        resp = k.put_records(StreamName=STREAM, Records=records[i : i + 500])
        if resp.get("FailedRecordCount"):
            sys.exit(f"put_records failed: {resp}")


def main() -> None:
    k = boto3.client(
        "kinesis",
        endpoint_url=ENDPOINT,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    try:
        k.delete_stream(StreamName=STREAM)
        wait(k, None)
    except k.exceptions.ResourceNotFoundException:
        pass
    k.create_stream(StreamName=STREAM, ShardCount=2)
    wait(k, "ACTIVE")
    put(k, 0, 600)
    shard = k.list_shards(StreamName=STREAM)["Shards"][0]
    lo, hi = (int(shard["HashKeyRange"][key]) for key in ("StartingHashKey", "EndingHashKey"))
    k.split_shard(StreamName=STREAM, ShardToSplit=shard["ShardId"], NewStartingHashKey=str((lo + hi) // 2 + 1))
    time.sleep(0.1)
    wait(k, "ACTIVE")
    # kinesalite stamps records put into a child shard during its first second with that
    # second's end (arrival times in the future); wait it out, so that every record has
    # arrived by the time floe starts (the bounded mode compares arrival times).
    time.sleep(1.1)
    put(k, 600, 400)
    k.put_records(
        StreamName=STREAM,
        Records=[{"PartitionKey": "bad", "Data": b"not json"}, {"PartitionKey": "bad", "Data": b'{"user_id": "x"}'}],
    )
    shards = len(k.list_shards(StreamName=STREAM)["Shards"])
    print(f"stream {STREAM} on {ENDPOINT}: {shards} shards, 1000 records and 2 bad ones")


if __name__ == "__main__":
    main()
