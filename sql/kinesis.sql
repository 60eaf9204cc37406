-- A Kinesis stream into an Iceberg table, stopping at the records present at the start.
-- Needs a Kinesis server with the stream 'clicks' (scripts/test.sh does this):
--   scripts/test-env.sh install && scripts/test-env.sh start    # kinesalite on 127.0.0.1:4567
--   eval "$(scripts/test-env.sh env)" && "$FLOE_TEST_PYTHON" scripts/seed-kinesis.py
-- then, from the repository root:  cargo run -q -- -f sql/kinesis.sql

CREATE CATALOG lake WITH (
  'type' = 'iceberg', 'catalog-type' = 'sql',
  'uri' = 'sqlite:lake/catalog.db', 'warehouse' = 'lake/warehouse');
CREATE SCHEMA IF NOT EXISTS lake.web;
CREATE TABLE IF NOT EXISTS lake.web.stream_clicks (
  user_id BIGINT, url STRING, shard STRING, partition_key STRING, arrived TIMESTAMP);

-- Declared columns; _shard, _sequence, _partition_key and _arrival_time come from Kinesis.
-- 'scan.bounded.mode' = 'latest' ends the job at the records that had arrived when it
-- started (without it, the job follows the stream until it is stopped).
CREATE SOURCE clicks (user_id BIGINT, url STRING,
                      _shard STRING, _sequence STRING, _partition_key STRING, _arrival_time TIMESTAMP)
WITH ('connector' = 'kinesis', 'stream' = 'clicks', 'format' = 'json',
      'aws.region' = 'us-east-1', 'aws.endpoint' = 'http://127.0.0.1:4567',
      'aws.access-key-id' = 'testing', 'aws.secret-access-key' = 'testing',
      'scan.startup.mode' = 'trim-horizon', 'scan.bounded.mode' = 'latest');

-- Preview without starting a job.
SELECT user_id, url, _shard, _partition_key FROM clicks LIMIT 5;

-- Wait for the job (it is bounded).
SET 'table.dml-sync' = 'true';
SET 'pipeline.name' = 'kinesis-clicks';
INSERT INTO lake.web.stream_clicks
SELECT user_id, url, _shard, _partition_key, _arrival_time FROM clicks;

-- The seeded stream was split once: the parent shard was read before its two children.
SELECT shard, count(*) AS records, count(DISTINCT partition_key) AS keys
FROM lake.web.stream_clicks GROUP BY 1 ORDER BY 1;
SELECT url, count(*) AS clicks FROM lake.web.stream_clicks GROUP BY 1 ORDER BY 2 DESC LIMIT 3;

-- Two records were not JSON: they are in the dead-letter table, with their shard.
SELECT source_partition, CAST(payload AS STRING) AS payload, error FROM lake.web.dead_letters;
