//! Rewriting a checkpoint's data files for a table schema that changed under them (another
//! writer's change merged in, `schema::merge`): read back, columns matched by name, written
//! again with the merged field ids.

use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use iceberg::spec::DataFile;
use iceberg::table::Table;

use crate::error::{Error, Result};
use crate::lake::TableWriter;
use crate::schema::conform;

/// Rewrite the data files at `paths` (written for another version of the table) against
/// `staged`'s schema and default spec: read back, columns matched by name. Returns the new
/// files.
pub async fn rewrite_files(staged: &Table, paths: &[String]) -> Result<Vec<DataFile>> {
    let mut writer = TableWriter::try_new(staged)?;
    let schema = staged.metadata().current_schema();
    for path in paths {
        let bytes = staged.file_io().new_input(path)?.read().await?;
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
            .and_then(|b| b.build())
            .map_err(|e| Error::Internal(format!("reading {path}: {e}")))?;
        for batch in reader {
            let batch = batch.map_err(|e| Error::Internal(format!("reading {path}: {e}")))?;
            writer.write(conform(schema, &batch)?).await?;
        }
    }
    writer.close().await
}
