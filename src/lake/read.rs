//! Reading a table's data files back as Arrow in its current schema: for compaction, and
//! for scans of tables iceberg-rust cannot read (see `catalog::evolved_scan`).
//!
//! iceberg-rust 0.10's reader matches nested fields by position (apache/iceberg-rust#2617),
//! so a file written before a struct column gained a field is read here instead: the
//! Parquet file as Arrow, its columns matched to the table's by name, nested fields too,
//! with NULL for what the file predates. Files with deletes are left to iceberg-rust, whose
//! reader applies them.

use bytes::Bytes;
use datafusion::arrow::array::RecordBatch;
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use iceberg::arrow::ArrowReaderBuilder;
use iceberg::io::FileIO;
use iceberg::scan::FileScanTask;
use iceberg::spec::{NestedFieldRef, Schema, TableMetadata, Type};
use iceberg::table::Table;

use crate::error::{Error, Result};
use crate::schema::conform;

/// Whether a struct, list or map column of the current schema has nested fields that an
/// older schema of the table lacked (so older files may lack them).
pub fn nested_fields_grew(md: &TableMetadata) -> bool {
    let current = md.current_schema();
    md.schemas_iter()
        .filter(|s| s.schema_id() != current.schema_id())
        .any(|old| {
            current.as_struct().fields().iter().any(|f| {
                old.field_by_id(f.id).is_some()
                    && nested_ids(f)
                        .iter()
                        .any(|id| old.field_by_id(*id).is_none())
            })
        })
}

fn nested_ids(field: &NestedFieldRef) -> Vec<i32> {
    let mut out = Vec::new();
    collect(&field.field_type, &mut out);
    out
}

fn collect(ty: &Type, out: &mut Vec<i32>) {
    match ty {
        Type::Primitive(_) => {}
        Type::Struct(s) => {
            for f in s.fields() {
                out.push(f.id);
                collect(&f.field_type, out);
            }
        }
        Type::List(l) => {
            out.push(l.element_field.id);
            collect(&l.element_field.field_type, out);
        }
        Type::Map(m) => {
            for f in [&m.key_field, &m.value_field] {
                out.push(f.id);
                collect(&f.field_type, out);
            }
        }
    }
}

/// The rows of data file `path`, in `schema` (the table's current one), matched by name.
pub async fn conformed(io: &FileIO, schema: &Schema, path: &str) -> Result<Vec<RecordBatch>> {
    let bytes: Bytes = io.new_input(path)?.read().await?;
    let fail = |e: String| Error::Internal(format!("reading data file {path}: {e}"));
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
        .and_then(|b| b.build())
        .map_err(|e| fail(e.to_string()))?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| fail(e.to_string()))?;
        out.push(conform(schema, &batch)?);
    }
    Ok(out)
}

/// The rows of the whole files `tasks` plan (their deletes applied), in the table's
/// current schema. Each task's predicate is dropped: every row of each file is read.
pub fn whole_files(
    table: &Table,
    tasks: Vec<FileScanTask>,
) -> Result<BoxStream<'static, Result<RecordBatch>>> {
    let tasks: Vec<FileScanTask> = tasks
        .into_iter()
        .map(|mut t| {
            t.predicate = None;
            t
        })
        .collect();
    let md = table.metadata();
    if nested_fields_grew(md) && tasks.iter().all(|t| t.deletes.is_empty()) {
        let io = table.file_io().clone();
        let schema = md.current_schema().clone();
        let paths: Vec<String> = tasks.into_iter().map(|t| t.data_file_path).collect();
        return Ok(futures::stream::iter(paths)
            .then(move |path| {
                let io = io.clone();
                let schema = schema.clone();
                async move { conformed(&io, &schema, &path).await }
            })
            .map_ok(|batches| futures::stream::iter(batches.into_iter().map(Ok)))
            .try_flatten()
            .boxed());
    }
    let reader = ArrowReaderBuilder::new(table.file_io().clone(), iceberg::Runtime::try_current()?)
        .with_data_file_concurrency_limit(2)
        .build();
    let stream = reader
        .read(futures::stream::iter(tasks.into_iter().map(Ok)).boxed())?
        .stream();
    Ok(stream.map_err(Error::from).boxed())
}
