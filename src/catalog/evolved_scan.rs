//! Reading a table whose struct columns gained fields, file by file.
//!
//! iceberg-rust 0.10's reader cannot read a data file written before a struct column gained a
//! field (apache/iceberg-rust#2617: it matches nested fields by position). For such tables
//! floe plans the files with iceberg-rust and reads each one itself: the Parquet file as
//! Arrow, its columns matched to the table's by name, nested fields too, with NULL for what
//! the file predates (the same conversion the sink uses to write), position deletes applied.
//! The reading itself is `lake::read`'s, which compaction and `DELETE` share.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::error::Result as DFResult;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::streaming::StreamingTableExec;
use iceberg::table::Table;

use super::positioned::Files;

use crate::lake::read;

/// A scan of the table's current snapshot, file by file.
pub async fn scan(
    table: &Table,
    schema: SchemaRef,
    projection: Option<&Vec<usize>>,
    limit: Option<usize>,
) -> DFResult<Arc<dyn ExecutionPlan>> {
    let tasks = read::plan_all(table).await?;
    let files = Arc::new(Files {
        table: table.clone(),
        schema: schema.clone(),
        tasks,
        columns: None,
        read: |table, tasks, _| read::live(table, tasks),
    });
    let exec = StreamingTableExec::try_new(schema, vec![files], projection, [], false, limit)?;
    Ok(Arc::new(exec))
}
