//! Schema evolution: fitting a batch's columns to a table's schema, and growing the schema
//! where the batch has more.
//!
//! Rules:
//! - a field the table lacks becomes an optional column (in nested structs too), with a new
//!   field id after the table's last one; a column the batch lacks reads as NULL;
//! - int widens to long, float to double, decimal to a larger precision (same scale);
//! - a value that fits the column losslessly is converted (an integer into a double column);
//! - anything else is incompatible: the records go to the dead-letter table with the reason;
//! - a column that has only NULLs in the batch creates nothing;
//! - columns are never dropped, renamed or narrowed.

use std::sync::Arc;

use super::promote::promotes;
use super::types::{FIELD_DOC, INFERRED, arrow_type_name, type_name, with_uuid};
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, ListArray, RecordBatch, RecordBatchOptions, StructArray,
    new_null_array,
};
use datafusion::arrow::compute::{CastOptions, cast, cast_with_options};
use datafusion::arrow::datatypes::Int64Type;
use datafusion::arrow::datatypes::{
    DataType, Field, FieldRef, Fields, Schema as ArrowSchema, SchemaRef,
};
use iceberg::arrow::{arrow_type_to_type, schema_to_arrow_schema};
use iceberg::spec::{NestedField, NestedFieldRef, PrimitiveType, Schema, StructType, Type};

use crate::error::{Error, Reject, Result};

/// Why a batch does not fit a table.
pub type Incompatible = Reject;

/// The table schema `batch` needs: `None` when `current` already takes it. Fails with the
/// reason when a column's type cannot be widened to the batch's.
pub fn evolve(
    current: &Schema,
    last_column_id: i32,
    batch: &ArrowSchema,
    columns: &[ArrayRef],
) -> std::result::Result<Option<Schema>, Incompatible> {
    let mut next_id = last_column_id;
    let fields = merge_struct(
        current.as_struct(),
        &batch.fields,
        columns,
        &mut next_id,
        "",
    )?;
    match fields {
        None => Ok(None),
        Some(fields) => Schema::builder()
            .with_fields(fields)
            .with_identifier_field_ids(current.identifier_field_ids())
            .build()
            .map(Some)
            .map_err(|e| Reject::new(format!("the evolved schema is invalid: {e}"))),
    }
}

/// The merged fields of `table` and `batch`, or `None` when nothing changes.
fn merge_struct(
    table: &StructType,
    batch: &Fields,
    columns: &[ArrayRef],
    next_id: &mut i32,
    path: &str,
) -> std::result::Result<Option<Vec<NestedFieldRef>>, Incompatible> {
    let mut changed = false;
    let mut out: Vec<NestedFieldRef> = Vec::new();
    for tf in table.fields() {
        let pos = batch.iter().position(|f| f.name() == &tf.name);
        // A column the batch lacks, or has only NULLs in, reads NULL: it must be optional,
        // and there is nothing to learn about its type.
        let all_null = pos.is_none_or(|p| columns[p].null_count() == columns[p].len());
        let Some(pos) = pos.filter(|_| !all_null) else {
            if tf.required {
                changed = true;
                out.push(Arc::new(NestedField::optional(
                    tf.id,
                    &tf.name,
                    (*tf.field_type).clone(),
                )));
            } else {
                out.push(tf.clone());
            }
            continue;
        };
        let column = &columns[pos];
        let name = format!("{path}{}", tf.name);
        let merged = merge_type(
            &tf.field_type,
            batch[pos].data_type(),
            column,
            next_id,
            &name,
        )?;
        let required = tf.required && column.null_count() == 0;
        match merged {
            None if required == tf.required => out.push(tf.clone()),
            merged => {
                changed = true;
                let ty = merged.unwrap_or_else(|| (*tf.field_type).clone());
                out.push(Arc::new(if required {
                    NestedField::required(tf.id, &tf.name, ty)
                } else {
                    NestedField::optional(tf.id, &tf.name, ty)
                }));
            }
        }
    }
    for (i, f) in batch.iter().enumerate() {
        if table.field_by_name(f.name()).is_some() || columns[i].null_count() == columns[i].len() {
            continue;
        }
        let name = format!("{path}{}", f.name());
        let ty = new_type(f.data_type(), &columns[i], next_id, &name)?;
        *next_id += 1;
        let id = *next_id;
        // New fields get their id before their children's: re-number depth-first.
        let ty = renumber(ty, next_id);
        changed = true;
        let field = NestedField::optional(id, f.name(), ty);
        let field = Arc::new(match f.metadata().get(FIELD_DOC) {
            Some(doc) => field.with_doc(doc),
            None => field,
        });
        out.push(with_uuid(&field, f));
    }
    Ok(changed.then_some(out))
}

/// The Iceberg type for a new column of Arrow type `t` (nested fields with placeholder ids
/// that [`renumber`] replaces).
fn new_type(
    t: &DataType,
    column: &ArrayRef,
    next_id: &mut i32,
    name: &str,
) -> std::result::Result<Type, Incompatible> {
    let _ = (column, next_id);
    let normalized = match t {
        DataType::Int8 | DataType::Int16 | DataType::UInt8 | DataType::UInt16 => DataType::Int32,
        DataType::UInt32 => DataType::Int64,
        DataType::Utf8View | DataType::LargeUtf8 => DataType::Utf8,
        DataType::Timestamp(_, tz) => DataType::Timestamp(
            datafusion::arrow::datatypes::TimeUnit::Microsecond,
            tz.clone(),
        ),
        other => other.clone(),
    };
    // Give nested Arrow fields ids so the converter accepts them.
    let with_ids = add_field_ids(&normalized, &mut 1_000_000);
    arrow_type_to_type(&with_ids).map_err(|e| {
        Reject::new(format!(
            "column '{name}' has type {t}, which Iceberg cannot hold: {e}"
        ))
        .in_column(name)
    })
}

fn add_field_ids(t: &DataType, next: &mut i32) -> DataType {
    let with_id = |f: &Field, next: &mut i32| -> Field {
        *next += 1;
        let mut md = f.metadata().clone();
        md.insert("PARQUET:field_id".to_string(), next.to_string());
        Field::new(f.name(), add_field_ids(f.data_type(), next), true).with_metadata(md)
    };
    match t {
        DataType::Struct(fields) => DataType::Struct(
            fields
                .iter()
                .map(|f| with_id(f, next))
                .collect::<Vec<_>>()
                .into(),
        ),
        DataType::List(f) => DataType::List(Arc::new(with_id(f, next))),
        DataType::LargeList(f) => DataType::List(Arc::new(with_id(f, next))),
        other => other.clone(),
    }
}

/// `ty` with every nested field id replaced by the next free id, depth first.
fn renumber(ty: Type, next_id: &mut i32) -> Type {
    match ty {
        Type::Struct(s) => Type::Struct(StructType::new(
            s.fields()
                .iter()
                .map(|f| {
                    *next_id += 1;
                    let id = *next_id;
                    let inner = renumber((*f.field_type).clone(), next_id);
                    Arc::new(NestedField::optional(id, &f.name, inner))
                })
                .collect(),
        )),
        Type::List(l) => {
            *next_id += 1;
            let id = *next_id;
            let inner = renumber((*l.element_field.field_type).clone(), next_id);
            Type::List(iceberg::spec::ListType::new(Arc::new(
                NestedField::list_element(id, inner, false),
            )))
        }
        other => other,
    }
}

/// The type a column must have to take values of Arrow type `t` (`None`: as it is).
fn merge_type(
    current: &Type,
    t: &DataType,
    column: &ArrayRef,
    next_id: &mut i32,
    name: &str,
) -> std::result::Result<Option<Type>, Incompatible> {
    let incompatible = || {
        Reject::new(format!(
            "column '{name}' is {} in the table; a {} value does not fit it without loss",
            type_name(current),
            arrow_type_name(t)
        ))
        .in_column(name)
    };
    match (current, t) {
        (Type::Primitive(p), t) => {
            let widened = arrow_primitive(t).filter(|w| w != p && promotes(p, w));
            if let Some(w) = widened {
                return Ok(Some(Type::Primitive(w)));
            }
            if fits(p, t) {
                Ok(None)
            } else {
                Err(incompatible())
            }
        }
        (Type::Struct(s), DataType::Struct(fields)) => {
            let Some(arr) = column.as_any().downcast_ref::<StructArray>() else {
                return Err(incompatible());
            };
            let merged = merge_struct(s, fields, arr.columns(), next_id, &format!("{name}."))?;
            Ok(merged.map(|f| Type::Struct(StructType::new(f))))
        }
        (Type::List(l), DataType::List(f)) => {
            let Some(arr) = column.as_list_opt::<i32>() else {
                return Err(incompatible());
            };
            let element = &l.element_field;
            let values = arr.values();
            // Elements in the rows' range only: a sliced list shares its parent's values.
            let first = arr.value_offsets()[0] as usize;
            let last = arr.value_offsets()[arr.len()] as usize;
            let values = values.slice(first, last - first);
            let merged = if values.null_count() == values.len() {
                None
            } else {
                merge_type(
                    &element.field_type,
                    f.data_type(),
                    &values,
                    next_id,
                    &format!("{name}.element"),
                )?
            };
            let required = element.required && values.null_count() == 0;
            if merged.is_none() && required == element.required {
                return Ok(None);
            }
            let ty = merged.unwrap_or_else(|| (*element.field_type).clone());
            Ok(Some(Type::List(iceberg::spec::ListType::new(Arc::new(
                NestedField::list_element(element.id, ty, required),
            )))))
        }
        _ => Err(incompatible()),
    }
}

/// The Iceberg type a column of Arrow type `t` is promoted to, where a promotion can apply.
fn arrow_primitive(t: &DataType) -> Option<PrimitiveType> {
    use PrimitiveType as P;
    Some(match t {
        DataType::Int32 => P::Int,
        DataType::Int64 => P::Long,
        DataType::Float32 => P::Float,
        DataType::Float64 => P::Double,
        DataType::Decimal128(precision, scale) => P::Decimal {
            precision: u32::from(*precision),
            scale: u32::try_from(*scale).ok()?,
        },
        _ => return None,
    })
}

/// Whether values of Arrow type `t` go into a column of `p` without loss.
fn fits(p: &PrimitiveType, t: &DataType) -> bool {
    use PrimitiveType as P;
    // A decimal with more fraction digits than the column's would be rounded: not lossless.
    // (More integer digits than the column has fail the conversion, value by value.)
    if let (P::Decimal { scale, .. }, DataType::Decimal128(_, s)) = (p, t) {
        return i64::from(*s) <= i64::from(*scale);
    }
    matches!(
        (p, t),
        (P::Boolean, DataType::Boolean)
            | (
                P::Int,
                DataType::Int8
                    | DataType::Int16
                    | DataType::Int32
                    | DataType::UInt8
                    | DataType::UInt16
            )
            | (
                P::Long,
                DataType::Int8
                    | DataType::Int16
                    | DataType::Int32
                    | DataType::Int64
                    | DataType::UInt8
                    | DataType::UInt16
                    | DataType::UInt32
            )
            | (P::Float, DataType::Float16 | DataType::Float32)
            | (
                P::Double,
                DataType::Float16
                    | DataType::Float32
                    | DataType::Float64
                    | DataType::Int8
                    | DataType::Int16
                    | DataType::Int32
            )
            | (
                P::String,
                DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
            )
            | (
                P::Binary,
                DataType::Binary | DataType::LargeBinary | DataType::BinaryView
            )
            | (P::Date, DataType::Date32)
            | (P::Timestamp | P::TimestampNs, DataType::Timestamp(_, None))
            | (
                P::Timestamptz | P::TimestamptzNs,
                DataType::Timestamp(_, Some(_))
            )
            | (P::Time, DataType::Time64(_) | DataType::Time32(_))
            | (P::Decimal { .. }, DataType::Decimal128(_, _))
            | (P::Uuid | P::Fixed(_), DataType::FixedSizeBinary(_))
    )
}

/// `batch` with each column named as the table's column that has the same name ignoring
/// ASCII case (`schema.case-insensitive`), in nested structs and list elements too; a column
/// the table lacks keeps its name. Two columns that differ only in case are an error (their
/// rows go to the dead-letter table).
pub fn match_case(
    table: &Schema,
    batch: &RecordBatch,
) -> std::result::Result<RecordBatch, Incompatible> {
    let (fields, columns, changed) = match_fields(
        Some(table.as_struct()),
        batch.schema().fields(),
        batch.columns(),
        "",
    )?;
    if !changed {
        return Ok(batch.clone());
    }
    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    RecordBatch::try_new_with_options(Arc::new(ArrowSchema::new(fields)), columns, &options)
        .map_err(|e| Reject::new(format!("renaming columns: {e}")))
}

/// `fields` (with their `columns`) renamed to the spelling of `table`'s fields; whether any
/// name changed.
fn match_fields(
    table: Option<&StructType>,
    fields: &Fields,
    columns: &[ArrayRef],
    path: &str,
) -> std::result::Result<(Fields, Vec<ArrayRef>, bool), Incompatible> {
    let mut seen: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    let mut changed = false;
    let mut out_fields = Vec::with_capacity(fields.len());
    let mut out_columns = Vec::with_capacity(fields.len());
    for (f, c) in fields.iter().zip(columns) {
        let lower = f.name().to_ascii_lowercase();
        if let Some(other) = seen.insert(lower.clone(), f.name().clone()) {
            return Err(Reject::new(format!(
                "columns '{path}{other}' and '{path}{}' differ only in case \
                 (schema.case-insensitive)",
                f.name()
            )));
        }
        let target = table.and_then(|t| {
            t.fields()
                .iter()
                .find(|t| t.name.to_ascii_lowercase() == lower)
        });
        let name = target.map_or_else(|| f.name().clone(), |t| t.name.clone());
        changed |= &name != f.name();
        let inner = format!("{path}{name}.");
        let (c, inner_changed) = match_nested(target.map(|t| t.field_type.as_ref()), c, &inner)?;
        changed |= inner_changed;
        out_fields.push(
            f.as_ref()
                .clone()
                .with_name(name)
                .with_data_type(c.data_type().clone()),
        );
        out_columns.push(c);
    }
    Ok((out_fields.into(), out_columns, changed))
}

/// A struct or list column with its nested fields renamed as in `table`.
fn match_nested(
    table: Option<&Type>,
    column: &ArrayRef,
    path: &str,
) -> std::result::Result<(ArrayRef, bool), Incompatible> {
    match column.data_type() {
        DataType::Struct(fields) => {
            let t = match table {
                Some(Type::Struct(t)) => Some(t),
                _ => None,
            };
            let s = column.as_struct();
            let (fields, children, changed) = match_fields(t, fields, s.columns(), path)?;
            if !changed {
                return Ok((column.clone(), false));
            }
            let out = StructArray::try_new(fields, children, s.nulls().cloned())
                .map_err(|e| Reject::new(format!("renaming fields of '{path}': {e}")))?;
            Ok((Arc::new(out), true))
        }
        DataType::List(field) => {
            let l = column.as_list::<i32>();
            let (values, changed) = match_nested(element_type(table), l.values(), path)?;
            if !changed {
                return Ok((column.clone(), false));
            }
            let out = with_values(l, field, values)
                .map_err(|e| Reject::new(format!("renaming fields of '{path}': {e}")))?;
            Ok((out, true))
        }
        _ => Ok((column.clone(), false)),
    }
}

/// `'json.infer.integers' = 'int'`: in the columns inferred from JSON (see [`INFERRED`]), the
/// integer values as `int` wherever they all fit one and the table (if any) does not have a
/// `long` there already; a larger value keeps `long`, which then widens the column.
pub fn narrow_integers(table: Option<&Schema>, batch: &RecordBatch) -> Result<RecordBatch> {
    let mut fields = Vec::with_capacity(batch.num_columns());
    let mut columns = Vec::with_capacity(batch.num_columns());
    for (f, c) in batch.schema().fields().iter().zip(batch.columns()) {
        if !f.metadata().contains_key(INFERRED) {
            fields.push(f.clone());
            columns.push(c.clone());
            continue;
        }
        let ty = table
            .and_then(|t| t.field_by_name(f.name()))
            .map(|t| t.field_type.as_ref());
        let c = narrow(c, ty)?;
        fields.push(Arc::new(
            Field::new(f.name(), c.data_type().clone(), f.is_nullable())
                .with_metadata(f.metadata().clone()),
        ));
        columns.push(c);
    }
    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    RecordBatch::try_new_with_options(Arc::new(ArrowSchema::new(fields)), columns, &options)
        .map_err(|e| Error::Internal(format!("narrowing integers: {e}")))
}

fn narrow(column: &ArrayRef, table: Option<&Type>) -> Result<ArrayRef> {
    let internal = |e: datafusion::arrow::error::ArrowError| Error::Internal(e.to_string());
    match column.data_type() {
        DataType::Int64 => {
            let long = matches!(table, Some(Type::Primitive(PrimitiveType::Long)));
            let values = column.as_primitive::<Int64Type>();
            let fits = values.iter().flatten().all(|v| i32::try_from(v).is_ok());
            if long || !fits {
                return Ok(column.clone());
            }
            cast(column, &DataType::Int32).map_err(internal)
        }
        DataType::Struct(fields) => {
            let s = column.as_struct();
            let mut out_fields = Vec::with_capacity(fields.len());
            let mut children = Vec::with_capacity(fields.len());
            for (f, c) in fields.iter().zip(s.columns()) {
                let ty = match table {
                    Some(Type::Struct(t)) => {
                        t.field_by_name(f.name()).map(|t| t.field_type.as_ref())
                    }
                    _ => None,
                };
                let c = narrow(c, ty)?;
                out_fields.push(f.as_ref().clone().with_data_type(c.data_type().clone()));
                children.push(c);
            }
            let out = StructArray::try_new(out_fields.into(), children, s.nulls().cloned())
                .map_err(internal)?;
            Ok(Arc::new(out))
        }
        DataType::List(field) => {
            let l = column.as_list::<i32>();
            let values = narrow(l.values(), element_type(table))?;
            with_values(l, field, values).map_err(internal)
        }
        _ => Ok(column.clone()),
    }
}

/// The element type of a list type.
fn element_type(list: Option<&Type>) -> Option<&Type> {
    match list {
        Some(Type::List(l)) => Some(l.element_field.field_type.as_ref()),
        _ => None,
    }
}

/// `list` with its elements replaced by `values` (of the same length, maybe another type).
fn with_values(
    list: &ListArray,
    field: &FieldRef,
    values: ArrayRef,
) -> std::result::Result<ArrayRef, datafusion::arrow::error::ArrowError> {
    let field = Arc::new(
        field
            .as_ref()
            .clone()
            .with_data_type(values.data_type().clone()),
    );
    let out = ListArray::try_new(field, list.offsets().clone(), values, list.nulls().cloned())?;
    Ok(Arc::new(out))
}

/// `batch`'s rows in `table`'s columns: matched by name, missing ones NULL, types converted.
/// Call after [`evolve`] made the table take every column of the batch.
pub fn conform(table: &Schema, batch: &RecordBatch) -> Result<RecordBatch> {
    conform_to(&Arc::new(schema_to_arrow_schema(table)?), batch)
}

/// [`conform`] with the table's Arrow schema (`schema_to_arrow_schema`) already at hand.
pub fn conform_to(arrow: &SchemaRef, batch: &RecordBatch) -> Result<RecordBatch> {
    let columns = arrow
        .fields()
        .iter()
        .map(|f| {
            conform_column(
                f,
                batch.schema().fields(),
                batch.columns(),
                batch.num_rows(),
            )
        })
        .collect::<Result<Vec<_>>>()?;
    RecordBatch::try_new(arrow.clone(), columns)
        .map_err(|e| Error::Record(Reject::new(format!("rows do not fit the table: {e}"))))
}

fn conform_column(
    target: &Field,
    fields: &Fields,
    columns: &[ArrayRef],
    rows: usize,
) -> Result<ArrayRef> {
    let Some(pos) = fields.iter().position(|f| f.name() == target.name()) else {
        return Ok(new_null_array(target.data_type(), rows));
    };
    conform_array(target, &columns[pos])
}

/// Conversions that fail on a value that does not fit, rather than make it NULL.
const UNSAFE_CAST: CastOptions<'static> = CastOptions {
    safe: false,
    format_options: datafusion::arrow::util::display::FormatOptions::new(),
};

/// `column` as values of `target`'s type: struct fields matched by name, list elements
/// likewise, other types converted; a value that does not convert is an [`Error::Record`].
pub fn conform_array(target: &Field, column: &ArrayRef) -> Result<ArrayRef> {
    match (target.data_type(), column.data_type()) {
        (DataType::Struct(children), DataType::Struct(_)) => {
            let s = column.as_struct();
            let arrays = children
                .iter()
                .map(|c| conform_column(c, s.fields(), s.columns(), s.len()))
                .collect::<Result<Vec<_>>>()?;
            Ok(Arc::new(
                StructArray::try_new(children.clone(), arrays, s.nulls().cloned()).map_err(
                    |e| {
                        Error::Record(
                            Reject::new(format!("struct column '{}': {e}", target.name()))
                                .in_column(target.name()),
                        )
                    },
                )?,
            ))
        }
        (DataType::List(element), DataType::List(_))
            if column.data_type() != target.data_type() =>
        {
            let l = column.as_list::<i32>();
            let values = conform_array(element, l.values())?;
            Ok(Arc::new(
                ListArray::try_new(
                    element.clone(),
                    l.offsets().clone(),
                    values,
                    l.nulls().cloned(),
                )
                .map_err(|e| {
                    Error::Record(
                        Reject::new(format!("list column '{}': {e}", target.name()))
                            .in_column(target.name()),
                    )
                })?,
            ))
        }
        _ if column.data_type() == target.data_type() => Ok(column.clone()),
        // Never the default safe cast, which writes NULL where a value does not fit (a
        // decimal too large for the column's precision): such a value is the record's fault.
        _ => cast_with_options(column, target.data_type(), &UNSAFE_CAST).map_err(|e| {
            Error::Record(
                Reject::new(format!(
                    "column '{}' ({}) cannot be written as {}: {e}",
                    target.name(),
                    column.data_type(),
                    target.data_type()
                ))
                .in_column(target.name()),
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{
        BooleanArray, Float32Array, Float64Array, Int32Array, Int64Array, StringArray,
    };
    use proptest::prelude::*;

    use super::*;

    fn table() -> Schema {
        Schema::builder()
            .with_fields(vec![
                NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
                NestedField::optional(2, "n", Type::Primitive(PrimitiveType::Int)).into(),
                NestedField::optional(3, "x", Type::Primitive(PrimitiveType::Double)).into(),
            ])
            .build()
            .unwrap()
    }

    fn batch(cols: Vec<(&str, ArrayRef)>) -> RecordBatch {
        let fields: Vec<Field> = cols
            .iter()
            .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
            .collect();
        RecordBatch::try_new(
            Arc::new(ArrowSchema::new(fields)),
            cols.into_iter().map(|(_, a)| a).collect(),
        )
        .unwrap()
    }

    fn run(b: &RecordBatch) -> std::result::Result<Option<Schema>, Incompatible> {
        evolve(&table(), 3, b.schema().as_ref(), b.columns())
    }

    #[test]
    fn the_same_columns_change_nothing() {
        let b = batch(vec![("id", Arc::new(Int64Array::from(vec![1])))]);
        let evolved = run(&b).unwrap();
        // `n` and `x` are missing but already optional; `id` has no NULLs.
        assert!(evolved.is_none());
    }

    #[test]
    fn new_columns_are_optional_with_new_ids() {
        let b = batch(vec![
            ("id", Arc::new(Int64Array::from(vec![1]))),
            ("tag", Arc::new(StringArray::from(vec!["a"]))),
        ]);
        let s = run(&b).unwrap().unwrap();
        let tag = s.field_by_name("tag").unwrap();
        assert_eq!(tag.id, 4);
        assert!(!tag.required);
        assert_eq!(s.field_by_name("id").unwrap().id, 1);
    }

    #[test]
    fn only_nulls_create_no_column() {
        let b = batch(vec![
            ("id", Arc::new(Int64Array::from(vec![1]))),
            ("ghost", Arc::new(StringArray::from(vec![None::<&str>]))),
        ]);
        assert!(run(&b).unwrap().is_none());
    }

    #[test]
    fn int_widens_to_long_and_integers_fit_doubles() {
        let b = batch(vec![
            ("id", Arc::new(Int64Array::from(vec![1]))),
            ("n", Arc::new(Int64Array::from(vec![5_000_000_000]))),
            ("x", Arc::new(Int32Array::from(vec![3]))),
        ]);
        let s = run(&b).unwrap().unwrap();
        assert_eq!(
            *s.field_by_name("n").unwrap().field_type,
            Type::Primitive(PrimitiveType::Long)
        );
        assert_eq!(s.field_by_name("n").unwrap().id, 2, "widening keeps the id");
    }

    #[test]
    fn narrowing_or_changing_kind_is_incompatible() {
        let b = batch(vec![("n", Arc::new(StringArray::from(vec!["ten"])))]);
        let err = run(&b).unwrap_err();
        assert!(
            err.reason.contains("column 'n' is int in the table"),
            "{err}"
        );
        assert_eq!(err.column.as_deref(), Some("n"));
        let b = batch(vec![("id", Arc::new(Float64Array::from(vec![10.5])))]);
        assert!(run(&b).is_err(), "10.5 does not go into a long column");
    }

    #[test]
    fn a_null_in_a_required_column_makes_it_optional() {
        let b = batch(vec![(
            "id",
            Arc::new(Int64Array::from(vec![Some(1), None])),
        )]);
        let s = run(&b).unwrap().unwrap();
        assert!(!s.field_by_name("id").unwrap().required);
    }

    #[test]
    fn nested_fields_are_added_inside_structs() {
        let table = Schema::builder()
            .with_fields(vec![
                NestedField::optional(
                    1,
                    "user",
                    Type::Struct(StructType::new(vec![
                        NestedField::optional(2, "name", Type::Primitive(PrimitiveType::String))
                            .into(),
                    ])),
                )
                .into(),
            ])
            .build()
            .unwrap();
        let user = StructArray::from(vec![
            (
                Arc::new(Field::new("name", DataType::Utf8, true)),
                Arc::new(StringArray::from(vec!["ann"])) as ArrayRef,
            ),
            (
                Arc::new(Field::new("age", DataType::Int64, true)),
                Arc::new(Int64Array::from(vec![30])) as ArrayRef,
            ),
        ]);
        let b = batch(vec![("user", Arc::new(user))]);
        let s = evolve(&table, 2, b.schema().as_ref(), b.columns())
            .unwrap()
            .unwrap();
        let age = s.field_by_name("user.age").unwrap();
        assert_eq!(age.id, 3);
        let conformed = conform(&s, &b).unwrap();
        assert_eq!(conformed.num_columns(), 1);
    }

    #[test]
    fn case_insensitive_matching_renames_to_the_tables_spelling() {
        let b = batch(vec![
            ("ID", Arc::new(Int64Array::from(vec![1]))),
            ("Tag", Arc::new(StringArray::from(vec!["a"]))),
        ]);
        let renamed = match_case(&table(), &b).unwrap();
        let names: Vec<&str> = renamed
            .schema_ref()
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        assert_eq!(names, vec!["id", "Tag"]);
        let twice = batch(vec![
            ("n", Arc::new(Int32Array::from(vec![1]))),
            ("N", Arc::new(Int32Array::from(vec![2]))),
        ]);
        assert!(
            match_case(&table(), &twice)
                .unwrap_err()
                .reason
                .contains("differ only in case")
        );
    }

    #[test]
    fn case_insensitive_matching_reaches_into_structs_and_lists() {
        let inner = |name: &str| Fields::from(vec![Field::new(name, DataType::Int64, true)]);
        let table = Schema::builder()
            .with_fields(vec![Arc::new(NestedField::optional(
                1,
                "geo",
                Type::Struct(StructType::new(vec![
                    Arc::new(NestedField::optional(
                        2,
                        "lat",
                        Type::Primitive(PrimitiveType::Long),
                    )),
                    Arc::new(NestedField::optional(
                        3,
                        "pts",
                        Type::List(iceberg::spec::ListType::new(Arc::new(
                            NestedField::list_element(
                                4,
                                Type::Struct(StructType::new(vec![Arc::new(
                                    NestedField::optional(
                                        5,
                                        "x",
                                        Type::Primitive(PrimitiveType::Long),
                                    ),
                                )])),
                                false,
                            ),
                        ))),
                    )),
                ])),
            ))])
            .build()
            .unwrap();
        let point =
            StructArray::try_new(inner("X"), vec![Arc::new(Int64Array::from(vec![7]))], None)
                .unwrap();
        let element = Arc::new(Field::new("item", point.data_type().clone(), true));
        let pts = ListArray::try_new(
            element,
            datafusion::arrow::buffer::OffsetBuffer::from_lengths([1]),
            Arc::new(point),
            None,
        )
        .unwrap();
        let geo = StructArray::try_new(
            Fields::from(vec![
                Field::new("LAT", DataType::Int64, true),
                Field::new("Pts", pts.data_type().clone(), true),
            ]),
            vec![Arc::new(Int64Array::from(vec![1])), Arc::new(pts)],
            None,
        )
        .unwrap();
        let b = batch(vec![("Geo", Arc::new(geo))]);
        let renamed = match_case(&table, &b).unwrap();
        assert_eq!(
            renamed.schema().field(0).data_type().to_string(),
            "Struct(\"lat\": Int64, \"pts\": List(Struct(\"x\": Int64)))"
        );
        assert_eq!(renamed.schema().field(0).name(), "geo");
    }

    #[test]
    fn conform_fills_missing_columns_and_converts() {
        let b = batch(vec![
            ("x", Arc::new(Int32Array::from(vec![3]))),
            ("id", Arc::new(Int64Array::from(vec![7]))),
        ]);
        let t = Schema::builder()
            .with_fields(table().as_struct().fields().to_vec())
            .build()
            .unwrap();
        let out = conform(&t, &b).unwrap();
        assert_eq!(out.num_columns(), 3);
        assert_eq!(out.column(1).null_count(), 1, "n is NULL");
        assert_eq!(
            out.column(2).data_type(),
            &DataType::Float64,
            "3 became 3.0"
        );
    }

    /// A column of one of a few Arrow types, its values drawn from `seed` (some NULL).
    fn column(kind: u8, values: &[Option<i32>]) -> ArrayRef {
        match kind % 6 {
            0 => Arc::new(Int32Array::from(values.to_vec())),
            1 => Arc::new(Int64Array::from_iter(
                values.iter().map(|v| v.map(|v| i64::from(v) * 1_000_000)),
            )),
            2 => Arc::new(Float32Array::from_iter(
                values.iter().map(|v| v.map(|v| v as f32 / 4.0)),
            )),
            3 => Arc::new(Float64Array::from_iter(
                values.iter().map(|v| v.map(|v| f64::from(v) / 3.0)),
            )),
            4 => Arc::new(StringArray::from_iter(
                values.iter().map(|v| v.map(|v| v.to_string())),
            )),
            _ => Arc::new(BooleanArray::from_iter(
                values.iter().map(|v| v.map(|v| v % 2 == 0)),
            )),
        }
    }

    proptest! {
        /// Whatever a batch brings, the schema `evolve` asks for takes it: conforming the
        /// batch to it never fails (a batch it cannot take is rejected by `evolve` itself).
        #[test]
        fn conform_after_evolve_never_fails(
            batches in proptest::collection::vec(
                (
                    proptest::collection::btree_map("[a-e]", 0u8..6, 1..5),
                    proptest::collection::vec(proptest::option::of(-50i32..50), 1..6),
                ),
                1..5,
            )
        ) {
            let mut current = table();
            let mut last = 3;
            for (columns, values) in batches {
                let b = batch(
                    columns
                        .iter()
                        .map(|(name, kind)| (name.as_str(), column(*kind, &values)))
                        .collect(),
                );
                match evolve(&current, last, b.schema().as_ref(), b.columns()) {
                    Err(_) => continue,
                    Ok(wanted) => {
                        if let Some(s) = wanted {
                            last = s.highest_field_id().max(last);
                            current = s;
                        }
                        let conformed = conform(&current, &b);
                        prop_assert!(conformed.is_ok(), "{:?}", conformed.err());
                        prop_assert_eq!(conformed.unwrap().num_rows(), b.num_rows());
                    }
                }
            }
        }
    }

    #[test]
    fn decimals_convert_losslessly_or_not_at_all() {
        use datafusion::arrow::array::Decimal128Array;
        let table = |precision, scale| {
            Schema::builder()
                .with_fields(vec![
                    NestedField::optional(
                        1,
                        "d",
                        Type::Primitive(PrimitiveType::Decimal { precision, scale }),
                    )
                    .into(),
                ])
                .build()
                .unwrap()
        };
        let decimals = |values: Vec<i128>, p: u8, s: i8| -> ArrayRef {
            Arc::new(
                Decimal128Array::from(values)
                    .with_precision_and_scale(p, s)
                    .unwrap(),
            )
        };
        // More fraction digits than the column's would be rounded: incompatible.
        let b = batch(vec![("d", decimals(vec![1234], 10, 3))]);
        let err = evolve(&table(10, 2), 1, b.schema().as_ref(), b.columns()).unwrap_err();
        assert!(err.reason.contains("without loss"), "{err}");
        // Fewer fraction digits fit; a value with too many integer digits is a record's
        // fault, not a NULL.
        let t = table(10, 4);
        let b = batch(vec![("d", decimals(vec![125, 1_234_567_890], 10, 2))]);
        assert!(
            evolve(&t, 1, b.schema().as_ref(), b.columns())
                .unwrap()
                .is_none()
        );
        let err = conform(&t, &b).unwrap_err();
        assert!(matches!(err, Error::Record(_)), "{err}");
        let fits = conform(&t, &b.slice(0, 1)).unwrap();
        let d = fits
            .column(0)
            .as_primitive::<datafusion::arrow::datatypes::Decimal128Type>();
        assert_eq!(d.value(0), 12_500, "1.25 as decimal(10, 4)");
    }
}
