//! Two or more aggregates in one continuous query (each over its own streams, the query above
//! joining their rows, as Nexmark's q8 joins the persons and the auctions of each window) run
//! as one: the job keeps one aggregate's state, over the union of the aggregates' rows, each row
//! tagged with its branch.
//!
//! ```text
//! Join(Agg_0(in_0), Agg_1(in_1))
//!   --> Join(View_0, View_1), View_j = Projection(Filter(__floe_branch = j, Agg))
//!       Agg = Aggregate(GROUP BY __floe_branch, window_start, window_end, keys of each branch;
//!                       each branch's aggregates FILTER (WHERE __floe_branch = j))
//!             over Union(Projection_0(in_0), Projection_1(in_1)), a branch's columns NULL in
//!             the other branches' rows
//! ```
//!
//! Over windows, every branch emits a window when the job's watermark (the smallest of its
//! sources') passes its end, so the windows the query above joins are emitted together: the
//! join needs no state of its own. A view reads the merged aggregate's rows as the aggregate
//! it stands for emitted them, under the same names.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, ScalarValue};
use datafusion::logical_expr::{
    Aggregate, Expr, ExprSchemable, LogicalPlan, LogicalPlanBuilder, cast, col, lit,
};

use super::aggregate::lowest_stateful;
use crate::error::{Error, Result};
use crate::sql::windows::{SessionGroup, WINDOW_END, WINDOW_START, origin, reads_processing_time};

/// The column of the merged aggregate's rows that says which aggregate a row is of.
const BRANCH: &str = "__floe_branch";

/// `plan` with its lowest aggregates merged into one when it has more than one (see the
/// module's documentation); unchanged otherwise.
pub fn merge_aggregates(plan: LogicalPlan) -> Result<LogicalPlan> {
    let mut aggregates: Vec<Aggregate> = Vec::new();
    let mut other = false;
    for node in lowest_stateful(&plan) {
        match node {
            LogicalPlan::Aggregate(a) if !aggregates.contains(a) => aggregates.push(a.clone()),
            LogicalPlan::Aggregate(_) => {}
            _ => other = true,
        }
    }
    // One aggregate, or a top-N beside one (refused where the stateful step is planned).
    if aggregates.len() < 2 || other {
        return Ok(plan);
    }
    let refuse = |why: &str| {
        Err(Error::Plan(format!(
            "this INSERT cannot run continuously: it has {} aggregates, {why}",
            aggregates.len()
        )))
    };
    let windowed: Vec<bool> = aggregates
        .iter()
        .map(|a| {
            a.group_expr
                .iter()
                .any(|e| matches!(e, Expr::Column(c) if c.name == WINDOW_END))
        })
        .collect();
    if windowed.iter().any(|w| !w) {
        return refuse(
            "and aggregates run side by side only over windows (each grouped by window_start, \
             window_end, ...), whose rows are emitted together when the watermark passes the \
             windows; aggregate the streams' union once instead",
        );
    }
    for a in &aggregates {
        if SessionGroup::of(a)?.is_some() {
            return refuse("and SESSION windows run in a query's only aggregate");
        }
        let proctime = a.group_expr.iter().any(|e| {
            matches!(e, Expr::Column(c) if c.name == WINDOW_END)
                && reads_processing_time(&origin(&a.input, e.clone()))
        });
        if proctime {
            return refuse(
                "and windows over processing time (PROCTIME()) run in a query's only aggregate",
            );
        }
        if a.group_expr
            .iter()
            .any(|e| matches!(e, Expr::GroupingSet(_)))
        {
            return refuse("and GROUPING SETS, ROLLUP and CUBE do not run continuously yet");
        }
    }

    // The union's columns: the window's, shared, then each branch's own, by the name each
    // branch's columns go by in it.
    let mut shared: Vec<(&str, DataType)> = Vec::new();
    for name in [WINDOW_START, WINDOW_END] {
        let typed = aggregates.iter().find_map(|a| {
            a.input
                .schema()
                .fields()
                .iter()
                .find(|f| f.name() == name)
                .map(|f| f.data_type().clone())
        });
        if let Some(t) = typed {
            shared.push((name, t));
        }
    }
    let mut renames: Vec<BTreeMap<Column, String>> = Vec::new();
    let mut own: Vec<(String, DataType, usize)> = Vec::new();
    for (j, a) in aggregates.iter().enumerate() {
        let mut names = BTreeMap::new();
        let mut refs: Vec<Column> = Vec::new();
        for e in a.group_expr.iter().chain(&a.aggr_expr) {
            for c in e.column_refs() {
                if !refs.contains(c) {
                    refs.push(c.clone());
                }
            }
        }
        for c in refs {
            if shared.iter().any(|(n, _)| *n == c.name) {
                names.insert(c.clone(), c.name.clone());
                continue;
            }
            let name = format!("__floe_b{j}_{}", own.len());
            let t = a
                .input
                .schema()
                .qualified_field_from_column(&c)?
                .1
                .data_type()
                .clone();
            own.push((name.clone(), t, j));
            names.insert(c, name);
        }
        renames.push(names);
    }

    // Each branch's rows with every column of the union.
    let mut union: Option<LogicalPlanBuilder> = None;
    for (j, a) in aggregates.iter().enumerate() {
        let schema = a.input.schema();
        let mut exprs = vec![lit(j as i32).alias(BRANCH)];
        for (name, t) in &shared {
            // The window column the branch's own expressions read, or any of its input's.
            let read = renames[j].keys().find(|c| c.name == *name).cloned();
            let e = match read.or_else(|| {
                let i = schema.fields().iter().position(|f| f.name() == name)?;
                Some(Column::from(schema.qualified_field(i)))
            }) {
                Some(c) => Expr::Column(c),
                None => lit(ScalarValue::try_from(t)?),
            };
            exprs.push(cast(e, t.clone()).alias(*name));
        }
        for (name, t, owner) in &own {
            let e = match renames[j].iter().find(|(_, n)| *n == name) {
                Some((c, _)) if *owner == j => Expr::Column(c.clone()),
                _ => lit(ScalarValue::try_from(t)?),
            };
            exprs.push(cast(e, t.clone()).alias(name));
        }
        let branch = LogicalPlanBuilder::from(a.input.as_ref().clone())
            .project(exprs)?
            .build()?;
        union = Some(match union {
            None => LogicalPlanBuilder::from(branch),
            Some(u) => u.union(branch)?,
        });
    }
    let union = union
        .ok_or_else(|| Error::Internal("merging aggregates without any".into()))?
        .build()?;

    // One aggregate: grouped by branch, the windows and every branch's keys; each branch's
    // aggregates over its own rows.
    let rename = |j: usize, e: &Expr| -> Result<Expr> {
        Ok(e.clone()
            .transform(|e| match e {
                Expr::Column(c) => match renames[j].get(&c) {
                    Some(name) => Ok(Transformed::yes(col(Column::new_unqualified(name)))),
                    None => Ok(Transformed::no(Expr::Column(c))),
                },
                e => Ok(Transformed::no(e)),
            })?
            .data)
    };
    let mut group: Vec<Expr> = vec![col(BRANCH)];
    let mut group_of: Vec<Vec<Expr>> = Vec::new();
    for (j, a) in aggregates.iter().enumerate() {
        let mut mine = Vec::new();
        for e in &a.group_expr {
            let renamed = rename(j, e)?;
            if !group.contains(&renamed) {
                group.push(renamed.clone());
            }
            mine.push(renamed);
        }
        group_of.push(mine);
    }
    let mut aggr: Vec<Expr> = Vec::new();
    let mut aggr_of: Vec<Vec<String>> = Vec::new();
    for (j, a) in aggregates.iter().enumerate() {
        let mut mine = Vec::new();
        for (k, e) in a.aggr_expr.iter().enumerate() {
            let only_mine = col(BRANCH).eq(lit(j as i32));
            let filtered = rename(j, e)?
                .transform(|e| match e {
                    Expr::AggregateFunction(mut f) => {
                        f.params.filter = Some(Box::new(match f.params.filter.take() {
                            Some(filter) => filter.as_ref().clone().and(only_mine.clone()),
                            None => only_mine.clone(),
                        }));
                        Ok(Transformed::new(
                            Expr::AggregateFunction(f),
                            true,
                            TreeNodeRecursion::Jump,
                        ))
                    }
                    e => Ok(Transformed::no(e)),
                })?
                .data;
            let name = format!("__floe_b{j}_a{k}");
            aggr.push(filtered.alias(&name));
            mine.push(name);
        }
        aggr_of.push(mine);
    }
    let merged = LogicalPlan::Aggregate(Aggregate::try_new(Arc::new(union), group, aggr)?);

    // Each aggregate's view of the merged rows, under its own columns' names.
    let mut views = Vec::new();
    for (j, a) in aggregates.iter().enumerate() {
        let merged_schema = merged.schema();
        let mut exprs = Vec::new();
        for (k, (qualifier, field)) in a.schema.iter().enumerate() {
            let source = if k < group_of[j].len() {
                let name = group_of[j][k].schema_name().to_string();
                let i = merged_schema
                    .fields()
                    .iter()
                    .position(|f| *f.name() == name)
                    .ok_or_else(|| Error::Internal(format!("merged group {name} not found")))?;
                Expr::Column(Column::from(merged_schema.qualified_field(i)))
            } else {
                col(Column::new_unqualified(&aggr_of[j][k - group_of[j].len()]))
            };
            let t = source.get_type(merged_schema.as_ref())?;
            let source = if &t == field.data_type() {
                source
            } else {
                cast(source, field.data_type().clone())
            };
            exprs.push(source.alias_qualified(qualifier.cloned(), field.name()));
        }
        let view = LogicalPlanBuilder::from(merged.clone())
            .filter(col(BRANCH).eq(lit(j as i32)))?
            .project(exprs)?
            .build()?;
        views.push((LogicalPlan::Aggregate(a.clone()), view));
    }
    let out = plan.transform_down(|n| {
        Ok(match views.iter().find(|(a, _)| *a == n) {
            Some((_, view)) => Transformed::new(view.clone(), true, TreeNodeRecursion::Jump),
            None => Transformed::no(n),
        })
    })?;
    Ok(out.data)
}
