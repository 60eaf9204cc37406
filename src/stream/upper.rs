//! The query above a continuous query's stateful step (its aggregate or top-N): run on the
//! rows the step emits, as a batch query over them.
//!
//! ```text
//! rows of the closing windows, or of the groups updated --> [slot] --> the plan above
//! ```
//!
//! Above windows it may be any query that keeps windows apart: aggregates grouped by
//! `window_end`, joins on it (the same windows of two views of the emitted rows, as a CTE read
//! twice), window functions partitioned by it; the rows of the windows a watermark closes are
//! then all it needs. Above an updating step, a row-wise plan (projections, HAVING) runs on the
//! groups updated since the last checkpoint; anything else runs on every group's row, each time.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::arrow::array::{RecordBatch, RecordBatchOptions};
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::common::Column;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::provider_as_source;
use datafusion::execution::TaskContext;
use datafusion::execution::session_state::SessionState;
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder, Operator};
use datafusion::physical_plan::execution_plan::reset_plan_states;
use datafusion::physical_plan::{ExecutionPlan, collect, displayable};

use super::slot::{BatchSlot, SlotTable};
use crate::error::{Error, Result};
use crate::sql::windows::WINDOW_END;

/// The name the emitted rows go by in the plan above.
const EMITTED: &str = "__floe_emitted";

/// The plan above a stateful step, over the rows it emits.
pub struct Upper {
    slot: Arc<BatchSlot>,
    exec: Arc<dyn ExecutionPlan>,
    /// The emitted rows as the plan reads them.
    input: SchemaRef,
    /// Whether it runs row by row (projections, filters): each output row is one emitted row's.
    row_wise: bool,
}

impl Upper {
    /// The plan of `rows` (a continuous query's rows) above `node` (its stateful step, every
    /// occurrence of it), over rows of `emitted` (the step's physical output). Above windows
    /// (`windowed`), fails unless it keeps windows apart.
    pub async fn try_new(
        rows: &LogicalPlan,
        node: &LogicalPlan,
        emitted: &SchemaRef,
        state: &SessionState,
        windowed: bool,
    ) -> Result<Self> {
        let slot = Arc::new(BatchSlot::default());
        // The columns under their own names, made unique where two relations share one; a
        // projection gives each its name and relation again.
        let schema = node.schema();
        if schema.fields().len() != emitted.fields().len() {
            return Err(Error::Internal(format!(
                "the stateful step emits {} columns, its plan {}",
                emitted.fields().len(),
                schema.fields().len()
            )));
        }
        let unique = |i: usize, name: &str| {
            let shared = schema.fields().iter().filter(|f| f.name() == name).count() > 1;
            if shared {
                format!("{name}#{i}")
            } else {
                name.to_string()
            }
        };
        let fields: Vec<Field> = emitted
            .fields()
            .iter()
            .zip(schema.fields())
            .enumerate()
            .map(|(i, (f, named))| Field::new(unique(i, named.name()), f.data_type().clone(), true))
            .collect();
        let input = Arc::new(Schema::new(fields));
        let table = Arc::new(SlotTable::new(input.clone(), slot.clone()));
        let names = schema
            .iter()
            .enumerate()
            .map(|(i, (qualifier, field))| {
                Expr::Column(Column::new(Some(EMITTED), unique(i, field.name())))
                    .alias_qualified(qualifier.cloned(), field.name())
            })
            .collect::<Vec<_>>();
        let leaf = LogicalPlanBuilder::scan(EMITTED, provider_as_source(table), None)?
            .project(names)?
            .build()?;
        // Every occurrence of the step is replaced (and what is below it left out), then
        // the nodes above are given their input's schema.
        let upper = rows
            .clone()
            .transform_down(|n| {
                Ok(if &n == node {
                    Transformed::new(leaf.clone(), true, TreeNodeRecursion::Jump)
                } else {
                    Transformed::no(n)
                })
            })?
            .data
            .transform_up(|n| Ok(Transformed::yes(n.recompute_schema()?)))?
            .data;
        let mut row_wise = true;
        upper.apply(|n| {
            row_wise &= match n {
                LogicalPlan::Projection(_)
                | LogicalPlan::Filter(_)
                | LogicalPlan::SubqueryAlias(_) => true,
                LogicalPlan::TableScan(scan) => scan.table_name.table() == EMITTED,
                _ => false,
            };
            Ok(TreeNodeRecursion::Continue)
        })?;
        check_reads_only_emitted(&upper)?;
        if windowed && !row_wise {
            window_columns(rows, node).map_err(|why| {
                Error::Plan(format!(
                    "this INSERT cannot run continuously: {why}; above windows, a query keeps \
                     each window's rows apart (GROUP BY, JOIN ON and PARTITION BY window_end)"
                ))
            })?;
        }
        let exec = state.create_physical_plan(&upper).await?;
        Ok(Self {
            slot,
            exec,
            input,
            row_wise,
        })
    }

    /// Whether each of its rows comes from one emitted row (else it needs them all).
    pub fn is_row_wise(&self) -> bool {
        self.row_wise
    }

    /// Its output schema.
    pub fn schema(&self) -> SchemaRef {
        self.exec.schema()
    }

    /// Its rows over `emitted`, as one batch.
    pub async fn run(
        &self,
        task: &Arc<TaskContext>,
        emitted: Vec<RecordBatch>,
    ) -> Result<RecordBatch> {
        let emitted = emitted
            .into_iter()
            .map(|b| {
                let options = RecordBatchOptions::new().with_row_count(Some(b.num_rows()));
                RecordBatch::try_new_with_options(
                    self.input.clone(),
                    b.columns().to_vec(),
                    &options,
                )
                .map_err(|e| Error::Internal(format!("the emitted rows: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        self.slot.set_all(emitted);
        // A join keeps what it built from one run for the next: each run starts it afresh.
        let exec = reset_plan_states(self.exec.clone());
        let out = match exec {
            Ok(exec) => collect(exec, task.clone())
                .await
                .map_err(Error::from_execution),
            Err(e) => Err(e.into()),
        };
        self.slot.clear();
        concat_batches(&self.schema(), &out?)
            .map_err(|e| Error::Internal(format!("joining the emitted rows: {e}")))
    }

    /// Its plan, for `EXPLAIN`, each line indented by `indent`; the emitted rows' leaf left out.
    pub fn explain(&self, indent: &str) -> String {
        displayable(self.exec.as_ref())
            .indent(true)
            .to_string()
            .lines()
            .filter(|l| {
                let l = l.trim_start();
                !l.starts_with("SourceBatchExec") && !l.starts_with("CooperativeExec")
            })
            .map(|l| format!("{indent}{l}\n"))
            .collect()
    }
}

/// Fail when the plan above reads anything but the emitted rows (a source, or a table).
fn check_reads_only_emitted(upper: &LogicalPlan) -> Result<()> {
    let mut other = None;
    // Subqueries too: a step read in one is not replaced, and would read the sources.
    upper.apply_with_subqueries(|n| {
        if let LogicalPlan::TableScan(scan) = n
            && scan.table_name.table() != EMITTED
        {
            other = Some(scan.table_name.to_string());
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    match other {
        Some(table) => Err(Error::Plan(format!(
            "this INSERT cannot run continuously: it reads {table} above its aggregate; a \
             continuous query reads its sources below its one aggregate or top-N, which the \
             rest of the query reads the rows of"
        ))),
        None => Ok(()),
    }
}

/// The columns of `plan`'s rows (by position) that hold the end of the windows `node` emits
/// (which names a window: `window_start` does not, for `CUMULATE`), or why an operator of
/// `plan` would mix the rows of different windows.
fn window_columns(
    plan: &LogicalPlan,
    node: &LogicalPlan,
) -> std::result::Result<BTreeSet<usize>, String> {
    if plan == node {
        return Ok(node
            .schema()
            .fields()
            .iter()
            .enumerate()
            .filter(|(_, f)| f.name() == WINDOW_END)
            .map(|(i, _)| i)
            .collect());
    }
    let is_window = |input: &LogicalPlan, keys: &BTreeSet<usize>, e: &Expr| -> bool {
        match e.clone().unalias() {
            Expr::Column(c) => input
                .schema()
                .index_of_column(&c)
                .is_ok_and(|i| keys.contains(&i)),
            _ => false,
        }
    };
    let single = |p: &LogicalPlan| -> std::result::Result<(LogicalPlan, BTreeSet<usize>), String> {
        let input = p
            .inputs()
            .into_iter()
            .next()
            .ok_or_else(|| "an operator without input".to_string())?
            .clone();
        let keys = window_columns(&input, node)?;
        Ok((input, keys))
    };
    match plan {
        LogicalPlan::Filter(_) | LogicalPlan::SubqueryAlias(_) => Ok(single(plan)?.1),
        LogicalPlan::Sort(s) if s.fetch.is_none() => Ok(single(plan)?.1),
        LogicalPlan::Projection(p) => {
            let keys = window_columns(&p.input, node)?;
            Ok(p.expr
                .iter()
                .enumerate()
                .filter(|(_, e)| is_window(&p.input, &keys, e))
                .map(|(i, _)| i)
                .collect())
        }
        LogicalPlan::Aggregate(a) => {
            let keys = window_columns(&a.input, node)?;
            let out: BTreeSet<usize> = a
                .group_expr
                .iter()
                .enumerate()
                .filter(|(_, e)| is_window(&a.input, &keys, e))
                .map(|(i, _)| i)
                .collect();
            if out.is_empty() {
                return Err("an aggregate above the windows is not grouped by a window".into());
            }
            Ok(out)
        }
        LogicalPlan::Window(w) => {
            let keys = window_columns(&w.input, node)?;
            let partitioned = w.window_expr.iter().all(|e| match e.clone().unalias() {
                Expr::WindowFunction(f) => f
                    .params
                    .partition_by
                    .iter()
                    .any(|p| is_window(&w.input, &keys, p)),
                _ => false,
            });
            if !partitioned {
                return Err(
                    "a window function above the windows is not partitioned by a window".into(),
                );
            }
            Ok(keys)
        }
        LogicalPlan::Join(j) => {
            let left = window_columns(&j.left, node)?;
            let right = window_columns(&j.right, node)?;
            let mut pairs: Vec<(Expr, Expr)> = j.on.clone();
            if let Some(filter) = &j.filter {
                for c in datafusion::logical_expr::utils::split_conjunction(filter) {
                    if let Expr::BinaryExpr(b) = c
                        && b.op == Operator::Eq
                    {
                        pairs.push((*b.left.clone(), *b.right.clone()));
                    }
                }
            }
            let on_window = pairs.iter().any(|(l, r)| {
                (is_window(&j.left, &left, l) && is_window(&j.right, &right, r))
                    || (is_window(&j.left, &left, r) && is_window(&j.right, &right, l))
            });
            if !on_window {
                return Err("a join above the windows does not join on a window".into());
            }
            use datafusion::logical_expr::JoinType;
            let width = j.left.schema().fields().len();
            Ok(match j.join_type {
                JoinType::LeftSemi | JoinType::LeftAnti | JoinType::LeftMark => left,
                JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark => right,
                _ => left
                    .into_iter()
                    .chain(right.into_iter().map(|i| i + width))
                    .collect(),
            })
        }
        LogicalPlan::Distinct(datafusion::logical_expr::Distinct::On(_)) => Err(
            "DISTINCT ON above the windows needs every window's rows; rank within \
                 windows instead (ROW_NUMBER() OVER (PARTITION BY window_end, ...))"
                .into(),
        ),
        LogicalPlan::Distinct(_) => {
            let keys = single(plan)?.1;
            if keys.is_empty() {
                return Err("a DISTINCT above the windows does not keep a window".into());
            }
            Ok(keys)
        }
        other => Err(format!(
            "'{}' above the windows needs every window's rows",
            other.display()
        )),
    }
}
