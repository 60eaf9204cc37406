-- Nexmark q4: the average closing price per category: each auction's highest bid while it was
-- open (a join of two streams, then an aggregate), averaged per category (an aggregate of
-- the aggregate's rows, recomputed over every auction at each checkpoint).
CREATE TABLE IF NOT EXISTS lake.nexmark.q4 (category BIGINT, avg_final DOUBLE,
  PRIMARY KEY (category) NOT ENFORCED);
INSERT INTO lake.nexmark.q4
SELECT q.category, avg(q.final) AS avg_final
FROM (
  SELECT max(b.price) AS final, a.category
  FROM auction a JOIN bid b ON a.id = b.auction
  WHERE b.date_time BETWEEN a.date_time AND a.expires
  GROUP BY a.id, a.category
) q
GROUP BY q.category;
