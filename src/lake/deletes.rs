//! Row-level deletes: the rows of a data file that no longer exist, by their position in it.
//! Format-version 2 tables take position delete files, v3 tables deletion vectors; floe
//! writes one or the other by the table's version ([`write_all`]) and reads both
//! ([`DeleteReader`]), never equality deletes, so that every reader (iceberg-rust, pyiceberg,
//! DuckDB) applies them.
//!
//! ```text
//! v2: data file path + sorted positions ─> <data file's folder>/<uuid>-deletes.parquet
//!     (file_path: string, pos: long; zstd), one per data file, the data file named as
//!     `referenced_data_file` and as both bounds of the `file_path` column
//! v3: every data file's positions of a commit ─> <table>/data/<uuid>-deletes.puffin, one
//!     `deletion-vector-v1` blob per data file (a roaring bitmap of positions, framed and
//!     checksummed as the Puffin spec says), each blob its own manifest entry naming its
//!     data file, offset and length; the footer uncompressed (DuckDB requires it)
//! ```
//! A v3 data file has at most one deletion vector: a new one holds the earlier deletes too,
//! and the row delta committing it removes the one it replaces (`commit::row_delta`).
//! Nothing is visible until the delete files are committed.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use datafusion::arrow::array::{Array, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema as ArrowSchema};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::arrow::PARQUET_FIELD_ID_META_KEY;
use datafusion::parquet::basic::{Compression, ZstdLevel};
use datafusion::parquet::file::properties::WriterProperties;
use iceberg::io::FileIO;
use iceberg::metadata_columns::{
    RESERVED_FIELD_ID_DELETE_FILE_PATH, RESERVED_FIELD_ID_DELETE_FILE_POS,
};
use iceberg::puffin::{Blob, CompressionCodec, DELETION_VECTOR_V1, PuffinReader, PuffinWriter};
use iceberg::scan::{FileScanTask, FileScanTaskDeleteFile};
use iceberg::spec::{
    DataContentType, DataFile, DataFileBuilder, DataFileFormat, Datum, FormatVersion,
    PrimitiveLiteral,
};
use iceberg::table::Table;
use roaring::RoaringTreemap;

use crate::error::{Error, Result};

/// The data file some of whose rows a delete file removes.
#[derive(Debug, Clone)]
pub struct Target {
    pub path: String,
    pub partition: iceberg::spec::Struct,
    pub spec_id: i32,
    /// The delete files that apply to its rows now (a new deletion vector holds theirs too).
    pub deletes: Vec<FileScanTaskDeleteFile>,
}

impl Target {
    /// The data file a scan task reads.
    pub fn of(task: &FileScanTask) -> Self {
        Self {
            path: task.data_file_path.clone(),
            partition: task
                .partition
                .clone()
                .unwrap_or_else(iceberg::spec::Struct::empty),
            spec_id: task
                .partition_spec
                .as_ref()
                .map(|s| s.spec_id())
                .unwrap_or(0),
            deletes: task.deletes.clone(),
        }
    }
}

/// Write the deletes of one commit of `table`: the rows at `positions` (ascending,
/// distinct) of each target (each data file once), as position delete files (v2) or one
/// Puffin file of deletion vectors holding each file's earlier deletes too (v3); each with
/// the id of its partition spec, uncommitted. Nothing is left behind when it fails.
pub async fn write_all(
    table: &Table,
    changes: &[(Target, Vec<i64>)],
) -> Result<Vec<(DataFile, i32)>> {
    let io = table.file_io();
    match table.metadata().format_version() {
        FormatVersion::V1 => Err(Error::Unsupported(format!(
            "deleting rows of format-version 1 table {}: row-level deletes need format version 2",
            table.identifier()
        ))),
        FormatVersion::V2 => {
            let mut out: Vec<(DataFile, i32)> = Vec::new();
            for (target, positions) in changes {
                match write_positions(io, target, positions).await {
                    Ok(d) => out.push((d, target.spec_id)),
                    Err(e) => {
                        discard(io, &out).await;
                        return Err(e);
                    }
                }
            }
            Ok(out)
        }
        FormatVersion::V3 => write_vectors(table, changes).await,
    }
}

/// Delete the delete files written for a commit that did not happen.
pub async fn discard(io: &FileIO, files: &[(DataFile, i32)]) {
    for (f, _) in files {
        let _ = io.delete(f.file_path()).await;
    }
}

/// The one data file whose rows delete file `f` removes, if it is scoped to one: the one it
/// names as `referenced_data_file` (every deletion vector does), or the one both bounds of
/// its `file_path` column name. `None` for data files and equality deletes.
pub fn scoped_to(f: &DataFile) -> Option<String> {
    if f.content_type() != DataContentType::PositionDeletes {
        return None;
    }
    f.referenced_data_file().or_else(|| {
        let low = f.lower_bounds().get(&RESERVED_FIELD_ID_DELETE_FILE_PATH)?;
        let high = f.upper_bounds().get(&RESERVED_FIELD_ID_DELETE_FILE_PATH)?;
        match (low.literal(), low == high) {
            (PrimitiveLiteral::String(p), true) => Some(p.clone()),
            _ => None,
        }
    })
}

/// The positions of each of `files` (data files) that delete files scoped to it removed in
/// snapshot `snapshot` of the table, ascending.
pub async fn scoped_at(
    table: &Table,
    snapshot: i64,
    files: &std::collections::HashSet<String>,
) -> Result<HashMap<String, Vec<i64>>> {
    let md = table.metadata();
    let Some(s) = md.snapshot_by_id(snapshot) else {
        return Err(Error::Internal(format!(
            "table {} has no snapshot {snapshot}",
            table.identifier()
        )));
    };
    let io = table.file_io();
    let reader = DeleteReader::new(io.clone());
    let mut out: HashMap<String, Vec<i64>> = HashMap::new();
    for m in table.manifest_list_reader(s).load().await?.entries() {
        if m.content != iceberg::spec::ManifestContentType::Deletes {
            continue;
        }
        for e in m.load_manifest(io).await?.entries() {
            if !e.is_alive() {
                continue;
            }
            let Some(target) = scoped_to(&e.data_file).filter(|t| files.contains(t)) else {
                continue;
            };
            let ps = reader.read(e.data_file.file_path(), &target).await?;
            out.entry(target).or_default().extend(ps);
        }
    }
    for ps in out.values_mut() {
        ps.sort_unstable();
        ps.dedup();
    }
    Ok(out)
}

/// The field a deletion vector is computed for: the row position (`_pos`).
const ROW_POSITION_FIELD_ID: i32 = 2147483645;
/// The magic number a `deletion-vector-v1` blob's vector starts with.
const VECTOR_MAGIC: [u8; 4] = [0xD1, 0xD3, 0x39, 0x64];
/// The blob property naming the data file whose rows a deletion vector deletes.
const REFERENCED_DATA_FILE: &str = "referenced-data-file";

/// [`write_all`] for a v3 table: one Puffin file, a deletion vector per target.
async fn write_vectors(
    table: &Table,
    changes: &[(Target, Vec<i64>)],
) -> Result<Vec<(DataFile, i32)>> {
    if changes.is_empty() {
        return Ok(Vec::new());
    }
    let io = table.file_io();
    let path = format!(
        "{}/data/{}-deletes.puffin",
        table.metadata().location(),
        uuid::Uuid::new_v4()
    );
    let fail = |e: String| Error::Internal(format!("writing deletion vectors {path}: {e}"));
    let reader = DeleteReader::new(io.clone());
    let mut blobs = Vec::with_capacity(changes.len());
    for (target, positions) in changes {
        let mut all: BTreeSet<i64> = reader
            .positions(&target.deletes, &target.path)
            .await?
            .into_iter()
            .collect();
        all.extend(positions.iter().copied());
        let data = encode_vector(&all).map_err(fail)?;
        blobs.push((target, all.len() as u64, data));
    }
    let output = io.new_output(&path)?;
    let written = async {
        let mut writer = PuffinWriter::new(&output, HashMap::new(), false).await?;
        // The first blob follows the file's 4-byte magic; blobs are stored uncompressed.
        let mut offset = 4i64;
        let mut out = Vec::with_capacity(blobs.len());
        for (target, cardinality, data) in blobs {
            let length = data.len() as i64;
            let blob = Blob::builder()
                .r#type(DELETION_VECTOR_V1.to_string())
                .fields(vec![ROW_POSITION_FIELD_ID])
                .snapshot_id(-1)
                .sequence_number(-1)
                .data(data)
                .properties(HashMap::from([
                    (REFERENCED_DATA_FILE.to_string(), target.path.clone()),
                    ("cardinality".to_string(), cardinality.to_string()),
                ]))
                .build();
            writer.add(blob, CompressionCodec::None).await?;
            out.push((target, cardinality, offset, length));
            offset += length;
        }
        writer.close().await?;
        let size = io.new_input(&path)?.metadata().await?.size;
        out.into_iter()
            .map(|(target, cardinality, offset, length)| {
                let file = DataFileBuilder::default()
                    .content(DataContentType::PositionDeletes)
                    .file_path(path.clone())
                    .file_format(DataFileFormat::Puffin)
                    .partition(target.partition.clone())
                    .partition_spec_id(target.spec_id)
                    .record_count(cardinality)
                    .file_size_in_bytes(size)
                    .referenced_data_file(Some(target.path.clone()))
                    .content_offset(Some(offset))
                    .content_size_in_bytes(Some(length))
                    .build()
                    .map_err(|e| fail(e.to_string()))?;
                Ok((file, target.spec_id))
            })
            .collect::<Result<Vec<_>>>()
    }
    .await;
    if written.is_err() {
        let _ = io.delete(&path).await;
    }
    written
}

/// A `deletion-vector-v1` blob of `positions`: the length of magic and vector (big-endian),
/// the magic, the positions as a portable 64-bit roaring bitmap, and the CRC-32 of magic
/// and vector (big-endian).
fn encode_vector(positions: &BTreeSet<i64>) -> std::result::Result<Vec<u8>, String> {
    let mut bitmap = RoaringTreemap::new();
    for &p in positions {
        let p = u64::try_from(p).map_err(|_| format!("a negative row position {p}"))?;
        bitmap.insert(p);
    }
    let mut body = VECTOR_MAGIC.to_vec();
    bitmap
        .serialize_into(&mut body)
        .map_err(|e| e.to_string())?;
    let length =
        u32::try_from(body.len()).map_err(|_| "a deletion vector over 4 GiB".to_string())?;
    let crc = crc32fast::hash(&body);
    let mut out = Vec::with_capacity(body.len() + 8);
    out.extend(length.to_be_bytes());
    out.extend(body);
    out.extend(crc.to_be_bytes());
    Ok(out)
}

/// The positions a `deletion-vector-v1` blob holds, ascending; its framing and checksum
/// checked.
fn decode_vector(blob: &[u8]) -> std::result::Result<Vec<i64>, String> {
    if blob.len() < 12 {
        return Err(format!("a deletion vector of {} bytes", blob.len()));
    }
    let length = u32::from_be_bytes([blob[0], blob[1], blob[2], blob[3]]) as usize;
    if length < 4 || blob.len() != length + 8 {
        return Err(format!(
            "a deletion vector of {} bytes says it holds {length}",
            blob.len()
        ));
    }
    let body = &blob[4..4 + length];
    if body[..4] != VECTOR_MAGIC {
        return Err("a deletion vector without its magic number".into());
    }
    let crc = u32::from_be_bytes([
        blob[4 + length],
        blob[5 + length],
        blob[6 + length],
        blob[7 + length],
    ]);
    if crc32fast::hash(body) != crc {
        return Err("a deletion vector whose checksum does not match".into());
    }
    let bitmap = RoaringTreemap::deserialize_from(&body[4..]).map_err(|e| e.to_string())?;
    bitmap
        .iter()
        .map(|p| i64::try_from(p).map_err(|_| format!("a row position {p} out of range")))
        .collect()
}

fn schema() -> Arc<ArrowSchema> {
    let id = |n: i32| HashMap::from([(PARQUET_FIELD_ID_META_KEY.to_string(), n.to_string())]);
    Arc::new(ArrowSchema::new(vec![
        Field::new("file_path", DataType::Utf8, false)
            .with_metadata(id(RESERVED_FIELD_ID_DELETE_FILE_PATH)),
        Field::new("pos", DataType::Int64, false)
            .with_metadata(id(RESERVED_FIELD_ID_DELETE_FILE_POS)),
    ]))
}

/// Rows of a position delete file written at a time.
const DELETE_BATCH: usize = 1 << 16;

/// Write the delete file removing the rows at `positions` (ascending, distinct) of `target`,
/// uncommitted.
async fn write_positions(io: &FileIO, target: &Target, positions: &[i64]) -> Result<DataFile> {
    let (Some(&first), Some(&last)) = (positions.first(), positions.last()) else {
        return Err(Error::Internal(format!(
            "a delete file of no rows for {}",
            target.path
        )));
    };
    let folder = target
        .path
        .rsplit_once('/')
        .map(|(f, _)| f)
        .unwrap_or(&target.path);
    let path = format!("{folder}/{}-deletes.parquet", uuid::Uuid::new_v4());
    let fail = |e: String| Error::Internal(format!("writing delete file {path}: {e}"));
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .build();
    let mut buffer = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut buffer, schema(), Some(props))
        .map_err(|e| fail(e.to_string()))?;
    // In batches: the path repeats on every row, and millions of rows of it would pass the
    // 2 GiB a string array holds (a job's checkpoint deleting that many rows of one file).
    let paths: Arc<dyn Array> = Arc::new(StringArray::from(vec![
        target.path.as_str();
        positions.len().min(DELETE_BATCH)
    ]));
    for chunk in positions.chunks(DELETE_BATCH) {
        let batch = RecordBatch::try_new(
            schema(),
            vec![
                paths.slice(0, chunk.len()),
                Arc::new(Int64Array::from(chunk.to_vec())),
            ],
        )
        .map_err(|e| fail(e.to_string()))?;
        writer.write(&batch).map_err(|e| fail(e.to_string()))?;
    }
    writer.close().map_err(|e| fail(e.to_string()))?;
    let size = buffer.len() as u64;
    io.new_output(&path)?.write(Bytes::from(buffer)).await?;
    let bounds = |pos: i64| {
        HashMap::from([
            (
                RESERVED_FIELD_ID_DELETE_FILE_PATH,
                Datum::string(target.path.clone()),
            ),
            (RESERVED_FIELD_ID_DELETE_FILE_POS, Datum::long(pos)),
        ])
    };
    DataFileBuilder::default()
        .content(DataContentType::PositionDeletes)
        .file_path(path.clone())
        .file_format(DataFileFormat::Parquet)
        .partition(target.partition.clone())
        .partition_spec_id(target.spec_id)
        .record_count(positions.len() as u64)
        .file_size_in_bytes(size)
        .lower_bounds(bounds(first))
        .upper_bounds(bounds(last))
        .referenced_data_file(Some(target.path.clone()))
        .build()
        .map_err(|e| fail(e.to_string()))
}

/// Reads the rows delete files remove, of position delete files and deletion vectors
/// alike. Puffin files are opened once per reader: the deletion vectors of a partition's
/// data files are planned against each of them (iceberg-rust does not match a delete file
/// to the data file it names), and each file's footer says which blob is whose.
#[derive(Clone)]
pub struct DeleteReader {
    io: FileIO,
    puffins: Arc<Mutex<HashMap<String, Arc<PuffinReader>>>>,
}

impl DeleteReader {
    pub fn new(io: FileIO) -> Self {
        Self {
            io,
            puffins: Arc::default(),
        }
    }

    /// The positions of data file `data_path`'s rows that `deletes` (the delete files
    /// planned for it) remove, ascending and distinct. A table with equality deletes
    /// (another writer's) is refused: floe applies position deletes only.
    pub async fn positions(
        &self,
        deletes: &[FileScanTaskDeleteFile],
        data_path: &str,
    ) -> Result<Vec<i64>> {
        let mut out = Vec::new();
        for d in deletes {
            match d.file_type {
                DataContentType::PositionDeletes => {
                    out.extend(self.read(&d.file_path, data_path).await?);
                }
                _ => {
                    return Err(Error::Unsupported(format!(
                        "equality delete file {}: floe reads position deletes to change rows; \
                         compact the table with an engine that applies equality deletes first",
                        d.file_path
                    )));
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    /// The positions of the task's data file that its delete files remove (see
    /// [`Self::positions`]).
    pub async fn of_task(&self, task: &FileScanTask) -> Result<Vec<i64>> {
        self.positions(&task.deletes, &task.data_file_path).await
    }

    /// The positions of `data_path`'s rows that the delete file `delete_path` removes: a
    /// Parquet position delete file, or a Puffin file (named `*.puffin`, as every writer
    /// names them) holding deletion vectors.
    pub async fn read(&self, delete_path: &str, data_path: &str) -> Result<Vec<i64>> {
        if delete_path.ends_with(".puffin") {
            self.vector(delete_path, data_path).await
        } else {
            read_parquet(&self.io, delete_path, data_path).await
        }
    }

    async fn vector(&self, puffin: &str, data_path: &str) -> Result<Vec<i64>> {
        let fail = |e: String| Error::Internal(format!("reading deletion vectors {puffin}: {e}"));
        let reader = {
            let mut open = self.puffins.lock().map_err(|e| fail(e.to_string()))?;
            match open.get(puffin) {
                Some(r) => r.clone(),
                None => {
                    let r = Arc::new(PuffinReader::new(self.io.new_input(puffin)?));
                    open.insert(puffin.to_string(), r.clone());
                    r
                }
            }
        };
        let footer = reader.file_metadata().await?;
        let mut out = Vec::new();
        for blob in footer.blobs() {
            if blob.blob_type() != DELETION_VECTOR_V1
                || blob
                    .properties()
                    .get(REFERENCED_DATA_FILE)
                    .map(String::as_str)
                    != Some(data_path)
            {
                continue;
            }
            let blob = reader.blob(blob).await?;
            out.extend(decode_vector(blob.data()).map_err(fail)?);
        }
        Ok(out)
    }
}

/// The positions of `data_path`'s rows that the position delete file `delete_path` removes.
async fn read_parquet(io: &FileIO, delete_path: &str, data_path: &str) -> Result<Vec<i64>> {
    let fail = |e: String| Error::Internal(format!("reading delete file {delete_path}: {e}"));
    let mut out = Vec::new();
    for batch in super::read::parquet(io, delete_path, "delete file").await? {
        if batch.num_columns() < 2 {
            return Err(fail("it has fewer than two columns".into()));
        }
        let paths = batch
            .column(0)
            .as_any()
            .downcast_ref::<StringArray>()
            .ok_or_else(|| fail("its file_path column is not a string".into()))?;
        let pos = batch
            .column(1)
            .as_any()
            .downcast_ref::<Int64Array>()
            .ok_or_else(|| fail("its pos column is not a long".into()))?;
        for i in 0..batch.num_rows() {
            if paths.is_valid(i) && paths.value(i) == data_path {
                out.push(pos.value(i));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_position_delete_file_of_many_rows_is_written_in_batches() {
        let dir = tempfile::tempdir().unwrap();
        let io =
            iceberg::io::FileIOBuilder::new(Arc::new(super::super::storage::LocalStorageFactory))
                .build();
        let data = format!("{}/data/{}.parquet", dir.path().display(), "x".repeat(100));
        std::fs::create_dir_all(dir.path().join("data")).unwrap();
        let target = Target {
            path: data.clone(),
            partition: iceberg::spec::Struct::empty(),
            spec_id: 0,
            deletes: Vec::new(),
        };
        let positions: Vec<i64> = (0..(DELETE_BATCH as i64 * 3 + 7)).map(|p| p * 2).collect();
        let file = write_positions(&io, &target, &positions).await.unwrap();
        assert_eq!(file.record_count(), positions.len() as u64);
        let back = DeleteReader::new(io)
            .read(file.file_path(), &data)
            .await
            .unwrap();
        assert_eq!(back, positions);
    }

    #[test]
    fn a_deletion_vector_round_trips() {
        let positions: BTreeSet<i64> = [0, 1, 7, 65_535, 65_536, 1 << 33, (1 << 33) + 5]
            .into_iter()
            .collect();
        let blob = encode_vector(&positions).unwrap();
        assert_eq!(&blob[4..8], &VECTOR_MAGIC);
        let back = decode_vector(&blob).unwrap();
        assert_eq!(back, positions.into_iter().collect::<Vec<_>>());
    }

    #[test]
    fn a_deletion_vector_is_framed_as_the_puffin_spec_says() {
        // One position, 5: magic, one bitmap (key 0), crc; the vector is the portable
        // roaring layout (a u64 count of bitmaps, then each key and its bitmap).
        let blob = encode_vector(&[5].into_iter().collect()).unwrap();
        let length = u32::from_be_bytes(blob[..4].try_into().unwrap()) as usize;
        assert_eq!(blob.len(), length + 8);
        assert_eq!(u64::from_le_bytes(blob[8..16].try_into().unwrap()), 1);
        assert_eq!(u32::from_le_bytes(blob[16..20].try_into().unwrap()), 0);
        let crc = u32::from_be_bytes(blob[4 + length..].try_into().unwrap());
        assert_eq!(crc, crc32fast::hash(&blob[4..4 + length]));
    }

    #[test]
    fn a_damaged_deletion_vector_is_refused() {
        let mut blob = encode_vector(&[1, 2, 3].into_iter().collect()).unwrap();
        let n = blob.len();
        blob[n - 6] ^= 0xFF;
        assert!(decode_vector(&blob).unwrap_err().contains("checksum"));
        assert!(decode_vector(&blob[..6]).is_err());
        let mut short = encode_vector(&[1].into_iter().collect()).unwrap();
        short.pop();
        assert!(decode_vector(&short).unwrap_err().contains("says it holds"));
    }
}
