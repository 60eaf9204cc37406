//! Window table functions in `FROM`, spelled as Flink SQL and RisingWave users know them:
//!
//! ```text
//! TUMBLE(table, time_column, size [, offset])          one window per row
//! HOP(table, time_column, slide, size [, offset])      size / slide windows per row
//! CUMULATE(table, time_column, step, size [, offset])  windows of a size-window's start,
//!                                                      ending every step: running totals
//! SESSION(table, time_column, gap)                     a key's records until a gap
//!                                                      without any
//! ```
//!
//! Each reads `table` (a source, any table for an ad-hoc query, or a subquery in parentheses,
//! as `TUMBLE((SELECT ... UNION ALL SELECT ...), ts, size)`) with two more columns,
//! `window_start` and `window_end`, of the time column's type: the windows of `size` (aligned
//! to the epoch, shifted by `offset`) that hold the row's time. Flink's
//! `TUMBLE(TABLE t, DESCRIPTOR(ts), ...)` spelling is taken without the `TABLE` keyword
//! (`DESCRIPTOR(ts)` is the column). A continuous aggregate grouped by `window_end` emits each
//! window when the watermark passes its end (`stream::aggregate`).
//!
//! A session belongs to a key: the aggregate over `SESSION(...)` says which, by its other
//! `GROUP BY` columns (Flink's `SESSION(TABLE t PARTITION BY key, ...)`, Arroyo's
//! `GROUP BY session(gap), key`). So `SESSION` gives each row its own window, `[time, time +
//! gap)`, and the aggregate merges the windows of a key that overlap: for a batch query, window
//! functions over the rows ([`SessionWindows`], an analyzer rule); continuously, the state's
//! windows as rows come (`stream::aggregate`). `window_end` carries a mark, a function that
//! returns its first argument, saying it is a session's, with the gap.

use std::any::Any;
use std::ops::ControlFlow;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, IntervalMonthDayNano, TimeUnit};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema, ScalarValue, plan_datafusion_err, plan_err};
use datafusion::error::Result as DFResult;
use datafusion::logical_expr::expr::WindowFunction;
use datafusion::logical_expr::planner::{
    PlannedRelation, RelationPlanner, RelationPlannerContext, RelationPlanning,
};
use datafusion::logical_expr::{
    Aggregate, ColumnarValue, Expr, ExprFunctionExt, ExprSchemable, LogicalPlan,
    LogicalPlanBuilder, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
    WindowFrame, WindowFrameBound, WindowFrameUnits, col, lit, when,
};
use datafusion::optimizer::AnalyzerRule;
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

/// Plans `TUMBLE(...)`, `HOP(...)`, `CUMULATE(...)` and `SESSION(...)` in `FROM`.
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
        let (usage, intervals) = match function.as_str() {
            "TUMBLE" => ("TUMBLE(table, time_column, size [, offset])", 1),
            "HOP" => ("HOP(table, time_column, slide, size [, offset])", 2),
            "CUMULATE" => ("CUMULATE(table, time_column, step, size [, offset])", 2),
            _ => ("SESSION(table, time_column, gap)", 1),
        };
        let offsets = if function == "SESSION" { 0 } else { 1 };
        if args.len() < 2 + intervals || args.len() > 2 + intervals + offsets {
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
        if function == "SESSION" {
            let gap = interval(2, "gap")?;
            if gap <= 0 {
                return plan_err!("SESSION: the gap must be positive");
            }
            let plan = sessions(input, time, gap)?;
            return Ok(RelationPlanning::Planned(Box::new(PlannedRelation::new(
                plan,
                alias.clone(),
            ))));
        }
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

/// Every column of `plan`'s rows, as expressions.
fn columns_of(plan: &LogicalPlan) -> Vec<Expr> {
    plan.schema()
        .columns()
        .into_iter()
        .map(Expr::Column)
        .collect()
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
    let columns = columns_of(&input);
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

/// `input` with each row's own session window after its columns: `window_start` its time,
/// `window_end` `gap` later, marked as a session's (the aggregate over them merges them).
fn sessions(input: LogicalPlan, time: Expr, gap: i64) -> DFResult<LogicalPlan> {
    let mut out = columns_of(&input);
    out.push(time.clone().alias(WINDOW_START));
    let end =
        ScalarUDF::new_from_impl(SessionEnd::default()).call(vec![time + interval(gap), lit(gap)]);
    out.push(end.alias(WINDOW_END));
    LogicalPlanBuilder::from(input).project(out)?.build()
}

/// The name of the mark on a session's `window_end`.
const SESSION_END: &str = "__floe_session_end";

/// The mark on a session's `window_end`: `__floe_session_end(end, gap_micros)` is `end`.
#[derive(Debug, PartialEq, Eq, Hash)]
struct SessionEnd {
    signature: Signature,
}

impl Default for SessionEnd {
    fn default() -> Self {
        Self {
            signature: Signature::any(2, Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for SessionEnd {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        SESSION_END
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> DFResult<DataType> {
        Ok(args[0].clone())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DFResult<ColumnarValue> {
        Ok(args.args[0].clone())
    }
}

/// The gap (microseconds) of the session windows whose mark `expr` holds.
fn session_gap_of(expr: &Expr) -> Option<i64> {
    let mut gap = None;
    let _ = expr.apply(|e| {
        if let Expr::ScalarFunction(f) = e
            && f.func.name() == SESSION_END
            && let Some(Expr::Literal(ScalarValue::Int64(Some(g)), _)) = f.args.get(1)
        {
            gap = Some(*g);
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    gap
}

/// Whether `expr` holds a session's mark.
fn is_marked(expr: &Expr) -> bool {
    session_gap_of(expr).is_some()
}

/// `expr` (over the rows of `plan`) followed down through the nodes that pass columns on
/// (projections, filters, aliases, sorts, limits, the side of a join a column comes from):
/// over the first rows it cannot be followed into, with the expressions that made them.
pub fn origin(plan: &LogicalPlan, expr: Expr) -> Expr {
    let substitute = |expr: Expr, f: &dyn Fn(&Column) -> Option<Expr>| -> Expr {
        let rewritten = expr.clone().transform(|e| match &e {
            Expr::Column(c) => Ok(match f(c) {
                Some(to) => Transformed::yes(to),
                None => Transformed::no(e),
            }),
            _ => Ok(Transformed::no(e)),
        });
        rewritten.map(|t| t.data).unwrap_or(expr)
    };
    let within = |schema: &DFSchema, expr: &Expr| {
        expr.column_refs()
            .iter()
            .all(|c| schema.maybe_index_of_column(c).is_some())
    };
    match plan {
        LogicalPlan::Projection(p) => {
            let expr = substitute(expr, &|c| {
                let i = p.schema.maybe_index_of_column(c)?;
                Some(p.expr[i].clone().unalias_nested().data)
            });
            origin(&p.input, expr)
        }
        LogicalPlan::SubqueryAlias(a) => {
            let input = a.input.schema();
            let expr = substitute(expr, &|c| {
                let i = a.schema.maybe_index_of_column(c)?;
                Some(Expr::Column(Column::from(input.qualified_field(i))))
            });
            origin(&a.input, expr)
        }
        LogicalPlan::Filter(f) => origin(&f.input, expr),
        LogicalPlan::Sort(s) => origin(&s.input, expr),
        LogicalPlan::Limit(l) => origin(&l.input, expr),
        LogicalPlan::Window(w) if within(w.input.schema(), &expr) => origin(&w.input, expr),
        LogicalPlan::Join(j) if within(j.left.schema(), &expr) => origin(&j.left, expr),
        LogicalPlan::Join(j) if within(j.right.schema(), &expr) => origin(&j.right, expr),
        _ => expr,
    }
}

/// An aggregate's session windows: their gap, and where its `GROUP BY` has `window_start` and
/// `window_end` (its other columns are the key whose sessions they are).
#[derive(Debug, Clone, Copy)]
pub struct SessionGroup {
    pub gap: i64,
    pub start: usize,
    pub end: usize,
}

impl SessionGroup {
    /// The session windows `aggregate` groups by, if it groups by `SESSION(...)`'s.
    pub fn of(aggregate: &Aggregate) -> DFResult<Option<Self>> {
        let find = |name: &str| {
            aggregate
                .group_expr
                .iter()
                .position(|e| matches!(e, Expr::Column(c) if c.name == name))
        };
        let Some(end) = find(WINDOW_END) else {
            return Ok(None);
        };
        let end_expr = aggregate.group_expr[end].clone();
        let Some(gap) = session_gap_of(&origin(&aggregate.input, end_expr)) else {
            return Ok(None);
        };
        let Some(start) = find(WINDOW_START) else {
            return plan_err!(
                "an aggregate over SESSION windows groups by window_start and window_end both \
                 (a session is known by its start and end): GROUP BY window_start, \
                 window_end, ..."
            );
        };
        Ok(Some(Self { gap, start, end }))
    }
}

/// The batch planning of `SESSION(...)`: each aggregate over session windows reads rows
/// whose windows are their key's merged sessions.
#[derive(Debug, Default)]
pub struct SessionWindows;

impl SessionWindows {
    /// The rule's name, by which a continuous query's planning leaves it out (it merges
    /// sessions in its state instead).
    pub const NAME: &str = "planning SESSION windows";
}

impl AnalyzerRule for SessionWindows {
    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> DFResult<LogicalPlan> {
        read_sessions(plan, true)
    }

    fn name(&self) -> &str {
        Self::NAME
    }
}

/// Fails when `plan` reads session windows other than by an aggregate grouped by them (a
/// session needs the key it is a session of). A continuous query checks this, and merges the
/// sessions in its state.
pub fn check_sessions(plan: &LogicalPlan) -> DFResult<()> {
    read_sessions(plan.clone(), false).map(|_| ())
}

/// `plan` with the session windows each aggregate reads merged per key when `merge`, their
/// marks gone; fails as [`check_sessions`] says.
fn read_sessions(plan: LogicalPlan, merge: bool) -> DFResult<LogicalPlan> {
    let out = plan
        .transform_up_with_subqueries(|node| {
            let LogicalPlan::Aggregate(a) = node else {
                return Ok(Transformed::no(node));
            };
            let Some(session) = SessionGroup::of(&a)? else {
                return Ok(Transformed::no(LogicalPlan::Aggregate(a)));
            };
            let input = unmarked(a.input.as_ref().clone())?;
            let input = match merge {
                true => merged_sessions(input, &a.group_expr, session)?,
                false => input,
            };
            Ok(Transformed::yes(LogicalPlan::Aggregate(
                Aggregate::try_new(Arc::new(input), a.group_expr, a.aggr_expr)?,
            )))
        })?
        .data;
    let mut unread = false;
    out.apply_with_subqueries(|node| {
        unread = node.expressions().iter().any(is_marked);
        Ok(match unread {
            true => TreeNodeRecursion::Stop,
            false => TreeNodeRecursion::Continue,
        })
    })?;
    if unread {
        return plan_err!(
            "SESSION windows are a key's: read them with an aggregate grouped by window_start, \
             window_end and the key (SELECT window_start, window_end, user_id, count(*) FROM \
             SESSION(events, ts, INTERVAL '10' MINUTE) GROUP BY window_start, window_end, \
             user_id)"
        );
    }
    Ok(out)
}

/// `plan` without the marks of session windows (their ends as they are).
fn unmarked(plan: LogicalPlan) -> DFResult<LogicalPlan> {
    let out = plan.transform_up_with_subqueries(|node| {
        if !node.expressions().iter().any(is_marked) {
            return Ok(Transformed::no(node));
        }
        let node = node
            .map_expressions(|e| {
                e.transform(|e| match e {
                    Expr::ScalarFunction(f) if f.func.name() == SESSION_END => {
                        Ok(Transformed::yes(f.args[0].clone()))
                    }
                    e => Ok(Transformed::no(e)),
                })
            })?
            .data
            .recompute_schema()?;
        Ok(Transformed::yes(node))
    })?;
    Ok(out.data)
}

/// Columns the batch merging of sessions adds, then drops.
const PREVIOUS_END: &str = "__floe_session_previous_end";
const STARTS: &str = "__floe_session_starts";
const SESSION: &str = "__floe_session";
const MERGED_START: &str = "__floe_session_merged_start";
const MERGED_END: &str = "__floe_session_merged_end";

/// `input` (rows with their own session windows) with each row's window the merged session
/// of its key (`group_expr` but the window columns) holding it: ordered by start, a row starts
/// a session when it starts at or after the end of the one before it.
fn merged_sessions(
    input: LogicalPlan,
    group_expr: &[Expr],
    session: SessionGroup,
) -> DFResult<LogicalPlan> {
    let keys: Vec<Expr> = group_expr
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != session.start && *i != session.end)
        .map(|(_, e)| e.clone())
        .collect();
    let start = group_expr[session.start].clone();
    let end = group_expr[session.end].clone();
    let by_start = vec![start.clone().sort(true, false)];
    let window = |f: Arc<datafusion::logical_expr::AggregateUDF>, arg: Expr| {
        Expr::from(WindowFunction::new(f, vec![arg]))
    };
    let previous = datafusion::functions_window::expr_fn::lag(end.clone(), Some(1), None)
        .partition_by(keys.clone())
        .order_by(by_start.clone())
        .build()?
        .alias(PREVIOUS_END);
    let plan = LogicalPlanBuilder::from(input.clone())
        .window(vec![previous])?
        .build()?;
    let starts = when(
        col(PREVIOUS_END)
            .is_null()
            .or(start.clone().gt_eq(col(PREVIOUS_END))),
        lit(1i64),
    )
    .otherwise(lit(0i64))?;
    let mut with_starts = columns_of(&plan);
    with_starts.push(starts.alias(STARTS));
    let running = WindowFrame::new_bounds(
        WindowFrameUnits::Rows,
        WindowFrameBound::Preceding(ScalarValue::UInt64(None)),
        WindowFrameBound::CurrentRow,
    );
    let numbered = window(
        datafusion::functions_aggregate::sum::sum_udaf(),
        col(STARTS),
    )
    .partition_by(keys.clone())
    .order_by(by_start)
    .window_frame(running)
    .build()?
    .alias(SESSION);
    let mut by_session = keys;
    by_session.push(col(SESSION));
    let bound = |f, arg: Expr, name: &str| -> DFResult<Expr> {
        Ok(window(f, arg)
            .partition_by(by_session.clone())
            .build()?
            .alias(name))
    };
    let plan = LogicalPlanBuilder::from(plan)
        .project(with_starts)?
        .window(vec![numbered])?
        .window(vec![
            bound(
                datafusion::functions_aggregate::min_max::min_udaf(),
                start.clone(),
                MERGED_START,
            )?,
            bound(
                datafusion::functions_aggregate::min_max::max_udaf(),
                end.clone(),
                MERGED_END,
            )?,
        ])?
        .build()?;
    // The input's columns, the window columns now the merged session's.
    let out: Vec<Expr> = input
        .schema()
        .iter()
        .map(|(qualifier, field)| {
            let column = Expr::Column(Column::from((qualifier, field)));
            let merged = if column == start {
                MERGED_START
            } else if column == end {
                MERGED_END
            } else {
                return column;
            };
            col(merged).alias_qualified(qualifier.cloned(), field.name())
        })
        .collect();
    LogicalPlanBuilder::from(plan).project(out)?.build()
}

/// `PROCTIME()`: the time a record is processed (now, UTC), for windows over processing
/// time (`TUMBLE((SELECT *, PROCTIME() AS p FROM s), p, INTERVAL '10' SECOND)`), which close
/// as the clock passes them rather than the watermark. As Flink's, it is read anew each time
/// (a batch's rows share it).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ProcTime {
    signature: Signature,
}

impl Default for ProcTime {
    fn default() -> Self {
        Self {
            signature: Signature::nullary(Volatility::Volatile),
        }
    }
}

impl ScalarUDFImpl for ProcTime {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        PROCTIME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> DFResult<DataType> {
        Ok(DataType::Timestamp(TimeUnit::Microsecond, None))
    }

    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> DFResult<ColumnarValue> {
        let now = chrono::Utc::now().timestamp_micros();
        Ok(ColumnarValue::Scalar(ScalarValue::TimestampMicrosecond(
            Some(now),
            None,
        )))
    }
}

/// The name of [`ProcTime`].
const PROCTIME: &str = "proctime";

/// Whether `expr` (see [`origin`]) reads the processing time.
pub fn reads_processing_time(expr: &Expr) -> bool {
    expr.exists(|e| Ok(matches!(e, Expr::ScalarFunction(f) if f.func.name() == PROCTIME)))
        .unwrap_or(false)
}
