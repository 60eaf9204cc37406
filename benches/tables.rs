//! New tables from files, whole process: the same JSON events routed to one table, to 1,000
//! tables and to 10,000, none of which exists before, each run a `floe -f` process of its own
//! on a lake of its own, timed from start to exit with its peak memory.
//!
//! ```text
//! cargo bench --bench tables                              # 1,500,000 events; 1, 1,000, 10,000
//! FLOE_BENCH_EVENTS=300000 FLOE_BENCH_TABLES=1,1000 cargo bench --bench tables
//! ```
//!
//! Targets (issue 15): 1,000 new tables in at most twice the one-table time with a peak
//! under 1 GiB; 10,000 at a third of the one-table rate or better, under 1.5 GiB. The events
//! are the ingest benchmark's (11 fields, ~285 bytes), in 8 files, their columns inferred per
//! record as a routed job's are; the route is `user_id` modulo the table count. Everything a
//! run does counts: starting, reading and routing, creating the tables and their folders, every
//! checkpoint's files and commits (the default interval, 10 s), and stopping.

use std::path::Path;

mod common;
use common::env;
use common::process::{Run, lake_script, run_script, write_events};

/// Route the events under `data` to `tables` new tables of a lake under `dir`.
fn run(dir: &Path, data: &Path, tables: u64) -> Run {
    let lake = dir.join(format!("lake-{tables}"));
    std::fs::create_dir_all(&lake).expect("lake dir");
    let d = data.display();
    let script = lake_script(
        &lake,
        &format!(
            "CREATE SOURCE events WITH ('connector' = 'filesystem', 'path' = '{d}',
               'format' = 'json');
             INSERT INTO lake.routed SELECT * FROM events
             ROUTE BY 'u_' || CAST(user_id % {tables} AS VARCHAR);"
        ),
    );
    run_script(&script, None)
}

fn main() {
    let events: u64 = env("FLOE_BENCH_EVENTS").unwrap_or(1_500_000);
    let counts: Vec<u64> = std::env::var("FLOE_BENCH_TABLES")
        .unwrap_or_else(|_| "1,1000,10000".into())
        .split(',')
        .map(|n| n.trim().parse().expect("FLOE_BENCH_TABLES: table counts"))
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    const FILES: u64 = 8;
    write_events(&data, events, FILES);
    println!("tables: {events} JSON events in {FILES} files routed to new tables, whole process");
    let mut one: Option<f64> = None;
    for tables in counts {
        let r = run(dir.path(), &data, tables);
        let (out, dead) = (r.count("records_out"), r.count("records_dead_lettered"));
        assert_eq!(out + dead, events, "every event accounted for");
        assert_eq!(dead, 0, "no dead letters");
        let made = std::fs::read_dir(dir.path().join(format!("lake-{tables}/warehouse/routed")))
            .map_or(0, |d| {
                d.filter(|e| e.as_ref().is_ok_and(|e| e.path().is_dir()))
                    .count()
            });
        assert_eq!(made as u64, tables, "tables created");
        let rate = events as f64 / r.seconds;
        let against = match (tables, one) {
            (1, _) => {
                one = Some(r.seconds);
                String::new()
            }
            (_, Some(base)) => format!(
                "   {:.2}x the 1-table time, {:.0}% of its rate",
                r.seconds / base,
                100.0 * base / r.seconds
            ),
            _ => String::new(),
        };
        println!(
            "  to {tables:>6} tables: {:>7.2} s {rate:>10.0} events/s   peak RSS {:>5.0} MiB{against}",
            r.seconds, r.peak_mib
        );
    }
    println!(
        "  targets: 1,000 tables within 2x the 1-table time, peak < 1 GiB; 10,000 at >= 33% of \
         its rate, peak < 1.5 GiB"
    );
}
