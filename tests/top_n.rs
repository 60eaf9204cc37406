//! Top-N and deduplication (ROW_NUMBER() ... WHERE rn <= N) run three ways (straight through,
//! with frequent checkpoints, killed with SIGKILL at random moments and restarted): without
//! windows each partition's rows are updated by key at every checkpoint, within windows each
//! window's top rows are appended once. All three leave the same rows, which are what the same
//! query in batch gives.

mod common;

use common::process::{
    assert_same_spilled, assert_same_with_checkpoints_and_kills, query_csv, run_script_to_end,
    state_files,
};
use std::path::Path;

const ROWS: u64 = 200_000;

const CATALOG: &str = "CREATE CATALOG lake WITH ('type' = 'iceberg', 'catalog-type' = 'sql', \
                       'uri' = 'sqlite:lake/catalog.db', 'warehouse' = 'lake/warehouse')";

/// One order every 100 ms of event time, up to 10 s out of order; the watermark trails the
/// latest order time by 2 s, so some records come after their window closed.
fn source() -> String {
    format!(
        "CREATE SOURCE gen (WATERMARK FOR order_time AS order_time - INTERVAL '2' SECOND)
           WITH ('connector' = 'datagen', 'profile' = 'orders', 'number-of-rows' = '{ROWS}',
           'rows-per-second' = '60000', 'seed' = '7', 'time.disorder' = '10s')"
    )
}

/// The three most expensive orders of each region and product (ties broken by order id).
const TOP: &str = "SELECT region, product, rn, order_id, price FROM (
       SELECT *, ROW_NUMBER() OVER (PARTITION BY region, product
                                    ORDER BY price DESC, order_id) AS rn
       FROM gen WHERE status <> 'new') WHERE rn <= 3";

/// Each customer's first order (deduplication: the first row by event time).
const FIRST: &str = "SELECT customer_id, order_id, order_time, price FROM (
       SELECT customer_id, order_id, order_time, price, ROW_NUMBER() OVER
         (PARTITION BY customer_id ORDER BY order_time, order_id) AS n FROM gen) WHERE n = 1";

/// The two most expensive orders of each region, in each minute of event time.
const WINDOW_TOP: &str = "SELECT window_start, window_end, region, order_id, price, rn FROM (
       SELECT window_start, window_end, region, order_id, price, ROW_NUMBER() OVER
         (PARTITION BY window_start, window_end, region ORDER BY price DESC, order_id) AS rn
       FROM TUMBLE(gen, order_time, INTERVAL '1' MINUTE)) WHERE rn < 3";

fn script(interval: &str) -> String {
    format!(
        "{CATALOG};
         CREATE SCHEMA IF NOT EXISTS lake.shop;
         CREATE TABLE IF NOT EXISTS lake.shop.top3 (region STRING, product STRING, rn BIGINT,
           order_id BIGINT, price DOUBLE, PRIMARY KEY (region, product, rn) NOT ENFORCED);
         CREATE TABLE IF NOT EXISTS lake.shop.first_orders (customer_id BIGINT,
           order_id BIGINT, order_time TIMESTAMP, price DOUBLE,
           PRIMARY KEY (customer_id) NOT ENFORCED);
         CREATE TABLE IF NOT EXISTS lake.shop.minute_top (window_start TIMESTAMP,
           window_end TIMESTAMP, region STRING, order_id BIGINT, price DOUBLE, rn BIGINT);
         {};
         SET 'checkpoint.interval' = '{interval}';
         SET 'pipeline.name' = 'top3';
         INSERT INTO lake.shop.top3 {TOP};
         SET 'pipeline.name' = 'first-orders';
         INSERT INTO lake.shop.first_orders {FIRST};
         SET 'pipeline.name' = 'minute-top';
         INSERT INTO lake.shop.minute_top {WINDOW_TOP};",
        source()
    )
}

/// Everything the jobs left, and the late records of the windowed one.
fn tables(dir: &Path) -> String {
    let q = |sql: &str| query_csv(dir, CATALOG, sql);
    let top = q("SELECT * FROM lake.shop.top3 ORDER BY region, product, rn");
    let first = q("SELECT * FROM lake.shop.first_orders ORDER BY customer_id");
    let windows = q("SELECT * FROM lake.shop.minute_top ORDER BY window_start, region, rn");
    let late = q("SELECT job, count(*) AS late, min(error) AS error
                  FROM lake.shop.dead_letters GROUP BY job ORDER BY job");
    format!("{top}\n{first}\n{windows}\n{late}")
}

#[test]
fn top_n_killed_and_restarted_leaves_the_same_rows_as_a_batch_query() {
    let straight = tempfile::tempdir().unwrap();
    run_script_to_end(straight.path(), &script("1h"));
    let expected = tables(straight.path());
    let dir = straight.path();

    // Without windows: what the query gives in batch over the same records.
    let batch = |sql: &str, order: &str| {
        query_csv(
            dir,
            &format!("{CATALOG}; {}", source()),
            &format!("SELECT * FROM ({sql}) ORDER BY {order}"),
        )
    };
    let top = query_csv(
        dir,
        CATALOG,
        "SELECT * FROM lake.shop.top3 ORDER BY region, product, rn",
    );
    assert_eq!(
        top.lines().count(),
        1 + 4 * 8 * 3,
        "3 rows x 4 regions x 8 products"
    );
    assert_eq!(top, batch(TOP, "region, product, rn"), "top 3 as in batch");
    let first = query_csv(
        dir,
        CATALOG,
        "SELECT * FROM lake.shop.first_orders ORDER BY customer_id",
    );
    assert!(first.lines().count() > 9_000, "a row per customer");
    assert_eq!(
        first,
        batch(FIRST, "customer_id"),
        "first orders as in batch"
    );

    // Within windows: each window once, its on-time records' top 2; the others are late.
    let windows = query_csv(
        dir,
        CATALOG,
        "SELECT count(*), count(DISTINCT CAST(window_start AS STRING) || region || rn)
         FROM lake.shop.minute_top",
    );
    let minutes = ROWS / 600;
    let counts: Vec<u64> = windows
        .lines()
        .nth(1)
        .unwrap()
        .split(',')
        .map(|v| v.parse().unwrap())
        .collect();
    assert!(
        counts[0] >= minutes * 4 * 2,
        "2 rows per minute and region: {windows}"
    );
    assert_eq!(counts[0], counts[1], "each window's rows once: {windows}");
    assert!(
        expected.contains("minute-top,") && expected.contains("late: its window ended at"),
        "late records dead-lettered: {expected}"
    );
    let on_time =
        "SELECT * FROM (SELECT window_start, window_end, region, order_id, price, ROW_NUMBER()
           OVER (PARTITION BY window_start, window_end, region ORDER BY price DESC, order_id)
           AS rn FROM TUMBLE((SELECT * FROM gen WHERE order_id NOT IN (SELECT
             CAST(split_part(split_part(CAST(payload AS STRING), '\"order_id\":', 2), ',', 1)
             AS BIGINT) FROM lake.shop.dead_letters
             WHERE job = 'minute-top')), order_time, INTERVAL '1' MINUTE)) WHERE rn < 3
         ORDER BY window_start, region, rn";
    let windows = query_csv(
        dir,
        CATALOG,
        "SELECT * FROM lake.shop.minute_top ORDER BY window_start, region, rn",
    );
    assert_eq!(
        windows,
        query_csv(dir, &format!("{CATALOG}; {}", source()), on_time),
        "each window's rows are the top 2 of its on-time records"
    );

    assert_same_with_checkpoints_and_kills(script, 600, tables, &expected);

    // Each partition's top rows beyond a small budget go to disk (windows' and groups'
    // alike): the same rows, straight and killed and restarted.
    let (spilled, _) = assert_same_spilled(script, "8kb", 600, tables, &expected);
    let spilled_parts = state_files(spilled.path(), "first-orders", "group-spill-");
    assert_eq!(
        spilled_parts, 16,
        "the deduplication's state is on disk, in its parts"
    );
}
