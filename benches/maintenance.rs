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

/// CPU seconds the maintenance runtime's threads (`floe-maintain`) have used (Linux).
fn maintenance_cpu_seconds() -> f64 {
    let ticks = 100.0; // USER_HZ
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return f64::NAN;
    };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.trim() == "floe-maintain")
        })
        .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
        .map(|stat| {
            // Fields after the command (which is in parentheses): utime and stime are the
            // 12th and 13th.
            let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
            let f: Vec<f64> = rest
                .split_whitespace()
                .map(|v| v.parse().unwrap_or(0.0))
                .collect();
            (f.get(11).unwrap_or(&0.0) + f.get(12).unwrap_or(&0.0)) / ticks
        })
        .sum()
}

/// What one run measured.
struct Measured {
    rate: f64,
    files_per_table: f64,
    /// Tables whose latest maintenance run compacted, and tables maintained at all.
    compacted: usize,
    maintained: usize,
    tables: usize,
    /// The share of one core the maintenance threads used over the run.
    cpu: f64,
}

/// The sustained rate, the data files per table at the end, and what maintenance did.
fn run(dir: &std::path::Path, maintained: bool) -> Measured {
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
    let cpu_before = maintenance_cpu_seconds();
    let began = std::time::Instant::now();
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
        if let Some((_, table, h)) = health.iter().find(|(_, _, h)| h.error.is_some()) {
            println!("  ({name}: {table}: maintenance failed: {:?})", h.error);
        }
        Measured {
            rate,
            files_per_table: per_table,
            compacted,
            maintained: health
                .iter()
                .filter(|(_, _, h)| h.maintained_at_ms.is_some())
                .count(),
            tables: health.len(),
            cpu: (maintenance_cpu_seconds() - cpu_before) / began.elapsed().as_secs_f64(),
        }
    })
}

fn main() {
    floe::process::tune();
    let dir = tempfile::tempdir().expect("tempdir");
    let plain = run(dir.path(), false);
    let kept = run(dir.path(), true);
    println!("maintenance: generated orders routed by customer, sustained, one core for the job");
    println!(
        "  without maintenance: {:>10.0} rows/s   {:>6.0} data files per table",
        plain.rate, plain.files_per_table
    );
    println!(
        "  with maintenance:    {:>10.0} rows/s   {:>6.0} data files per table",
        kept.rate, kept.files_per_table
    );
    println!(
        "  maintenance: {} of {} tables maintained, {} compacted by their last run; its threads \
         used {:.0}% of one core (budget 25%)",
        kept.maintained,
        kept.tables,
        kept.compacted,
        100.0 * kept.cpu
    );
    println!(
        "  ratio: {:.0}% of the rate without (target: at least 85%); peak RSS {:.0} MiB",
        100.0 * kept.rate / plain.rate,
        peak_rss_mib()
    );
}
