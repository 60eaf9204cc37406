//! Results as PostgreSQL rows: each Arrow type as the PostgreSQL type a client expects of it,
//! each value in the text or binary format the client asked for.
//!
//! ```text
//! Boolean -> bool        Int8/16, UInt8 -> int2   Int32, UInt16 -> int4   Int64, UInt32 -> int8
//! Float16/32 -> float4   Float64 -> float8        Decimal128 (<= 28 digits) -> numeric
//! Utf8* -> text          Binary* -> bytea         Date32/64 -> date       Time32/64 -> time
//! Timestamp -> timestamp, or timestamptz with a time zone
//! anything else (UInt64, lists, structs, maps, intervals, ...) -> text, as floe prints it
//! ```

use std::sync::Arc;

use chrono::{DateTime, NaiveDate, NaiveDateTime, NaiveTime, Timelike, Utc};
use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{
    DataType, Date32Type, Date64Type, Decimal128Type, Float16Type, Float32Type, Float64Type,
    Int8Type, Int16Type, Int32Type, Int64Type, Schema, Time32MillisecondType, Time32SecondType,
    Time64MicrosecondType, Time64NanosecondType, TimeUnit, TimestampMicrosecondType,
    TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType, UInt8Type, UInt16Type,
    UInt32Type,
};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use pgwire::api::Type;
use pgwire::api::portal::Format;
use pgwire::api::results::{DataRowEncoder, FieldFormat, FieldInfo};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::data::DataRow;
use rust_decimal::Decimal;

/// The largest precision PostgreSQL's numeric values take here (rust_decimal's).
const MAX_NUMERIC_DIGITS: u8 = 28;

/// The PostgreSQL type a column of `dt` is sent as.
pub fn pg_type(dt: &DataType) -> Type {
    match dt {
        DataType::Boolean => Type::BOOL,
        DataType::Int8 | DataType::Int16 | DataType::UInt8 => Type::INT2,
        DataType::Int32 | DataType::UInt16 => Type::INT4,
        DataType::Int64 | DataType::UInt32 => Type::INT8,
        DataType::Float16 | DataType::Float32 => Type::FLOAT4,
        DataType::Float64 => Type::FLOAT8,
        DataType::Decimal128(p, _) if *p <= MAX_NUMERIC_DIGITS => Type::NUMERIC,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Type::TEXT,
        DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_) => Type::BYTEA,
        DataType::Date32 | DataType::Date64 => Type::DATE,
        DataType::Time32(_) | DataType::Time64(_) => Type::TIME,
        DataType::Timestamp(_, None) => Type::TIMESTAMP,
        DataType::Timestamp(_, Some(_)) => Type::TIMESTAMPTZ,
        _ => Type::TEXT,
    }
}

/// The row description of `schema`, each column in the format `format` asks for.
pub fn fields(schema: &Schema, format: &Format) -> Vec<FieldInfo> {
    schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            FieldInfo::new(
                f.name().clone(),
                None,
                None,
                pg_type(f.data_type()),
                format.format_for(i),
            )
        })
        .collect()
}

fn failed(e: impl std::fmt::Display) -> PgWireError {
    PgWireError::ApiError(Box::new(std::io::Error::other(e.to_string())))
}

/// The rows of `batches`, encoded for `fields` (their [`fields`]).
pub fn rows(fields: &Arc<Vec<FieldInfo>>, batches: &[RecordBatch]) -> PgWireResult<Vec<DataRow>> {
    let options = FormatOptions::default().with_null("");
    let mut encoder = DataRowEncoder::new(fields.clone());
    let mut out = Vec::new();
    for batch in batches {
        let formatters = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options).map_err(failed))
            .collect::<PgWireResult<Vec<_>>>()?;
        for row in 0..batch.num_rows() {
            for ((column, formatter), field) in
                batch.columns().iter().zip(&formatters).zip(fields.iter())
            {
                let text = field.format() == FieldFormat::Text;
                encode(&mut encoder, column, row, formatter, text)?;
            }
            out.push(encoder.take_row());
        }
    }
    Ok(out)
}

/// Encode the value at `row` of `column` as its [`pg_type`]; in the text format (`text`)
/// times and timestamps as PostgreSQL prints them.
fn encode(
    encoder: &mut DataRowEncoder,
    column: &ArrayRef,
    row: usize,
    formatter: &ArrayFormatter,
    text: bool,
) -> PgWireResult<()> {
    if column.is_null(row) {
        return encoder.encode_field(&None::<&str>);
    }
    let c = column.as_ref();
    match c.data_type() {
        DataType::Boolean => encoder.encode_field(&c.as_boolean().value(row)),
        DataType::Int8 => encoder.encode_field(&(c.as_primitive::<Int8Type>().value(row) as i16)),
        DataType::Int16 => encoder.encode_field(&c.as_primitive::<Int16Type>().value(row)),
        DataType::UInt8 => encoder.encode_field(&(c.as_primitive::<UInt8Type>().value(row) as i16)),
        DataType::Int32 => encoder.encode_field(&c.as_primitive::<Int32Type>().value(row)),
        DataType::UInt16 => {
            encoder.encode_field(&(c.as_primitive::<UInt16Type>().value(row) as i32))
        }
        DataType::Int64 => encoder.encode_field(&c.as_primitive::<Int64Type>().value(row)),
        DataType::UInt32 => {
            encoder.encode_field(&(c.as_primitive::<UInt32Type>().value(row) as i64))
        }
        DataType::Float16 => {
            encoder.encode_field(&c.as_primitive::<Float16Type>().value(row).to_f32())
        }
        DataType::Float32 => encoder.encode_field(&c.as_primitive::<Float32Type>().value(row)),
        DataType::Float64 => encoder.encode_field(&c.as_primitive::<Float64Type>().value(row)),
        DataType::Decimal128(p, s) if *p <= MAX_NUMERIC_DIGITS => {
            let v = c.as_primitive::<Decimal128Type>().value(row);
            let d = Decimal::try_from_i128_with_scale(v, *s as u32).map_err(failed)?;
            encoder.encode_field(&d)
        }
        DataType::Utf8 => encoder.encode_field(&c.as_string::<i32>().value(row)),
        DataType::LargeUtf8 => encoder.encode_field(&c.as_string::<i64>().value(row)),
        DataType::Utf8View => encoder.encode_field(&c.as_string_view().value(row)),
        DataType::Binary => encoder.encode_field(&c.as_binary::<i32>().value(row)),
        DataType::LargeBinary => encoder.encode_field(&c.as_binary::<i64>().value(row)),
        DataType::BinaryView => encoder.encode_field(&c.as_binary_view().value(row)),
        DataType::FixedSizeBinary(_) => encoder.encode_field(&c.as_fixed_size_binary().value(row)),
        DataType::Date32 => encoder.encode_field(&date(
            c.as_primitive::<Date32Type>().value_as_date(row),
            formatter,
            row,
        )?),
        DataType::Date64 => encoder.encode_field(&date(
            c.as_primitive::<Date64Type>().value_as_date(row),
            formatter,
            row,
        )?),
        DataType::Time32(_) | DataType::Time64(_) => {
            let t = time(c, row).ok_or_else(|| out_of_range(formatter, row))?;
            if text {
                return encoder.encode_field(&postgres_text(
                    &t.format("%H:%M:%S"),
                    t.nanosecond(),
                    "",
                ));
            }
            encoder.encode_field(&t)
        }
        DataType::Timestamp(unit, tz) => {
            let at = timestamp(c, unit, row).ok_or_else(|| out_of_range(formatter, row))?;
            if text {
                let zone = if tz.is_some() { "+00" } else { "" };
                let shown = at.format("%Y-%m-%d %H:%M:%S");
                return encoder.encode_field(&postgres_text(&shown, at.nanosecond(), zone));
            }
            match tz {
                None => encoder.encode_field(&at),
                Some(_) => {
                    encoder.encode_field(&DateTime::<Utc>::from_naive_utc_and_offset(at, Utc))
                }
            }
        }
        _ => encoder.encode_field(&formatter.value(row).to_string()),
    }
}

/// A time as PostgreSQL prints it: its fraction of a second in microseconds without
/// trailing zeros, none when whole (`09:15:00`, `09:15:00.5`), then its zone (timestamps
/// with a time zone are sent in UTC: `+00`).
fn postgres_text(whole: &impl std::fmt::Display, nanos: u32, zone: &str) -> String {
    let micros = nanos / 1_000;
    if micros == 0 {
        return format!("{whole}{zone}");
    }
    let fraction = format!("{micros:06}");
    format!("{whole}.{}{zone}", fraction.trim_end_matches('0'))
}

fn out_of_range(formatter: &ArrayFormatter, row: usize) -> PgWireError {
    failed(format!(
        "the value {} is out of the range PostgreSQL clients read",
        formatter.value(row)
    ))
}

fn date(d: Option<NaiveDate>, formatter: &ArrayFormatter, row: usize) -> PgWireResult<NaiveDate> {
    d.ok_or_else(|| out_of_range(formatter, row))
}

fn time(c: &dyn Array, row: usize) -> Option<NaiveTime> {
    match c.data_type() {
        DataType::Time32(TimeUnit::Second) => {
            c.as_primitive::<Time32SecondType>().value_as_time(row)
        }
        DataType::Time32(_) => c.as_primitive::<Time32MillisecondType>().value_as_time(row),
        DataType::Time64(TimeUnit::Microsecond) => {
            c.as_primitive::<Time64MicrosecondType>().value_as_time(row)
        }
        DataType::Time64(_) => c.as_primitive::<Time64NanosecondType>().value_as_time(row),
        _ => None,
    }
}

fn timestamp(c: &dyn Array, unit: &TimeUnit, row: usize) -> Option<NaiveDateTime> {
    match unit {
        TimeUnit::Second => c
            .as_primitive::<TimestampSecondType>()
            .value_as_datetime(row),
        TimeUnit::Millisecond => c
            .as_primitive::<TimestampMillisecondType>()
            .value_as_datetime(row),
        TimeUnit::Microsecond => c
            .as_primitive::<TimestampMicrosecondType>()
            .value_as_datetime(row),
        TimeUnit::Nanosecond => c
            .as_primitive::<TimestampNanosecondType>()
            .value_as_datetime(row),
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{BooleanArray, Decimal128Array, Int64Array, StringArray};
    use datafusion::arrow::datatypes::Field;

    use super::*;

    fn text_of(batch: &RecordBatch) -> Vec<u8> {
        let fields = Arc::new(fields(&batch.schema(), &Format::UnifiedText));
        let rows = rows(&fields, std::slice::from_ref(batch)).unwrap();
        let mut out = bytes::BytesMut::new();
        for r in rows {
            out.extend_from_slice(&r.data);
        }
        out.to_vec()
    }

    #[test]
    fn values_are_sent_as_postgresql_writes_them() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("b", DataType::Boolean, true),
            Field::new("n", DataType::Int64, true),
            Field::new("d", DataType::Decimal128(10, 2), true),
            Field::new("s", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(BooleanArray::from(vec![Some(true), None])),
                Arc::new(Int64Array::from(vec![Some(-7), Some(1)])),
                Arc::new(
                    Decimal128Array::from(vec![Some(1999), None])
                        .with_precision_and_scale(10, 2)
                        .unwrap(),
                ),
                Arc::new(StringArray::from(vec![Some("ann"), Some("")])),
            ],
        )
        .unwrap();
        let bytes = text_of(&batch);
        // Each value is its length (i32, -1 for NULL) and its text: PostgreSQL's booleans
        // are `t`/`f`, numerics keep their scale.
        let mut want = Vec::new();
        for v in [
            Some("t"),
            Some("-7"),
            Some("19.99"),
            Some("ann"),
            None,
            Some("1"),
            None,
            Some(""),
        ] {
            match v {
                Some(s) => {
                    want.extend((s.len() as i32).to_be_bytes());
                    want.extend(s.as_bytes());
                }
                None => want.extend((-1i32).to_be_bytes()),
            }
        }
        assert_eq!(bytes, want);
    }

    #[test]
    fn times_are_printed_as_postgresql_prints_them() {
        let whole = chrono::NaiveDate::from_ymd_opt(2024, 5, 1)
            .and_then(|d| d.and_hms_opt(9, 15, 0))
            .expect("a time");
        let shown = whole.format("%Y-%m-%d %H:%M:%S");
        assert_eq!(postgres_text(&shown, 0, ""), "2024-05-01 09:15:00");
        assert_eq!(
            postgres_text(&shown, 500_000_000, "+00"),
            "2024-05-01 09:15:00.5+00"
        );
        assert_eq!(
            postgres_text(&shown, 123_456_789, ""),
            "2024-05-01 09:15:00.123456"
        );
    }

    #[test]
    fn types_map_to_what_clients_expect() {
        assert_eq!(pg_type(&DataType::Int32), Type::INT4);
        assert_eq!(pg_type(&DataType::Utf8View), Type::TEXT);
        assert_eq!(pg_type(&DataType::Decimal128(38, 0)), Type::TEXT);
        assert_eq!(
            pg_type(&DataType::Timestamp(
                TimeUnit::Microsecond,
                Some("UTC".into())
            )),
            Type::TIMESTAMPTZ
        );
    }
}
