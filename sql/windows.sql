-- Windowed aggregates over event time: orders per region and minute, each minute written once
-- its window has closed, late orders kept as dead letters; a top-N per window, a
-- deduplication, and session windows.
-- Run from the repository root:  cargo run -q -- -f sql/windows.sql

CREATE CATALOG lake WITH (
  'type' = 'iceberg', 'catalog-type' = 'sql',
  'uri' = 'sqlite:lake/catalog.db', 'warehouse' = 'lake/warehouse');
CREATE SCHEMA IF NOT EXISTS lake.shop;
CREATE TABLE IF NOT EXISTS lake.shop.sales_per_minute (
  window_start TIMESTAMP, window_end TIMESTAMP, region STRING,
  orders BIGINT, customers BIGINT, revenue DOUBLE, p90_price DOUBLE)
PARTITIONED BY (days(window_start));

-- 20,000 orders, one every 100 ms of event time, coming up to 10 s out of order. The
-- watermark allows 3 s of disorder: orders later than that miss their window.
CREATE SOURCE orders (WATERMARK FOR order_time AS order_time - INTERVAL '3' SECOND)
WITH ('connector' = 'datagen', 'profile' = 'orders', 'number-of-rows' = '20000',
      'seed' = '7', 'time.disorder' = '10s');

-- Ad hoc, a window function is a table like any other.
SELECT window_start, count(*) AS orders
FROM TUMBLE(orders, order_time, INTERVAL '10' MINUTE) GROUP BY window_start ORDER BY 1;

SET 'table.dml-sync' = 'true';
SET 'pipeline.name' = 'sales-per-minute';
EXPLAIN INSERT INTO lake.shop.sales_per_minute
SELECT window_start, window_end, region, count(*), count(DISTINCT customer_id),
       round(sum(quantity * price), 2), approx_percentile_cont(0.9) WITHIN GROUP (ORDER BY price)
FROM TUMBLE(orders, order_time, INTERVAL '1' MINUTE)
GROUP BY window_start, window_end, region;

INSERT INTO lake.shop.sales_per_minute
SELECT window_start, window_end, region, count(*), count(DISTINCT customer_id),
       round(sum(quantity * price), 2), approx_percentile_cont(0.9) WITHIN GROUP (ORDER BY price)
FROM TUMBLE(orders, order_time, INTERVAL '1' MINUTE)
GROUP BY window_start, window_end, region;

SELECT * FROM lake.shop.sales_per_minute ORDER BY window_start, region LIMIT 8;

-- Orders that came after their minute was written: dead letters, with the reason.
SELECT count(*) AS late, min(error) AS example FROM lake.shop.dead_letters
WHERE job = 'sales-per-minute';

-- Five-minute windows every minute, from the same orders.
CREATE TABLE IF NOT EXISTS lake.shop.busy_five_minutes (
  window_start TIMESTAMP, window_end TIMESTAMP, orders BIGINT);
SET 'pipeline.name' = 'busy-five-minutes';
SET 'window.allowed-lateness' = '10s';
INSERT INTO lake.shop.busy_five_minutes
SELECT window_start, window_end, count(*) FROM HOP(orders, order_time, INTERVAL '1' MINUTE, INTERVAL '5' MINUTE)
GROUP BY window_start, window_end HAVING count(*) > 2900;
SELECT * FROM lake.shop.busy_five_minutes ORDER BY window_start;

-- The three most expensive orders of each minute and region (a window top-N), and each
-- customer's latest order, kept current in a table keyed by customer (deduplication).
CREATE TABLE IF NOT EXISTS lake.shop.top_orders (
  window_start TIMESTAMP, region STRING, rank BIGINT, order_id BIGINT, price DOUBLE);
SET 'pipeline.name' = 'top-orders';
INSERT INTO lake.shop.top_orders
SELECT window_start, region, rn, order_id, price FROM (
  SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end, region
                               ORDER BY price DESC) AS rn
  FROM TUMBLE(orders, order_time, INTERVAL '1' MINUTE)) WHERE rn <= 3;
SELECT * FROM lake.shop.top_orders ORDER BY window_start, region, rank LIMIT 6;

CREATE TABLE IF NOT EXISTS lake.shop.latest_order (
  customer_id BIGINT, order_id BIGINT, order_time TIMESTAMP, PRIMARY KEY (customer_id) NOT ENFORCED);
SET 'pipeline.name' = 'latest-order';
INSERT INTO lake.shop.latest_order
SELECT customer_id, order_id, order_time FROM (
  SELECT customer_id, order_id, order_time,
         ROW_NUMBER() OVER (PARTITION BY customer_id ORDER BY order_time DESC) AS rn
  FROM orders) WHERE rn = 1;
SELECT count(*) AS customers, max(order_time) AS latest FROM lake.shop.latest_order;

-- Each region's busy spells: its orders until 2 seconds pass without one (a session window;
-- the region, the other group column, is whose sessions they are). A session may close at any
-- moment, so it takes the orders within the watermark plus the allowed lateness.
CREATE TABLE IF NOT EXISTS lake.shop.busy_spells (
  region STRING, window_start TIMESTAMP, window_end TIMESTAMP, orders BIGINT);
SET 'pipeline.name' = 'busy-spells';
INSERT INTO lake.shop.busy_spells
SELECT region, window_start, window_end, count(*)
FROM SESSION(orders, order_time, INTERVAL '2' SECOND)
GROUP BY region, window_start, window_end;
SELECT region, count(*) AS spells, max(orders) AS longest FROM lake.shop.busy_spells
GROUP BY region ORDER BY region;
SHOW JOBS;
