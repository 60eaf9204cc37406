//! Window table functions in `FROM`, spelled as Flink SQL and RisingWave users know them:
//!
//! ```text
//! TUMBLE(table, time_column, size [, offset])          one window per row
//! HOP(table, time_column, slide, size [, offset])      size / slide windows per row
//! ```
//!
//! Each reads `table` (a source, any table for an ad-hoc query, or a subquery in parentheses,
//! as `TUMBLE((SELECT ... UNION ALL SELECT ...), ts, size)`) with two more columns,
//! `window_start` and `window_end`, of the time column's type: the windows of `size` (aligned
//! to the epoch, shifted by `offset`) that hold the row's time. Flink's
//! `TUMBLE(TABLE t, DESCRIPTOR(ts), ...)` spelling is taken without the `TABLE` keyword
//! (`DESCRIPTOR(ts)` is the column). A continuous aggregate grouped by `window_end` emits each
//! window when the watermark passes its end (`stream::aggregate`).

use std::ops::ControlFlow;

use datafusion::arrow::datatypes::{DataType, IntervalMonthDayNano};
use datafusion::common::{DFSchema, ScalarValue, plan_datafusion_err, plan_err};
use datafusion::error::Result as DFResult;
use datafusion::logical_expr::planner::{
    PlannedRelation, RelationPlanner, RelationPlannerContext, RelationPlanning,
};
use datafusion::logical_expr::{Expr, ExprSchemable, LogicalPlan, LogicalPlanBuilder, col, lit};
use datafusion::sql::sqlparser::ast::{
    Expr as SqlExpr, FunctionArg, FunctionArgExpr, FunctionArguments, Ident, ObjectName,
    ObjectNamePart, TableFactor, VisitorMut,
};

/// The window columns a window function adds.
pub const WINDOW_START: &str = "window_start";
pub const WINDOW_END: &str = "window_end";

/// How far back a window starts, while `HOP` spreads rows over their windows.
const HOP_BACK: &str = "__floe_hop";

/// Plans `TUMBLE(...)` and `HOP(...)` in `FROM`.
#[derive(Debug, Default)]
pub struct WindowFunctions;

/// The first argument that marks a window function once [`WindowRewriter`] has moved its
/// table into the function's place: `TUMBLE(events, ...)` is planned as
/// `events(__window_tumble, ...)`, so that DataFusion, which loads the tables a statement names
/// before planning it, loads `events`.
const MARK: &str = "__window_";

/// Rewrites `TUMBLE(table, ...)` (and the other window functions) in `FROM` as
/// `table(__window_tumble, ...)` (see [`MARK`]).
pub struct WindowRewriter;

impl VisitorMut for WindowRewriter {
    type Break = ();

    fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
        if let TableFactor::Table {
            name,
            args: Some(args),
            ..
        } = factor
            && let [ObjectNamePart::Identifier(function)] = name.0.as_slice()
            && FUNCTIONS.contains(&function.value.to_ascii_uppercase().as_str())
            && let Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(first))) = args.args.first()
            && let Some(table) = table_name(first)
        {
            let mark = Ident::new(format!("{MARK}{}", function.value.to_ascii_lowercase()));
            args.args[0] = FunctionArg::Unnamed(FunctionArgExpr::Expr(SqlExpr::Identifier(mark)));
            *name = table;
        }
        ControlFlow::Continue(())
    }
}

/// The window functions.
const FUNCTIONS: [&str; 4] = ["TUMBLE", "HOP", "SESSION", "CUMULATE"];

impl RelationPlanner for WindowFunctions {
    fn plan_relation(
        &self,
        relation: TableFactor,
        context: &mut dyn RelationPlannerContext,
    ) -> DFResult<RelationPlanning> {
        let TableFactor::Table {
            name,
            args: Some(args),
            alias,
            ..
        } = &relation
        else {
            return Ok(RelationPlanning::Original(Box::new(relation)));
        };
        // The windowed rows: a table (moved into the function's place by WindowRewriter), or
        // a subquery (`TUMBLE((SELECT ... UNION ALL ...), ts, size)`).
        let (function, inner) = match (args.args.first(), name.0.as_slice()) {
            (Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(SqlExpr::Identifier(id)))), _)
                if id.value.to_ascii_lowercase().starts_with(MARK) =>
            {
                let mut inner = relation.clone();
                if let TableFactor::Table { args, alias, .. } = &mut inner {
                    *args = None;
                    *alias = None;
                }
                (id.value[MARK.len()..].to_ascii_uppercase(), inner)
            }
            (
                Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(SqlExpr::Subquery(query)))),
                [ObjectNamePart::Identifier(f)],
            ) if FUNCTIONS.contains(&f.value.to_ascii_uppercase().as_str()) => (
                f.value.to_ascii_uppercase(),
                TableFactor::Derived {
                    lateral: false,
                    subquery: query.clone(),
                    alias: None,
                    sample: None,
                },
            ),
            _ => return Ok(RelationPlanning::Original(Box::new(relation))),
        };
        let args = positional(&function, &args.args)?;
        let usage = match function.as_str() {
            "TUMBLE" => "TUMBLE(table, time_column, size [, offset])",
            "HOP" => "HOP(table, time_column, slide, size [, offset])",
            other => {
                return plan_err!(
                    "{other} windows are not supported yet; use TUMBLE(table, time_column, \
                     size) or HOP(table, time_column, slide, size)"
                );
            }
        };
        let intervals = if function == "TUMBLE" { 1 } else { 2 };
        if args.len() < 2 + intervals || args.len() > 3 + intervals {
            return plan_err!("{function} takes {usage}");
        }
        let input = context.plan(inner)?;
        let time_arg = descriptor(&args[1]);
        let time = context.sql_to_expr(time_arg.clone(), input.schema())?;
        let time_type = time.get_type(input.schema())?;
        if !matches!(time_type, DataType::Timestamp(_, _)) {
            return plan_err!(
                "{function}: the time column {time_arg} must be a TIMESTAMP, it is {time_type}"
            );
        }
        let empty = DFSchema::empty();
        let mut interval = |i: usize, what: &str| -> DFResult<i64> {
            let e = context.sql_to_expr(args[i].clone(), &empty)?;
            micros_of_interval(&e).ok_or_else(|| {
                plan_datafusion_err!(
                    "{function}: the {what} must be an INTERVAL of days or less (as INTERVAL '1' \
                     MINUTE), got {}",
                    args[i]
                )
            })
        };
        let (slide, size) = if function == "TUMBLE" {
            let size = interval(2, "size")?;
            (size, size)
        } else {
            (interval(2, "slide")?, interval(3, "size")?)
        };
        let offset = if args.len() > 2 + intervals {
            interval(2 + intervals, "offset")?
        } else {
            0
        };
        if size <= 0 || slide <= 0 {
            return plan_err!("{function}: a window's size and slide must be positive");
        }
        if size % slide != 0 {
            return plan_err!(
                "{function}: the size ({}) must be a whole multiple of the slide ({})",
                args[3],
                args[2]
            );
        }
        let plan = windowed(input, time, slide, size, offset)?;
        Ok(RelationPlanning::Planned(Box::new(PlannedRelation::new(
            plan,
            alias.clone(),
        ))))
    }
}

/// The arguments of a window function, which takes them by position.
fn positional(function: &str, args: &[FunctionArg]) -> DFResult<Vec<SqlExpr>> {
    args.iter()
        .map(|a| match a {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Ok(e.clone()),
            other => plan_err!("{function} takes its arguments by position, got {other}"),
        })
        .collect()
}

/// The table an argument names (`events`, `lake.shop.orders`).
fn table_name(arg: &SqlExpr) -> Option<ObjectName> {
    let parts: Vec<Ident> = match arg {
        SqlExpr::Identifier(id) => vec![id.clone()],
        SqlExpr::CompoundIdentifier(ids) => ids.clone(),
        _ => return None,
    };
    Some(ObjectName(
        parts.into_iter().map(ObjectNamePart::Identifier).collect(),
    ))
}

/// The column of a time argument: `ts`, or Flink's `DESCRIPTOR(ts)`.
fn descriptor(arg: &SqlExpr) -> SqlExpr {
    if let SqlExpr::Function(f) = arg
        && f.name.to_string().eq_ignore_ascii_case("descriptor")
        && let FunctionArguments::List(list) = &f.args
        && let [FunctionArg::Unnamed(FunctionArgExpr::Expr(e))] = list.args.as_slice()
    {
        return e.clone();
    }
    arg.clone()
}

/// Microseconds in an interval literal without months.
fn micros_of_interval(e: &Expr) -> Option<i64> {
    let Expr::Literal(v, _) = e else { return None };
    match v {
        ScalarValue::IntervalMonthDayNano(Some(i)) if i.months == 0 => {
            Some(i64::from(i.days) * 86_400_000_000 + i.nanoseconds / 1_000)
        }
        ScalarValue::IntervalDayTime(Some(i)) => {
            Some(i64::from(i.days) * 86_400_000_000 + i64::from(i.milliseconds) * 1_000)
        }
        _ => None,
    }
}

fn interval(micros: i64) -> Expr {
    lit(ScalarValue::IntervalMonthDayNano(Some(
        IntervalMonthDayNano::new(0, 0, micros * 1_000),
    )))
}

/// `input` with `window_start` and `window_end` after its columns: one row per window of
/// `size` every `slide` (microseconds, aligned to the epoch plus `offset`) holding `time`.
fn windowed(
    input: LogicalPlan,
    time: Expr,
    slide: i64,
    size: i64,
    offset: i64,
) -> DFResult<LogicalPlan> {
    let columns: Vec<Expr> = input
        .schema()
        .columns()
        .into_iter()
        .map(Expr::Column)
        .collect();
    // The latest window start at or before `time`: the bin of `time - offset`, shifted back.
    let shifted = if offset == 0 {
        time
    } else {
        time - interval(offset)
    };
    let mut start =
        datafusion::functions::datetime::date_bin().call(vec![interval(slide), shifted]);
    if offset != 0 {
        start = start + interval(offset);
    }
    let hops = size / slide;
    let (builder, start) = if hops == 1 {
        (LogicalPlanBuilder::from(input), start)
    } else {
        // Each row once per window holding it: the windows starting at start - k * slide.
        let hops = (0..hops).map(|k| interval(k * slide)).collect::<Vec<_>>();
        let mut with_hops = columns.clone();
        with_hops.push(start.alias(WINDOW_START));
        with_hops.push(datafusion::functions_nested::expr_fn::make_array(hops).alias(HOP_BACK));
        let spread = LogicalPlanBuilder::from(input)
            .project(with_hops)?
            .unnest_column(HOP_BACK)?;
        (spread, col(WINDOW_START) - col(HOP_BACK))
    };
    let mut out = columns;
    out.push(start.clone().alias(WINDOW_START));
    out.push((start + interval(size)).alias(WINDOW_END));
    builder.project(out)?.build()
}
