//! Reading a table's data files back as Arrow in its current schema: for compaction, and
//! for scans of tables iceberg-rust cannot read (see `catalog::evolved_scan`).
//!
//! iceberg-rust 0.10's reader matches nested fields by position (apache/iceberg-rust#2617),
//! so a file written before a struct column gained a field is read here instead: the
//! Parquet file as Arrow, its columns matched to the table's by name, nested fields too,
//! with NULL for what the file predates, and the position deletes that apply to it applied.
//! Tables with deletion vectors (format v3), which iceberg-rust 0.10 does not apply, are
//! read here too ([`needs_own_reader`]).
//! The same reading gives each row's file and position ([`positioned`]), which statements
//! changing rows delete by.

use std::sync::Arc;

use bytes::Bytes;
use datafusion::arrow::array::{BooleanArray, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Schema as ArrowSchema, SchemaRef};
use datafusion::parquet::arrow::ProjectionMask;
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use iceberg::arrow::{ArrowReaderBuilder, schema_to_arrow_schema};
use iceberg::io::FileIO;
use iceberg::scan::FileScanTask;
use iceberg::spec::{
    FormatVersion, NestedFieldRef, Schema, SchemaRef as SchemaRefIceberg, TableMetadata, Type,
};
use iceberg::table::Table;

use super::deletes;
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

/// Every batch of Parquet file `path` (`what` it is, for errors).
pub async fn parquet(io: &FileIO, path: &str, what: &str) -> Result<Vec<RecordBatch>> {
    parquet_columns(io, path, what, None).await
}

/// [`parquet`], of only the top-level columns named `columns` (all when `None`).
async fn parquet_columns(
    io: &FileIO,
    path: &str,
    what: &str,
    columns: Option<&Schema>,
) -> Result<Vec<RecordBatch>> {
    let bytes: Bytes = io.new_input(path)?.read().await?;
    let fail = |e: String| Error::Internal(format!("reading {what} {path}: {e}"));
    let mut builder =
        ParquetRecordBatchReaderBuilder::try_new(bytes).map_err(|e| fail(e.to_string()))?;
    if let Some(columns) = columns {
        let roots: Vec<usize> = builder
            .schema()
            .fields()
            .iter()
            .enumerate()
            .filter(|(_, f)| columns.field_by_name(f.name()).is_some())
            .map(|(i, _)| i)
            .collect();
        let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
        builder = builder.with_projection(mask);
    }
    builder
        .build()
        .map_err(|e| fail(e.to_string()))?
        .map(|b| b.map_err(|e| fail(e.to_string())))
        .collect()
}

/// The rows of data file `path`, in `schema` (the table's current one), matched by name.
pub async fn conformed(io: &FileIO, schema: &Schema, path: &str) -> Result<Vec<RecordBatch>> {
    conformed_columns(io, schema, path, false).await
}

/// The rows at `positions` (ascending) of data file `path`, in `columns` (a projection of
/// the table's schema, see [`columns_of`]), only those columns read.
pub async fn rows_at(
    io: &FileIO,
    columns: &Schema,
    path: &str,
    positions: &[i64],
) -> Result<RecordBatch> {
    let batches = conformed_columns(io, columns, path, true).await?;
    let arrow = Arc::new(schema_to_arrow_schema(columns)?);
    let all = datafusion::arrow::compute::concat_batches(&arrow, &batches)
        .map_err(|e| Error::Internal(format!("reading {path}: {e}")))?;
    let indices = datafusion::arrow::array::UInt64Array::from_iter_values(
        positions.iter().map(|&p| p as u64),
    );
    datafusion::arrow::compute::take_record_batch(&all, &indices)
        .map_err(|e| Error::Internal(format!("rows of {path} at positions: {e}")))
}

/// [`conformed`]; when `only`, only `schema`'s columns are read from the file (a projection
/// of the table's schema: the key columns, say).
async fn conformed_columns(
    io: &FileIO,
    schema: &Schema,
    path: &str,
    only: bool,
) -> Result<Vec<RecordBatch>> {
    parquet_columns(io, path, "data file", only.then_some(schema))
        .await?
        .iter()
        .map(|b| conform(schema, b))
        .collect()
}

/// Whether iceberg-rust cannot read snapshot `snapshot` of the table (its current one when
/// `None`), so floe reads it file by file ([`live`]): its struct columns gained fields (see
/// the module doc), or it is a format-version 3 snapshot that may hold deletion vectors,
/// which iceberg-rust 0.10 does not apply (its summary counts no delete files, or none).
pub fn needs_own_reader(md: &TableMetadata, snapshot: Option<i64>) -> bool {
    if nested_fields_grew(md) {
        return true;
    }
    if md.format_version() < FormatVersion::V3 {
        return false;
    }
    let snapshot = match snapshot {
        Some(id) => md.snapshot_by_id(id),
        None => md.current_snapshot(),
    };
    snapshot.is_some_and(|s| {
        s.summary()
            .additional_properties
            .get("total-delete-files")
            .is_none_or(|n| n != "0")
    })
}

/// The rows of the whole files `tasks` plan (their deletes applied), in the table's
/// current schema. Each task's predicate is dropped: every row of each file is read.
/// iceberg-rust reads them, unless it cannot ([`needs_own_reader`]): then [`live`].
pub fn whole_files(
    table: &Table,
    tasks: Vec<FileScanTask>,
) -> Result<BoxStream<'static, Result<RecordBatch>>> {
    if needs_own_reader(table.metadata(), None) {
        return live(table, tasks);
    }
    let tasks: Vec<FileScanTask> = tasks
        .into_iter()
        .map(|mut t| {
            t.predicate = None;
            t
        })
        .collect();
    let reader = ArrowReaderBuilder::new(table.file_io().clone(), iceberg::Runtime::try_current()?)
        .with_data_file_concurrency_limit(2)
        .build();
    let stream = reader
        .read(futures::stream::iter(tasks.into_iter().map(Ok)).boxed())?
        .stream();
    Ok(stream.map_err(Error::from).boxed())
}

/// The live rows of the files `tasks` plan, read by floe file by file (columns matched by
/// name, position deletes applied), in the table's current schema.
pub fn live(
    table: &Table,
    tasks: Vec<FileScanTask>,
) -> Result<BoxStream<'static, Result<RecordBatch>>> {
    let schema = schema_to_arrow_schema(table.metadata().current_schema())?;
    let columns: Vec<usize> = (0..schema.fields().len()).collect();
    Ok(positioned(table, tasks)?
        .and_then(move |b| {
            let out = b
                .project(&columns)
                .map_err(|e| Error::Internal(format!("live rows: {e}")));
            futures::future::ready(out)
        })
        .boxed())
}

/// The table's columns named `names`, as a schema of their own (with their field ids).
pub fn columns_of(table: &Table, names: &[String]) -> Result<Schema> {
    columns_in(table, table.metadata().current_schema(), names)
}

/// [`columns_of`] in `schema`, one of the table's schemas.
fn columns_in(table: &Table, schema: &Schema, names: &[String]) -> Result<Schema> {
    let fields = names
        .iter()
        .map(|n| {
            schema.field_by_name(n).cloned().ok_or_else(|| {
                Error::Internal(format!("table {} has no column {n}", table.identifier()))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Schema::builder().with_fields(fields).build()?)
}

/// Every file of the table's current snapshot, planned for reading all its columns.
pub async fn plan_all(table: &Table) -> Result<Vec<FileScanTask>> {
    Ok(table
        .scan()
        .select_all()
        .build()?
        .plan_files()
        .await?
        .try_collect()
        .await?)
}

/// The column [`positioned`] adds holding each row's data file.
pub const FILE_COLUMN: &str = "__floe_file";
/// The column [`positioned`] adds holding each row's position in its data file.
pub const POS_COLUMN: &str = "__floe_pos";

/// The table's current schema in Arrow with [`FILE_COLUMN`] and [`POS_COLUMN`] after it.
pub fn positioned_schema(table: &Table) -> Result<SchemaRef> {
    with_positions(&schema_to_arrow_schema(table.metadata().current_schema())?)
}

/// `arrow` with [`FILE_COLUMN`] and [`POS_COLUMN`] after its columns.
fn with_positions(arrow: &ArrowSchema) -> Result<SchemaRef> {
    let mut fields: Vec<FieldRef> = arrow.fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(FILE_COLUMN, DataType::Utf8, false)));
    fields.push(Arc::new(Field::new(POS_COLUMN, DataType::Int64, false)));
    Ok(Arc::new(ArrowSchema::new(fields)))
}

/// The live rows of the files `tasks` plan, each with its data file and its position in it
/// ([`positioned_schema`]): what a statement changing rows needs to delete them. Position
/// deletes and deletion vectors are applied here (see [`deletes::DeleteReader`]); each task's predicate is
/// dropped, every live row of each file is read.
pub fn positioned(
    table: &Table,
    tasks: Vec<FileScanTask>,
) -> Result<BoxStream<'static, Result<RecordBatch>>> {
    positioned_columns(table, tasks, None)
}

/// [`positioned`], of only the table's columns named `columns` (then their positions).
pub fn positioned_columns(
    table: &Table,
    tasks: Vec<FileScanTask>,
    columns: Option<&[String]>,
) -> Result<BoxStream<'static, Result<RecordBatch>>> {
    positioned_in(table, table.metadata().current_schema(), tasks, columns)
}

/// [`positioned_columns`] in `schema`, one of the table's schemas (a snapshot's, for a query
/// travelling to it).
pub fn positioned_in(
    table: &Table,
    schema: &SchemaRefIceberg,
    tasks: Vec<FileScanTask>,
    columns: Option<&[String]>,
) -> Result<BoxStream<'static, Result<RecordBatch>>> {
    let io = table.file_io().clone();
    let (iceberg, only) = match columns {
        None => (schema.clone(), false),
        Some(names) => (Arc::new(columns_in(table, schema, names)?), true),
    };
    let schema = with_positions(&schema_to_arrow_schema(&iceberg)?)?;
    let deletes = deletes::DeleteReader::new(io.clone());
    Ok(futures::stream::iter(tasks)
        .then(move |task| {
            let io = io.clone();
            let iceberg = iceberg.clone();
            let schema = schema.clone();
            let deletes = deletes.clone();
            async move {
                let deleted = deletes.of_task(&task).await?;
                let batches = conformed_columns(&io, &iceberg, &task.data_file_path, only).await?;
                let mut start = 0i64;
                let mut out = Vec::with_capacity(batches.len());
                for batch in batches {
                    let n = batch.num_rows();
                    let positions = Int64Array::from_iter_values(start..start + n as i64);
                    start += n as i64;
                    let mut columns = batch.columns().to_vec();
                    columns.push(Arc::new(StringArray::from(vec![
                        task.data_file_path
                            .as_str();
                        n
                    ])));
                    columns.push(Arc::new(positions.clone()));
                    let batch = RecordBatch::try_new(schema.clone(), columns)
                        .map_err(|e| Error::Internal(format!("positioned rows: {e}")))?;
                    let live = BooleanArray::from_iter(
                        positions
                            .values()
                            .iter()
                            .map(|p| Some(deleted.binary_search(p).is_err())),
                    );
                    let batch = filter_record_batch(&batch, &live)
                        .map_err(|e| Error::Internal(format!("positioned rows: {e}")))?;
                    if batch.num_rows() > 0 {
                        out.push(batch);
                    }
                }
                Ok::<_, Error>(futures::stream::iter(out.into_iter().map(Ok)))
            }
        })
        .try_flatten()
        .boxed())
}
