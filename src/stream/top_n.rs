//! Top-N per partition, Flink's ROW_NUMBER pattern, as a continuous query's stateful step:
//!
//! ```sql
//! SELECT * FROM (
//!   SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC) AS rn FROM bid
//! ) WHERE rn <= 10
//! ```
//!
//! The state is rows: the query's rows below the `ROW_NUMBER`, at most N per partition. Rows
//! that can no longer reach the top N are dropped as soon as a batch, a merge or a checkpoint
//! sees them below N others of their partition; what is kept is exactly what the top N of
//! all the rows so far is made of. Deduplication is the case N = 1. Within windows, `RANK()`
//! and `DENSE_RANK()` keep ties too (a row's rank among some rows is never above its rank
//! among all, so dropping what ranks past N is as safe).

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch, UInt32Array, UInt64Array};
use datafusion::arrow::compute::{SortOptions, concat_batches, take_record_batch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::ScalarValue;
use datafusion::execution::session_state::SessionState;
use datafusion::logical_expr::expr::{WindowFunction, WindowFunctionDefinition};
use datafusion::logical_expr::utils::split_conjunction;
use datafusion::logical_expr::{BinaryExpr, Expr, LogicalPlan, Operator, Window};
use datafusion::physical_expr::{PhysicalExpr, create_physical_expr};

use crate::error::{Error, Result};

/// The top `limit` rows of each partition, by an order.
pub struct TopN {
    function: Rank,
    partition: Vec<Arc<dyn PhysicalExpr>>,
    order: Vec<(Arc<dyn PhysicalExpr>, SortOptions)>,
    limit: usize,
    /// The rows ranked: the state's rows with the rank column after them.
    ranked: SchemaRef,
    /// The SQL of the window function, for `EXPLAIN`.
    sql: String,
}

impl TopN {
    /// The top-N of `window` (the query's one ranking function), kept to the `limit` the
    /// query's filter on it sets, over rows of `input` (the physical schema of the plan below
    /// it).
    pub fn try_new(
        window: &Window,
        limit: usize,
        input: &SchemaRef,
        state: &SessionState,
    ) -> Result<Self> {
        let [expr] = window.window_expr.as_slice() else {
            return Err(unsupported(
                "it computes several window functions over the stream; a continuous query \
                 takes one ROW_NUMBER() OVER (PARTITION BY ... ORDER BY ...) bounded by a \
                 filter on it",
            ));
        };
        let (function, rank) = ranking(expr)?;
        let logical = window.input.schema();
        let props = state.execution_props();
        let physical = |e: &Expr| -> Result<Arc<dyn PhysicalExpr>> {
            Ok(create_physical_expr(e, logical, props)?)
        };
        let partition = function
            .params
            .partition_by
            .iter()
            .map(physical)
            .collect::<Result<Vec<_>>>()?;
        let order = function
            .params
            .order_by
            .iter()
            .map(|s| {
                Ok((
                    physical(&s.expr)?,
                    SortOptions {
                        descending: !s.asc,
                        nulls_first: s.nulls_first,
                    },
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let rank_field = window.schema.field(window.schema.fields().len() - 1);
        let mut fields: Vec<Field> = input
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect();
        fields.push(Field::new(rank_field.name(), DataType::UInt64, false));
        Ok(Self {
            function: rank,
            partition,
            order,
            limit,
            ranked: Arc::new(Schema::new(fields)),
            sql: expr.to_string(),
        })
    }

    /// Whether `column` is one of the partition's expressions, as a column.
    pub fn partitions_by(window: &Window, column: &str) -> bool {
        window.window_expr.iter().any(|e| {
            ranking(e).is_ok_and(|(f, _)| {
                f.params
                    .partition_by
                    .iter()
                    .any(|p| matches!(p, Expr::Column(c) if c.name == column))
            })
        })
    }

    /// How it ranks rows.
    pub fn function(&self) -> Rank {
        self.function
    }

    /// The rows with their rank, as the plan above reads them.
    pub fn ranked_schema(&self) -> SchemaRef {
        self.ranked.clone()
    }

    /// For `EXPLAIN`.
    pub fn describe(&self) -> String {
        format!("TopN: {} <= {}", self.sql, self.limit)
    }

    /// Each row's partition key, as columns.
    pub fn keys(&self, batch: &RecordBatch) -> Result<Vec<ArrayRef>> {
        evaluate(&self.partition, batch)
    }

    /// The rows of `batches` among the top N of their partition, without their rank.
    pub fn top(&self, batches: &[RecordBatch]) -> Result<Option<RecordBatch>> {
        Ok(self
            .ranked(batches)?
            .map(|(rows, _)| rows)
            .filter(|r| r.num_rows() > 0))
    }

    /// The rows of `batches` among the top N of their partition, each with its rank after
    /// its columns.
    pub fn rank(&self, batches: &[RecordBatch]) -> Result<RecordBatch> {
        let Some((rows, ranks)) = self.ranked(batches)? else {
            return Ok(RecordBatch::new_empty(self.ranked.clone()));
        };
        let mut columns = rows.columns().to_vec();
        columns.push(Arc::new(ranks));
        RecordBatch::try_new(self.ranked.clone(), columns).map_err(internal)
    }

    /// The rows of the top N of each partition, in partition and rank order, and their ranks.
    fn ranked(&self, batches: &[RecordBatch]) -> Result<Option<(RecordBatch, UInt64Array)>> {
        let Some(first) = batches.iter().find(|b| b.num_rows() > 0) else {
            return Ok(None);
        };
        let all = concat_batches(&first.schema(), batches).map_err(internal)?;
        let keys = self.keys(&all)?;
        let orders = evaluate(
            &self
                .order
                .iter()
                .map(|(e, _)| e.clone())
                .collect::<Vec<_>>(),
            &all,
        )?;
        let rows = |columns: Vec<(ArrayRef, SortOptions)>| {
            let fields = columns
                .iter()
                .map(|(c, o)| SortField::new_with_options(c.data_type().clone(), *o))
                .collect();
            let converter = RowConverter::new(fields).map_err(internal)?;
            let arrays: Vec<ArrayRef> = columns.into_iter().map(|(c, _)| c).collect();
            converter.convert_columns(&arrays).map_err(internal)
        };
        let ascending = |c: &ArrayRef| (c.clone(), SortOptions::default());
        let partitions = rows(keys.iter().map(ascending).collect())?;
        let sort = rows(
            keys.iter()
                .map(ascending)
                .chain(orders.into_iter().zip(self.order.iter().map(|(_, o)| *o)))
                .collect(),
        )?;
        let mut order: Vec<usize> = (0..all.num_rows()).collect();
        order.sort_by(|a, b| sort.row(*a).cmp(&sort.row(*b)));
        let mut keep = Vec::new();
        let mut ranks = Vec::new();
        let (mut seen, mut rank) = (0u64, 0u64);
        let mut previous: Option<(_, _)> = None;
        for i in order {
            let (partition, place) = (partitions.row(i), sort.row(i));
            let tie = match previous {
                Some((p, _)) if p != partition => {
                    (seen, rank) = (0, 0);
                    false
                }
                Some((_, q)) => q == place,
                None => false,
            };
            previous = Some((partition, place));
            seen += 1;
            rank = match self.function {
                Rank::RowNumber => seen,
                Rank::Rank if tie => rank,
                Rank::Rank => seen,
                Rank::DenseRank if tie => rank,
                Rank::DenseRank => rank + 1,
            };
            if rank <= self.limit as u64 {
                keep.push(u32::try_from(i).map_err(|_| {
                    Error::Internal("top-N: more than 2^32 rows at once".to_string())
                })?);
                ranks.push(rank);
            }
        }
        let rows = take_record_batch(&all, &UInt32Array::from(keep)).map_err(internal)?;
        Ok(Some((rows, UInt64Array::from(ranks))))
    }
}

/// A function ranking rows within their partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rank {
    /// 1, 2, 3, ... whatever the ties.
    RowNumber,
    /// Ties share a rank, the next rank skips them: 1, 1, 3.
    Rank,
    /// Ties share a rank, the next follows it: 1, 1, 2.
    DenseRank,
}

/// The function of a window expression, when it ranks (`ROW_NUMBER()`, `RANK()`,
/// `DENSE_RANK()`); else fails saying what runs instead.
fn ranking(expr: &Expr) -> Result<(&WindowFunction, Rank)> {
    let name = match expr {
        Expr::WindowFunction(f) => match &f.fun {
            WindowFunctionDefinition::WindowUDF(u) => Some((f, u.name())),
            _ => None,
        },
        Expr::Alias(a) => return ranking(&a.expr),
        _ => None,
    };
    match name {
        Some((f, "row_number")) => Ok((f, Rank::RowNumber)),
        Some((f, "rank")) => Ok((f, Rank::Rank)),
        Some((f, "dense_rank")) => Ok((f, Rank::DenseRank)),
        _ => Err(unsupported(&format!(
            "{expr} needs the whole stream; the window functions a continuous query takes \
             rank rows, ROW_NUMBER() (or RANK(), DENSE_RANK() within windows) OVER (PARTITION \
             BY ... ORDER BY ...), bounded by a filter on the rank (WHERE rn <= N), for the \
             top N rows or the first row of each partition"
        ))),
    }
}

/// The bound `plan`'s filters put on the rank `window` (its ranking step) gives, read through
/// the projections and aliases between them: `rn <= N`, `rn < N`, `rn = 1`. Where the step is
/// read more than once (a CTE), the largest bound, and none if one read has none.
pub fn rank_limit(plan: &LogicalPlan, window: &LogicalPlan) -> Option<usize> {
    let reads = rank_reads(plan, window);
    let mut limit = 0;
    for (_, bound) in reads.iter() {
        limit = limit.max((*bound)?);
    }
    (!reads.is_empty()).then_some(limit)
}

/// For each read of `window` in `plan`: the names under which `plan`'s rows carry its rank,
/// and the bound put on it between them.
fn rank_reads(plan: &LogicalPlan, window: &LogicalPlan) -> Vec<(Vec<String>, Option<usize>)> {
    if plan == window {
        let LogicalPlan::Window(w) = plan else {
            return Vec::new();
        };
        let name = w.schema.fields()[w.input.schema().fields().len()..]
            .first()
            .map(|f| f.name().clone());
        return vec![(name.into_iter().collect(), None)];
    }
    match plan {
        LogicalPlan::SubqueryAlias(s) => rank_reads(&s.input, window),
        LogicalPlan::Projection(p) => rank_reads(&p.input, window)
            .into_iter()
            .map(|(names, limit)| {
                let passed = p
                    .expr
                    .iter()
                    .zip(p.schema.fields())
                    .filter(|(e, _)| is_rank(e, &names))
                    .map(|(_, f)| f.name().clone())
                    .collect();
                (passed, limit)
            })
            .collect(),
        LogicalPlan::Filter(f) => rank_reads(&f.input, window)
            .into_iter()
            .map(|(names, mut limit)| {
                for conjunct in split_conjunction(&f.predicate) {
                    if let Some(n) = bound(conjunct, &names) {
                        limit = Some(limit.map_or(n, |l: usize| l.min(n)));
                    }
                }
                (names, limit)
            })
            .collect(),
        // Past any other operator the rank is out of sight; a bound below it holds.
        other => other
            .inputs()
            .into_iter()
            .flat_map(|i| rank_reads(i, window))
            .map(|(_, limit)| (Vec::new(), limit))
            .collect(),
    }
}

/// Whether `e` is the rank column under one of `names` (cast or aliased).
fn is_rank(e: &Expr, names: &[String]) -> bool {
    match e {
        Expr::Column(c) => names.contains(&c.name),
        Expr::Alias(a) => is_rank(&a.expr, names),
        Expr::Cast(c) => is_rank(&c.expr, names),
        Expr::TryCast(c) => is_rank(&c.expr, names),
        _ => false,
    }
}

/// The most rows a partition keeps under `conjunct`, when it bounds the rank.
fn bound(conjunct: &Expr, names: &[String]) -> Option<usize> {
    let Expr::BinaryExpr(BinaryExpr { left, op, right }) = conjunct else {
        return None;
    };
    let (op, value) = if is_rank(left, names) {
        (*op, literal(right)?)
    } else if is_rank(right, names) {
        (op.swap()?, literal(left)?)
    } else {
        return None;
    };
    let n = match op {
        Operator::LtEq => value.floor(),
        Operator::Lt => value.ceil() - 1.0,
        Operator::Eq if value == 1.0 => 1.0,
        _ => return None,
    };
    Some(if n < 0.0 { 0 } else { n as usize })
}

/// The numeric value of a literal (through casts).
fn literal(e: &Expr) -> Option<f64> {
    match e {
        Expr::Literal(v, _) => match v.cast_to(&DataType::Float64).ok()? {
            ScalarValue::Float64(Some(n)) if n.is_finite() => Some(n),
            _ => None,
        },
        Expr::Cast(c) => literal(&c.expr),
        Expr::TryCast(c) => literal(&c.expr),
        _ => None,
    }
}

fn evaluate(exprs: &[Arc<dyn PhysicalExpr>], batch: &RecordBatch) -> Result<Vec<ArrayRef>> {
    exprs
        .iter()
        .map(|e| Ok(e.evaluate(batch)?.into_array(batch.num_rows())?))
        .collect()
}

fn internal(e: datafusion::arrow::error::ArrowError) -> Error {
    Error::Internal(format!("top-N state: {e}"))
}

fn unsupported(why: &str) -> Error {
    Error::Plan(format!("this INSERT cannot run continuously: {why}"))
}
