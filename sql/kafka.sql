-- A Kafka topic into a partitioned Iceberg table, with the record's key, partition, offset
-- and timestamp. Needs a broker at 127.0.0.1:9092 holding the topic floe-example-orders:
--   scripts/test-env.sh install && scripts/test-env.sh start
--   eval "$(scripts/test-env.sh env)" && "$FLOE_TEST_PYTHON" scripts/kafka-seed.py
-- Then, from the repository root:  cargo run -q -- -f sql/kafka.sql
--
-- A Kafka source never ends by itself. Here 'scan.bounded.mode' = 'latest-offset' makes the
-- job finish once it has caught up with the end of every partition, so the script can wait
-- for it; without it the job runs until STOP JOB, Ctrl-C or SIGTERM.

CREATE CATALOG lake WITH (
  'type' = 'iceberg', 'catalog-type' = 'sql',
  'uri' = 'sqlite:lake/catalog.db', 'warehouse' = 'lake/warehouse');
CREATE SCHEMA IF NOT EXISTS lake.shop;
CREATE TABLE IF NOT EXISTS lake.shop.kafka_orders (
  order_id BIGINT, customer STRING, amount DOUBLE, ordered_at TIMESTAMP,
  kafka_partition INT, kafka_offset BIGINT)
PARTITIONED BY (days(ordered_at));

-- Declared columns; _key, _partition, _offset and _timestamp come from the Kafka record.
CREATE SOURCE orders (order_id BIGINT, amount DOUBLE, status STRING,
                      _key STRING, _partition INT, _offset BIGINT, _timestamp TIMESTAMP)
WITH ('connector' = 'kafka', 'topic' = 'floe-example-orders',
      'properties.bootstrap.servers' = '127.0.0.1:9092',
      'format' = 'json', 'scan.startup.mode' = 'earliest-offset',
      'scan.bounded.mode' = 'latest-offset');

-- Preview without starting a job.
SELECT order_id, _key AS customer, amount, _partition, _offset FROM orders LIMIT 3;

SET 'table.dml-sync' = 'true';
SET 'pipeline.name' = 'kafka-orders';
INSERT INTO lake.shop.kafka_orders
SELECT order_id, _key, amount, _timestamp, _partition, _offset FROM orders WHERE amount > 0;

SELECT CAST(ordered_at AS DATE) AS day, count(*) AS orders, round(sum(amount), 2) AS amount
FROM lake.shop.kafka_orders GROUP BY 1 ORDER BY 1;
SELECT customer, count(*) AS orders FROM lake.shop.kafka_orders GROUP BY 1 ORDER BY 1;
SHOW JOBS;

-- One record of the topic is not JSON: it is in the dead-letter table with its partition
-- and offset, and the job went on.
SELECT source_partition, source_offset, CAST(payload AS STRING) AS payload, error
FROM lake.shop.dead_letters;
