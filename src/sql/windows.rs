//! Window table functions in `FROM`, spelled as Flink SQL and RisingWave users know them:
//!
//! ```text
//! TUMBLE(table, time_column, size [, offset])          one window per row
//! HOP(table, time_column, slide, size [, offset])      size / slide windows per row
//! CUMULATE(table, time_column, step, size [, offset])  windows of a size-window's start,
//!                                                      ending every step: running totals
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

/// How far from the window start a window starts (`HOP`) or ends (`CUMULATE`), while a row is
/// spread over its windows.
const SPREAD: &str = "__floe_window_offset";

/// Plans `TUMBLE(...)` and `HOP(...)` in `FROM`.
#[derive(Debug, Default)]
pub struct WindowFunctions;

/// The first argument that marks a window function once [`WindowRewriter`] has moved its
/// table into the function's place: `TUMBLE(events, ...)` is planned as
/// `events(__window_tumble, ...)`, so that DataFusion, which loads the tables a statement names
/// before planning it, loads `events`.
const MARK: &str = "__window_";

/// Rewrites `TUMBLE(table, ...)` (and the other window functions) in `FROM` as
/// `table(__window_tumble, ...)`.
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
            "CUMULATE" => "CUMULATE(table, time_column, step, size [, offset])",
            other => {
                return plan_err!(
                    "{other} windows are not supported yet; use TUMBLE(table, time_column, \
                     size), HOP(table, time_column, slide, size) or CUMULATE(table, \
                     time_column, step, size)"
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
        let step = if function == "CUMULATE" {
            "step"
        } else {
            "slide"
        };
        let (slide, size) = if function == "TUMBLE" {
            let size = interval(2, "size")?;
            (size, size)
        } else {
            (interval(2, step)?, interval(3, "size")?)
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
                "{function}: the size ({}) must be a whole multiple of the {step} ({})",
                args[3],
                args[2]
            );
        }
        let spread = match function.as_str() {
            "CUMULATE" => Spread::Cumulate { step: slide, size },
            _ => Spread::Hop { slide, size },
        };
        let plan = windowed(input, time, spread, offset)?;
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

/// How rows spread over windows.
#[derive(Debug, Clone, Copy)]
enum Spread {
    /// Windows of `size` starting every `slide` (a tumbling window when they are equal).
    Hop { slide: i64, size: i64 },
    /// Windows starting every `size`, each ending every `step` until `size`: a row is in each
    /// of its size-window's windows that end after it.
    Cumulate { step: i64, size: i64 },
}

/// `input` with `window_start` and `window_end` after its columns: one row per window holding
/// `time` (microseconds; windows aligned to the epoch plus `offset`).
fn windowed(input: LogicalPlan, time: Expr, spread: Spread, offset: i64) -> DFResult<LogicalPlan> {
    let columns: Vec<Expr> = input
        .schema()
        .columns()
        .into_iter()
        .map(Expr::Column)
        .collect();
    // The latest window start at or before `time`: the bin of `time - offset`, shifted back.
    let bin = |every: i64| {
        let shifted = if offset == 0 {
            time.clone()
        } else {
            time.clone() - interval(offset)
        };
        let start =
            datafusion::functions::datetime::date_bin().call(vec![interval(every), shifted]);
        if offset == 0 {
            start
        } else {
            start + interval(offset)
        }
    };
    // Each row once per window holding it: the windows from `start` with an offset from the
    // list, kept where `keep` holds.
    let spread_over = |start: Expr, offsets: Vec<i64>| -> DFResult<LogicalPlanBuilder> {
        let mut with_offsets = columns.clone();
        with_offsets.push(start.alias(WINDOW_START));
        with_offsets.push(
            datafusion::functions_nested::expr_fn::make_array(
                offsets.into_iter().map(interval).collect(),
            )
            .alias(SPREAD),
        );
        LogicalPlanBuilder::from(input.clone())
            .project(with_offsets)?
            .unnest_column(SPREAD)
    };
    let (builder, start, end) = match spread {
        Spread::Hop { slide, size } if slide == size => {
            let start = bin(size);
            (
                LogicalPlanBuilder::from(input.clone()),
                start.clone(),
                start + interval(size),
            )
        }
        Spread::Hop { slide, size } => {
            // The windows starting at bin - k * slide.
            let back = (0..size / slide).map(|k| k * slide).collect();
            let start = col(WINDOW_START) - col(SPREAD);
            (
                spread_over(bin(slide), back)?,
                start.clone(),
                start + interval(size),
            )
        }
        Spread::Cumulate { step, size } => {
            // The windows starting at the size-window's start and ending k * step later,
            // after the row's time.
            let ends = (1..=size / step).map(|k| k * step).collect();
            let end = col(WINDOW_START) + col(SPREAD);
            let builder = spread_over(bin(size), ends)?.filter(end.clone().gt(time.clone()))?;
            (builder, col(WINDOW_START), end)
        }
    };
    let mut out = columns;
    out.push(start.alias(WINDOW_START));
    out.push(end.alias(WINDOW_END));
    builder.project(out)?.build()
}
