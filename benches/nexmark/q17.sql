-- Nexmark q17: auction statistics per day, an updating aggregate keyed by auction and day.
CREATE TABLE IF NOT EXISTS lake.nexmark.q17 (auction BIGINT, day DATE, total_bids BIGINT,
  rank1_bids BIGINT, rank2_bids BIGINT, rank3_bids BIGINT, min_price BIGINT, max_price BIGINT,
  avg_price DOUBLE, sum_price BIGINT, PRIMARY KEY (auction, day) NOT ENFORCED);
INSERT INTO lake.nexmark.q17
SELECT auction, CAST(date_time AS DATE) AS day,
       count(*) AS total_bids,
       count(*) FILTER (WHERE price < 10000) AS rank1_bids,
       count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids,
       count(*) FILTER (WHERE price >= 1000000) AS rank3_bids,
       min(price) AS min_price, max(price) AS max_price, avg(price) AS avg_price,
       sum(price) AS sum_price
FROM bid
GROUP BY auction, CAST(date_time AS DATE);
