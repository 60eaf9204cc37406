//! Grouping routed rows by the table their route value names: one hash lookup per run of
//! equal values, one gather across the batches routed.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, RecordBatch, UInt32Array};
use datafusion::arrow::compute::{cast, interleave_record_batch, take_record_batch};
use datafusion::arrow::datatypes::{DataType, Schema as ArrowSchema};

use super::options::table_name;
use crate::error::{Error, Reject, Result};

/// A batch's rows grouped by the table their route value names.
pub(super) struct Groups {
    /// The tables, in first-seen order (two route values may name one: `A`, `a`).
    pub(super) names: Vec<String>,
    /// Row numbers (across the batches routed): each table's rows in turn (in their order),
    /// then the unroutable ones.
    order: Vec<u32>,
    /// Where each routed batch's rows start in the row numbers.
    starts: Vec<usize>,
    /// Where each table's rows end in `order`.
    pub(super) ends: Vec<usize>,
    /// Rows whose route value is NULL or names no table (empty), last in `order`.
    pub(super) unroutable: usize,
}

/// The group of a row whose route names no table.
const UNROUTABLE: u32 = u32::MAX;

impl Groups {
    /// Group the rows of `routes` (the route column of each batch routed, in turn).
    pub(super) fn of(routes: &[&dyn Array]) -> Result<Self> {
        // Text as it comes (Utf8 and Utf8View without a copy), other types cast.
        let mut cast_ones = Vec::new();
        for r in routes {
            if r.as_string_opt::<i32>().is_none() && r.as_string_view_opt().is_none() {
                cast_ones.push(cast(*r, &DataType::Utf8).map_err(|e| {
                    Error::Record(Reject::new(format!("ROUTE BY value is not text: {e}")))
                })?);
            }
        }
        let mut cast_ones = cast_ones.iter();
        let texts: Vec<&dyn Array> = routes
            .iter()
            .map(|r| {
                if r.as_string_opt::<i32>().is_some() || r.as_string_view_opt().is_some() {
                    *r
                } else {
                    cast_ones.next().map_or(*r, |c| c.as_ref())
                }
            })
            .collect();
        let values = texts
            .iter()
            .flat_map(|a| -> Box<dyn Iterator<Item = Option<&str>>> {
                match a.as_string_opt::<i32>() {
                    Some(s) => Box::new(s.iter()),
                    None => Box::new(a.as_string_view().iter()),
                }
            });
        let mut starts = Vec::with_capacity(routes.len());
        let mut len = 0;
        for r in routes {
            starts.push(len);
            len += r.len();
        }
        let mut groups = Self::group(values, len);
        groups.starts = starts;
        Ok(groups)
    }

    /// The rows of `batches` (those routed) in the order of [`Self::order`].
    pub(super) fn gather(&self, batches: &[RecordBatch]) -> Result<RecordBatch> {
        let gathered = if let [one] = batches {
            take_record_batch(one, &UInt32Array::from(self.order.clone()))
        } else {
            let indices: Vec<(usize, usize)> = self
                .order
                .iter()
                .map(|&row| {
                    let row = row as usize;
                    let b = self.starts.partition_point(|&s| s <= row) - 1;
                    (b, row - self.starts[b])
                })
                .collect();
            let batches: Vec<&RecordBatch> = batches.iter().collect();
            interleave_record_batch(&batches, &indices)
        };
        gathered.map_err(|e| Error::Internal(format!("grouping rows by route: {e}")))
    }

    fn group<'a>(routes: impl Iterator<Item = Option<&'a str>>, len: usize) -> Self {
        // Each distinct value is named once; a run of one value is looked up once.
        let mut names: Vec<String> = Vec::new();
        let mut counts: Vec<usize> = Vec::new();
        let mut group_of_name: HashMap<String, u32> = HashMap::new();
        let mut group_of_value: datafusion::common::HashMap<&str, u32> = Default::default();
        let mut last: Option<(&str, u32)> = None;
        let mut of_row: Vec<u32> = Vec::with_capacity(len);
        let mut unroutable = 0;
        for value in routes {
            let group = match value {
                None => UNROUTABLE,
                Some(v) => match last {
                    Some((l, g)) if l == v => g,
                    _ => {
                        let g = *group_of_value.entry(v).or_insert_with(|| {
                            table_name(v).map_or(UNROUTABLE, |name| {
                                *group_of_name.entry(name.clone()).or_insert_with(|| {
                                    names.push(name);
                                    counts.push(0);
                                    (counts.len() - 1) as u32
                                })
                            })
                        });
                        last = Some((v, g));
                        g
                    }
                },
            };
            match counts.get_mut(group as usize) {
                Some(c) => *c += 1,
                None => unroutable += 1,
            }
            of_row.push(group);
        }
        let ends: Vec<usize> = counts
            .iter()
            .scan(0, |end, c| {
                *end += c;
                Some(*end)
            })
            .collect();
        let mut next: Vec<usize> = std::iter::once(0)
            .chain(ends.iter().copied())
            .take(counts.len())
            .collect();
        let mut next_unroutable = len - unroutable;
        let mut order = vec![0u32; len];
        for (row, group) in of_row.into_iter().enumerate() {
            let slot = next.get_mut(group as usize).unwrap_or(&mut next_unroutable);
            order[*slot] = row as u32;
            *slot += 1;
        }
        Self {
            names,
            order,
            starts: vec![0],
            ends,
            unroutable,
        }
    }

    /// The routed batch and row (in it) of the row at `k` in the routed order.
    pub(super) fn source_row(&self, k: usize) -> (usize, usize) {
        let row = self.order.get(k).map_or(k, |&r| r as usize);
        let batch = self.starts.partition_point(|&s| s <= row).saturating_sub(1);
        (batch, row - self.starts.get(batch).copied().unwrap_or(0))
    }

    /// Whether every row goes to one table, in order: no gather is needed.
    pub(super) fn is_identity(&self) -> bool {
        self.names.len() <= 1 && self.unroutable == 0
    }
}

/// A table's rows without the columns that are NULL in every row: a field its records did
/// not carry creates no column.
pub(super) fn drop_all_null_columns(batch: &RecordBatch) -> Result<RecordBatch> {
    let keep: Vec<usize> = (0..batch.num_columns())
        .filter(|&i| batch.column(i).null_count() < batch.num_rows())
        .collect();
    if keep.len() == batch.num_columns() {
        return Ok(batch.clone());
    }
    let fields: Vec<_> = keep
        .iter()
        .map(|&i| batch.schema().field(i).clone())
        .collect();
    RecordBatch::try_new(
        Arc::new(ArrowSchema::new(fields)),
        keep.iter().map(|&i| batch.column(i).clone()).collect(),
    )
    .map_err(|e| Error::Internal(format!("dropping NULL columns: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_of_several_batches_gather_by_table() {
        use datafusion::arrow::array::{Int64Array, StringArray};
        let batch = |routes: Vec<Option<&str>>, ids: Vec<i64>| {
            RecordBatch::try_from_iter(vec![
                (
                    "route",
                    Arc::new(StringArray::from(routes)) as Arc<dyn Array>,
                ),
                ("id", Arc::new(Int64Array::from(ids))),
            ])
            .unwrap()
        };
        let batches = [
            batch(vec![Some("b"), Some("A"), None], vec![0, 1, 2]),
            batch(
                vec![Some("a"), Some("b"), Some(""), Some("a")],
                vec![3, 4, 5, 6],
            ),
        ];
        let routes: Vec<&dyn Array> = batches.iter().map(|b| b.column(0).as_ref()).collect();
        let g = Groups::of(&routes).unwrap();
        assert_eq!(g.names, vec!["b", "a"]);
        assert_eq!(g.ends, vec![2, 5]);
        assert_eq!(g.unroutable, 2);
        let sorted = g.gather(&batches).unwrap();
        let ids = sorted
            .column(1)
            .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
        assert_eq!(ids.values().to_vec(), vec![0, 4, 1, 3, 6, 2, 5]);
    }

    #[test]
    fn rows_group_by_table_in_first_seen_order() {
        use datafusion::arrow::array::{StringArray, StringViewArray};
        let values = vec![
            Some("b"),
            Some("A"),
            None,
            Some("a"),
            Some("b"),
            Some(""),
            Some("a"),
        ];
        for routes in [
            Arc::new(StringArray::from(values.clone())) as Arc<dyn Array>,
            Arc::new(StringViewArray::from(values.clone())),
        ] {
            let g = Groups::of(&[routes.as_ref()]).unwrap();
            // `A` and `a` name one table; NULL and empty name none and come last.
            assert_eq!(g.names, vec!["b", "a"]);
            assert_eq!(g.ends, vec![2, 5]);
            assert_eq!(g.unroutable, 2);
            assert_eq!(g.order, vec![0, 4, 1, 3, 6, 2, 5]);
            assert!(!g.is_identity());
        }
        let one = StringArray::from(vec!["x", "x", "X"]);
        let g = Groups::of(&[&one]).unwrap();
        assert!(g.is_identity());
        assert_eq!(g.order, vec![0, 1, 2]);
    }
}
