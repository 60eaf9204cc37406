//! Change streams' rows: a batch whose last column, [`CHANGE_COLUMN`], says whether each row
//! deletes its key (true) or inserts or replaces it (false). Decoded with the rows
//! (Debezium's `op`), carried past the job's query, and applied by the sink of a table with
//! a primary key.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, AsArray, BooleanArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};

use crate::error::{Error, Result};

/// The column saying whether each row of a change stream deletes its key.
pub const CHANGE_COLUMN: &str = "__floe_delete";

/// `rows` with `deletes` as their last column, [`CHANGE_COLUMN`].
pub fn with_changes(rows: &RecordBatch, deletes: ArrayRef) -> Result<RecordBatch> {
    let mut fields: Vec<_> = rows.schema().fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(
        CHANGE_COLUMN,
        DataType::Boolean,
        false,
    )));
    let mut columns = rows.columns().to_vec();
    columns.push(deletes);
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .map_err(|e| Error::Internal(format!("a change stream's rows: {e}")))
}

/// `batch` without [`CHANGE_COLUMN`], and that column (`None`: the rows change nothing but
/// themselves, a stream of appends).
pub fn split_changes(batch: RecordBatch) -> Result<(RecordBatch, Option<BooleanArray>)> {
    let Ok(i) = batch.schema().index_of(CHANGE_COLUMN) else {
        return Ok((batch, None));
    };
    let deletes = batch.column(i).as_boolean().clone();
    let keep: Vec<usize> = (0..batch.num_columns()).filter(|&c| c != i).collect();
    let rows = batch
        .project(&keep)
        .map_err(|e| Error::Internal(format!("a change stream's rows: {e}")))?;
    Ok((rows, Some(deletes)))
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
        let (back, deletes) = split_changes(with).unwrap();
        assert_eq!(back, rows);
        assert_eq!(deletes.unwrap(), BooleanArray::from(vec![false, true]));
    }
}
