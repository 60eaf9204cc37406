//! Reading a table whose struct columns gained fields, file by file.
//!
//! iceberg-rust 0.10's reader cannot read a data file written before a struct column gained a
//! field (apache/iceberg-rust#2617: it matches nested fields by position). For such tables
//! floe plans the files with iceberg-rust and reads each one itself: the Parquet file as
//! Arrow, its columns matched to the table's by name, nested fields too, with NULL for what
//! the file predates (the same conversion the sink uses to write). Tables with delete files
//! are left to iceberg-rust. The reading itself is `lake::read`'s, which compaction shares.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use futures::{StreamExt, TryStreamExt};
use iceberg::spec::Schema;
use iceberg::table::Table;

use crate::error::Error;
use crate::lake::read;

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
                    let mut out = Vec::new();
                    for conformed in read::conformed(&io, &iceberg, &path)
                        .await
                        .map_err(|e| fail(e.to_string()))?
                    {
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
