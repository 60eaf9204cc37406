-- The ad-hoc queries of `cargo bench --bench query`, over `orders` (a view of the lake table
-- floe wrote: 20 M generated orders over 23 days, partitioned by day and region). Each query
-- is run by floe and by DuckDB's iceberg_scan and must give the same rows. Its name is the
-- comment that starts it; statements end with ';' at the end of a line.

-- q1 totals: a whole scan of three columns
SELECT count(*) AS orders, sum(quantity) AS items, avg(price) AS average_price
FROM orders;

-- q2 revenue by region: a group-by over the whole table
SELECT region, count(*) AS orders, sum(price * quantity) AS revenue
FROM orders GROUP BY region ORDER BY region;

-- q3 one region's products by status: partition pruning on region
SELECT product, status, count(*) AS orders, max(price) AS top
FROM orders WHERE region = 'eu' GROUP BY product, status ORDER BY product, status;

-- q4 three days by day: partition pruning on the day, then min/max on the time
SELECT CAST(order_time AS DATE) AS day, count(*) AS orders, sum(quantity) AS items
FROM orders
WHERE order_time >= TIMESTAMP '2024-01-10 00:00:00' AND order_time < TIMESTAMP '2024-01-13 06:00:00'
GROUP BY CAST(order_time AS DATE) ORDER BY day;

-- q5 a range of order ids: min/max pruning on a column that is not a partition
SELECT count(*) AS orders, sum(quantity) AS items, min(customer_id) AS first_customer
FROM orders WHERE order_id BETWEEN 7000000 AND 7050000;

-- q6 distinct customers per region
SELECT region, count(DISTINCT customer_id) AS customers
FROM orders GROUP BY region ORDER BY region;

-- q7 top 10 orders by value: a top-N over the whole table
SELECT order_id, customer_id, price * quantity AS total
FROM orders ORDER BY total DESC, order_id LIMIT 10;

-- q8 top 10 customers by spend: a group-by on 10,000 keys, then a top-N
SELECT customer_id, count(*) AS orders, sum(price * quantity) AS spend
FROM orders GROUP BY customer_id ORDER BY spend DESC, customer_id LIMIT 10;

-- q9 orders by product category: a join with a small dimension
SELECT c.category, o.status, count(*) AS orders, sum(o.quantity) AS items
FROM orders o
JOIN (VALUES ('keyboard', 'input'), ('mouse', 'input'), ('monitor', 'display'),
             ('laptop', 'computer'), ('headset', 'audio'), ('webcam', 'video'),
             ('dock', 'accessory'), ('cable', 'accessory')) AS c(product, category)
  ON o.product = c.product
WHERE o.status <> 'new'
GROUP BY c.category, o.status ORDER BY c.category, o.status;

-- q10 customers' first orders: the table joined with an aggregate of itself
SELECT o.region, count(*) AS first_orders, sum(o.quantity) AS items
FROM orders o
JOIN (SELECT customer_id, min(order_id) AS first_id FROM orders GROUP BY customer_id) f
  ON o.order_id = f.first_id
GROUP BY o.region ORDER BY o.region;
