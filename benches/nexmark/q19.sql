-- Nexmark q19: the ten highest bids of each auction (a top-N updated at every checkpoint,
-- keyed by auction and rank).
CREATE TABLE IF NOT EXISTS lake.nexmark.q19 (auction BIGINT, bidder BIGINT, price BIGINT,
  channel STRING, url STRING, date_time TIMESTAMP, extra STRING, rank_number BIGINT,
  PRIMARY KEY (auction, rank_number) NOT ENFORCED);
INSERT INTO lake.nexmark.q19
SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC) AS rank_number
               FROM bid)
WHERE rank_number <= 10;
