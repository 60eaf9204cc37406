-- Nexmark q20: bids expanded with their auction's details, a join of two streams.
CREATE TABLE IF NOT EXISTS lake.nexmark.q20 (auction BIGINT, bidder BIGINT, price BIGINT,
  channel STRING, url STRING, date_time TIMESTAMP, item_name STRING, description STRING,
  initial_bid BIGINT, reserve BIGINT, auction_date_time TIMESTAMP, expires TIMESTAMP,
  seller BIGINT, category BIGINT);
INSERT INTO lake.nexmark.q20
SELECT b.auction, b.bidder, b.price, b.channel, b.url, b.date_time, a.item_name,
       a.description, a.initial_bid, a.reserve, a.date_time, a.expires, a.seller, a.category
FROM bid b JOIN auction a ON b.auction = a.id
WHERE a.category = 10;
