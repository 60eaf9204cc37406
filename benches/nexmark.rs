//! The Nexmark queries under `benches/nexmark/`, each timed as a continuous job on one core.
//!
//! ```text
//! cargo bench --bench nexmark                          # every query, 5 M events
//! FLOE_BENCH_EVENTS=10000000 cargo bench --bench nexmark
//! FLOE_BENCH_QUERIES=q0,q18 cargo bench --bench nexmark
//! ```
//!
//! The three streams (datagen `nexmark.person`, `.auction`, `.bid`: one consistent world, 1
//! person, 3 auctions and 46 bids in every 50 events) are bounded to `FLOE_BENCH_EVENTS`
//! events in all. Each query's job runs to the end of its sources (table creation and its
//! final checkpoint included, checkpoints every 10 s) and its rate is the events of the
//! streams it reads over that time (floe generates only those; Flink's generator makes every
//! event and its queries filter them, so this counts fewer events than Nexmark would). It is
//! printed next to the per-core figures Flink published (nexmark's `GUIDE_V1.md`: 8 cores,
//! RocksDB, exactly-once checkpoints every 3 minutes, 100 M events); Arroyo and RisingWave
//! publish no per-query, per-core figures. Results are checked by
//! `tests/interop/test_nexmark.py`.

use std::path::Path;
use std::time::Instant;

mod common;
use common::{env, peak_rss_mib, reset_peak_rss};

/// The binary's allocator (see src/main.rs): memory figures are the binary's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Flink's published throughput per core, in thousands of events per second.
const FLINK_K_PER_CORE: [(&str, f64); 22] = [
    ("q0", 155.0),
    ("q1", 158.0),
    ("q2", 175.0),
    ("q3", 152.0),
    ("q4", 34.3),
    ("q5", 22.1),
    ("q7", 12.3),
    ("q8", 146.0),
    ("q9", 14.2),
    ("q10", 57.8),
    ("q11", 39.7),
    ("q12", 75.7),
    ("q13", 131.0),
    ("q14", 161.0),
    ("q15", 72.4),
    ("q16", 18.7),
    ("q17", 117.0),
    ("q18", 53.7),
    ("q19", 44.0),
    ("q20", 19.0),
    ("q21", 98.5),
    ("q22", 130.0),
];

/// The statements of a query file, comments left out.
fn statements(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).expect("query file");
    let code: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect();
    code.join("\n")
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// The query files, by name (q0, q1, ...), in query order.
fn queries(dir: &Path) -> Vec<(String, std::path::PathBuf)> {
    let only: Option<String> = env("FLOE_BENCH_QUERIES");
    let only: Option<Vec<&str>> = only.as_deref().map(|q| q.split(',').collect());
    let mut out: Vec<(String, std::path::PathBuf)> = std::fs::read_dir(dir)
        .expect("benches/nexmark")
        .filter_map(|e| {
            let path = e.ok()?.path();
            let name = path.file_stem()?.to_str()?.to_string();
            (path.extension()? == "sql").then_some((name, path))
        })
        .filter(|(name, _)| only.as_ref().is_none_or(|o| o.contains(&name.as_str())))
        .collect();
    out.sort_by_key(|(name, _)| name[1..].parse::<u32>().unwrap_or(u32::MAX));
    out
}

fn main() {
    floe::process::tune();
    let events: u64 = env("FLOE_BENCH_EVENTS").unwrap_or(5_000_000);
    let dir = tempfile::tempdir().expect("tempdir");
    let files = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/nexmark");
    println!(
        "nexmark: {events} events ({} persons, {} auctions, {} bids), one core, release",
        events / 50,
        events * 3 / 50,
        events * 46 / 50
    );
    println!(
        "  {:<5} {:>10} {:>9} {:>12} {:>14} {:>9} {:>10} {:>9}",
        "query", "events", "seconds", "K events/s", "Flink K ev/s", "ratio", "rows out", "peak MiB"
    );
    let runtime = common::one_core();
    runtime.block_on(async {
        let session = common::lake_session(
            dir.path(),
            &format!(
                "CREATE SCHEMA lake.nexmark;
                 CREATE SOURCE person (WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND)
                   WITH ('connector' = 'datagen', 'profile' = 'nexmark.person',
                   'number-of-rows' = '{}');
                 CREATE SOURCE auction (WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND)
                   WITH ('connector' = 'datagen', 'profile' = 'nexmark.auction',
                   'number-of-rows' = '{}');
                 CREATE SOURCE bid (WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND)
                   WITH ('connector' = 'datagen', 'profile' = 'nexmark.bid',
                   'number-of-rows' = '{}');",
                events / 50,
                events * 3 / 50,
                events * 46 / 50
            ),
        )
        .await;
        for (name, path) in queries(&files) {
            let mut statements = statements(&path);
            let insert = statements.pop().expect("a query file ends with its INSERT");
            session
                .sql(&format!("SET 'pipeline.name' = 'nexmark-{name}'"))
                .await
                .expect("set");
            for s in &statements {
                session.sql(s).await.expect("the query's setup");
            }
            reset_peak_rss();
            let start = Instant::now();
            session.sql(&insert).await.expect("the query's job");
            let seconds = start.elapsed().as_secs_f64();
            let job = session
                .jobs()
                .rows()
                .into_iter()
                .find(|r| r.name == format!("nexmark-{name}"))
                .expect("the job");
            assert!(job.error.is_none(), "{name}: {job:?}");
            // The events of the streams the query reads: floe generates only those (Flink's
            // generator makes every event, and its queries filter them).
            let words: Vec<String> = insert
                .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
                .filter(|w| !w.is_empty())
                .map(str::to_ascii_lowercase)
                .collect();
            let reads = |stream: &str| {
                words.windows(2).any(|w| {
                    ["from", "join", "tumble", "hop", "cumulate", "session"].contains(&w[0].as_str())
                        && w[1] == stream
                })
            };
            let read: u64 = [("person", 1), ("auction", 3), ("bid", 46)]
                .iter()
                .filter(|(stream, _)| reads(stream))
                .map(|(_, share)| events * share / 50)
                .sum();
            let rate = read as f64 / seconds / 1000.0;
            let flink = FLINK_K_PER_CORE.iter().find(|(q, _)| *q == name);
            let (flink, ratio) = match flink {
                Some((_, f)) => (format!("{f:.1}"), format!("{:.2}x", rate / f)),
                None => ("-".to_string(), "-".to_string()),
            };
            println!(
                "  {name:<5} {read:>10} {seconds:>9.2} {rate:>12.1} {flink:>14} {ratio:>9} {:>10} {:>9.0}",
                job.records_out,
                peak_rss_mib()
            );
        }
    });
}
