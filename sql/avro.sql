-- Avro from Kafka in the Confluent wire format, with the writer schemas from a schema
-- registry, into Iceberg with exact types; a new schema version evolves the table with no
-- restart. Needs a broker at 127.0.0.1:9092 and a registry at 127.0.0.1:8081 (the test
-- environment's fixture, scripts/schema-registry.py) holding the topic's schemas:
--   scripts/test-env.sh install && scripts/test-env.sh start
--   eval "$(scripts/test-env.sh env)" && "$FLOE_TEST_PYTHON" scripts/avro-seed.py
-- Then, from the repository root:  cargo run -q -- -f sql/avro.sql

CREATE CATALOG lake WITH (
  'type' = 'iceberg', 'catalog-type' = 'sql',
  'uri' = 'sqlite:lake/catalog.db', 'warehouse' = 'lake/warehouse');

-- No columns to declare: they come from each record's writer schema. _key, _partition and
-- _offset are the Kafka record's.
CREATE SOURCE orders (_key STRING, _offset BIGINT)
WITH ('connector' = 'kafka', 'topic' = 'floe-example-avro',
      'properties.bootstrap.servers' = '127.0.0.1:9092',
      'format' = 'avro-confluent', 'avro-confluent.url' = 'http://127.0.0.1:8081',
      'scan.startup.mode' = 'earliest-offset', 'scan.bounded.mode' = 'latest-offset');

-- Preview: the records of both schema versions in one table.
SELECT order_id, customer, quantity, status, total, ordered_at, coupon
FROM orders ORDER BY order_id LIMIT 3;

-- Half the records were written with version 1 of the schema, half with version 2, which adds
-- `coupon` and promotes `quantity` from int to long: one job, one table, evolved on the way.
SET 'table.dml-sync' = 'true';
SET 'pipeline.name' = 'avro-orders';
INSERT INTO lake.shop SELECT * FROM orders ROUTE BY 'avro_orders'
WITH ('partition.candidates' = 'days(ordered_at)');

DESCRIBE lake.shop.avro_orders;
SELECT status, count(*) AS orders, sum(total) AS total, max(quantity) AS max_quantity,
       count(coupon) AS with_coupon
FROM lake.shop.avro_orders GROUP BY status ORDER BY status;
-- The record whose schema the registry does not know is a dead letter, with the reason.
SELECT source_partition, source_offset, error FROM lake.shop.dead_letters;
