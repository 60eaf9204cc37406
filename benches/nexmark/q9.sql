-- Nexmark q9: winning bids, the highest bid of each auction while it was open (a join of two
-- streams, then a top-1 per auction updated at every checkpoint, keyed by the auction).
CREATE TABLE IF NOT EXISTS lake.nexmark.q9 (id BIGINT, item_name STRING, description STRING,
  initial_bid BIGINT, reserve BIGINT, date_time TIMESTAMP, expires TIMESTAMP, seller BIGINT,
  category BIGINT, auction BIGINT, bidder BIGINT, price BIGINT, bid_date_time TIMESTAMP,
  PRIMARY KEY (id) NOT ENFORCED);
INSERT INTO lake.nexmark.q9
SELECT id, item_name, description, initial_bid, reserve, date_time, expires, seller, category,
       auction, bidder, price, bid_date_time
FROM (
  SELECT a.id, a.item_name, a.description, a.initial_bid, a.reserve, a.date_time, a.expires,
         a.seller, a.category, b.auction, b.bidder, b.price, b.date_time AS bid_date_time,
         ROW_NUMBER() OVER (PARTITION BY a.id ORDER BY b.price DESC, b.date_time ASC) AS rn
  FROM auction a JOIN bid b ON a.id = b.auction
  WHERE b.date_time BETWEEN a.date_time AND a.expires
) WHERE rn <= 1;
