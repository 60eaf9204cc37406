"""Windowed aggregates checked against an independent computation.

Events (JSON lines) come out of order, some far too late. The windows floe writes are read
back through pyiceberg and DuckDB's iceberg_scan and compared with what DuckDB computes from the
same events, lateness decided here in Python by the rule floe documents: a record is late when
the watermark before it (the largest event time so far, less the allowed disorder) has passed
the end of its window. The late records are exactly floe's dead letters.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from pathlib import Path

from conftest import SqlLake

BASE = dt.datetime(2024, 5, 1, 10, 0, 0)
EVENTS = 6000
DELAY_S = 3  # WATERMARK FOR ts AS ts - INTERVAL '3' SECOND


def make_events(path: Path) -> list[dict]:
    rng = random.Random(7)
    events = []
    for i in range(EVENTS):
        # One event every 200 ms, up to 8 s early; every 500th is 5 minutes behind.
        ms = i * 200 - rng.randint(0, 8000) - (300_000 if i % 500 == 499 else 0)
        events.append(
            {
                "id": i,
                "user_id": rng.randint(1, 40),
                "region": rng.choice(["eu", "us", "ap"]),
                "latency_ms": rng.randint(5, 900),
                "ts": (BASE + dt.timedelta(milliseconds=ms)).isoformat(timespec="milliseconds"),
            }
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return events


def on_time(events: list[dict], size_s: int, slide_s: int) -> tuple[list[dict], set[int]]:
    """(record, window) pairs whose window was still open when the record came, and the ids
    of records late for at least one of their windows."""
    kept, late = [], set()
    watermark = None
    for e in events:
        ts = dt.datetime.fromisoformat(e["ts"])
        epoch = (ts - dt.datetime(1970, 1, 1)).total_seconds()
        last_start = int(epoch // slide_s) * slide_s
        for k in range(size_s // slide_s):
            start = last_start - k * slide_s
            end = start + size_s
            end_ts = dt.datetime(1970, 1, 1) + dt.timedelta(seconds=end)
            if watermark is not None and end_ts <= watermark:
                late.add(e["id"])
            else:
                kept.append({**e, "window_start": dt.datetime(1970, 1, 1) + dt.timedelta(seconds=start)})
        mark = ts - dt.timedelta(seconds=DELAY_S)
        watermark = mark if watermark is None or mark > watermark else watermark
    return kept, late


def dead_letter_ids(catalog, table: str, reason: str, by: str = "job") -> dict[str, set[int]]:
    """The ids of the records dead-lettered into `table`, by job (or source), each letter's
    reason checked to start with `reason`."""
    ids: dict[str, set[int]] = {}
    for letter in catalog.load_table(table).scan().to_arrow().to_pylist():
        assert letter["error"].startswith(reason), letter["error"]
        ids.setdefault(letter[by], set()).add(json.loads(letter["payload"])["id"])
    return ids


def expected(duck, rows: list[dict], sql: str) -> list[tuple]:
    import pyarrow as pa

    duck.register("kept", pa.Table.from_pylist(rows))
    try:
        return [tuple(r) for r in duck.execute(sql).fetchall()]
    finally:
        duck.unregister("kept")


def test_windows_match_an_independent_computation(run_lake, lake: SqlLake, duck, tmp_path: Path):
    events = make_events(tmp_path / "events" / "events.jsonl")
    run_lake(
        "CREATE SCHEMA lake.web",
        "CREATE TABLE lake.web.per_minute (window_start TIMESTAMP, window_end TIMESTAMP, "
        "region STRING, views BIGINT, users BIGINT, latency BIGINT, slowest BIGINT) "
        "PARTITIONED BY (region)",
        "CREATE TABLE lake.web.busy (window_start TIMESTAMP, views BIGINT)",
        f"CREATE SOURCE events (id BIGINT, user_id BIGINT, region STRING, latency_ms BIGINT, "
        f"ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '{DELAY_S}' SECOND) "
        f"WITH ('connector' = 'filesystem', 'path' = '{tmp_path / 'events'}', 'format' = 'json')",
        f"SET 'state.dir' = '{tmp_path / 'state'}'",
        "SET 'table.dml-sync' = 'true'",
        "SET 'pipeline.name' = 'per-minute'",
        "INSERT INTO lake.web.per_minute SELECT window_start, window_end, region, count(*), "
        "count(DISTINCT user_id), sum(latency_ms), max(latency_ms) "
        "FROM TUMBLE(events, ts, INTERVAL '1' MINUTE) GROUP BY window_start, window_end, region",
        "SET 'pipeline.name' = 'busy'",
        "INSERT INTO lake.web.busy SELECT window_start, count(*) "
        "FROM HOP(events, ts, INTERVAL '30' SECOND, INTERVAL '2' MINUTE) "
        "GROUP BY window_start, window_end",
    )

    kept, late_minute = on_time(events, 60, 60)
    want_minutes = expected(
        duck,
        kept,
        "SELECT window_start, window_start + INTERVAL 1 MINUTE, region, count(*), "
        "count(DISTINCT user_id), sum(latency_ms), max(latency_ms) FROM kept "
        "GROUP BY ALL ORDER BY 1, 3",
    )
    assert len(want_minutes) > 50 and late_minute, "the events give windows and late records"

    catalog = lake.pyiceberg()
    got = catalog.load_table("web.per_minute").scan().to_arrow().sort_by(
        [("window_start", "ascending"), ("region", "ascending")]
    )
    assert [tuple(r.values()) for r in got.to_pylist()] == want_minutes

    loc = catalog.load_table("web.per_minute").metadata_location
    through_duck = duck.execute(
        f"SELECT * FROM iceberg_scan('{loc}') ORDER BY window_start, region"
    ).fetchall()
    assert [tuple(r) for r in through_duck] == want_minutes

    kept_hops, late_hop = on_time(events, 120, 30)
    want_hops = expected(
        duck, kept_hops, "SELECT window_start, count(*) FROM kept GROUP BY ALL ORDER BY 1"
    )
    busy = catalog.load_table("web.busy").scan().to_arrow().sort_by("window_start")
    assert [tuple(r.values()) for r in busy.to_pylist()] == want_hops

    # The late records, and only they, are dead letters, each with its line and the reason.
    by_job = dead_letter_ids(catalog, "web.dead_letters", "late: its window ended at")
    assert by_job == {"per-minute": late_minute, "busy": late_hop}


def flink_sessions(events: list[dict], gap_s: int) -> tuple[list[tuple], set[int]]:
    """Each user's sessions as Flink's window operator merges them, record by record in the
    order they come: sessions whose end the watermark has passed are emitted; a record opens a
    window (its time + the gap) merged with the user's sessions still open that it overlaps,
    and is late when the watermark has passed the end of what that merges into."""
    gap = dt.timedelta(seconds=gap_s)
    open_by_user: dict[int, list[dict]] = {}
    emitted, late = [], set()
    watermark = None
    for e in events:
        ts = dt.datetime.fromisoformat(e["ts"])
        sessions = open_by_user.setdefault(e["user_id"], [])
        if watermark is not None:
            for s in [s for s in sessions if s["end"] <= watermark]:
                sessions.remove(s)
                emitted.append((e["user_id"], s))
        merged = {"start": ts, "end": ts + gap, "events": [e]}
        overlapping = [s for s in sessions if s["start"] < merged["end"] and merged["start"] < s["end"]]
        for s in overlapping:
            merged["start"] = min(merged["start"], s["start"])
            merged["end"] = max(merged["end"], s["end"])
            merged["events"] += s["events"]
        if watermark is not None and merged["end"] <= watermark:
            late.add(e["id"])  # the merged window is late: Flink drops the record
        else:
            for s in overlapping:
                sessions.remove(s)
            sessions.append(merged)
        mark = ts - dt.timedelta(seconds=DELAY_S)
        watermark = mark if watermark is None or mark > watermark else watermark
    emitted += [(user, s) for user, sessions in open_by_user.items() for s in sessions]
    rows = sorted(
        (s["start"], s["end"], user, len(s["events"]), sum(x["latency_ms"] for x in s["events"]))
        for user, s in emitted
    )
    return rows, late


def test_sessions_merge_as_flinks_do(run_lake, lake: SqlLake, duck, tmp_path: Path):
    """Each user's sessions (4 s gap) from events up to 8 s out of order, a 3 s watermark delay:
    many records come behind the watermark with their own session still open, and join the
    sessions open when they came or start one beside a session emitted already. floe's
    sessions and dead letters are those of a record-by-record simulation of Flink's merging."""
    events = make_events(tmp_path / "events" / "events.jsonl")
    run_lake(
        "CREATE SCHEMA lake.web",
        "CREATE TABLE lake.web.visits (window_start TIMESTAMP, window_end TIMESTAMP, "
        "user_id BIGINT, views BIGINT, latency BIGINT)",
        f"CREATE SOURCE events (id BIGINT, user_id BIGINT, region STRING, latency_ms BIGINT, "
        f"ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '{DELAY_S}' SECOND) "
        f"WITH ('connector' = 'filesystem', 'path' = '{tmp_path / 'events'}', 'format' = 'json')",
        f"SET 'state.dir' = '{tmp_path / 'state'}'",
        "SET 'checkpoint.interval' = '200ms'",
        "SET 'pipeline.name' = 'visits'",
        "INSERT INTO lake.web.visits SELECT window_start, window_end, user_id, count(*), "
        "sum(latency_ms) FROM SESSION(events, ts, INTERVAL '4' SECOND) "
        "GROUP BY user_id, window_start, window_end",
        # The same with its state beyond 4 KB on disk.
        "CREATE TABLE lake.web.visits_spilled AS SELECT * FROM lake.web.visits WHERE false",
        "SET 'state.memory-budget' = '4kb'",
        "SET 'pipeline.name' = 'visits-spilled'",
        "INSERT INTO lake.web.visits_spilled SELECT window_start, window_end, user_id, count(*), "
        "sum(latency_ms) FROM SESSION(events, ts, INTERVAL '4' SECOND) "
        "GROUP BY user_id, window_start, window_end",
    )
    want, late = flink_sessions(events, 4)
    behind = late_ids(events, DELAY_S) - late
    # Records whose own window (time + 4 s) the watermark had passed, kept by a longer
    # session of their user still open around them.
    held = {e["id"] for e in events if e["id"] in late_ids(events, DELAY_S + 4)} - late
    by_user = sorted((user, start, end) for start, end, user, *_ in want)
    beside = sum(1 for a, b in zip(by_user, by_user[1:]) if a[0] == b[0] and b[1] < a[2])
    assert len(want) > 300 and late and len(behind) > 100 and beside > 10 and held, (
        "sessions, late records, records behind the watermark kept, sessions beside emitted "
        "ones, records held by a longer session"
    )

    catalog = lake.pyiceberg()
    for table in ("web.visits", "web.visits_spilled"):
        got = catalog.load_table(table).scan().to_arrow().to_pylist()
        got = sorted(
            (r["window_start"], r["window_end"], r["user_id"], r["views"], r["latency"]) for r in got
        )
        assert got == want, table

    loc = catalog.load_table("web.visits").metadata_location
    through_duck = duck.execute(
        f"SELECT * FROM iceberg_scan('{loc}') ORDER BY window_start, window_end, user_id"
    ).fetchall()
    assert sorted(tuple(r) for r in through_duck) == want

    by_job = dead_letter_ids(catalog, "web.dead_letters", "late: its session window")
    assert by_job == {"visits": late, "visits-spilled": late}


def late_ids(events: list[dict], delay_s: int) -> set[int]:
    """The ids of records behind their stream's watermark when they came."""
    late, watermark = set(), None
    for e in events:
        ts = dt.datetime.fromisoformat(e["ts"])
        if watermark is not None and ts < watermark:
            late.add(e["id"])
        mark = ts - dt.timedelta(seconds=delay_s)
        watermark = mark if watermark is None or mark > watermark else watermark
    return late


def test_interval_join_matches_an_independent_computation(run_lake, lake: SqlLake, duck, tmp_path: Path):
    """Clicks met with the impressions of the same ad shown up to 10 s before them. Both
    streams come out of order; the records behind their stream's watermark are dead letters
    (their partners may be gone), the others meet exactly as DuckDB's join says."""
    import pyarrow as pa

    rng = random.Random(11)

    def stream(name: str, n: int, step_ms: int) -> list[dict]:
        rows = [
            {
                "id": i,
                "ad": rng.randint(1, 60),
                "ts": (BASE + dt.timedelta(milliseconds=i * step_ms - rng.randint(0, 6000)))
                .isoformat(timespec="milliseconds"),
            }
            for i in range(n)
        ]
        path = tmp_path / name / f"{name}.jsonl"
        path.parent.mkdir(parents=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return rows

    impressions = stream("impressions", 4000, 150)
    clicks = stream("clicks", 3000, 200)
    source = lambda name: (  # noqa: E731
        f"CREATE SOURCE {name} (id BIGINT, ad BIGINT, ts TIMESTAMP, "
        f"WATERMARK FOR ts AS ts - INTERVAL '{DELAY_S}' SECOND) WITH ('connector' = "
        f"'filesystem', 'path' = '{tmp_path / name}', 'format' = 'json')"
    )
    run_lake(
        "CREATE SCHEMA lake.ads",
        "CREATE TABLE lake.ads.attributed (click BIGINT, impression BIGINT, ad BIGINT)",
        source("impressions"),
        source("clicks"),
        f"SET 'state.dir' = '{tmp_path / 'state'}'",
        "SET 'table.dml-sync' = 'true'",
        "SET 'pipeline.name' = 'attributed'",
        "INSERT INTO lake.ads.attributed SELECT c.id, i.id, c.ad FROM clicks c "
        "JOIN impressions i ON c.ad = i.ad AND c.ts BETWEEN i.ts AND i.ts + INTERVAL '10' SECOND",
    )
    late_clicks, late_impressions = late_ids(clicks, DELAY_S), late_ids(impressions, DELAY_S)
    assert late_clicks and late_impressions, "the streams have late records"
    for name, rows, late in (("c", clicks, late_clicks), ("i", impressions, late_impressions)):
        duck.register(name, pa.Table.from_pylist([r for r in rows if r["id"] not in late]))
    want = duck.execute(
        "SELECT c.id, i.id, c.ad FROM c JOIN i ON c.ad = i.ad "
        "AND CAST(c.ts AS TIMESTAMP) BETWEEN CAST(i.ts AS TIMESTAMP) "
        "AND CAST(i.ts AS TIMESTAMP) + INTERVAL 10 SECOND ORDER BY 1, 2"
    ).fetchall()
    assert len(want) > 100
    got = lake.pyiceberg().load_table("ads.attributed").scan().to_arrow()
    got = sorted(tuple(r.values()) for r in got.to_pylist())
    assert got == [tuple(r) for r in want]

    by_source = dead_letter_ids(
        lake.pyiceberg(), "ads.dead_letters", "late: its ts is behind the watermark", by="source"
    )
    assert by_source == {"clicks": late_clicks, "impressions": late_impressions}
