//! Iceberg metadata tables: `t$snapshots`, `t$history`, `t$files`, `t$partitions`,
//! `t$manifests`.
//!
//! Each is materialised from the table's metadata when a statement names it and served as a
//! DataFusion `MemTable`, so every SQL feature works on it (projection, filters,
//! aggregates, joins). Column names follow Spark's and pyiceberg's metadata tables.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanArray, Int32Array, Int64Array, RecordBatch, StringArray,
    TimestampMillisecondArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::datasource::{MemTable, TableProvider};
use futures::TryStreamExt;
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::spec::{DataContentType, DataFile, StructType};
use iceberg::table::Table;

use crate::error::{Error, Result};

/// Which metadata table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetadataTable {
    Snapshots,
    History,
    Files,
    Partitions,
    Manifests,
}

impl MetadataTable {
    /// The metadata table a `$suffix` names.
    pub fn parse(suffix: &str) -> Option<Self> {
        Some(match suffix.to_ascii_lowercase().as_str() {
            "snapshots" => Self::Snapshots,
            "history" => Self::History,
            "files" => Self::Files,
            "partitions" => Self::Partitions,
            "manifests" => Self::Manifests,
            _ => return None,
        })
    }
}

/// Build the metadata table `kind` of `table`.
pub async fn metadata_table(kind: MetadataTable, table: &Table) -> Result<Arc<dyn TableProvider>> {
    let batch = match kind {
        MetadataTable::Snapshots => {
            let inspect = table.inspect();
            let t = inspect.snapshots();
            let schema = Arc::new(schema_to_arrow_schema(&t.schema())?);
            return from_stream(schema, t.scan().await?).await;
        }
        MetadataTable::Manifests => {
            let inspect = table.inspect();
            let t = inspect.manifests();
            let schema = Arc::new(schema_to_arrow_schema(&t.schema())?);
            return from_stream(schema, t.scan().await?).await;
        }
        MetadataTable::History => history(table)?,
        MetadataTable::Files => files(table).await?,
        MetadataTable::Partitions => partitions(table).await?,
    };
    mem_table(batch.schema(), vec![batch])
}

async fn from_stream(
    schema: SchemaRef,
    stream: iceberg::scan::ArrowRecordBatchStream,
) -> Result<Arc<dyn TableProvider>> {
    let batches: Vec<RecordBatch> = stream.try_collect().await?;
    // Use the batches' own schema when there are any (nullability may differ slightly).
    let schema = batches.first().map(|b| b.schema()).unwrap_or(schema);
    mem_table(schema, batches)
}

fn mem_table(schema: SchemaRef, batches: Vec<RecordBatch>) -> Result<Arc<dyn TableProvider>> {
    Ok(Arc::new(MemTable::try_new(schema, vec![batches])?))
}

fn batch(fields: Vec<Field>, columns: Vec<ArrayRef>) -> Result<RecordBatch> {
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .map_err(|e| Error::Internal(format!("building a metadata table: {e}")))
}

fn ts_type() -> DataType {
    DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()))
}

/// `made_current_at, snapshot_id, parent_id, is_current_ancestor`, from the snapshot log.
fn history(table: &Table) -> Result<RecordBatch> {
    let md = table.metadata();
    let mut ancestors = std::collections::HashSet::new();
    let mut cur = md.current_snapshot();
    while let Some(s) = cur {
        ancestors.insert(s.snapshot_id());
        cur = s.parent_snapshot_id().and_then(|p| md.snapshot_by_id(p));
    }
    let log = md.history();
    let made: Vec<i64> = log.iter().map(|l| l.timestamp_ms).collect();
    let ids: Vec<i64> = log.iter().map(|l| l.snapshot_id).collect();
    let parents: Vec<Option<i64>> = ids
        .iter()
        .map(|id| md.snapshot_by_id(*id).and_then(|s| s.parent_snapshot_id()))
        .collect();
    let is_anc: Vec<bool> = ids.iter().map(|id| ancestors.contains(id)).collect();
    batch(
        vec![
            Field::new("made_current_at", ts_type(), false),
            Field::new("snapshot_id", DataType::Int64, false),
            Field::new("parent_id", DataType::Int64, true),
            Field::new("is_current_ancestor", DataType::Boolean, false),
        ],
        vec![
            Arc::new(TimestampMillisecondArray::from(made).with_timezone("UTC")),
            Arc::new(Int64Array::from(ids)),
            Arc::new(Int64Array::from(parents)),
            Arc::new(BooleanArray::from(is_anc)),
        ],
    )
}

/// The live files of the current snapshot, with the spec they were written with.
async fn live_files(table: &Table) -> Result<Vec<(i32, DataFile)>> {
    let Some(snapshot) = table.metadata().current_snapshot() else {
        return Ok(Vec::new());
    };
    let list = table.manifest_list_reader(snapshot).load().await?;
    let mut out = Vec::new();
    for manifest_file in list.entries() {
        let manifest = manifest_file.load_manifest(table.file_io()).await?;
        for entry in manifest.entries() {
            if entry.is_alive() {
                out.push((manifest_file.partition_spec_id, entry.data_file().clone()));
            }
        }
    }
    Ok(out)
}

/// A file's partition as a JSON object (`{"ts_day":"2024-05-01","region":"eu"}`), or
/// `{}` when unpartitioned.
fn partition_json(table: &Table, spec_id: i32, file: &DataFile) -> String {
    let md = table.metadata();
    let ty: Option<StructType> = md
        .partition_spec_by_id(spec_id)
        .and_then(|spec| spec.partition_type(md.current_schema()).ok());
    let Some(ty) = ty else {
        return "{}".to_string();
    };
    let mut obj = serde_json::Map::new();
    for (field, value) in ty.fields().iter().zip(file.partition().iter()) {
        let json = match value {
            None => serde_json::Value::Null,
            Some(lit) => lit
                .clone()
                .try_into_json(&field.field_type)
                .unwrap_or_else(|_| serde_json::Value::String(format!("{lit:?}"))),
        };
        obj.insert(field.name.clone(), json);
    }
    serde_json::Value::Object(obj).to_string()
}

fn content_name(c: DataContentType) -> &'static str {
    match c {
        DataContentType::Data => "data",
        DataContentType::PositionDeletes => "position_deletes",
        DataContentType::EqualityDeletes => "equality_deletes",
    }
}

/// `content, content_type, file_path, file_format, spec_id, partition, record_count,
/// file_size_in_bytes, referenced_data_file, content_offset, content_size_in_bytes` (the
/// last three: the data file a delete file is scoped to, and a deletion vector's blob).
async fn files(table: &Table) -> Result<RecordBatch> {
    let files = live_files(table).await?;
    let content: Vec<i32> = files.iter().map(|(_, f)| f.content_type() as i32).collect();
    let path: Vec<&str> = files.iter().map(|(_, f)| f.file_path()).collect();
    let format: Vec<String> = files
        .iter()
        .map(|(_, f)| f.file_format().to_string().to_ascii_uppercase())
        .collect();
    let spec: Vec<i32> = files.iter().map(|(s, _)| *s).collect();
    let partition: Vec<String> = files
        .iter()
        .map(|(s, f)| partition_json(table, *s, f))
        .collect();
    let records: Vec<i64> = files.iter().map(|(_, f)| f.record_count() as i64).collect();
    let sizes: Vec<i64> = files
        .iter()
        .map(|(_, f)| f.file_size_in_bytes() as i64)
        .collect();
    let kinds: Vec<&str> = files
        .iter()
        .map(|(_, f)| content_name(f.content_type()))
        .collect();
    let referenced: Vec<Option<String>> = files
        .iter()
        .map(|(_, f)| f.referenced_data_file())
        .collect();
    let offsets: Vec<Option<i64>> = files.iter().map(|(_, f)| f.content_offset()).collect();
    let lengths: Vec<Option<i64>> = files
        .iter()
        .map(|(_, f)| f.content_size_in_bytes())
        .collect();
    batch(
        vec![
            Field::new("content", DataType::Int32, false),
            Field::new("content_type", DataType::Utf8, false),
            Field::new("file_path", DataType::Utf8, false),
            Field::new("file_format", DataType::Utf8, false),
            Field::new("spec_id", DataType::Int32, false),
            Field::new("partition", DataType::Utf8, false),
            Field::new("record_count", DataType::Int64, false),
            Field::new("file_size_in_bytes", DataType::Int64, false),
            Field::new("referenced_data_file", DataType::Utf8, true),
            Field::new("content_offset", DataType::Int64, true),
            Field::new("content_size_in_bytes", DataType::Int64, true),
        ],
        vec![
            Arc::new(Int32Array::from(content)),
            Arc::new(StringArray::from(kinds)),
            Arc::new(StringArray::from(path)),
            Arc::new(StringArray::from(format)),
            Arc::new(Int32Array::from(spec)),
            Arc::new(StringArray::from(partition)),
            Arc::new(Int64Array::from(records)),
            Arc::new(Int64Array::from(sizes)),
            Arc::new(StringArray::from(referenced)),
            Arc::new(Int64Array::from(offsets)),
            Arc::new(Int64Array::from(lengths)),
        ],
    )
}

/// One row per partition of the current snapshot: `partition, spec_id, record_count,
/// file_count, total_data_file_size_in_bytes`, counting data files only.
async fn partitions(table: &Table) -> Result<RecordBatch> {
    let mut groups: BTreeMap<(String, i32), (i64, i64, i64)> = BTreeMap::new();
    for (spec, file) in live_files(table).await? {
        if file.content_type() != DataContentType::Data {
            continue;
        }
        let g = groups
            .entry((partition_json(table, spec, &file), spec))
            .or_default();
        g.0 += file.record_count() as i64;
        g.1 += 1;
        g.2 += file.file_size_in_bytes() as i64;
    }
    let parts: Vec<&str> = groups.keys().map(|(p, _)| p.as_str()).collect();
    let specs: Vec<i32> = groups.keys().map(|(_, s)| *s).collect();
    let records: Vec<i64> = groups.values().map(|g| g.0).collect();
    let counts: Vec<i64> = groups.values().map(|g| g.1).collect();
    let sizes: Vec<i64> = groups.values().map(|g| g.2).collect();
    batch(
        vec![
            Field::new("partition", DataType::Utf8, false),
            Field::new("spec_id", DataType::Int32, false),
            Field::new("record_count", DataType::Int64, false),
            Field::new("file_count", DataType::Int64, false),
            Field::new("total_data_file_size_in_bytes", DataType::Int64, false),
        ],
        vec![
            Arc::new(StringArray::from(parts)),
            Arc::new(Int32Array::from(specs)),
            Arc::new(Int64Array::from(records)),
            Arc::new(Int64Array::from(counts)),
            Arc::new(Int64Array::from(sizes)),
        ],
    )
}
