-- Nexmark q18: each bidder's last bid on each auction (deduplication, the top-1 by time
-- descending, updated at every checkpoint, keyed by bidder and auction).
CREATE TABLE IF NOT EXISTS lake.nexmark.q18 (auction BIGINT, bidder BIGINT, price BIGINT,
  channel STRING, url STRING, date_time TIMESTAMP, extra STRING,
  PRIMARY KEY (bidder, auction) NOT ENFORCED);
INSERT INTO lake.nexmark.q18
SELECT auction, bidder, price, channel, url, date_time, extra
FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY bidder, auction ORDER BY date_time DESC) AS rank_number
      FROM bid)
WHERE rank_number <= 1;
