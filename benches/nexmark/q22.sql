-- Nexmark q22: the directories of each bid's url.
CREATE TABLE IF NOT EXISTS lake.nexmark.q22 (auction BIGINT, bidder BIGINT, price BIGINT,
  channel STRING, dir1 STRING, dir2 STRING, dir3 STRING);
INSERT INTO lake.nexmark.q22
SELECT auction, bidder, price, channel,
       split_part(url, '/', 4) AS dir1, split_part(url, '/', 5) AS dir2,
       split_part(url, '/', 6) AS dir3
FROM bid;
