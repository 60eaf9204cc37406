//! One job on one core and on every core the bench may use: the same JSON events from files
//! into Iceberg, each run a whole `floe -f` process pinned to its cores (CPU affinity), on a
//! lake of its own.
//!
//! ```text
//! cargo bench --bench cores                        # 1,500,000 events, best of 2 runs each
//! FLOE_BENCH_EVENTS=500000 FLOE_BENCH_REPEAT=1 cargo bench --bench cores
//! ```
//!
//! Target (issue 15): one job on 2 cores at least 1.7x its one-core rate, by default
//! (`parallelism.default` unset: every core). Two jobs: declared columns into one table, and
//! columns inferred per record routed by event type to four tables. Everything a run does
//! counts: starting, reading, decoding, writing, the checkpoints (10 s) and stopping.

use std::path::Path;

mod common;
use common::process::{allowed_cpus, lake_script, run_script, write_events};
use common::{EVENT_COLUMNS, env};

/// The jobs: a name and the script's statements after the catalog, with `{d}` the events'
/// folder.
const JOBS: [(&str, &str); 2] = [
    (
        "declared, one table",
        "CREATE SCHEMA lake.bench;
         CREATE TABLE lake.bench.events ({columns})
           WITH ('write.parquet.compression-codec' = 'zstd');
         CREATE SOURCE events ({columns})
           WITH ('connector' = 'filesystem', 'path' = '{d}', 'format' = 'json');
         INSERT INTO lake.bench.events SELECT * FROM events;",
    ),
    (
        "inferred, routed to 4",
        "CREATE SOURCE events WITH ('connector' = 'filesystem', 'path' = '{d}', 'format' = 'json');
         INSERT INTO lake.routed SELECT * FROM events ROUTE BY event_type
           WITH ('table.properties.write.parquet.compression-codec' = 'zstd');",
    ),
];

/// Run `job` on `cores` cores on a lake of its own under `dir`: wall seconds.
fn run(dir: &Path, data: &Path, job: &str, cores: usize, events: u64) -> f64 {
    let lake = tempfile::tempdir_in(dir).expect("lake dir");
    let statements = job
        .replace("{columns}", EVENT_COLUMNS)
        .replace("{d}", &data.display().to_string());
    let script = lake_script(lake.path(), &statements);
    let r = run_script(&script, Some(cores));
    assert_eq!(r.count("records_out"), events, "every event written");
    r.seconds
}

fn main() {
    let events: u64 = env("FLOE_BENCH_EVENTS").unwrap_or(1_500_000);
    let repeat: usize = env("FLOE_BENCH_REPEAT").unwrap_or(2);
    let all = allowed_cpus().len();
    assert!(all >= 2, "the bench needs 2 cores, it may use {all}");
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    write_events(&data, events, 8);
    println!("cores: {events} JSON events in 8 files, whole process, best of {repeat}");
    for (name, job) in JOBS {
        let mut best = [f64::INFINITY; 2];
        for _ in 0..repeat {
            for (i, cores) in [1, all].into_iter().enumerate() {
                best[i] = best[i].min(run(dir.path(), &data, job, cores, events));
            }
        }
        let [one, every] = best;
        println!(
            "  {name:<22} 1 core {one:>6.2} s {:>9.0} events/s   {all} cores {every:>6.2} s \
             {:>9.0} events/s   {:.2}x",
            events as f64 / one,
            events as f64 / every,
            one / every
        );
    }
    println!("  target: {all} cores at least 1.7x the one-core rate");
}
