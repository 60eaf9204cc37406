//! Record formats: bytes of one record each, decoded into Arrow columns.
//!
//! ```text
//! 'format' = 'json'    one JSON object per record, into the declared columns
//! 'format' = 'csv'     one CSV line per record ('csv.delimiter', default ',')
//! 'format' = 'raw'     the whole record into the one declared column (STRING or BYTES)
//! ```
//!
//! Decoding is columnar (arrow-json / arrow-csv over the whole poll). Only when a poll holds a
//! bad record are its records decoded one by one, to keep the good ones and reject the bad
//! ones with their reason.

use std::io::Cursor;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, BinaryArray, RecordBatch, StringArray};
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::{DataType, SchemaRef};

use crate::error::{Error, Result};
use crate::sql::Options;

/// How records are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Csv { delimiter: u8 },
    Raw,
}

/// Decodes records of one format into a fixed schema.
#[derive(Debug, Clone)]
pub struct Decoder {
    format: Format,
    schema: SchemaRef,
}

/// What a decode produced: a batch of the good records, which input records they are, and
/// the bad ones with their errors.
#[derive(Debug)]
pub struct Decoded {
    pub batch: RecordBatch,
    /// Index in the input of each row of `batch`.
    pub rows: Vec<usize>,
    /// Index in the input and error of each record that did not decode.
    pub errors: Vec<(usize, String)>,
}

impl Decoder {
    /// A decoder for the `'format'` option (and its own options) into `schema`.
    pub fn try_new(format: &str, options: &mut Options, schema: SchemaRef) -> Result<Self> {
        let format = match format {
            "json" => Format::Json,
            "csv" => {
                let delimiter = match options.take_str("csv.delimiter") {
                    None => b',',
                    Some(d) if d.len() == 1 => d.as_bytes()[0],
                    Some(d) => {
                        return Err(Error::Option(format!(
                            "'csv.delimiter' must be one character, got '{d}'"
                        )));
                    }
                };
                Format::Csv { delimiter }
            }
            "raw" => {
                let ok = schema.fields().len() == 1
                    && matches!(
                        schema.field(0).data_type(),
                        DataType::Utf8 | DataType::Binary
                    );
                if !ok {
                    return Err(Error::Plan(
                        "'format' = 'raw' needs exactly one column, of type STRING or BYTES"
                            .to_string(),
                    ));
                }
                Format::Raw
            }
            other => {
                return Err(Error::Option(format!(
                    "'format' = '{other}' is not supported; use 'json', 'csv' or 'raw'"
                )));
            }
        };
        Ok(Self { format, schema })
    }

    /// The format.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Decode `records`.
    pub fn decode(&self, records: &[&[u8]]) -> Result<Decoded> {
        if let Ok(batch) = self.decode_all(records) {
            return Ok(Decoded {
                batch,
                rows: (0..records.len()).collect(),
                errors: Vec::new(),
            });
        }
        let mut good = Vec::new();
        let mut rows = Vec::new();
        let mut errors = Vec::new();
        for (i, r) in records.iter().enumerate() {
            match self.decode_all(std::slice::from_ref(r)) {
                Ok(b) => {
                    good.push(b);
                    rows.push(i);
                }
                Err(e) => errors.push((i, e)),
            }
        }
        let batch = concat_batches(&self.schema, &good)
            .map_err(|e| Error::Internal(format!("joining decoded records: {e}")))?;
        Ok(Decoded {
            batch,
            rows,
            errors,
        })
    }

    fn decode_all(&self, records: &[&[u8]]) -> std::result::Result<RecordBatch, String> {
        let rows = records.len().max(1);
        let mut batches = Vec::new();
        match self.format {
            Format::Json => {
                // One more than the records: a record holding two objects overflows it.
                let mut decoder = datafusion::arrow::json::ReaderBuilder::new(self.schema.clone())
                    .with_batch_size(rows + 1)
                    .build_decoder()
                    .map_err(|e| e.to_string())?;
                for r in records {
                    let text = std::str::from_utf8(r).map_err(|e| e.to_string())?;
                    if text.trim().is_empty() {
                        return Err("empty record".to_string());
                    }
                    let mut buf = text.as_bytes();
                    while !buf.is_empty() {
                        let n = decoder.decode(buf).map_err(|e| e.to_string())?;
                        if n == 0 {
                            return Err("a record holds more than one JSON value".to_string());
                        }
                        buf = &buf[n..];
                    }
                    // One record each: a record that is not a whole object fails here.
                    decoder.decode(b"\n").map_err(|e| e.to_string())?;
                }
                if let Some(b) = decoder.flush().map_err(|e| e.to_string())? {
                    batches.push(b);
                }
            }
            Format::Csv { delimiter } => {
                let mut text = Vec::new();
                for r in records {
                    text.extend_from_slice(r);
                    text.push(b'\n');
                }
                let reader = datafusion::arrow::csv::ReaderBuilder::new(self.schema.clone())
                    .with_header(false)
                    .with_delimiter(delimiter)
                    .with_batch_size(rows)
                    .build(Cursor::new(text))
                    .map_err(|e| e.to_string())?;
                for b in reader {
                    batches.push(b.map_err(|e| e.to_string())?);
                }
            }
            Format::Raw => {
                let column: ArrayRef = match self.schema.field(0).data_type() {
                    DataType::Utf8 => Arc::new(StringArray::from_iter_values(
                        records
                            .iter()
                            .map(|r| std::str::from_utf8(r).map_err(|e| e.to_string()))
                            .collect::<std::result::Result<Vec<_>, _>>()?,
                    )),
                    _ => Arc::new(BinaryArray::from_iter_values(records.iter())),
                };
                batches.push(
                    RecordBatch::try_new(self.schema.clone(), vec![column])
                        .map_err(|e| e.to_string())?,
                );
            }
        }
        let batch = concat_batches(&self.schema, &batches).map_err(|e| e.to_string())?;
        if batch.num_rows() != records.len() {
            return Err(format!(
                "{} records decoded into {} rows",
                records.len(),
                batch.num_rows()
            ));
        }
        Ok(batch)
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::{Field, Int64Type, Schema};

    use super::*;

    fn decoder(format: &str) -> Decoder {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("name", DataType::Utf8, true),
        ]));
        let mut o = Options::try_new("t", []).unwrap();
        Decoder::try_new(format, &mut o, schema).unwrap()
    }

    #[test]
    fn json_keeps_the_good_records_and_names_the_bad() {
        let d = decoder("json");
        let recs: Vec<&[u8]> = vec![
            br#"{"id": 1, "name": "a"}"#,
            br#"{"id": "x"}"#,
            b"{}",
            br#"{"id": 3} {"id": 4}"#,
            br#"{"id": 5, "extra": true}"#,
        ];
        let out = d.decode(&recs).unwrap();
        assert_eq!(out.rows, vec![0, 2, 4]);
        assert_eq!(
            out.batch
                .column(0)
                .as_primitive::<Int64Type>()
                .iter()
                .collect::<Vec<_>>(),
            vec![Some(1), None, Some(5)]
        );
        let bad: Vec<usize> = out.errors.iter().map(|(i, _)| *i).collect();
        assert_eq!(bad, vec![1, 3]);
    }

    #[test]
    fn csv_and_raw() {
        let out = decoder("csv").decode(&[b"1,a", b"oops,b", b"3,"]).unwrap();
        assert_eq!(out.rows, vec![0, 2]);
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Utf8, true)]));
        let mut o = Options::try_new("t", []).unwrap();
        let raw = Decoder::try_new("raw", &mut o, schema).unwrap();
        let out = raw.decode(&[b"hello", &[0xff, 0xfe]]).unwrap();
        assert_eq!(out.rows, vec![0]);
        assert_eq!(out.batch.column(0).as_string::<i32>().value(0), "hello");
    }
}
