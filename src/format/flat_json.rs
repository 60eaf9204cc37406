//! JSON records of flat columns, decoded straight into Arrow: one pass over each record that
//! checks it and takes its values.
//!
//! Inferring a record's columns takes a walk over it for its shape ([`shape_key`]); decoding it
//! into the shape's schema with arrow-json takes two more (arrow-json's tape, then its columns).
//! Records of a stream mostly have the shape of the record before them, and most shapes are
//! flat: every field a number, a string or a boolean. A [`FlatDecoder`] holds one such shape's
//! columns and takes a record only when it has exactly that shape: the same fields in the same
//! order, each value of its field's kind by the rules of [`shape_key`] (no NULL, no other
//! field). What it takes, it decodes as arrow-json decodes it into the shape's schema; what it
//! does not, it leaves untouched for the walk and arrow-json. So a record decodes to the same
//! row, in the same schema, whichever path takes it.
//!
//! Declared columns decode the same way ([`Kinds::Declared`]), taking the records whose
//! fields come in the columns' order with values arrow-json would take as they are.
//!
//! [`shape_key`]: crate::schema::shape_key

use std::sync::Arc;

use datafusion::arrow::array::timezone::Tz;
use datafusion::arrow::array::{
    ArrayRef, BooleanArray, BooleanBufferBuilder, Float64Array, Int32Array, Int64Array,
    RecordBatch, StringArray, TimestampMicrosecondArray,
};
use datafusion::arrow::buffer::{Buffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use datafusion::arrow::compute::kernels::cast_utils::string_to_datetime;
use datafusion::arrow::datatypes::{DataType, SchemaRef, TimeUnit};

use super::Group;
use crate::schema::infer::timestamp_kind;
use crate::schema::shape_key::{number, plain_bytes};

/// The columns of records of one flat shape, as they are decoded.
pub(super) struct FlatDecoder {
    schema: SchemaRef,
    /// Each field's name, as it stands between quotes in a record.
    names: Vec<Box<[u8]>>,
    columns: Vec<Column>,
    /// Each column's validity, once it has a NULL (declared columns only), and whether it
    /// may have one.
    nulls: Vec<Option<BooleanBufferBuilder>>,
    nullable: Vec<bool>,
    /// Whose rules a value follows.
    kinds: Kinds,
    /// The input index of each row.
    rows: Vec<usize>,
}

enum Column {
    Long(Vec<i64>),
    /// Declared `INT`.
    Int(Vec<i32>),
    Double(Vec<f64>),
    /// Offsets (from a first 0) and bytes of the values.
    Text(Vec<i32>, Vec<u8>),
    Boolean(BooleanBufferBuilder),
    /// Microseconds; the time zone the schema names, read as arrow-json reads it (UTC where
    /// it names none).
    Timestamp(Vec<i64>, Option<(Arc<str>, Tz)>),
}

/// Whose rules say which values a column takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kinds {
    /// The shape walk's, for a shape's columns (`'json.timestamp-inference'`: strings that
    /// read as timestamps are timestamps, not strings).
    Inferred { timestamps: bool },
    /// Declared columns': any value arrow-json decodes exactly, of the JSON type it takes
    /// without a conversion of its own (a number for a number column, a string for a
    /// string or timestamp column), or NULL; fields in the columns' order, any of them
    /// missing (NULL), and fields the columns lack only with NULL values.
    Declared,
}

/// Not the shape's record, or not one decoded here: nothing taken.
struct Refused;

type Taken<T = ()> = Result<T, Refused>;

impl FlatDecoder {
    /// A decoder of records of `schema`'s columns in their order (a shape's, as the shape
    /// cache made it, or declared), when every field is flat and named without escapes;
    /// `rows` is how many records it may take.
    pub(super) fn new(schema: &SchemaRef, kinds: Kinds, rows: usize) -> Option<Self> {
        if schema.fields().is_empty() {
            return None;
        }
        let mut names = Vec::with_capacity(schema.fields().len());
        let mut columns = Vec::with_capacity(schema.fields().len());
        for field in schema.fields() {
            let name = field.name().as_bytes();
            // A name written with escapes in a record is not compared byte for byte.
            if name.iter().any(|&c| c == b'"' || c == b'\\' || c < 0x20) {
                return None;
            }
            names.push(name.into());
            columns.push(match field.data_type() {
                DataType::Int64 => Column::Long(Vec::with_capacity(rows)),
                DataType::Int32 if kinds == Kinds::Declared => {
                    Column::Int(Vec::with_capacity(rows))
                }
                DataType::Float64 => Column::Double(Vec::with_capacity(rows)),
                DataType::Utf8 => {
                    let mut offsets = Vec::with_capacity(rows + 1);
                    offsets.push(0);
                    Column::Text(offsets, Vec::new())
                }
                DataType::Boolean => Column::Boolean(BooleanBufferBuilder::new(rows)),
                DataType::Timestamp(TimeUnit::Microsecond, tz) => {
                    let tz = match tz {
                        Some(name) => Some((name.clone(), name.parse::<Tz>().ok()?)),
                        None => None,
                    };
                    Column::Timestamp(Vec::with_capacity(rows), tz)
                }
                _ => return None,
            });
        }
        Some(Self {
            schema: schema.clone(),
            names,
            nulls: columns.iter().map(|_| None).collect(),
            nullable: schema.fields().iter().map(|f| f.is_nullable()).collect(),
            columns,
            kinds,
            rows: Vec::with_capacity(rows),
        })
    }

    /// Take `record` (input index `index`) when it has this decoder's shape exactly; `false`
    /// (nothing taken) otherwise.
    pub(super) fn push(&mut self, record: &[u8], index: usize) -> bool {
        let mut r = Reader { b: record, i: 0 };
        if self.fill(&mut r).is_ok() {
            self.rows.push(index);
            true
        } else {
            let n = self.rows.len();
            for column in &mut self.columns {
                column.truncate(n);
            }
            for nulls in self.nulls.iter_mut().flatten() {
                nulls.truncate(n);
            }
            false
        }
    }

    fn fill(&mut self, r: &mut Reader) -> Taken {
        let declared = self.kinds == Kinds::Declared;
        r.ws();
        r.expect(b'{')?;
        r.ws();
        // The next field of the shape.
        let mut k = 0;
        if r.b.get(r.i) == Some(&b'}') {
            r.i += 1;
        } else {
            loop {
                r.expect(b'"')?;
                let rest = &r.b[r.i..];
                let at = match self.names.get(k) {
                    Some(name) if rest.starts_with(name) && rest.get(name.len()) == Some(&b'"') => {
                        r.i += name.len() + 1;
                        Some(k)
                    }
                    _ => {
                        let name = &rest[..plain_bytes(rest, false)];
                        r.i += name.len();
                        r.expect(b'"')?;
                        std::str::from_utf8(name).map_err(|_| Refused)?;
                        let at = self.names.iter().position(|n| **n == *name);
                        match at {
                            // Declared columns may be missing: the ones passed over are NULL.
                            Some(j) if declared && j > k => Some(j),
                            // A field repeated, or out of the shape's order.
                            Some(_) => return Err(Refused),
                            None => None,
                        }
                    }
                };
                r.ws();
                r.expect(b':')?;
                r.ws();
                match at {
                    Some(j) => {
                        for missing in k..j {
                            self.null(missing)?;
                        }
                        if declared && r.literal(b"null") {
                            self.null(j)?;
                        } else {
                            self.columns[j].take(r, self.kinds)?;
                            if let Some(nulls) = &mut self.nulls[j] {
                                nulls.append(true);
                            }
                        }
                        k = j + 1;
                    }
                    // A field the shape lacks has no value (the walk leaves NULLs out,
                    // arrow-json passes over fields its schema lacks).
                    None => {
                        if !r.literal(b"null") {
                            return Err(Refused);
                        }
                    }
                }
                r.ws();
                match r.b.get(r.i) {
                    Some(b',') => {
                        r.i += 1;
                        r.ws();
                    }
                    Some(b'}') => {
                        r.i += 1;
                        break;
                    }
                    _ => return Err(Refused),
                }
            }
        }
        if declared {
            for missing in k..self.names.len() {
                self.null(missing)?;
            }
            k = self.names.len();
        }
        r.ws();
        match k == self.names.len() && r.i == r.b.len() {
            true => Ok(()),
            false => Err(Refused),
        }
    }

    /// A NULL in column `k` (declared columns, where the column may hold one).
    fn null(&mut self, k: usize) -> Taken {
        if self.kinds != Kinds::Declared || !self.nullable[k] {
            return Err(Refused);
        }
        let rows = self.rows.len();
        self.nulls[k]
            .get_or_insert_with(|| {
                let mut valid = BooleanBufferBuilder::new(rows + 1);
                valid.append_n(rows, true);
                valid
            })
            .append(false);
        self.columns[k].placeholder();
        Ok(())
    }

    /// The records taken, as one batch of the schema, with their input indices.
    pub(super) fn finish(self) -> Result<Group, String> {
        let columns = self
            .columns
            .into_iter()
            .zip(self.nulls)
            .map(|(column, nulls)| column.finish(nulls.map(|mut n| NullBuffer::new(n.finish()))))
            .collect::<Result<Vec<_>, _>>()?;
        let batch = RecordBatch::try_new(self.schema, columns).map_err(|e| e.to_string())?;
        Ok(Group {
            batch,
            rows: self.rows,
        })
    }
}

impl Column {
    /// Take a value of this column's kind from `r`.
    fn take(&mut self, r: &mut Reader, kinds: Kinds) -> Taken {
        let (inferred, timestamps) = match kinds {
            Kinds::Inferred { timestamps } => (true, timestamps),
            Kinds::Declared => (false, false),
        };
        match self {
            Column::Long(values) => {
                let (value, fraction) = r.number()?;
                if fraction {
                    return Err(Refused);
                }
                values.push(value.parse().map_err(|_| Refused)?);
            }
            Column::Int(values) => {
                let (value, fraction) = r.number()?;
                if fraction {
                    return Err(Refused);
                }
                values.push(value.parse().map_err(|_| Refused)?);
            }
            Column::Double(values) => {
                // (An integer is a double's value when declared, another shape inferred.)
                let (value, fraction) = r.number()?;
                if inferred && !fraction {
                    return Err(Refused);
                }
                values.push(value.parse().map_err(|_| Refused)?);
            }
            Column::Text(offsets, values) => {
                let escaped = r.string(values)?;
                if timestamps {
                    // The walk reads an escaped string's shape no further; a string that
                    // reads as a timestamp is a timestamp field.
                    let start = *offsets.last().expect("offsets start with 0") as usize;
                    let text = std::str::from_utf8(&values[start..]).map_err(|_| Refused)?;
                    if escaped || timestamp_kind(text).is_some() {
                        return Err(Refused);
                    }
                }
                offsets.push(i32::try_from(values.len()).map_err(|_| Refused)?);
            }
            Column::Boolean(values) => {
                if r.literal(b"true") {
                    values.append(true);
                } else if r.literal(b"false") {
                    values.append(false);
                } else {
                    return Err(Refused);
                }
            }
            Column::Timestamp(values, tz) => {
                let mut text = Vec::new();
                let escaped = r.string(&mut text)?;
                let text = std::str::from_utf8(&text).map_err(|_| Refused)?;
                if inferred && (escaped || timestamp_kind(text) != Some(tz.is_some())) {
                    return Err(Refused);
                }
                // As arrow-json reads a timestamp column's strings.
                let micros = match tz {
                    Some((_, tz)) => string_to_datetime(tz, text).map(|t| t.timestamp_micros()),
                    None => string_to_datetime(&chrono::Utc, text).map(|t| t.timestamp_micros()),
                };
                values.push(micros.map_err(|_| Refused)?);
            }
        }
        Ok(())
    }

    /// A value standing for a NULL.
    fn placeholder(&mut self) {
        match self {
            Column::Long(values) | Column::Timestamp(values, _) => values.push(0),
            Column::Int(values) => values.push(0),
            Column::Double(values) => values.push(0.0),
            Column::Text(offsets, values) => offsets.push(values.len() as i32),
            Column::Boolean(values) => values.append(false),
        }
    }

    /// Back to the first `rows` values.
    fn truncate(&mut self, rows: usize) {
        match self {
            Column::Long(values) => values.truncate(rows),
            Column::Int(values) => values.truncate(rows),
            Column::Double(values) => values.truncate(rows),
            Column::Text(offsets, values) => {
                offsets.truncate(rows + 1);
                values.truncate(offsets[rows] as usize);
            }
            Column::Boolean(values) => values.truncate(rows),
            Column::Timestamp(values, _) => values.truncate(rows),
        }
    }

    fn finish(self, nulls: Option<NullBuffer>) -> Result<ArrayRef, String> {
        Ok(match self {
            Column::Long(values) => Arc::new(Int64Array::new(values.into(), nulls)),
            Column::Int(values) => Arc::new(Int32Array::new(values.into(), nulls)),
            Column::Double(values) => Arc::new(Float64Array::new(values.into(), nulls)),
            Column::Text(offsets, values) => {
                let offsets = OffsetBuffer::new(ScalarBuffer::from(offsets));
                Arc::new(
                    StringArray::try_new(offsets, Buffer::from_vec(values), nulls)
                        .map_err(|e| e.to_string())?,
                )
            }
            Column::Boolean(mut values) => Arc::new(BooleanArray::new(values.finish(), nulls)),
            Column::Timestamp(values, tz) => Arc::new(
                TimestampMicrosecondArray::new(values.into(), nulls)
                    .with_timezone_opt(tz.map(|(name, _)| name)),
            ),
        })
    }
}

/// A record's bytes, read from `i`.
struct Reader<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Reader<'a> {
    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    fn expect(&mut self, c: u8) -> Taken {
        if self.b.get(self.i) == Some(&c) {
            self.i += 1;
            Ok(())
        } else {
            Err(Refused)
        }
    }

    fn literal(&mut self, word: &[u8]) -> bool {
        let found = self.b[self.i..].starts_with(word);
        if found {
            self.i += word.len();
        }
        found
    }

    /// A number, as the shape walk reads one (see [`number`]): its text, and whether it has
    /// a fraction (`1.5`) or not (`15`, fitting a long).
    fn number(&mut self) -> Taken<(&'a str, bool)> {
        let start = self.i;
        let (end, fraction) = number(self.b, start).ok_or(Refused)?;
        self.i = end;
        // ASCII digits, a sign and a point.
        let text = std::str::from_utf8(&self.b[start..end]).map_err(|_| Refused)?;
        Ok((text, fraction))
    }

    /// A string from its opening quote, unescaped onto `out`; whether it held escapes. Its
    /// bytes are checked as UTF-8 (the record's other bytes are ASCII or refused).
    fn string(&mut self, out: &mut Vec<u8>) -> Taken<bool> {
        self.expect(b'"')?;
        let mut escaped = false;
        loop {
            let plain = plain_bytes(&self.b[self.i..], true);
            out.extend_from_slice(&self.b[self.i..self.i + plain]);
            self.i += plain;
            match *self.b.get(self.i).ok_or(Refused)? {
                b'"' => {
                    self.i += 1;
                    return Ok(escaped);
                }
                b'\\' => {
                    escaped = true;
                    let unescaped = match *self.b.get(self.i + 1).ok_or(Refused)? {
                        c @ (b'"' | b'\\' | b'/') => c,
                        b'b' => 0x08,
                        b'f' => 0x0c,
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'u' => {
                            let hex = self.b.get(self.i + 2..self.i + 6).ok_or(Refused)?;
                            let hex = std::str::from_utf8(hex).map_err(|_| Refused)?;
                            let unit = u16::from_str_radix(hex, 16).map_err(|_| Refused)?;
                            // Surrogate pairs are the walk's to check.
                            let c = char::from_u32(unit.into()).ok_or(Refused)?;
                            out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                            self.i += 6;
                            continue;
                        }
                        _ => return Err(Refused),
                    };
                    out.push(unescaped);
                    self.i += 2;
                }
                c if c < 0x20 => return Err(Refused),
                c => {
                    // A character of more than one byte: checked whole.
                    let width = match c {
                        0xC2..=0xDF => 2,
                        0xE0..=0xEF => 3,
                        0xF0..=0xF4 => 4,
                        _ => return Err(Refused),
                    };
                    let bytes = self.b.get(self.i..self.i + width).ok_or(Refused)?;
                    std::str::from_utf8(bytes).map_err(|_| Refused)?;
                    out.extend_from_slice(bytes);
                    self.i += width;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::schema::infer::{ShapeCache, record_shape};
    use crate::schema::shape_key;

    /// The schema the shape cache gives `record`'s shape, if it has one.
    fn schema_of(cache: &mut ShapeCache, record: &str, timestamps: bool) -> Option<SchemaRef> {
        let fields = record_shape(record.as_bytes(), timestamps).ok()?;
        let mut key = Vec::new();
        shape_key::write(&fields, &mut key);
        Some(cache.schema(&key, &fields))
    }

    /// `record` into `schema` by arrow-json, as the walk's path decodes it.
    fn by_arrow_json(schema: &SchemaRef, record: &str) -> Option<RecordBatch> {
        let mut decoder = datafusion::arrow::json::ReaderBuilder::new(schema.clone())
            .build_decoder()
            .ok()?;
        decoder.decode(record.as_bytes()).ok()?;
        decoder.flush().ok()?
    }

    /// `decoded` (taken from `record`) is the row arrow-json decodes `record` into.
    fn assert_arrow_json_row(schema: &SchemaRef, record: &str, decoded: &RecordBatch) {
        let expected = by_arrow_json(schema, record)
            .unwrap_or_else(|| panic!("arrow-json does not decode {record:?}, taken"));
        assert_eq!(decoded, &expected, "{record:?}");
        // A NaN-free column equals itself: compare the bits of doubles too.
        for (a, b) in decoded.columns().iter().zip(expected.columns()) {
            assert_eq!(a.to_data(), b.to_data(), "{record:?}");
        }
    }

    /// Checks `record` against every schema of `schemas`: a decoder of a flat schema takes
    /// it only when the record has that shape, and then gives the row arrow-json gives.
    /// Whether the decoder of its own shape took it.
    fn check(schemas: &[SchemaRef], record: &str, timestamps: bool) -> bool {
        let mut cache = ShapeCache::default();
        let own = schema_of(&mut cache, record, timestamps);
        let mut took_own = false;
        for schema in schemas {
            let Some(mut decoder) = FlatDecoder::new(schema, Kinds::Inferred { timestamps }, 1)
            else {
                continue;
            };
            if !decoder.push(record.as_bytes(), 7) {
                assert_eq!(decoder.rows.len(), 0);
                continue;
            }
            let own = own.as_ref().unwrap_or_else(|| {
                panic!("{record:?} was taken, and its shape is not valid ({schema:?})")
            });
            assert_eq!(
                own, schema,
                "{record:?} was taken by another shape's decoder"
            );
            took_own = true;
            let group = decoder.finish().expect("finish");
            assert_eq!(group.rows, vec![7]);
            assert_arrow_json_row(schema, record, &group.batch);
        }
        took_own
    }

    const RECORDS: &[&str] = &[
        r#"{"a": 1, "b": 1.5, "c": "x", "d": true, "e": false}"#,
        r#"  {"a":1,"b":1.5,"c":"x","d":true,"e":false}  "#,
        "{\"a\":\t1 ,\r\n\"b\" : 1.5,\"c\":\"x\",\"d\":true,\"e\":false}\n",
        r#"{"b": 1.5, "a": 1, "c": "x", "d": true, "e": false}"#,
        r#"{"a": 1, "b": 2, "c": "x", "d": true, "e": false}"#,
        r#"{"a": 1, "b": 1.5, "c": null, "d": true, "e": false}"#,
        r#"{"a": 1, "b": 1.5, "c": "x", "d": true}"#,
        r#"{"a": 1, "b": 1.5, "c": "x", "d": true, "e": false, "f": 1}"#,
        r#"{"a": 1, "a": 1.5, "c": "x", "d": true, "e": false}"#,
        r#"{"a": 1, "b": 1.5, "c": "x", "d": true, "e": false}{}"#,
        r#"{"a": 1, "b": 1.5, "c": "x", "d": true, "e": false} x"#,
        r#"{"a": 1, "b": 1.5, "c": "x", "d": true, "e": fals}"#,
        r#"{"a": 1, "b": 1.5, "c": "x", "d": true, "e": false"#,
        r#"{"a": -0, "b": -0.0, "c": "", "d": false, "e": true}"#,
        r#"{"a": 01, "b": 1.5, "c": "x", "d": true, "e": false}"#,
        r#"{"a": 1e3, "b": 1.5e3, "c": "x", "d": true, "e": false}"#,
        r#"{"a": 9223372036854775807, "b": -0.5, "c": "x", "d": true, "e": false}"#,
        r#"{"a": -9223372036854775808, "b": 123456789012345678.5, "c": "x", "d": true, "e": true}"#,
        r#"{"a": 9223372036854775808, "b": 1234567890123456789.5, "c": "x", "d": true, "e": true}"#,
        r#"{"a": 1, "b": 0.1000000000000000055511151231257827, "c": "x", "d": true, "e": true}"#,
        r#"{"a": 1, "b": 1., "c": "x", "d": true, "e": false}"#,
        r#"{"a": 1, "b": .5, "c": "x", "d": true, "e": false}"#,
        r#"{"a": 1, "b": 1.5, "c": "tab\there \"q\" \\ \/ \b\f\n\r \u00e9 \u20AC \u0000", "d": true, "e": false}"#,
        r#"{"a": 1, "b": 1.5, "c": "pair \ud83d\ude00", "d": true, "e": false}"#,
        r#"{"a": 1, "b": 1.5, "c": "lone \ud83d", "d": true, "e": false}"#,
        r#"{"a": 1, "b": 1.5, "c": "bad \x", "d": true, "e": false}"#,
        r#"{"a": 1, "b": 1.5, "c": "bad \u12", "d": true, "e": false}"#,
        "{\"a\": 1, \"b\": 1.5, \"c\": \"raw\tcontrol\", \"d\": true, \"e\": false}",
        r#"{"a": 1, "b": 1.5, "c": "ünïcödé 😀 €", "d": true, "e": false}"#,
        r#"{"ünï": "cödé", "10": 10}"#,
        r#"{"a\"b": 1}"#,
        r#"{"a\u0062": 1}"#,
        r#"{"t": "2024-05-01T10:00:00Z", "n": "2024-05-01 10:00:00.5", "s": "2024-05-01"}"#,
        r#"{"t": "2024-05-01T10:00:00+02:00", "n": "2024-05-01T10:00:00.123456789", "s": "x"}"#,
        r#"{"t": "2024-05-01T10:00:00\u005a", "n": "2024-05-01 10:00:00", "s": "x"}"#,
        r#"{"t": "9999-12-31T23:59:59Z", "n": "0001-01-01 00:00:00", "s": "x"}"#,
        r#"{"o": {"x": 1}, "l": [1, 2]}"#,
        r#"{"o": {}, "l": []}"#,
        r#"{}"#,
        r#"[1, 2]"#,
        r#""#,
        r#"{"a": true, "b": "true", "c": 1, "d": "1"}"#,
        r#"{"x": null, "a": 1, "b": 1.5, "y": null, "c": "x", "d": true, "e": false, "z": null}"#,
        r#"{"a": 1, "b": 1.5, "c": "x", "d": true, "e": false, "a": null}"#,
        r#"{"a": 1, "b": 1.5, "c": "x", "d": true, "e": false, "x": {}}"#,
        r#"{"a": 1, "b": 1.5, "c": "x", "d": true, "e": false, "x": nul}"#,
        r#"{"a": 1, "b": 1.5, "c": "x", "d": true, "e": false, "x\"": null}"#,
        r#"{"a": 1, "b": 1.5, "c": "x", "d": true, "e": false,}"#,
        r#"{"a": 1, "b": 1.5, "c": "x", "d": true, "e": false, "ü": null}"#,
        r#"{"a": tru, "b": "true", "c": 1, "d": "1"}"#,
        r#"{"a": trueish, "b": "true", "c": 1, "d": "1"}"#,
    ];

    #[test]
    fn decodes_what_the_walk_and_arrow_json_decode() {
        for timestamps in [false, true] {
            let mut cache = ShapeCache::default();
            let schemas: Vec<SchemaRef> = RECORDS
                .iter()
                .filter_map(|r| schema_of(&mut cache, r, timestamps))
                .collect();
            let taken: Vec<&str> = RECORDS
                .iter()
                .copied()
                .filter(|r| check(&schemas, r, timestamps))
                .collect();
            // The common records are taken, not left to the walk (an escaped string's shape
            // is the walk's to settle when strings may be timestamps).
            for r in [
                RECORDS[0],
                RECORDS[1],
                RECORDS[2],
                RECORDS[28],
                RECORDS[32],
                RECORDS[42],
            ] {
                assert!(taken.contains(&r), "{r:?} not taken ({timestamps})");
            }
            assert_eq!(taken.contains(&RECORDS[22]), !timestamps);
        }
    }

    #[test]
    fn a_refused_record_leaves_the_columns_as_they_were() {
        let mut cache = ShapeCache::default();
        let schema = schema_of(&mut cache, RECORDS[0], false).unwrap();
        let mut decoder =
            FlatDecoder::new(&schema, Kinds::Inferred { timestamps: false }, 4).unwrap();
        assert!(decoder.push(RECORDS[0].as_bytes(), 0));
        // Refused at its last field, after the others were taken.
        assert!(!decoder.push(RECORDS[11].as_bytes(), 1));
        assert!(decoder.push(RECORDS[1].as_bytes(), 2));
        let group = decoder.finish().unwrap();
        assert_eq!(group.rows, vec![0, 2]);
        let both = format!("{}\n{}", RECORDS[0], RECORDS[1]);
        assert_eq!(Some(group.batch), by_arrow_json(&schema, &both));
    }

    #[test]
    fn a_refused_declared_record_leaves_the_nulls_as_they_were() {
        let schema = declared();
        let good = [
            r#"{"l": 1, "s": "x", "b": true}"#,
            r#"{"l": null, "i": 2, "d": 1, "s": null, "b": false, "t": "2024-05-01"}"#,
        ];
        let mut decoder = FlatDecoder::new(&schema, Kinds::Declared, 4).unwrap();
        assert!(decoder.push(good[0].as_bytes(), 0));
        // NULLs taken, then refused at its last field.
        assert!(!decoder.push(br#"{"l": null, "s": null, "b": true, "z": 5}"#, 1));
        assert!(decoder.push(good[1].as_bytes(), 2));
        let group = decoder.finish().unwrap();
        assert_eq!(group.rows, vec![0, 2]);
        assert_eq!(Some(group.batch), by_arrow_json(&schema, &good.join("\n")));
    }

    /// A JSON value's text, of every kind the walk tells apart and some it does not settle.
    fn value() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<i64>().prop_map(|v| v.to_string()),
            (-1000i64..1000).prop_map(|v| v.to_string()),
            any::<f64>().prop_map(|v| format!("{v:?}")),
            (any::<i32>(), 0u32..100_000).prop_map(|(a, b)| format!("{a}.{b}")),
            Just("-0".to_string()),
            Just("1e5".to_string()),
            Just("00".to_string()),
            Just("true".to_string()),
            Just("false".to_string()),
            Just("null".to_string()),
            Just("{}".to_string()),
            Just("[1]".to_string()),
            "[a-z \\\\\"/é€😀\t]{0,12}".prop_map(|s| serde_json::to_string(&s).unwrap()),
            "\\\\u[0-9a-fA-F]{4}".prop_map(|s| format!("\"{s}\"")),
            (0u32..24, 0u32..60, prop::bool::ANY).prop_map(|(h, m, z)| format!(
                "\"2024-05-01T{h:02}:{m:02}:00{}\"",
                if z { "Z" } else { "" }
            )),
        ]
    }

    /// A value for declared column `column`: mostly of its type, sometimes any.
    fn typed(column: &str) -> BoxedStrategy<String> {
        let good = match column {
            "l" => any::<i64>().prop_map(|v| v.to_string()).boxed(),
            "i" => any::<i32>().prop_map(|v| v.to_string()).boxed(),
            "d" => prop_oneof![
                any::<f64>().prop_map(|v| format!("{v:?}")),
                (any::<i32>(), 0u32..1_000_000).prop_map(|(a, b)| format!("{a}.{b}")),
                any::<i64>().prop_map(|v| v.to_string()),
            ]
            .boxed(),
            "b" => any::<bool>().prop_map(|v| v.to_string()).boxed(),
            "t" | "z" => (
                1i32..9999,
                1u32..13,
                1u32..29,
                prop::sample::select(vec!["T", " "]),
                0u32..24,
                0u32..60,
                prop::sample::select(vec![
                    "",
                    ".5",
                    ".123456",
                    ".123456789",
                    "Z",
                    "+02:00",
                    "-11:30",
                ]),
            )
                .prop_map(|(y, mo, d, sep, h, mi, tail)| {
                    format!("\"{y:04}-{mo:02}-{d:02}{sep}{h:02}:{mi:02}:07{tail}\"")
                })
                .boxed(),
            _ => "[a-z \\\\\"/é€😀\t]{0,12}"
                .prop_map(|s| serde_json::to_string(&s).unwrap())
                .boxed(),
        };
        prop_oneof![4 => good, 1 => value()].boxed()
    }

    /// A record of a few fields named from a small set (so that shapes repeat), and
    /// sometimes broken.
    fn record() -> impl Strategy<Value = String> {
        (
            prop::collection::vec(
                (prop::sample::select(vec!["a", "b", "c", "é"]), value()),
                0..5,
            ),
            prop::sample::select(vec!["", " ", "\n", "x", "}", ","]),
        )
            .prop_map(|(fields, tail)| {
                let body: Vec<String> = fields
                    .iter()
                    .map(|(name, value)| format!("\"{name}\": {value}"))
                    .collect();
                format!("{{{}}}{tail}", body.join(","))
            })
    }

    /// Declared columns of every type a declared decoder takes.
    fn declared() -> SchemaRef {
        use datafusion::arrow::datatypes::{Field, Schema};
        Arc::new(Schema::new(vec![
            Field::new("l", DataType::Int64, true),
            Field::new("i", DataType::Int32, true),
            Field::new("d", DataType::Float64, true),
            Field::new("s", DataType::Utf8, true),
            Field::new("b", DataType::Boolean, false),
            Field::new("t", DataType::Timestamp(TimeUnit::Microsecond, None), true),
            Field::new(
                "z",
                DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
                true,
            ),
        ]))
    }

    /// Whether a declared decoder takes `record`; when it does, its row is arrow-json's.
    fn check_declared(schema: &SchemaRef, record: &str) -> bool {
        let mut decoder = FlatDecoder::new(schema, Kinds::Declared, 1).unwrap();
        if !decoder.push(record.as_bytes(), 3) {
            return false;
        }
        let group = decoder.finish().expect("finish");
        assert_arrow_json_row(schema, record, &group.batch);
        true
    }

    #[test]
    fn declared_columns_decode_as_arrow_json_decodes_them() {
        let schema = declared();
        let row = |l: &str, i: &str, d: &str, s: &str, t: &str| {
            format!(
                r#"{{"l": {l}, "i": {i}, "d": {d}, "s": {s}, "b": true, "t": {t}, "z": "2024-05-01T10:00:00+02:00"}}"#
            )
        };
        let taken = [
            row("1", "2", "3.5", r#""x""#, r#""2024-05-01T10:00:00""#),
            row(
                "-9223372036854775808",
                "-2147483648",
                "3",
                r#""\u00e9\n""#,
                r#""2024-05-01 10:00:00.25""#,
            ),
            row(
                "9223372036854775807",
                "2147483647",
                "-0.0",
                r#""""#,
                r#""2024-05-01T10:00:00Z""#,
            ),
            row(
                "0",
                "0",
                "123456789012345678.25",
                r#""2024-05-01T10:00:00""#,
                r#""2024-05-01""#,
            ),
            format!(
                "{} , \"extra\": null",
                row("1", "2", "3.5", r#""x""#, r#""2024-05-01""#)
            )
            .replacen('}', "", 1)
                + "}",
            row("1", "2", "3.5", "null", r#""2024-05-01""#),
            r#"{"l": 1, "i": 2, "d": 3.5, "s": "x", "b": true, "t": "2024-05-01"}"#.to_string(),
            r#"{"b": false, "extra": null}"#.to_string(),
            r#"{"l": null, "i": null, "d": null, "s": null, "b": true, "t": null, "z": null}"#
                .to_string(),
        ];
        for r in &taken {
            assert!(check_declared(&schema, r), "{r:?} not taken");
        }
        // Left to arrow-json (or refused by it): values it converts, a NULL or no value for a
        // NOT NULL column, extra fields with values, reordered or repeated fields, numbers the
        // walk does not settle.
        let refused = [
            row("1.5", "2", "3.5", r#""x""#, r#""2024-05-01""#),
            row("1", "2147483648", "3.5", r#""x""#, r#""2024-05-01""#),
            row(r#""1""#, "2", "3.5", r#""x""#, r#""2024-05-01""#),
            row("1", "2", "1e3", r#""x""#, r#""2024-05-01""#),
            row("1", "2", "3.5", "1", r#""2024-05-01""#),
            row("1", "2", "3.5", r#""x""#, "1714557600000000"),
            row("1", "2", "3.5", r#""x""#, r#""yesterday""#),
            row("-0", "2", "3.5", r#""x""#, r#""2024-05-01""#),
            r#"{"i": 2, "l": 1, "d": 3.5, "s": "x", "b": true, "t": "2024-05-01", "z": "2024-05-01"}"#.to_string(),
            r#"{"l": 1, "i": 2, "d": 3.5, "s": "x", "t": "2024-05-01"}"#.to_string(),
            r#"{"l": 1, "i": 2, "d": 3.5, "s": "x", "b": null, "t": "2024-05-01"}"#.to_string(),
            r#"{"l": 1, "b": true, "l": 2}"#.to_string(),
            format!("{} , \"extra\": 1", row("1", "2", "3.5", r#""x""#, r#""2024-05-01""#))
                .replacen('}', "", 1)
                + "}",
        ];
        for r in &refused {
            assert!(!check_declared(&schema, r), "{r:?} taken");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        #[test]
        fn generated_records_decode_as_arrow_json_decodes_them(
            records in prop::collection::vec(record(), 1..24),
            timestamps in any::<bool>(),
        ) {
            let mut cache = ShapeCache::default();
            let schemas: Vec<SchemaRef> = records
                .iter()
                .filter_map(|r| schema_of(&mut cache, r, timestamps))
                .collect();
            for r in &records {
                check(&schemas, r, timestamps);
            }
        }

        #[test]
        fn generated_declared_records_decode_as_arrow_json_decodes_them(
            values in (typed("l"), typed("i"), typed("d"), typed("s"), typed("b"), typed("t"), typed("z")),
            shuffled in prop::collection::vec(prop::sample::select(vec!["l", "i", "d", "s", "b", "t", "z", "x"]), 7),
        ) {
            let (l, i, d, s, b, t, z) = values;
            let values = [l, i, d, s, b, t, z];
            // In the columns' order, as most producers write them, and in any order.
            for names in [vec!["l", "i", "d", "s", "b", "t", "z"], shuffled] {
                let body: Vec<String> = names
                    .iter()
                    .zip(&values)
                    .map(|(name, value)| format!("\"{name}\": {value}"))
                    .collect();
                check_declared(&declared(), &format!("{{{}}}", body.join(",")));
            }
        }
    }
}
