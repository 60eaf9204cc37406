//! Writing a continuous job's rows to Iceberg tables: the [`Sink`] a job writes to (one
//! table, [`table::TableTarget`], or the tables `ROUTE BY` picks, [`route::RoutedSink`]),
//! each table's writer with its schema and partition evolution ([`table_sink::TableSink`]),
//! and the dead-letter table.
//!
//! ```text
//! job --write(source, rows)--> Sink --> TableSink per table --> lake::writer (files)
//!      <--Outcome {rows, rejected}--        (rejected rows: the job's dead letters)
//! checkpoint: flush -> close (PendingCommit per table) -> commit -> after_commit (new bases)
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{RecordBatch, UInt32Array};
use iceberg::TableIdent;
use iceberg::table::Table;

use crate::checkpoint::PendingCommit;
use crate::connector::{Origin, Origins};
use crate::error::{Reject, Result};

pub mod dead_letter;
pub mod route;
pub mod table;
pub mod table_sink;

/// What a continuous job writes its query's output to.
#[async_trait]
pub trait Sink: Send {
    /// Take `rows`, the query's output for records of `source`. Rows a table cannot take
    /// come back in the outcome, or, from a sink that takes a batch whole, as
    /// [`crate::Error::Record`] (the job then finds the bad rows by halving the batch).
    /// A sink may gather rows and write them in a later call.
    async fn write(
        &mut self,
        source: &str,
        rows: RecordBatch,
        origins: Option<RowOrigins>,
    ) -> Result<Outcome>;

    /// Write what earlier calls gathered: the job is about to checkpoint.
    async fn flush(&mut self) -> Result<Outcome>;

    /// Close every table's files: what the checkpoint commits, per table.
    async fn close(&mut self) -> Result<Vec<PendingCommit>>;

    /// The tables as last committed, by identifier: what the next commit starts from.
    fn known(&self) -> HashMap<TableIdent, Table>;

    /// The checkpoint that committed `pending` is done; `committed` holds the tables as its
    /// commits left them: each table's new base. Rows written since that a table, changed by
    /// another writer, cannot take are given back as rejected.
    async fn after_commit(
        &mut self,
        pending: &[PendingCommit],
        committed: &HashMap<TableIdent, Table>,
    ) -> Result<Outcome>;
}

/// What a write did: rows written (or gathered to be), and rows no table took.
#[derive(Default)]
pub struct Outcome {
    pub rows: u64,
    pub rejected: Vec<Rejected>,
}

impl Outcome {
    /// Rows a table left out (see [`Sink::after_commit`]), rejected for `table`.
    pub fn left_out(table: &str, rows: Vec<(RecordBatch, Reject)>) -> Outcome {
        let rejected = rows
            .into_iter()
            .map(|(rows, reject)| Rejected {
                source: String::new(),
                rows,
                reject,
                table: Some(table.to_string()),
                records: Vec::new(),
            })
            .collect();
        Outcome { rows: 0, rejected }
    }

    /// Both outcomes, in order.
    pub fn and(mut self, other: Outcome) -> Outcome {
        self.rows += other.rows;
        self.rejected.extend(other.rejected);
        self
    }
}

/// Rows that could not be routed or written, with why: they become dead letters.
pub struct Rejected {
    /// The source the rows' records came from.
    pub source: String,
    pub rows: RecordBatch,
    pub reject: Reject,
    /// The table the rows were meant for, when one was named.
    pub table: Option<String>,
    /// Each row's record, when known (else empty): the dead letter keeps its place and bytes.
    pub records: Vec<Option<Origin>>,
}

/// Where the rows a sink is given came from: rows `start..` of batch `batch` of a poll's
/// [`Origins`], one for one, or through `inputs`, the query's map from each output row to
/// the input row it came from.
#[derive(Clone)]
pub struct RowOrigins {
    pub origins: Arc<dyn Origins>,
    pub batch: usize,
    pub start: usize,
    pub inputs: Option<UInt32Array>,
}

impl RowOrigins {
    /// The record row `row` of the rows given came from.
    pub fn origin(&self, row: usize) -> Option<Origin> {
        let input = match &self.inputs {
            Some(inputs) if row < inputs.len() => inputs.value(row) as usize,
            Some(_) => return None,
            None => row,
        };
        self.origins.origin(self.batch, self.start + input)
    }

    /// These origins (of rows `start..`, one for one), for the rows a query made of those
    /// rows: output row `k` came from row `inputs[k]` of them.
    pub fn through(self, inputs: UInt32Array) -> Self {
        Self {
            inputs: Some(inputs),
            ..self
        }
    }
}

/// Whether `pending` (a checkpoint's commits) has one for `ident`.
pub fn commits(pending: &[PendingCommit], ident: &TableIdent) -> bool {
    pending
        .iter()
        .any(|p| p.table == ident.name() && p.namespace == ident.namespace().clone().inner())
}
