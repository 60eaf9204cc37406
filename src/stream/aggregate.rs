//! The aggregate of a continuous query, on DataFusion's own accumulators: over windows
//! (each emitted once, when the watermark passes its end), or without (each group's row
//! updated once per checkpoint, by key).
//!
//! ```text
//! per batch:  the query's rows below the aggregate (row-wise, with window_start/window_end)
//!               late (the window closed before the record came) --> dead letters, 'late'
//!               on time --AggregateExec(Partial)--> group keys + accumulator state: the state
//! watermark:  state rows of windows with end + lateness <= watermark
//!               --AggregateExec(Final)--> the aggregate's rows --the plan above it--> the sink
//! growing:    past COMPACT_AFTER batches and twice the rows --AggregateExec(PartialReduce)--> one
//! checkpoint: the state, compacted, in an Arrow IPC file the checkpoint record names
//!
//! without windows (an updating aggregate):
//! per batch:  partial states kept apart (pending)
//! checkpoint: pending merged; the groups it touched, merged with what the state held of them
//!               --Final--> their rows now, written to a table keyed by the group
//! ```
//!
//! The accumulators are DataFusion's (`count`, `count(DISTINCT)`, `approx_percentile_cont`,
//! user-registered UDAFs): what a partial aggregate outputs is exactly their `state()`, and
//! the final and reducing aggregates `merge_batch` it. So the state a checkpoint saves is
//! plain Arrow, restored by reading it back.
//!
//! A top-N (`ROW_NUMBER() OVER (PARTITION BY ... ORDER BY ...) ... WHERE rn <= N`, see
//! [`super::top_n`]) runs through the same stages and emits the same ways (a window's rows
//! once, or each partition's rows at each checkpoint): its state is rows, at most N per
//! partition, its merge keeps the top N of the rows merged, and its finish numbers them.

use std::collections::HashSet;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Int64Array, RecordBatch, RecordBatchOptions,
    UInt32Array,
};
use datafusion::arrow::compute::{
    cast, concat_batches, filter_record_batch, not, take_record_batch,
};
use datafusion::arrow::datatypes::{
    DataType, Field, Int64Type, Schema, SchemaRef, TimeUnit, TimestampMicrosecondType,
};
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::DFSchema;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::execution::TaskContext;
use datafusion::execution::session_state::SessionState;
use datafusion::logical_expr::simplify::SimplifyContext;
use datafusion::logical_expr::{Aggregate, Expr, LogicalPlan, LogicalPlanBuilder};
use datafusion::optimizer::simplify_expressions::ExprSimplifier;
use datafusion::physical_expr::create_physical_expr;
use datafusion::physical_expr::expressions::Column as PhysicalColumn;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode, PhysicalGroupBy};
use datafusion::physical_plan::{ExecutionPlan, collect, displayable};
use datafusion::physical_planner::create_aggregate_expr_and_maybe_filter;

use super::slot::{BatchSlot, SlotExec};
use super::top_n::{Rank, TopN, rank_limit};
use super::upper::Upper;
use crate::checkpoint::{SpillRun, StateStore};
use crate::error::{Error, Reject, Result};
use crate::sql::windows::{SessionGroup, WINDOW_END, origin, reads_processing_time};

/// State batches kept before they are merged into one.
const COMPACT_AFTER: usize = 32;

/// Over session windows, the group column of the state that holds the watermark its rows
/// came after, in microseconds: sessions merge in the order their rows arrived.
const ARRIVAL: &str = "__floe_arrival";

/// A continuous query's stateful step: its aggregate, or its top-N per partition
/// ([`TopN`], the `ROW_NUMBER()` pattern), with the plans of its stages.
pub struct StreamAggregate {
    /// The rows it aggregates: the query's rows below the aggregate.
    input: SchemaRef,
    /// Where a row of `input` and a row of the state have their window's end, for an
    /// aggregate over windows.
    windows: Option<(WindowColumn, WindowColumn)>,
    /// Whether its windows are over processing time (`PROCTIME()`): they close as the clock
    /// passes them, and no record is late.
    processing_time: bool,
    op: Op,
    /// The query above the aggregate (projections, HAVING, or more), over its rows.
    upper: Upper,
    /// How long after its end a window waits for late records, in microseconds.
    lateness: i64,
    /// The bytes of open windows' state held in memory; beyond them, on disk.
    budget: usize,
    task: Arc<TaskContext>,
}

/// What the state is and how it is merged and finished.
enum Op {
    /// `GROUP BY`: DataFusion's `AggregateExec` in its modes; the state is the groups'
    /// accumulator states, the group columns first.
    Group {
        groups: usize,
        /// Over `SESSION(...)`: its gap and window columns, whose windows the state merges.
        session: Option<SessionGroup>,
        partial: Stage,
        reduce: Stage,
        finish: Stage,
    },
    /// `ROW_NUMBER() ... <= N`: the state is rows, the top N of each partition.
    Top(TopN),
}

/// The `window_end` column of a batch.
#[derive(Debug, Clone, Copy)]
struct WindowColumn {
    index: usize,
}

impl WindowColumn {
    /// The `window_end` column among `fields`, if any.
    fn find<'a>(
        mut fields: impl Iterator<Item = &'a datafusion::arrow::datatypes::Field>,
    ) -> Option<Self> {
        fields
            .position(|f| f.name() == WINDOW_END)
            .map(|index| Self { index })
    }

    /// Each row's window end in microseconds (NULL where the row has no time).
    fn ends(&self, batch: &RecordBatch) -> Result<Int64Array> {
        let column = batch.column(self.index);
        let DataType::Timestamp(_, tz) = column.data_type() else {
            return Err(Error::Internal(format!(
                "a window column is {}, not a TIMESTAMP",
                column.data_type()
            )));
        };
        let micros = cast(
            column,
            &DataType::Timestamp(TimeUnit::Microsecond, tz.clone()),
        )
        .map_err(|e| Error::Internal(format!("window end: {e}")))?;
        let micros = micros.as_primitive::<TimestampMicrosecondType>();
        Ok(micros.iter().collect())
    }
}

/// One stage: a plan over the batches put in its slot.
struct Stage {
    slot: Arc<BatchSlot>,
    exec: Arc<dyn ExecutionPlan>,
}

impl Stage {
    fn over(
        schema: SchemaRef,
        build: impl FnOnce(Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>>,
    ) -> Result<Self> {
        let slot = Arc::new(BatchSlot::default());
        let exec = build(SlotExec::over(schema, slot.clone()))?;
        Ok(Self { slot, exec })
    }

    async fn run(
        &self,
        task: &Arc<TaskContext>,
        batches: Vec<RecordBatch>,
    ) -> Result<Vec<RecordBatch>> {
        self.slot.set_all(batches);
        let out = collect(self.exec.clone(), task.clone()).await;
        self.slot.clear();
        out.map_err(Error::from_execution)
    }

    fn schema(&self) -> SchemaRef {
        self.exec.schema()
    }
}

/// The groups' partial aggregates (the open windows'), between checkpoints and across them.
#[derive(Debug, Default, Clone)]
pub struct AggregateState {
    batches: Vec<RecordBatch>,
    /// For an aggregate without windows: the partial aggregates of the rows since the last
    /// checkpoint, whose groups it updates.
    pending: Vec<RecordBatch>,
    /// Open windows' state beyond the memory budget, on disk.
    spilled: Vec<SpillRun>,
    /// The rows the last merge of `batches` left, and of `pending`.
    merged: usize,
    pending_merged: usize,
}

impl AggregateState {
    /// The state in memory as saved: its batches.
    pub fn batches(&self) -> &[RecordBatch] {
        &self.batches
    }

    /// The state on disk: its runs' files.
    pub fn spilled(&self) -> &[SpillRun] {
        &self.spilled
    }

    /// A state restored from saved batches and the runs it had on disk.
    pub fn restore(batches: Vec<RecordBatch>, spilled: Vec<SpillRun>) -> Self {
        Self {
            merged: rows_in(&batches),
            batches,
            pending: Vec::new(),
            spilled,
            pending_merged: 0,
        }
    }

    /// The groups (window and keys) held in memory, counting a group once per batch it is in.
    pub fn rows(&self) -> usize {
        rows_in(&self.batches)
    }

    /// The bytes the state holds in memory.
    pub fn bytes(&self) -> usize {
        self.batches
            .iter()
            .map(RecordBatch::get_array_memory_size)
            .sum()
    }

    /// The bytes of the partial state of the rows since the last update, in memory.
    fn pending_bytes(&self) -> usize {
        self.pending
            .iter()
            .map(RecordBatch::get_array_memory_size)
            .sum()
    }
}

fn rows_in(batches: &[RecordBatch]) -> usize {
    batches.iter().map(RecordBatch::num_rows).sum()
}

/// Whether state `batches` are due a merge: more than [`COMPACT_AFTER`] of them, holding at
/// least twice the rows the last merge left. A merge that cannot shrink them (every group
/// distinct) is then redone only as they double, so merging costs in proportion to the rows,
/// not to their square.
fn merge_due(batches: &[RecordBatch], left: usize) -> bool {
    batches.len() > COMPACT_AFTER && rows_in(batches) >= 2 * left
}

/// Where a job's state files go: its folder in the state store.
pub struct StateFiles<'a> {
    pub store: &'a StateStore,
    pub job: &'a str,
}

/// The files a run of spilled state is split into (by the hash of each row's group).
const SPILL_PARTS: usize = 16;

/// FNV-1a: a hash that is the same in every process, as a spilled run's files must be.
pub(super) fn stable_hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The node of `plan` (the rows of a continuous query) that keeps state across batches: its
/// lowest aggregate, or `ROW_NUMBER()` window (a top-N); the rows below it run per batch, the
/// query above it on the rows it emits ([`Upper`]).
pub fn stateful_node(plan: &LogicalPlan) -> Option<&LogicalPlan> {
    lowest_stateful(plan).into_iter().next()
}

/// The aggregates and windows of `plan` with none below them.
pub(super) fn lowest_stateful(plan: &LogicalPlan) -> Vec<&LogicalPlan> {
    let below: Vec<&LogicalPlan> = plan
        .inputs()
        .into_iter()
        .flat_map(lowest_stateful)
        .collect();
    if below.is_empty() && matches!(plan, LogicalPlan::Aggregate(_) | LogicalPlan::Window(_)) {
        vec![plan]
    } else {
        below
    }
}

/// The stages of `aggregate` (a `GROUP BY`) over rows of `input`, and where its rows and
/// state have their window's end when it groups by windows.
fn group(
    aggregate: &Aggregate,
    input: &SchemaRef,
    state: &SessionState,
) -> Result<(Op, Option<(WindowColumn, WindowColumn)>)> {
    if aggregate
        .group_expr
        .iter()
        .any(|e| matches!(e, Expr::GroupingSet(_)))
    {
        return Err(unsupported(
            "GROUPING SETS, ROLLUP and CUBE do not run continuously yet",
        ));
    }
    let logical_input = aggregate.input.schema();
    let group_window = aggregate
        .group_expr
        .iter()
        .position(|e| matches!(e, Expr::Column(c) if c.name == WINDOW_END))
        .map(|index| WindowColumn { index });
    let windows = match group_window {
        Some(state_end) => {
            let input_end = WindowColumn::find(input.fields().iter().map(AsRef::as_ref))
                .ok_or_else(|| Error::Internal("the windowed rows have no window column".into()))?;
            Some((input_end, state_end))
        }
        None => None,
    };
    let props = state.execution_props();
    // Simplified as DataFusion's optimizer would (`coalesce` runs only as a CASE), under
    // their own names, which the plan above reads them by.
    let simplify = simplifier(state, logical_input);
    let mut group_exprs = aggregate
        .group_expr
        .iter()
        .map(|e| {
            Ok((
                create_physical_expr(&simplify(e)?, logical_input, props)?,
                datafusion::logical_expr::expr::physical_name(e)?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    let session = SessionGroup::of(aggregate)?;
    // Over sessions, each row also has the watermark it came after: a group of the state is
    // its window and that arrival (see [`StreamAggregate::sessions`]).
    let input = match session {
        Some(_) => {
            let mut fields = input.fields().to_vec();
            fields.push(Arc::new(Field::new(ARRIVAL, DataType::Int64, false)));
            group_exprs.push((
                Arc::new(PhysicalColumn::new(ARRIVAL, fields.len() - 1)),
                ARRIVAL.to_string(),
            ));
            Arc::new(Schema::new_with_metadata(fields, input.metadata().clone()))
        }
        None => input.clone(),
    };
    let input = &input;
    let group_by = PhysicalGroupBy::new_single(group_exprs);
    let mut aggregates = Vec::new();
    let mut filters = Vec::new();
    for e in &aggregate.aggr_expr {
        let named = simplify(&e.clone().unalias())?.alias(e.schema_name().to_string());
        let (agg, filter, _) =
            create_aggregate_expr_and_maybe_filter(&named, logical_input, input, props)?;
        aggregates.push(agg);
        filters.push(filter);
    }
    let partial = Stage::over(input.clone(), |leaf| {
        Ok(Arc::new(AggregateExec::try_new(
            AggregateMode::Partial,
            group_by.clone(),
            aggregates.clone(),
            filters.clone(),
            leaf,
            input.clone(),
        )?))
    })?;
    let merged = |mode: AggregateMode| {
        Stage::over(partial.schema(), |leaf| {
            Ok(Arc::new(AggregateExec::try_new(
                mode,
                group_by.as_final(),
                aggregates.clone(),
                filters.clone(),
                leaf,
                input.clone(),
            )?))
        })
    };
    let reduce = merged(AggregateMode::PartialReduce)?;
    let finish = merged(AggregateMode::Final)?;
    let op = Op::Group {
        groups: aggregate.group_expr.len(),
        session,
        partial,
        reduce,
        finish,
    };
    Ok((op, windows))
}

/// `plan` with each aggregate reading only the columns its expressions use: the plan below
/// it runs on every batch, and would otherwise carry every column of the source.
pub fn prune_below_aggregates(plan: LogicalPlan) -> Result<LogicalPlan> {
    let out = plan.transform_up(|node| {
        let LogicalPlan::Aggregate(a) = node else {
            return Ok(Transformed::no(node));
        };
        let mut used = std::collections::HashSet::new();
        for e in a.group_expr.iter().chain(&a.aggr_expr) {
            used.extend(e.column_refs().into_iter().cloned());
        }
        let columns: Vec<Expr> = a
            .input
            .schema()
            .columns()
            .into_iter()
            .filter(|c| used.contains(c))
            .map(Expr::Column)
            .collect();
        if columns.len() == a.input.schema().fields().len() {
            return Ok(Transformed::no(LogicalPlan::Aggregate(a)));
        }
        let input = LogicalPlanBuilder::from(a.input.as_ref().clone())
            .project(columns)?
            .build()?;
        Ok(Transformed::yes(LogicalPlan::Aggregate(
            Aggregate::try_new(Arc::new(input), a.group_expr, a.aggr_expr)?,
        )))
    })?;
    Ok(out.data)
}

impl StreamAggregate {
    /// The stages of `rows`'s stateful step (see [`stateful_node`]), whose input rows come
    /// as `input` (the physical schema of the plan below it). Fails, saying why, when it
    /// cannot run continuously.
    pub async fn try_new(
        rows: &LogicalPlan,
        input: SchemaRef,
        state: &SessionState,
        lateness: i64,
        budget: usize,
    ) -> Result<Self> {
        // Types coerced (the casts an expression needs), as DataFusion does before planning.
        let rows =
            &state
                .analyzer()
                .execute_and_check(rows.clone(), state.config_options(), |_, _| {})?;
        let nodes = lowest_stateful(rows);
        let Some(node) = nodes.first().copied() else {
            return Err(Error::Internal(
                "a stateful query without an aggregate".into(),
            ));
        };
        if nodes.iter().any(|n| *n != node) {
            return Err(unsupported(
                "it keeps the top N of the streams beside another stateful step (a second \
                 top-N, or an aggregate); a continuous query keeps one top-N, or aggregates \
                 (over windows, several aggregates joined on their windows run as one), and \
                 any query may read its rows (a CTE read twice is one step)",
            ));
        }
        let (op, windows) = match node {
            LogicalPlan::Aggregate(aggregate) => group(aggregate, &input, state)?,
            LogicalPlan::Window(window) => {
                let limit = rank_limit(rows, node).ok_or_else(|| {
                    unsupported(
                        "ROW_NUMBER() without a bound on it would keep every row; filter on \
                         it (WHERE rn <= N) for the top N rows of each partition, or rn = 1 \
                         for the first",
                    )
                })?;
                let windows = if TopN::partitions_by(window, WINDOW_END) {
                    let end = WindowColumn::find(input.fields().iter().map(AsRef::as_ref))
                        .ok_or_else(|| {
                            Error::Internal("the windowed rows have no window column".into())
                        })?;
                    Some((end, end))
                } else {
                    None
                };
                let top = TopN::try_new(window, limit, &input, state)?;
                if windows.is_none() && top.function() != Rank::RowNumber {
                    return Err(unsupported(
                        "RANK() and DENSE_RANK() give ties the same rank, and a top-N without \
                         windows is kept in a table keyed by rank: use ROW_NUMBER(), or rank \
                         within windows (PARTITION BY window_start, window_end, ...)",
                    ));
                }
                (Op::Top(top), windows)
            }
            _ => {
                return Err(Error::Internal(
                    "a stateful query without an aggregate".into(),
                ));
            }
        };
        let finished = match &op {
            Op::Group {
                finish,
                groups,
                session: Some(_),
                ..
            } => Arc::new(without_column(&finish.schema(), *groups)?),
            Op::Group { finish, .. } => finish.schema(),
            Op::Top(top) => top.ranked_schema(),
        };
        let processing_time = windows.is_some()
            && node.inputs().first().is_some_and(|below| {
                below
                    .schema()
                    .columns()
                    .into_iter()
                    .filter(|c| c.name == WINDOW_END)
                    .any(|c| reads_processing_time(&origin(below, Expr::Column(c))))
            });
        let upper = Upper::try_new(rows, node, &finished, state, windows.is_some()).await?;
        Ok(Self {
            input,
            windows,
            processing_time,
            op,
            upper,
            lateness,
            budget,
            task: Arc::new(TaskContext::from(state)),
        })
    }

    /// Add `rows` (the query's rows below the aggregate) to the windows of `state`, except
    /// the rows whose window closed before them: `watermarks[i]` is the watermark row `i`
    /// came after (microseconds; `i64::MIN` before any). Returns the late rows, with why.
    pub async fn absorb(
        &self,
        state: &mut AggregateState,
        rows: RecordBatch,
        watermarks: &[i64],
        files: &StateFiles<'_>,
    ) -> Result<Vec<(usize, Reject)>> {
        let rows = self.conform(rows)?;
        let Some((input_end, _)) = self.windows else {
            let partial = self.partial(rows).await?;
            state
                .pending
                .extend(partial.into_iter().filter(|b| b.num_rows() > 0));
            if merge_due(&state.pending, state.pending_merged) {
                let merged = self.merge(std::mem::take(&mut state.pending)).await?;
                state.pending.extend(merged);
                state.pending_merged = rows_in(&state.pending);
            }
            return Ok(Vec::new());
        };
        let ends = input_end.ends(&rows)?;
        let mut late = Vec::new();
        let session = self.session().is_some();
        // The watermark each row came after (over processing time, none: a record's window
        // is open when it is read).
        let marks: Vec<i64> = (0..rows.num_rows())
            .map(|i| match self.processing_time {
                true => i64::MIN,
                false => watermarks.get(i).copied().unwrap_or(i64::MIN),
            })
            .collect();
        for (i, end) in ends.iter().enumerate() {
            let watermark = marks[i];
            match end {
                None => late.push((
                    i,
                    Reject::new("the record has no event time (its window is NULL)"),
                )),
                // A record is late when the watermark has passed its window's end: over
                // sessions, its own session window's (its time + the gap) and every session
                // of its key it falls in, as Flink's (see `open_sessions_hold`).
                Some(end) if end.saturating_add(self.lateness) <= watermark => late.push((
                    i,
                    Reject::new(format!(
                        "late: its {} ended at {} and the watermark had passed it ({})",
                        if session {
                            "session window (its time + the gap, and any session of its key \
                             around it)"
                        } else {
                            "window"
                        },
                        show_micros(end),
                        show_micros(watermark)
                    )),
                )),
                Some(_) => {}
            }
        }
        let rows = match self.arrival() {
            Some(_) => {
                let mut fields = rows.schema().fields().to_vec();
                fields.push(Arc::new(Field::new(ARRIVAL, DataType::Int64, false)));
                let schema = Arc::new(Schema::new(fields));
                let mut columns = rows.columns().to_vec();
                columns.push(Arc::new(Int64Array::from(marks)));
                let rows = RecordBatch::try_new(schema, columns).map_err(internal)?;
                if !late.is_empty() && !self.processing_time {
                    let held = self.open_sessions_hold(state, &rows, &late, files)?;
                    late.retain(|(i, _)| !held.contains(i));
                }
                rows
            }
            None => rows,
        };
        let on_time = if late.is_empty() {
            rows
        } else {
            let mut keep = vec![true; rows.num_rows()];
            for (i, _) in &late {
                keep[*i] = false;
            }
            filter_record_batch(&rows, &BooleanArray::from(keep))
                .map_err(|e| Error::Internal(format!("dropping late rows: {e}")))?
        };
        if on_time.num_rows() > 0 {
            let partial = self.partial(on_time).await?;
            state
                .batches
                .extend(partial.into_iter().filter(|b| b.num_rows() > 0));
            if merge_due(&state.batches, state.merged) {
                self.compact(state).await?;
            }
        }
        Ok(late)
    }

    /// Over sessions: which of the `late` rows of `rows` (the aggregate's input with each
    /// row's arrival) fall in a session of their key that was open when they came, whose end
    /// the watermark has not passed. Flink merges such a record's window into that session,
    /// and so does floe: the key's sessions are merged as of the record's arrival from every
    /// row of its key in the state (in memory, and in the part of each run on disk that holds
    /// the key) and in this batch before it. Late rows are rare (behind the watermark by more
    /// than the gap), so this reads little.
    fn open_sessions_hold(
        &self,
        state: &AggregateState,
        rows: &RecordBatch,
        late: &[(usize, Reject)],
        files: &StateFiles<'_>,
    ) -> Result<HashSet<usize>> {
        let (
            Some(session),
            Some(arrival),
            Op::Group {
                partial, groups, ..
            },
        ) = (self.session(), self.arrival(), &self.op)
        else {
            return Ok(HashSet::new());
        };
        let exec = partial
            .exec
            .as_any()
            .downcast_ref::<AggregateExec>()
            .ok_or_else(|| Error::Internal("a partial aggregate that is not one".into()))?;
        // The rows' groups as the state holds them: the partial aggregate's group columns.
        let n = rows.num_rows();
        let values = exec
            .group_expr()
            .expr()
            .iter()
            .map(|(e, _)| e.evaluate(rows).and_then(|v| v.into_array(n)))
            .collect::<datafusion::error::Result<Vec<ArrayRef>>>()?;
        let key_columns: Vec<usize> = (0..*groups)
            .filter(|i| *i != session.start && *i != session.end)
            .collect();
        let converter = RowConverter::new(
            key_columns
                .iter()
                .map(|i| SortField::new(values[*i].data_type().clone()))
                .collect(),
        )
        .map_err(internal)?;
        let keys = converter
            .convert_columns(
                &key_columns
                    .iter()
                    .map(|i| values[*i].clone())
                    .collect::<Vec<_>>(),
            )
            .map_err(internal)?;
        let micros = |a: &ArrayRef| -> Result<Int64Array> {
            let batch = RecordBatch::try_from_iter([("t", a.clone())]).map_err(internal)?;
            WindowColumn { index: 0 }.ends(&batch)
        };
        let (starts, ends) = (
            micros(&values[session.start])?,
            micros(&values[session.end])?,
        );
        let arrivals = values[arrival]
            .as_primitive_opt::<Int64Type>()
            .ok_or_else(|| Error::Internal("a session's arrival is not a BIGINT".into()))?
            .clone();
        let candidates: Vec<usize> = late
            .iter()
            .map(|(i, _)| *i)
            .filter(|i| ends.is_valid(*i) && starts.is_valid(*i))
            .collect();
        if candidates.is_empty() {
            return Ok(HashSet::new());
        }
        let wanted: HashSet<Vec<u8>> = candidates
            .iter()
            .map(|i| keys.row(*i).as_ref().to_vec())
            .collect();
        // The state's rows of those keys.
        let mut units: std::collections::HashMap<Vec<u8>, Vec<SessionUnit>> = Default::default();
        let mut add = |batch: &RecordBatch| -> Result<()> {
            let held = converter
                .convert_columns(&self.keys(batch)?)
                .map_err(internal)?;
            let starts = WindowColumn {
                index: session.start,
            }
            .ends(batch)?;
            let ends = WindowColumn { index: session.end }.ends(batch)?;
            let arrivals = batch.column(arrival).as_primitive::<Int64Type>();
            for (r, key) in held.iter().enumerate() {
                if wanted.contains(key.as_ref()) {
                    units
                        .entry(key.as_ref().to_vec())
                        .or_default()
                        .push(SessionUnit {
                            start: starts.value(r),
                            end: ends.value(r),
                            arrival: arrivals.value(r),
                            row: usize::MAX,
                        });
                }
            }
            Ok(())
        };
        for batch in &state.batches {
            add(batch)?;
        }
        let parts: std::collections::BTreeSet<usize> = wanted
            .iter()
            .map(|k| (stable_hash(k) % SPILL_PARTS as u64) as usize)
            .collect();
        // A run's sessions start at or after its `first_end` - 1: only a run starting before a
        // late row's window ends can hold it (rare: runs left on disk start at or after the
        // watermark).
        let last_end = candidates
            .iter()
            .map(|i| ends.value(*i))
            .max()
            .unwrap_or(i64::MIN);
        for run in state
            .spilled
            .iter()
            .filter(|run| run.first_end.saturating_sub(1) < last_end)
        {
            for p in &parts {
                let file = run
                    .files
                    .get(*p)
                    .ok_or_else(|| Error::Internal(format!("a spilled run without part {p}")))?;
                for batch in files.store.load_state(files.job, file)? {
                    add(&batch)?;
                }
            }
        }
        let is_late: HashSet<usize> = late.iter().map(|(i, _)| *i).collect();
        // This batch's rows of those keys, in the order they came.
        let mut batch_rows: std::collections::HashMap<&[u8], Vec<usize>> = Default::default();
        for j in 0..n {
            if wanted.contains(keys.row(j).as_ref()) && ends.is_valid(j) && starts.is_valid(j) {
                batch_rows.entry(keys.row(j).data()).or_default().push(j);
            }
        }
        // Each key's sessions as the state holds them, then its rows here one by one, as
        // Flink's: a row on time joins (or starts) a session, a late one joins the open
        // sessions it falls in, if any.
        let mut held = HashSet::new();
        for (key, mut rows) in batch_rows {
            let mut sessions = SessionMerger::new(self.lateness);
            sessions.merge(units.remove(key).unwrap_or_default());
            rows.sort_by_key(|j| arrivals.value(*j));
            for j in rows {
                let unit = SessionUnit {
                    start: starts.value(j),
                    end: ends.value(j),
                    arrival: arrivals.value(j),
                    row: j,
                };
                let late = is_late.contains(&j);
                if sessions.join(&unit, late) && late {
                    held.insert(j);
                }
            }
        }
        Ok(held)
    }

    /// How the aggregate runs, for `EXPLAIN`: where it emits, its state, its plans.
    pub fn explain(&self) -> String {
        let show = |us: i64| match us {
            us if us % 1_000_000 == 0 => format!("{}s", us / 1_000_000),
            us => format!("{}ms", us / 1_000),
        };
        let lateness = show(self.lateness);
        let mut out = match (self.windows, self.session()) {
            (Some(_), Some(s)) => format!(
                "Emit: each session once (a key's records until {} without one), when the \
                 watermark passes its end (its last record's time + {}) + {lateness} \
                 (window.allowed-lateness); a record joins the sessions open when it came, or is \
                 a dead letter ('late') when the watermark had passed its own (its time + {})\n",
                show(s.gap),
                show(s.gap),
                show(s.gap)
            ),
            (Some(_), None) if self.processing_time => "Emit: each window once, when the clock \
                 passes window_end (windows over processing time, PROCTIME())\n"
                .to_string(),
            (Some(_), None) => format!(
                "Emit: each window once, when the watermark passes window_end + {lateness} \
                 (window.allowed-lateness); records of a window already emitted: dead letters \
                 ('late')\n"
            ),
            (None, _) => format!(
                "Emit: at each checkpoint, the rows of the {} updated since the last, replacing \
                 the table's rows of the same key\n",
                match self.op {
                    Op::Group { .. } => "groups",
                    Op::Top(_) => "partitions",
                }
            ),
        };
        if !self.upper.is_row_wise() && self.windows.is_none() {
            out.push_str("  (the plan above runs on every group's row at each checkpoint)\n");
        }
        out.push_str(&self.upper.explain("  "));
        let windowed = self.windows.is_some();
        let (what, state) = match &self.op {
            Op::Group { finish, .. } => (
                format!(
                    "{}: {}",
                    if windowed {
                        "WindowAggregate"
                    } else {
                        "UpdatingAggregate"
                    },
                    displayable(finish.exec.as_ref())
                        .one_line()
                        .to_string()
                        .trim_end()
                        .replace("AggregateExec: mode=Final, ", "")
                ),
                match self.session() {
                    Some(_) => format!(
                        "each open session's accumulator state (as AggregateExec mode=Partial \
                         gives it) and the watermark its last row came after ({ARRIVAL}), \
                         sessions merged in the order their rows came"
                    ),
                    None => format!(
                        "each {}'s accumulator state (as AggregateExec mode=Partial gives it)",
                        if windowed { "open window" } else { "group" }
                    ),
                },
            ),
            Op::Top(top) => (
                format!(
                    "{}{}",
                    if windowed { "Window" } else { "Updating" },
                    top.describe()
                ),
                format!(
                    "the top rows of each {}partition, no more",
                    if windowed { "open window's " } else { "" }
                ),
            ),
        };
        let budget = crate::config::format_size(self.budget as u64);
        let spill = match windowed {
            true => format!(
                ", beyond {budget} (state.memory-budget) on local disk until its windows close"
            ),
            false => format!(
                ", beyond {budget} (state.memory-budget) on local disk in parts by key, a part \
                 rewritten at a checkpoint that updates it"
            ),
        };
        out.push_str(&format!(
            "  {what}\n    state: {state}, merged past {COMPACT_AFTER} batches as it doubles{spill}, \
             saved with each checkpoint\n"
        ));
        out
    }

    /// The schema of the state's batches.
    pub fn state_schema(&self) -> SchemaRef {
        match &self.op {
            Op::Group { partial, .. } => partial.schema(),
            Op::Top(_) => nullable(&self.input),
        }
    }

    /// The state `rows` (on time) add: their partial aggregates, or their top N.
    async fn partial(&self, rows: RecordBatch) -> Result<Vec<RecordBatch>> {
        match &self.op {
            Op::Group { partial, .. } => partial.run(&self.task, vec![rows]).await,
            Op::Top(top) => Ok(top.top(&[rows])?.into_iter().collect()),
        }
    }

    /// The rows of `state` batches (of the groups or partitions they hold): the aggregates'
    /// rows, or the top rows with their rank.
    async fn finish(&self, state: Vec<RecordBatch>) -> Result<Vec<RecordBatch>> {
        match &self.op {
            Op::Group { finish, .. } => {
                let rows = finish.run(&self.task, state).await?;
                match self.arrival() {
                    Some(arrival) => rows
                        .into_iter()
                        .map(|b| {
                            let schema = Arc::new(without_column(&b.schema(), arrival)?);
                            let mut columns = b.columns().to_vec();
                            columns.remove(arrival);
                            RecordBatch::try_new(schema, columns).map_err(internal)
                        })
                        .collect(),
                    None => Ok(rows),
                }
            }
            Op::Top(top) => Ok(vec![top.rank(&state)?]),
        }
    }

    /// The key (group or partition) of each row of a state batch, as columns: over session
    /// windows, the key whose sessions they are (the group but its window).
    fn keys(&self, batch: &RecordBatch) -> Result<Vec<ArrayRef>> {
        match &self.op {
            Op::Group {
                groups,
                session: Some(s),
                ..
            } => Ok((0..*groups)
                .filter(|i| *i != s.start && *i != s.end)
                .map(|i| batch.column(i).clone())
                .collect()),
            Op::Group { groups, .. } => Ok(batch.columns()[..*groups].to_vec()),
            Op::Top(top) => top.keys(batch),
        }
    }

    /// Over `SESSION(...)`, the state's column of each row's arrival ([`ARRIVAL`]): the
    /// group column after the query's own.
    fn arrival(&self) -> Option<usize> {
        match &self.op {
            Op::Group {
                groups,
                session: Some(_),
                ..
            } => Some(*groups),
            _ => None,
        }
    }

    /// Its session windows, when it aggregates over `SESSION(...)`.
    fn session(&self) -> Option<SessionGroup> {
        match &self.op {
            Op::Group { session, .. } => *session,
            Op::Top(_) => None,
        }
    }

    /// Merge the state's batches into one (their sessions merged, unless some of the state is
    /// on disk).
    pub async fn compact(&self, state: &mut AggregateState) -> Result<()> {
        if self.session().is_some() && state.spilled.is_empty() {
            state.batches = self.sessions(std::mem::take(&mut state.batches)).await?;
        } else if state.batches.len() > 1 {
            // Sessions are merged only with every row that may touch them at hand: a run on
            // disk that the watermark has reached since the last emit may hold rows a merge
            // of these would have to see (a session it holds, open when a row here came and
            // closed since). Rows of the same window and arrival merge all the same.
            state.batches = self.merge(std::mem::take(&mut state.batches)).await?;
        }
        state.merged = state.rows();
        Ok(())
    }

    /// State `batches` merged into one batch, each key's sessions merged first (over
    /// `SESSION(...)`). The rows of a key are taken in the order they arrived (the watermark
    /// each came after, [`ARRIVAL`]), and a row joins the sessions it overlaps that were still
    /// open when it came (their end + the allowed lateness past its arrival), as Flink merges
    /// a record's window with the sessions it holds: a record behind the watermark whose own
    /// window is open may start a session beside one closed already, never reopen it. The
    /// merged session's arrival is its last row's, so that merging again (as state is merged
    /// at any batch or checkpoint) merges nothing more: sessions left apart overlap only
    /// where one had closed before the other reached it.
    async fn sessions(&self, batches: Vec<RecordBatch>) -> Result<Vec<RecordBatch>> {
        let (Some(session), Some(arrival)) = (self.session(), self.arrival()) else {
            return self.merge(batches).await;
        };
        let Some(first) = batches.first() else {
            return Ok(batches);
        };
        let one = concat_batches(&first.schema(), &batches).map_err(internal)?;
        let (start_column, end_column) = (
            WindowColumn {
                index: session.start,
            },
            WindowColumn { index: session.end },
        );
        let starts = start_column.ends(&one)?;
        let ends = end_column.ends(&one)?;
        let arrivals = one
            .column(arrival)
            .as_primitive_opt::<Int64Type>()
            .ok_or_else(|| Error::Internal("a session's arrival is not a BIGINT".into()))?
            .clone();
        let keys = self.keys(&one)?;
        let converter = RowConverter::new(
            keys.iter()
                .map(|k| SortField::new(k.data_type().clone()))
                .collect(),
        )
        .map_err(internal)?;
        let rows = converter.convert_columns(&keys).map_err(internal)?;
        let mut order: Vec<usize> = (0..one.num_rows()).collect();
        order.sort_unstable_by(|a, b| rows.row(*a).cmp(&rows.row(*b)));
        let mut merged_start = vec![0; one.num_rows()];
        let mut merged_end = merged_start.clone();
        let mut merged_arrival = merged_start.clone();
        let mut i = 0;
        while i < order.len() {
            let key = rows.row(order[i]);
            let mut units = Vec::new();
            while i < order.len() && rows.row(order[i]) == key {
                let row = order[i];
                units.push(SessionUnit {
                    start: starts.value(row),
                    end: ends.value(row),
                    arrival: arrivals.value(row),
                    row,
                });
                i += 1;
            }
            let mut merger = SessionMerger::new(self.lateness);
            merger.merge(units);
            for session in merger.sessions() {
                for row in session.rows {
                    merged_start[row] = session.start;
                    merged_end[row] = session.end;
                    merged_arrival[row] = session.arrival;
                }
            }
        }
        let as_column = |values: Vec<i64>, like: &ArrayRef| -> Result<ArrayRef> {
            let DataType::Timestamp(_, tz) = like.data_type() else {
                return Err(Error::Internal(
                    "a session column is not a TIMESTAMP".into(),
                ));
            };
            let micros: ArrayRef = Arc::new(
                datafusion::arrow::array::TimestampMicrosecondArray::from(values)
                    .with_timezone_opt(tz.clone()),
            );
            cast(&micros, like.data_type()).map_err(internal)
        };
        let mut columns = one.columns().to_vec();
        columns[session.start] = as_column(merged_start, one.column(session.start))?;
        columns[session.end] = as_column(merged_end, one.column(session.end))?;
        columns[arrival] = Arc::new(Int64Array::from(merged_arrival));
        let relabeled = RecordBatch::try_new(one.schema(), columns).map_err(internal)?;
        self.merge(vec![relabeled]).await
    }

    /// `batches` of partial state merged into one batch, a row per group (none if empty).
    async fn merge(&self, batches: Vec<RecordBatch>) -> Result<Vec<RecordBatch>> {
        if batches.is_empty() {
            return Ok(batches);
        }
        let reduce = match &self.op {
            Op::Group { reduce, .. } => reduce,
            Op::Top(top) => return Ok(top.top(&batches)?.into_iter().collect()),
        };
        // The state's rows are many records' and already taken in: a failure here is the
        // job's (it resumes from its checkpoint), not a record's to dead-letter.
        let merged = reduce.run(&self.task, batches).await.map_err(|e| match e {
            e if e.is_record() => Error::Internal(format!("merging aggregate state: {e}")),
            e => e,
        })?;
        let one = concat_batches(&reduce.schema(), &merged)
            .map_err(|e| Error::Internal(format!("merging aggregate state: {e}")))?;
        Ok((one.num_rows() > 0).then_some(one).into_iter().collect())
    }

    /// What it is, for messages: "an aggregate" or "a top-N (ROW_NUMBER)".
    pub fn kind(&self) -> &'static str {
        match self.op {
            Op::Group { .. } => "an aggregate",
            Op::Top(_) => "a top-N (ROW_NUMBER() ... <= N)",
        }
    }

    /// The columns the table of its updated rows is keyed by, for messages.
    pub fn updating_key(&self) -> &'static str {
        match self.op {
            Op::Group { .. } => "the group columns",
            Op::Top(_) => "the PARTITION BY columns (and the ROW_NUMBER column when N > 1)",
        }
    }

    /// The windowed form of it, which appends its rows once, for messages.
    pub fn windowed_alternative(&self) -> &'static str {
        match self.op {
            Op::Group { .. } => {
                "aggregate over windows (FROM TUMBLE(source, time_column, size) ... GROUP BY \
                 window_start, window_end, ...)"
            }
            Op::Top(_) => {
                "rank within windows (FROM TUMBLE(source, time_column, size), PARTITION BY \
                 window_start, window_end, ...)"
            }
        }
    }

    /// Whether the aggregate is over windows (else it updates its groups' rows).
    pub fn is_windowed(&self) -> bool {
        self.windows.is_some()
    }

    /// For an aggregate without windows: whether the rows since the last update hold more
    /// state than the memory budget, so that the groups they touch are to be updated now rather
    /// than at the checkpoint (their rows written twice in its interval, the later replacing
    /// the earlier).
    pub fn update_due(&self, state: &AggregateState) -> bool {
        self.windows.is_none() && state.pending_bytes() > self.budget
    }

    /// Whether its windows are over processing time (they close as the clock passes them).
    pub fn is_processing_time(&self) -> bool {
        self.processing_time
    }

    /// For an aggregate without windows: the rows, as they are now, of the groups the rows
    /// since the last call updated (merged into `state`, in memory or in its parts on disk,
    /// read from `files`); `None` when none was.
    pub async fn emit_updates(
        &self,
        state: &mut AggregateState,
        files: &StateFiles<'_>,
    ) -> Result<Option<RecordBatch>> {
        if state.pending.is_empty() {
            return Ok(None);
        }
        let delta = self.merge(std::mem::take(&mut state.pending)).await?;
        state.pending_merged = 0;
        let Some(delta) = delta.into_iter().next() else {
            return Ok(None);
        };
        if !state.spilled.is_empty() {
            if !state.batches.is_empty() {
                self.spill_groups(state, files)?;
            }
            let run = state.spilled[0].clone();
            return self.update_parts(state, delta, run, files).await;
        }
        let (updated, untouched) = self
            .update(delta, std::mem::take(&mut state.batches))
            .await?;
        state.batches = untouched
            .into_iter()
            .chain(updated.iter().cloned())
            .filter(|b| b.num_rows() > 0)
            .collect();
        self.compact(state).await?;
        // A plan above that is not row-wise (an aggregate of the groups' rows, say) needs
        // every group's row, not only the updated ones'.
        let finals = match self.upper.is_row_wise() {
            true => self.finish(updated).await?,
            false => self.finish(state.batches.clone()).await?,
        };
        self.upper.run(&self.task, finals).await.map(Some)
    }

    /// `delta` (merged partial state) merged with what `batches` (state) held of its groups:
    /// the updated groups' state, and the rest of `batches`.
    async fn update(
        &self,
        delta: RecordBatch,
        batches: Vec<RecordBatch>,
    ) -> Result<(Vec<RecordBatch>, Vec<RecordBatch>)> {
        let delta_keys = self.keys(&delta)?;
        let fields = delta_keys
            .iter()
            .map(|k| SortField::new(k.data_type().clone()))
            .collect();
        let converter = RowConverter::new(fields).map_err(internal)?;
        let touched_keys = converter.convert_columns(&delta_keys).map_err(internal)?;
        let touched: HashSet<_> = touched_keys.iter().collect();
        let mut updated = vec![delta];
        let mut untouched = Vec::new();
        for batch in batches {
            let rows = converter
                .convert_columns(&self.keys(&batch)?)
                .map_err(internal)?;
            let mask: BooleanArray = rows.iter().map(|r| Some(touched.contains(&r))).collect();
            let split = |m: &BooleanArray| filter_record_batch(&batch, m).map_err(internal);
            updated.push(split(&mask)?);
            untouched.push(split(&not(&mask).map_err(internal)?)?);
        }
        Ok((self.merge(updated).await?, untouched))
    }

    /// [`Self::emit_updates`] with the groups' state on disk, in `run`'s parts: each part the
    /// delta touches is read, updated and written anew (the checkpoint before still names the
    /// old one), one at a time.
    async fn update_parts(
        &self,
        state: &mut AggregateState,
        delta: RecordBatch,
        run: SpillRun,
        files: &StateFiles<'_>,
    ) -> Result<Option<RecordBatch>> {
        let id = uuid::Uuid::new_v4().simple();
        let mut parts = run.files.clone();
        let mut out = Vec::new();
        for (p, delta) in self.partition(&delta)?.into_iter().enumerate() {
            if delta.num_rows() == 0 {
                continue;
            }
            let file = run
                .files
                .get(p)
                .ok_or_else(|| Error::Internal(format!("a spilled run without part {p}")))?;
            let held = files.store.load_state(files.job, file)?;
            let (updated, untouched) = self.update(delta, held).await?;
            let rows: Vec<RecordBatch> = untouched
                .into_iter()
                .chain(updated.iter().cloned())
                .filter(|b| b.num_rows() > 0)
                .collect();
            let name = format!("group-spill-{id}-{p}.arrow");
            files
                .store
                .save_state(files.job, &name, &self.state_schema_of(&rows), &rows)?;
            parts[p] = name;
            if self.upper.is_row_wise() {
                out.extend(self.finish(updated).await?);
            }
        }
        state.spilled = vec![SpillRun {
            files: parts.clone(),
            first_end: i64::MAX,
        }];
        if !self.upper.is_row_wise() {
            // The plan above needs every group's row: each part's, finished.
            for file in &parts {
                let held = files.store.load_state(files.job, file)?;
                if held.iter().any(|b| b.num_rows() > 0) {
                    out.extend(self.finish(held).await?);
                }
            }
        }
        self.upper.run(&self.task, out).await.map(Some)
    }

    /// The schema of state `rows`: theirs, or the state's when there are none.
    fn state_schema_of(&self, rows: &[RecordBatch]) -> SchemaRef {
        rows.first()
            .map_or_else(|| self.state_schema(), RecordBatch::schema)
    }

    /// The rows of the windows the watermark closes (end + lateness <= `watermark`), taken
    /// out of `state` (and its runs on disk, read from `files`); none when none closes.
    pub async fn emit(
        &self,
        state: &mut AggregateState,
        watermark: i64,
        files: &StateFiles<'_>,
    ) -> Result<Vec<RecordBatch>> {
        if self.windows.is_none() {
            return Ok(Vec::new());
        }
        let (closing, kept): (Vec<SpillRun>, Vec<SpillRun>) = std::mem::take(&mut state.spilled)
            .into_iter()
            .partition(|run| self.closes(run.first_end, watermark));
        state.spilled = kept;
        if closing.is_empty() {
            let batches = std::mem::take(&mut state.batches);
            let (closed, open) = self.split_closed(batches, watermark).await?;
            state.batches = open;
            state.merged = state.merged.min(state.rows());
            if closed.is_empty() {
                return Ok(Vec::new());
            }
            let finals = self.finish(closed).await?;
            return Ok(vec![self.upper.run(&self.task, finals).await?]);
        }
        // With runs on disk, the state is finished a part at a time (a group, or a key's
        // sessions, are in one part of every run), or all at once when the plan above needs
        // every row.
        let mut parts: Vec<Vec<RecordBatch>> = vec![Vec::new(); SPILL_PARTS];
        for batch in std::mem::take(&mut state.batches) {
            for (p, part) in self.partition(&batch)?.into_iter().enumerate() {
                parts[p].push(part);
            }
        }
        let groups: Vec<Vec<usize>> = if self.upper.is_row_wise() {
            (0..SPILL_PARTS).map(|p| vec![p]).collect()
        } else {
            vec![(0..SPILL_PARTS).collect()]
        };
        let mut out = Vec::new();
        for group in groups {
            let mut rows = Vec::new();
            for p in group {
                rows.append(&mut parts[p]);
                for run in &closing {
                    let file = run.files.get(p).ok_or_else(|| {
                        Error::Internal(format!("a spilled run without part {p}"))
                    })?;
                    rows.extend(files.store.load_state(files.job, file)?);
                }
            }
            rows.retain(|b| b.num_rows() > 0);
            let (closed, open) = self.split_closed(rows, watermark).await?;
            state.batches.extend(open);
            if closed.is_empty() {
                continue;
            }
            let finals = self.finish(closed).await?;
            out.push(self.upper.run(&self.task, finals).await?);
        }
        state.merged = 0;
        Ok(out)
    }

    /// Whether a window ending at `end` closes at `watermark`.
    fn closes(&self, end: i64, watermark: i64) -> bool {
        end.saturating_add(self.lateness) <= watermark
    }

    /// State `batches` split into the rows of windows the watermark closes and the others;
    /// over sessions, their windows merged first when one may close. Runs left on disk then
    /// start at or after the watermark, so any session of theirs a row here touches was open
    /// when the row came, whichever sessions merged: merging these without them merges as
    /// merging with them would, and merging again with them later finishes it.
    async fn split_closed(
        &self,
        batches: Vec<RecordBatch>,
        watermark: i64,
    ) -> Result<(Vec<RecordBatch>, Vec<RecordBatch>)> {
        let Some((_, state_end)) = self.windows else {
            return Ok((Vec::new(), batches));
        };
        let ends = |b: &RecordBatch| state_end.ends(b);
        let mut may_close = false;
        for b in &batches {
            may_close |= ends(b)?
                .iter()
                .any(|e| e.is_some_and(|e| self.closes(e, watermark)));
        }
        if !may_close {
            return Ok((Vec::new(), batches));
        }
        let batches = match self.session() {
            Some(_) => self.sessions(batches).await?,
            None => batches,
        };
        let (mut closed, mut open) = (Vec::new(), Vec::new());
        for batch in batches {
            let mask: BooleanArray = ends(&batch)?
                .iter()
                .map(|e| Some(e.is_some_and(|e| self.closes(e, watermark))))
                .collect();
            match mask.true_count() {
                0 => open.push(batch),
                n if n == batch.num_rows() => closed.push(batch),
                _ => {
                    closed.push(filter_record_batch(&batch, &mask).map_err(internal)?);
                    let rest = not(&mask).map_err(internal)?;
                    open.push(filter_record_batch(&batch, &rest).map_err(internal)?);
                }
            }
        }
        Ok((closed, open))
    }

    /// For an aggregate over windows whose state in memory passed the memory budget: the
    /// state compacted and moved to disk (`files`), a run of files by the hash of each row's
    /// group, read again when its earliest window closes.
    pub async fn spill(&self, state: &mut AggregateState, files: &StateFiles<'_>) -> Result<()> {
        if state.bytes() <= self.budget {
            return Ok(());
        }
        self.compact(state).await?;
        if state.bytes() <= self.budget / 2 {
            return Ok(());
        }
        let Some((_, state_end)) = self.windows else {
            return self.spill_groups(state, files);
        };
        for batch in std::mem::take(&mut state.batches) {
            // When the run is read again: as its earliest window closes, or over sessions,
            // as the watermark passes its earliest start (a session closing then may extend
            // into the run).
            let due = match self.session() {
                Some(s) => WindowColumn { index: s.start }
                    .ends(&batch)?
                    .iter()
                    .flatten()
                    .min()
                    .map(|start| start.saturating_add(1)),
                None => state_end.ends(&batch)?.iter().flatten().min(),
            };
            let first_end = due.unwrap_or(i64::MIN);
            let id = uuid::Uuid::new_v4().simple();
            let mut names = Vec::with_capacity(SPILL_PARTS);
            for (p, part) in self.partition(&batch)?.iter().enumerate() {
                let name = format!("window-spill-{id}-{p}.arrow");
                files.store.save_state(
                    files.job,
                    &name,
                    &batch.schema(),
                    std::slice::from_ref(part),
                )?;
                names.push(name);
            }
            state.spilled.push(SpillRun {
                files: names,
                first_end,
            });
        }
        state.merged = 0;
        Ok(())
    }

    /// For an aggregate without windows: its groups' state (compacted) moved to disk, into the
    /// parts of the one run it keeps there (each part rewritten with its groups added).
    fn spill_groups(&self, state: &mut AggregateState, files: &StateFiles<'_>) -> Result<()> {
        let held = state.spilled.first().map(|run| run.files.clone());
        let id = uuid::Uuid::new_v4().simple();
        let mut parts = Vec::with_capacity(SPILL_PARTS);
        let mut memory: Vec<Vec<RecordBatch>> = vec![Vec::new(); SPILL_PARTS];
        for batch in std::mem::take(&mut state.batches) {
            for (p, part) in self.partition(&batch)?.into_iter().enumerate() {
                memory[p].push(part);
            }
        }
        for (p, mut rows) in memory.into_iter().enumerate() {
            // A group is in memory or on disk, never both: the parts take the memory's rows.
            if let Some(file) = held.as_ref().and_then(|f| f.get(p)) {
                rows.extend(files.store.load_state(files.job, file)?);
            }
            rows.retain(|b| b.num_rows() > 0);
            let name = format!("group-spill-{id}-{p}.arrow");
            files
                .store
                .save_state(files.job, &name, &self.state_schema_of(&rows), &rows)?;
            parts.push(name);
        }
        state.spilled = vec![SpillRun {
            files: parts,
            first_end: i64::MAX,
        }];
        state.merged = 0;
        Ok(())
    }

    /// `batch` (state rows) split in [`SPILL_PARTS`] by the hash of each row's group.
    fn partition(&self, batch: &RecordBatch) -> Result<Vec<RecordBatch>> {
        let keys = self.keys(batch)?;
        let fields = keys
            .iter()
            .map(|k| SortField::new(k.data_type().clone()))
            .collect();
        let converter = RowConverter::new(fields).map_err(internal)?;
        let rows = converter.convert_columns(&keys).map_err(internal)?;
        let mut indices = vec![Vec::new(); SPILL_PARTS];
        for (i, row) in rows.iter().enumerate() {
            let part = (stable_hash(row.as_ref()) % SPILL_PARTS as u64) as usize;
            indices[part].push(i as u32);
        }
        indices
            .into_iter()
            .map(|i| take_record_batch(batch, &UInt32Array::from(i)).map_err(internal))
            .collect()
    }

    /// `rows` as the aggregate's input schema (a batch of an inferred source may be typed
    /// otherwise): each column cast to its field's type.
    fn conform(&self, rows: RecordBatch) -> Result<RecordBatch> {
        if rows.schema() == self.input {
            return Ok(rows);
        }
        let fields = self.input.fields();
        let columns =
            crate::schema::types::cast_to_fields(rows.columns(), fields).map_err(|(i, e)| {
                Error::Record(Reject::new(format!(
                    "column {} is {}, the windowed query reads it as {}: {e}",
                    fields[i].name(),
                    rows.column(i).data_type(),
                    fields[i].data_type()
                )))
            })?;
        let options = RecordBatchOptions::new().with_row_count(Some(rows.num_rows()));
        RecordBatch::try_new_with_options(nullable(&self.input), columns, &options)
            .map_err(|e| Error::Record(Reject::new(format!("the windowed query's rows: {e}"))))
    }
}

/// A row of a key's session state (or a record's own session window): its window, the
/// watermark it came after, and where it is.
#[derive(Debug, Clone, Copy)]
struct SessionUnit {
    start: i64,
    end: i64,
    arrival: i64,
    row: usize,
}

/// A key's session: its window, its last row's arrival, and its rows.
#[derive(Debug)]
struct Session {
    start: i64,
    end: i64,
    arrival: i64,
    rows: Vec<usize>,
}

/// One key's sessions merged as Flink's window operator merges them, record by record in the
/// order they came: a unit (a row, or a session of the state) joins the sessions it overlaps
/// that were open when it came (their end + `lateness` past its arrival); the others, closed,
/// stay apart and are never looked at again.
struct SessionMerger {
    lateness: i64,
    /// The sessions open at `arrival`, and those closed.
    open: Vec<Session>,
    closed: Vec<Session>,
    arrival: i64,
}

impl SessionMerger {
    fn new(lateness: i64) -> Self {
        Self {
            lateness,
            open: Vec::new(),
            closed: Vec::new(),
            arrival: i64::MIN,
        }
    }

    fn is_closed(&self, unit: &SessionUnit) -> bool {
        unit.end.saturating_add(self.lateness) <= unit.arrival
    }

    /// Sessions the watermark `arrival` closed set apart (watermarks only grow).
    fn advance(&mut self, arrival: i64) {
        if arrival <= self.arrival {
            return;
        }
        self.arrival = arrival;
        let lateness = self.lateness;
        let (open, closed): (Vec<Session>, Vec<Session>) = std::mem::take(&mut self.open)
            .into_iter()
            .partition(|s| s.end.saturating_add(lateness) > arrival);
        self.open = open;
        self.closed.extend(closed);
    }

    /// `unit` merged into the open sessions it overlaps, or a session of its own; when `held`
    /// (its own window had closed when it came), only into open sessions: false when none.
    fn join(&mut self, unit: &SessionUnit, held: bool) -> bool {
        self.advance(unit.arrival);
        let overlaps = |s: &Session, start: i64, end: i64| {
            s.end.saturating_add(self.lateness) > unit.arrival && s.start < end && start < s.end
        };
        if held && !self.open.iter().any(|s| overlaps(s, unit.start, unit.end)) {
            return false;
        }
        let mut merged = Session {
            start: unit.start,
            end: unit.end,
            arrival: unit.arrival,
            rows: vec![unit.row],
        };
        let mut k = 0;
        while k < self.open.len() {
            if overlaps(&self.open[k], merged.start, merged.end) {
                let other = self.open.swap_remove(k);
                merged.start = merged.start.min(other.start);
                merged.end = merged.end.max(other.end);
                merged.arrival = merged.arrival.max(other.arrival);
                merged.rows.extend(other.rows);
            } else {
                k += 1;
            }
        }
        self.open.push(merged);
        true
    }

    /// `units` merged in the order they came. Units of one arrival merge the same in any
    /// order, but for those whose own window had closed when they came (kept because a session
    /// open then held them, see [`StreamAggregate::open_sessions_hold`]): they join after the
    /// others of their arrival, each once a session it overlaps is there, as each had one
    /// when it came.
    fn merge(&mut self, mut units: Vec<SessionUnit>) {
        units.sort_by_key(|u| (u.arrival, self.is_closed(u), u.start));
        let mut pending: Vec<SessionUnit> = Vec::new();
        for unit in units {
            if pending.first().is_some_and(|p| p.arrival != unit.arrival) {
                self.settle(&mut pending);
            }
            if self.is_closed(&unit) {
                pending.push(unit);
            } else {
                self.join(&unit, false);
            }
        }
        self.settle(&mut pending);
    }

    /// Held units in turn, each once a session it overlaps is there.
    fn settle(&mut self, pending: &mut Vec<SessionUnit>) {
        while !pending.is_empty() {
            let before = pending.len();
            pending.retain(|u| !self.join(u, true));
            if pending.len() == before {
                break;
            }
        }
        for unit in pending.drain(..) {
            self.join(&unit, false);
        }
    }

    fn sessions(self) -> Vec<Session> {
        let mut all = self.closed;
        all.extend(self.open);
        all
    }
}

/// `schema` without its column `index`.
fn without_column(schema: &Schema, index: usize) -> Result<Schema> {
    let keep: Vec<usize> = (0..schema.fields().len()).filter(|i| *i != index).collect();
    schema.project(&keep).map_err(internal)
}

fn internal(e: datafusion::arrow::error::ArrowError) -> Error {
    Error::Internal(format!("window state: {e}"))
}

/// `schema` with every field nullable: a state batch's.
fn nullable(schema: &SchemaRef) -> SchemaRef {
    Arc::new(datafusion::arrow::datatypes::Schema::new(
        schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect::<Vec<_>>(),
    ))
}

fn unsupported(why: &str) -> Error {
    Error::Plan(format!("this INSERT cannot run continuously: {why}"))
}

/// Simplifies expressions over `schema` as DataFusion's optimizer does before planning.
fn simplifier(state: &SessionState, schema: &Arc<DFSchema>) -> impl Fn(&Expr) -> Result<Expr> {
    let context = SimplifyContext::default()
        .with_schema(schema.clone())
        .with_config_options(state.config_options().clone())
        .with_current_time();
    move |e: &Expr| Ok(ExprSimplifier::new(context.clone()).simplify(e.clone())?)
}

/// Microseconds since the epoch as a timestamp.
fn show_micros(micros: i64) -> String {
    chrono::DateTime::from_timestamp_micros(micros)
        .map(|t| t.naive_utc().to_string())
        .unwrap_or_else(|| micros.to_string())
}

#[cfg(test)]
mod tests {
    use super::{SessionMerger, SessionUnit};

    fn unit(start: i64, end: i64, arrival: i64, row: usize) -> SessionUnit {
        SessionUnit {
            start,
            end,
            arrival,
            row,
        }
    }

    fn merged(units: Vec<SessionUnit>) -> Vec<(i64, i64, Vec<usize>)> {
        let mut merger = SessionMerger::new(0);
        merger.merge(units);
        let mut out: Vec<_> = merger
            .sessions()
            .into_iter()
            .map(|mut s| {
                s.rows.sort_unstable();
                (s.start, s.end, s.rows)
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn a_row_joins_only_the_sessions_open_when_it_came() {
        // [0, 10) closed at watermark 10; a row at [5, 15) arriving then starts its own
        // session beside it, and one at [12, 22) joins that.
        let sessions = merged(vec![
            unit(0, 10, 0, 0),
            unit(5, 15, 10, 1),
            unit(12, 22, 11, 2),
        ]);
        assert_eq!(sessions, vec![(0, 10, vec![0]), (5, 22, vec![1, 2])]);
    }

    #[test]
    fn a_held_row_joins_after_the_rows_of_its_arrival_that_hold_it() {
        // Row 1's own window [2, 4) had closed at watermark 5, but the longer session [0, 9)
        // open then holds it; listed first, it still joins once that session is there.
        let sessions = merged(vec![unit(2, 4, 5, 1), unit(0, 6, 5, 0), unit(3, 9, 5, 2)]);
        assert_eq!(sessions, vec![(0, 9, vec![0, 1, 2])]);
        // Rows of a later arrival never merge into a session closed by then.
        let sessions = merged(vec![unit(0, 6, 5, 0), unit(4, 8, 7, 1)]);
        assert_eq!(sessions, vec![(0, 6, vec![0]), (4, 8, vec![1])]);
    }

    #[test]
    fn a_lone_held_row_stays_a_session_of_its_own() {
        // Kept (it was checked when it came) though nothing of its arrival overlaps it here.
        let mut merger = SessionMerger::new(0);
        merger.merge(vec![unit(0, 3, 5, 0)]);
        assert!(
            !merger.join(&unit(1, 2, 6, 1), true),
            "no open session holds it"
        );
        let sessions: Vec<_> = merger.sessions().into_iter().map(|s| s.rows).collect();
        assert_eq!(sessions, vec![vec![0]]);
    }
}
