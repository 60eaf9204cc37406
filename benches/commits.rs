//! Commit cost as the tables' history grows: how long a checkpoint's table commits take when
//! it touches 100 tables, early on and after 1,000 earlier commits to each.
//!
//! ```text
//! cargo bench --bench commits
//! FLOE_BENCH_COMMITS=300 FLOE_BENCH_TABLES=20 cargo bench --bench commits
//! ```
//!
//! A generated order stream (`FLOE_BENCH_RATE`, 5,000 rows/s) is routed by customer to
//! `FLOE_BENCH_TABLES` (100) tables on the sqlite catalog, checkpointing every
//! `FLOE_BENCH_INTERVAL` (100 ms): each checkpoint commits to nearly every table, and the
//! checkpoints follow each other as fast as their commits allow. The bench reads each
//! checkpoint's commit time (`SHOW JOBS`' `commit_ms`: from the first table commit to the
//! last) and prints the median and the slowest of each stretch of the run, up to
//! `FLOE_BENCH_COMMITS` (1,000) checkpoints. The target (issue 15): under 1 s, and the same
//! after 1,000 commits.

use std::time::{Duration, Instant};

mod common;
use common::{env, peak_rss_mib};

/// The binary's allocator (see src/main.rs).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The median and the largest of `ms`.
fn median_max(ms: &mut [u64]) -> (u64, u64) {
    ms.sort_unstable();
    (ms[ms.len() / 2], ms[ms.len() - 1])
}

fn main() {
    floe::process::tune();
    let tables: u64 = env("FLOE_BENCH_TABLES").unwrap_or(100);
    let commits: u64 = env("FLOE_BENCH_COMMITS").unwrap_or(1000);
    let rate: u64 = env("FLOE_BENCH_RATE").unwrap_or(5000);
    if std::env::var("FLOE_BENCH_INTERVAL").is_err() {
        // SAFETY: set before any other thread starts.
        unsafe { std::env::set_var("FLOE_BENCH_INTERVAL", "100ms") };
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let started = Instant::now();
    // Commit time by checkpoint.
    let seen: Vec<(u64, u64)> = common::one_core().block_on(async {
        let session = common::lake_session(
            dir.path(),
            &format!(
                "CREATE SOURCE orders WITH ('connector' = 'datagen', 'profile' = 'orders',
                   'rows-per-second' = '{rate}');
                 SET 'pipeline.name' = 'commits'; SET 'table.dml-sync' = 'false';"
            ),
        )
        .await;
        session
            .sql(&format!(
                "INSERT INTO lake.history SELECT * FROM orders
                 ROUTE BY 'customer_' || CAST(customer_id % {tables} AS VARCHAR)"
            ))
            .await
            .expect("job");
        let mut seen = Vec::new();
        let mut last = 0;
        while last < commits {
            let job = session.jobs().rows().remove(0);
            assert!(job.error.is_none(), "{job:?}");
            if job.checkpoint > last {
                last = job.checkpoint;
                seen.push((last, job.commit_duration_ms));
                if last.is_multiple_of(100) {
                    eprintln!(
                        "  checkpoint {last}: commits {} ms ({:.0} s)",
                        job.commit_duration_ms,
                        started.elapsed().as_secs_f64()
                    );
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        session.sql("STOP JOB 'commits'").await.expect("stop job");
        seen
    });
    println!(
        "commits: {tables} tables, {rate} rows/s, a checkpoint every {} (sqlite catalog, \
         local warehouse), {} checkpoints in {:.0} s",
        std::env::var("FLOE_BENCH_INTERVAL").unwrap_or_default(),
        seen.len(),
        started.elapsed().as_secs_f64()
    );
    println!("  checkpoints        commit ms: median   max");
    let stretch = (commits / 10).max(1);
    let mut early = 0;
    for from in (0..commits).step_by(stretch as usize) {
        let mut ms: Vec<u64> = seen
            .iter()
            .filter(|(c, _)| *c > from.max(1) && *c <= from + stretch)
            .map(|(_, ms)| *ms)
            .collect();
        if ms.is_empty() {
            continue;
        }
        let (median, max) = median_max(&mut ms);
        if early == 0 {
            early = median.max(1);
        }
        println!(
            "  {:>5} - {:<5}                {median:>6} {max:>6}",
            from.max(1) + 1,
            from + stretch
        );
    }
    let mut last: Vec<u64> = seen.iter().rev().take(10).map(|(_, ms)| *ms).collect();
    let (median, _) = median_max(&mut last);
    println!(
        "  after {commits} commits: median {median} ms, {:.1}x the first stretch's; \
         target under 1,000 ms: {}; peak RSS {:.0} MiB",
        median as f64 / early as f64,
        median < 1000,
        peak_rss_mib()
    );
}
