-- Nexmark q8: new users who opened an auction in the 10-second window they registered in.
-- Written as a window join (persons and auctions joined on the seller and the window, a join
-- of two streams) under one windowed aggregate, rather than a join of two aggregates.
CREATE TABLE IF NOT EXISTS lake.nexmark.q8 (id BIGINT, name STRING, starttime TIMESTAMP);
INSERT INTO lake.nexmark.q8
SELECT p.id, p.name, p.window_start AS starttime
FROM TUMBLE(person, date_time, INTERVAL '10' SECOND) p
JOIN TUMBLE(auction, date_time, INTERVAL '10' SECOND) a
  ON p.id = a.seller AND p.window_start = a.window_start AND p.window_end = a.window_end
GROUP BY p.id, p.name, p.window_start, p.window_end;
