//! Routing to many tables: sustained throughput to 1,000 tables against 1 table, and peak
//! memory.
//!
//! ```text
//! cargo bench --bench routing                        # sustained, 3 checkpoints each
//! FLOE_BENCH_CHECKPOINTS=5 cargo bench --bench routing
//! FLOE_BENCH_ROWS=10000000 cargo bench --bench routing   # bounded runs, end to end
//! FLOE_BENCH_INTERVAL=1h FLOE_BENCH_WITH="WITH ('route.max-open-files' = '100')" ...
//! ```
//!
//! The same generated order stream is routed once to a single table and once to 1,000 (by
//! customer). The targets (DESIGN): the 1,000-table run keeps at least half the throughput of
//! the 1-table run, and the process stays under 1 GiB resident.
//!
//! Throughput is a continuous job's sustained rate: rows written per second from the end of
//! its first checkpoint (the tables exist, every cost is in its steady state) to the end of
//! `FLOE_BENCH_CHECKPOINTS` (3) more, each every `FLOE_BENCH_INTERVAL` (10 s), so the window
//! holds whole checkpoints: closing files and committing every table. With `FLOE_BENCH_ROWS`
//! the source is bounded instead, and the rate is rows over the whole run: creating the
//! tables and the final checkpoint included. `FLOE_BENCH_WITH` sets the routed INSERT's `WITH`
//! clause, `FLOE_BENCH_TABLES` runs one table count only (for profiling).

use std::time::Instant;

mod common;
use common::{env, peak_rss_mib};

/// The binary's allocator (see src/main.rs): memory figures are the binary's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn insert(tables: u64) -> String {
    format!(
        "INSERT INTO lake.routed{tables} SELECT * FROM orders
         ROUTE BY 'customer_' || CAST(customer_id % {tables} AS VARCHAR) {}",
        std::env::var("FLOE_BENCH_WITH").unwrap_or_default()
    )
}

/// Rows per second routed to `tables` tables.
fn run(dir: &std::path::Path, tables: u64) -> f64 {
    common::one_core().block_on(async {
        let bounded: Option<u64> = env("FLOE_BENCH_ROWS");
        let source = match bounded {
            Some(rows) => format!(", 'number-of-rows' = '{rows}'"),
            None => String::new(),
        };
        let session = common::lake_session(
            dir,
            &format!(
                "CREATE SOURCE orders WITH ('connector' = 'datagen', 'profile' = 'orders'{source});
                 SET 'pipeline.name' = 'bench-{tables}';"
            ),
        )
        .await;
        let job = |session: &floe::Session| session.jobs().rows().remove(0);
        let rate = if let Some(rows) = bounded {
            let start = Instant::now();
            session.sql(&insert(tables)).await.expect("job");
            let rate = rows as f64 / start.elapsed().as_secs_f64();
            assert_eq!(job(&session).records_out, rows, "{:?}", job(&session));
            rate
        } else {
            let checkpoints: u64 = env("FLOE_BENCH_CHECKPOINTS").unwrap_or(3);
            common::sustained_rate(
                &session,
                &format!("bench-{tables}"),
                &insert(tables),
                checkpoints,
            )
            .await
        };
        let j = job(&session);
        println!(
            "  ({tables} tables: last checkpoint {} ms, of which commits {} ms)",
            j.checkpoint_duration_ms, j.commit_duration_ms
        );
        rate
    })
}

fn main() {
    floe::process::tune();
    let dir = tempfile::tempdir().expect("tempdir");
    let mode = match env::<u64>("FLOE_BENCH_ROWS") {
        Some(rows) => format!("{rows} generated orders, end to end"),
        None => format!(
            "generated orders, sustained over {} checkpoints",
            env::<u64>("FLOE_BENCH_CHECKPOINTS").unwrap_or(3)
        ),
    };
    if let Some(tables) = env::<u64>("FLOE_BENCH_TABLES") {
        // One run only (for profiling): no ratio.
        let rate = run(dir.path(), tables);
        println!("routing: {mode}, one core");
        println!(
            "  to {tables} tables: {rate:>10.0} rows/s   peak RSS {:.0} MiB",
            peak_rss_mib()
        );
        return;
    }
    let one = run(dir.path(), 1);
    let rss_one = peak_rss_mib();
    let many = run(dir.path(), 1000);
    let rss_many = peak_rss_mib();
    println!("routing: {mode}, one core");
    println!("  to 1 table:      {one:>10.0} rows/s   peak RSS {rss_one:.0} MiB");
    println!("  to 1,000 tables: {many:>10.0} rows/s   peak RSS {rss_many:.0} MiB");
    println!(
        "  ratio: {:.0}% of the 1-table rate (target: at least 50%); peak under 1 GiB: {}",
        100.0 * many / one,
        rss_many < 1024.0
    );
}
