//! Translating SQL and Arrow schemas into Iceberg schemas and partition specs.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Fields, Schema as ArrowSchema, TimeUnit};
use datafusion::sql::sqlparser::ast::{
    ArrayElemTypeDef, ColumnDef, ColumnOption, DataType as SqlType, ExactNumberInfo, Expr,
    FunctionArg, FunctionArgExpr, FunctionArguments, TimezoneInfo, Value,
};
use iceberg::arrow::arrow_schema_to_schema_auto_assign_ids;
use iceberg::spec::{
    ListType, NestedFieldRef, PrimitiveType, Schema, StructType, Transform, Type,
    UnboundPartitionSpec,
};

use crate::error::{Error, Result};

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

/// The Iceberg schema for Arrow `schema` (from a query), with types widened to ones
/// Iceberg has. With `all_optional`, every column is optional.
pub fn iceberg_schema(schema: &ArrowSchema, all_optional: bool) -> Result<Schema> {
    let fields = schema
        .fields()
        .iter()
        .map(|f| normalize_field(f, all_optional))
        .collect::<Result<Vec<_>>>()?;
    let converted = arrow_schema_to_schema_auto_assign_ids(&ArrowSchema::new(fields))?;
    let fields = converted
        .as_struct()
        .fields()
        .iter()
        .zip(schema.fields())
        .map(|(f, a)| with_uuid(f, a))
        .collect::<Vec<_>>();
    Ok(Schema::builder()
        .with_schema_id(converted.schema_id())
        .with_fields(fields)
        .build()?)
}

/// Arrow's extension name for a UUID (a 16-byte fixed binary); arrow-avro marks them with
/// the Avro `logicalType` instead.
const UUID_EXTENSION: &str = "arrow.uuid";

/// `field` (converted from `arrow`) with `fixed(16)` as `uuid` wherever `arrow` marks a UUID,
/// nested fields included: iceberg-rust's conversion knows no Arrow extension types.
pub fn with_uuid(field: &NestedFieldRef, arrow: &Field) -> NestedFieldRef {
    let ty = uuid_type(&field.field_type, arrow);
    if ty == *field.field_type {
        return field.clone();
    }
    let mut out = field.as_ref().clone();
    out.field_type = Box::new(ty);
    Arc::new(out)
}

fn uuid_type(ty: &Type, arrow: &Field) -> Type {
    let m = arrow.metadata();
    let is_uuid = m
        .get("ARROW:extension:name")
        .is_some_and(|n| n == UUID_EXTENSION)
        || m.get("logicalType").is_some_and(|t| t == "uuid");
    match (ty, arrow.data_type()) {
        (Type::Primitive(PrimitiveType::Fixed(16)), _) if is_uuid => {
            Type::Primitive(PrimitiveType::Uuid)
        }
        (Type::Struct(s), DataType::Struct(children)) => Type::Struct(StructType::new(
            s.fields()
                .iter()
                .map(|f| match children.iter().find(|c| c.name() == &f.name) {
                    Some(c) => with_uuid(f, c),
                    None => f.clone(),
                })
                .collect(),
        )),
        (Type::List(l), DataType::List(e)) => {
            Type::List(ListType::new(with_uuid(&l.element_field, e)))
        }
        _ => ty.clone(),
    }
}

fn normalize_field(f: &Field, all_optional: bool) -> Result<Field> {
    let out = Field::new(
        f.name(),
        normalize_type(f.data_type(), f.name())?,
        all_optional || f.is_nullable(),
    );
    // A column doc (from an Avro field doc, say) becomes the Iceberg field's doc.
    Ok(match f.metadata().get(FIELD_DOC) {
        Some(doc) => out.with_metadata([(FIELD_DOC.to_string(), doc.clone())].into()),
        None => out,
    })
}

/// The Arrow field metadata key iceberg-rust reads an Iceberg field's doc from.
pub const FIELD_DOC: &str = "doc";

/// The nearest Arrow type that maps to an Iceberg type.
fn normalize_type(dt: &DataType, name: &str) -> Result<DataType> {
    use DataType::*;
    Ok(match dt {
        Int8 | Int16 | UInt8 | UInt16 => Int32,
        UInt32 => Int64,
        Float16 => Float32,
        Utf8View | LargeUtf8 => Utf8,
        BinaryView | LargeBinary => Binary,
        Timestamp(_, None) => Timestamp(TimeUnit::Microsecond, None),
        Timestamp(_, Some(_)) => Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
        Time32(_) | Time64(_) => Time64(TimeUnit::Microsecond),
        Date64 => Date32,
        Decimal32(p, s) | Decimal64(p, s) => Decimal128(*p, *s),
        List(f) | LargeList(f) | ListView(f) | LargeListView(f) | FixedSizeList(f, _) => {
            List(Arc::new(normalize_field(f, false)?))
        }
        Struct(fields) => Struct(
            fields
                .iter()
                .map(|f| normalize_field(f, false))
                .collect::<Result<Fields>>()?,
        ),
        Map(entries, sorted) => Map(Arc::new(normalize_field(entries, false)?), *sorted),
        Dictionary(_, v) => normalize_type(v, name)?,
        Boolean
        | Int32
        | Int64
        | Float32
        | Float64
        | Utf8
        | Binary
        | Date32
        | FixedSizeBinary(_)
        | Decimal128(_, _) => dt.clone(),
        other => {
            return Err(Error::Unsupported(format!(
                "column '{name}' has type {other}, which Iceberg has no type for"
            )));
        }
    })
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

/// An Iceberg type as users read it: `long`, `decimal(10, 2)`, `list<string>`,
/// `map<string, long>`, `struct<a: int, b: string>`.
pub fn type_name(t: &Type) -> String {
    match t {
        Type::Primitive(p) => p.to_string(),
        Type::List(l) => format!("list<{}>", type_name(&l.element_field.field_type)),
        Type::Map(m) => format!(
            "map<{}, {}>",
            type_name(&m.key_field.field_type),
            type_name(&m.value_field.field_type)
        ),
        Type::Struct(s) => format!(
            "struct<{}>",
            s.fields()
                .iter()
                .map(|f| format!("{}: {}", f.name, type_name(&f.field_type)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The partition spec for `PARTITIONED BY (...)` over `schema`.
pub fn partition_spec(exprs: &[Expr], schema: &Schema) -> Result<UnboundPartitionSpec> {
    let mut builder = UnboundPartitionSpec::builder();
    for expr in exprs {
        let (column, transform, suffix) = partition_field(expr)?;
        let field = schema.field_by_name(&column).ok_or_else(|| {
            Error::Plan(format!(
                "PARTITIONED BY names column '{column}', which the table does not have"
            ))
        })?;
        let name = match suffix {
            None => column.clone(),
            Some(s) => format!("{column}_{s}"),
        };
        builder = builder.add_partition_field(field.id, name, transform)?;
    }
    Ok(builder.build())
}

pub(crate) fn partition_field(expr: &Expr) -> Result<(String, Transform, Option<&'static str>)> {
    let bad = || {
        Error::Plan(format!(
            "'{expr}' is not a partition field: use a column, years(col), months(col), \
             days(col), hours(col), bucket(N, col) or truncate(N, col)"
        ))
    };
    match expr {
        Expr::Identifier(id) => Ok((id.value.clone(), Transform::Identity, None)),
        Expr::Function(f) => {
            let fname = f.name.to_string().to_ascii_lowercase();
            let FunctionArguments::List(list) = &f.args else {
                return Err(bad());
            };
            let args: Vec<&Expr> = list
                .args
                .iter()
                .map(|a| match a {
                    FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Ok(e),
                    _ => Err(bad()),
                })
                .collect::<Result<_>>()?;
            let column = |e: &Expr| match e {
                Expr::Identifier(id) => Ok(id.value.clone()),
                _ => Err(bad()),
            };
            let number = |e: &Expr| match e {
                Expr::Value(v) => match &v.value {
                    Value::Number(n, _) => n.parse::<u32>().map_err(|_| bad()),
                    _ => Err(bad()),
                },
                _ => Err(bad()),
            };
            match (fname.as_str(), args.as_slice()) {
                ("years" | "year", [c]) => Ok((column(c)?, Transform::Year, Some("year"))),
                ("months" | "month", [c]) => Ok((column(c)?, Transform::Month, Some("month"))),
                ("days" | "day" | "date", [c]) => Ok((column(c)?, Transform::Day, Some("day"))),
                ("hours" | "hour", [c]) => Ok((column(c)?, Transform::Hour, Some("hour"))),
                ("bucket", [n, c]) => {
                    Ok((column(c)?, Transform::Bucket(number(n)?), Some("bucket")))
                }
                ("truncate", [n, c]) => {
                    Ok((column(c)?, Transform::Truncate(number(n)?), Some("trunc")))
                }
                _ => Err(bad()),
            }
        }
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn arrow_uuids_become_iceberg_uuids_nested_too() {
        let uuid = || {
            Field::new("id", DataType::FixedSizeBinary(16), true).with_metadata(
                [("ARROW:extension:name".to_string(), "arrow.uuid".to_string())].into(),
            )
        };
        let plain = Field::new("raw", DataType::FixedSizeBinary(16), true);
        let arrow = ArrowSchema::new(vec![
            uuid(),
            plain,
            Field::new("s", DataType::Struct(vec![uuid()].into()), true),
        ]);
        let schema = iceberg_schema(&arrow, true).unwrap();
        let types: Vec<String> = schema
            .as_struct()
            .fields()
            .iter()
            .map(|f| type_name(&f.field_type))
            .collect();
        assert_eq!(types, vec!["uuid", "fixed(16)", "struct<id: uuid>"]);
    }

    use super::*;
    use crate::sql::{Statement, parse_sql};

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
