-- Nexmark q8: new users who opened an auction in the 10-second window they registered in.
-- As Flink writes it: the persons and the sellers of each window (two windowed aggregates over
-- two streams) joined on the seller and the window. Both emit a window when the watermark
-- passes it, so the join keeps no state of its own.
CREATE TABLE IF NOT EXISTS lake.nexmark.q8 (id BIGINT, name STRING, starttime TIMESTAMP);
INSERT INTO lake.nexmark.q8
SELECT p.id, p.name, p.starttime
FROM (SELECT id, name, window_start AS starttime, window_end AS endtime
      FROM TUMBLE(person, date_time, INTERVAL '10' SECOND)
      GROUP BY id, name, window_start, window_end) p
JOIN (SELECT seller, window_start AS starttime, window_end AS endtime
      FROM TUMBLE(auction, date_time, INTERVAL '10' SECOND)
      GROUP BY seller, window_start, window_end) a
  ON p.id = a.seller AND p.starttime = a.starttime AND p.endtime = a.endtime;
