-- Nexmark q5: hot items, the auctions with the most bids in each 10-second window sliding
-- every 2 seconds. The per-auction counts are one windowed aggregate, read twice (a CTE):
-- their maximum per window, joined back to them on the window.
CREATE TABLE IF NOT EXISTS lake.nexmark.q5 (auction BIGINT, num BIGINT);
INSERT INTO lake.nexmark.q5
WITH counts AS (
  SELECT auction, count(*) AS num, window_start, window_end
  FROM HOP(bid, date_time, INTERVAL '2' SECOND, INTERVAL '10' SECOND)
  GROUP BY auction, window_start, window_end
)
SELECT c.auction, c.num
FROM counts c JOIN (
  SELECT max(num) AS maxn, window_start, window_end FROM counts GROUP BY window_start, window_end
) m ON c.window_start = m.window_start AND c.window_end = m.window_end AND c.num >= m.maxn;
