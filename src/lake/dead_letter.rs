//! The dead-letter table's layout: records a job could not decode, convert or write, kept
//! with the reason (the sink that writes them with each checkpoint is
//! `sink::dead_letter`; a commit that must leave rows out writes them too, see
//! `checkpoint::commit`).
//!
//! ```text
//! <namespace>.dead_letters (
//!   job STRING, source STRING, source_partition STRING, source_offset BIGINT,
//!   payload BINARY, error STRING, target_table STRING, failed_at TIMESTAMPTZ)
//! ```

use std::sync::Arc;

use datafusion::arrow::array::{
    Int64Array, LargeBinaryArray, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
use iceberg::table::Table;
use iceberg::{Catalog, ErrorKind, NamespaceIdent, TableCreation, TableIdent};

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
