"""The Nexmark queries under benches/nexmark/, checked against an independent computation.

floe generates the three Nexmark streams (one consistent world: persons, auctions, bids),
copies each to a lake table, and runs every query file as a continuous job into its own table.
DuckDB then reads the copied events through iceberg_scan, computes each query itself (the
DuckDB SQL below, written for DuckDB, not taken from the files), and must find exactly the rows
floe wrote, read back through iceberg_scan as well.
"""

from __future__ import annotations

import decimal
from pathlib import Path

from conftest import SqlLake

QUERIES = Path(__file__).resolve().parents[2] / "benches" / "nexmark"
EVENTS = 20_000  # 1 person, 3 auctions and 46 bids in every 50 events
RATE = 500  # events per second of event time: 40 s of it, several windows

STREAMS = {
    "person": ("nexmark.person", EVENTS // 50,
               "id BIGINT, name STRING, email_address STRING, credit_card STRING, city STRING, "
               "state STRING, date_time TIMESTAMP, extra STRING"),
    "auction": ("nexmark.auction", EVENTS * 3 // 50,
                "id BIGINT, item_name STRING, description STRING, initial_bid BIGINT, "
                "reserve BIGINT, date_time TIMESTAMP, expires TIMESTAMP, seller BIGINT, "
                "category BIGINT, extra STRING"),
    "bid": ("nexmark.bid", EVENTS * 46 // 50,
            "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, "
            "date_time TIMESTAMP, extra STRING"),
}

RANKS = """
  count(*) FILTER (WHERE price < 10000),
  count(*) FILTER (WHERE price >= 10000 AND price < 1000000),
  count(*) FILTER (WHERE price >= 1000000)"""
DISTINCT_RANKS = """
  count(DISTINCT bidder),
  count(DISTINCT bidder) FILTER (WHERE price < 10000),
  count(DISTINCT bidder) FILTER (WHERE price >= 10000 AND price < 1000000),
  count(DISTINCT bidder) FILTER (WHERE price >= 1000000),
  count(DISTINCT auction),
  count(DISTINCT auction) FILTER (WHERE price < 10000),
  count(DISTINCT auction) FILTER (WHERE price >= 10000 AND price < 1000000),
  count(DISTINCT auction) FILTER (WHERE price >= 1000000)"""
HOUR = "hour(date_time)"

# Each query as DuckDB computes it from the events, and the columns of floe's table compared
# with it (all of them unless named).
EXPECTED: dict[str, tuple[str, str]] = {
    "q0": ("SELECT auction, bidder, price, channel, url, date_time, extra FROM bid", "*"),
    "q1": ("SELECT auction, bidder, 0.908::DOUBLE * price, date_time, extra FROM bid", "*"),
    "q2": ("SELECT auction, price FROM bid WHERE auction % 123 = 0", "*"),
    "q3": ("SELECT p.name, p.city, p.state, a.id FROM auction a JOIN person p ON a.seller = p.id "
           "WHERE a.category = 10 AND p.state IN ('OR', 'ID', 'CA')", "*"),
    "q4": ("SELECT category, avg(final) FROM (SELECT max(b.price) AS final, a.category "
           "FROM auction a JOIN bid b ON a.id = b.auction "
           "AND b.date_time BETWEEN a.date_time AND a.expires GROUP BY a.id, a.category) "
           "GROUP BY category", "*"),
    # HOP(2 s, 10 s): each bid in the five windows starting in the 10 s up to it.
    "q5": ("WITH w AS (SELECT auction, time_bucket(INTERVAL 2 SECOND, date_time) "
           "- to_seconds(2 * k) AS ws FROM bid, range(5) t(k)), "
           "counts AS (SELECT auction, count(*) AS num, ws FROM w GROUP BY auction, ws) "
           "SELECT c.auction, c.num FROM counts c JOIN (SELECT max(num) AS maxn, ws FROM counts "
           "GROUP BY ws) m ON c.ws = m.ws AND c.num >= m.maxn", "*"),
    "q6": ("SELECT seller, avg(final) FROM (SELECT seller, final, row_number() OVER "
           "(PARTITION BY seller ORDER BY date_time DESC, id DESC) AS rn FROM (SELECT a.id, "
           "a.seller, a.date_time, max(b.price) AS final FROM auction a JOIN bid b "
           "ON a.id = b.auction AND b.date_time BETWEEN a.date_time AND a.expires "
           "GROUP BY a.id, a.seller, a.date_time)) WHERE rn <= 10 GROUP BY seller", "*"),
    "q7": ("SELECT auction, price, bidder, date_time, extra FROM bid QUALIFY rank() OVER "
           "(PARTITION BY time_bucket(INTERVAL 10 SECOND, date_time) ORDER BY price DESC) = 1",
           "*"),
    "q8": ("SELECT DISTINCT p.id, p.name, time_bucket(INTERVAL 10 SECOND, p.date_time) "
           "FROM person p JOIN auction a ON p.id = a.seller AND time_bucket(INTERVAL 10 SECOND, "
           "p.date_time) = time_bucket(INTERVAL 10 SECOND, a.date_time)", "*"),
    "q9": ("SELECT a.id, a.item_name, a.description, a.initial_bid, a.reserve, a.date_time, "
           "a.expires, a.seller, a.category, b.auction, b.bidder, b.price, b.date_time "
           "FROM auction a JOIN bid b ON a.id = b.auction "
           "AND b.date_time BETWEEN a.date_time AND a.expires "
           "QUALIFY row_number() OVER (PARTITION BY a.id ORDER BY b.price DESC, b.date_time) = 1",
           "*"),
    "q10": ("SELECT auction, bidder, price, date_time, extra, strftime(date_time, '%Y-%m-%d'), "
            "strftime(date_time, '%H:%M') FROM bid", "*"),
    # Each bidder's sessions: a bid starts one 10 s or more after the bidder's bid before it.
    "q11": ("SELECT bidder, count(*), min(date_time), max(date_time) + INTERVAL 10 SECOND "
            "FROM (SELECT *, sum(starts) OVER (PARTITION BY bidder ORDER BY date_time "
            "ROWS UNBOUNDED PRECEDING) AS session FROM (SELECT *, CASE WHEN date_time < "
            "lag(date_time) OVER (PARTITION BY bidder ORDER BY date_time) + INTERVAL 10 SECOND "
            "THEN 0 ELSE 1 END AS starts FROM bid)) GROUP BY bidder, session", "*"),
    # Windows of processing time are not in the events: each bidder's bids, all counted once,
    # in windows of 10 s.
    "q12": ("SELECT bidder, count(*), true FROM bid GROUP BY bidder",
            "DISTINCT bidder, sum(bid_count) OVER (PARTITION BY bidder), "
            "bool_and(endtime - starttime = INTERVAL 10 SECOND "
            "AND epoch_us(starttime) % 10000000 = 0) OVER ()"),
    "q13": ("SELECT auction, bidder, price, date_time, 'side-' || CAST(auction % 10000 AS VARCHAR) "
            "FROM bid", "*"),
    "q14": ("SELECT auction, bidder, 0.908::DOUBLE * price, CASE "
            f"WHEN {HOUR} >= 8 AND {HOUR} <= 18 THEN 'dayTime' "
            f"WHEN {HOUR} <= 6 OR {HOUR} >= 20 THEN 'nightTime' ELSE 'otherTime' END, "
            "date_time, extra, length(extra) - length(replace(extra, 'c', '')) FROM bid "
            "WHERE 0.908::DOUBLE * price > 1000000 AND 0.908::DOUBLE * price < 50000000", "*"),
    "q15": (f"SELECT CAST(date_time AS DATE), count(*), {RANKS}, {DISTINCT_RANKS} FROM bid "
            "GROUP BY 1", "*"),
    "q16": (f"SELECT channel, CAST(date_time AS DATE), max(strftime(date_time, '%H:%M')), "
            f"count(*), {RANKS}, {DISTINCT_RANKS} FROM bid GROUP BY 1, 2", "*"),
    "q17": (f"SELECT auction, CAST(date_time AS DATE), count(*), {RANKS}, min(price), "
            "max(price), avg(price), sum(price) FROM bid GROUP BY 1, 2", "*"),
    "q18": ("SELECT auction, bidder, price, channel, url, date_time, extra FROM bid "
            "QUALIFY row_number() OVER (PARTITION BY bidder, auction ORDER BY date_time DESC) = 1",
            "*"),
    # Bids of equal price may take each other's rank: compare the ranks' prices.
    "q19": ("SELECT auction, price, rank_number FROM (SELECT auction, price, row_number() OVER "
            "(PARTITION BY auction ORDER BY price DESC) AS rank_number FROM bid) "
            "WHERE rank_number <= 10", "auction, price, rank_number"),
    "q20": ("SELECT b.auction, b.bidder, b.price, b.channel, b.url, b.date_time, a.item_name, "
            "a.description, a.initial_bid, a.reserve, a.date_time, a.expires, a.seller, "
            "a.category FROM bid b JOIN auction a ON b.auction = a.id WHERE a.category = 10", "*"),
    "q21": ("SELECT auction, bidder, price, channel, CASE lower(channel) WHEN 'apple' THEN '0' "
            "WHEN 'google' THEN '1' WHEN 'facebook' THEN '2' WHEN 'baidu' THEN '3' "
            "ELSE regexp_extract(url, '(&|^)channel_id=([^&]*)', 2) END FROM bid "
            "WHERE regexp_extract(url, '(&|^)channel_id=([^&]*)', 2) <> '' "
            "OR lower(channel) IN ('apple', 'google', 'facebook', 'baidu')", "*"),
    "q22": ("SELECT auction, bidder, price, channel, split_part(url, '/', 4), "
            "split_part(url, '/', 5), split_part(url, '/', 6) FROM bid", "*"),
}


def statements(path: Path) -> list[str]:
    """The statements of a query file, comments left out."""
    text = "\n".join(l for l in path.read_text().splitlines() if not l.lstrip().startswith("--"))
    return [s.strip() for s in text.split(";") if s.strip()]


def normal(rows: list[tuple]) -> list[tuple]:
    """Rows comparable across engines: floats to 6 significant digits, sorted."""

    def value(v):
        if isinstance(v, (float, decimal.Decimal)):
            return float(f"{float(v):.6g}")
        return v

    return sorted((tuple(value(v) for v in r) for r in rows), key=repr)


def test_the_query_files_cover_what_floe_runs():
    files = sorted(p.stem for p in QUERIES.glob("q*.sql"))
    assert sorted(EXPECTED) == files, "every query file has its DuckDB computation here"


def test_nexmark_queries_match_duckdb(run_lake, lake: SqlLake, duck, tmp_path: Path):
    setup = ["CREATE SCHEMA lake.nexmark", f"SET 'state.dir' = '{tmp_path / 'state'}'",
             "SET 'table.dml-sync' = 'true'"]
    for name, (profile, rows, columns) in STREAMS.items():
        setup += [
            f"CREATE SOURCE {name} (WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND) "
            f"WITH ('connector' = 'datagen', 'profile' = '{profile}', "
            f"'number-of-rows' = '{rows}', 'nexmark.events-per-second' = '{RATE}')",
            f"CREATE TABLE lake.nexmark.{name}_events ({columns})",
            f"SET 'pipeline.name' = '{name}-events'",
            f"INSERT INTO lake.nexmark.{name}_events SELECT * FROM {name}",
        ]
    for query in sorted(EXPECTED):
        setup += [f"SET 'pipeline.name' = '{query}'", *statements(QUERIES / f"{query}.sql")]
    run_lake(*setup)

    catalog = lake.pyiceberg()
    location = lambda table: catalog.load_table(f"nexmark.{table}").metadata_location  # noqa: E731
    for name in STREAMS:
        duck.execute(f"CREATE VIEW {name} AS SELECT * FROM iceberg_scan('{location(name + '_events')}')")
    counts = {n: duck.execute(f"SELECT count(*) FROM {n}").fetchone()[0] for n in STREAMS}
    assert counts == {n: rows for n, (_, rows, _) in STREAMS.items()}

    letters = catalog.load_table("nexmark.dead_letters").scan().to_arrow().to_pylist() \
        if catalog.table_exists("nexmark.dead_letters") else []
    assert letters == [], f"no record of a well-formed stream is a dead letter: {letters[:3]}"

    q10 = catalog.load_table("nexmark.q10")
    assert [f.name for f in q10.spec().fields] == ["dt", "hm"], "q10 partitioned by day, minute"
    minutes = duck.execute("SELECT count(DISTINCT strftime(date_time, '%Y-%m-%d %H:%M')) "
                           "FROM bid").fetchone()[0]
    assert len(q10.inspect.partitions()) == minutes, "q10: a partition per minute of bids"

    for query, (sql, columns) in sorted(EXPECTED.items()):
        want = normal(duck.execute(sql).fetchall())
        got = normal(duck.execute(
            f"SELECT {columns} FROM iceberg_scan('{location(query)}')").fetchall())
        assert want, f"{query}: DuckDB finds rows"
        assert len(got) == len(want), f"{query}: {len(got)} rows, DuckDB {len(want)}"
        diff = [(g, w) for g, w in zip(got, want) if g != w]
        assert not diff, f"{query}: first differences (floe, DuckDB): {diff[:3]}"
