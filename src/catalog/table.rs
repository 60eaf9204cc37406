//! An Iceberg table as a DataFusion table: scans read the current snapshot (with filter
//! pushdown and partition pruning, through iceberg-datafusion's scan), inserts write data
//! files and commit them as one snapshot when the statement ends.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::Session;
use datafusion::datasource::sink::{DataSink, DataSinkExec};
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::Result as DFResult;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan};
use futures::StreamExt;
use iceberg::Catalog;
use iceberg::spec::FormatVersion;
use iceberg::table::Table;
use iceberg_datafusion::IcebergStaticTableProvider;

use super::evolved_scan;
use crate::error::Error;
use crate::lake::commit::{Committer, EvolvingAppend};
use crate::lake::maintenance::Maintained;
use crate::lake::{TableWriter, commit};

/// A table of an Iceberg catalog, as loaded for one statement.
#[derive(Debug, Clone)]
pub struct LakeTable {
    table: Table,
    catalog: Arc<dyn Catalog>,
    reader: Arc<IcebergStaticTableProvider>,
    /// Whether iceberg-rust cannot read it (scans then read file by file, see
    /// [`super::evolved_scan`]).
    own_reader: bool,
    /// The snapshot a query travels to (read-only), or the current one.
    snapshot: Option<i64>,
    /// floe's own commit path to its catalog, where there is one: INSERTs commit through it
    /// (merging manifests as they accumulate), else through iceberg-rust's append.
    committer: Option<Arc<Committer>>,
}

impl LakeTable {
    /// Wrap a freshly loaded table.
    pub async fn try_new(table: Table, catalog: Arc<dyn Catalog>) -> Result<Self, Error> {
        let reader = IcebergStaticTableProvider::try_new_from_table(table.clone()).await?;
        let own_reader = crate::lake::read::needs_own_reader(table.metadata(), None);
        Ok(Self {
            table,
            catalog,
            reader: Arc::new(reader),
            own_reader,
            snapshot: None,
            committer: None,
        })
    }

    /// The table, its INSERTs committed through `committer` (when there is one).
    pub fn committing_with(mut self, committer: Option<Arc<Committer>>) -> Self {
        self.committer = committer;
        self
    }

    /// The table as it was at snapshot `id` (time travel), for reading only; iceberg-rust
    /// reads it (a snapshot floe must read itself is `evolved_scan::FileByFile`'s).
    pub async fn at_snapshot(
        table: Table,
        catalog: Arc<dyn Catalog>,
        id: i64,
    ) -> Result<Self, Error> {
        let reader =
            IcebergStaticTableProvider::try_new_from_table_snapshot(table.clone(), id).await?;
        Ok(Self {
            table,
            catalog,
            reader: Arc::new(reader),
            own_reader: false,
            snapshot: Some(id),
            committer: None,
        })
    }

    /// The Iceberg table.
    pub fn table(&self) -> &Table {
        &self.table
    }

    /// The catalog it belongs to.
    pub fn catalog(&self) -> &Arc<dyn Catalog> {
        &self.catalog
    }
}

#[async_trait]
impl TableProvider for LakeTable {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        self.reader.schema()
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
        if self.own_reader {
            return evolved_scan::FileByFile::try_new(self.table.clone(), None)?
                .scan(state, projection, filters, limit)
                .await;
        }
        let partitions = state.config_options().execution.target_partitions;
        super::split_scan::plan(
            &self.table,
            self.snapshot,
            &self.reader.schema(),
            projection,
            filters,
            limit,
            partitions,
        )
        .await
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DFResult<Vec<TableProviderFilterPushDown>> {
        if self.own_reader {
            // Read file by file: filters prune files, every one is applied above the scan.
            return Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()]);
        }
        self.reader.supports_filters_pushdown(filters)
    }

    async fn insert_into(
        &self,
        _state: &dyn Session,
        input: Arc<dyn ExecutionPlan>,
        insert_op: InsertOp,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        if let Some(id) = self.snapshot {
            return Err(Error::Unsupported(format!(
                "INSERT into {} as of snapshot {id}: a table's past is read-only",
                self.table.identifier()
            ))
            .into());
        }
        if insert_op != InsertOp::Append {
            return Err(Error::Unsupported(format!(
                "INSERT {insert_op} into an Iceberg table; floe appends (INSERT INTO)"
            ))
            .into());
        }
        let sink = AppendSink {
            table: self.table.clone(),
            catalog: self.catalog.clone(),
            committer: self.committer.clone(),
            schema: self.schema(),
        };
        Ok(Arc::new(DataSinkExec::new(input, Arc::new(sink), None)))
    }
}

/// Writes all rows of an `INSERT` and commits them as one snapshot at the end, so the
/// statement is atomic: it adds all its rows or none.
#[derive(Debug)]
struct AppendSink {
    table: Table,
    catalog: Arc<dyn Catalog>,
    committer: Option<Arc<Committer>>,
    schema: SchemaRef,
}

impl DisplayAs for AppendSink {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IcebergAppend: table={}", self.table.identifier())
    }
}

#[async_trait]
impl DataSink for AppendSink {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    async fn write_all(
        &self,
        mut data: SendableRecordBatchStream,
        context: &Arc<TaskContext>,
    ) -> DFResult<u64> {
        // The files' columns are encoded on as many threads as the query runs on.
        let threads = context.session_config().target_partitions();
        let mut writer = TableWriter::try_new(&self.table)?.encoding_on(threads);
        while let Some(batch) = data.next().await {
            writer.write(batch?).await?;
        }
        let rows = writer.rows();
        let files = writer.close().await?;
        let summary = HashMap::from([("floe.operation".to_string(), "insert".to_string())]);
        let own = self
            .committer
            .clone()
            .filter(|_| self.table.metadata().format_version() != FormatVersion::V1);
        let Some(committer) = own.filter(|_| !files.is_empty()) else {
            let (catalog, table) = (&self.catalog, &self.table);
            commit::append(catalog, table, files, summary, HashMap::new()).await?;
            return Ok(rows);
        };
        // floe's own path: the same snapshot, with the table's small manifests merged as
        // they accumulate (`lake::commit::merge`); prepared again on the table as another
        // writer left it when that writer won.
        let spec_id = self.table.metadata().default_partition_spec_id();
        let target = Maintained {
            catalog: self.catalog.clone(),
            committer,
            ident: self.table.identifier().clone(),
        };
        target
            .commit(|base| {
                let change = EvolvingAppend {
                    schema: None,
                    spec: None,
                    files: vec![(spec_id, files.clone())],
                    summary: summary.clone(),
                    properties: HashMap::new(),
                };
                async move { Ok(Some((commit::prepare(&base, change).await?, ()))) }
            })
            .await?;
        Ok(rows)
    }
}
