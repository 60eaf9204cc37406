//! A table's live rows with where each one lives: its columns, then the data file and the
//! position in it (`lake::read::positioned`). Statements that change rows (`DELETE`,
//! `UPDATE`, `MERGE INTO`) query it through DataFusion, so their conditions, joins and
//! subqueries are plain SQL, and turn the positions they select into position deletes.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::Session;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use iceberg::scan::FileScanTask;
use iceberg::table::Table;

use crate::error::{Error, Result};
use crate::lake::deletes::Target;
use crate::lake::read::{self, FILE_COLUMN, POS_COLUMN};

/// A table's live rows in one snapshot, with [`FILE_COLUMN`] and [`POS_COLUMN`].
#[derive(Debug)]
pub struct PositionedTable {
    table: Table,
    schema: SchemaRef,
    /// The data files scans planned, by path: what a delete file of their rows names.
    targets: Arc<Mutex<HashMap<String, Target>>>,
}

impl PositionedTable {
    pub fn try_new(table: Table) -> Result<Self> {
        let schema = read::positioned_schema(&table)?;
        Ok(Self {
            table,
            schema,
            targets: Arc::default(),
        })
    }

    /// The data file at `path`, if a scan read it.
    pub fn target(&self, path: &str) -> Option<Target> {
        self.targets.lock().ok()?.get(path).cloned()
    }

    async fn plan(&self, filters: &[Expr]) -> Result<Vec<FileScanTask>> {
        // Filters on the table's own columns prune files; DataFusion applies all of them.
        let own: Vec<Expr> = filters
            .iter()
            .filter(|f| {
                f.column_refs()
                    .iter()
                    .all(|c| c.name != FILE_COLUMN && c.name != POS_COLUMN)
            })
            .cloned()
            .collect();
        let tasks = plan(&self.table, None, &own).await?;
        if let Ok(mut targets) = self.targets.lock() {
            for t in &tasks {
                targets
                    .entry(t.data_file_path.clone())
                    .or_insert_with(|| Target::of(t));
            }
        }
        Ok(tasks)
    }
}

/// The files of snapshot `snapshot` (the current one when `None`) of the table that may hold
/// rows passing `filters`, planned to read all columns: the filters iceberg-rust can bind
/// prune files by partition and column bounds; the rows still need every filter applied.
pub(super) async fn plan(
    table: &Table,
    snapshot: Option<i64>,
    filters: &[Expr],
) -> Result<Vec<FileScanTask>> {
    let build = |filter: Option<iceberg::expr::Predicate>| {
        let mut scan = table.scan().select_all();
        if let Some(id) = snapshot {
            scan = scan.snapshot_id(id);
        }
        if let Some(p) = filter {
            scan = scan.with_filter(p);
        }
        scan.build()
    };
    let scan = match iceberg_datafusion::physical_plan::convert_filters_to_predicate(filters) {
        // A filter iceberg-rust cannot bind prunes nothing.
        Some(p) => build(Some(p)).or_else(|_| build(None))?,
        None => build(None)?,
    };
    Ok(scan.plan_files().await?.try_collect().await?)
}

#[async_trait]
impl TableProvider for PositionedTable {
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
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let tasks = self.plan(filters).await?;
        // Only the columns the statement reads are read from the files (a DELETE reads its
        // condition's), then the positions.
        let all: Vec<usize> = (0..self.schema.fields().len()).collect();
        let wanted = projection.unwrap_or(&all);
        let data = self.schema.fields().len() - 2;
        let (columns, names) = columns_read(&self.schema, wanted, data);
        let mut fields: Vec<_> = columns
            .iter()
            .map(|&i| self.schema.fields()[i].clone())
            .collect();
        fields.extend(self.schema.fields()[data..].iter().cloned());
        let schema = Arc::new(datafusion::arrow::datatypes::Schema::new(fields));
        let projection: Vec<usize> = wanted
            .iter()
            .map(|&i| match columns.binary_search(&i) {
                Ok(k) => k,
                Err(_) => columns.len() + (i - data),
            })
            .collect();
        let files = Arc::new(Files {
            table: self.table.clone(),
            schema: schema.clone(),
            tasks,
            columns: Some(names),
            read: Arc::new(read::positioned_columns),
        });
        let exec =
            StreamingTableExec::try_new(schema, vec![files], Some(&projection), [], false, limit)?;
        Ok(Arc::new(exec))
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DFResult<Vec<TableProviderFilterPushDown>> {
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }
}

/// The columns of `schema` among its first `data` that a scan of `wanted` reads from the
/// files: ascending, each once, and one when it reads none (rows are counted by a column:
/// `count(*)`, `DELETE FROM t`); with their names.
pub(super) fn columns_read(
    schema: &SchemaRef,
    wanted: &[usize],
    data: usize,
) -> (Vec<usize>, Vec<String>) {
    let mut columns: Vec<usize> = wanted.iter().copied().filter(|&i| i < data).collect();
    columns.sort_unstable();
    columns.dedup();
    if columns.is_empty() && data > 0 {
        columns.push(0);
    }
    let names = columns
        .iter()
        .map(|&i| schema.field(i).name().clone())
        .collect();
    (columns, names)
}

/// How a scan reads its files (only the columns named, when named): `lake::read`'s
/// `positioned_columns`, or the rows alone in a snapshot's schema.
pub(super) type ReadFn = Arc<
    dyn Fn(
            &Table,
            Vec<FileScanTask>,
            Option<&[String]>,
        ) -> Result<BoxStream<'static, Result<RecordBatch>>>
        + Send
        + Sync,
>;

/// The files of one scan (or of one of its partitions), read one after the other by
/// `read`, in `schema` (the one the provider states).
pub(super) struct Files {
    pub(super) table: Table,
    pub(super) schema: SchemaRef,
    pub(super) tasks: Vec<FileScanTask>,
    /// The table's columns to read (all when `None`).
    pub(super) columns: Option<Vec<String>>,
    pub(super) read: ReadFn,
}

impl std::fmt::Debug for Files {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Files")
            .field("table", self.table.identifier())
            .field("files", &self.tasks.len())
            .field("columns", &self.columns)
            .finish()
    }
}

impl PartitionStream for Files {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let schema = self.schema.clone();
        let batches = match (self.read)(&self.table, self.tasks.clone(), self.columns.as_deref()) {
            Ok(rows) => rows
                .map(move |b| {
                    b.and_then(|b| {
                        b.with_schema(schema.clone())
                            .map_err(|e| Error::Internal(format!("scanning: {e}")))
                    })
                    .map_err(DataFusionError::from)
                })
                .boxed(),
            Err(e) => futures::stream::once(async move { Err(DataFusionError::from(e)) }).boxed(),
        };
        Box::pin(RecordBatchStreamAdapter::new(self.schema.clone(), batches))
    }
}
