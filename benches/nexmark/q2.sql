-- Nexmark q2: selection, the bids of some auctions.
CREATE TABLE IF NOT EXISTS lake.nexmark.q2 (auction BIGINT, price BIGINT);
INSERT INTO lake.nexmark.q2 SELECT auction, price FROM bid WHERE auction % 123 = 0;
