-- Changing rows of a lake table: DELETE, UPDATE and MERGE INTO write position deletes that
-- every Iceberg reader applies. Run from the repository root:  cargo run -q -- -f sql/changes.sql

CREATE CATALOG lake WITH (
  'type' = 'iceberg', 'catalog-type' = 'sql',
  'uri' = 'sqlite:lake/catalog.db', 'warehouse' = 'lake/warehouse');
CREATE SCHEMA IF NOT EXISTS lake.shop;
DROP TABLE IF EXISTS lake.shop.customers;
DROP TABLE IF EXISTS lake.shop.customer_changes;
CREATE TABLE lake.shop.customers (id BIGINT, name STRING, email STRING, tier STRING,
  PRIMARY KEY (id) NOT ENFORCED)
PARTITIONED BY (bucket(4, id));
DESCRIBE lake.shop.customers;

-- 1,000 customers in one INSERT.
CREATE TABLE lake.shop.customer_changes (id BIGINT, name STRING, email STRING, op STRING);
INSERT INTO lake.shop.customers
SELECT id, 'customer ' || CAST(id AS VARCHAR), 'c' || CAST(id AS VARCHAR) || '@example.com',
       CASE WHEN id % 10 = 0 THEN 'gold' ELSE 'basic' END
FROM (SELECT unnest(range(1, 1001)) AS id);

-- Fix data by hand.
DELETE FROM lake.shop.customers WHERE id > 990;
UPDATE lake.shop.customers SET email = upper(email) WHERE tier = 'gold';

-- Apply a batch of changes by key.
INSERT INTO lake.shop.customer_changes VALUES
  (1, 'Ann', 'ann@example.com', 'u'), (2, NULL, NULL, 'd'), (2000, 'Zed', 'zed@example.com', 'i');
MERGE INTO lake.shop.customers c USING lake.shop.customer_changes s ON c.id = s.id
  WHEN MATCHED AND s.op = 'd' THEN DELETE
  WHEN MATCHED THEN UPDATE SET name = s.name, email = s.email
  WHEN NOT MATCHED THEN INSERT (id, name, email, tier) VALUES (s.id, s.name, s.email, 'basic');

SELECT count(*) AS customers, count(*) FILTER (WHERE tier = 'gold') AS gold FROM lake.shop.customers;
SELECT * FROM lake.shop.customers WHERE id IN (1, 2, 10, 2000) ORDER BY id;
-- Position delete files beside the data files; each snapshot says what changed it.
SELECT content_type, count(*) AS files, sum(record_count) AS rows
FROM lake.shop."customers$files" GROUP BY content_type ORDER BY content_type;
SELECT operation, summary['floe.operation'] AS statement, summary['added-position-deletes'] AS deletes
FROM lake.shop."customers$snapshots" ORDER BY committed_at;

-- Compaction folds the deletes back into data files.
CALL lake.system.rewrite_data_files(table => 'shop.customers');
SELECT content_type, count(*) AS files FROM lake.shop."customers$files" GROUP BY content_type;

-- A Debezium change stream (here from a file; from Kafka the same with 'connector' = 'kafka'):
-- creates, updates and deletes applied by key to a table with a primary key, exactly once.
DROP TABLE IF EXISTS lake.shop.customers_mirror;
CREATE TABLE lake.shop.customers_mirror (id BIGINT, name STRING, email STRING,
  PRIMARY KEY (id) NOT ENFORCED);
CREATE SOURCE customer_changes (id BIGINT, name STRING, email STRING)
WITH ('connector' = 'filesystem', 'path' = 'sql/cdc', 'format' = 'debezium-json');
SET 'pipeline.name' = 'customers-cdc';
SET 'table.dml-sync' = 'true';
INSERT INTO lake.shop.customers_mirror SELECT * FROM customer_changes;
-- Ann's new email, no Bob (deleted), Cy renamed, Dee created.
SELECT * FROM lake.shop.customers_mirror ORDER BY id;
