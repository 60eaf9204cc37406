//! Aggregates with a million groups, within their memory budget: over one window, and
//! without windows (updated at each checkpoint).
//!
//! ```text
//! cargo bench --bench state
//! FLOE_BENCH_ROWS=4000000 FLOE_BENCH_BUDGET=32mb cargo bench --bench state
//! ```
//!
//! Generated orders (one every 100 ms of event time) grouped by a key of a million values in
//! one window of a week: every group stays open until the end of the source, when the window
//! closes. The job runs twice on one core: with `state.memory-budget` at `FLOE_BENCH_BUDGET`
//! (64 MiB), so that the open windows' state goes to disk beyond it, and with a budget larger
//! than the state. Each run prints its time and the process's peak resident memory; the
//! budgeted run's peak should sit near the budget plus what a job holds anyway, well under the
//! unbounded run's. Then the same groups without a window, an aggregate updated at each
//! checkpoint (its groups' state in parts on disk beyond the budget, a part rewritten when a
//! checkpoint updates it), both ways. Each run's rows are checked against the same aggregate in
//! batch.

use std::time::Instant;

mod common;
use common::{env, peak_rss_mib, reset_peak_rss};

/// The binary's allocator (see src/main.rs): memory figures are the binary's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const GROUPS: u64 = 1_000_000;

const WINDOWED: &str = "SELECT window_start, window_end, order_id % 1000000 AS k, count(*) AS n,
       sum(price) AS total, max(price) AS top
     FROM TUMBLE(orders, order_time, INTERVAL '7' DAY)
     GROUP BY window_start, window_end, order_id % 1000000";

const UPDATING: &str = "SELECT order_id % 1000000 AS k, count(*) AS n, sum(price) AS total,
       max(price) AS top
     FROM orders GROUP BY order_id % 1000000";

/// Seconds the job took and the peak resident memory (MiB), with `budget`, over one window
/// or updating.
fn run(dir: &std::path::Path, rows: u64, budget: &str, windowed: bool) -> (f64, f64) {
    let (query, table, columns) = match windowed {
        true => (
            WINDOWED,
            format!("groups_{budget}"),
            "window_start TIMESTAMP, window_end TIMESTAMP, k BIGINT, n BIGINT, total DOUBLE, \
             top DOUBLE",
        ),
        false => (
            UPDATING,
            format!("updated_{budget}"),
            "k BIGINT, n BIGINT, total DOUBLE, top DOUBLE, PRIMARY KEY (k) NOT ENFORCED",
        ),
    };
    common::one_core().block_on(async {
        let session = common::lake_session(
            dir,
            &format!(
                "CREATE SCHEMA IF NOT EXISTS lake.state;
                 CREATE TABLE lake.state.{table} ({columns});
                 CREATE SOURCE IF NOT EXISTS orders (WATERMARK FOR order_time AS order_time)
                   WITH ('connector' = 'datagen', 'profile' = 'orders',
                   'number-of-rows' = '{rows}', 'seed' = '3');
                 SET 'state.memory-budget' = '{budget}';
                 SET 'checkpoint.interval' = '5s';
                 SET 'pipeline.name' = '{table}';"
            ),
        )
        .await;
        reset_peak_rss();
        let start = Instant::now();
        session
            .sql(&format!("INSERT INTO lake.state.{table} {query}"))
            .await
            .expect("the job");
        let seconds = start.elapsed().as_secs_f64();
        let peak = peak_rss_mib();
        let totals = "count(*) AS groups, sum(n) AS n, round(sum(total)) AS total";
        let written = common::text(
            &session,
            &format!("SELECT {totals} FROM lake.state.{table}"),
        )
        .await;
        let batch = common::text(&session, &format!("SELECT {totals} FROM ({query})")).await;
        assert_eq!(written, batch, "the job's groups are the batch query's");
        (seconds, peak)
    })
}

/// The peak resident memory (MiB) of a job over the same orders that keeps no state (it
/// filters every order out): what the process holds besides the state.
fn stateless(dir: &std::path::Path, rows: u64) -> f64 {
    common::one_core().block_on(async {
        let session = common::lake_session(
            dir,
            &format!(
                "CREATE SCHEMA IF NOT EXISTS lake.state;
                 CREATE TABLE lake.state.none (k BIGINT);
                 CREATE SOURCE IF NOT EXISTS orders (WATERMARK FOR order_time AS order_time)
                   WITH ('connector' = 'datagen', 'profile' = 'orders',
                   'number-of-rows' = '{rows}', 'seed' = '3');
                 SET 'pipeline.name' = 'none';"
            ),
        )
        .await;
        reset_peak_rss();
        session
            .sql(
                "INSERT INTO lake.state.none SELECT order_id % 1000000 FROM orders WHERE price < 0",
            )
            .await
            .expect("the job");
        peak_rss_mib()
    })
}

fn main() {
    floe::process::tune();
    let rows: u64 = env("FLOE_BENCH_ROWS").unwrap_or(2_000_000);
    let budget: String = env("FLOE_BENCH_BUDGET").unwrap_or_else(|| "64mb".to_string());
    assert!(
        rows >= GROUPS,
        "FLOE_BENCH_ROWS: at least {GROUPS} rows for {GROUPS} groups"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let base = stateless(dir.path(), rows);
    println!("a job over the same orders keeping no state: peak RSS {base:.0} MiB");
    for (windowed, what) in [
        (true, "open groups (one window)"),
        (false, "groups updated at each 5 s checkpoint"),
    ] {
        let (spilled_s, spilled_rss) = run(dir.path(), rows, &budget, windowed);
        let (memory_s, memory_rss) = run(dir.path(), rows, "64gb", windowed);
        println!("state: {GROUPS} {what}, {rows} orders, one core");
        println!(
            "  state.memory-budget {budget:>5}: {spilled_s:>7.2} s   peak RSS {spilled_rss:>6.0} MiB"
        );
        println!("  state.memory-budget  64gb: {memory_s:>7.2} s   peak RSS {memory_rss:>6.0} MiB");
        println!(
            "  budgeted peak: {:.0}% of the unbounded run's, time {:.2}x; above the stateless \
             job's: {:.0} MiB with the budget, {:.0} MiB without",
            100.0 * spilled_rss / memory_rss,
            spilled_s / memory_s,
            spilled_rss - base,
            memory_rss - base
        );
    }
}
