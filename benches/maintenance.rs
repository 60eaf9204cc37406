//! Maintenance inside a running job: the job's sustained rate with compaction and snapshot
//! expiry on, against the same job without.
//!
//! ```text
//! cargo bench --bench maintenance
//! FLOE_BENCH_CHECKPOINTS=10 FLOE_BENCH_INTERVAL=2s FLOE_BENCH_TABLES=100 cargo bench --bench maintenance
//! ```
//!
//! A generated order stream is routed to `FLOE_BENCH_TABLES` (10) tables, partitioned by
//! region, with a checkpoint every `FLOE_BENCH_INTERVAL` (1 s): many small files. It runs
//! once as it is and once with `maintenance.compaction` and `maintenance.snapshot-retention`
//! (every 2 s, within the default budget: a quarter of one core, 256 MiB). The rate is the
//! sustained one over `FLOE_BENCH_CHECKPOINTS` (20) checkpoints after the first. The target
//! (the maintenance issue): with maintenance on, at least 85% of the rate without; the
//! files per table show that it did its work.

mod common;
use common::{env, peak_rss_mib};

/// The binary's allocator (see src/main.rs).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The sustained rate, the data files per table at the end, and the tables a maintenance
/// run compacted.
fn run(dir: &std::path::Path, maintained: bool) -> (f64, f64, usize) {
    let tables: u64 = env("FLOE_BENCH_TABLES").unwrap_or(10);
    let checkpoints: u64 = env("FLOE_BENCH_CHECKPOINTS").unwrap_or(20);
    let name = if maintained { "maintained" } else { "plain" };
    let with = if maintained {
        ", 'maintenance.compaction' = 'on', 'maintenance.interval' = '2s', \
         'maintenance.snapshot-retention' = '10s'"
    } else {
        ""
    };
    if std::env::var("FLOE_BENCH_INTERVAL").is_err() {
        // SAFETY: set before any thread of this benchmark reads the environment.
        unsafe { std::env::set_var("FLOE_BENCH_INTERVAL", "1s") };
    }
    common::one_core().block_on(async {
        let session = common::lake_session(
            &dir.join(name),
            &format!(
                "CREATE SOURCE orders WITH ('connector' = 'datagen', 'profile' = 'orders');
                 SET 'pipeline.name' = '{name}';"
            ),
        )
        .await;
        let insert = format!(
            "INSERT INTO lake.{name} SELECT * FROM orders
             ROUTE BY 'customer_' || CAST(customer_id % {tables} AS VARCHAR)
             WITH ('partition.candidates' = 'region'{with})"
        );
        let rate = common::sustained_rate(&session, name, &insert, checkpoints).await;
        let health = session.jobs().table_health();
        let per_table = health
            .iter()
            .map(|(_, _, h)| h.data_files as f64)
            .sum::<f64>()
            / health.len().max(1) as f64;
        let compacted = health
            .iter()
            .filter(|(_, _, h)| {
                h.maintenance
                    .as_deref()
                    .is_some_and(|m| m.contains("compacted"))
            })
            .count();
        if let Some((_, table, h)) = health.first() {
            println!(
                "  ({name}: {table}: last run {:?}, error {:?})",
                h.maintenance, h.error
            );
        }
        (rate, per_table, compacted)
    })
}

fn main() {
    floe::process::tune();
    let dir = tempfile::tempdir().expect("tempdir");
    let (plain, plain_files, _) = run(dir.path(), false);
    let (kept, kept_files, compacted) = run(dir.path(), true);
    println!("maintenance: generated orders routed by customer, sustained, one core for the job");
    println!(
        "  without maintenance: {plain:>10.0} rows/s   {plain_files:>6.0} data files per table"
    );
    println!(
        "  with maintenance:    {kept:>10.0} rows/s   {kept_files:>6.0} data files per table \
         ({compacted} tables compacted by their last run)"
    );
    println!(
        "  ratio: {:.0}% of the rate without (target: at least 85%); peak RSS {:.0} MiB",
        100.0 * kept / plain,
        peak_rss_mib()
    );
}
