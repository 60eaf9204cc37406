//! Position delete files (Iceberg format v2): the rows of a data file that no longer exist,
//! by their position in it. floe writes one delete file per data file, with the data file
//! named as `referenced_data_file` and as both bounds of the `file_path` column, so that
//! every reader (iceberg-rust, pyiceberg, DuckDB) ties it to that file alone.
//!
//! ```text
//! data file path + sorted positions ─> <data file's folder>/<uuid>-deletes.parquet
//!                                      (file_path: string, pos: long; zstd)
//! ```
//! Nothing is visible until the delete files are committed (`commit::row_delta`).

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use datafusion::arrow::array::{Array, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema as ArrowSchema};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::arrow::PARQUET_FIELD_ID_META_KEY;
use datafusion::parquet::basic::{Compression, ZstdLevel};
use datafusion::parquet::file::properties::WriterProperties;
use iceberg::io::FileIO;
use iceberg::metadata_columns::{
    RESERVED_FIELD_ID_DELETE_FILE_PATH, RESERVED_FIELD_ID_DELETE_FILE_POS,
};
use iceberg::scan::FileScanTask;
use iceberg::spec::{DataContentType, DataFile, DataFileBuilder, DataFileFormat, Datum};

use crate::error::{Error, Result};

/// The data file some of whose rows a delete file removes.
#[derive(Debug, Clone)]
pub struct Target {
    pub path: String,
    pub partition: iceberg::spec::Struct,
    pub spec_id: i32,
}

impl Target {
    /// The data file a scan task reads.
    pub fn of(task: &FileScanTask) -> Self {
        Self {
            path: task.data_file_path.clone(),
            partition: task
                .partition
                .clone()
                .unwrap_or_else(iceberg::spec::Struct::empty),
            spec_id: task
                .partition_spec
                .as_ref()
                .map(|s| s.spec_id())
                .unwrap_or(0),
        }
    }
}

fn schema() -> Arc<ArrowSchema> {
    let id = |n: i32| HashMap::from([(PARQUET_FIELD_ID_META_KEY.to_string(), n.to_string())]);
    Arc::new(ArrowSchema::new(vec![
        Field::new("file_path", DataType::Utf8, false)
            .with_metadata(id(RESERVED_FIELD_ID_DELETE_FILE_PATH)),
        Field::new("pos", DataType::Int64, false)
            .with_metadata(id(RESERVED_FIELD_ID_DELETE_FILE_POS)),
    ]))
}

/// Write the delete file removing the rows at `positions` (ascending, distinct) of `target`,
/// uncommitted.
pub async fn write(io: &FileIO, target: &Target, positions: &[i64]) -> Result<DataFile> {
    let (Some(&first), Some(&last)) = (positions.first(), positions.last()) else {
        return Err(Error::Internal(format!(
            "a delete file of no rows for {}",
            target.path
        )));
    };
    let folder = target
        .path
        .rsplit_once('/')
        .map(|(f, _)| f)
        .unwrap_or(&target.path);
    let path = format!("{folder}/{}-deletes.parquet", uuid::Uuid::new_v4());
    let fail = |e: String| Error::Internal(format!("writing delete file {path}: {e}"));
    let batch = RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(StringArray::from(vec![
                target.path.as_str();
                positions.len()
            ])),
            Arc::new(Int64Array::from(positions.to_vec())),
        ],
    )
    .map_err(|e| fail(e.to_string()))?;
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .build();
    let mut buffer = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut buffer, schema(), Some(props))
        .map_err(|e| fail(e.to_string()))?;
    writer.write(&batch).map_err(|e| fail(e.to_string()))?;
    writer.close().map_err(|e| fail(e.to_string()))?;
    let size = buffer.len() as u64;
    io.new_output(&path)?.write(Bytes::from(buffer)).await?;
    let bounds = |pos: i64| {
        HashMap::from([
            (
                RESERVED_FIELD_ID_DELETE_FILE_PATH,
                Datum::string(target.path.clone()),
            ),
            (RESERVED_FIELD_ID_DELETE_FILE_POS, Datum::long(pos)),
        ])
    };
    DataFileBuilder::default()
        .content(DataContentType::PositionDeletes)
        .file_path(path.clone())
        .file_format(DataFileFormat::Parquet)
        .partition(target.partition.clone())
        .partition_spec_id(target.spec_id)
        .record_count(positions.len() as u64)
        .file_size_in_bytes(size)
        .lower_bounds(bounds(first))
        .upper_bounds(bounds(last))
        .referenced_data_file(Some(target.path.clone()))
        .build()
        .map_err(|e| fail(e.to_string()))
}

/// The positions of `data_path`'s rows that the position delete file `delete_path` removes.
pub async fn read(io: &FileIO, delete_path: &str, data_path: &str) -> Result<Vec<i64>> {
    let fail = |e: String| Error::Internal(format!("reading delete file {delete_path}: {e}"));
    let mut out = Vec::new();
    for batch in super::read::parquet(io, delete_path, "delete file").await? {
        if batch.num_columns() < 2 {
            return Err(fail("it has fewer than two columns".into()));
        }
        let paths = batch
            .column(0)
            .as_any()
            .downcast_ref::<StringArray>()
            .ok_or_else(|| fail("its file_path column is not a string".into()))?;
        let pos = batch
            .column(1)
            .as_any()
            .downcast_ref::<Int64Array>()
            .ok_or_else(|| fail("its pos column is not a long".into()))?;
        for i in 0..batch.num_rows() {
            if paths.is_valid(i) && paths.value(i) == data_path {
                out.push(pos.value(i));
            }
        }
    }
    Ok(out)
}

/// The positions of the task's data file that its delete files remove, ascending. A
/// table with equality deletes (another writer's) is refused: floe applies position
/// deletes only.
pub async fn deleted_positions(io: &FileIO, task: &FileScanTask) -> Result<Vec<i64>> {
    let mut out = Vec::new();
    for d in &task.deletes {
        match d.file_type {
            DataContentType::PositionDeletes => {
                out.extend(read(io, &d.file_path, &task.data_file_path).await?);
            }
            _ => {
                return Err(Error::Unsupported(format!(
                    "equality delete file {}: floe reads position deletes to change rows; \
                     compact the table with an engine that applies equality deletes first",
                    d.file_path
                )));
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}
