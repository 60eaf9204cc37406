-- Nexmark q21: a channel id from the channel name or, failing that, the url.
CREATE TABLE IF NOT EXISTS lake.nexmark.q21 (auction BIGINT, bidder BIGINT, price BIGINT,
  channel STRING, channel_id STRING);
INSERT INTO lake.nexmark.q21
SELECT auction, bidder, price, channel,
       CASE
         WHEN lower(channel) = 'apple' THEN '0'
         WHEN lower(channel) = 'google' THEN '1'
         WHEN lower(channel) = 'facebook' THEN '2'
         WHEN lower(channel) = 'baidu' THEN '3'
         ELSE regexp_match(url, '(&|^)channel_id=([^&]*)')[2]
       END AS channel_id
FROM bid
WHERE regexp_match(url, '(&|^)channel_id=([^&]*)')[2] IS NOT NULL
   OR lower(channel) IN ('apple', 'google', 'facebook', 'baidu');
