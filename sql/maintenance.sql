-- Keeping a table healthy: a streaming job commits small files every checkpoint; the
-- maintenance procedures (Spark's and Trino's names) compact them, merge the manifests
-- and expire old snapshots. Run from the repository root:  cargo run -q -- -f sql/maintenance.sql

CREATE CATALOG lake WITH (
  'type' = 'iceberg', 'catalog-type' = 'sql',
  'uri' = 'sqlite:lake/catalog.db', 'warehouse' = 'lake/warehouse');
CREATE SCHEMA IF NOT EXISTS lake.shop;
DROP TABLE IF EXISTS lake.shop.orders;
CREATE TABLE lake.shop.orders (order_id BIGINT NOT NULL, price DOUBLE, region STRING)
PARTITIONED BY (region);

-- 2,000 orders, a checkpoint every 100 ms: many snapshots of a few small files each.
CREATE SOURCE order_stream WITH ('connector' = 'datagen', 'profile' = 'orders',
  'number-of-rows' = '2000', 'rows-per-second' = '1000');
SET 'pipeline.name' = 'orders-small-files';
SET 'checkpoint.interval' = '100ms';
SET 'table.dml-sync' = 'true';
INSERT INTO lake.shop.orders SELECT order_id, price, region FROM order_stream;

SELECT count(*) AS files, sum(record_count) AS rows FROM lake.shop."orders$files";

-- Bin-pack each partition's small files into files near the target size (here the
-- table's write.target-file-size-bytes); `where` limits it to the files a filter may match.
CALL lake.system.rewrite_data_files(table => 'shop.orders', where => 'region = ''eu''');
CALL lake.system.rewrite_data_files(table => 'shop.orders', min_input_files => 2);
SELECT region, count(*) AS files FROM (
  SELECT partition AS region FROM lake.shop."orders$files") GROUP BY region ORDER BY region;

-- One manifest per commit, merged into few.
CALL lake.system.rewrite_manifests(table => 'shop.orders');

-- Drop the snapshots older than now but the newest two, then the files only they used.
-- The job's exactly-once mark survives: running the INSERT again adds nothing.
CALL lake.system.expire_snapshots(table => 'shop.orders', older_than => now(), retain_last => 2);
SELECT operation FROM lake.shop."orders$snapshots" ORDER BY committed_at;

-- Files under the table that nothing references (none here), listed but not deleted.
CALL lake.system.remove_orphan_files(table => 'shop.orders', older_than => now(), dry_run => true);
INSERT INTO lake.shop.orders SELECT order_id, price, region FROM order_stream;
SELECT count(*) AS orders, count(DISTINCT order_id) AS distinct_orders FROM lake.shop.orders;
