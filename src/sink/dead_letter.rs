//! The dead-letter table: records a job could not decode, convert or write, kept with the
//! reason instead of failing the job (its layout: `lake::dead_letter`).
//!
//! Created on first use in the target's namespace, and written and committed in the same
//! checkpoint as the data, so it is exactly-once too.

use std::collections::HashMap;
use std::sync::Arc;

use iceberg::table::Table;
use iceberg::{Catalog, NamespaceIdent, TableIdent};

use super::table_sink::TableSink;
use super::{Rejected, commits};
use crate::checkpoint::{DeadLetterTarget, PendingCommit};
use crate::connector::Origin;
use crate::error::{Error, Result};
pub use crate::lake::dead_letter::{DEAD_LETTER_TABLE, DeadLetter, batch, ensure_table, row_json};
use datafusion::arrow::array::RecordBatch;

/// A job's dead-letter table, created when the first letter comes, written and committed
/// with the job's checkpoints.
pub struct DeadLetters {
    catalog_name: String,
    catalog: Arc<dyn Catalog>,
    namespace: NamespaceIdent,
    name: String,
    /// The job and its target, as each letter names them.
    job: String,
    target: String,
    sink: Option<TableSink>,
}

impl DeadLetters {
    /// The dead letters of `job` (writing to `target`): table `name` of `namespace`.
    pub fn new(
        catalog_name: &str,
        catalog: &Arc<dyn Catalog>,
        namespace: NamespaceIdent,
        name: &str,
        job: &str,
        target: &str,
    ) -> Self {
        Self {
            catalog_name: catalog_name.to_string(),
            catalog: catalog.clone(),
            namespace,
            name: name.to_string(),
            job: job.to_string(),
            target: target.to_string(),
            sink: None,
        }
    }

    /// Write `letters` (nothing visible until the checkpoint commits them).
    pub async fn write(&mut self, letters: &[DeadLetter]) -> Result<u64> {
        if letters.is_empty() {
            return Ok(0);
        }
        let sink = match &mut self.sink {
            Some(s) => s,
            None => {
                let table = ensure_table(&self.catalog, &self.namespace, &self.name).await?;
                self.sink.insert(
                    TableSink::new(&self.catalog_name, &self.catalog, table, false, Vec::new())
                        .created_on_sight(),
                )
            }
        };
        let rows = batch(&self.job, &self.target, letters, sink.table())?;
        match sink.write(rows).await {
            Err(Error::Record(reason)) => Err(Error::Plan(format!(
                "the dead-letter table {} cannot take dead letters: {reason}",
                sink.table().identifier()
            ))),
            other => other,
        }
    }

    /// Whether letters are written that no checkpoint has committed yet.
    pub fn has_pending(&self) -> bool {
        self.sink.as_ref().is_some_and(|s| !s.is_idle())
    }

    /// Where the letters go, as a checkpoint record names it.
    pub fn target(&self) -> DeadLetterTarget {
        DeadLetterTarget {
            namespace: self.namespace.clone().inner(),
            table: self.name.clone(),
            target: self.target.clone(),
        }
    }

    /// Close the table's files: what the checkpoint commits of it.
    pub async fn close(&mut self) -> Result<Option<PendingCommit>> {
        match &mut self.sink {
            Some(s) => s.close().await,
            None => Ok(None),
        }
    }

    /// The table as last committed, once it is written.
    pub fn known(&self) -> Option<(TableIdent, Table)> {
        let table = self.sink.as_ref()?.table();
        Some((table.identifier().clone(), table.clone()))
    }

    /// As [`crate::sink::Sink::after_commit`].
    pub async fn after_commit(
        &mut self,
        pending: &[PendingCommit],
        committed: &HashMap<TableIdent, Table>,
    ) -> Result<()> {
        if let Some(sink) = &mut self.sink {
            let ident = sink.table().identifier().clone();
            if commits(pending, &ident) {
                let left_out = sink.after_commit(committed.get(&ident)).await?;
                if let Some((_, reject)) = left_out.first() {
                    return Err(Error::Plan(format!(
                        "the dead-letter table {ident} cannot take dead letters: {reject}"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// The dead letter of `row` (one row of `source`'s), rejected for `error`: its record's place
/// and bytes when known, else the row as JSON.
pub fn letter(
    source: &str,
    record: Option<Origin>,
    row: &RecordBatch,
    error: String,
) -> DeadLetter {
    match record {
        Some((partition, offset, payload)) => DeadLetter {
            source: source.to_string(),
            partition: Some(partition),
            offset: i64::try_from(offset).ok(),
            payload,
            error,
        },
        None => DeadLetter {
            source: source.to_string(),
            partition: None,
            offset: None,
            payload: row_json(row),
            error,
        },
    }
}

/// The dead letters of rows no table took: one per row, with its record's place and bytes
/// when known, else the row as JSON.
pub fn letters_of(rejected: Vec<Rejected>) -> Vec<DeadLetter> {
    let mut letters = Vec::new();
    for r in rejected {
        let error = match &r.table {
            Some(t) => format!("table {t}: {}", r.reject),
            None => r.reject.to_string(),
        };
        for i in 0..r.rows.num_rows() {
            let record = r.records.get(i).cloned().flatten();
            letters.push(letter(
                &r.source,
                record,
                &r.rows.slice(i, 1),
                error.clone(),
            ));
        }
    }
    letters
}
