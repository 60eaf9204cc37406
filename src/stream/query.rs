//! A continuous query: the `SELECT` of a continuous `INSERT`, planned once and run on each
//! batch a source delivers.
//!
//! Only row-wise queries run continuously: projections, filters, scalar functions, `CAST`,
//! `CASE`, and `UNION ALL` of sources. Anything that needs the whole stream (aggregates,
//! joins, `ORDER BY`, `LIMIT`, windows, `DISTINCT`) is rejected when the job is submitted.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::provider_as_source;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{LogicalPlan, TableScan};
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::{SessionConfig, SessionContext};

use super::slot::{BatchSlot, SlotTable};
use super::source_table::SourceTable;
use crate::connector::SourceRef;
use crate::error::{Error, Result};

/// A planned continuous query.
pub struct ContinuousQuery {
    /// The sources it reads, by name, with the slot each feeds.
    sources: BTreeMap<String, (SourceRef, Arc<BatchSlot>)>,
    plan: Arc<dyn ExecutionPlan>,
    task: Arc<TaskContext>,
}

/// The sources a logical plan reads, by name.
pub fn sources_of(plan: &LogicalPlan) -> BTreeMap<String, SourceRef> {
    let mut out = BTreeMap::new();
    let _ = plan.apply(|node| {
        if let LogicalPlan::TableScan(scan) = node
            && let Some(source) = source_table(scan)
        {
            out.insert(source.name.clone(), source);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    out
}

/// The source a table scan reads, if it reads one.
fn source_table(scan: &TableScan) -> Option<SourceRef> {
    let provider = datafusion::datasource::source_as_provider(&scan.source).ok()?;
    let table = provider.as_any().downcast_ref::<SourceTable>()?;
    Some(table.source().clone())
}

/// Fail unless every node of `plan` can run on one batch at a time.
fn check_row_wise(plan: &LogicalPlan) -> Result<()> {
    let mut bad: Option<String> = None;
    let _ = plan.apply(|node| {
        let ok = match node {
            LogicalPlan::Projection(_)
            | LogicalPlan::Filter(_)
            | LogicalPlan::SubqueryAlias(_)
            | LogicalPlan::Union(_) => true,
            LogicalPlan::TableScan(scan) => {
                if source_table(scan).is_none() {
                    bad = Some(format!(
                        "it reads table {}, which is not a source; a continuous INSERT reads \
                         sources only (CREATE SOURCE)",
                        scan.table_name
                    ));
                    return Ok(TreeNodeRecursion::Stop);
                }
                true
            }
            _ => false,
        };
        if !ok {
            let what = node.display().to_string();
            let op = what.split(':').next().unwrap_or(&what).trim().to_string();
            bad = Some(format!(
                "'{op}' needs the whole stream; a continuous INSERT runs row by row \
                 (projections, filters, functions, CAST, CASE, UNION ALL)"
            ));
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    match bad {
        Some(why) => Err(Error::Plan(format!(
            "this INSERT cannot run continuously: {why}"
        ))),
        None => Ok(()),
    }
}

impl ContinuousQuery {
    /// Plan `input` (the INSERT's source query, already cast to the target's columns).
    pub async fn try_new(input: &LogicalPlan) -> Result<Self> {
        check_row_wise(input)?;
        let mut sources = BTreeMap::new();
        for (name, def) in sources_of(input) {
            sources.insert(name, (def, Arc::new(BatchSlot::default())));
        }
        let rewritten = input
            .clone()
            .transform_up(|node| {
                if let LogicalPlan::TableScan(scan) = &node
                    && let Some(source) = source_table(scan)
                    && let Some((def, slot)) = sources.get(&source.name)
                {
                    let slot_table = SlotTable::new(def.schema.clone(), slot.clone());
                    let mut scan = scan.clone();
                    scan.source = provider_as_source(Arc::new(slot_table));
                    return Ok(Transformed::yes(LogicalPlan::TableScan(scan)));
                }
                Ok(Transformed::no(node))
            })?
            .data;
        // One partition: the plan is re-executed per batch, which row-wise operators allow.
        let config = SessionConfig::new()
            .with_target_partitions(1)
            .with_coalesce_batches(false);
        let ctx = SessionContext::new_with_config(config);
        let plan = ctx.state().create_physical_plan(&rewritten).await?;
        Ok(Self {
            sources,
            plan,
            task: ctx.task_ctx(),
        })
    }

    /// The sources the query reads, by name.
    pub fn sources(&self) -> impl Iterator<Item = &SourceRef> {
        self.sources.values().map(|(d, _)| d)
    }

    /// Run the query on `batch` from source `source`.
    pub async fn run(&self, source: &str, batch: RecordBatch) -> Result<Vec<RecordBatch>> {
        let (_, slot) = self
            .sources
            .get(source)
            .ok_or_else(|| Error::Internal(format!("query has no source '{source}'")))?;
        slot.set(batch);
        let out = collect(self.plan.clone(), self.task.clone()).await;
        slot.clear();
        Ok(out?)
    }
}
