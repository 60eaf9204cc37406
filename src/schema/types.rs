//! Arrow and Iceberg types: which Iceberg type an Arrow column becomes, and how types are
//! named in messages.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Fields, Schema as ArrowSchema, TimeUnit};
use datafusion::arrow::error::ArrowError;
use iceberg::arrow::arrow_schema_to_schema_auto_assign_ids;
use iceberg::spec::{ListType, NestedFieldRef, PrimitiveType, Schema, StructType, Type};

use crate::error::{Error, Result};

/// The field metadata key the JSON decoder sets on the columns it infers.
pub const INFERRED: &str = "floe.inferred";

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

/// The columns of `schema`, nested fields (struct fields, list elements, map keys and
/// values) included: what a table's column cap counts.
pub fn column_count(schema: &Schema) -> usize {
    fn of(ty: &iceberg::spec::Type) -> usize {
        use iceberg::spec::Type;
        match ty {
            Type::Primitive(_) => 0,
            Type::Struct(s) => s.fields().iter().map(|f| 1 + of(&f.field_type)).sum(),
            Type::List(l) => 1 + of(&l.element_field.field_type),
            Type::Map(m) => 2 + of(&m.key_field.field_type) + of(&m.value_field.field_type),
        }
    }
    schema
        .as_struct()
        .fields()
        .iter()
        .map(|f| 1 + of(&f.field_type))
        .sum()
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

/// `schema` with the top-level columns `key` as its identifier fields (its primary key):
/// each a column of a primitive type other than FLOAT and DOUBLE, and NOT NULL, or made so
/// with `make_required` (a table created from rows, whose columns are all optional).
/// The error says which column does not fit, and how, for `table`.
pub fn with_key(
    schema: Schema,
    key: &[&str],
    make_required: bool,
    table: &dyn std::fmt::Display,
) -> std::result::Result<Schema, String> {
    if key.is_empty() {
        return Ok(schema);
    }
    let mut ids = Vec::new();
    for k in key {
        let field = schema
            .field_by_name(k)
            .ok_or_else(|| format!("primary key column '{k}' is not a column of table {table}"))?;
        let fit = match &*field.field_type {
            Type::Primitive(p) => !matches!(p, PrimitiveType::Float | PrimitiveType::Double),
            _ => false,
        };
        let top = schema.as_struct().field_by_id(field.id).is_some();
        if !fit || !top || (!field.required && !make_required) {
            return Err(format!(
                "primary key column '{k}' of table {table} is {}{}: a key column is a \
                 NOT NULL top-level column of a primitive type other than FLOAT and DOUBLE",
                type_name(&field.field_type),
                if field.required { "" } else { " NULL" }
            ));
        }
        ids.push(field.id);
    }
    let fields: Vec<NestedFieldRef> = schema
        .as_struct()
        .fields()
        .iter()
        .map(|f| match ids.contains(&f.id) && !f.required {
            true => {
                let mut f = f.as_ref().clone();
                f.required = true;
                Arc::new(f)
            }
            false => f.clone(),
        })
        .collect();
    Schema::builder()
        .with_schema_id(schema.schema_id())
        .with_fields(fields)
        .with_identifier_field_ids(ids)
        .build()
        .map_err(|e| format!("the primary key of table {table}: {e}"))
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

/// The Iceberg-style name of the values of Arrow type `t`, for messages.
pub fn arrow_type_name(t: &DataType) -> String {
    match t {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "string".into(),
        DataType::Int8 | DataType::Int16 | DataType::Int32 => "int".into(),
        DataType::UInt8 | DataType::UInt16 => "int".into(),
        DataType::Int64 | DataType::UInt32 => "long".into(),
        DataType::Float16 | DataType::Float32 => "float".into(),
        DataType::Float64 => "double".into(),
        DataType::Boolean => "boolean".into(),
        DataType::Date32 | DataType::Date64 => "date".into(),
        DataType::Timestamp(_, None) => "timestamp".into(),
        DataType::Timestamp(_, Some(_)) => "timestamptz".into(),
        DataType::Decimal128(p, s) => format!("decimal({p}, {s})"),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => "binary".into(),
        DataType::Struct(_) => "struct".into(),
        DataType::List(_) | DataType::LargeList(_) => "list".into(),
        DataType::Map(_, _) => "map".into(),
        other => other.to_string(),
    }
}

/// `columns` cast to the types of `fields`, one for one (a column already of its field's type
/// is kept as it is); the first that cannot be cast fails, with its place.
pub fn cast_to_fields(
    columns: &[datafusion::arrow::array::ArrayRef],
    fields: &Fields,
) -> std::result::Result<Vec<datafusion::arrow::array::ArrayRef>, (usize, ArrowError)> {
    columns
        .iter()
        .zip(fields.iter())
        .enumerate()
        .map(|(i, (c, f))| {
            if c.data_type() == f.data_type() {
                Ok(c.clone())
            } else {
                datafusion::arrow::compute::cast(c, f.data_type()).map_err(|e| (i, e))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
