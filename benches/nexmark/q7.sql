-- Nexmark q7: the highest bids of each 10-second window, ties kept. Written as Flink's window
-- top-N (RANK within a TUMBLE window) rather than a join of the stream with its windowed
-- maximum: the same bids, each window emitted once when the watermark passes it.
CREATE TABLE IF NOT EXISTS lake.nexmark.q7 (auction BIGINT, price BIGINT, bidder BIGINT,
  date_time TIMESTAMP, extra STRING);
INSERT INTO lake.nexmark.q7
SELECT auction, price, bidder, date_time, extra
FROM (
  SELECT *, RANK() OVER (PARTITION BY window_start, window_end ORDER BY price DESC) AS rank_number
  FROM TUMBLE(bid, date_time, INTERVAL '10' SECOND)
) WHERE rank_number <= 1;
