//! Debezium change events in JSON (`'format' = 'debezium-json'`, Flink's name): each record
//! is one change of one row of a database table, decoded into the declared columns with
//! whether it deletes the row (the column `schema::CHANGE_COLUMN`).
//!
//! ```text
//! {"before": {...}, "after": {...}, "op": "c"|"r"|"u"|"d", "source": {...}, "ts_ms": ...}
//!   (or wrapped as {"schema": {...}, "payload": {...}} by Kafka Connect's JsonConverter)
//! c, r (snapshot), u  -> the row `after`, an upsert of its key
//! d                   -> the row `before` (its key columns at least), a delete of its key
//! an empty record     -> nothing (the tombstone Debezium sends after a delete)
//! t (truncate), m (message), anything else -> a bad record, with why
//! ```

use serde_json::Value;

/// What one Debezium record says.
#[derive(Debug, PartialEq)]
pub enum Change {
    /// The row (a JSON object), and whether the change deletes it.
    Row { json: Vec<u8>, delete: bool },
    /// Nothing to apply: a tombstone.
    Skip,
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
    match event.remove(side) {
        Some(row @ Value::Object(_)) => Ok(Change::Row {
            json: serde_json::to_vec(&row).map_err(|e| e.to_string())?,
            delete,
        }),
        _ => Err(format!(
            "a '{op}' event without '{side}' (a delete needs the key in 'before': the table's \
             REPLICA IDENTITY, or Debezium's tombstones only, cannot say which row)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(json: &str, delete: bool) -> Change {
        Change::Row {
            json: json.as_bytes().to_vec(),
            delete,
        }
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
        assert_eq!(change(b"").unwrap(), Change::Skip);
        assert_eq!(change(b"null").unwrap(), Change::Skip);
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
}
