//! Scans of a lake table split across cores: the files a query reads, after the partition and
//! column-bound pruning of its filters, in as many groups as DataFusion has target
//! partitions, balanced by bytes; each group is read by iceberg-rust's reader (deletes
//! applied) as a partition of its own.
//!
//! ```text
//! filters -> plan files (pruned) -> N groups by size -> partition i: read group i -> ...
//! EXPLAIN: LakeScan: table=ns.t, files=12 of 96, groups=2, projection=[..], predicate=[..]
//! ```
//! iceberg-datafusion's scan reads every file in one partition, so a query over a large
//! table ran on one core however many it had.
//!
//! The filters prune files; DataFusion applies them to the rows above the scan (they are
//! pushed down inexact). iceberg-rust's reader, given a file's predicate, both skips the row
//! groups whose statistics rule it out and filters every row it decodes (an Arrow row filter,
//! decoding the filter's columns first and then the others for the rows selected): that
//! costs more than the filter above does, and doubled a whole-table scan with a `<>` filter.
//! So a file is read with its predicate only when it can hold more than one row group of the
//! table's size (`write.parquet.row-group-size-bytes`), where skipping one can pay; a smaller
//! file was judged whole by its own bounds when planned, and its row groups are small
//! (`EXPLAIN ANALYZE`: `files_row_filtered`). DataFusion's own Parquet scan likewise prunes
//! row groups without filtering rows unless `pushdown_filters` is set.

use std::any::Any;
use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{RecordBatch, RecordBatchOptions};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::stats::Precision;
use datafusion::common::{ColumnStatistics, Statistics};
use datafusion::config::ConfigOptions;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_expr_common::physical_expr::snapshot_generation;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::filter_pushdown::{
    ChildPushdownResult, FilterPushdownPhase, FilterPushdownPropagation, PushedDown,
};
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use futures::{StreamExt, TryStreamExt};
use iceberg::expr::Predicate;
use iceberg::scan::FileScanTask;
use iceberg::table::Table;

use super::dynamic_filter;
use crate::error::Error;

/// Plan the scan of `table` (at `snapshot`, else its current one) for `projection` of
/// `schema` (the table's Arrow schema then) and `filters`, in at most `partitions` groups
/// of files.
pub async fn plan(
    table: &Table,
    snapshot: Option<i64>,
    schema: &SchemaRef,
    projection: Option<&Vec<usize>>,
    filters: &[Expr],
    limit: Option<usize>,
    partitions: usize,
) -> DFResult<Arc<dyn ExecutionPlan>> {
    let all: Vec<usize> = (0..schema.fields().len()).collect();
    let wanted = projection.unwrap_or(&all);
    let projected = Arc::new(schema.project(wanted)?);
    // A query that reads no column (count(*)) still reads one, for the row counts.
    let read: Vec<String> = match wanted.first() {
        Some(_) => wanted
            .iter()
            .map(|&i| schema.field(i).name().clone())
            .collect(),
        None => schema
            .fields()
            .first()
            .map(|f| vec![f.name().clone()])
            .unwrap_or_default(),
    };
    let predicate = iceberg_datafusion::physical_plan::convert_filters_to_predicate(filters);
    let build = |predicate: Option<&Predicate>| {
        let mut scan = table.scan().select(read.clone());
        if let Some(id) = snapshot {
            scan = scan.snapshot_id(id);
        }
        if let Some(p) = predicate {
            scan = scan.with_filter(p.clone());
        }
        scan.build()
    };
    // A filter iceberg-rust cannot bind prunes nothing; DataFusion applies every filter.
    let (scan, predicate) = match build(predicate.as_ref()) {
        Ok(scan) => (scan, predicate),
        Err(_) => (build(None).map_err(Error::from)?, None),
    };
    let tasks: Vec<FileScanTask> = scan
        .plan_files()
        .await
        .map_err(Error::from)?
        .try_collect()
        .await
        .map_err(Error::from)?;
    let md = table.metadata();
    let total = snapshot
        .map_or_else(|| md.current_snapshot(), |id| md.snapshot_by_id(id))
        .and_then(|s| {
            s.summary()
                .additional_properties
                .get("total-data-files")
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(tasks.len());
    let groups = balanced(tasks, partitions.max(1), |t| t.length);
    Ok(Arc::new(LakeScanExec {
        table: table.clone(),
        snapshot,
        read,
        properties: properties(&projected, groups.len()),
        schema: projected,
        groups,
        total_files: total,
        predicate,
        dynamic: Vec::new(),
        limit,
        metrics: ExecutionPlanMetricsSet::new(),
    }))
}

/// `items` in at most `n` groups of about equal `size` (largest first, each to the lightest
/// group so far); one group when there are none.
pub(super) fn balanced<T>(mut items: Vec<T>, n: usize, size: impl Fn(&T) -> u64) -> Vec<Vec<T>> {
    items.sort_by_key(|t| std::cmp::Reverse(size(t)));
    let mut groups: Vec<(u64, Vec<T>)> = (0..n.min(items.len()).max(1))
        .map(|_| (0, Vec::new()))
        .collect();
    for item in items {
        if let Some(lightest) = groups.iter_mut().min_by_key(|g| g.0) {
            lightest.0 += size(&item);
            lightest.1.push(item);
        }
    }
    groups.into_iter().map(|g| g.1).collect()
}

/// The scan: one partition per group of files.
#[derive(Debug, Clone)]
pub struct LakeScanExec {
    table: Table,
    /// The snapshot read (`None`: the table's current one when planned).
    snapshot: Option<i64>,
    /// The columns read.
    read: Vec<String>,
    schema: SchemaRef,
    groups: Vec<Vec<FileScanTask>>,
    /// The table's data files, pruned or not.
    total_files: usize,
    /// The query's filters Iceberg could bind, which pruned the files planned.
    predicate: Option<Predicate>,
    /// Filters DataFusion pushed down that are known only as the query runs (a hash join's
    /// build-side keys, a top-N's threshold): read before each file is opened, to skip more
    /// files (see [`dynamic_filter`]).
    dynamic: Vec<Arc<dyn PhysicalExpr>>,
    limit: Option<usize>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

/// What DataFusion knows of a scan in `partitions` partitions of `schema`: bounded,
/// emitted as read, in no order.
fn properties(schema: &SchemaRef, partitions: usize) -> Arc<PlanProperties> {
    Arc::new(PlanProperties::new(
        EquivalenceProperties::new(schema.clone()),
        Partitioning::UnknownPartitioning(partitions),
        EmissionType::Incremental,
        Boundedness::Bounded,
    ))
}

impl DisplayAs for LakeScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let files: usize = self.groups.iter().map(Vec::len).sum();
        let columns: Vec<&str> = self
            .schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        write!(
            f,
            "LakeScan: table={}, files={files} of {}, groups={}, projection=[{}]",
            self.table.identifier(),
            self.total_files,
            self.groups.len(),
            columns.join(",")
        )?;
        if let Some(p) = &self.predicate {
            write!(f, ", predicate=[{p}]")?;
        }
        if !self.dynamic.is_empty() {
            let filters: Vec<String> = self.dynamic.iter().map(|d| d.to_string()).collect();
            write!(f, ", dynamic_filters=[{}]", filters.join(", "))?;
        }
        if let Some(n) = self.limit {
            write!(f, ", limit={n}")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for LakeScanExec {
    fn name(&self) -> &str {
        "LakeScanExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    /// What the manifests tell of the rows read: their count (before deletes and the filters
    /// DataFusion applies above) and their size in memory, estimated from the columns' types,
    /// so that DataFusion builds a join's hash table on the smaller side.
    fn partition_statistics(&self, partition: Option<usize>) -> DFResult<Statistics> {
        let tasks: Vec<&FileScanTask> = match partition {
            Some(p) => self
                .groups
                .get(p)
                .map(|g| g.iter().collect())
                .unwrap_or_default(),
            None => self.groups.iter().flatten().collect(),
        };
        Ok(estimate(&self.schema, &tasks, self.limit))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    /// Filters pushed from above after planning (the `Post` phase: hash joins' and top-Ns'
    /// dynamic filters) are kept to prune files as they are opened; DataFusion still
    /// applies each to the rows, so none is taken over.
    fn handle_child_pushdown_result(
        &self,
        phase: FilterPushdownPhase,
        child_pushdown_result: ChildPushdownResult,
        _config: &ConfigOptions,
    ) -> DFResult<FilterPushdownPropagation<Arc<dyn ExecutionPlan>>> {
        let filters: Vec<Arc<dyn PhysicalExpr>> = child_pushdown_result
            .parent_filters
            .into_iter()
            .map(|f| f.filter)
            .collect();
        let unsupported = vec![PushedDown::No; filters.len()];
        let result = FilterPushdownPropagation::with_parent_pushdown_result(unsupported);
        if phase != FilterPushdownPhase::Post || filters.is_empty() {
            return Ok(result);
        }
        let mut scan = self.clone();
        scan.dynamic.extend(filters);
        Ok(result.with_updated_node(Arc::new(scan) as Arc<dyn ExecutionPlan>))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        let tasks = self.groups.get(partition).cloned().ok_or_else(|| {
            DataFusionError::Internal(format!("LakeScanExec has no partition {partition}"))
        })?;
        let schema = self.schema.clone();
        let reader = self
            .table
            .reader_builder()
            .with_batch_size(context.session_config().batch_size())
            .build();
        let pruner = Pruner {
            scan: self.clone(),
            generation: None,
            implied: None,
            kept: None,
            row_group: crate::lake::writer::row_group_bytes(self.table.metadata().properties()),
            pruned: MetricBuilder::new(&self.metrics).counter("files_pruned_at_run", partition),
            read: MetricBuilder::new(&self.metrics).counter("files_read", partition),
            row_filtered: MetricBuilder::new(&self.metrics)
                .counter("files_row_filtered", partition),
        };
        // Each file is kept or skipped as the reader asks for it, by the dynamic filters as
        // they stand then: a hash join's keys (set once its build side is in), a top-N's
        // threshold (tightened as rows arrive).
        let wanted = futures::stream::unfold(
            (pruner, tasks.into_iter()),
            |(mut pruner, mut tasks)| async move {
                for task in tasks.by_ref() {
                    if pruner.wants(&task).await {
                        let task = pruner.to_read(task);
                        return Some((Ok(task), (pruner, tasks)));
                    }
                }
                None
            },
        );
        let batches = reader
            .read(Box::pin(wanted))
            .map_err(|e| DataFusionError::from(Error::from(e)))?
            .stream()
            .map_err(|e| DataFusionError::from(Error::from(e)));
        let conform = schema.clone();
        let mut rows = batches
            .and_then(move |batch| {
                // The declared schema (no columns when the query reads none), its values.
                let columns = if conform.fields().is_empty() {
                    Vec::new()
                } else {
                    batch.columns().to_vec()
                };
                let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
                futures::future::ready(
                    RecordBatch::try_new_with_options(conform.clone(), columns, &options)
                        .map_err(DataFusionError::from),
                )
            })
            .boxed();
        if let Some(limit) = self.limit {
            // Each partition stops at the limit; DataFusion's own limit takes the rest.
            let mut seen = 0;
            rows = rows
                .try_take_while(move |b| {
                    let more = seen < limit;
                    seen += b.num_rows();
                    futures::future::ready(Ok(more))
                })
                .boxed();
        }
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, rows)))
    }
}

/// Whether a partition's files are still wanted by the scan's dynamic filters, decided file
/// by file as the reader asks for them: when a filter has changed since the last file, the
/// table is planned again with what the filters imply added to the query's predicate (the
/// manifests are cached) and a file is kept only if that plan has it. The tasks kept are the
/// ones planned first, so the rows of a file are filtered by the query's predicate alone (a
/// join's key list checked row by row in the reader would cost more than it saves; the join
/// does it). A filter that says nothing, or a plan that fails, keeps every file.
struct Pruner {
    scan: LakeScanExec,
    /// The filters' generation when last looked at.
    generation: Option<u64>,
    /// What they implied then.
    implied: Option<Predicate>,
    /// The files the last plan kept (`None`: all).
    kept: Option<HashSet<String>>,
    /// The table's row-group size (see the module's notes).
    row_group: u64,
    pruned: Count,
    read: Count,
    row_filtered: Count,
}

impl Pruner {
    async fn wants(&mut self, task: &FileScanTask) -> bool {
        let generation = self
            .scan
            .dynamic
            .iter()
            .fold(0u64, |g, f| g.wrapping_add(snapshot_generation(f)));
        if self.generation != Some(generation) {
            self.generation = Some(generation);
            let implied = dynamic_filter::predicate(&self.scan.dynamic);
            if implied != self.implied {
                self.kept = match &implied {
                    Some(dynamic) => self.planned(dynamic.clone()).await,
                    None => None,
                };
                self.implied = implied;
            }
        }
        let wanted = self
            .kept
            .as_ref()
            .is_none_or(|kept| kept.contains(&task.data_file_path));
        if wanted { &self.read } else { &self.pruned }.add(1);
        wanted
    }

    /// `task` as the reader is to read it: with its predicate (row groups skipped by their
    /// statistics, rows filtered as decoded) only when the file can hold more than one row
    /// group of the table's size (see the module's notes).
    fn to_read(&self, mut task: FileScanTask) -> FileScanTask {
        if task.file_size_in_bytes <= self.row_group {
            task.predicate = None;
        } else if task.predicate.is_some() {
            self.row_filtered.add(1);
        }
        task
    }

    /// The files of the table the query's predicate and `dynamic` together keep; `None` when
    /// Iceberg cannot plan with them (a key of another type than the column's).
    async fn planned(&self, dynamic: Predicate) -> Option<HashSet<String>> {
        let scan = &self.scan;
        let predicate = match &scan.predicate {
            Some(p) => p.clone().and(dynamic),
            None => dynamic,
        };
        let mut builder = scan.table.scan().select(scan.read.clone());
        if let Some(id) = scan.snapshot {
            builder = builder.snapshot_id(id);
        }
        let planned: iceberg::Result<HashSet<String>> = async {
            builder
                .with_filter(predicate)
                .build()?
                .plan_files()
                .await?
                .map_ok(|t| t.data_file_path)
                .try_collect()
                .await
        }
        .await;
        planned.ok()
    }
}

/// Bytes a value of a column of variable width is taken to hold in memory.
const VARIABLE_WIDTH: usize = 16;

/// Inexact statistics of reading `tasks` for `schema` (at most `limit` rows): the files' row
/// counts, and each column's bytes as its type's width (or [`VARIABLE_WIDTH`]) per row.
fn estimate(schema: &SchemaRef, tasks: &[&FileScanTask], limit: Option<usize>) -> Statistics {
    let rows: Option<u64> = tasks.iter().map(|t| t.record_count).sum();
    let Some(rows) = rows.map(|r| limit.map_or(r as usize, |l| l.min(r as usize))) else {
        return Statistics::new_unknown(schema);
    };
    let column_statistics: Vec<ColumnStatistics> = schema
        .fields()
        .iter()
        .map(|f| {
            let width = f.data_type().primitive_width().unwrap_or(VARIABLE_WIDTH);
            ColumnStatistics::new_unknown().with_byte_size(Precision::Inexact(rows * width))
        })
        .collect();
    let bytes = column_statistics
        .iter()
        .filter_map(|c| c.byte_size.get_value().copied())
        .sum();
    Statistics {
        num_rows: Precision::Inexact(rows),
        total_byte_size: Precision::Inexact(bytes),
        column_statistics,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_balanced_by_bytes_and_never_empty() {
        let sizes =
            |groups: &[Vec<u64>]| -> Vec<u64> { groups.iter().map(|g| g.iter().sum()).collect() };
        let groups = balanced(vec![10, 1, 9, 2, 8, 3], 2, |s| *s);
        assert_eq!(groups.len(), 2);
        assert_eq!(sizes(&groups), vec![16, 17]);
        // Fewer files than partitions: one group each; none: one empty group.
        assert_eq!(balanced(vec![5, 7], 4, |s| *s).len(), 2);
        assert_eq!(
            balanced(Vec::<u64>::new(), 4, |s| *s),
            vec![Vec::<u64>::new()]
        );
    }
}
