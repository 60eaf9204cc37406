//! Runs the `.slt` files under `sqllogictest/slt/`, one fresh floe session per file.
//!
//! ```text
//! cargo test --test sqllogictests                 # run every file
//! cargo test --test sqllogictests -- ddl          # files whose path contains "ddl"
//! cargo test --test sqllogictests -- --complete   # rewrite expected output in place
//! ```
//!
//! Files start with `control substitution on` and put their catalogs under
//! `$__TEST_DIR__`, a scratch folder the runner makes per file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use datafusion::arrow::array::{Array, RecordBatch};
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use floe::{Error, Output, Session};
use sqllogictest::{DBOutput, DefaultColumnType, Runner};

/// A floe session as a sqllogictest database.
struct FloeDb {
    session: Session,
}

#[derive(Debug)]
struct DbError(Error);

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::error::Error for DbError {}

#[async_trait::async_trait]
impl sqllogictest::AsyncDB for FloeDb {
    type Error = DbError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, DbError> {
        let outputs = self.session.sql(sql).await.map_err(DbError)?;
        match outputs.into_iter().last() {
            Some(Output::Rows(schema, batches)) => Ok(DBOutput::Rows {
                types: schema
                    .fields()
                    .iter()
                    .map(|f| column_type(f.data_type()))
                    .collect(),
                rows: rows(&batches).map_err(DbError)?,
            }),
            Some(Output::Done(_) | Output::Started { .. }) | None => {
                Ok(DBOutput::StatementComplete(0))
            }
        }
    }

    fn engine_name(&self) -> &str {
        "floe"
    }

    async fn sleep(dur: Duration) {
        tokio::time::sleep(dur).await
    }

    async fn shutdown(&mut self) {}
}

fn column_type(t: &DataType) -> DefaultColumnType {
    if t.is_integer() {
        DefaultColumnType::Integer
    } else if t.is_floating() || matches!(t, DataType::Decimal128(_, _)) {
        DefaultColumnType::FloatingPoint
    } else {
        DefaultColumnType::Text
    }
}

/// Rows as strings: NULL as `NULL`, the empty string as `(empty)`.
fn rows(batches: &[RecordBatch]) -> Result<Vec<Vec<String>>, Error> {
    let options = FormatOptions::default().with_null("NULL");
    let mut out = Vec::new();
    for batch in batches {
        let formatters = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Error::Internal(e.to_string()))?;
        for row in 0..batch.num_rows() {
            let cells: Vec<Vec<String>> = formatters
                .iter()
                .zip(batch.columns())
                .map(|(f, c)| {
                    // Plans end lines with spaces and the text with a newline.
                    let s = f.value(row).to_string();
                    let lines: Vec<String> = s
                        .trim_end()
                        .lines()
                        .map(|l| l.trim_end().to_string())
                        .collect();
                    if lines.is_empty() && !c.is_null(row) {
                        vec!["(empty)".to_string()]
                    } else {
                        lines
                    }
                })
                .collect();
            // A cell of several lines (a plan) spreads over several rows.
            let height = cells.iter().map(Vec::len).max().unwrap_or(1).max(1);
            for i in 0..height {
                out.push(
                    cells
                        .iter()
                        .map(|c| c.get(i).cloned().unwrap_or_default())
                        .collect(),
                );
            }
        }
    }
    Ok(out)
}

fn slt_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "slt") {
                files.push(p);
            }
        }
    }
    files.sort();
    files
}

/// Compares rows with expected lines after collapsing whitespace on both sides (plans are
/// indented); lines with `<slt:ignore>` use sqllogictest's own fragment matching.
fn validator(
    normalizer: sqllogictest::Normalizer,
    actual: &[Vec<String>],
    expected: &[String],
) -> bool {
    if expected.iter().any(|l| l.contains("<slt:ignore>")) {
        return sqllogictest::default_validator(normalizer, actual, expected);
    }
    let actual: Vec<String> = actual.iter().map(|r| normalizer(&r.join(" "))).collect();
    let expected: Vec<String> = expected.iter().map(normalizer).collect();
    actual == expected
}

fn make_runner() -> Runner<FloeDb, impl sqllogictest::MakeConnection<Conn = FloeDb>> {
    let mut runner = Runner::new(|| async {
        Ok(FloeDb {
            session: Session::new(),
        })
    });
    runner.with_validator(validator);
    runner
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let complete = args.iter().any(|a| a == "--complete");
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("sqllogictest/slt");
    let files: Vec<PathBuf> = slt_files(&root)
        .into_iter()
        .filter(|f| {
            filters.is_empty()
                || filters
                    .iter()
                    .any(|x| f.to_string_lossy().contains(x.as_str()))
        })
        .collect();
    let (mut passed, mut failed) = (0, 0);
    for file in &files {
        let name = file
            .strip_prefix(&root)
            .unwrap_or(file)
            .display()
            .to_string();
        let mut runner = make_runner();
        let result = if complete {
            runner
                .update_test_file(
                    file,
                    " ",
                    validator,
                    sqllogictest::default_normalizer,
                    sqllogictest::default_column_validator,
                )
                .await
                .map_err(|e| e.to_string())
        } else {
            runner
                .run_file_async(file)
                .await
                .map_err(|e| e.display(false).to_string())
        };
        match result {
            Ok(()) => {
                passed += 1;
                println!("ok     {name}");
            }
            Err(e) => {
                failed += 1;
                println!("FAILED {name}\n{e}\n");
            }
        }
    }
    println!("\nsqllogictest: {passed} passed, {failed} failed");
    if files.is_empty() {
        eprintln!("no .slt files matched under {}", root.display());
        std::process::exit(1);
    }
    if failed > 0 {
        std::process::exit(1);
    }
}
