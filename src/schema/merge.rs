//! Merging a checkpoint's schema change with one another writer committed first.
//!
//! Two writers that evolve one table from the same schema both give their new columns the
//! next free field ids, so the same id can name different columns. The second to commit
//! merges by name: its columns the table now has take the table's ids (widened if it needs
//! wider types); the others get fresh ids after the table's last one. When that changes an
//! id its data files were written with, the files are rewritten against the merged schema
//! (`checkpoint::rewrite`) before the commit; the old ones are deleted after it. A column
//! both gave types that do not merge keeps theirs: our rows whose values its type takes as a
//! new row's would be are written again, the others are dead letters ([`Merged::conflicts`]).
//!
//! ```text
//! base: {1 id}      theirs (committed): {1 id, 2 a}      ours (pending): {1 id, 2 b}
//! merged: {1 id, 2 a, 3 b}    our files: field 2 -> 3, rewritten
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use iceberg::spec::{
    ListType, MapType, NestedField, NestedFieldRef, Schema, StructType, Type,
    UnboundPartitionField, UnboundPartitionSpec,
};

use super::promote::widest;
use super::types::type_name;
use crate::error::Result;

/// The merged schema and how our field ids map to its ids.
#[derive(Debug)]
pub struct Merged {
    pub schema: Schema,
    /// Our field id -> the merged schema's id, for every id that differs.
    pub remap: HashMap<i32, i32>,
    /// Columns both gave types that do not merge (another writer made `x` a string, we a
    /// long): theirs, committed first, is kept; why, for each. Our rows with values its type
    /// does not take (as `schema::evolve` rules for new rows) are dead letters with this
    /// reason.
    pub conflicts: Vec<String>,
}

/// Merge `ours` (a schema evolved from an older one of the table) into `theirs` (the table's
/// current schema, whose highest field id ever is `last_column_id`).
pub fn merge_schemas(theirs: &Schema, ours: &Schema, last_column_id: i32) -> Result<Merged> {
    let mut ids = Ids {
        next: last_column_id,
        remap: HashMap::new(),
        conflicts: Vec::new(),
    };
    let fields = merge_struct(theirs.as_struct(), ours.as_struct(), &mut ids, "")?;
    let schema = Schema::builder()
        .with_fields(fields)
        .with_identifier_field_ids(theirs.identifier_field_ids())
        .build()?;
    Ok(Merged {
        schema,
        remap: ids.remap,
        conflicts: ids.conflicts,
    })
}

/// What a merge keeps track of as it goes: the next free field id, our ids that change,
/// and the conflicts it settled.
struct Ids {
    next: i32,
    remap: HashMap<i32, i32>,
    conflicts: Vec<String>,
}

fn merge_struct(
    theirs: &StructType,
    ours: &StructType,
    ids: &mut Ids,
    path: &str,
) -> Result<Vec<NestedFieldRef>> {
    let mut out: Vec<NestedFieldRef> = theirs.fields().to_vec();
    for f in ours.fields() {
        let name = format!("{path}{}", f.name);
        match out.iter().position(|t| t.name == f.name) {
            Some(i) => {
                let t = out[i].clone();
                if t.id != f.id {
                    ids.remap.insert(f.id, t.id);
                }
                let ty = merge_type(&t.field_type, &f.field_type, ids, &name)?;
                let required = t.required && f.required;
                out[i] = Arc::new(field(t.id, &t.name, ty, required, t.doc.clone()));
            }
            None => {
                // A column only we have: fresh ids for it and everything inside it.
                let id = fresh(f.id, &mut ids.next, &mut ids.remap);
                let ty = renumber(&f.field_type, &mut ids.next, &mut ids.remap);
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
fn merge_type(theirs: &Type, ours: &Type, ids: &mut Ids, name: &str) -> Result<Type> {
    Ok(match (theirs, ours) {
        (Type::Primitive(t), Type::Primitive(o)) => match widest(t, o) {
            Some(w) => Type::Primitive(w),
            None => return Ok(conflict(name, theirs, ours, ids)),
        },
        (Type::Struct(t), Type::Struct(o)) => Type::Struct(StructType::new(merge_struct(
            t,
            o,
            ids,
            &format!("{name}."),
        )?)),
        (Type::List(t), Type::List(o)) => {
            let (te, oe) = (&t.element_field, &o.element_field);
            if te.id != oe.id {
                ids.remap.insert(oe.id, te.id);
            }
            let ty = merge_type(
                &te.field_type,
                &oe.field_type,
                ids,
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
                    ids.remap.insert(b.id, a.id);
                }
            }
            let (tk, ok) = (&t.key_field.field_type, &o.key_field.field_type);
            let key = merge_type(tk, ok, ids, &format!("{name}.key"))?;
            let (tv, ov) = (&t.value_field.field_type, &o.value_field.field_type);
            let value = merge_type(tv, ov, ids, &format!("{name}.value"))?;
            Type::Map(MapType::new(
                Arc::new(NestedField::map_key_element(t.key_field.id, key)),
                Arc::new(NestedField::map_value_element(
                    t.value_field.id,
                    value,
                    t.value_field.required && o.value_field.required,
                )),
            ))
        }
        _ => conflict(name, theirs, ours, ids),
    })
}

/// Their type, for a column whose two types do not merge; the conflict is noted.
fn conflict(name: &str, theirs: &Type, ours: &Type, ids: &mut Ids) -> Type {
    ids.conflicts.push(format!(
        "column '{name}' became {} by another writer while this job made it {}",
        type_name(theirs),
        type_name(ours)
    ));
    theirs.clone()
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

#[cfg(test)]
mod tests {
    use super::*;
    use iceberg::spec::PrimitiveType;
    use proptest::prelude::*;

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
    fn types_widen_and_conflicts_keep_theirs() {
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
        let m = merge_schemas(&theirs, &ours, 2).unwrap();
        // Theirs, committed first, stays; the conflict says why our values may not fit.
        assert_eq!(
            m.schema.field_by_name("s").unwrap().field_type.to_string(),
            "string"
        );
        assert_eq!(m.conflicts.len(), 1);
        assert!(
            m.conflicts[0]
                .contains("column 's' became string by another writer while this job made it long"),
            "{:?}",
            m.conflicts
        );
    }

    /// Columns named from `names`, typed from a few primitives, ids from `first`.
    fn columns(names: Vec<(String, u8)>, first: i32) -> Vec<NestedFieldRef> {
        let types = [
            PrimitiveType::Int,
            PrimitiveType::Long,
            PrimitiveType::Double,
            PrimitiveType::String,
        ];
        names
            .into_iter()
            .enumerate()
            .map(|(i, (name, t))| {
                Arc::new(NestedField::optional(
                    first + i as i32,
                    &name,
                    Type::Primitive(types[t as usize % types.len()].clone()),
                ))
            })
            .collect()
    }

    /// The merged schema's columns as `name: type`, sorted (ids and order aside).
    fn columns_of(s: &Schema) -> Vec<String> {
        let mut out: Vec<String> = s
            .as_struct()
            .fields()
            .iter()
            .map(|f| format!("{}: {}", f.name, f.field_type))
            .collect();
        out.sort();
        out
    }

    proptest! {
        /// Two writers that each added their own columns to {1 id}: merging either into the
        /// other gives the same columns, every id unique.
        #[test]
        fn merging_disjoint_additions_commutes(
            added in proptest::collection::btree_map("[a-h]{1,3}", (any::<bool>(), 0u8..4), 0..8)
        ) {
            let (a, b): (Vec<_>, Vec<_>) = added.into_iter().partition(|(_, (side, _))| *side);
            let strip = |v: Vec<(String, (bool, u8))>| -> Vec<(String, u8)> {
                v.into_iter().map(|(n, (_, t))| (n, t)).collect()
            };
            let (a, b) = (strip(a), strip(b));
            let base = long(1, "id");
            let mut theirs = vec![base.clone()];
            theirs.extend(columns(a.clone(), 2));
            let mut ours = vec![base];
            ours.extend(columns(b.clone(), 2));
            let (theirs, ours) = (schema(theirs), schema(ours));
            let last = 1 + a.len().max(b.len()) as i32;
            let one = merge_schemas(&theirs, &ours, last).unwrap().schema;
            let other = merge_schemas(&ours, &theirs, last).unwrap().schema;
            prop_assert_eq!(columns_of(&one), columns_of(&other));
            prop_assert_eq!(one.as_struct().fields().len(), 1 + a.len() + b.len());
            let mut ids: Vec<i32> = one.as_struct().fields().iter().map(|f| f.id).collect();
            ids.sort_unstable();
            ids.dedup();
            prop_assert_eq!(ids.len(), 1 + a.len() + b.len());
        }
    }
}
