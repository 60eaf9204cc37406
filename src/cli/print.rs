//! Printing results: `table`, `csv`, `json` and `ndjson`.

use std::io::Write;
use std::time::Duration;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::csv::WriterBuilder as CsvWriterBuilder;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::json::WriterBuilder as JsonWriterBuilder;
use datafusion::arrow::json::writer::{JsonArray, LineDelimited};
use datafusion::arrow::util::pretty::pretty_format_batches_with_schema;

use crate::error::{Error, Result};
use crate::session::Output;

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// An aligned text table.
    Table,
    /// Comma-separated values with a header line.
    Csv,
    /// One JSON array of objects per result.
    Json,
    /// One JSON object per row, one row per line.
    Ndjson,
}

/// Printing options.
#[derive(Debug, Clone, Copy)]
pub struct PrintOptions {
    pub format: Format,
    /// Rows shown by the table format at most (`None`: all).
    pub max_rows: Option<usize>,
    /// No row counts, timings or statement tags.
    pub quiet: bool,
}

fn io_err(e: impl std::fmt::Display) -> Error {
    Error::io("writing output", std::io::Error::other(e.to_string()))
}

impl PrintOptions {
    /// Print one statement's output to `out`.
    pub fn print(&self, out: &mut dyn Write, output: &Output, elapsed: Duration) -> Result<()> {
        match output {
            Output::Done(_) | Output::Started { .. } => {
                if !self.quiet && self.format == Format::Table {
                    writeln!(out, "{output}").map_err(io_err)?;
                    writeln!(out, "Elapsed {:.3} seconds.\n", elapsed.as_secs_f64())
                        .map_err(io_err)?;
                }
            }
            Output::Rows(schema, batches) => {
                self.print_rows(out, schema, batches)?;
                if !self.quiet && self.format == Format::Table {
                    let rows = output.row_count();
                    let shown = self.max_rows.map_or(rows, |m| rows.min(m));
                    let mut footer = format!("{rows} row(s) fetched.");
                    if shown < rows {
                        footer.push_str(&format!(
                            " (First {shown} displayed. Use --maxrows to adjust)"
                        ));
                    }
                    writeln!(out, "{footer}").map_err(io_err)?;
                    writeln!(out, "Elapsed {:.3} seconds.\n", elapsed.as_secs_f64())
                        .map_err(io_err)?;
                }
            }
        }
        out.flush().map_err(io_err)
    }

    fn print_rows(
        &self,
        out: &mut dyn Write,
        schema: &SchemaRef,
        batches: &[RecordBatch],
    ) -> Result<()> {
        match self.format {
            Format::Table => {
                let shown = match self.max_rows {
                    Some(max) => first_rows(batches, max),
                    None => batches.to_vec(),
                };
                let text =
                    pretty_format_batches_with_schema(schema.clone(), &shown).map_err(io_err)?;
                writeln!(out, "{text}").map_err(io_err)
            }
            Format::Csv => {
                let mut w = CsvWriterBuilder::new().with_header(true).build(out);
                if batches.is_empty() {
                    w.write(&RecordBatch::new_empty(schema.clone()))
                        .map_err(io_err)?;
                }
                for b in batches {
                    w.write(b).map_err(io_err)?;
                }
                Ok(())
            }
            Format::Json => {
                let mut w = JsonWriterBuilder::new()
                    .with_explicit_nulls(true)
                    .build::<_, JsonArray>(&mut *out);
                for b in batches {
                    w.write(b).map_err(io_err)?;
                }
                w.finish().map_err(io_err)?;
                drop(w);
                writeln!(out).map_err(io_err)
            }
            Format::Ndjson => {
                let mut w = JsonWriterBuilder::new()
                    .with_explicit_nulls(true)
                    .build::<_, LineDelimited>(&mut *out);
                for b in batches {
                    w.write(b).map_err(io_err)?;
                }
                w.finish().map_err(io_err)
            }
        }
    }
}

/// The first `max` rows of `batches`.
fn first_rows(batches: &[RecordBatch], max: usize) -> Vec<RecordBatch> {
    let mut left = max;
    let mut out = Vec::new();
    for b in batches {
        if left == 0 {
            break;
        }
        let n = b.num_rows().min(left);
        out.push(b.slice(0, n));
        left -= n;
    }
    out
}
