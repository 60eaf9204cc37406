-- Nexmark q12: how many bids each user makes in each 10-second window of processing time
-- (PROCTIME(), when floe reads the bid), not of the bids' own time: each window is emitted
-- once the clock passes its end.
CREATE TABLE IF NOT EXISTS lake.nexmark.q12 (bidder BIGINT, bid_count BIGINT,
  starttime TIMESTAMP, endtime TIMESTAMP);
INSERT INTO lake.nexmark.q12
SELECT bidder, count(*) AS bid_count, window_start AS starttime, window_end AS endtime
FROM TUMBLE((SELECT *, PROCTIME() AS p_time FROM bid), p_time, INTERVAL '10' SECOND)
GROUP BY bidder, window_start, window_end;
