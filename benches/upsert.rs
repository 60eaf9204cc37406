//! Keeping one row per key: a job upserting generated orders by key into a table with a
//! primary key, against the same job appending them to a table without one.
//!
//! ```text
//! cargo bench --bench upsert
//! FLOE_BENCH_KEYS=1000000 FLOE_BENCH_CHANGES=10000000 cargo bench --bench upsert
//! ```
//!
//! Both runs read `FLOE_BENCH_CHANGES` (2 M) generated orders, keyed `order_id %
//! FLOE_BENCH_KEYS` (200,000), with a checkpoint every `FLOE_BENCH_INTERVAL` (2 s), to the
//! end; the keyed table's job compacts it as it runs (`maintenance.compaction`).
//! `FLOE_BENCH_INDEX_MEMORY` (say `16mb`) sets the key index's budget
//! (`floe.key-index.memory`): beyond it the index is on disk. The target
//! (the change-data-capture issue, at 10 M changes over 1 M keys): the upsert rate at least
//! 50% of the append rate, within a memory budget; a query over the upserted table within
//! 2x of the same query after compacting it fully.

mod common;
use std::time::Instant;

use common::{env, peak_rss_mib, reset_peak_rss};

/// The binary's allocator (see src/main.rs).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// What one run measured.
struct Run {
    /// The seconds the job took to read every change.
    seconds: f64,
    /// The job's peak resident memory (MiB), the queries after it not counted.
    peak: f64,
    /// The rows its table holds.
    rows: String,
    /// The queries' times.
    query: String,
}

fn run(dir: &std::path::Path, keyed: bool) -> Run {
    let keys: u64 = env("FLOE_BENCH_KEYS").unwrap_or(200_000);
    let changes: u64 = env("FLOE_BENCH_CHANGES").unwrap_or(2_000_000);
    if std::env::var("FLOE_BENCH_INTERVAL").is_err() {
        // SAFETY: set before any thread of this benchmark reads the environment.
        unsafe { std::env::set_var("FLOE_BENCH_INTERVAL", "2s") };
    }
    let name = if keyed { "keyed" } else { "plain" };
    let key = if keyed {
        ", PRIMARY KEY (k) NOT ENFORCED"
    } else {
        ""
    };
    // The key index's memory budget (a small one puts it on disk).
    let with = match std::env::var("FLOE_BENCH_INDEX_MEMORY") {
        Ok(m) if keyed => format!(" WITH ('floe.key-index.memory' = '{m}')"),
        _ => String::new(),
    };
    // The keyed table is maintained as a user would keep it: compacted as the job runs.
    let maintained = if keyed {
        " SET 'maintenance.compaction' = 'on'; SET 'maintenance.interval' = '2s';"
    } else {
        ""
    };
    common::one_core().block_on(async {
        let session = common::lake_session(
            &dir.join(name),
            &format!(
                "CREATE SCHEMA lake.b;
                 CREATE TABLE lake.b.{name} (k BIGINT NOT NULL, order_id BIGINT, customer_id BIGINT,
                   amount DOUBLE, region STRING, status STRING{key}){with};
                 CREATE SOURCE orders WITH ('connector' = 'datagen', 'profile' = 'orders',
                   'number-of-rows' = '{changes}');
                 SET 'pipeline.name' = '{name}';{maintained}"
            ),
        )
        .await;
        reset_peak_rss();
        let began = Instant::now();
        session
            .sql(&format!(
                "INSERT INTO lake.b.{name} SELECT order_id % {keys}, order_id, customer_id,
                   quantity * price, region, status FROM orders"
            ))
            .await
            .expect("job");
        let seconds = began.elapsed().as_secs_f64();
        let peak = peak_rss_mib();
        let rows = common::text(
            &session,
            &format!("SELECT count(*) AS n, count(DISTINCT k) AS keys FROM lake.b.{name}"),
        )
        .await;
        let query = format!(
            "SELECT region, count(*), round(sum(amount), 2) FROM lake.b.{name} GROUP BY region \
             ORDER BY region"
        );
        let before = Instant::now();
        session.sql(&query).await.expect("query");
        let query_time = before.elapsed().as_secs_f64();
        let compacted = if keyed {
            session
                .sql(&format!(
                    "CALL lake.system.rewrite_data_files(table => 'b.{name}')"
                ))
                .await
                .expect("compact");
            let again = Instant::now();
            session.sql(&query).await.expect("query");
            format!(
                "query {:.3} s, after compaction {:.3} s ({:.1}x)",
                query_time,
                again.elapsed().as_secs_f64(),
                query_time / again.elapsed().as_secs_f64()
            )
        } else {
            format!("query {query_time:.3} s")
        };
        Run {
            seconds,
            peak,
            rows,
            query: compacted,
        }
    })
}

fn main() {
    floe::process::tune();
    let keys: u64 = env("FLOE_BENCH_KEYS").unwrap_or(200_000);
    let changes: u64 = env("FLOE_BENCH_CHANGES").unwrap_or(2_000_000);
    let dir = tempfile::tempdir().expect("tempdir");
    let plain = run(dir.path(), false);
    let keyed = run(dir.path(), true);
    println!("upsert: {changes} generated orders over {keys} keys, one core, to the end");
    for (name, r) in [("append", &plain), ("upsert", &keyed)] {
        println!(
            "  {name}: {:>10.0} rows/s, job peak RSS {:.0} MiB  ({}) {}",
            changes as f64 / r.seconds,
            r.peak,
            r.query,
            r.rows
        );
    }
    println!(
        "  ratio: {:.0}% of the append rate (target: at least 50%); peak RSS {:.0} MiB since \
         the upsert job started (its queries too)",
        100.0 * plain.seconds / keyed.seconds,
        peak_rss_mib()
    );
}
