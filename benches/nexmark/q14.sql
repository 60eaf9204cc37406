-- Nexmark q14: calculation, a CASE on the hour and a count of characters (Flink's UDF
-- count_char written in SQL).
CREATE TABLE IF NOT EXISTS lake.nexmark.q14 (auction BIGINT, bidder BIGINT, price DOUBLE,
  bid_time_type STRING, date_time TIMESTAMP, extra STRING, c_counts BIGINT);
INSERT INTO lake.nexmark.q14
SELECT auction, bidder, 0.908 * price AS price,
       CASE
         WHEN extract(hour FROM date_time) >= 8 AND extract(hour FROM date_time) <= 18 THEN 'dayTime'
         WHEN extract(hour FROM date_time) <= 6 OR extract(hour FROM date_time) >= 20 THEN 'nightTime'
         ELSE 'otherTime'
       END AS bid_time_type,
       date_time, extra,
       CAST(length(extra) - length(replace(extra, 'c', '')) AS BIGINT) AS c_counts
FROM bid
WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000;
