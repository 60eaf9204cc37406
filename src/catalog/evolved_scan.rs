//! Reading a table whose struct columns gained fields, file by file.
//!
//! iceberg-rust 0.10's reader cannot read a data file written before a struct column gained a
//! field (apache/iceberg-rust#2617: it matches nested fields by position). For such tables
//! floe plans the files with iceberg-rust and reads each one itself: the Parquet file as
//! Arrow, its columns matched to the table's by name, nested fields too, with NULL for what
//! the file predates (the same conversion the sink uses to write). Tables with delete files
//! are left to iceberg-rust.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use futures::{StreamExt, TryStreamExt};
use iceberg::spec::{NestedFieldRef, Schema, TableMetadata, Type};
use iceberg::table::Table;

use crate::error::Error;
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

/// A scan of the table's current snapshot, file by file; `None` when the table has delete
/// files (iceberg-rust's reader applies them).
pub async fn scan(
    table: &Table,
    schema: SchemaRef,
    projection: Option<&Vec<usize>>,
    limit: Option<usize>,
) -> DFResult<Option<Arc<dyn ExecutionPlan>>> {
    let tasks: Vec<_> = table
        .scan()
        .build()
        .map_err(Error::from)?
        .plan_files()
        .await
        .map_err(Error::from)?
        .try_collect()
        .await
        .map_err(Error::from)?;
    if tasks.iter().any(|t| !t.deletes.is_empty()) {
        return Ok(None);
    }
    let mut paths: Vec<String> = tasks.into_iter().map(|t| t.data_file_path).collect();
    paths.dedup();
    let files = Arc::new(Files {
        table: table.clone(),
        schema: schema.clone(),
        paths,
    });
    let exec = StreamingTableExec::try_new(schema, vec![files], projection, [], false, limit)?;
    Ok(Some(Arc::new(exec)))
}

/// The data files of one scan, read one after the other.
#[derive(Debug)]
struct Files {
    table: Table,
    schema: SchemaRef,
    paths: Vec<String>,
}

impl PartitionStream for Files {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let io = self.table.file_io().clone();
        let iceberg: Arc<Schema> = self.table.metadata().current_schema().clone();
        let schema = self.schema.clone();
        let batches = futures::stream::iter(self.paths.clone())
            .then(move |path| {
                let io = io.clone();
                let iceberg = iceberg.clone();
                let schema = schema.clone();
                async move {
                    let fail = |e: String| {
                        DataFusionError::External(format!("reading {path}: {e}").into())
                    };
                    let bytes = io
                        .new_input(&path)
                        .map_err(|e| fail(e.to_string()))?
                        .read()
                        .await
                        .map_err(|e| fail(e.to_string()))?;
                    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
                        .and_then(|b| b.build())
                        .map_err(|e| fail(e.to_string()))?;
                    let mut out = Vec::new();
                    for batch in reader {
                        let batch = batch.map_err(|e| fail(e.to_string()))?;
                        let conformed =
                            conform(&iceberg, &batch).map_err(|e| fail(e.to_string()))?;
                        // The table's Arrow schema as the provider states it.
                        out.push(
                            conformed
                                .with_schema(schema.clone())
                                .map_err(|e| fail(e.to_string()))?,
                        );
                    }
                    Ok::<_, DataFusionError>(futures::stream::iter(out.into_iter().map(Ok)))
                }
            })
            .try_flatten();
        Box::pin(RecordBatchStreamAdapter::new(self.schema.clone(), batches))
    }
}
