-- Nexmark q13: bounded side input join, bids enriched from a lake table (a lookup join).
CREATE TABLE IF NOT EXISTS lake.nexmark.side_input (id BIGINT, value STRING);
INSERT INTO lake.nexmark.side_input
SELECT value AS id, 'side-' || CAST(value AS STRING) AS value FROM range(0, 10000)
WHERE NOT EXISTS (SELECT 1 FROM lake.nexmark.side_input);
CREATE TABLE IF NOT EXISTS lake.nexmark.q13 (auction BIGINT, bidder BIGINT, price BIGINT,
  date_time TIMESTAMP, value STRING);
INSERT INTO lake.nexmark.q13
SELECT b.auction, b.bidder, b.price, b.date_time, s.value
FROM bid b JOIN lake.nexmark.side_input s ON b.auction % 10000 = s.id;
