-- ROUTE BY: one continuous INSERT writes every record to its own table, created on first sight
-- and evolved as the records change. Run from the repository root:
--   cargo run -q -- -f sql/routing.sql

CREATE CATALOG lake WITH (
  'type' = 'iceberg', 'catalog-type' = 'sql',
  'uri' = 'sqlite:lake/catalog.db', 'warehouse' = 'lake/warehouse');
SET 'table.dml-sync' = 'true';
SET 'checkpoint.interval' = '1s';

-- 1. Generated web events. Half-way through, page views gain user_agent and scroll_depth and a
--    new event type appears: new optional columns, a new table, and (user_agent being a
--    partition candidate) a new partition spec, each committed with the data that needs it.
CREATE SOURCE generated WITH (
  'connector' = 'datagen', 'profile' = 'events', 'number-of-rows' = '20000',
  'events.drift-at' = '10000', 'rows-per-second' = '50000', 'seed' = '42');
SET 'pipeline.name' = 'routing-generated';
INSERT INTO lake.generated
SELECT *, CAST(event_time AS DATE) AS event_date FROM generated
ROUTE BY event_type || '_events'
WITH ('partition.candidates' = 'event_date, truncate(4, user_agent)');

SHOW TABLES IN lake.generated;
SELECT event_id > 10000 AS after_drift, count(*) AS events, count(user_agent) AS with_agent
FROM lake.generated.page_view_events GROUP BY 1 ORDER BY 1;
SELECT spec_id, count(*) AS files FROM lake.generated."page_view_events$files" GROUP BY 1 ORDER BY 1;

-- 2. JSON events with no declared columns (sql/events): each record's schema is inferred.
--    Integers are ints until a larger value arrives ('json.infer.integers' = 'int'); a field
--    that is null or an empty list makes no column; nested fields evolve too.
CREATE SOURCE web WITH ('connector' = 'filesystem', 'path' = 'sql/events', 'format' = 'json');
DESCRIBE SOURCE web;
-- A preview shows every shape in one table (fields a record lacks read NULL).
SELECT event_type, event_id, url, amount, "userAgent" FROM web ORDER BY event_id LIMIT 5;

SET 'pipeline.name' = 'routing-json';
INSERT INTO lake.web
SELECT *, CAST(ts AS TIMESTAMP) AS event_time FROM web
ROUTE BY event_type
WITH ('partition.candidates' = 'days(event_time), region', 'json.infer.integers' = 'int');

SHOW TABLES IN lake.web;
DESCRIBE lake.web.page_view;
SELECT event_id, url, "userAgent", "scrollDepth", "user"['plan'] AS plan
FROM lake.web.page_view ORDER BY event_id;
SELECT event_id, amount, region FROM lake.web."order" ORDER BY event_id;
-- The records that could not be written, and why; the job went on.
SELECT CAST(payload AS STRING) AS payload, error FROM lake.web.dead_letters ORDER BY error;
