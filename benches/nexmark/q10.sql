-- Nexmark q10: every bid written to a table partitioned by its day and minute (Flink writes
-- a partitioned file system sink; here an Iceberg table partitioned by both columns).
CREATE TABLE IF NOT EXISTS lake.nexmark.q10 (auction BIGINT, bidder BIGINT, price BIGINT,
  date_time TIMESTAMP, extra STRING, dt STRING, hm STRING) PARTITIONED BY (dt, hm);
INSERT INTO lake.nexmark.q10
SELECT auction, bidder, price, date_time, extra,
       to_char(date_time, '%Y-%m-%d') AS dt, to_char(date_time, '%H:%M') AS hm
FROM bid;
