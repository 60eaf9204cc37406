//! Translating SQL column lists (`CREATE TABLE`, `CREATE SOURCE`) into Arrow and Iceberg
//! schemas; `PARTITIONED BY` is [`crate::schema::partition`].

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Fields, Schema as ArrowSchema, TimeUnit};
use datafusion::sql::sqlparser::ast::{
    ArrayElemTypeDef, ColumnDef, ColumnOption, DataType as SqlType, ExactNumberInfo, TimezoneInfo,
};
use iceberg::spec::Schema;

use crate::error::{Error, Result};
use crate::schema::iceberg_schema;

/// The Iceberg schema for a `CREATE TABLE` column list.
pub fn schema_from_columns(columns: &[ColumnDef]) -> Result<Schema> {
    iceberg_schema(&arrow_schema_from_columns(columns)?, false)
}

/// The Arrow schema for a column list (`CREATE TABLE`, `CREATE SOURCE`).
pub fn arrow_schema_from_columns(columns: &[ColumnDef]) -> Result<ArrowSchema> {
    let fields = columns
        .iter()
        .map(|c| {
            let mut nullable = true;
            for opt in &c.options {
                match &opt.option {
                    ColumnOption::NotNull => nullable = false,
                    ColumnOption::Null => nullable = true,
                    other => {
                        return Err(Error::Unsupported(format!(
                            "column option '{other}' on '{}': Iceberg columns take only \
                             NOT NULL",
                            c.name
                        )));
                    }
                }
            }
            Ok(Field::new(&c.name.value, sql_type(&c.data_type)?, nullable))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(ArrowSchema::new(fields))
}

/// The Arrow type for a SQL type name.
fn sql_type(t: &SqlType) -> Result<DataType> {
    use SqlType as S;
    Ok(match t {
        S::Boolean | S::Bool => DataType::Boolean,
        S::TinyInt(_) | S::SmallInt(_) | S::Int(_) | S::Integer(_) | S::Int4(_) | S::Int2(_) => {
            DataType::Int32
        }
        S::BigInt(_) | S::Int8(_) | S::Int64 => DataType::Int64,
        S::Float(_) | S::Real | S::Float4 | S::Float32 => DataType::Float32,
        S::Double(_) | S::DoublePrecision | S::Float8 | S::Float64 => DataType::Float64,
        S::Decimal(info) | S::Numeric(info) | S::Dec(info) => {
            let (p, s) = match info {
                ExactNumberInfo::None => (38, 10),
                ExactNumberInfo::Precision(p) => (*p, 0),
                ExactNumberInfo::PrecisionAndScale(p, s) => (*p, *s),
            };
            if p == 0 || p > 38 || s as u64 > p {
                return Err(Error::Plan(format!(
                    "DECIMAL({p}, {s}) is out of range: precision 1..38, scale <= precision"
                )));
            }
            DataType::Decimal128(p as u8, s as i8)
        }
        S::String(_)
        | S::Varchar(_)
        | S::Text
        | S::Char(_)
        | S::Character(_)
        | S::CharVarying(_)
        | S::CharacterVarying(_)
        | S::Nvarchar(_) => DataType::Utf8,
        S::Bytea | S::Binary(_) | S::Varbinary(_) | S::Blob(_) | S::Bytes(_) => DataType::Binary,
        S::Uuid => DataType::FixedSizeBinary(16),
        S::Date => DataType::Date32,
        S::Time(_, _) => DataType::Time64(TimeUnit::Microsecond),
        S::Timestamp(_, tz) => match tz {
            TimezoneInfo::None | TimezoneInfo::WithoutTimeZone => {
                DataType::Timestamp(TimeUnit::Microsecond, None)
            }
            TimezoneInfo::WithTimeZone | TimezoneInfo::Tz => {
                DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into()))
            }
        },
        S::Datetime(_) => DataType::Timestamp(TimeUnit::Microsecond, None),
        S::Array(elem) => match elem {
            ArrayElemTypeDef::AngleBracket(t)
            | ArrayElemTypeDef::SquareBracket(t, _)
            | ArrayElemTypeDef::Parenthesis(t) => {
                DataType::List(Arc::new(Field::new("element", sql_type(t)?, true)))
            }
            ArrayElemTypeDef::None => {
                return Err(Error::Plan(
                    "ARRAY needs an element type, e.g. ARRAY<BIGINT>".to_string(),
                ));
            }
        },
        S::Struct(fields, _) => DataType::Struct(
            fields
                .iter()
                .map(|f| {
                    let name = f
                        .field_name
                        .as_ref()
                        .map(|n| n.value.clone())
                        .ok_or_else(|| {
                            Error::Plan("every STRUCT field needs a name".to_string())
                        })?;
                    Ok(Field::new(name, sql_type(&f.field_type)?, true))
                })
                .collect::<Result<Fields>>()?,
        ),
        S::Map(k, v) => DataType::Map(
            Arc::new(Field::new(
                "key_value",
                DataType::Struct(Fields::from(vec![
                    Field::new("key", sql_type(k)?, false),
                    Field::new("value", sql_type(v)?, true),
                ])),
                false,
            )),
            false,
        ),
        other => {
            return Err(Error::Unsupported(format!(
                "column type {other}; Iceberg tables take BOOLEAN, INT, BIGINT, FLOAT, DOUBLE, \
                 DECIMAL(p, s), STRING, BINARY, DATE, TIME, TIMESTAMP, TIMESTAMPTZ, UUID, \
                 ARRAY<t>, STRUCT<...>, MAP(k, v)"
            )));
        }
    })
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::schema::partition::partition_spec;
    use crate::schema::type_name;
    use crate::sql::{Statement, parse_sql};
    use iceberg::spec::UnboundPartitionSpec;

    fn create(sql: &str) -> (Schema, Result<UnboundPartitionSpec>) {
        let Statement::CreateTable(ct) = parse_sql(sql).unwrap().remove(0) else {
            panic!()
        };
        let schema = schema_from_columns(&ct.columns).unwrap();
        let spec = partition_spec(&ct.partitioned_by, &schema);
        (schema, spec)
    }

    #[test]
    fn columns_map_to_iceberg_types() {
        let (schema, _) = create(
            "CREATE TABLE t (a INT NOT NULL, b BIGINT, c STRING, d TIMESTAMP, e DECIMAL(10, 2), \
             f ARRAY<STRING>, g DATE, h TIMESTAMP WITH TIME ZONE, \
             i STRUCT<x INT, y MAP(STRING, BIGINT)>)",
        );
        let types: Vec<String> = schema
            .as_struct()
            .fields()
            .iter()
            .map(|f| format!("{}:{}:{}", f.name, type_name(&f.field_type), f.required))
            .collect();
        assert_eq!(
            types,
            vec![
                "a:int:true",
                "b:long:false",
                "c:string:false",
                "d:timestamp:false",
                "e:decimal(10, 2):false",
                "f:list<string>:false",
                "g:date:false",
                "h:timestamptz:false",
                "i:struct<x: int, y: map<string, long>>:false",
            ]
        );
    }

    #[test]
    fn partition_transforms() {
        let (_, spec) = create(
            "CREATE TABLE t (id BIGINT, ts TIMESTAMP, s STRING) \
             PARTITIONED BY (days(ts), bucket(16, id), truncate(4, s), s)",
        );
        let spec = spec.unwrap();
        let names: Vec<String> = spec
            .fields()
            .iter()
            .map(|f| format!("{}={}", f.name, f.transform))
            .collect();
        assert_eq!(
            names,
            vec![
                "ts_day=day",
                "id_bucket=bucket[16]",
                "s_trunc=truncate[4]",
                "s=identity"
            ]
        );
    }

    #[test]
    fn bad_partitions_are_explained() {
        let (_, spec) = create("CREATE TABLE t (id BIGINT) PARTITIONED BY (days(nope))");
        assert!(spec.unwrap_err().to_string().contains("'nope'"));
        let (_, spec) = create("CREATE TABLE t (id BIGINT) PARTITIONED BY (weeks(id))");
        assert!(
            spec.unwrap_err()
                .to_string()
                .contains("not a partition field")
        );
    }
}
