-- Nexmark q3: local item suggestion, a join of two streams (every row kept: a regular join).
CREATE TABLE IF NOT EXISTS lake.nexmark.q3 (name STRING, city STRING, state STRING, id BIGINT);
INSERT INTO lake.nexmark.q3
SELECT p.name, p.city, p.state, a.id
FROM auction a JOIN person p ON a.seller = p.id
WHERE a.category = 10 AND p.state IN ('OR', 'ID', 'CA');
