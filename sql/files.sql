-- A continuous job over files: JSON lines under sql/data, into a partitioned Iceberg table.
-- Run from the repository root:  cargo run -q -- -f sql/files.sql

CREATE CATALOG lake WITH (
  'type' = 'iceberg', 'catalog-type' = 'sql',
  'uri' = 'sqlite:lake/catalog.db', 'warehouse' = 'lake/warehouse');
CREATE SCHEMA IF NOT EXISTS lake.web;
CREATE TABLE IF NOT EXISTS lake.web.clicks (
  user_id BIGINT, url STRING, ts TIMESTAMP, ms BIGINT, file STRING, line BIGINT)
PARTITIONED BY (days(ts));

-- Declared columns; _file and _line are filled in by the connector.
CREATE SOURCE clicks (user_id BIGINT, url STRING, ts TIMESTAMP, ms BIGINT, _file STRING, _line BIGINT)
WITH ('connector' = 'filesystem', 'path' = 'sql/data', 'format' = 'json');

-- Preview without starting a job.
SELECT user_id, url, ts FROM clicks LIMIT 3;

-- Wait for the job: the file source is bounded (no 'source.monitor-interval').
SET 'table.dml-sync' = 'true';
SET 'pipeline.name' = 'clicks-to-lake';
INSERT INTO lake.web.clicks
SELECT user_id, url, ts, ms, regexp_replace(_file, '^.*/', ''), _line FROM clicks WHERE url <> '/home';

SELECT CAST(ts AS DATE) AS day, count(*) AS clicks, avg(ms) AS avg_ms
FROM lake.web.clicks GROUP BY 1 ORDER BY 1;
SHOW JOBS;

-- Two lines of the sample data are not valid records: they are in the dead-letter table of the
-- namespace, with where they came from and why, and the job went on.
SELECT source_partition, source_offset, CAST(payload AS STRING) AS payload, error
FROM lake.web.dead_letters ORDER BY source_offset;
