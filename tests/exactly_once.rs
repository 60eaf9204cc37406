//! Golden pipeline test: the same continuous job run three ways must leave the same rows.
//!
//! 1. straight through, one checkpoint at the end;
//! 2. with a checkpoint every 50 ms;
//! 3. killed with SIGKILL at random moments several times, restarted each time from its
//!    last checkpoint.
//!
//! This is how exactly-once is proven: the killed run neither loses nor duplicates a row.

mod common;

use common::process::{
    assert_same_with_checkpoints_and_kills, crash_then_finish, kill_and_restart, run_script_to_end,
};
use std::path::Path;

const ROWS: u64 = 240_000;

const CATALOG: &str = "CREATE CATALOG lake WITH ('type' = 'iceberg', 'catalog-type' = 'sql', \
                       'uri' = 'sqlite:lake/catalog.db', 'warehouse' = 'lake/warehouse')";

fn script(interval: &str) -> String {
    format!(
        "{CATALOG};
         CREATE SCHEMA IF NOT EXISTS lake.shop;
         CREATE TABLE IF NOT EXISTS lake.shop.orders (order_id BIGINT, product STRING, amount DOUBLE,
           region STRING, order_time TIMESTAMP) PARTITIONED BY (region, days(order_time));
         CREATE SOURCE gen WITH ('connector' = 'datagen', 'profile' = 'orders',
           'number-of-rows' = '{ROWS}', 'rows-per-second' = '60000', 'seed' = '42');
         SET 'pipeline.name' = 'golden';
         SET 'checkpoint.interval' = '{interval}';
         INSERT INTO lake.shop.orders
           SELECT order_id, upper(product), quantity * price, region, order_time
           FROM gen WHERE status <> 'new';"
    )
}

/// A routed job over drifting events: schemas and partition specs evolve within checkpoints.
fn routed_script(interval: &str) -> String {
    format!(
        "{CATALOG};
         CREATE SOURCE events WITH ('connector' = 'datagen', 'profile' = 'events',
           'number-of-rows' = '{ROWS}', 'events.drift-at' = '{}', 'rows-per-second' = '60000',
           'seed' = '9');
         SET 'pipeline.name' = 'golden-routed';
         SET 'checkpoint.interval' = '{interval}';
         INSERT INTO lake.analytics SELECT *, CAST(event_time AS DATE) AS event_date FROM events
         ROUTE BY event_type WITH ('partition.candidates' = 'region, truncate(4, user_agent)');",
        ROWS / 2
    )
}

/// Rows the upsert job reads, and the keys it keeps (`order_id % KEYS`).
const UPSERT_ROWS: u64 = 120_000;
const KEYS: u64 = 5_000;

/// A job keeping the latest order of each key in a table with a primary key.
fn upsert_script(interval: &str) -> String {
    format!(
        "{CATALOG};
         CREATE SCHEMA IF NOT EXISTS lake.shop;
         CREATE TABLE IF NOT EXISTS lake.shop.latest (k BIGINT, order_id BIGINT, amount DOUBLE,
           region STRING, PRIMARY KEY (k) NOT ENFORCED) PARTITIONED BY (bucket(8, k));
         CREATE SOURCE gen WITH ('connector' = 'datagen', 'profile' = 'orders',
           'number-of-rows' = '{UPSERT_ROWS}', 'rows-per-second' = '40000', 'seed' = '7');
         SET 'pipeline.name' = 'golden-upsert';
         SET 'checkpoint.interval' = '{interval}';
         INSERT INTO lake.shop.latest
           SELECT order_id % {KEYS}, order_id, quantity * price, region FROM gen;"
    )
}

/// The keyed table's contents, summarised; checked against what it must hold whatever
/// the run: one row per key, each the key's last order.
fn upsert_summary(dir: &Path) -> String {
    let out = query_csv(
        dir,
        "SELECT count(*) AS n, count(DISTINCT k) AS keys, min(order_id) AS first, \
         sum(order_id) AS id_sum, round(sum(amount), 2) AS amount, \
         count(*) FILTER (WHERE k <> order_id % 5000) AS wrong FROM lake.shop.latest",
    );
    let last: u64 = (UPSERT_ROWS - KEYS + 1..=UPSERT_ROWS).sum();
    let row = out.lines().nth(1).unwrap_or_default().to_string();
    let fields: Vec<&str> = row.split(',').collect();
    assert_eq!(fields[0], KEYS.to_string(), "one row per key: {out}");
    assert_eq!(fields[1], KEYS.to_string(), "{out}");
    assert_eq!(
        fields[2],
        (UPSERT_ROWS - KEYS + 1).to_string(),
        "each key's last order: {out}"
    );
    assert_eq!(fields[3], last.to_string(), "each key's last order: {out}");
    assert_eq!(fields[5], "0", "{out}");
    out
}

#[test]
fn an_upsert_job_killed_and_restarted_keeps_the_last_row_of_each_key() {
    let straight = tempfile::tempdir().unwrap();
    run_script_to_end(straight.path(), &upsert_script("1h"));
    let expected = upsert_summary(straight.path());

    assert_same_with_checkpoints_and_kills(upsert_script, 550, upsert_summary, &expected);
}

/// The CSV output of `sql` against the lake in `dir`.
fn query_csv(dir: &Path, sql: &str) -> String {
    common::process::query_csv(dir, CATALOG, sql)
}

/// The routed tables' contents, summarised.
fn routed_summary(dir: &Path) -> String {
    query_csv(
        dir,
        "SELECT 'order' AS t, count(*) AS n, count(DISTINCT event_id) AS ids, \
           sum(event_id) AS s, count(amount) AS extra FROM lake.analytics.\"order\"
         UNION ALL SELECT 'page_view', count(*), count(DISTINCT event_id), sum(event_id),
           count(user_agent) FROM lake.analytics.page_view
         UNION ALL SELECT 'interaction', count(*), count(DISTINCT event_id), sum(event_id),
           count(element) FROM lake.analytics.interaction ORDER BY t",
    )
}

/// The routed tables of a run straight through, with one checkpoint at the end.
fn straight_routed_summary() -> String {
    let straight = tempfile::tempdir().unwrap();
    run_script_to_end(straight.path(), &routed_script("1h"));
    let expected = routed_summary(straight.path());
    assert_eq!(expected.lines().count(), 4, "{expected}");
    expected
}

/// The table's contents, summarised so that any lost or duplicated row shows.
fn summary(dir: &Path) -> String {
    query_csv(
        dir,
        "SELECT count(*) AS n, count(DISTINCT order_id) AS ids, sum(order_id) AS id_sum, \
         round(sum(amount), 2) AS amount, count(DISTINCT product || region) AS combos \
         FROM lake.shop.orders",
    )
}

fn run_to_end(dir: &Path, interval: &str) {
    run_script_to_end(dir, &script(interval));
}

#[test]
fn a_job_killed_and_restarted_gives_the_same_rows() {
    let straight = tempfile::tempdir().unwrap();
    run_to_end(straight.path(), "1h");
    let expected = summary(straight.path());
    assert!(expected.contains('\n'), "{expected}");

    let frequent = tempfile::tempdir().unwrap();
    run_to_end(frequent.path(), "50ms");
    assert_eq!(summary(frequent.path()), expected, "frequent checkpoints");

    let killed = tempfile::tempdir().unwrap();
    kill_and_restart(killed.path(), &script("100ms"), 550);
    assert_eq!(summary(killed.path()), expected, "killed and restarted");
}

#[test]
fn a_routed_evolving_job_killed_and_restarted_gives_the_same_tables() {
    let expected = straight_routed_summary();

    assert_same_with_checkpoints_and_kills(routed_script, 550, routed_summary, &expected);
}

/// A crash at each step of a checkpoint (`FLOE_FAILPOINT`, see `src/failpoint.rs`): after the
/// record is written, between two table commits, after the commits before the next record,
/// and halfway through writing a metadata file. Restarted, the job leaves the same tables as
/// a run that never crashed.
#[test]
fn a_crash_at_each_step_of_a_checkpoint_loses_and_duplicates_nothing() {
    let expected = straight_routed_summary();

    for failpoint in [
        "after-record:3",
        "between-commits:5",
        "after-commits:3",
        "in-metadata-write:4",
    ] {
        let dir = tempfile::tempdir().unwrap();
        crash_then_finish(dir.path(), &routed_script("100ms"), failpoint);
        assert_eq!(
            routed_summary(dir.path()),
            expected,
            "crashed at {failpoint}"
        );
    }
}

/// The upsert job crashed after its record is written (its commit then finds the rows to
/// delete on the table as it is after the restart), after its commit, and halfway through
/// a metadata file: one row per key, each the last.
#[test]
fn an_upsert_job_crashed_at_each_step_keeps_the_last_row_of_each_key() {
    for failpoint in ["after-record:3", "after-commits:3", "in-metadata-write:4"] {
        let dir = tempfile::tempdir().unwrap();
        crash_then_finish(dir.path(), &upsert_script("100ms"), failpoint);
        upsert_summary(dir.path());
    }
}
