-- floe quickstart: an Iceberg lake on the embedded default (a sqlite catalog and a local
-- warehouse under ./lake), no server needed.
--
--   cargo run -q -- -f sql/quickstart.sql

CREATE CATALOG lake WITH (
  'type' = 'iceberg', 'catalog-type' = 'sql',
  'uri' = 'sqlite:lake/catalog.db', 'warehouse' = 'lake/warehouse');

CREATE SCHEMA IF NOT EXISTS lake.shop;
DROP TABLE IF EXISTS lake.shop.orders;

-- A partitioned table: one folder per day and region.
CREATE TABLE lake.shop.orders (
  order_id BIGINT NOT NULL,
  customer STRING,
  region   STRING,
  amount   DECIMAL(10, 2),
  ts       TIMESTAMP
) PARTITIONED BY (days(ts), region);

-- Each INSERT is one atomic Iceberg commit (one snapshot).
INSERT INTO lake.shop.orders VALUES
  (1, 'ann', 'eu', 19.99, TIMESTAMP '2024-05-01 09:15:00'),
  (2, 'bob', 'us', 5.00,  TIMESTAMP '2024-05-01 17:40:00'),
  (3, 'cid', 'eu', 42.50, TIMESTAMP '2024-05-02 08:05:00');

INSERT INTO lake.shop.orders VALUES
  (4, 'dee', 'ap', 12.00, TIMESTAMP '2024-05-02 23:59:00'),
  (5, 'ann', 'eu', 7.25,  TIMESTAMP '2024-05-03 12:00:00');

-- Ad-hoc SQL over the lake.
SELECT region, count(*) AS orders, sum(amount) AS revenue
FROM lake.shop.orders GROUP BY region ORDER BY revenue DESC;

-- Partition pruning: only the files of 2024-05-02 are read.
SELECT order_id, customer, amount FROM lake.shop.orders
WHERE ts >= TIMESTAMP '2024-05-02 00:00:00' AND ts < TIMESTAMP '2024-05-03 00:00:00'
ORDER BY order_id;

-- The table as Iceberg sees it, and its metadata tables.
DESCRIBE lake.shop.orders;
SELECT snapshot_id, operation, summary['added-records'] AS added FROM lake.shop."orders$snapshots" ORDER BY committed_at;
SELECT partition, record_count, file_count FROM lake.shop."orders$partitions" ORDER BY partition;

-- A continuous job: a generated order stream into its own table, checkpointed every
-- second with exactly-once commits. The source is bounded (number-of-rows), and
-- table.dml-sync makes this INSERT wait until the job has committed its last rows.
CREATE SOURCE order_stream WITH (
  'connector' = 'datagen', 'profile' = 'orders', 'number-of-rows' = '200000',
  'rows-per-second' = '100000', 'seed' = '7');
SELECT * FROM order_stream LIMIT 3;

DROP TABLE IF EXISTS lake.shop.order_lines;
CREATE TABLE lake.shop.order_lines (
  order_id BIGINT NOT NULL, product STRING, total DOUBLE, region STRING, order_time TIMESTAMP)
PARTITIONED BY (region, hours(order_time));

SET 'pipeline.name' = 'quickstart-orders';
SET 'checkpoint.interval' = '1s';
SET 'table.dml-sync' = 'true';
INSERT INTO lake.shop.order_lines
SELECT order_id, upper(product), quantity * price, region, order_time
FROM order_stream WHERE status <> 'new';

SELECT region, count(*) AS orders, round(sum(total), 2) AS revenue
FROM lake.shop.order_lines GROUP BY region ORDER BY region;
SELECT summary['floe.job'] AS job, summary['floe.checkpoint'] AS checkpoint,
       summary['added-records'] AS records
FROM lake.shop."order_lines$snapshots" ORDER BY committed_at;

-- ROUTE BY: web events of several types, each type into its own table, created on first sight.
-- Half-way through, page views gain user_agent and scroll_depth and a new type appears: the
-- tables evolve as the data does, in the same commits as the data. (Run the script again: the
-- job resumes from its checkpoint, finds its bounded source done, and adds nothing.)
CREATE SOURCE events WITH (
  'connector' = 'datagen', 'profile' = 'events', 'number-of-rows' = '100000',
  'events.drift-at' = '50000', 'rows-per-second' = '100000');
SET 'pipeline.name' = 'quickstart-events';
INSERT INTO lake.analytics
SELECT *, CAST(event_time AS DATE) AS event_date FROM events
ROUTE BY event_type || '_events'
WITH ('partition.candidates' = 'event_date, region');

SHOW JOBS;
SHOW TABLES IN lake.analytics;
DESCRIBE lake.analytics.page_view_events;
SELECT event_id > 50000 AS after_drift, count(*) AS events, count(user_agent) AS with_agent
FROM lake.analytics.page_view_events GROUP BY 1 ORDER BY 1;

-- Time travel: pick a snapshot_id from above, then
--   SELECT count(*) FROM lake.shop.orders FOR VERSION AS OF <snapshot_id>;
--   SELECT count(*) FROM lake.shop.orders FOR TIMESTAMP AS OF '2024-06-01 12:00:00';
