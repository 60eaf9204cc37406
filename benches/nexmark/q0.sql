-- Nexmark q0: pass-through. Measures the cost of reading and writing alone.
CREATE TABLE IF NOT EXISTS lake.nexmark.q0 (auction BIGINT, bidder BIGINT, price BIGINT,
  channel STRING, url STRING, date_time TIMESTAMP, extra STRING);
INSERT INTO lake.nexmark.q0 SELECT auction, bidder, price, channel, url, date_time, extra FROM bid;
