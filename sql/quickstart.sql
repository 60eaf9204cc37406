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

-- Time travel: pick a snapshot_id from above, then
--   SELECT count(*) FROM lake.shop.orders FOR VERSION AS OF <snapshot_id>;
--   SELECT count(*) FROM lake.shop.orders FOR TIMESTAMP AS OF '2024-06-01 12:00:00';
