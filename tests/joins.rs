//! Joins run three ways (straight, frequent checkpoints, killed and restarted) give the same
//! rows, the rows a batch query gives: a stream joined with a lake table (a lookup join), and
//! two streams joined. A lake table updated while the job runs is seen by the rows read after
//! the update.

mod common;

use common::process::{
    assert_same_spilled, assert_same_with_checkpoints_and_kills, floe_ok, kill_and_restart,
    kill_losing_state_and_restart, query_csv, run_script_to_end, start_script, state_files,
};
use std::path::Path;
use std::time::{Duration, Instant};

const ROWS: u64 = 240_000;

const CATALOG: &str = "CREATE CATALOG lake WITH ('type' = 'iceberg', 'catalog-type' = 'sql', \
                       'uri' = 'sqlite:lake/catalog.db', 'warehouse' = 'lake/warehouse')";

/// Customers 1..=8000 (the orders' customer ids run to 10,000): a third of them gold.
fn setup(dir: &Path) {
    floe_ok(
        dir,
        &[
            "-q",
            "-c",
            &format!(
                "{CATALOG}; CREATE SCHEMA lake.shop;
                 CREATE TABLE lake.shop.customers (id BIGINT, segment STRING, discount DOUBLE);
                 INSERT INTO lake.shop.customers SELECT value,
                   CASE WHEN value % 3 = 0 THEN 'gold' ELSE 'std' END,
                   CASE WHEN value % 3 = 0 THEN 0.1 ELSE 0.0 END
                 FROM generate_series(1, 8000);
                 CREATE TABLE lake.shop.enriched (order_id BIGINT, customer_id BIGINT,
                   segment STRING, paid DOUBLE, region STRING)"
            ),
        ],
    );
}

fn script(interval: &str, rate: u64, refresh: &str) -> String {
    format!(
        "{CATALOG};
         CREATE SOURCE gen WITH ('connector' = 'datagen', 'profile' = 'orders',
           'number-of-rows' = '{ROWS}', 'rows-per-second' = '{rate}', 'seed' = '42');
         SET 'pipeline.name' = 'enrich';
         SET 'checkpoint.interval' = '{interval}';
         SET 'lookup.refresh-interval' = '{refresh}';
         INSERT INTO lake.shop.enriched
         SELECT o.order_id, o.customer_id, coalesce(c.segment, 'unknown'),
                round(o.price * o.quantity * (1 - coalesce(c.discount, 0)), 2), o.region
         FROM gen o LEFT JOIN lake.shop.customers c ON o.customer_id = c.id
         WHERE o.status <> 'new';"
    )
}

fn summary(dir: &Path) -> String {
    query_csv(
        dir,
        CATALOG,
        "SELECT segment, count(*) AS n, count(DISTINCT order_id) AS ids, sum(order_id) AS s,
           round(sum(paid), 2) AS paid, min(customer_id) AS lo, max(customer_id) AS hi
         FROM lake.shop.enriched GROUP BY segment ORDER BY segment",
    )
}

#[test]
fn a_lookup_join_killed_and_restarted_gives_the_same_rows() {
    let straight = tempfile::tempdir().unwrap();
    setup(straight.path());
    run_script_to_end(straight.path(), &script("1h", 60_000, "1m"));
    let expected = summary(straight.path());
    assert_eq!(
        expected.lines().count(),
        4,
        "gold, std, unknown: {expected}"
    );
    // What a batch query over the same orders and customers gives.
    let batch = query_csv(
        straight.path(),
        &format!(
            "{CATALOG}; CREATE SOURCE gen WITH ('connector' = 'datagen', 'profile' = 'orders', \
             'number-of-rows' = '{ROWS}', 'seed' = '42')"
        ),
        "SELECT coalesce(c.segment, 'unknown') AS segment, count(*) AS n,
           count(DISTINCT o.order_id) AS ids, sum(o.order_id) AS s,
           round(sum(round(o.price * o.quantity * (1 - coalesce(c.discount, 0)), 2)), 2) AS paid,
           min(o.customer_id) AS lo, max(o.customer_id) AS hi
         FROM gen o LEFT JOIN lake.shop.customers c ON o.customer_id = c.id
         WHERE o.status <> 'new' GROUP BY 1 ORDER BY 1",
    );
    assert_eq!(expected, batch, "the job's rows are the batch query's");

    let frequent = tempfile::tempdir().unwrap();
    setup(frequent.path());
    run_script_to_end(frequent.path(), &script("50ms", 60_000, "1m"));
    assert_eq!(summary(frequent.path()), expected, "frequent checkpoints");

    let killed = tempfile::tempdir().unwrap();
    setup(killed.path());
    kill_and_restart(killed.path(), &script("100ms", 60_000, "1m"), 550);
    assert_eq!(summary(killed.path()), expected, "killed and restarted");
}

#[test]
fn a_table_updated_while_the_job_runs_is_seen_after_the_refresh_interval() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path());
    let mut job = start_script(dir.path(), &script("200ms", 20_000, "200ms"));
    // Once the job has written rows, every gold customer becomes platinum.
    let start = Instant::now();
    loop {
        assert!(start.elapsed() < Duration::from_secs(60), "no rows written");
        std::thread::sleep(Duration::from_millis(300));
        let out = query_csv(
            dir.path(),
            CATALOG,
            "SELECT count(*) FROM lake.shop.enriched",
        );
        if out.lines().nth(1).is_some_and(|n| n != "0") {
            break;
        }
    }
    floe_ok(
        dir.path(),
        &[
            "-q",
            "-c",
            &format!(
                "{CATALOG}; UPDATE lake.shop.customers SET segment = 'platinum' \
                 WHERE segment = 'gold'"
            ),
        ],
    );
    assert!(job.wait().unwrap().success());
    let out = query_csv(
        dir.path(),
        CATALOG,
        "SELECT segment, count(*) AS n, min(order_id) AS first, max(order_id) AS last
         FROM lake.shop.enriched WHERE segment IN ('gold', 'platinum') GROUP BY 1 ORDER BY 1",
    );
    let rows: Vec<Vec<u64>> = out
        .lines()
        .skip(1)
        .map(|l| l.split(',').skip(1).map(|v| v.parse().unwrap()).collect())
        .collect();
    assert_eq!(
        rows.len(),
        2,
        "gold before the update, platinum after: {out}"
    );
    let (gold, platinum) = (&rows[0], &rows[1]);
    assert!(
        gold[2] < platinum[1],
        "every order read after the refresh sees the new segment: {out}"
    );
    assert!(gold[0] > 0 && platinum[0] > 0, "{out}");
}

/// Orders joined with their shipments (a second stream, delivered at its own pace): each
/// order that has a shipment, once, whichever of the two came first.
fn streams_script(interval: &str) -> String {
    format!(
        "{CATALOG};
         CREATE SCHEMA IF NOT EXISTS lake.shop;
         CREATE TABLE IF NOT EXISTS lake.shop.shipped (order_id BIGINT, region STRING,
           carrier STRING, paid DOUBLE, days INT);
         CREATE SOURCE orders WITH ('connector' = 'datagen', 'profile' = 'orders',
           'number-of-rows' = '{ROWS}', 'rows-per-second' = '60000', 'seed' = '42');
         CREATE SOURCE shipments (order_id BIGINT, carrier STRING, days INT)
           WITH ('connector' = 'datagen', 'number-of-rows' = '{}', 'rows-per-second' = '40000',
           'seed' = '9');
         SET 'pipeline.name' = 'shipped';
         SET 'checkpoint.interval' = '{interval}';
         INSERT INTO lake.shop.shipped
         SELECT o.order_id, o.region, s.carrier, o.price * o.quantity, s.days
         FROM orders o JOIN shipments s ON o.order_id = s.order_id % {ROWS} + 1
         WHERE o.status <> 'new';",
        ROWS / 2
    )
}

fn shipped(dir: &Path) -> String {
    query_csv(
        dir,
        CATALOG,
        "SELECT region, count(*) AS n, count(DISTINCT order_id) AS ids, sum(order_id) AS s,
           round(sum(paid), 2) AS paid, sum(days) AS days, count(DISTINCT carrier) AS carriers
         FROM lake.shop.shipped GROUP BY region ORDER BY region",
    )
}

#[test]
fn a_join_of_two_streams_killed_and_restarted_gives_the_same_rows() {
    let straight = tempfile::tempdir().unwrap();
    run_script_to_end(straight.path(), &streams_script("1h"));
    let expected = shipped(straight.path());
    assert_eq!(expected.lines().count(), 5, "four regions: {expected}");
    let batch = query_csv(
        straight.path(),
        &format!(
            "{CATALOG}; CREATE SOURCE orders WITH ('connector' = 'datagen', 'profile' = 'orders', \
             'number-of-rows' = '{ROWS}', 'seed' = '42'); CREATE SOURCE shipments (order_id \
             BIGINT, carrier STRING, days INT) WITH ('connector' = 'datagen', 'number-of-rows' \
             = '{}', 'seed' = '9')",
            ROWS / 2
        ),
        &format!(
            "SELECT o.region, count(*) AS n, count(DISTINCT o.order_id) AS ids,
               sum(o.order_id) AS s, round(sum(o.price * o.quantity), 2) AS paid,
               sum(s.days) AS days, count(DISTINCT s.carrier) AS carriers
             FROM orders o JOIN shipments s ON o.order_id = s.order_id % {ROWS} + 1
             WHERE o.status <> 'new' GROUP BY 1 ORDER BY 1"
        ),
    );
    assert_eq!(expected, batch, "the job's rows are the batch query's");

    assert_same_with_checkpoints_and_kills(streams_script, 550, shipped, &expected);

    // The kept rows beyond a small budget go to disk, each with its key's hash: the same
    // rows, straight and killed and restarted.
    let (spilled, _) = assert_same_spilled(streams_script, "16kb", 550, shipped, &expected);
    let files = state_files(spilled.path(), "shipped", "join-spill-");
    assert!(files > 1, "the kept rows are on disk: {files} files");

    // The state folder lost at every kill: the kept rows (on disk too) come back from the
    // copy beside the table its last commit names.
    let lost = tempfile::tempdir().unwrap();
    let spilling = format!(
        "SET 'state.memory-budget' = '16kb'; {}",
        streams_script("100ms")
    );
    kill_losing_state_and_restart(lost.path(), &spilling, 550);
    assert_eq!(
        shipped(lost.path()),
        expected,
        "state folder lost at every kill"
    );
}

/// Two order streams met within a time bound: `b` from 5 s before `a` to 2 s after, each
/// up to 10 s out of order; the watermarks trail by `delay` seconds.
fn interval_script(interval: &str, delay: &str) -> String {
    let source = |name: &str, seed: u32, rate: u32| {
        format!(
            "CREATE SOURCE {name} (WATERMARK FOR order_time AS order_time - INTERVAL '{delay}'
               SECOND) WITH ('connector' = 'datagen', 'profile' = 'orders',
               'number-of-rows' = '{ROWS}', 'rows-per-second' = '{rate}', 'seed' = '{seed}',
               'time.disorder' = '10s')"
        )
    };
    format!(
        "{CATALOG};
         CREATE SCHEMA IF NOT EXISTS lake.shop;
         CREATE TABLE IF NOT EXISTS lake.shop.met (a_id BIGINT, b_id BIGINT, customer BIGINT);
         {}; {};
         SET 'pipeline.name' = 'met';
         SET 'checkpoint.interval' = '{interval}';
         INSERT INTO lake.shop.met {INTERVAL_JOIN};",
        source("a", 1, 60_000),
        source("b", 3, 45_000)
    )
}

const INTERVAL_JOIN: &str = "SELECT a.order_id AS a_id, b.order_id AS b_id, a.customer_id AS customer
    FROM a JOIN b
    ON a.customer_id = b.customer_id
    AND b.order_time BETWEEN a.order_time - INTERVAL '5' SECOND AND a.order_time + INTERVAL '2' SECOND";

fn met(dir: &Path) -> String {
    let q = |sql: &str| query_csv(dir, CATALOG, sql);
    let rows = q(
        "SELECT count(*) AS n, count(DISTINCT a_id) AS a, sum(a_id) AS sa, sum(b_id) AS sb,
                  sum(customer) AS c FROM lake.shop.met",
    );
    let late = match q("SELECT table_name FROM lake.information_schema.tables
                        WHERE table_name = 'dead_letters'")
    .lines()
    .count()
    {
        1 => "no dead letters".to_string(),
        _ => q(
            "SELECT source, count(*) AS n, min(error) AS why FROM lake.shop.dead_letters
                GROUP BY source ORDER BY source",
        ),
    };
    format!("{rows}{late}")
}

/// The rows the job's last checkpoint keeps, per file.
fn kept_rows(dir: &Path) -> usize {
    let mut rows = 0;
    for entry in std::fs::read_dir(dir.join(".floe/met")).unwrap() {
        let path = entry.unwrap().path();
        if path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("join-")
        {
            let file = std::fs::File::open(&path).unwrap();
            for batch in datafusion::arrow::ipc::reader::FileReader::try_new(file, None).unwrap() {
                rows += batch.unwrap().num_rows();
            }
        }
    }
    rows
}

#[test]
fn an_interval_join_killed_and_restarted_gives_the_same_rows_and_lets_old_rows_go() {
    // The watermarks allow the whole disorder: nothing is late; the rows are a batch query's.
    let allowing = tempfile::tempdir().unwrap();
    run_script_to_end(allowing.path(), &interval_script("200ms", "10"));
    let setup = interval_script("1h", "10");
    let setup = setup.split("SET 'pipeline.name'").next().unwrap();
    let batch = query_csv(
        allowing.path(),
        setup,
        &format!(
            "SELECT count(*) AS n, count(DISTINCT a_id) AS a, sum(a_id) AS sa, sum(b_id) AS sb,
               sum(customer) AS c FROM ({})",
            INTERVAL_JOIN.replace('\n', " ")
        ),
    );
    let allowed = met(allowing.path());
    assert!(allowed.ends_with("no dead letters"), "{allowed}");
    assert!(
        allowed.starts_with(&batch),
        "{allowed} is not the batch query's {batch}"
    );
    // Only the rows the watermarks have not passed are kept: a few seconds' worth of 480,000.
    let kept = kept_rows(allowing.path());
    assert!(kept < 2 * ROWS as usize / 100, "{kept} rows kept");

    // Trailing by 8 s, records up to 10 s out of order come late: the same ones every run.
    let straight = tempfile::tempdir().unwrap();
    run_script_to_end(straight.path(), &interval_script("1h", "8"));
    let expected = met(straight.path());
    assert!(
        expected.contains("late: its order_time is behind the watermark"),
        "{expected}"
    );

    assert_same_with_checkpoints_and_kills(|i| interval_script(i, "8"), 550, met, &expected);
    // Kept rows on disk are not let go, but the join's condition keeps them from joining.
    assert_same_spilled(|i| interval_script(i, "8"), "16kb", 550, met, &expected);
}
