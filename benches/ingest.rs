//! Ingest throughput: JSON events -> an Iceberg table on local disk, one core, against the
//! machine's own limit measured in the same run.
//!
//! ```text
//! cargo bench --bench ingest                 # 400,000 events
//! FLOE_BENCH_EVENTS=2000000 cargo bench --bench ingest
//! cargo bench --bench ingest -- inferred     # one run alone (baseline, declared, inferred)
//! ```
//!
//! The whole process is pinned to one core (the first the process may use), so the job's
//! threads (reader, writer, the runtime) share it as they would on a one-core machine.
//!
//! The baseline is the machine's limit with Arrow's own parts: the same bytes decoded by
//! arrow-json and encoded as zstd Parquet, in one thread, with nothing around it (the faster
//! of 4,096 and 8,192 records a batch). floe decodes records of the columns in their order
//! with a decoder of its own (`format/flat_json.rs`), one pass a record where arrow-json
//! takes two, so it can pass this limit. floe runs a continuous job
//! (filesystem source, declared columns) into a sqlite-catalog table on one runtime thread.
//! The target (DESIGN) is at least 70% of the baseline.

use std::io::Cursor;
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::arrow::json::ReaderBuilder;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::basic::{Compression, ZstdLevel};
use datafusion::parquet::file::properties::WriterProperties;

mod common;
use common::EVENT_COLUMNS as COLUMNS;

/// The binary's allocator (see src/main.rs): figures are the binary's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("event_id", DataType::Int64, true),
        Field::new("event_type", DataType::Utf8, true),
        Field::new(
            "event_time",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            true,
        ),
        Field::new("user_id", DataType::Int64, true),
        Field::new("session_id", DataType::Utf8, true),
        Field::new("region", DataType::Utf8, true),
        Field::new("amount", DataType::Float64, true),
        Field::new("url", DataType::Utf8, true),
        Field::new("device", DataType::Utf8, true),
        Field::new("ok", DataType::Boolean, true),
        Field::new("tags", DataType::Utf8, true),
    ]))
}

/// arrow-json decode + zstd Parquet encode of `text`, `batch` records at a time, one thread:
/// records per second.
fn baseline(text: &str, events: u64, batch: usize) -> f64 {
    let start = Instant::now();
    let reader = ReaderBuilder::new(schema())
        .with_batch_size(batch)
        .build(Cursor::new(text.as_bytes()))
        .expect("reader");
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .build();
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, schema(), Some(props)).expect("writer");
    let mut rows = 0;
    for batch in reader {
        let batch = batch.expect("decode");
        rows += batch.num_rows() as u64;
        writer.write(&batch).expect("encode");
    }
    writer.close().expect("close");
    assert_eq!(rows, events);
    events as f64 / start.elapsed().as_secs_f64()
}

/// How floe reads the events.
#[derive(Clone, Copy)]
enum Job {
    /// Declared columns, into one table.
    Declared,
    /// Columns inferred per record, routed by event type (four tables).
    InferredRouted,
}

/// floe: a continuous job from JSON files to Iceberg: records per second.
fn floe_job(dir: &std::path::Path, events: u64, job: Job) -> f64 {
    common::one_core().block_on(async {
        let d = dir.display();
        let (setup, insert) = match job {
            Job::Declared => (
                format!(
                    "CREATE SCHEMA lake.bench;
                     CREATE TABLE lake.bench.events ({COLUMNS})
                     WITH ('write.parquet.compression-codec' = 'zstd');
                     CREATE SOURCE events ({COLUMNS})
                     WITH ('connector' = 'filesystem', 'path' = '{d}/data', 'format' = 'json');
                     SET 'pipeline.name' = 'declared';"
                ),
                "INSERT INTO lake.bench.events SELECT * FROM events",
            ),
            Job::InferredRouted => (
                format!(
                    "CREATE SOURCE inferred
                     WITH ('connector' = 'filesystem', 'path' = '{d}/data', 'format' = 'json');
                     SET 'pipeline.name' = 'inferred';"
                ),
                "INSERT INTO lake.routed SELECT * FROM inferred ROUTE BY event_type
                 WITH ('table.properties.write.parquet.compression-codec' = 'zstd')",
            ),
        };
        let session = common::lake_session(dir, &setup).await;
        let start = Instant::now();
        session.sql(insert).await.expect("job");
        let rate = events as f64 / start.elapsed().as_secs_f64();
        let rows = session.jobs().rows();
        assert_eq!(rows[0].records_out, events, "{rows:?}");
        rate
    })
}

fn main() {
    common::process::pin_to_one_core();
    floe::process::tune();
    let events: u64 = std::env::var("FLOE_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400_000);
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("data dir");
    let mut text = String::new();
    for i in 0..events {
        text.push_str(&common::event(i));
        text.push('\n');
    }
    let bytes = text.len() as f64 / events as f64;
    std::fs::write(data.join("events.jsonl"), &text).expect("write events");

    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let runs = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    println!("ingest: {events} JSON events of {bytes:.0} bytes, 11 fields, one core");
    // The limit at the faster of two batch sizes (floe decodes 4,096 records at a time).
    let batches = runs("baseline").then(|| [4096, 8192].map(|b| (b, baseline(&text, events, b))));
    let base = batches.map(|rates| rates.iter().map(|(_, r)| *r).fold(0.0, f64::max));
    let report = |label: &str, rate: f64, target: u32| match base {
        Some(base) => println!(
            "  {label:<50} {rate:>10.0} records/s  {:>3.0}% of the baseline (target {target}%)",
            100.0 * rate / base
        ),
        None => println!("  {label:<50} {rate:>10.0} records/s"),
    };
    if let (Some(base), Some(rates)) = (base, batches) {
        report(
            "baseline (arrow-json decode + zstd Parquet encode)",
            base,
            100,
        );
        for (batch, rate) in rates {
            println!("    {batch} records a batch: {rate:.0} records/s");
        }
    }
    if runs("declared") {
        let rate = floe_job(dir.path(), events, Job::Declared);
        report("floe, declared columns, one table", rate, 70);
    }
    if runs("inferred") {
        let rate = floe_job(dir.path(), events, Job::InferredRouted);
        report("floe, inferred per record, routed to 4 tables", rate, 60);
    }
}
