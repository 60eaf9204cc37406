//! Change streams' rows: a batch whose trailing columns say what each row changes.
//! [`CHANGE_COLUMN`] says whether it deletes its key (true) or inserts or replaces it
//! (false); [`KEY_NAMES_COLUMN`], where the stream says, which columns are the key of the
//! row's source table (a Debezium message key's). Decoded with the rows (Debezium's `op`),
//! carried past the job's query, and applied by the sink of a table with a primary key (or
//! taken as the key of a routed table created on first sight).
//!
//! [`SOURCE_TABLE_COLUMN`] is a plain column of the query (`ROUTE BY __source_table`) that
//! sinks never write.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, AsArray, BooleanArray, Int64Array, RecordBatch, StringArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};

use crate::error::{Error, Result};

/// The column saying whether each row of a change stream deletes its key.
pub const CHANGE_COLUMN: &str = "__floe_delete";

/// The column naming the key columns of each row's source table, joined by `,` (NULL: the
/// stream does not say, or the source table has no key).
pub const KEY_NAMES_COLUMN: &str = "__floe_key";

/// The column ordering a change stream's changes of one key (a Kafka offset: a key's changes
/// are all in one partition), where the source can say: rows decoded in groups (one per
/// record shape or writer schema) reach a sink out of their records' order.
pub const SEQ_COLUMN: &str = "__floe_seq";

/// The source table of each change (Debezium's `source.table`), for routing.
pub const SOURCE_TABLE_COLUMN: &str = "__source_table";

/// Whether `name` is one of the trailing change columns (not one of the query's).
pub fn is_change_column(name: &str) -> bool {
    name == CHANGE_COLUMN || name == KEY_NAMES_COLUMN || name == SEQ_COLUMN
}

/// What a change stream's rows change: whether each deletes its key, and the names of its
/// source table's key where the stream says.
#[derive(Debug, Clone)]
pub struct Changes {
    pub deletes: BooleanArray,
    pub key_names: Option<StringArray>,
    /// The order of the changes of one key ([`SEQ_COLUMN`]), where the source says.
    pub seq: Option<Int64Array>,
}

impl Changes {
    /// The changes of the rows at `indices` (rows a query made from these).
    pub fn take(&self, indices: &dyn datafusion::arrow::array::Array) -> Result<Changes> {
        let fail = |e| Error::Internal(format!("a change stream's rows: {e}"));
        let take = |a: &dyn datafusion::arrow::array::Array| {
            datafusion::arrow::compute::take(a, indices, None).map_err(fail)
        };
        Ok(Changes {
            deletes: take(&self.deletes)?.as_boolean().clone(),
            key_names: match &self.key_names {
                Some(k) => Some(take(k)?.as_string::<i32>().clone()),
                None => None,
            },
            seq: match &self.seq {
                Some(s) => Some(take(s)?.as_primitive::<Int64Type>().clone()),
                None => None,
            },
        })
    }

    /// The key names the rows' source tables have, each once (NULL for none).
    pub fn distinct_key_names(&self) -> Vec<Option<&str>> {
        let mut out: Vec<Option<&str>> = Vec::new();
        if let Some(k) = &self.key_names {
            for name in k.iter() {
                if !out.contains(&name) {
                    out.push(name);
                }
            }
        }
        out
    }
}

/// `rows` with `deletes` as their last column, [`CHANGE_COLUMN`].
pub fn with_changes(rows: &RecordBatch, deletes: ArrayRef) -> Result<RecordBatch> {
    with_columns(
        rows,
        vec![(CHANGE_COLUMN, DataType::Boolean, false, deletes)],
    )
}

/// `rows` with the change columns of `changes` last.
pub fn with_change_columns(rows: &RecordBatch, changes: &Changes) -> Result<RecordBatch> {
    let mut extra: Vec<(&str, DataType, bool, ArrayRef)> = vec![(
        CHANGE_COLUMN,
        DataType::Boolean,
        false,
        Arc::new(changes.deletes.clone()),
    )];
    if let Some(k) = &changes.key_names {
        extra.push((KEY_NAMES_COLUMN, DataType::Utf8, true, Arc::new(k.clone())));
    }
    if let Some(s) = &changes.seq {
        extra.push((SEQ_COLUMN, DataType::Int64, false, Arc::new(s.clone())));
    }
    with_columns(rows, extra)
}

/// `rows` with columns appended.
pub fn with_columns(
    rows: &RecordBatch,
    extra: Vec<(&str, DataType, bool, ArrayRef)>,
) -> Result<RecordBatch> {
    let mut fields: Vec<_> = rows.schema().fields().iter().cloned().collect();
    let mut columns = rows.columns().to_vec();
    for (name, ty, nullable, column) in extra {
        fields.push(Arc::new(Field::new(name, ty, nullable)));
        columns.push(column);
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .map_err(|e| Error::Internal(format!("a change stream's rows: {e}")))
}

/// `batch` without its change columns, and what they say (`None`: the rows change nothing
/// but themselves, a stream of appends).
pub fn split_changes(batch: RecordBatch) -> Result<(RecordBatch, Option<Changes>)> {
    let schema = batch.schema();
    let Ok(i) = schema.index_of(CHANGE_COLUMN) else {
        return Ok((batch, None));
    };
    let deletes = batch.column(i).as_boolean().clone();
    let k = schema.index_of(KEY_NAMES_COLUMN).ok();
    let key_names = k.map(|k| batch.column(k).as_string::<i32>().clone());
    let q = schema.index_of(SEQ_COLUMN).ok();
    let seq = q.map(|q| batch.column(q).as_primitive::<Int64Type>().clone());
    let keep: Vec<usize> = (0..batch.num_columns())
        .filter(|&c| c != i && Some(c) != k && Some(c) != q)
        .collect();
    let rows = batch
        .project(&keep)
        .map_err(|e| Error::Internal(format!("a change stream's rows: {e}")))?;
    Ok((
        rows,
        Some(Changes {
            deletes,
            key_names,
            seq,
        }),
    ))
}

/// `batch` without [`SOURCE_TABLE_COLUMN`], which is the query's to route by, not a table's.
pub fn without_source_table(batch: RecordBatch) -> Result<RecordBatch> {
    let Ok(i) = batch.schema().index_of(SOURCE_TABLE_COLUMN) else {
        return Ok(batch);
    };
    let keep: Vec<usize> = (0..batch.num_columns()).filter(|&c| c != i).collect();
    batch
        .project(&keep)
        .map_err(|e| Error::Internal(format!("a change stream's rows: {e}")))
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::Int64Array;

    use super::*;

    #[test]
    fn changes_split_off_and_back() {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let rows =
            RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![1, 2]))]).unwrap();
        let (same, none) = split_changes(rows.clone()).unwrap();
        assert_eq!(same, rows);
        assert!(none.is_none());
        let flags = Arc::new(BooleanArray::from(vec![false, true]));
        let with = with_changes(&rows, flags).unwrap();
        assert_eq!(with.schema().field(1).name(), CHANGE_COLUMN);
        let (back, changes) = split_changes(with).unwrap();
        assert_eq!(back, rows);
        let changes = changes.unwrap();
        assert_eq!(changes.deletes, BooleanArray::from(vec![false, true]));
        assert!(changes.key_names.is_none());
        // With key names, through a query that kept the second row twice.
        let keyed = Changes {
            key_names: Some(StringArray::from(vec![Some("id"), None])),
            seq: Some(Int64Array::from(vec![7, 3])),
            ..changes
        };
        let with = with_change_columns(&rows, &keyed).unwrap();
        let (_, back) = split_changes(with).unwrap();
        let taken = back
            .unwrap()
            .take(&Int64Array::from(vec![1, 1, 0]))
            .unwrap();
        assert_eq!(taken.deletes, BooleanArray::from(vec![true, true, false]));
        assert_eq!(taken.distinct_key_names(), vec![None, Some("id")]);
        assert_eq!(taken.seq.unwrap(), Int64Array::from(vec![3, 3, 7]));
    }
}
