-- Nexmark q1: currency conversion (dollars to euros).
CREATE TABLE IF NOT EXISTS lake.nexmark.q1 (auction BIGINT, bidder BIGINT, price DOUBLE,
  date_time TIMESTAMP, extra STRING);
INSERT INTO lake.nexmark.q1 SELECT auction, bidder, 0.908 * price AS price, date_time, extra FROM bid;
