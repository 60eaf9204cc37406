//! Ad-hoc queries over a lake table floe wrote, side by side with DuckDB's `iceberg_scan` on
//! the same table (the speed issue's target: within 1.2x of DuckDB in total, the same rows).
//!
//! ```text
//! scripts/test-env.sh install && eval "$(scripts/test-env.sh env)"   # DuckDB, in Python
//! cargo bench --bench query                         # 20 M orders, each query best of 3
//! FLOE_BENCH_ROWS=2000000 FLOE_BENCH_REPEAT=1 cargo bench --bench query
//! FLOE_BENCH_DIR=/tmp/lake cargo bench --bench query   # keep the table for the next run
//! ```
//!
//! floe writes `FLOE_BENCH_ROWS` generated orders (23 days of them at 20 M) into a table
//! partitioned by day and region, as a continuous job checkpointing every 300 ms writes them
//! (some hundreds of files). Each query of `benches/query/queries.sql` then runs in floe (every
//! core) and in DuckDB (`benches/query/duck.py`, every core, through the test environment's
//! Python: `FLOE_TEST_PYTHON`), once to warm up and then `FLOE_BENCH_REPEAT` times, the best
//! time kept. The rows must be the same (floats to 1e-9); the files each query reads after
//! pruning are printed from floe's `EXPLAIN`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use datafusion::arrow::array::{Array, RecordBatch};
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};

mod common;
use common::env;

/// The binary's allocator (see src/main.rs).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A cell: a number (compared to a relative 1e-9, as sums of floats depend on their order) or
/// text.
#[derive(Debug, Clone)]
enum Cell {
    Number(f64),
    Text(String),
    Null,
}

impl PartialEq for Cell {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Cell::Number(a), Cell::Number(b)) => {
                a == b || (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
            }
            (Cell::Text(a), Cell::Text(b)) => a == b,
            (Cell::Null, Cell::Null) => true,
            _ => false,
        }
    }
}

/// The queries of `path`: (name, SQL), the name the first word of the comment starting each.
fn queries(path: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(path).expect("queries.sql");
    let (mut out, mut name, mut lines) = (Vec::new(), String::new(), Vec::new());
    for line in text.lines() {
        if let Some(comment) = line.strip_prefix("--") {
            if lines.is_empty() {
                name = comment.split_whitespace().next().unwrap_or("").to_string();
            }
            continue;
        }
        if !line.trim().is_empty() {
            lines.push(line);
        }
        if line.trim_end().ends_with(';') {
            let sql = lines.join("\n");
            out.push((
                name.clone(),
                sql.trim_end().trim_end_matches(';').to_string(),
            ));
            lines.clear();
        }
    }
    out
}

fn rows_of(batches: &[RecordBatch]) -> Vec<Vec<Cell>> {
    let mut rows = Vec::new();
    for batch in batches {
        let columns: Vec<_> = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &FormatOptions::default()).unwrap())
            .collect();
        for r in 0..batch.num_rows() {
            rows.push(
                batch
                    .columns()
                    .iter()
                    .zip(&columns)
                    .map(|(array, text)| match array.data_type() {
                        _ if array.is_null(r) => Cell::Null,
                        t if t.is_numeric() => {
                            Cell::Number(text.value(r).to_string().parse().expect("a number"))
                        }
                        DataType::Date32 | DataType::Utf8 | DataType::Utf8View => {
                            Cell::Text(text.value(r).to_string())
                        }
                        other => panic!("a {other} column: give the query a number or text"),
                    })
                    .collect(),
            );
        }
    }
    rows
}

fn cell_of(v: &serde_json::Value) -> Cell {
    match v {
        serde_json::Value::Null => Cell::Null,
        serde_json::Value::Number(n) => Cell::Number(n.as_f64().expect("a number")),
        serde_json::Value::String(s) => Cell::Text(s.clone()),
        other => panic!("DuckDB gave {other}"),
    }
}

/// The newest metadata file of the table at `table` (a folder of the local warehouse).
fn metadata_file(table: &Path) -> PathBuf {
    let mut files: Vec<(u64, PathBuf)> = std::fs::read_dir(table.join("metadata"))
        .expect("the table's metadata folder")
        .filter_map(|e| {
            let path = e.ok()?.path();
            let name = path.file_name()?.to_str()?.to_string();
            let version = name.strip_suffix(".metadata.json")?.split('-').next()?;
            Some((version.parse().ok()?, path))
        })
        .collect();
    files.sort();
    files.pop().expect("a metadata file").1
}

/// The rows of the bench's table, 0 when there is none.
async fn count(session: &floe::Session) -> u64 {
    match session
        .sql("SELECT count(*) FROM lake.bench.orders")
        .await
        .ok()
        .and_then(|mut o| o.pop())
    {
        Some(floe::Output::Rows(_, b)) => match rows_of(&b).first().and_then(|r| r.first()) {
            Some(Cell::Number(n)) => *n as u64,
            _ => 0,
        },
        _ => 0,
    }
}

fn main() {
    floe::process::tune();
    let rows: u64 = env("FLOE_BENCH_ROWS").unwrap_or(20_000_000);
    let repeat: u32 = env("FLOE_BENCH_REPEAT").unwrap_or(3);
    let python = std::env::var("FLOE_TEST_PYTHON").unwrap_or_else(|_| {
        panic!(
            "FLOE_TEST_PYTHON is not set: DuckDB runs in the test environment's Python. Run \
             scripts/test-env.sh install, then eval \"$(scripts/test-env.sh env)\""
        )
    });
    let kept: Option<PathBuf> = env("FLOE_BENCH_DIR");
    let temp = tempfile::tempdir().expect("tempdir");
    let dir = kept.clone().unwrap_or_else(|| temp.path().to_path_buf());
    std::fs::create_dir_all(&dir).expect("the bench folder");
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/query");
    let queries = queries(&here.join("queries.sql"));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");

    let floe_side = runtime.block_on(async {
        let session = common::lake_session(&dir, "CREATE SCHEMA IF NOT EXISTS lake.bench").await;
        if count(&session).await != rows {
            let start = Instant::now();
            session
                .sql(&format!(
                    "DROP TABLE IF EXISTS lake.bench.orders;
                     CREATE TABLE lake.bench.orders (order_id BIGINT NOT NULL,
                       customer_id BIGINT NOT NULL, product STRING NOT NULL,
                       quantity INT NOT NULL, price DOUBLE NOT NULL, region STRING NOT NULL,
                       status STRING NOT NULL, order_time TIMESTAMP NOT NULL)
                       PARTITIONED BY (days(order_time), region);
                     CREATE SOURCE gen WITH ('connector' = 'datagen', 'profile' = 'orders',
                       'number-of-rows' = '{rows}', 'seed' = '7');
                     SET 'checkpoint.interval' = '300ms';
                     SET 'pipeline.name' = 'write-{}';
                     INSERT INTO lake.bench.orders SELECT * FROM gen;",
                    std::process::id()
                ))
                .await
                .expect("writing the table");
            println!(
                "query: wrote {rows} orders in {:.1} s",
                start.elapsed().as_secs_f64()
            );
            assert_eq!(count(&session).await, rows, "the table's rows");
        }
        session
            .sql("CREATE VIEW orders AS SELECT * FROM lake.bench.orders")
            .await
            .expect("the view");
        let mut out = Vec::new();
        for (name, sql) in &queries {
            let plan = match session.sql(&format!("EXPLAIN {sql}")).await {
                Ok(mut o) => match o.pop() {
                    Some(floe::Output::Rows(_, b)) => {
                        datafusion::arrow::util::pretty::pretty_format_batches(&b)
                            .map(|t| t.to_string())
                            .unwrap_or_default()
                    }
                    _ => String::new(),
                },
                Err(e) => panic!("{name}: EXPLAIN: {e}"),
            };
            let files: Vec<String> = plan
                .split("files=")
                .skip(1)
                .filter_map(|s| s.split(',').next().map(str::to_string))
                .collect();
            let run = || async {
                match session.sql(sql).await.expect(name).pop() {
                    Some(floe::Output::Rows(_, b)) => rows_of(&b),
                    _ => panic!("{name}: no rows"),
                }
            };
            run().await;
            let mut best = f64::INFINITY;
            let mut result = Vec::new();
            for _ in 0..repeat {
                let start = Instant::now();
                result = run().await;
                best = best.min(start.elapsed().as_secs_f64());
            }
            out.push((files.join(" + "), best, result));
        }
        out
    });

    let table = dir.join("warehouse/bench/orders");
    let output = std::process::Command::new(&python)
        .arg(here.join("duck.py"))
        .arg(metadata_file(&table))
        .arg(here.join("queries.sql"))
        .arg(repeat.to_string())
        .output()
        .expect("running DuckDB's side");
    assert!(
        output.status.success(),
        "DuckDB's side failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let duck: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(duck.len(), queries.len(), "DuckDB ran every query");

    println!("query: {rows} orders, {cores} cores, best of {repeat}, release");
    println!(
        "  {:<5} {:>26} {:>9} {:>9} {:>7}",
        "query", "files read", "floe s", "DuckDB s", "ratio"
    );
    let (mut floe_total, mut duck_total) = (0.0, 0.0);
    let mut differ = Vec::new();
    for (((name, _), (files, floe_s, floe_rows)), theirs) in
        queries.iter().zip(&floe_side).zip(&duck)
    {
        let duck_s = theirs["seconds"].as_f64().expect("seconds");
        let duck_rows: Vec<Vec<Cell>> = theirs["rows"]
            .as_array()
            .expect("rows")
            .iter()
            .map(|r| r.as_array().expect("a row").iter().map(cell_of).collect())
            .collect();
        if &duck_rows != floe_rows {
            differ.push(format!(
                "{name}: floe {floe_rows:?}\n  DuckDB {duck_rows:?}"
            ));
        }
        floe_total += floe_s;
        duck_total += duck_s;
        println!(
            "  {name:<5} {files:>26} {floe_s:>9.3} {duck_s:>9.3} {:>6.2}x",
            floe_s / duck_s
        );
    }
    println!(
        "  {:<5} {:>26} {floe_total:>9.3} {duck_total:>9.3} {:>6.2}x   (target: 1.2x or less)",
        "total",
        "",
        floe_total / duck_total
    );
    assert!(
        differ.is_empty(),
        "floe and DuckDB differ:\n{}",
        differ.join("\n")
    );
}
