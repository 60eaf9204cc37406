//! Scans of tables iceberg-rust cannot read, file by file (`lake::read::needs_own_reader`).
//!
//! iceberg-rust 0.10's reader cannot read a data file written before a struct column gained a
//! field (apache/iceberg-rust#2617: it matches nested fields by position), and applies no
//! deletion vectors (format v3). For such tables floe plans the files with iceberg-rust
//! (filters prune files by partition and column bounds) and reads each one itself: the
//! Parquet file as Arrow, only the columns the query reads, matched to the table's by name,
//! nested fields too, with NULL for what the file predates (the same conversion the sink uses
//! to write), position deletes and deletion vectors applied; the files split across cores as
//! `split_scan` splits them. The reading itself is `lake::read`'s, which compaction and
//! `DELETE` share.

use std::any::Any;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{Schema as ArrowSchema, SchemaRef};
use datafusion::catalog::Session;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::Result as DFResult;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use futures::{StreamExt, TryStreamExt};
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::spec::SchemaRef as IcebergSchemaRef;
use iceberg::table::Table;

use super::positioned::{Files, ReadFn, columns_read};
use crate::error::{Error, Result};
use crate::lake::read;

/// A table's rows in one snapshot (its current one, or one a query travels to), read file
/// by file.
#[derive(Debug)]
pub struct FileByFile {
    table: Table,
    snapshot: Option<i64>,
    /// The snapshot's schema, in Iceberg and in Arrow.
    iceberg: IcebergSchemaRef,
    schema: SchemaRef,
}

impl FileByFile {
    pub fn try_new(table: Table, snapshot: Option<i64>) -> Result<Self> {
        let md = table.metadata();
        let iceberg = match snapshot.and_then(|id| md.snapshot_by_id(id)) {
            Some(s) => s.schema(md)?,
            None => md.current_schema().clone(),
        };
        let schema = Arc::new(schema_to_arrow_schema(&iceberg)?);
        Ok(Self {
            table,
            snapshot,
            iceberg,
            schema,
        })
    }
}

#[async_trait]
impl TableProvider for FileByFile {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let tasks = super::positioned::plan(&self.table, self.snapshot, filters).await?;
        // Only the columns the query reads are read.
        let all: Vec<usize> = (0..self.schema.fields().len()).collect();
        let wanted = projection.unwrap_or(&all);
        let (columns, names) = columns_read(&self.schema, wanted, all.len());
        let schema = Arc::new(ArrowSchema::new(
            columns
                .iter()
                .map(|&i| self.schema.fields()[i].clone())
                .collect::<Vec<_>>(),
        ));
        let projection: Vec<usize> = wanted
            .iter()
            .filter_map(|i| columns.binary_search(i).ok())
            .collect();
        let iceberg = self.iceberg.clone();
        let read: ReadFn = Arc::new(move |table, tasks, columns| {
            let names = columns.unwrap_or_default();
            let rows = read::positioned_in(table, &iceberg, tasks, Some(names))?;
            // The file and position columns come last: drop them.
            let keep: Vec<usize> = (0..names.len()).collect();
            Ok(rows
                .and_then(move |b| {
                    futures::future::ready(
                        b.project(&keep)
                            .map_err(|e| Error::Internal(format!("scanning: {e}"))),
                    )
                })
                .boxed())
        });
        // Split across cores as other lake scans are (see `split_scan`).
        let partitions = state.config_options().execution.target_partitions;
        let groups: Vec<Arc<dyn PartitionStream>> =
            super::split_scan::balanced(tasks, partitions.max(1), |t| t.length)
                .into_iter()
                .map(|tasks| {
                    Arc::new(Files {
                        table: self.table.clone(),
                        schema: schema.clone(),
                        tasks,
                        columns: Some(names.clone()),
                        read: read.clone(),
                    }) as Arc<dyn PartitionStream>
                })
                .collect();
        let exec =
            StreamingTableExec::try_new(schema, groups, Some(&projection), [], false, limit)?;
        Ok(Arc::new(exec))
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DFResult<Vec<TableProviderFilterPushDown>> {
        // Filters prune files; DataFusion applies every one to the rows.
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }
}
