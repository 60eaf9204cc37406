//! Rewriting a checkpoint's data files for a table schema that changed under them (another
//! writer's change merged in, `schema::merge`, or the table created again): read back,
//! columns matched by name, written again with the table's field ids. Rows whose values the
//! table's types cannot take without loss (a column another writer made a string while this
//! job made it a long) are not written but returned, each with why: the rule new rows meet
//! (`schema::evolve`), so a row's fate does not depend on which writer committed first.

use datafusion::arrow::array::RecordBatch;
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use iceberg::spec::{DataFile, Schema};
use iceberg::table::Table;

use crate::error::{Error, Reject, Result};
use crate::lake::TableWriter;
use crate::schema::{conform, evolve};

/// What a rewrite made: the new files, and the rows it could not write.
#[derive(Debug, Default)]
pub struct Rewritten {
    pub files: Vec<DataFile>,
    /// Each row not written (as it was read), with why.
    pub rejected: Vec<(RecordBatch, Reject)>,
}

/// Rewrite the data files at `paths` (written for another version of the table) against
/// `staged`'s schema and default spec: read back, columns matched by name.
pub async fn rewrite_files(staged: &Table, paths: &[String]) -> Result<Rewritten> {
    let mut writer = TableWriter::try_new(staged)?;
    let schema = staged.metadata().current_schema();
    let mut rejected = Vec::new();
    for path in paths {
        let bytes = staged.file_io().new_input(path)?.read().await?;
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
            .and_then(|b| b.build())
            .map_err(|e| Error::Internal(format!("reading {path}: {e}")))?;
        for batch in reader {
            let batch = batch.map_err(|e| Error::Internal(format!("reading {path}: {e}")))?;
            // Halve a batch that does not conform until the rows that do not are found.
            let mut parts = vec![batch];
            while let Some(part) = parts.pop() {
                match fit(schema, &part) {
                    Ok(rows) => writer.write(rows).await?,
                    Err(Error::Record(reject)) if part.num_rows() == 1 => {
                        rejected.push((part, reject));
                    }
                    Err(Error::Record(_)) => {
                        let half = part.num_rows() / 2;
                        parts.push(part.slice(half, part.num_rows() - half));
                        parts.push(part.slice(0, half));
                    }
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(Rewritten {
        files: writer.close().await?,
        rejected,
    })
}

/// `batch` in `schema`'s columns, where its values fit them as a new row's must: a value
/// only a conversion would fit (a number into a text column) is the row's fault.
fn fit(schema: &Schema, batch: &RecordBatch) -> Result<RecordBatch> {
    let columns = batch.columns();
    evolve(schema, schema.highest_field_id(), &batch.schema(), columns).map_err(Error::Record)?;
    conform(schema, batch)
}
