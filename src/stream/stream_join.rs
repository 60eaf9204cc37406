//! Joins between streams: every row each joined source has delivered is kept, so that a batch
//! from one source joins all the rows the other sources delivered before it.
//!
//! ```text
//! batch of a:  a's slot = the batch, b's slot = b's kept rows -> the query's plan -> rows
//!              then the batch is kept as a's
//! ```
//!
//! Each pair of joined rows is made once, when the later of the two comes: the earlier is kept
//! by then, the later not yet. So an inner join of append-only streams emits append-only rows,
//! whatever order the sources' batches come in, and a replay after a crash (kept rows and
//! offsets from the same checkpoint) makes the same pairs. The rows are kept for the life of
//! the job and saved with each checkpoint.

use std::collections::BTreeMap;

use datafusion::arrow::array::{AsArray, BooleanArray, Int64Array, RecordBatch};
use datafusion::arrow::compute::{cast, concat_batches, filter_record_batch};
use datafusion::arrow::datatypes::{DataType, SchemaRef, TimeUnit, TimestampMicrosecondType};
use datafusion::common::{Column, ScalarValue};
use datafusion::logical_expr::{Expr, Operator};

use crate::error::{Error, Result};

/// Batches kept per source before they are joined into one.
const MERGE_AFTER: usize = 64;

/// The rows each joined source has delivered.
#[derive(Debug, Default, Clone)]
pub struct JoinBuffers {
    by_source: BTreeMap<String, Vec<RecordBatch>>,
}

impl JoinBuffers {
    /// The rows `source` has delivered.
    pub fn rows_of(&self, source: &str) -> &[RecordBatch] {
        self.by_source.get(source).map_or(&[], Vec::as_slice)
    }

    /// Keep `batch`, delivered by `source` and joined.
    pub fn keep(&mut self, source: &str, batch: RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let kept = self.by_source.entry(source.to_string()).or_default();
        kept.push(batch);
        if kept.len() > MERGE_AFTER {
            let schema = kept[0].schema();
            let one = concat_batches(&schema, kept.iter())
                .map_err(|e| Error::Internal(format!("keeping {source}'s rows: {e}")))?;
            *kept = vec![one];
        }
        Ok(())
    }

    /// Every source's kept rows, by source.
    pub fn sources(&self) -> impl Iterator<Item = (&String, &Vec<RecordBatch>)> {
        self.by_source.iter()
    }

    /// Kept rows restored from a checkpoint.
    pub fn restore(&mut self, source: &str, batches: Vec<RecordBatch>) {
        self.by_source.insert(source.to_string(), batches);
    }

    /// The rows kept in all.
    pub fn rows(&self) -> usize {
        self.by_source
            .values()
            .flatten()
            .map(RecordBatch::num_rows)
            .sum()
    }
}

/// The time bound of a join between two streams, from its condition: `lower <= left - right
/// <= upper` (microseconds; either may be open) between a time column of the left source and
/// one of the right, named as in their sources. With it the join is an interval join: a kept
/// row that no future row of the other source can meet (the other's watermark has passed its
/// reach) is let go, and a record that comes after its own source's watermark passed it is
/// late (its partners may be gone): a dead letter.
#[derive(Debug, Clone, PartialEq)]
pub struct TimeBound {
    /// The left source and its time column.
    pub left: (String, String),
    /// The right source and its time column.
    pub right: (String, String),
    pub lower: Option<i64>,
    pub upper: Option<i64>,
}

impl TimeBound {
    /// The bound `join`'s condition sets between a time column of each side, if it sets one;
    /// `side_source(plan)` names the one source a side reads (if it reads one).
    pub fn of(
        join: &datafusion::logical_expr::Join,
        side_source: impl Fn(&datafusion::logical_expr::LogicalPlan) -> Option<(String, SchemaRef)>,
    ) -> Option<Self> {
        use datafusion::logical_expr::utils::split_conjunction;
        let (left, left_schema) = side_source(&join.left)?;
        let (right, right_schema) = side_source(&join.right)?;
        let filter = join.filter.as_ref()?;
        // A column of one side as (is it the left's, its name), when its source has it.
        let side = |c: &Column| -> Option<(bool, String)> {
            let timestamp = |s: &SchemaRef| {
                s.field_with_name(&c.name)
                    .is_ok_and(|f| matches!(f.data_type(), DataType::Timestamp(_, _)))
            };
            if join.left.schema().has_column(c) && timestamp(&left_schema) {
                Some((true, c.name.clone()))
            } else if join.right.schema().has_column(c) && timestamp(&right_schema) {
                Some((false, c.name.clone()))
            } else {
                None
            }
        };
        let mut bound = TimeBound {
            left: (left, String::new()),
            right: (right, String::new()),
            lower: None,
            upper: None,
        };
        let mut comparisons = Vec::new();
        for e in split_conjunction(filter) {
            match e {
                Expr::BinaryExpr(b) => comparisons.push((b.left.as_ref(), b.op, b.right.as_ref())),
                Expr::Between(b) if !b.negated => {
                    comparisons.push((b.expr.as_ref(), Operator::GtEq, b.low.as_ref()));
                    comparisons.push((b.expr.as_ref(), Operator::LtEq, b.high.as_ref()));
                }
                _ => {}
            }
        }
        for (x, op, y) in comparisons {
            let (Some((cx, ox)), Some((cy, oy))) = (shifted_column(x), shifted_column(y)) else {
                continue;
            };
            let (Some((x_left, x_name)), Some((y_left, y_name))) = (side(&cx), side(&cy)) else {
                continue;
            };
            if x_left == y_left {
                continue;
            }
            // x + ox op y + oy  <=>  x - y op oy - ox; as left - right.
            let (op, c, left_name, right_name) = if x_left {
                (op, oy - ox, x_name, y_name)
            } else {
                (op.swap()?, ox - oy, y_name, x_name)
            };
            for (name, have) in [
                (&left_name, &mut bound.left.1),
                (&right_name, &mut bound.right.1),
            ] {
                if have.is_empty() {
                    *have = name.clone();
                } else if have != name {
                    return None; // bounds on two different time columns
                }
            }
            match op {
                Operator::Lt | Operator::LtEq => {
                    bound.upper = Some(bound.upper.map_or(c, |u| u.min(c)))
                }
                Operator::Gt | Operator::GtEq => {
                    bound.lower = Some(bound.lower.map_or(c, |l| l.max(c)))
                }
                _ => {}
            }
        }
        (bound.lower.is_some() || bound.upper.is_some()).then_some(bound)
    }
}

/// `column`, `column + INTERVAL ...` or `column - INTERVAL ...`, as the column and the shift
/// in microseconds.
fn shifted_column(e: &Expr) -> Option<(Column, i64)> {
    match e {
        Expr::Column(c) => Some((c.clone(), 0)),
        Expr::Cast(c) => shifted_column(&c.expr),
        Expr::BinaryExpr(b) if matches!(b.op, Operator::Plus | Operator::Minus) => {
            let (c, base) = shifted_column(&b.left)?;
            let shift = interval_micros(&b.right)?;
            Some((
                c,
                if b.op == Operator::Plus {
                    base + shift
                } else {
                    base - shift
                },
            ))
        }
        _ => None,
    }
}

/// Microseconds in an interval literal without months.
fn interval_micros(e: &Expr) -> Option<i64> {
    match e {
        Expr::Literal(ScalarValue::IntervalMonthDayNano(Some(i)), _) if i.months == 0 => {
            Some(i64::from(i.days) * 86_400_000_000 + i.nanoseconds / 1_000)
        }
        Expr::Literal(ScalarValue::IntervalDayTime(Some(i)), _) => {
            Some(i64::from(i.days) * 86_400_000_000 + i64::from(i.milliseconds) * 1_000)
        }
        Expr::Cast(c) => interval_micros(&c.expr),
        _ => None,
    }
}

impl JoinBuffers {
    /// Let go of `source`'s kept rows whose `column` is before `before` (microseconds).
    pub fn expire(&mut self, source: &str, column: &str, before: i64) -> Result<()> {
        let Some(kept) = self.by_source.get_mut(source) else {
            return Ok(());
        };
        let mut left = Vec::with_capacity(kept.len());
        for batch in kept.drain(..) {
            let times = micros(&batch, column)?;
            let keep: BooleanArray = times
                .iter()
                .map(|t| Some(t.is_none_or(|t| t >= before)))
                .collect();
            if keep.true_count() == batch.num_rows() {
                left.push(batch);
            } else if keep.true_count() > 0 {
                left.push(
                    filter_record_batch(&batch, &keep)
                        .map_err(|e| Error::Internal(format!("letting rows go: {e}")))?,
                );
            }
        }
        *kept = left;
        Ok(())
    }
}

/// A batch's timestamp `column` in microseconds since the epoch.
pub fn micros(batch: &RecordBatch, column: &str) -> Result<Int64Array> {
    let c = batch
        .column_by_name(column)
        .ok_or_else(|| Error::Internal(format!("kept rows without their column {column}")))?;
    let DataType::Timestamp(_, zone) = c.data_type() else {
        return Err(Error::Internal(format!("{column} is not a TIMESTAMP")));
    };
    let us = cast(c, &DataType::Timestamp(TimeUnit::Microsecond, zone.clone()))
        .map_err(|e| Error::Internal(format!("{column}: {e}")))?;
    Ok(us
        .as_primitive::<TimestampMicrosecondType>()
        .reinterpret_cast())
}
