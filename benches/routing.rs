//! Routing to many tables: throughput to 1,000 tables against 1 table, and peak memory.
//!
//! ```text
//! cargo bench --bench routing                    # 400,000 rows
//! FLOE_BENCH_ROWS=10000000 cargo bench --bench routing
//! FLOE_BENCH_INTERVAL=1h FLOE_BENCH_WITH="WITH ('route.max-open-tables' = '100')" ...
//! ```
//!
//! `FLOE_BENCH_INTERVAL` sets the checkpoint interval (10 s), `FLOE_BENCH_WITH` the routed
//! INSERT's `WITH` clause.
//!
//! The same generated order stream is routed once to a single table and once to 1,000
//! (by customer). The targets (DESIGN): the 1,000-table run keeps at least half the
//! throughput of the 1-table run, and the process stays under 1 GiB resident.

use std::time::Instant;

mod common;

/// The binary's allocator (see src/main.rs): memory figures are the binary's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Peak resident memory of this process so far, in MiB (Linux).
fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn run(dir: &std::path::Path, rows: u64, tables: u64) -> f64 {
    common::one_core().block_on(async {
        let session = common::lake_session(
            dir,
            &format!(
                "CREATE SOURCE orders WITH ('connector' = 'datagen', 'profile' = 'orders',
                   'number-of-rows' = '{rows}');
                 SET 'pipeline.name' = 'bench-{tables}';"
            ),
        )
        .await;
        let start = Instant::now();
        session
            .sql(&format!(
                "INSERT INTO lake.routed{tables} SELECT * FROM orders
                 ROUTE BY 'customer_' || CAST(customer_id % {tables} AS VARCHAR) {}",
                std::env::var("FLOE_BENCH_WITH").unwrap_or_default()
            ))
            .await
            .expect("job");
        let rate = rows as f64 / start.elapsed().as_secs_f64();
        let job = &session.jobs().rows()[0];
        assert_eq!(job.records_out, rows, "{job:?}");
        println!(
            "  ({tables} tables: last checkpoint {} ms, of which commits {} ms)",
            job.checkpoint_duration_ms, job.commit_duration_ms
        );
        rate
    })
}

fn main() {
    let rows: u64 = std::env::var("FLOE_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400_000);
    let dir = tempfile::tempdir().expect("tempdir");
    let one = run(dir.path(), rows, 1);
    let rss_one = peak_rss_mib();
    let many = run(dir.path(), rows, 1000);
    let rss_many = peak_rss_mib();
    println!("routing: {rows} generated orders, one core");
    println!("  to 1 table:      {one:>10.0} rows/s   peak RSS {rss_one:.0} MiB");
    println!("  to 1,000 tables: {many:>10.0} rows/s   peak RSS {rss_many:.0} MiB");
    println!(
        "  ratio: {:.0}% of the 1-table rate (target: at least 50%); peak under 1 GiB: {}",
        100.0 * many / one,
        rss_many < 1024.0
    );
}
