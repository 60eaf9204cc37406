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

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::concat_batches;

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
