//! Merging a checkpoint's schema change with one another writer committed first.
//!
//! Two writers that evolve one table from the same schema both give their new columns the
//! next free field ids, so the same id can name different columns. The second to commit
//! merges by name: its columns the table now has take the table's ids (widened if it needs
//! wider types); the others get fresh ids after the table's last one. When that changes an
//! id its data files were written with, the files are rewritten against the merged schema
//! (read back, matched by name) before the commit; the old ones are deleted after it.
//!
//! ```text
//! base: {1 id}      theirs (committed): {1 id, 2 a}      ours (pending): {1 id, 2 b}
//! merged: {1 id, 2 a, 3 b}    our files: field 2 -> 3, rewritten
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use iceberg::spec::{
    DataFile, ListType, MapType, NestedField, NestedFieldRef, PrimitiveType, Schema, StructType,
    Type, UnboundPartitionField, UnboundPartitionSpec,
};
use iceberg::table::Table;

use crate::error::{Error, Result};
use crate::sink::TableWriter;
use crate::sink::evolve::conform;

/// The merged schema and how our field ids map to its ids.
#[derive(Debug)]
pub struct Merged {
    pub schema: Schema,
    /// Our field id -> the merged schema's id, for every id that differs.
    pub remap: HashMap<i32, i32>,
}

/// Merge `ours` (a schema evolved from an older one of the table) into `theirs` (the table's
/// current schema, whose highest field id ever is `last_column_id`).
pub fn merge_schemas(theirs: &Schema, ours: &Schema, last_column_id: i32) -> Result<Merged> {
    let mut next_id = last_column_id;
    let mut remap = HashMap::new();
    let fields = merge_struct(
        theirs.as_struct(),
        ours.as_struct(),
        &mut next_id,
        &mut remap,
        "",
    )?;
    let schema = Schema::builder()
        .with_fields(fields)
        .with_identifier_field_ids(theirs.identifier_field_ids())
        .build()?;
    Ok(Merged { schema, remap })
}

fn merge_struct(
    theirs: &StructType,
    ours: &StructType,
    next_id: &mut i32,
    remap: &mut HashMap<i32, i32>,
    path: &str,
) -> Result<Vec<NestedFieldRef>> {
    let mut out: Vec<NestedFieldRef> = theirs.fields().to_vec();
    for f in ours.fields() {
        let name = format!("{path}{}", f.name);
        match out.iter().position(|t| t.name == f.name) {
            Some(i) => {
                let t = out[i].clone();
                if t.id != f.id {
                    remap.insert(f.id, t.id);
                }
                let ty = merge_type(&t.field_type, &f.field_type, next_id, remap, &name)?;
                let required = t.required && f.required;
                out[i] = Arc::new(field(t.id, &t.name, ty, required, t.doc.clone()));
            }
            None => {
                // A column only we have: fresh ids for it and everything inside it.
                let id = fresh(f.id, next_id, remap);
                let ty = renumber(&f.field_type, next_id, remap);
                out.push(Arc::new(field(id, &f.name, ty, false, f.doc.clone())));
            }
        }
    }
    Ok(out)
}

fn field(id: i32, name: &str, ty: Type, required: bool, doc: Option<String>) -> NestedField {
    let f = if required {
        NestedField::required(id, name, ty)
    } else {
        NestedField::optional(id, name, ty)
    };
    match doc {
        Some(d) => f.with_doc(d),
        None => f,
    }
}

fn fresh(ours: i32, next_id: &mut i32, remap: &mut HashMap<i32, i32>) -> i32 {
    *next_id += 1;
    if *next_id != ours {
        remap.insert(ours, *next_id);
    }
    *next_id
}

/// `ty` with fresh ids for every nested field.
fn renumber(ty: &Type, next_id: &mut i32, remap: &mut HashMap<i32, i32>) -> Type {
    match ty {
        Type::Primitive(_) => ty.clone(),
        Type::Struct(s) => Type::Struct(StructType::new(
            s.fields()
                .iter()
                .map(|f| {
                    let id = fresh(f.id, next_id, remap);
                    let inner = renumber(&f.field_type, next_id, remap);
                    Arc::new(field(id, &f.name, inner, f.required, f.doc.clone()))
                })
                .collect(),
        )),
        Type::List(l) => {
            let e = &l.element_field;
            let id = fresh(e.id, next_id, remap);
            let inner = renumber(&e.field_type, next_id, remap);
            Type::List(ListType::new(Arc::new(NestedField::list_element(
                id, inner, e.required,
            ))))
        }
        Type::Map(m) => {
            let (k, v) = (&m.key_field, &m.value_field);
            let kid = fresh(k.id, next_id, remap);
            let kt = renumber(&k.field_type, next_id, remap);
            let vid = fresh(v.id, next_id, remap);
            let vt = renumber(&v.field_type, next_id, remap);
            Type::Map(MapType::new(
                Arc::new(NestedField::map_key_element(kid, kt)),
                Arc::new(NestedField::map_value_element(vid, vt, v.required)),
            ))
        }
    }
}

/// The type a column both writers gave a type must have: theirs, widened where ours is wider.
fn merge_type(
    theirs: &Type,
    ours: &Type,
    next_id: &mut i32,
    remap: &mut HashMap<i32, i32>,
    name: &str,
) -> Result<Type> {
    use PrimitiveType as P;
    Ok(match (theirs, ours) {
        (Type::Primitive(t), Type::Primitive(o)) => Type::Primitive(match (t, o) {
            (t, o) if t == o => t.clone(),
            (P::Int, P::Long) => P::Long,
            (P::Float, P::Double) => P::Double,
            (P::Long, P::Int) | (P::Double, P::Float) => t.clone(),
            (
                P::Decimal {
                    precision: tp,
                    scale: ts,
                },
                P::Decimal {
                    precision: op,
                    scale: os,
                },
            ) if ts == os => P::Decimal {
                precision: *tp.max(op),
                scale: *ts,
            },
            _ => return Err(conflict(name, theirs, ours)),
        }),
        (Type::Struct(t), Type::Struct(o)) => Type::Struct(StructType::new(merge_struct(
            t,
            o,
            next_id,
            remap,
            &format!("{name}."),
        )?)),
        (Type::List(t), Type::List(o)) => {
            let (te, oe) = (&t.element_field, &o.element_field);
            if te.id != oe.id {
                remap.insert(oe.id, te.id);
            }
            let ty = merge_type(
                &te.field_type,
                &oe.field_type,
                next_id,
                remap,
                &format!("{name}.element"),
            )?;
            Type::List(ListType::new(Arc::new(NestedField::list_element(
                te.id,
                ty,
                te.required && oe.required,
            ))))
        }
        (Type::Map(t), Type::Map(o)) => {
            for (a, b) in [
                (&t.key_field, &o.key_field),
                (&t.value_field, &o.value_field),
            ] {
                if a.id != b.id {
                    remap.insert(b.id, a.id);
                }
            }
            let key = merge_type(
                &t.key_field.field_type,
                &o.key_field.field_type,
                next_id,
                remap,
                &format!("{name}.key"),
            )?;
            let value = merge_type(
                &t.value_field.field_type,
                &o.value_field.field_type,
                next_id,
                remap,
                &format!("{name}.value"),
            )?;
            Type::Map(MapType::new(
                Arc::new(NestedField::map_key_element(t.key_field.id, key)),
                Arc::new(NestedField::map_value_element(
                    t.value_field.id,
                    value,
                    t.value_field.required && o.value_field.required,
                )),
            ))
        }
        _ => return Err(conflict(name, theirs, ours)),
    })
}

fn conflict(name: &str, theirs: &Type, ours: &Type) -> Error {
    use crate::catalog::schema::type_name;
    Error::Plan(format!(
        "column '{name}' became {} by another writer while this job made it {}; the two \
         cannot be merged",
        type_name(theirs),
        type_name(ours)
    ))
}

/// `spec` with its source columns renumbered as `remap` says.
pub fn remap_spec(
    spec: &UnboundPartitionSpec,
    remap: &HashMap<i32, i32>,
) -> Result<UnboundPartitionSpec> {
    let fields: Vec<UnboundPartitionField> = spec
        .fields()
        .iter()
        .map(|f| UnboundPartitionField {
            source_id: remap.get(&f.source_id).copied().unwrap_or(f.source_id),
            ..f.clone()
        })
        .collect();
    Ok(UnboundPartitionSpec::builder()
        .add_partition_fields(fields)?
        .build())
}

/// Rewrite the data files at `paths` (written for another version of the table) against
/// `staged`'s schema and default spec: read back, columns matched by name. Returns the new
/// files.
pub async fn rewrite_files(staged: &Table, paths: &[String]) -> Result<Vec<DataFile>> {
    let mut writer = TableWriter::try_new(staged)?;
    let schema = staged.metadata().current_schema();
    for path in paths {
        let bytes = staged.file_io().new_input(path)?.read().await?;
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
            .and_then(|b| b.build())
            .map_err(|e| Error::Internal(format!("reading {path}: {e}")))?;
        for batch in reader {
            let batch = batch.map_err(|e| Error::Internal(format!("reading {path}: {e}")))?;
            writer.write(conform(schema, &batch)?).await?;
        }
    }
    writer.close().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn long(id: i32, name: &str) -> NestedFieldRef {
        Arc::new(NestedField::optional(
            id,
            name,
            Type::Primitive(PrimitiveType::Long),
        ))
    }

    fn schema(fields: Vec<NestedFieldRef>) -> Schema {
        Schema::builder().with_fields(fields).build().unwrap()
    }

    #[test]
    fn our_new_columns_take_fresh_ids_and_shared_ones_theirs() {
        // From {1 id}: they added a (2) and s.x (3, 4); we added b (2) and s.y (3, 4).
        let s = |x: &str, id: i32, inner: i32| {
            Arc::new(NestedField::optional(
                id,
                "s",
                Type::Struct(StructType::new(vec![long(inner, x)])),
            ))
        };
        let theirs = schema(vec![long(1, "id"), long(2, "a"), s("x", 3, 4)]);
        let ours = schema(vec![long(1, "id"), long(2, "b"), s("y", 3, 4)]);
        let m = merge_schemas(&theirs, &ours, 4).unwrap();
        assert_eq!(
            m.schema.to_string(),
            schema(vec![
                long(1, "id"),
                long(2, "a"),
                Arc::new(NestedField::optional(
                    3,
                    "s",
                    Type::Struct(StructType::new(vec![long(4, "x"), long(6, "y")]))
                )),
                long(5, "b"),
            ])
            .to_string()
        );
        assert_eq!(m.remap, HashMap::from([(2, 5), (4, 6)]));
    }

    #[test]
    fn types_widen_and_conflicts_say_so() {
        let int = |id, name: &str| {
            Arc::new(NestedField::optional(
                id,
                name,
                Type::Primitive(PrimitiveType::Int),
            ))
        };
        let theirs = schema(vec![int(1, "n"), long(2, "s")]);
        let ours = schema(vec![long(1, "n"), long(2, "s")]);
        let m = merge_schemas(&theirs, &ours, 2).unwrap();
        assert_eq!(
            m.schema.field_by_name("n").unwrap().field_type.to_string(),
            "long"
        );
        assert!(m.remap.is_empty());
        let string = Arc::new(NestedField::optional(
            2,
            "s",
            Type::Primitive(PrimitiveType::String),
        ));
        let theirs = schema(vec![int(1, "n"), string]);
        let e = merge_schemas(&theirs, &ours, 2).unwrap_err().to_string();
        assert!(e.contains("column 's' became string"), "{e}");
    }
}
