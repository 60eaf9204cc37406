-- Nexmark q11: how many bids each user makes in a session of activity (their bids until 10
-- seconds pass without one). Flink writes it with the legacy GROUP BY SESSION(dateTime,
-- INTERVAL '10' SECOND); SESSION(...) in FROM gives each bidder (the aggregate's other group
-- column) their own sessions the same way, each emitted once the watermark passes its end.
CREATE TABLE IF NOT EXISTS lake.nexmark.q11 (bidder BIGINT, bid_count BIGINT,
  starttime TIMESTAMP, endtime TIMESTAMP);
INSERT INTO lake.nexmark.q11
SELECT bidder, count(*) AS bid_count, window_start AS starttime, window_end AS endtime
FROM SESSION(bid, date_time, INTERVAL '10' SECOND)
GROUP BY bidder, window_start, window_end;
