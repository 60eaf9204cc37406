//! Kafka messages into source rows: the payloads through the format's [`Decoder`], the
//! metadata columns from the messages, and every message that cannot be a row as a
//! [`BadRecord`] that says where it is (`<topic>:<partition>`, offset) and why.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanArray, Int32Array, Int64Array, RecordBatch, StringArray,
    TimestampMicrosecondArray,
};
use datafusion::arrow::datatypes::SchemaRef;

use super::UpsertKey;
use super::{
    KEY_COLUMN, OFFSET_COLUMN, PARTITION_COLUMN, TIMESTAMP_COLUMN, TOPIC_COLUMN, TopicPartition,
};
use crate::connector::{BadRecord, RecordOrigins, source_rows};
use crate::error::Reject;
use crate::error::Result;
use crate::format::Decoder;
use crate::schema::changes::{split_changes, with_change_columns, with_changes};

/// One message, copied out of librdkafka.
#[derive(Debug, Clone)]
pub struct Raw {
    /// Shared by the messages of a partition a poll took.
    pub tp: Arc<TopicPartition>,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub timestamp_ms: Option<i64>,
}

/// Decode `raw` into rows of `schema` (one batch per record shape) and rejects (sorted by
/// partition and offset).
/// An upsert topic's records (`upsert`) upsert their key, and its tombstones delete it: they
/// decode as the key alone, and the rows carry which they are (`schema::CHANGE_COLUMN`).
pub async fn decode(
    schema: &SchemaRef,
    decoder: &Decoder,
    upsert: Option<&UpsertKey>,
    raw: Vec<Raw>,
) -> Result<(Vec<RecordBatch>, Vec<BadRecord>, RecordOrigins<Raw>)> {
    let check_key = schema.field_with_name(KEY_COLUMN).is_ok();
    let mut rejects = Vec::new();
    let mut good = Vec::with_capacity(raw.len());
    let reject = |r: &Raw, why: String| BadRecord {
        partition: r.tp.to_string(),
        offset: u64::try_from(r.offset).unwrap_or_default(),
        payload: r.payload.clone().unwrap_or_default(),
        reject: Reject::new(format!("{} offset {}: {why}", r.tp, r.offset)),
    };
    // A change stream's tombstones (a key with no value, after a delete) are no change.
    let tombstones = decoder.format().is_changes();
    // An upsert topic's tombstones delete their key: decoded from the key.
    let mut keys: HashMap<usize, Vec<u8>> = HashMap::new();
    for (i, r) in raw.iter().enumerate() {
        match (&r.payload, &r.key) {
            (None, _) if tombstones => good.push(i),
            (None, Some(key)) if upsert.is_some() => match key_row(upsert, key) {
                Ok(row) => {
                    keys.insert(i, row);
                    good.push(i);
                }
                Err(why) => rejects.push(reject(r, why)),
            },
            (None, None) if upsert.is_some() => rejects.push(reject(
                r,
                "a tombstone without a key deletes nothing".into(),
            )),
            (None, _) => rejects.push(reject(r, "the record has no value (a null payload)".into())),
            (Some(_), Some(key)) if check_key && std::str::from_utf8(key).is_err() => {
                let why = "the record's key is not UTF-8 text, as _key STRING needs";
                rejects.push(reject(r, why.into()))
            }
            _ => good.push(i),
        }
    }
    let records: Vec<&[u8]> = good
        .iter()
        .map(|&i| match keys.get(&i) {
            Some(row) => row.as_slice(),
            None => raw[i].payload.as_deref().unwrap_or_default(),
        })
        .collect();
    // A change stream's message keys name its source tables' keys.
    let message_keys: Option<Vec<Option<&[u8]>>> =
        tombstones.then(|| good.iter().map(|&i| raw[i].key.as_deref()).collect());
    let mut decoded = decoder
        .decode_keyed(&records, message_keys.as_deref())
        .await?;
    if upsert.is_some() {
        for group in &mut decoded.groups {
            let deletes = BooleanArray::from_iter(
                group
                    .rows
                    .iter()
                    .map(|&j| Some(keys.contains_key(&good[j]))),
            );
            group.batch = with_changes(&group.batch, Arc::new(deletes))?;
        }
    }
    // A key's changes are ordered by their offsets (they are all in one partition): the
    // groups the records decode into (one per shape or writer schema) are not in order.
    for group in &mut decoded.groups {
        let (rows, changes) = split_changes(group.batch.clone())?;
        if let Some(mut changes) = changes {
            let offsets = group.rows.iter().map(|&j| raw[good[j]].offset);
            changes.seq = Some(Int64Array::from_iter_values(offsets));
            group.batch = with_change_columns(&rows, &changes)?;
        }
    }
    for (j, e) in &decoded.errors {
        rejects.push(reject(
            &raw[good[*j]],
            format!("cannot decode the record: {e}"),
        ));
    }
    let batches = source_rows(schema, &decoded, decoder.is_inferred(), |name, rows| {
        let rows: Vec<&Raw> = rows.iter().map(|&j| &raw[good[j]]).collect();
        Some(match name {
            KEY_COLUMN => {
                Arc::new(StringArray::from_iter(rows.iter().map(|r| {
                    r.key.as_deref().and_then(|k| std::str::from_utf8(k).ok())
                }))) as ArrayRef
            }
            PARTITION_COLUMN => Arc::new(Int32Array::from_iter_values(
                rows.iter().map(|r| r.tp.partition),
            )),
            OFFSET_COLUMN => Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.offset))),
            TIMESTAMP_COLUMN => Arc::new(TimestampMicrosecondArray::from_iter(
                rows.iter()
                    .map(|r| r.timestamp_ms.and_then(|ms| ms.checked_mul(1000))),
            )),
            TOPIC_COLUMN => Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r.tp.topic.as_str()),
            )),
            _ => return None,
        })
    })?;
    rejects.sort_by(|a, b| (&a.partition, a.offset).cmp(&(&b.partition, b.offset)));
    let rows = decoded
        .group_rows()
        .into_iter()
        .map(|rows| rows.into_iter().map(|j| good[j]).collect())
        .collect();
    let origins = RecordOrigins::new(raw, rows, |r: &Raw| {
        let offset = u64::try_from(r.offset).ok()?;
        Some((
            r.tp.to_string(),
            offset,
            r.payload.clone().unwrap_or_default(),
        ))
    });
    Ok((batches, rejects, origins))
}

/// The row a tombstone with `key` deletes, as JSON for the value decoder: the key's JSON
/// object, or for `'key.format' = 'raw'` the key's text as the one key column.
fn key_row(upsert: Option<&UpsertKey>, key: &[u8]) -> std::result::Result<Vec<u8>, String> {
    let Some(u) = upsert else {
        return Err("not an upsert topic".into());
    };
    if u.raw {
        let text = std::str::from_utf8(key)
            .map_err(|_| "the tombstone's key is not UTF-8 text ('key.format' = 'raw')")?;
        let mut row = serde_json::Map::new();
        row.insert(u.columns[0].clone(), serde_json::Value::String(text.into()));
        return serde_json::to_vec(&row).map_err(|e| e.to_string());
    }
    match serde_json::from_slice::<serde_json::Value>(key) {
        Ok(serde_json::Value::Object(o)) if u.columns.iter().all(|c| o.contains_key(c)) => {
            Ok(key.to_vec())
        }
        _ => Err(format!(
            "the tombstone's key is not a JSON object with the key columns ({}); \
             'key.format' = 'raw' reads a key of one column as text",
            u.columns.join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::{DataType, Field, Int32Type, Int64Type, Schema, TimeUnit};

    use super::*;
    use crate::connector::data_schema;
    use crate::sql::Options;

    fn raw(partition: i32, offset: i64, key: Option<&[u8]>, payload: Option<&[u8]>) -> Raw {
        Raw {
            tp: Arc::new(TopicPartition::new("t", partition)),
            offset,
            key: key.map(<[u8]>::to_vec),
            payload: payload.map(<[u8]>::to_vec),
            timestamp_ms: Some(1_700_000_000_000 + offset),
        }
    }

    #[tokio::test]
    async fn rows_carry_metadata_and_bad_messages_are_rejects_with_their_place() {
        let schema: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("_key", DataType::Utf8, true),
            Field::new("_partition", DataType::Int32, true),
            Field::new("_offset", DataType::Int64, true),
            Field::new(
                "_timestamp",
                DataType::Timestamp(TimeUnit::Microsecond, None),
                true,
            ),
            Field::new("_topic", DataType::Utf8, true),
        ]));
        let data = data_schema(&schema, &super::super::metadata_columns()).unwrap();
        let mut o = Options::try_new("t", []).unwrap();
        let decoder = Decoder::try_new("json", &mut o, data).unwrap();
        let messages = [
            raw(0, 7, Some(b"a"), Some(br#"{"id": 1}"#)),
            raw(0, 8, None, None),
            raw(1, 3, Some(&[0xff]), Some(br#"{"id": 3}"#)),
            raw(1, 4, None, Some(br#"{"id": 4}"#)),
            raw(0, 9, Some(b"c"), Some(b"{oops")),
        ];
        let (batches, rejects, _) = decode(&schema, &decoder, None, messages.to_vec())
            .await
            .unwrap();
        let batch = crate::connector::concat(&batches);
        assert_eq!(batch.num_rows(), 2);
        assert_eq!(
            batch.column(0).as_primitive::<Int64Type>().values(),
            &[1, 4]
        );
        let keys: Vec<Option<&str>> = batch.column(1).as_string::<i32>().iter().collect();
        assert_eq!(keys, vec![Some("a"), None]);
        assert_eq!(
            batch.column(2).as_primitive::<Int32Type>().values(),
            &[0, 1]
        );
        assert_eq!(
            batch.column(3).as_primitive::<Int64Type>().values(),
            &[7, 4]
        );
        let ts = batch
            .column(4)
            .as_primitive::<datafusion::arrow::datatypes::TimestampMicrosecondType>();
        assert_eq!(ts.value(0), 1_700_000_000_007_000);
        assert_eq!(batch.column(5).as_string::<i32>().value(1), "t");
        let places: Vec<(&str, u64)> = rejects
            .iter()
            .map(|r| (r.partition.as_str(), r.offset))
            .collect();
        assert_eq!(places, vec![("t:0", 8), ("t:0", 9), ("t:1", 3)]);
        assert!(
            rejects[0]
                .reject
                .reason
                .starts_with("t:0 offset 8: the record has no value")
        );
        assert!(
            rejects[1]
                .reject
                .reason
                .contains("cannot decode the record")
        );
        assert_eq!(rejects[1].payload, b"{oops");
        assert!(rejects[2].reject.reason.contains("key is not UTF-8"));
    }

    #[tokio::test]
    async fn keys_are_not_checked_when_not_declared() {
        let schema: SchemaRef =
            Arc::new(Schema::new(vec![Field::new("v", DataType::Binary, true)]));
        let mut o = Options::try_new("t", []).unwrap();
        let decoder = Decoder::try_new("raw", &mut o, schema.clone()).unwrap();
        let (batches, rejects, _) = decode(
            &schema,
            &decoder,
            None,
            vec![raw(0, 0, Some(&[0xff]), Some(&[1, 2]))],
        )
        .await
        .unwrap();
        let batch = crate::connector::concat(&batches);
        assert_eq!(batch.num_rows(), 1);
        assert!(rejects.is_empty());
    }

    #[tokio::test]
    async fn an_upsert_topics_tombstones_delete_their_key() {
        let schema: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("sku", DataType::Utf8, false),
            Field::new("price", DataType::Int64, true),
        ]));
        let mut o = Options::try_new("t", []).unwrap();
        let decoder = Decoder::try_new("json", &mut o, schema.clone()).unwrap();
        let json = UpsertKey {
            columns: vec!["sku".into()],
            raw: false,
        };
        let messages = vec![
            raw(
                0,
                0,
                Some(br#"{"sku": "a"}"#),
                Some(br#"{"sku": "a", "price": 3}"#),
            ),
            raw(0, 1, Some(br#"{"sku": "a"}"#), None),
            raw(0, 2, Some(b"b"), None),
            raw(0, 3, None, None),
        ];
        let (batches, rejects, _) = decode(&schema, &decoder, Some(&json), messages.clone())
            .await
            .unwrap();
        let batch = crate::connector::concat(&batches);
        let skus: Vec<&str> = batch
            .column(0)
            .as_string::<i32>()
            .iter()
            .flatten()
            .collect();
        assert_eq!(skus, ["a", "a"]);
        let deletes: Vec<bool> = batch.column(2).as_boolean().iter().flatten().collect();
        assert_eq!(deletes, [false, true]);
        let why: Vec<&str> = rejects.iter().map(|r| r.reject.reason.as_str()).collect();
        assert!(
            why[0].contains("not a JSON object with the key columns (sku)"),
            "{why:?}"
        );
        assert!(why[1].contains("a tombstone without a key"), "{why:?}");
        // A raw key is the text of the one key column.
        let text = UpsertKey {
            columns: vec!["sku".into()],
            raw: true,
        };
        let (batches, rejects, _) = decode(&schema, &decoder, Some(&text), messages[2..3].to_vec())
            .await
            .unwrap();
        assert!(rejects.is_empty());
        let batch = crate::connector::concat(&batches);
        assert_eq!(batch.column(0).as_string::<i32>().value(0), "b");
        assert!(batch.column(2).as_boolean().value(0));
    }
}
