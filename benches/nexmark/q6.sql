-- Nexmark q6: the average selling price of each seller's last 10 auctions. Each auction's
-- highest bid while it was open (a join of two streams, then an aggregate kept current), then
-- per seller the 10 latest auctions' prices averaged (the query over the aggregate's rows,
-- recomputed at each checkpoint). Flink's text, an OVER window of 10 preceding rows over the
-- joined aggregate, does not run in Flink (its OVER operator takes no retractions); the result
-- kept here is the one the benchmark defines, a row per seller, current at each checkpoint.
CREATE TABLE IF NOT EXISTS lake.nexmark.q6 (seller BIGINT, avg_price DOUBLE,
  PRIMARY KEY (seller) NOT ENFORCED);
INSERT INTO lake.nexmark.q6
SELECT seller, avg(final) AS avg_price
FROM (
  SELECT seller, final,
         ROW_NUMBER() OVER (PARTITION BY seller ORDER BY date_time DESC, id DESC) AS rn
  FROM (
    SELECT a.id, a.seller, a.date_time, max(b.price) AS final
    FROM auction a JOIN bid b ON a.id = b.auction
    WHERE b.date_time BETWEEN a.date_time AND a.expires
    GROUP BY a.id, a.seller, a.date_time
  )
) WHERE rn <= 10
GROUP BY seller;
