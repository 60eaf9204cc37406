//! The dead-letter table: records a job could not decode, convert or write, kept with the
//! reason instead of failing the job.
//!
//! ```text
//! <namespace>.dead_letters (
//!   job STRING, source STRING, source_partition STRING, source_offset BIGINT,
//!   payload BINARY, error STRING, target_table STRING, failed_at TIMESTAMPTZ)
//! ```
//!
//! Created on first use in the target's namespace, and written and committed in the same
//! checkpoint as the data, so it is exactly-once too.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{
    Int64Array, LargeBinaryArray, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
use iceberg::table::Table;
use iceberg::{Catalog, ErrorKind, NamespaceIdent, TableCreation, TableIdent};

use super::table_sink::TableSink;
use super::{Rejected, commits};
use crate::checkpoint::PendingCommit;
use crate::error::{Error, Result};

/// The table name, in the target's namespace.
pub const DEAD_LETTER_TABLE: &str = "dead_letters";

/// One rejected record.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetter {
    pub source: String,
    pub partition: Option<String>,
    pub offset: Option<i64>,
    pub payload: Vec<u8>,
    pub error: String,
}

fn schema() -> Result<Schema> {
    let string = || Type::Primitive(PrimitiveType::String);
    Ok(Schema::builder()
        .with_fields(vec![
            NestedField::required(1, "job", string()).into(),
            NestedField::required(2, "source", string()).into(),
            NestedField::optional(3, "source_partition", string()).into(),
            NestedField::optional(4, "source_offset", Type::Primitive(PrimitiveType::Long)).into(),
            NestedField::optional(5, "payload", Type::Primitive(PrimitiveType::Binary)).into(),
            NestedField::required(6, "error", string()).into(),
            NestedField::required(7, "target_table", string()).into(),
            NestedField::required(8, "failed_at", Type::Primitive(PrimitiveType::Timestamptz))
                .into(),
        ])
        .build()?)
}

/// The dead-letter table `name` of `namespace`, created if missing (a concurrent creator
/// wins harmlessly).
pub async fn ensure_table(
    catalog: &Arc<dyn Catalog>,
    namespace: &NamespaceIdent,
    name: &str,
) -> Result<Table> {
    let ident = TableIdent::new(namespace.clone(), name.to_string());
    match catalog.load_table(&ident).await {
        Ok(t) => return Ok(t),
        Err(e) if e.kind() == ErrorKind::TableNotFound => {}
        Err(e) => return Err(e.into()),
    }
    let creation = TableCreation::builder()
        .name(name.to_string())
        .schema(schema()?)
        .build();
    match catalog.create_table(namespace, creation).await {
        Ok(t) => Ok(t),
        Err(e) if e.kind() == ErrorKind::TableAlreadyExists => {
            Ok(catalog.load_table(&ident).await?)
        }
        Err(e) => Err(e.into()),
    }
}

/// Rows for the dead-letter table.
pub fn batch(
    job: &str,
    target: &str,
    letters: &[DeadLetter],
    table: &Table,
) -> Result<RecordBatch> {
    let arrow = Arc::new(iceberg::arrow::schema_to_arrow_schema(
        table.metadata().current_schema(),
    )?);
    let now = chrono::Utc::now().timestamp_micros();
    let n = letters.len();
    RecordBatch::try_new(
        arrow,
        vec![
            Arc::new(StringArray::from(vec![job; n])),
            Arc::new(StringArray::from_iter_values(
                letters.iter().map(|l| l.source.as_str()),
            )),
            Arc::new(StringArray::from_iter(
                letters.iter().map(|l| l.partition.as_deref()),
            )),
            Arc::new(Int64Array::from_iter(letters.iter().map(|l| l.offset))),
            Arc::new(LargeBinaryArray::from_iter(
                letters.iter().map(|l| Some(l.payload.as_slice())),
            )),
            Arc::new(StringArray::from_iter_values(
                letters.iter().map(|l| l.error.as_str()),
            )),
            Arc::new(StringArray::from(vec![target; n])),
            Arc::new(TimestampMicrosecondArray::from(vec![now; n]).with_timezone("+00:00")),
        ],
    )
    .map_err(|e| {
        Error::Plan(format!(
            "table {} does not have the dead-letter columns: {e}",
            table.identifier()
        ))
    })
}

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
                sink.after_commit(committed.get(&ident)).await?;
            }
        }
        Ok(())
    }
}

/// The dead letters of rows no table took: one per row, its payload the row as JSON.
pub fn letters_of(rejected: Vec<Rejected>) -> Vec<DeadLetter> {
    let mut letters = Vec::new();
    for r in rejected {
        let error = match &r.table {
            Some(t) => format!("table {t}: {}", r.reject),
            None => r.reject.to_string(),
        };
        for i in 0..r.rows.num_rows() {
            letters.push(DeadLetter {
                source: r.source.clone(),
                partition: None,
                offset: None,
                payload: row_json(&r.rows.slice(i, 1)),
                error: error.clone(),
            });
        }
    }
    letters
}

/// One row as a JSON object: the payload of a record rejected after decoding.
pub fn row_json(batch: &RecordBatch) -> Vec<u8> {
    let mut out = Vec::new();
    let mut w = datafusion::arrow::json::LineDelimitedWriter::new(&mut out);
    if w.write(batch).is_ok() && w.finish().is_ok() {
        drop(w);
        while out.last() == Some(&b'\n') {
            out.pop();
        }
    }
    out
}
