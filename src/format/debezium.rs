//! Debezium change events (`'format' = 'debezium-json'` and `'debezium-avro-confluent'`,
//! Flink's names): each record is one change of one row of a database table, decoded into
//! its columns with whether it deletes the row (the column `schema::CHANGE_COLUMN`).
//!
//! ```text
//! {"before": {...}, "after": {...}, "op": "c"|"r"|"u"|"d", "source": {...}, "ts_ms": ...}
//!   (or wrapped as {"schema": {...}, "payload": {...}} by Kafka Connect's JsonConverter)
//! c, r (snapshot), u  -> the row `after`, an upsert of its key
//! d                   -> the row `before` (its key columns at least), a delete of its key
//! an empty record     -> nothing (the tombstone Debezium sends after a delete)
//! t (truncate), m (message), anything else -> a bad record, with why
//! ```

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, RecordBatch, StringArray, StructArray,
};
use datafusion::arrow::compute::interleave;
use datafusion::arrow::datatypes::{DataType, Schema};
use serde_json::Value;

use super::{Decoded, Group};
use crate::error::{Error, Result};
use crate::schema::changes::{Changes, SOURCE_TABLE_COLUMN, with_change_columns, with_columns};

/// Why an update or delete without a message key is not applied.
pub const NO_KEY: &str = "an update or delete of a row whose source table has no primary key \
     (the message has no key): which row it changes cannot be told";

/// What one Debezium record says.
#[derive(Debug, PartialEq)]
pub enum Change {
    /// The row (a JSON object), whether the change deletes it, whether it changes a row
    /// that was there before (an update or a delete: only a key can say which), and the
    /// source table it is a row of (`source.table`), if the event says.
    Row {
        json: Vec<u8>,
        delete: bool,
        existing: bool,
        table: Option<String>,
    },
    /// Nothing to apply: a tombstone.
    Skip,
}

/// The names of the key columns a Debezium message key holds (`{"id": 1}`, or wrapped as
/// `{"schema": ..., "payload": {...}}` by Kafka Connect's JsonConverter), joined by `,`;
/// `None` for a null key (a source table without a primary key).
pub fn key_names(key: &[u8]) -> std::result::Result<Option<String>, String> {
    let text = std::str::from_utf8(key).map_err(|_| "the message key is not UTF-8 JSON")?;
    if text.trim().is_empty() || text.trim() == "null" {
        return Ok(None);
    }
    let value: Value =
        serde_json::from_str(text).map_err(|e| format!("the message key is not JSON ({e})"))?;
    let value = match value {
        Value::Object(mut o) if o.contains_key("payload") && o.contains_key("schema") => {
            o.remove("payload").unwrap_or(Value::Null)
        }
        other => other,
    };
    match value {
        Value::Null => Ok(None),
        Value::Object(o) if !o.is_empty() => {
            Ok(Some(o.keys().cloned().collect::<Vec<_>>().join(",")))
        }
        _ => Err("the message key is not a JSON object of the key columns".into()),
    }
}

/// The change `record` holds, or why it holds none floe applies.
pub fn change(record: &[u8]) -> std::result::Result<Change, String> {
    let text = std::str::from_utf8(record).map_err(|e| e.to_string())?;
    if text.trim().is_empty() || text.trim() == "null" {
        return Ok(Change::Skip);
    }
    let value: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let Value::Object(mut event) = value else {
        return Err("a Debezium event is a JSON object".into());
    };
    // Kafka Connect's JsonConverter with schemas.enable wraps the event.
    if event.contains_key("payload") && event.contains_key("schema") {
        match event.remove("payload") {
            Some(Value::Object(inner)) => event = inner,
            Some(Value::Null) => return Ok(Change::Skip),
            _ => return Err("the event's payload is not a JSON object".into()),
        }
    }
    let op = match event.get("op") {
        Some(Value::String(op)) => op.clone(),
        _ => return Err("the event has no 'op' (c, r, u or d)".into()),
    };
    let (side, delete) = match op.as_str() {
        "c" | "r" | "u" => ("after", false),
        "d" => ("before", true),
        "t" => {
            return Err(
                "a truncate event ('op' = 't'): floe does not empty tables on a change stream's \
                 say; DELETE FROM the table to do it"
                    .into(),
            );
        }
        other => {
            return Err(format!(
                "unknown Debezium op '{other}' (c, r, u and d are applied)"
            ));
        }
    };
    let table = event
        .get("source")
        .and_then(|s| s.get("table"))
        .and_then(Value::as_str)
        .map(str::to_string);
    match event.remove(side) {
        Some(row @ Value::Object(_)) => Ok(Change::Row {
            json: serde_json::to_vec(&row).map_err(|e| e.to_string())?,
            delete,
            existing: matches!(op.as_str(), "u" | "d"),
            table,
        }),
        _ => Err(format!(
            "a '{op}' event without '{side}' (a delete needs the key in 'before': the table's \
             REPLICA IDENTITY, or Debezium's tombstones only, cannot say which row)"
        )),
    }
}

/// What a record's message key says about its source table's key.
#[derive(Debug, Clone, PartialEq)]
pub enum MessageKey {
    /// No key: the source table has no primary key.
    Absent,
    /// A key floe cannot read the column names of.
    Unknown,
    /// The key columns' names, joined by `,`.
    Names(String),
}

/// Decoded Avro envelopes (`before`, `after`, `op`, `source`, ...) as the rows they change:
/// the fields of `after` (of `before` for a delete) as columns, then `__source_table` (the
/// envelope's `source.table`, where it has one), with whether each deletes its key and, given
/// the records' message keys (`keys`, by record index), the key columns' names. Events floe
/// does not apply join the errors, by their record's index.
pub fn rows_of_envelopes(decoded: Decoded, keys: Option<&[MessageKey]>) -> Result<Decoded> {
    let mut errors = decoded.errors;
    let mut groups = Vec::new();
    for group in decoded.groups {
        let (group, bad) = rows_of(group, keys)?;
        errors.extend(bad);
        groups.extend(group);
    }
    errors.sort_by_key(|(i, _)| *i);
    Ok(Decoded { groups, errors })
}

/// Records' errors: each record's index with why it was not applied.
type Errors = Vec<(usize, String)>;

fn rows_of(group: Group, keys: Option<&[MessageKey]>) -> Result<(Option<Group>, Errors)> {
    let batch = &group.batch;
    let fail = |e: String| Error::Internal(format!("Debezium Avro events: {e}"));
    let envelope = |name: &str| {
        batch.column_by_name(name).cloned().ok_or_else(|| {
            format!("the writer schema is not a Debezium envelope: it has no '{name}' field")
        })
    };
    let (op, before, after) = match (envelope("op"), envelope("before"), envelope("after")) {
        (Ok(op), Ok(before), Ok(after)) => (op, before, after),
        (Err(why), _, _) | (_, Err(why), _) | (_, _, Err(why)) => {
            let bad = group.rows.iter().map(|&i| (i, why.clone())).collect();
            return Ok((None, bad));
        }
    };
    let (Some(op), Some(before), Some(after)) = (
        op.as_string_opt::<i32>(),
        before.as_struct_opt(),
        after.as_struct_opt(),
    ) else {
        let why = "the envelope's 'op' is not a string or 'before'/'after' not records".to_string();
        let bad = group.rows.iter().map(|&i| (i, why.clone())).collect();
        return Ok((None, bad));
    };
    let mut keep = Vec::new();
    let mut sides = Vec::new();
    let mut deletes = Vec::new();
    let mut bad = Vec::new();
    for row in 0..batch.num_rows() {
        let input = group.rows[row];
        let (side, delete) = match op.is_valid(row).then(|| op.value(row)) {
            Some("c" | "r" | "u") => (1, false),
            Some("d") => (0, true),
            Some("t") => {
                bad.push((
                    input,
                    "a truncate event ('op' = 't'): floe does not empty tables \
                                   on a change stream's say; DELETE FROM the table to do it"
                        .to_string(),
                ));
                continue;
            }
            other => {
                bad.push((
                    input,
                    format!("unknown Debezium op {other:?} (c, r, u and d are applied)"),
                ));
                continue;
            }
        };
        let chosen: &StructArray = if side == 0 { before } else { after };
        if chosen.is_null(row) {
            let name = if side == 0 { "before" } else { "after" };
            bad.push((
                input,
                format!("a '{}' event without '{name}'", op.value(row)),
            ));
            continue;
        }
        if keys.is_some_and(|k| k[input] == MessageKey::Absent)
            && matches!(op.value(row), "u" | "d")
        {
            bad.push((input, NO_KEY.to_string()));
            continue;
        }
        keep.push(row);
        sides.push((side, row));
        deletes.push(delete);
    }
    if keep.is_empty() {
        return Ok((None, bad));
    }
    if before.data_type() != after.data_type() {
        let why = "the envelope's 'before' and 'after' have different types".to_string();
        return Ok((None, group.rows.iter().map(|&i| (i, why.clone())).collect()));
    }
    let rows = interleave(&[before as &dyn Array, after as &dyn Array], &sides)
        .map_err(|e| fail(e.to_string()))?;
    let rows = rows.as_struct();
    let DataType::Struct(fields) = rows.data_type() else {
        return Err(fail("not a struct".into()));
    };
    let schema = Arc::new(Schema::new(fields.clone()));
    let columns = rows.columns().to_vec();
    let mut data = RecordBatch::try_new(schema, columns).map_err(|e| fail(e.to_string()))?;
    // The source table, for routing.
    let tables = batch
        .column_by_name("source")
        .and_then(|s| s.as_struct_opt())
        .and_then(|s| s.column_by_name("table"))
        .and_then(|t| t.as_string_opt::<i32>());
    if let Some(tables) = tables {
        let kept: ArrayRef = Arc::new(StringArray::from_iter(
            keep.iter()
                .map(|&r| tables.is_valid(r).then(|| tables.value(r))),
        ));
        data = with_columns(
            &data,
            vec![(SOURCE_TABLE_COLUMN, DataType::Utf8, true, kept)],
        )?;
    }
    let changes = Changes {
        deletes: BooleanArray::from(deletes),
        key_names: keys.map(|k| {
            StringArray::from_iter(keep.iter().map(|&r| match &k[group.rows[r]] {
                MessageKey::Names(n) => Some(n.as_str()),
                _ => None,
            }))
        }),
        seq: None,
    };
    let batch = with_change_columns(&data, &changes)?;
    let rows = keep.iter().map(|&r| group.rows[r]).collect();
    Ok((Some(Group { batch, rows }), bad))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(json: &str, delete: bool) -> (String, bool) {
        (json.to_string(), delete)
    }

    /// A change's row and whether it deletes.
    fn change(record: &[u8]) -> std::result::Result<(String, bool), String> {
        match super::change(record)? {
            Change::Row { json, delete, .. } => Ok((String::from_utf8(json).unwrap(), delete)),
            Change::Skip => Err("skipped".into()),
        }
    }

    #[test]
    fn events_name_their_source_table_and_keys_their_columns() {
        let u = br#"{"before": {"id": 1}, "after": {"id": 1}, "op": "u",
                     "source": {"db": "inventory", "table": "customers"}}"#;
        let Change::Row {
            existing, table, ..
        } = super::change(u).unwrap()
        else {
            panic!("a row")
        };
        assert!(existing);
        assert_eq!(table.as_deref(), Some("customers"));
        let Change::Row {
            existing, table, ..
        } = super::change(br#"{"after": {"id": 1}, "op": "r"}"#).unwrap()
        else {
            panic!("a row")
        };
        assert!(!existing && table.is_none());
        assert_eq!(key_names(br#"{"id": 1}"#).unwrap().as_deref(), Some("id"));
        let wrapped = br#"{"schema": {}, "payload": {"a": 1, "b": "x"}}"#;
        assert_eq!(key_names(wrapped).unwrap().as_deref(), Some("a,b"));
        assert_eq!(key_names(b"null").unwrap(), None);
        assert!(key_names(b"7").unwrap_err().contains("not a JSON object"));
    }

    #[test]
    fn inserts_updates_and_deletes() {
        let c = br#"{"before": null, "after": {"id": 1, "name": "a"}, "op": "c", "ts_ms": 1}"#;
        assert_eq!(change(c).unwrap(), row(r#"{"id":1,"name":"a"}"#, false));
        let u = br#"{"before": {"id": 1}, "after": {"id": 1, "name": "b"}, "op": "u"}"#;
        assert_eq!(change(u).unwrap(), row(r#"{"id":1,"name":"b"}"#, false));
        let d = br#"{"before": {"id": 1, "name": "b"}, "after": null, "op": "d"}"#;
        assert_eq!(change(d).unwrap(), row(r#"{"id":1,"name":"b"}"#, true));
        let r = br#"{"after": {"id": 2}, "op": "r"}"#;
        assert_eq!(change(r).unwrap(), row(r#"{"id":2}"#, false));
        // Wrapped by the JsonConverter, with its schema.
        let w = br#"{"schema": {"type": "struct"}, "payload": {"after": {"id": 3}, "op": "c"}}"#;
        assert_eq!(change(w).unwrap(), row(r#"{"id":3}"#, false));
    }

    #[test]
    fn tombstones_are_skipped_and_the_rest_named() {
        assert_eq!(super::change(b"").unwrap(), Change::Skip);
        assert_eq!(super::change(b"null").unwrap(), Change::Skip);
        assert!(change(br#"{"op": "t"}"#).unwrap_err().contains("truncate"));
        assert!(
            change(br#"{"op": "m"}"#)
                .unwrap_err()
                .contains("unknown Debezium op 'm'")
        );
        assert!(
            change(br#"{"after": {"id": 1}}"#)
                .unwrap_err()
                .contains("no 'op'")
        );
        assert!(
            change(br#"{"op": "d", "before": null}"#)
                .unwrap_err()
                .contains("without 'before'")
        );
        assert!(change(b"[1]").unwrap_err().contains("JSON object"));
        assert!(change(b"{nope").is_err());
    }

    /// An Avro-decoded envelope batch: `before`/`after` records of (id, name), and `op`.
    fn envelopes(ops: &[Option<&str>], before: &[Option<i64>], after: &[Option<i64>]) -> Group {
        use datafusion::arrow::array::{Int64Array, StringArray};
        use datafusion::arrow::buffer::NullBuffer;
        use datafusion::arrow::datatypes::{Field, Fields};
        let fields = Fields::from(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("name", DataType::Utf8, true),
        ]);
        let side = |ids: &[Option<i64>], tag: &str| {
            let names: Vec<Option<String>> =
                ids.iter().map(|i| i.map(|i| format!("{tag}{i}"))).collect();
            StructArray::new(
                fields.clone(),
                vec![
                    Arc::new(Int64Array::from(ids.to_vec())),
                    Arc::new(StringArray::from(names)),
                ],
                Some(NullBuffer::from(
                    ids.iter().map(Option::is_some).collect::<Vec<_>>(),
                )),
            )
        };
        let schema = Arc::new(Schema::new(vec![
            Field::new("before", DataType::Struct(fields.clone()), true),
            Field::new("after", DataType::Struct(fields.clone()), true),
            Field::new("op", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(side(before, "b")),
                Arc::new(side(after, "a")),
                Arc::new(StringArray::from(ops.to_vec())),
            ],
        )
        .unwrap();
        Group {
            rows: (10..10 + ops.len()).collect(),
            batch,
        }
    }

    #[test]
    fn avro_envelopes_become_the_rows_they_change() {
        let group = envelopes(
            &[
                Some("c"),
                Some("u"),
                Some("d"),
                Some("t"),
                Some("d"),
                Some("r"),
            ],
            &[None, Some(2), Some(3), None, None, None],
            &[Some(1), Some(2), None, None, None, Some(6)],
        );
        let decoded = rows_of_envelopes(
            Decoded {
                groups: vec![group],
                errors: vec![(0, "earlier".into())],
            },
            None,
        )
        .unwrap();
        let g = &decoded.groups[0];
        assert_eq!(
            g.rows,
            vec![10, 11, 12, 15],
            "each row keeps its record's index"
        );
        let names: Vec<&str> = g
            .batch
            .column(1)
            .as_string::<i32>()
            .iter()
            .flatten()
            .collect();
        assert_eq!(
            names,
            ["a1", "a2", "b3", "a6"],
            "after, or before for a delete"
        );
        let deletes: Vec<bool> = g.batch.column(2).as_boolean().iter().flatten().collect();
        assert_eq!(deletes, [false, false, true, false]);
        let bad: Vec<usize> = decoded.errors.iter().map(|(i, _)| *i).collect();
        assert_eq!(bad, vec![0, 13, 14]);
        assert!(decoded.errors[1].1.contains("truncate"));
        assert!(decoded.errors[2].1.contains("a 'd' event without 'before'"));
    }

    #[test]
    fn a_writer_schema_that_is_no_envelope_is_named() {
        let mut group = envelopes(&[Some("c")], &[None], &[Some(1)]);
        group.batch = group.batch.project(&[0, 1]).unwrap();
        let decoded = rows_of_envelopes(
            Decoded {
                groups: vec![group],
                errors: vec![],
            },
            None,
        )
        .unwrap();
        assert!(decoded.groups.is_empty());
        assert!(
            decoded.errors[0].1.contains("no 'op' field"),
            "{:?}",
            decoded.errors
        );
    }
}
