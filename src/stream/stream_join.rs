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

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Int64Array, RecordBatch, UInt64Array,
};
use datafusion::arrow::compute::{cast, concat_batches, filter_record_batch};
use datafusion::arrow::datatypes::{
    DataType, Field, Schema, SchemaRef, TimeUnit, TimestampMicrosecondType,
};
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::{Column, ScalarValue};
use datafusion::logical_expr::{Expr, Operator};
use datafusion::physical_plan::PhysicalExpr;

use crate::checkpoint::StateStore;
use crate::error::{Error, Result};

/// Batches kept per source before they are joined into one.
const MERGE_AFTER: usize = 64;

/// Rows in a block of a spilled run's file.
const SPILL_BLOCK: usize = 8192;

/// The column a spilled run's files add to the kept rows: each row's key hash.
const KEY_HASH: &str = "__floe_key_hash";

/// For a join of two streams on equal keys: each source's side of the keys, as expressions
/// over the source's own rows, of the types the join compares them as. A batch's key hashes
/// pick the kept rows of the other source that may join it (equal keys hash the same), so the
/// join runs on those rather than on every row kept.
#[derive(Debug)]
pub struct JoinKeys {
    by_source: BTreeMap<String, Vec<Arc<dyn PhysicalExpr>>>,
    types: Vec<DataType>,
}

impl JoinKeys {
    /// Keys from each source's expressions (in the order of the join's pairs) and the types
    /// the pairs are compared as.
    pub fn new(
        by_source: BTreeMap<String, Vec<Arc<dyn PhysicalExpr>>>,
        types: Vec<DataType>,
    ) -> Self {
        Self { by_source, types }
    }

    /// The hash of each row's key, from `source`'s `batch` (NULL where a part of it is NULL:
    /// such a row joins nothing); `None` when the source has no key.
    pub fn hashes(&self, source: &str, batch: &RecordBatch) -> Result<Option<UInt64Array>> {
        let Some(exprs) = self.by_source.get(source) else {
            return Ok(None);
        };
        let fail = |e: String| Error::Internal(format!("the join key of {source}: {e}"));
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(exprs.len());
        for (e, t) in exprs.iter().zip(&self.types) {
            let array = e
                .evaluate(batch)
                .and_then(|v| v.into_array(batch.num_rows()))
                .map_err(|e| fail(e.to_string()))?;
            columns.push(cast(&array, t).map_err(|e| fail(e.to_string()))?);
        }
        let converter = RowConverter::new(
            self.types
                .iter()
                .map(|t| SortField::new(t.clone()))
                .collect(),
        )
        .map_err(|e| fail(e.to_string()))?;
        let rows = converter
            .convert_columns(&columns)
            .map_err(|e| fail(e.to_string()))?;
        let nulls = columns.iter().fold(
            None,
            |acc: Option<datafusion::arrow::buffer::NullBuffer>, c| {
                datafusion::arrow::buffer::NullBuffer::union(
                    acc.as_ref(),
                    c.logical_nulls().as_ref(),
                )
            },
        );
        let hashes: UInt64Array = (0..batch.num_rows())
            .map(|i| {
                let null = nulls.as_ref().is_some_and(|n| n.is_null(i));
                (!null).then(|| super::aggregate::stable_hash(rows.row(i).as_ref()))
            })
            .collect();
        Ok(Some(hashes))
    }
}

/// Key hashes, hashed again as themselves (they are well mixed already).
#[derive(Default)]
pub struct AsItself(u64);

impl std::hash::Hasher for AsItself {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// A set of key hashes.
pub type Hashes = HashSet<u64, std::hash::BuildHasherDefault<AsItself>>;

/// Rows a source delivered, with their key hashes when the join has keys, and the rows in
/// the order of their hashes (to find a hash's rows by binary search).
#[derive(Debug, Clone)]
struct Kept {
    rows: RecordBatch,
    hashes: Option<UInt64Array>,
    by_hash: Vec<(u64, u32)>,
}

impl Kept {
    fn new(rows: RecordBatch, hashes: Option<UInt64Array>) -> Self {
        let by_hash = hashes.iter().flat_map(|h| h.iter().enumerate());
        let by_hash = by_hash.filter_map(|(i, h)| Some((h?, i as u32))).collect();
        Self::sorted(rows, hashes, by_hash)
    }

    /// Rows with `by_hash` (pairs of hash and row) sorted by hash: a sort that merges the
    /// sorted runs it finds, as merged batches' pairs are.
    fn sorted(
        rows: RecordBatch,
        hashes: Option<UInt64Array>,
        mut by_hash: Vec<(u64, u32)>,
    ) -> Self {
        by_hash.sort();
        Self {
            rows,
            hashes,
            by_hash,
        }
    }

    /// The rows of hashes in `probe`: found by binary search when the probe is small against
    /// the rows, else by a pass over every row's hash.
    fn pick(&self, probe: &Hashes) -> Result<Option<RecordBatch>> {
        let Some(hashes) = &self.hashes else {
            return Ok(Some(self.rows.clone()));
        };
        let n = self.rows.num_rows();
        if n <= 8 * probe.len() {
            // Few rows against the batch: the join's own hash table picks them as cheaply.
            return Ok(Some(self.rows.clone()));
        }
        let log = (usize::BITS - n.leading_zeros()) as usize;
        if probe.len() * log >= n {
            return pick(&self.rows, hashes, Some(probe));
        }
        let mut rows: Vec<u32> = Vec::new();
        for h in probe {
            let from = self.by_hash.partition_point(|(x, _)| x < h);
            rows.extend(
                self.by_hash[from..]
                    .iter()
                    .take_while(|(x, _)| x == h)
                    .map(|(_, r)| *r),
            );
        }
        if rows.is_empty() {
            return Ok(None);
        }
        rows.sort_unstable();
        let indices = datafusion::arrow::array::UInt32Array::from(rows);
        datafusion::arrow::compute::take_record_batch(&self.rows, &indices)
            .map(Some)
            .map_err(|e| Error::Internal(format!("picking joined rows: {e}")))
    }
}

/// The rows of `rows` whose hash is in `probe` (all with a hash without one).
fn pick(
    rows: &RecordBatch,
    hashes: &UInt64Array,
    probe: Option<&Hashes>,
) -> Result<Option<RecordBatch>> {
    let mask: BooleanArray = hashes
        .iter()
        .map(|h| Some(h.is_some_and(|h| probe.is_none_or(|p| p.contains(&h)))))
        .collect();
    Ok(match mask.true_count() {
        0 => None,
        n if n == rows.num_rows() => Some(rows.clone()),
        _ => Some(
            filter_record_batch(rows, &mask)
                .map_err(|e| Error::Internal(format!("picking joined rows: {e}")))?,
        ),
    })
}

/// The rows each joined source has delivered: in memory, and beyond the memory budget in
/// files of the job's state folder (runs), each row with its key hash.
#[derive(Debug, Clone)]
pub struct JoinBuffers {
    by_source: BTreeMap<String, Vec<Kept>>,
    spilled: BTreeMap<String, Vec<String>>,
    /// The latest time in a run's file, by run and time column, once read (`None` when a row
    /// has none): the run is let go once an interval join's bound passes it.
    run_latest: BTreeMap<(String, String), Option<i64>>,
    keys: Option<Arc<JoinKeys>>,
    budget: usize,
    files: Option<(StateStore, String)>,
}

impl Default for JoinBuffers {
    fn default() -> Self {
        Self::new(None, usize::MAX, None)
    }
}

impl JoinBuffers {
    /// Buffers for a join on `keys` (when it has equal keys), holding `budget` bytes of rows in
    /// memory and the rest in `files` (a job's state store and name); without keys or files,
    /// all in memory.
    pub fn new(
        keys: Option<Arc<JoinKeys>>,
        budget: usize,
        files: Option<(StateStore, String)>,
    ) -> Self {
        Self {
            by_source: BTreeMap::new(),
            spilled: BTreeMap::new(),
            run_latest: BTreeMap::new(),
            keys,
            budget,
            files,
        }
    }

    /// The rows `source` has delivered that are held in memory.
    pub fn rows_of(&self, source: &str) -> Vec<RecordBatch> {
        self.by_source
            .get(source)
            .map(|k| k.iter().map(|k| k.rows.clone()).collect())
            .unwrap_or_default()
    }

    /// The key hashes of `source`'s `batch`, which pick the rows of the other sources it may
    /// join; `None` when the join has no keys (it may join any).
    pub fn probe(&self, source: &str, batch: &RecordBatch) -> Result<Option<Hashes>> {
        let Some(keys) = &self.keys else {
            return Ok(None);
        };
        Ok(keys
            .hashes(source, batch)?
            .map(|h| h.iter().flatten().collect()))
    }

    /// The rows `source` has delivered (in memory and on disk) that may join rows of the key
    /// hashes `probe` (all of them without one).
    pub fn candidates(&self, source: &str, probe: Option<&Hashes>) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        for kept in self.by_source.get(source).into_iter().flatten() {
            match probe {
                Some(p) => out.extend(kept.pick(p)?),
                None => out.push(kept.rows.clone()),
            }
        }
        if let (Some(runs), Some((store, job))) = (self.spilled.get(source), &self.files) {
            for run in runs {
                // A block at a time: memory holds one, and the rows it picks.
                for batch in store.read_state(job, run)? {
                    let batch = batch?;
                    let last = batch.num_columns() - 1;
                    let hashes = batch
                        .column(last)
                        .as_primitive::<datafusion::arrow::datatypes::UInt64Type>()
                        .clone();
                    let rows = batch
                        .project(&(0..last).collect::<Vec<_>>())
                        .map_err(|e| Error::Internal(format!("reading joined rows: {e}")))?;
                    out.extend(pick(&rows, &hashes, probe)?);
                }
            }
        }
        Ok(out)
    }

    /// Keep `batch`, delivered by `source` and joined. Past the memory budget, the rows in
    /// memory go to disk.
    pub fn keep(&mut self, source: &str, batch: RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let hashes = match &self.keys {
            Some(keys) => keys.hashes(source, &batch)?,
            None => None,
        };
        let kept = self.by_source.entry(source.to_string()).or_default();
        kept.push(Kept::new(batch, hashes));
        if kept.len() > MERGE_AFTER {
            *kept = vec![merged(source, kept)?];
        }
        if self.bytes() > self.budget {
            self.spill()?;
        }
        Ok(())
    }

    /// The bytes of the rows held in memory.
    fn bytes(&self) -> usize {
        self.by_source
            .values()
            .flatten()
            .map(|k| k.rows.get_array_memory_size())
            .sum()
    }

    /// Move the rows in memory to disk: a file per source, its rows with their key hashes
    /// (only a join on keys spills: without them each batch reads every row kept).
    fn spill(&mut self) -> Result<()> {
        let (Some(_), Some((store, job))) = (&self.keys, &self.files) else {
            return Ok(());
        };
        for (source, kept) in std::mem::take(&mut self.by_source) {
            if kept.is_empty() {
                continue;
            }
            let one = merged(&source, &kept)?;
            let Some(hashes) = one.hashes else {
                self.by_source
                    .insert(source, vec![Kept::new(one.rows, None)]);
                continue;
            };
            let mut fields: Vec<Arc<Field>> = one.rows.schema().fields().iter().cloned().collect();
            fields.push(Arc::new(Field::new(KEY_HASH, DataType::UInt64, true)));
            let schema = Arc::new(Schema::new(fields));
            let mut columns = one.rows.columns().to_vec();
            columns.push(Arc::new(hashes));
            let batch = RecordBatch::try_new(schema.clone(), columns)
                .map_err(|e| Error::Internal(format!("spilling joined rows: {e}")))?;
            let name = format!("join-spill-{}.arrow", uuid::Uuid::new_v4().simple());
            // In blocks, read back one at a time.
            let blocks: Vec<RecordBatch> = (0..batch.num_rows())
                .step_by(SPILL_BLOCK)
                .map(|at| batch.slice(at, SPILL_BLOCK.min(batch.num_rows() - at)))
                .collect();
            store.save_state(job, &name, &schema, &blocks)?;
            self.spilled.entry(source).or_default().push(name);
        }
        Ok(())
    }

    /// Every source's rows kept in memory, by source.
    pub fn sources(&self) -> impl Iterator<Item = (&String, Vec<RecordBatch>)> {
        self.by_source
            .iter()
            .map(|(s, k)| (s, k.iter().map(|k| k.rows.clone()).collect()))
    }

    /// Every source's files of rows on disk, by source.
    pub fn spilled(&self) -> &BTreeMap<String, Vec<String>> {
        &self.spilled
    }

    /// Kept rows restored from a checkpoint: those that were in memory, and the files of
    /// those on disk.
    pub fn restore(
        &mut self,
        source: &str,
        batches: Vec<RecordBatch>,
        spilled: Vec<String>,
    ) -> Result<()> {
        let mut kept = Vec::with_capacity(batches.len());
        for rows in batches {
            let hashes = match &self.keys {
                Some(keys) => keys.hashes(source, &rows)?,
                None => None,
            };
            kept.push(Kept::new(rows, hashes));
        }
        self.by_source.insert(source.to_string(), kept);
        if !spilled.is_empty() {
            self.spilled.insert(source.to_string(), spilled);
        }
        Ok(())
    }

    /// The rows kept in memory in all.
    pub fn rows(&self) -> usize {
        self.by_source
            .values()
            .flatten()
            .map(|k| k.rows.num_rows())
            .sum()
    }
}

/// `kept` (rows of `source`) as one batch, with their hashes.
fn merged(source: &str, kept: &[Kept]) -> Result<Kept> {
    let fail = |e: datafusion::arrow::error::ArrowError| {
        Error::Internal(format!("keeping {source}'s rows: {e}"))
    };
    let schema = kept[0].rows.schema();
    let rows = concat_batches(&schema, kept.iter().map(|k| &k.rows)).map_err(fail)?;
    let hashes = match kept
        .iter()
        .map(|k| k.hashes.as_ref())
        .collect::<Option<Vec<_>>>()
    {
        Some(h) => {
            let arrays: Vec<&dyn Array> = h.iter().map(|a| *a as &dyn Array).collect();
            let one = datafusion::arrow::compute::concat(&arrays).map_err(fail)?;
            Some(
                one.as_primitive::<datafusion::arrow::datatypes::UInt64Type>()
                    .clone(),
            )
        }
        None => None,
    };
    // Each part's pairs are sorted already: offset, they are runs the sort merges.
    let mut by_hash = Vec::with_capacity(kept.iter().map(|k| k.by_hash.len()).sum());
    let mut offset = 0u32;
    for k in kept {
        by_hash.extend(k.by_hash.iter().map(|(h, r)| (*h, r + offset)));
        offset += k.rows.num_rows() as u32;
    }
    Ok(Kept::sorted(rows, hashes, by_hash))
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
    /// Let go of `source`'s kept rows whose `column` is before `before` (microseconds): in
    /// memory each such row, on disk each file whose rows all are (a file with later rows stays;
    /// the join's own condition keeps its earlier rows from joining).
    pub fn expire(&mut self, source: &str, column: &str, before: i64) -> Result<()> {
        self.expire_runs(source, column, before)?;
        let Some(kept) = self.by_source.get_mut(source) else {
            return Ok(());
        };
        let mut left = Vec::with_capacity(kept.len());
        for k in kept.drain(..) {
            let times = micros(&k.rows, column)?;
            let keep: BooleanArray = times
                .iter()
                .map(|t| Some(t.is_none_or(|t| t >= before)))
                .collect();
            if keep.true_count() == k.rows.num_rows() {
                left.push(k);
            } else if keep.true_count() > 0 {
                let fail = |e| Error::Internal(format!("letting rows go: {e}"));
                let rows = filter_record_batch(&k.rows, &keep).map_err(fail)?;
                let hashes = match &k.hashes {
                    Some(h) => Some(
                        datafusion::arrow::compute::filter(h, &keep)
                            .map_err(fail)?
                            .as_primitive::<datafusion::arrow::datatypes::UInt64Type>()
                            .clone(),
                    ),
                    None => None,
                };
                left.push(Kept::new(rows, hashes));
            }
        }
        *kept = left;
        Ok(())
    }
}

impl JoinBuffers {
    /// Drop `source`'s files on disk whose rows' `column` is all before `before`.
    fn expire_runs(&mut self, source: &str, column: &str, before: i64) -> Result<()> {
        let (Some(runs), Some((store, job))) = (self.spilled.get_mut(source), &self.files) else {
            return Ok(());
        };
        let mut left = Vec::with_capacity(runs.len());
        for run in runs.drain(..) {
            let key = (run.clone(), column.to_string());
            let latest = match self.run_latest.get(&key) {
                Some(l) => *l,
                None => {
                    let mut latest = Some(i64::MIN);
                    for batch in store.read_state(job, &run)? {
                        let times = micros(&batch?, column)?;
                        latest = match times.null_count() {
                            0 => latest.max(datafusion::arrow::compute::max(&times)),
                            _ => None,
                        };
                        if latest.is_none() {
                            break;
                        }
                    }
                    self.run_latest.insert(key.clone(), latest);
                    latest
                }
            };
            if latest.is_some_and(|l| l < before) {
                self.run_latest.remove(&key);
            } else {
                left.push(run);
            }
        }
        *runs = left;
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

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, TimestampMicrosecondArray};
    use datafusion::physical_expr::expressions::Column as ColumnExpr;

    /// Rows `(id, ts)` of source `s`, its key `id`.
    fn rows(ids: std::ops::Range<i64>, ts: i64) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("ts", DataType::Timestamp(TimeUnit::Microsecond, None), true),
        ]));
        let n = (ids.end - ids.start) as usize;
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values(ids)),
                Arc::new(TimestampMicrosecondArray::from(vec![ts; n])),
            ],
        )
        .unwrap()
    }

    fn buffers(dir: &std::path::Path, budget: usize) -> JoinBuffers {
        let key: Arc<dyn PhysicalExpr> = Arc::new(ColumnExpr::new("id", 0));
        let keys = JoinKeys::new(
            BTreeMap::from([
                ("s".to_string(), vec![key.clone()]),
                ("t".to_string(), vec![key]),
            ]),
            vec![DataType::Int64],
        );
        JoinBuffers::new(
            Some(Arc::new(keys)),
            budget,
            Some((StateStore::new(dir), "job".to_string())),
        )
    }

    fn ids(batches: &[RecordBatch]) -> Vec<i64> {
        let mut out: Vec<i64> = batches
            .iter()
            .flat_map(|b| {
                b.column(0)
                    .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
                    .values()
                    .to_vec()
            })
            .collect();
        out.sort_unstable();
        out
    }

    #[test]
    fn kept_rows_are_picked_by_key_in_memory_and_on_disk_and_files_go_past_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let mut kept = buffers(dir.path(), 1);
        // Each batch goes to disk (the budget is a byte), the last one stays in memory.
        kept.keep("s", rows(0..1000, 10)).unwrap();
        kept.keep("s", rows(1000..2000, 20)).unwrap();
        assert_eq!(kept.spilled().get("s").map(Vec::len), Some(2));
        kept.budget = usize::MAX;
        kept.keep("s", rows(2000..3000, 30)).unwrap();
        assert_eq!(kept.rows(), 1000, "the last batch in memory");

        let probe = kept
            .probe("t", &rows(0..1, 0).slice(0, 1))
            .unwrap()
            .unwrap();
        assert_eq!(ids(&kept.candidates("s", Some(&probe)).unwrap()), vec![0]);
        let mut wanted = rows(990..1010, 0);
        wanted = datafusion::arrow::compute::concat_batches(
            &wanted.schema(),
            &[wanted.clone(), rows(2995..3005, 0)],
        )
        .unwrap();
        let probe = kept.probe("t", &wanted).unwrap().unwrap();
        let found = ids(&kept.candidates("s", Some(&probe)).unwrap());
        let expected: Vec<i64> = (990..1010).chain(2995..3000).collect();
        assert_eq!(
            found, expected,
            "rows of the probe's keys, from disk and memory"
        );
        assert_eq!(ids(&kept.candidates("s", None).unwrap()).len(), 3000);

        // The first file's rows are all before 15: it goes; the second's are not.
        kept.expire("s", "ts", 15).unwrap();
        assert_eq!(kept.spilled().get("s").map(Vec::len), Some(1));
        assert_eq!(ids(&kept.candidates("s", None).unwrap()).len(), 2000);
        kept.expire("s", "ts", 25).unwrap();
        assert_eq!(kept.spilled().get("s").map(Vec::len), Some(0));
        assert_eq!(
            ids(&kept.candidates("s", None).unwrap()),
            (2000..3000).collect::<Vec<_>>()
        );
    }
}
