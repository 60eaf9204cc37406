//! Aggregates run three ways (straight through, with frequent checkpoints, killed with SIGKILL
//! at random moments and restarted): over windows they must emit the same windows, each once,
//! and dead-letter the same late records; without windows they must leave the same row per
//! group. What they write is what a batch query over the same records gives.

mod common;

use common::process::{
    assert_same_spilled, assert_same_with_checkpoints_and_kills, floe,
    kill_losing_state_and_restart, query_csv, run_script_to_end, start_script,
};
use std::path::Path;

const ROWS: u64 = 240_000;

const CATALOG: &str = "CREATE CATALOG lake WITH ('type' = 'iceberg', 'catalog-type' = 'sql', \
                       'uri' = 'sqlite:lake/catalog.db', 'warehouse' = 'lake/warehouse')";

/// The orders source: one order every 100 ms of event time, up to 10 s out of order; the
/// watermark trails the latest order time by `delay`.
fn source(delay: &str) -> String {
    format!(
        "CREATE SOURCE gen (WATERMARK FOR order_time AS order_time - INTERVAL '{delay}' SECOND)
           WITH ('connector' = 'datagen', 'profile' = 'orders', 'number-of-rows' = '{ROWS}',
           'rows-per-second' = '60000', 'seed' = '42', 'time.disorder' = '10s')"
    )
}

/// The per-minute (tumbling) and five-minute-every-minute (hopping) aggregates. Money is
/// summed in cents, so that the sums do not depend on the order they are added in.
const TUMBLE: &str = "SELECT window_start, window_end, region, count(*) AS orders,
       count(DISTINCT customer_id) AS customers,
       sum(CAST(round(price * 100) AS BIGINT) * quantity) AS cents, max(price) AS top
     FROM TUMBLE(gen, order_time, INTERVAL '1' MINUTE) WHERE status <> 'new'
     GROUP BY window_start, window_end, region";
const HOP: &str = "SELECT window_start, window_end, count(*) AS orders,
       approx_distinct(customer_id) AS customers, min(order_id) AS first
     FROM HOP(gen, order_time, INTERVAL '1' MINUTE, INTERVAL '5' MINUTE)
     GROUP BY window_start, window_end HAVING count(*) > 100";
const CUMULATE: &str = "SELECT window_start, window_end, region, count(*) AS orders,
       sum(quantity) AS items
     FROM CUMULATE(gen, order_time, INTERVAL '10' MINUTE, INTERVAL '1' HOUR)
     GROUP BY window_start, window_end, region";
/// Bursts of orders of each product in each region: its orders until 5 s without one. Its
/// records come up to 10 s out of order and the watermark trails by 2 s: a record behind the
/// watermark whose own session (time + 5 s) is open joins the sessions open when it came, or
/// starts one beside a session closed already.
const SESSION: &str = "SELECT window_start, window_end, region, product, count(*) AS orders,
       sum(quantity) AS items, max(order_id) AS last
     FROM SESSION(gen, order_time, INTERVAL '5' SECOND)
     GROUP BY region, product, window_start, window_end";

fn script(interval: &str, delay: &str) -> String {
    format!(
        "{CATALOG};
         CREATE SCHEMA IF NOT EXISTS lake.shop;
         CREATE TABLE IF NOT EXISTS lake.shop.per_minute (window_start TIMESTAMP,
           window_end TIMESTAMP, region STRING, orders BIGINT, customers BIGINT, cents BIGINT,
           top DOUBLE) PARTITIONED BY (days(window_start));
         CREATE TABLE IF NOT EXISTS lake.shop.five_minutes (window_start TIMESTAMP,
           window_end TIMESTAMP, orders BIGINT, customers BIGINT, first BIGINT);
         {};
         SET 'checkpoint.interval' = '{interval}';
         SET 'pipeline.name' = 'per-minute';
         INSERT INTO lake.shop.per_minute {TUMBLE};
         SET 'pipeline.name' = 'five-minutes';
         INSERT INTO lake.shop.five_minutes {HOP};
         CREATE TABLE IF NOT EXISTS lake.shop.running (window_start TIMESTAMP,
           window_end TIMESTAMP, region STRING, orders BIGINT, items BIGINT);
         SET 'pipeline.name' = 'running';
         INSERT INTO lake.shop.running {CUMULATE};
         CREATE TABLE IF NOT EXISTS lake.shop.bursts (window_start TIMESTAMP,
           window_end TIMESTAMP, region STRING, product STRING, orders BIGINT, items BIGINT,
           last BIGINT);
         SET 'pipeline.name' = 'bursts';
         INSERT INTO lake.shop.bursts {SESSION};",
        source(delay)
    )
}

/// Everything the jobs left: both tables whole, and the late records per job.
fn tables(dir: &Path) -> String {
    let q = |sql: &str| query_csv(dir, CATALOG, sql);
    let per_minute = q("SELECT * FROM lake.shop.per_minute ORDER BY window_start, region");
    let five = q("SELECT * FROM lake.shop.five_minutes ORDER BY window_start");
    let running = q("SELECT * FROM lake.shop.running ORDER BY window_start, window_end, region");
    let bursts = q("SELECT * FROM lake.shop.bursts ORDER BY region, product, window_start");
    let late = q(
        "SELECT job, count(*) AS late, count(DISTINCT payload) AS records,
                    min(error) AS error FROM lake.shop.dead_letters GROUP BY job ORDER BY job",
    );
    format!("{per_minute}\n{five}\n{running}\n{bursts}\n{late}")
}

/// Each window once: no (window, region) twice in the per-minute table, no window twice in
/// the five-minute one; each order in one burst or late, no two bursts of a product and region
/// starting together.
fn assert_each_window_once(dir: &Path) {
    let out = query_csv(
        dir,
        CATALOG,
        &format!(
            "SELECT (SELECT count(*) - count(DISTINCT CAST(window_start AS STRING) || region)
                     FROM lake.shop.per_minute),
                    (SELECT count(*) - count(DISTINCT window_start) FROM lake.shop.five_minutes),
                    (SELECT count(*) - count(DISTINCT region || product
                                                      || CAST(window_start AS STRING))
                     FROM lake.shop.bursts),
                    (SELECT sum(orders) FROM lake.shop.bursts)
                      + (SELECT count(*) FROM lake.shop.dead_letters WHERE job = 'bursts')
                      - {ROWS}"
        ),
    );
    assert_eq!(
        out.lines().nth(1),
        Some("0,0,0,0"),
        "a window emitted twice, or an order in no burst or two: {out}"
    );
}

/// Bursts of a product and region that overlap: a record behind the watermark started one
/// beside a burst closed before it came.
fn overlapping_bursts(dir: &Path) -> u64 {
    let out = query_csv(
        dir,
        CATALOG,
        "SELECT count(*) FROM lake.shop.bursts a JOIN lake.shop.bursts b
           ON a.region = b.region AND a.product = b.product AND a.window_start < b.window_start
           AND b.window_start < a.window_end",
    );
    out.lines().nth(1).and_then(|l| l.parse().ok()).unwrap_or(0)
}

#[test]
fn windows_killed_and_restarted_are_emitted_once_with_the_same_rows() {
    // The watermark trails by 2 s and records come up to 10 s out of order: some are late.
    let straight = tempfile::tempdir().unwrap();
    run_script_to_end(straight.path(), &script("1h", "2"));
    let expected = tables(straight.path());
    let minutes = ROWS / 600;
    assert!(
        expected.lines().count() as u64 > minutes * 4,
        "a row per minute and region: {expected}"
    );
    assert!(
        expected.contains("per-minute,")
            && expected.contains("five-minutes,")
            && expected.contains("running,")
            && expected.contains("bursts,"),
        "late records dead-lettered for every job: {expected}"
    );
    assert!(expected.contains("late: its window ended at"), "{expected}");
    let sessions = expected.split("\n\n").nth(3).unwrap_or_default();
    assert!(
        sessions.lines().count() > 1000
            && sessions
                .lines()
                .skip(1)
                .any(|l| l.split(',').nth(4).is_some_and(|n| n != "1")),
        "many sessions, some of several orders: {sessions}"
    );
    assert!(
        expected.contains("late: its session window (its time + the gap, and any session"),
        "{expected}"
    );
    assert_each_window_once(straight.path());
    assert!(
        overlapping_bursts(straight.path()) > 0,
        "records behind the watermark start sessions beside closed ones"
    );

    let (frequent, killed) = assert_same_with_checkpoints_and_kills(
        |interval| script(interval, "2"),
        700,
        tables,
        &expected,
    );
    assert_each_window_once(frequent.path());
    assert_each_window_once(killed.path());

    // Open windows' state beyond a small budget goes to disk: the same rows, straight and
    // killed and restarted.
    let (_, killed) = assert_same_spilled(|i| script(i, "2"), "16kb", 700, tables, &expected);
    assert_each_window_once(killed.path());

    // The state folder lost at every kill (an ephemeral disk): each job resumes from the copy
    // of its checkpoint record and state (spilled files too) that its tables' last commit
    // names: the same windows and the same dead letters.
    let lost = tempfile::tempdir().unwrap();
    let spilled = format!(
        "SET 'state.memory-budget' = '16kb'; {}",
        script("100ms", "2")
    );
    kill_losing_state_and_restart(lost.path(), &spilled, 700);
    assert_eq!(
        tables(lost.path()),
        expected,
        "state folder lost at every kill"
    );
    assert_each_window_once(lost.path());
    // The copies of the state beside the tables: the last checkpoint's, and those of runs
    // killed before their first commit.
    for (job, table) in [
        ("per-minute", "per_minute"),
        ("five-minutes", "five_minutes"),
        ("running", "running"),
        ("bursts", "bursts"),
    ] {
        let copies = state_copies(lost.path(), table, job, "record-");
        let tree = std::process::Command::new("find")
            .arg(lost.path().join("lake/warehouse/shop"))
            .output()
            .unwrap();
        assert!(
            (1..=6).contains(&copies),
            "{job}: {copies} states: {}",
            String::from_utf8_lossy(&tree.stdout)
        );
    }
}

/// How many files named `prefix...` the copies of job `job`'s record and state with the shop's
/// table `table` hold (a folder per run of the job).
fn state_copies(dir: &Path, table: &str, job: &str, prefix: &str) -> usize {
    let folder = dir
        .join("lake/warehouse/shop")
        .join(table)
        .join(".floe-state")
        .join(job);
    std::fs::read_dir(&folder)
        .unwrap_or_else(|e| panic!("{}: {e}", folder.display()))
        .flatten()
        .flat_map(|run| std::fs::read_dir(run.path()).unwrap().flatten())
        .filter(|f| f.file_name().to_string_lossy().starts_with(prefix))
        .count()
}

#[test]
fn a_job_whose_state_folder_is_lost_resumes_from_the_copy_beside_its_tables_or_refuses() {
    let job = |copy: bool| {
        format!(
            "SET 'state.lake-copy' = '{copy}'; {CATALOG};
             CREATE SCHEMA IF NOT EXISTS lake.shop;
             CREATE TABLE IF NOT EXISTS lake.shop.per_minute (window_start TIMESTAMP,
               window_end TIMESTAMP, region STRING, orders BIGINT, customers BIGINT,
               cents BIGINT, top DOUBLE);
             {}; SET 'checkpoint.interval' = '100ms'; SET 'pipeline.name' = 'per-minute';
             INSERT INTO lake.shop.per_minute {TUMBLE};",
            source("10")
        )
    };
    let rows = |dir: &Path| {
        query_csv(
            dir,
            CATALOG,
            "SELECT count(*), count(DISTINCT CAST(window_start AS STRING) || region)
             FROM lake.shop.per_minute",
        )
    };
    let run = |dir: &Path, script: &str| {
        std::fs::write(dir.join("job.sql"), script).unwrap();
        floe()
            .current_dir(dir)
            .args(["-q", "-f", "job.sql"])
            .output()
            .unwrap()
    };
    for copy in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        run_script_to_end(dir.path(), &job(copy));
        let before = rows(dir.path());
        std::fs::remove_dir_all(dir.path().join(".floe")).unwrap();
        let again = run(dir.path(), &job(copy));
        let stderr = String::from_utf8_lossy(&again.stderr);
        if copy {
            assert!(again.status.success(), "{stderr}");
            assert_eq!(
                state_copies(dir.path(), "per_minute", "per-minute", "record-"),
                1
            );
            // The copy gone too (deleted by hand): the job refuses rather than lose its state.
            let copies = dir
                .path()
                .join("lake/warehouse/shop/per_minute/.floe-state");
            std::fs::remove_dir_all(copies).unwrap();
            std::fs::remove_dir_all(dir.path().join(".floe")).unwrap();
            let gone = run(dir.path(), &job(copy));
            let stderr = String::from_utf8_lossy(&gone.stderr);
            assert!(
                !gone.status.success(),
                "resumed without its state: {stderr}"
            );
            assert!(
                stderr.contains("record with that state is missing"),
                "{stderr}"
            );
        } else {
            assert!(
                !again.status.success(),
                "resumed without its state: {stderr}"
            );
            assert!(
                stderr.contains(
                    "job 'per-minute' keeps state (open windows), and its checkpoint \
                                 record with that state is missing"
                ) && stderr.contains("state.lake-copy"),
                "{stderr}"
            );
        }
        assert_eq!(rows(dir.path()), before, "the same windows, each once");
    }
}

#[test]
fn windows_hold_what_a_batch_query_over_the_same_records_gives() {
    // The watermark trails by the whole disorder: no record is late.
    let dir = tempfile::tempdir().unwrap();
    run_script_to_end(dir.path(), &script("200ms", "10"));
    let q = |sql: &str| query_csv(dir.path(), CATALOG, sql);
    let shop = q("SELECT table_name FROM lake.information_schema.tables
                  WHERE table_schema = 'shop' ORDER BY 1");
    assert_eq!(
        shop, "table_name\nbursts\nfive_minutes\nper_minute\nrunning\n",
        "no dead letters: no record is late when the watermark allows the disorder"
    );
    let setup = format!("{CATALOG}; {}", source("10"));
    let batch = |sql: &str, order: &str| {
        query_csv(
            dir.path(),
            &setup,
            &format!("SELECT * FROM ({sql}) ORDER BY {order}"),
        )
    };
    let tumble = batch(TUMBLE, "window_start, region");
    let hop = batch(HOP, "window_start");
    assert_eq!(
        q("SELECT * FROM lake.shop.per_minute ORDER BY window_start, region"),
        tumble
    );
    assert_eq!(
        q("SELECT * FROM lake.shop.five_minutes ORDER BY window_start"),
        hop
    );
    assert_eq!(
        q("SELECT * FROM lake.shop.running ORDER BY window_start, window_end, region"),
        batch(CUMULATE, "window_start, window_end, region")
    );
    // Sessions, against their definition in plain SQL: ordered by time, an order of a
    // product in a region starts a burst when it comes 5 seconds or more after the one before.
    let bursts = batch(
        "SELECT min(order_time) AS window_start,
                max(order_time) + INTERVAL '5' SECOND AS window_end, region, product,
                count(*) AS orders, sum(quantity) AS items, max(order_id) AS last
         FROM (SELECT *, sum(starts) OVER (PARTITION BY region, product ORDER BY order_time
                                           ROWS UNBOUNDED PRECEDING) AS burst
               FROM (SELECT *, CASE WHEN order_time < lag(order_time) OVER
                      (PARTITION BY region, product ORDER BY order_time) + INTERVAL '5' SECOND
                      THEN 0 ELSE 1 END AS starts FROM gen))
         GROUP BY region, product, burst",
        "region, product, window_start",
    );
    assert!(bursts.lines().count() > 1000, "{bursts}");
    assert_eq!(
        q("SELECT * FROM lake.shop.bursts ORDER BY region, product, window_start"),
        bursts
    );
    assert_eq!(batch(SESSION, "region, product, window_start"), bursts);
}

#[test]
fn explain_shows_the_streaming_plan() {
    let dir = tempfile::tempdir().unwrap();
    let setup = format!(
        "{CATALOG}; CREATE SCHEMA lake.shop; CREATE TABLE lake.shop.five_minutes (window_start \
         TIMESTAMP, window_end TIMESTAMP, orders BIGINT, customers BIGINT, first BIGINT); {}",
        source("2")
    );
    let plan = common::process::floe_ok(
        dir.path(),
        &[
            "-q",
            "--format",
            "csv",
            "-c",
            &setup,
            "-c",
            &format!("EXPLAIN INSERT INTO lake.shop.five_minutes {HOP}"),
        ],
    );
    for part in [
        "continuous_plan",
        "Emit: each window once, when the watermark passes window_end + 0s",
        "FilterExec: count(Int64(1))@2 > 100",
        "WindowAggregate: gby=[window_start@0 as window_start, window_end@1 as window_end]",
        "state: each open window's accumulator state",
        "PerBatch: source=gen",
        "UnnestExec",
        "Source: gen, connector=datagen, watermark=order_time - INTERVAL '2' SECOND",
    ] {
        assert!(plan.contains(part), "{part}: {plan}");
    }
    // The plan each batch runs reads only the columns the aggregate needs.
    assert!(!plan.contains("price"), "{plan}");
}

/// A source that sends nothing holds the watermark back, until the idle timeout lets it on.
#[test]
fn an_idle_source_stops_holding_windows_back_after_the_idle_timeout() {
    use std::time::{Duration, Instant};
    let script = |timeout: &str| {
        format!(
            "{CATALOG}; CREATE SCHEMA IF NOT EXISTS lake.shop;
             CREATE TABLE IF NOT EXISTS lake.shop.counts (window_start TIMESTAMP, orders BIGINT);
             {};
             CREATE SOURCE quiet (order_id BIGINT, order_time TIMESTAMP,
               WATERMARK FOR order_time AS order_time) WITH ('connector' = 'filesystem',
               'path' = 'quiet', 'format' = 'json', 'source.monitor-interval' = '100ms');
             SET 'source.idle-timeout' = '{timeout}';
             SET 'checkpoint.interval' = '200ms';
             INSERT INTO lake.shop.counts SELECT window_start, count(*)
             FROM TUMBLE((SELECT order_id, order_time FROM gen UNION ALL SELECT * FROM quiet),
               order_time, INTERVAL '1' MINUTE) GROUP BY window_start, window_end;",
            source("2")
        )
    };
    // Runs the never-ending job until it has emitted windows or `wait` has passed; the
    // orders it emitted then.
    let run_for = |timeout: &str, wait: Duration| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("quiet")).unwrap();
        let mut child = start_script(dir.path(), &script(timeout));
        let start = Instant::now();
        let mut emitted = 0;
        while start.elapsed() < wait && emitted == 0 {
            std::thread::sleep(Duration::from_millis(500));
            assert!(
                child.try_wait().unwrap().is_none(),
                "the job over a watched folder ended"
            );
            let out = query_csv(
                dir.path(),
                CATALOG,
                "SELECT coalesce(sum(orders), 0) FROM lake.shop.counts",
            );
            emitted = out.lines().nth(1).unwrap_or("0").parse::<u64>().unwrap();
        }
        child.kill().unwrap();
        child.wait().unwrap();
        emitted
    };
    // Without a timeout, the quiet source holds every window back, after the orders ended too.
    assert_eq!(run_for("none", Duration::from_secs(8)), 0);
    // With one, the orders' watermark closes their windows.
    let emitted = run_for("500ms", Duration::from_secs(30));
    assert!(emitted > 0, "no window emitted");
}

/// Orders per customer segment and region, updated at each checkpoint into a table keyed by
/// the group (sums in cents: exact whatever the order they are added in).
fn updating_script(interval: &str) -> String {
    format!(
        "{CATALOG};
         CREATE SCHEMA IF NOT EXISTS lake.shop;
         CREATE TABLE IF NOT EXISTS lake.shop.by_region (region STRING, product STRING,
           orders BIGINT, customers BIGINT, cents BIGINT, top DOUBLE,
           PRIMARY KEY (region, product) NOT ENFORCED);
         {};
         SET 'checkpoint.interval' = '{interval}';
         SET 'pipeline.name' = 'by-region';
         INSERT INTO lake.shop.by_region {UPDATING};",
        source("2")
    )
}

const UPDATING: &str = "SELECT region, product, count(*) AS orders,
       count(DISTINCT customer_id) AS customers,
       sum(CAST(round(price * 100) AS BIGINT) * quantity) AS cents, max(price) AS top
     FROM gen WHERE status <> 'new' GROUP BY region, product";

#[test]
fn an_updating_aggregate_killed_and_restarted_keeps_one_right_row_per_group() {
    let rows = |dir: &Path| {
        query_csv(
            dir,
            CATALOG,
            "SELECT * FROM lake.shop.by_region ORDER BY region, product",
        )
    };
    let straight = tempfile::tempdir().unwrap();
    run_script_to_end(straight.path(), &updating_script("1h"));
    let expected = rows(straight.path());
    assert_eq!(
        expected.lines().count(),
        33,
        "4 regions x 8 products: {expected}"
    );
    let batch = query_csv(
        straight.path(),
        &format!("{CATALOG}; {}", source("2")),
        &format!("SELECT * FROM ({UPDATING}) ORDER BY region, product"),
    );
    assert_eq!(expected, batch, "the job's rows are the batch query's");

    // Every checkpoint updates every group: the table keeps one row per group, the last.
    let (frequent, _) =
        assert_same_with_checkpoints_and_kills(updating_script, 550, rows, &expected);
    let snapshots = query_csv(
        frequent.path(),
        CATALOG,
        "SELECT count(*) FROM lake.shop.\"by_region$snapshots\"",
    );
    let snapshots: u64 = snapshots.lines().nth(1).unwrap().parse().unwrap();
    assert!(
        snapshots > 5,
        "updated at each checkpoint: {snapshots} snapshots"
    );

    // The groups' state beyond a small budget goes to disk: the same rows, straight and
    // killed and restarted.
    assert_same_spilled(updating_script, "4kb", 550, rows, &expected);
}

/// Queries over an aggregate's rows: the busiest products of each minute (the per-minute
/// counts read twice, their maximum joined back on the window), and the average over each
/// region's products of their takings, updated by region (recomputed over every group).
fn composed_script(interval: &str) -> String {
    format!(
        "{CATALOG};
         CREATE SCHEMA IF NOT EXISTS lake.shop;
         CREATE TABLE IF NOT EXISTS lake.shop.busiest (window_start TIMESTAMP, product STRING,
           orders BIGINT);
         CREATE TABLE IF NOT EXISTS lake.shop.avg_top (region STRING, avg_cents BIGINT,
           PRIMARY KEY (region) NOT ENFORCED);
         {};
         SET 'checkpoint.interval' = '{interval}';
         SET 'pipeline.name' = 'busiest';
         INSERT INTO lake.shop.busiest {BUSIEST};
         SET 'pipeline.name' = 'avg-top';
         INSERT INTO lake.shop.avg_top {AVG_TOP};",
        source("2")
    )
}

const BUSIEST: &str = "WITH counts AS (SELECT window_start, window_end, product, count(*) AS n
       FROM TUMBLE(gen, order_time, INTERVAL '1' MINUTE) GROUP BY window_start, window_end, product)
     SELECT c.window_start, c.product, c.n FROM counts c JOIN (SELECT window_start, window_end,
       max(n) AS top FROM counts GROUP BY window_start, window_end) m
     ON c.window_start = m.window_start AND c.window_end = m.window_end AND c.n >= m.top";

const AVG_TOP: &str = "SELECT region, CAST(avg(cents) AS BIGINT) AS avg_cents FROM (
       SELECT region, product, sum(CAST(round(price * 100) AS BIGINT)) AS cents FROM gen
       GROUP BY region, product)
     GROUP BY region";

#[test]
fn queries_over_an_aggregate_killed_and_restarted_give_the_same_rows() {
    let rows = |dir: &Path| {
        let q = |sql: &str| query_csv(dir, CATALOG, sql);
        let busiest = q("SELECT * FROM lake.shop.busiest ORDER BY window_start, product");
        let avg = q("SELECT * FROM lake.shop.avg_top ORDER BY region");
        let late = q("SELECT job, count(*) FROM lake.shop.dead_letters GROUP BY job ORDER BY job");
        format!("{busiest}\n{avg}\n{late}")
    };
    let straight = tempfile::tempdir().unwrap();
    run_script_to_end(straight.path(), &composed_script("1h"));
    let expected = rows(straight.path());
    let windows = query_csv(
        straight.path(),
        CATALOG,
        "SELECT count(DISTINCT window_start) FROM lake.shop.busiest",
    );
    let windows: u64 = windows.lines().nth(1).unwrap().parse().unwrap();
    assert!(
        windows >= ROWS / 600 - 1,
        "the busiest of every minute: {expected}"
    );
    assert!(expected.contains("busiest,"), "late records: {expected}");
    // Without late records, the updating result is the batch query's.
    let batch = query_csv(
        straight.path(),
        &format!("{CATALOG}; {}", source("2")),
        &format!("SELECT * FROM ({AVG_TOP}) ORDER BY region"),
    );
    let avg = query_csv(
        straight.path(),
        CATALOG,
        "SELECT * FROM lake.shop.avg_top ORDER BY region",
    );
    assert_eq!(avg.lines().count(), 5, "a row per region: {avg}");
    assert_eq!(avg, batch, "the average as in batch");

    assert_same_with_checkpoints_and_kills(composed_script, 600, rows, &expected);

    // With the state on disk, the average over every group's row still sees every group.
    let spilled = tempfile::tempdir().unwrap();
    run_script_to_end(
        spilled.path(),
        &format!(
            "SET 'state.memory-budget' = '1kb'; {}",
            composed_script("100ms")
        ),
    );
    assert_eq!(rows(spilled.path()), expected, "state spilled to disk");
}

/// Windows over processing time (`PROCTIME()`): every record counted once, in one-second
/// windows, straight, with frequent checkpoints and killed and restarted (which window a
/// record lands in depends on when it is read, so the totals are compared, not the windows).
#[test]
fn processing_time_windows_count_each_record_once_killed_and_restarted() {
    let script = |interval: &str| {
        format!(
            "{CATALOG}; CREATE SCHEMA IF NOT EXISTS lake.shop;
             CREATE TABLE IF NOT EXISTS lake.shop.per_second (window_start TIMESTAMP,
               window_end TIMESTAMP, region STRING, orders BIGINT, items BIGINT);
             CREATE SOURCE gen WITH ('connector' = 'datagen', 'profile' = 'orders',
               'number-of-rows' = '40000', 'rows-per-second' = '10000', 'seed' = '42');
             SET 'checkpoint.interval' = '{interval}';
             SET 'pipeline.name' = 'per-second';
             INSERT INTO lake.shop.per_second
             SELECT window_start, window_end, region, count(*), sum(quantity)
             FROM TUMBLE((SELECT *, PROCTIME() AS read_at FROM gen), read_at, INTERVAL '1' SECOND)
             GROUP BY window_start, window_end, region;"
        )
    };
    let totals = |dir: &Path| {
        query_csv(
            dir,
            CATALOG,
            "SELECT region, sum(orders) AS orders, sum(items) AS items
             FROM lake.shop.per_second GROUP BY region ORDER BY region",
        )
    };
    // Each (window, region) once, each window a second of the clock.
    let windows = |dir: &Path| {
        query_csv(
            dir,
            CATALOG,
            "SELECT count(*) - count(DISTINCT CAST(window_start AS STRING) || region),
                    bool_and(window_end = window_start + INTERVAL '1' SECOND
                             AND date_trunc('second', window_start) = window_start),
                    count(DISTINCT window_start) > 2
             FROM lake.shop.per_second",
        )
    };
    let straight = tempfile::tempdir().unwrap();
    run_script_to_end(straight.path(), &script("1h"));
    let expected = totals(straight.path());
    let batch = query_csv(
        straight.path(),
        &format!(
            "{CATALOG}; CREATE SOURCE gen WITH ('connector' = 'datagen', 'profile' = 'orders',
               'number-of-rows' = '40000', 'seed' = '42')"
        ),
        "SELECT region, count(*) AS orders, sum(quantity) AS items FROM gen
         GROUP BY region ORDER BY region",
    );
    assert_eq!(expected, batch);
    assert_eq!(windows(straight.path()).lines().nth(1), Some("0,true,true"));
    let (frequent, killed) = assert_same_with_checkpoints_and_kills(script, 700, totals, &expected);
    for dir in [frequent.path(), killed.path()] {
        assert_eq!(windows(dir).lines().nth(1), Some("0,true,true"));
    }
}

/// A window over processing time closes as the clock passes it, though no record comes
/// after it and the source declares no event time.
#[test]
fn processing_time_windows_close_on_the_clock_without_more_records() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("in")).unwrap();
    let records: String = (0..500)
        .map(|i| format!("{{\"id\": {i}, \"kind\": \"k{}\"}}\n", i % 3))
        .collect();
    std::fs::write(dir.path().join("in/a.json"), records).unwrap();
    let script = format!(
        "{CATALOG}; CREATE SCHEMA IF NOT EXISTS lake.shop;
         CREATE TABLE IF NOT EXISTS lake.shop.kinds (window_start TIMESTAMP, kind STRING,
           n BIGINT);
         CREATE SOURCE events (id BIGINT, kind STRING) WITH ('connector' = 'filesystem',
           'path' = 'in', 'format' = 'json', 'source.monitor-interval' = '100ms');
         SET 'checkpoint.interval' = '200ms';
         INSERT INTO lake.shop.kinds SELECT window_start, kind, count(*)
         FROM TUMBLE((SELECT *, PROCTIME() AS t FROM events), t, INTERVAL '1' SECOND)
         GROUP BY window_start, window_end, kind;"
    );
    let mut child = start_script(dir.path(), &script);
    let start = std::time::Instant::now();
    let mut counted = String::new();
    while start.elapsed() < std::time::Duration::from_secs(30) {
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(child.try_wait().unwrap().is_none(), "the job ended");
        counted = query_csv(
            dir.path(),
            CATALOG,
            "SELECT kind, sum(n) FROM lake.shop.kinds GROUP BY kind ORDER BY kind",
        );
        if counted.lines().count() == 4 && !counted.contains(",,") {
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(
        counted.lines().skip(1).collect::<Vec<_>>(),
        ["k0,167", "k1,167", "k2,166"],
        "every record's window emitted while the job ran on, without more records"
    );
}

/// A windowed job routing each region's windows to a table of its own, with its state folder
/// lost at every kill: a checkpoint whose commits a kill interrupted is finished from the copy
/// of its record beside the tables (only that record named the tables it had not reached yet).
#[test]
fn a_routed_job_losing_its_state_folder_at_every_kill_writes_each_window_once() {
    let script = |interval: &str| {
        format!(
            "{CATALOG}; {};
             SET 'checkpoint.interval' = '{interval}'; SET 'pipeline.name' = 'by-region';
             INSERT INTO lake.by_region
             SELECT window_start, window_end, region, count(*) AS orders,
                    sum(quantity) AS items
             FROM TUMBLE(gen, order_time, INTERVAL '1' MINUTE)
             GROUP BY window_start, window_end, region ROUTE BY region;",
            source("10")
        )
    };
    let read = |dir: &Path| {
        let regions = ["ap", "eu", "sa", "us"].map(|r| {
            format!(
                "SELECT '{r}' AS region, count(*) AS windows,
                        count(DISTINCT window_start) AS starts, sum(orders) AS orders,
                        sum(items) AS items FROM lake.by_region.{r}"
            )
        });
        query_csv(
            dir,
            CATALOG,
            &format!("{} ORDER BY 1", regions.join(" UNION ALL ")),
        )
    };
    let straight = tempfile::tempdir().unwrap();
    run_script_to_end(straight.path(), &script("1h"));
    let expected = read(straight.path());
    assert!(expected.contains("ap,401,401,"), "{expected}");
    let lost = tempfile::tempdir().unwrap();
    kill_losing_state_and_restart(lost.path(), &script("100ms"), 900);
    assert_eq!(read(lost.path()), expected);
}

/// Two windowed aggregates over two streams, joined on their windows and region: the orders
/// of each minute and region beside the returns (a second stream of orders) of the same.
const ORDERS_AND_RETURNS: &str = "SELECT o.window_start, o.window_end, o.region, o.orders,
       o.items, r.returns, r.customers
     FROM (SELECT window_start, window_end, region, count(*) AS orders, sum(quantity) AS items
           FROM TUMBLE(gen, order_time, INTERVAL '1' MINUTE)
           GROUP BY window_start, window_end, region) o
     JOIN (SELECT window_start, window_end, region, count(*) AS returns,
                  count(DISTINCT customer_id) AS customers
           FROM TUMBLE(returned, order_time, INTERVAL '1' MINUTE) WHERE status <> 'new'
           GROUP BY window_start, window_end, region) r
       ON o.window_start = r.window_start AND o.window_end = r.window_end
      AND o.region = r.region";

/// The orders and returns sources: no record late (the watermark trails by the whole disorder).
fn two_sources() -> String {
    format!(
        "{};
         CREATE SOURCE returned (WATERMARK FOR order_time AS order_time - INTERVAL '10' SECOND)
           WITH ('connector' = 'datagen', 'profile' = 'orders', 'number-of-rows' = '{}',
           'rows-per-second' = '20000', 'seed' = '7', 'time.disorder' = '10s')",
        source("10"),
        ROWS / 2
    )
}

#[test]
fn two_aggregates_joined_on_their_windows_give_the_batch_querys_rows_three_ways() {
    let script = |interval: &str| {
        format!(
            "{CATALOG};
             CREATE SCHEMA IF NOT EXISTS lake.shop;
             CREATE TABLE IF NOT EXISTS lake.shop.orders_and_returns (window_start TIMESTAMP,
               window_end TIMESTAMP, region STRING, orders BIGINT, items BIGINT,
               returns BIGINT, customers BIGINT);
             {};
             SET 'checkpoint.interval' = '{interval}';
             SET 'pipeline.name' = 'orders-and-returns';
             INSERT INTO lake.shop.orders_and_returns {ORDERS_AND_RETURNS};",
            two_sources()
        )
    };
    let rows = |dir: &Path| {
        query_csv(
            dir,
            CATALOG,
            "SELECT * FROM lake.shop.orders_and_returns ORDER BY window_start, region",
        )
    };
    let straight = tempfile::tempdir().unwrap();
    run_script_to_end(straight.path(), &script("1h"));
    let expected = rows(straight.path());
    // The returns cover the first half of the orders' time: a row per minute and region there.
    assert!(
        expected.lines().count() as u64 > ROWS / 2 / 600 * 3,
        "{expected}"
    );
    let batch = query_csv(
        straight.path(),
        &format!("{CATALOG}; {}", two_sources()),
        &format!("SELECT * FROM ({ORDERS_AND_RETURNS}) ORDER BY window_start, region"),
    );
    assert_eq!(expected, batch, "the batch query's rows");
    let plan = query_csv(
        straight.path(),
        &format!("{CATALOG}; {}", two_sources()),
        &format!("EXPLAIN INSERT INTO lake.shop.orders_and_returns {ORDERS_AND_RETURNS}"),
    );
    assert!(
        plan.contains("WindowAggregate: gby=[__floe_branch") && !plan.contains("JoinState"),
        "one aggregate's state, no join state: {plan}"
    );
    assert_same_with_checkpoints_and_kills(script, 700, rows, &expected);
}

#[test]
fn two_aggregates_not_over_windows_are_refused_with_the_alternative() {
    let dir = tempfile::tempdir().unwrap();
    let out = floe()
        .current_dir(dir.path())
        .args([
            "-q",
            "-c",
            &format!(
                "{CATALOG}; CREATE SCHEMA lake.shop; CREATE TABLE lake.shop.t (region STRING, \
                 a BIGINT, b BIGINT); {}",
                two_sources()
            ),
            "-c",
            "INSERT INTO lake.shop.t SELECT o.region, o.n, r.n FROM (SELECT region, count(*) AS n \
             FROM gen GROUP BY region) o JOIN (SELECT region, count(*) AS n FROM returned \
             GROUP BY region) r ON o.region = r.region",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && stderr.contains("it has 2 aggregates")
            && stderr.contains("only over windows"),
        "{stderr}"
    );
}
