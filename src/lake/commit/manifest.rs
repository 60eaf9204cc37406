//! Manifests: the Avro files listing a snapshot's data and delete files.
//!
//! iceberg-rust's `ManifestWriter` builds the manifest's Avro schema anew for every manifest
//! (an iceberg schema of the entry, then its Avro form), turns every entry into a generic
//! Avro value and resolves it against that schema. A routed job writes a manifest per table
//! per checkpoint: with 10,000 new tables that was an eighth of the whole run. floe encodes
//! entries straight into Avro's binary form instead, as they are added.
//!
//! ```text
//! partition type ──(once per process)──> probe: iceberg-rust writes a manifest of three
//!     sample entries in memory; floe encodes the same entries; the bytes and the partition
//!     summaries must be equal ──> Format { the Avro schema text iceberg-rust wrote }
//!                                   (unequal, or a type floe does not encode: None)
//! add_file / add_existing_file / add_delete_file ──> entry bytes (Format) or
//!                                                    iceberg-rust's writer (None)
//! write_manifest_file ──> one Avro container file, one block, no codec
//! ```
//!
//! So the schema readers see is iceberg-rust's to the byte, and floe's encoding of it is
//! checked against iceberg-rust's for the very partition type before it is used. Partition
//! fields of decimal, uuid or fixed type, and format-version 1 tables, keep iceberg-rust's
//! writer.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use bytes::Bytes;
use iceberg::io::{FileIO, OutputFile};
use iceberg::spec::{
    DataContentType, DataFile, DataFileBuilder, DataFileFormat, Datum, FieldSummary, FormatVersion,
    Literal, ManifestContentType, ManifestFile, ManifestStatus, ManifestWriterBuilder,
    PartitionSpec, PrimitiveLiteral, PrimitiveType, SchemaRef, Struct, StructType, Type,
};

use crate::error::{Error, Result};

/// Writes one manifest: floe's encoder where the partition type allows, else iceberg-rust's.
pub struct ManifestWriter(Writer);

enum Writer {
    Own(Box<Own>),
    Iceberg(Box<iceberg::spec::ManifestWriter>),
}

/// What a manifest is written for.
pub struct Target<'a> {
    pub output: OutputFile,
    pub snapshot_id: i64,
    pub schema: &'a SchemaRef,
    pub spec: &'a PartitionSpec,
    pub format_version: FormatVersion,
    pub content: ManifestContentType,
}

impl ManifestWriter {
    /// A writer of a manifest of `target.content` for snapshot `target.snapshot_id`.
    pub async fn new(target: Target<'_>) -> Result<Self> {
        let partition_type = target.spec.partition_type(target.schema)?;
        let format = match target.format_version {
            FormatVersion::V1 => None,
            FormatVersion::V2 | FormatVersion::V3 => {
                format_for(target.schema, target.spec, &partition_type).await?
            }
        };
        let Some(format) = format else {
            return Ok(Self(Writer::Iceberg(Box::new(iceberg_writer(target)))));
        };
        let header = Header {
            schema: json(target.schema.as_ref(), "table schema")?,
            schema_id: target.schema.schema_id().to_string(),
            spec: json(target.spec.fields(), "partition spec")?,
            spec_id: target.spec.spec_id(),
            format_version: (target.format_version as u8).to_string(),
            content: target.content,
        };
        let entries = Entries::new(format, target.content, Some(target.snapshot_id));
        Ok(Self(Writer::Own(Box::new(Own {
            output: target.output,
            header,
            entries,
        }))))
    }

    /// Add `file` as added by this snapshot, with data sequence number `sequence_number`, or
    /// inheriting the snapshot's when it is negative.
    pub fn add_file(&mut self, file: DataFile, sequence_number: i64) -> Result<()> {
        match &mut self.0 {
            Writer::Own(w) => w.entries.add(Entry {
                status: ManifestStatus::Added,
                snapshot_id: w.entries.snapshot_id,
                sequence_number: (sequence_number >= 0).then_some(sequence_number),
                file_sequence_number: None,
                file: &file,
            }),
            Writer::Iceberg(w) => Ok(w.add_file(file, sequence_number)?),
        }
    }

    /// Add `file` as removed by this snapshot, keeping the sequence numbers it was added with.
    pub fn add_delete_file(
        &mut self,
        file: DataFile,
        sequence_number: i64,
        file_sequence_number: Option<i64>,
    ) -> Result<()> {
        match &mut self.0 {
            Writer::Own(w) => w.entries.add(Entry {
                status: ManifestStatus::Deleted,
                snapshot_id: w.entries.snapshot_id,
                sequence_number: Some(sequence_number),
                file_sequence_number,
                file: &file,
            }),
            Writer::Iceberg(w) => {
                Ok(w.add_delete_file(file, sequence_number, file_sequence_number)?)
            }
        }
    }

    /// Add `file` as still live, added by snapshot `snapshot_id` with these sequence numbers.
    pub fn add_existing_file(
        &mut self,
        file: DataFile,
        snapshot_id: i64,
        sequence_number: i64,
        file_sequence_number: Option<i64>,
    ) -> Result<()> {
        match &mut self.0 {
            Writer::Own(w) => w.entries.add(Entry {
                status: ManifestStatus::Existing,
                snapshot_id: Some(snapshot_id),
                sequence_number: Some(sequence_number),
                file_sequence_number,
                file: &file,
            }),
            Writer::Iceberg(w) => {
                Ok(w.add_existing_file(file, snapshot_id, sequence_number, file_sequence_number)?)
            }
        }
    }

    /// Write the manifest and return its entry for a manifest list (sequence numbers left
    /// for the list to assign, as iceberg-rust's writer leaves them).
    pub async fn write_manifest_file(self) -> Result<ManifestFile> {
        match self.0 {
            Writer::Iceberg(w) => Ok((*w).write_manifest_file().await?),
            Writer::Own(w) => {
                let Own {
                    output,
                    header,
                    entries,
                } = *w;
                let bytes = entries.container(&header);
                let length = bytes.len() as i64;
                let path = output.location().to_string();
                output.write(Bytes::from(bytes)).await?;
                Ok(entries.manifest_file(path, length, header.spec_id))
            }
        }
    }

    /// Whether floe's own encoder writes this manifest (for tests).
    pub fn is_own(&self) -> bool {
        matches!(self.0, Writer::Own(_))
    }
}

fn iceberg_writer(target: Target<'_>) -> iceberg::spec::ManifestWriter {
    let builder = ManifestWriterBuilder::new(
        target.output,
        Some(target.snapshot_id),
        target.schema.clone(),
        target.spec.clone(),
    );
    match (target.format_version, target.content) {
        (FormatVersion::V1, _) => builder.build_v1(),
        (FormatVersion::V2, ManifestContentType::Data) => builder.build_v2_data(),
        (FormatVersion::V2, ManifestContentType::Deletes) => builder.build_v2_deletes(),
        (FormatVersion::V3, ManifestContentType::Data) => builder.build_v3_data(),
        (FormatVersion::V3, ManifestContentType::Deletes) => builder.build_v3_deletes(),
    }
}

fn json<T: serde::Serialize + ?Sized>(value: &T, what: &str) -> Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(|e| Error::Internal(format!("encoding the {what}: {e}")))
}

struct Own {
    output: OutputFile,
    header: Header,
    entries: Entries,
}

/// The manifest's key-value metadata besides the Avro schema, as iceberg-rust writes it.
struct Header {
    schema: Vec<u8>,
    schema_id: String,
    spec: Vec<u8>,
    spec_id: i32,
    format_version: String,
    content: ManifestContentType,
}

/// How manifests of one partition type are encoded: the Avro schema's text (iceberg-rust's)
/// and how each partition field's values are written.
#[derive(Debug)]
struct Format {
    avro_schema: Vec<u8>,
    /// Per partition field: its Avro type, and whether it may be null.
    fields: Vec<(Kind, bool)>,
}

/// The Avro types floe encodes partition values as.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Boolean,
    /// int, date
    Int,
    /// long, time, timestamps
    Long,
    Float,
    Double,
    String,
    Binary,
}

impl Kind {
    fn of(t: &Type) -> Option<Self> {
        let Type::Primitive(p) = t else {
            return None;
        };
        Some(match p {
            PrimitiveType::Boolean => Kind::Boolean,
            PrimitiveType::Int | PrimitiveType::Date => Kind::Int,
            PrimitiveType::Long
            | PrimitiveType::Time
            | PrimitiveType::Timestamp
            | PrimitiveType::Timestamptz
            | PrimitiveType::TimestampNs
            | PrimitiveType::TimestamptzNs => Kind::Long,
            PrimitiveType::Float => Kind::Float,
            PrimitiveType::Double => Kind::Double,
            PrimitiveType::String => Kind::String,
            PrimitiveType::Binary => Kind::Binary,
            PrimitiveType::Decimal { .. } | PrimitiveType::Uuid | PrimitiveType::Fixed(_) => {
                return None;
            }
        })
    }

    fn fits(self, v: &PrimitiveLiteral) -> bool {
        matches!(
            (self, v),
            (Kind::Boolean, PrimitiveLiteral::Boolean(_))
                | (Kind::Int, PrimitiveLiteral::Int(_))
                | (Kind::Long, PrimitiveLiteral::Long(_))
                | (Kind::Float, PrimitiveLiteral::Float(_))
                | (Kind::Double, PrimitiveLiteral::Double(_))
                | (Kind::String, PrimitiveLiteral::String(_))
                | (Kind::Binary, PrimitiveLiteral::Binary(_))
        )
    }
}

/// Formats by partition type (its JSON): `None` where iceberg-rust's writer is kept.
static FORMATS: LazyLock<Mutex<HashMap<String, Option<Arc<Format>>>>> =
    LazyLock::new(Default::default);

async fn format_for(
    schema: &SchemaRef,
    spec: &PartitionSpec,
    partition_type: &StructType,
) -> Result<Option<Arc<Format>>> {
    let key = String::from_utf8(json(partition_type, "partition type")?)
        .map_err(|e| Error::Internal(format!("partition type JSON: {e}")))?;
    if let Some(known) = lock(&FORMATS).get(&key) {
        return Ok(known.clone());
    }
    let format = probe(schema, spec, partition_type).await?;
    lock(&FORMATS).insert(key, format.clone());
    Ok(format)
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The format of `partition_type`'s manifests, if floe encodes it exactly as iceberg-rust
/// does: both write the same sample entries (every optional field set in one, unset in
/// another), and the entry bytes and partition summaries must be equal.
async fn probe(
    schema: &SchemaRef,
    spec: &PartitionSpec,
    partition_type: &StructType,
) -> Result<Option<Arc<Format>>> {
    let fields = partition_type
        .fields()
        .iter()
        .map(|f| Kind::of(&f.field_type).map(|k| (k, !f.required)))
        .collect::<Option<Vec<_>>>();
    let Some(fields) = fields else {
        return Ok(None);
    };
    let samples = samples(&fields, spec.spec_id())?;
    let (snapshot_id, sequence_number) = (7, 3);
    let io = FileIO::new_with_memory();
    let path = "memory:///floe-manifest-probe.avro";
    let mut theirs = iceberg_writer(Target {
        output: io.new_output(path)?,
        snapshot_id,
        schema,
        spec,
        format_version: FormatVersion::V2,
        content: ManifestContentType::Data,
    });
    let (first, rest) = samples.split_at(1);
    theirs.add_file(first[0].clone(), sequence_number)?;
    theirs.add_file(rest[0].clone(), -1)?;
    theirs.add_existing_file(rest[1].clone(), 5, 2, Some(2))?;
    let their_file = theirs.write_manifest_file().await?;
    let written = io.new_input(path)?.read().await?;
    let Some((mut metadata, block)) = read_container(&written) else {
        return Ok(None);
    };
    let Some(avro_schema) = metadata.remove("avro.schema") else {
        return Ok(None);
    };
    let format = Arc::new(Format {
        avro_schema,
        fields,
    });
    let mut ours = Entries::new(format.clone(), ManifestContentType::Data, Some(snapshot_id));
    let added = |file| Entry {
        status: ManifestStatus::Added,
        snapshot_id: Some(snapshot_id),
        sequence_number: None,
        file_sequence_number: None,
        file,
    };
    ours.add(Entry {
        sequence_number: Some(sequence_number),
        ..added(&samples[0])
    })?;
    ours.add(added(&samples[1]))?;
    ours.add(Entry {
        status: ManifestStatus::Existing,
        snapshot_id: Some(5),
        sequence_number: Some(2),
        file_sequence_number: Some(2),
        file: &samples[2],
    })?;
    let our_file = ours.manifest_file(path.to_string(), their_file.manifest_length, spec.spec_id());
    // (Unequal: a partition type floe encodes otherwise than iceberg-rust; its writer stays.)
    Ok((ours.buf == block && our_file == their_file).then_some(format))
}

/// Three data files for a probe: one with every optional field and one value in every map,
/// one with none (and null partition values where allowed), one with other partition values.
fn samples(fields: &[(Kind, bool)], spec_id: i32) -> Result<Vec<DataFile>> {
    let partition = |high: bool, nulls: bool| -> Struct {
        fields
            .iter()
            .map(|&(kind, nullable)| {
                if nulls && nullable {
                    return None;
                }
                Some(Literal::Primitive(match (kind, high) {
                    (Kind::Boolean, h) => PrimitiveLiteral::Boolean(h),
                    (Kind::Int, h) => PrimitiveLiteral::Int(if h { 7 } else { -3 }),
                    (Kind::Long, h) => PrimitiveLiteral::Long(if h { 1 << 40 } else { -3 }),
                    (Kind::Float, h) => {
                        PrimitiveLiteral::Float((if h { 2.5f32 } else { -1.0 }).into())
                    }
                    (Kind::Double, h) => {
                        PrimitiveLiteral::Double((if h { 2.5f64 } else { -1.0 }).into())
                    }
                    (Kind::String, h) => PrimitiveLiteral::String(if h { "p" } else { "a" }.into()),
                    (Kind::Binary, h) => {
                        PrimitiveLiteral::Binary(if h { vec![9, 1] } else { vec![] })
                    }
                }))
            })
            .collect()
    };
    let base = |name: &str, partition: Struct| {
        let mut b = DataFileBuilder::default();
        b.content(DataContentType::Data)
            .file_path(format!("memory:///{name}.parquet"))
            .file_format(DataFileFormat::Parquet)
            .partition(partition)
            .record_count(300)
            .file_size_in_bytes(4096)
            .partition_spec_id(spec_id);
        b
    };
    let built = |b: &mut DataFileBuilder| {
        b.build()
            .map_err(|e| Error::Internal(format!("a sample data file: {e}")))
    };
    let full = built(
        base("full", partition(true, false))
            .column_sizes(HashMap::from([(1, 100)]))
            .value_counts(HashMap::from([(1, 300)]))
            .null_value_counts(HashMap::from([(2, 4)]))
            .nan_value_counts(HashMap::from([(3, 0)]))
            .lower_bounds(HashMap::from([(1, Datum::long(-5))]))
            .upper_bounds(HashMap::from([(2, Datum::string("zz"))]))
            .key_metadata(Some(vec![1, 2, 3]))
            .split_offsets(Some(vec![4, 2048]))
            .equality_ids(Some(vec![1, 2]))
            .sort_order_id(0)
            .first_row_id(Some(40))
            .referenced_data_file(Some("memory:///data.parquet".to_string()))
            .content_offset(Some(4))
            .content_size_in_bytes(Some(60)),
    )?;
    let empty = built(&mut base("empty", partition(false, true)))?;
    let other = built(&mut base("other", partition(false, false)))?;
    Ok(vec![full, empty, other])
}

/// An Avro container file's key-value metadata.
pub(super) type Metadata = HashMap<String, Vec<u8>>;

/// The key-value metadata of an Avro object container file and its first block's bytes,
/// if the file is one (uncompressed: its codec is `null`).
pub(super) fn read_container(file: &[u8]) -> Option<(Metadata, Vec<u8>)> {
    let mut r = Read(file);
    if r.take(4)? != b"Obj\x01" {
        return None;
    }
    let mut metadata = HashMap::new();
    loop {
        let mut count = r.long()?;
        if count == 0 {
            break;
        }
        if count < 0 {
            count = -count;
            r.long()?;
        }
        for _ in 0..count {
            let key = String::from_utf8(r.bytes()?.to_vec()).ok()?;
            metadata.insert(key, r.bytes()?.to_vec());
        }
    }
    if metadata.get("avro.codec").is_some_and(|c| c != b"null") {
        return None;
    }
    r.take(16)?;
    r.long()?;
    let block = r.bytes()?;
    Some((metadata, block.to_vec()))
}

struct Read<'a>(&'a [u8]);

impl<'a> Read<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }

    fn long(&mut self) -> Option<i64> {
        let mut z = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.take(1)?[0];
            z |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(((z >> 1) as i64) ^ -((z & 1) as i64));
            }
        }
        None
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(self.long()?).ok()?;
        self.take(n)
    }
}

/// One manifest entry to encode.
struct Entry<'a> {
    status: ManifestStatus,
    snapshot_id: Option<i64>,
    sequence_number: Option<i64>,
    file_sequence_number: Option<i64>,
    file: &'a DataFile,
}

/// Encoded entries of one manifest and what its manifest-list entry says of them.
struct Entries {
    format: Arc<Format>,
    content: ManifestContentType,
    snapshot_id: Option<i64>,
    buf: Vec<u8>,
    count: u64,
    /// (files, rows) added, existing, deleted.
    added: (u32, u64),
    existing: (u32, u64),
    deleted: (u32, u64),
    min_sequence_number: Option<i64>,
    partitions: Vec<FieldStats>,
}

impl Entries {
    fn new(format: Arc<Format>, content: ManifestContentType, snapshot_id: Option<i64>) -> Self {
        let partitions = format
            .fields
            .iter()
            .map(|_| FieldStats::default())
            .collect();
        Self {
            format,
            content,
            snapshot_id,
            buf: Vec::new(),
            count: 0,
            added: (0, 0),
            existing: (0, 0),
            deleted: (0, 0),
            min_sequence_number: None,
            partitions,
        }
    }

    fn add(&mut self, e: Entry<'_>) -> Result<()> {
        let f = e.file;
        let fits = match self.content {
            ManifestContentType::Data => f.content_type() == DataContentType::Data,
            ManifestContentType::Deletes => f.content_type() != DataContentType::Data,
        };
        if !fits {
            return Err(Error::Internal(format!(
                "{:?} file {} in a manifest of {} files",
                f.content_type(),
                f.file_path(),
                self.content
            )));
        }
        if e.status != ManifestStatus::Added
            && (e.sequence_number.is_none() || e.file_sequence_number.is_none())
        {
            return Err(Error::Internal(format!(
                "manifest entry of {} ({:?}) without its sequence numbers",
                f.file_path(),
                e.status
            )));
        }
        let start = self.buf.len();
        if let Err(err) = self.encode(&e) {
            self.buf.truncate(start);
            return Err(err);
        }
        let tally = match e.status {
            ManifestStatus::Added => &mut self.added,
            ManifestStatus::Existing => &mut self.existing,
            ManifestStatus::Deleted => &mut self.deleted,
        };
        tally.0 += 1;
        tally.1 += f.record_count();
        if e.status != ManifestStatus::Deleted
            && let Some(n) = e.sequence_number
        {
            self.min_sequence_number = Some(self.min_sequence_number.map_or(n, |m| m.min(n)));
        }
        self.count += 1;
        Ok(())
    }

    /// Append `e` in the `manifest_entry` record's binary encoding (iceberg's v2 manifest
    /// schema, which v3 keeps).
    fn encode(&mut self, e: &Entry<'_>) -> Result<()> {
        let f = e.file;
        let b = &mut self.buf;
        long(b, e.status as i64);
        optional(b, e.snapshot_id, long);
        optional(b, e.sequence_number, long);
        optional(b, e.file_sequence_number, long);
        // data_file
        long(b, f.content_type() as i64);
        bytes(b, f.file_path().as_bytes());
        bytes(
            b,
            f.file_format().to_string().to_ascii_uppercase().as_bytes(),
        );
        self.partition(f)?;
        let b = &mut self.buf;
        long(b, count(f.record_count(), "record count")?);
        long(b, count(f.file_size_in_bytes(), "file size")?);
        for counts in [
            f.column_sizes(),
            f.value_counts(),
            f.null_value_counts(),
            f.nan_value_counts(),
        ] {
            long(b, 1);
            let mut pairs = Vec::with_capacity(counts.len());
            for (&k, &v) in counts {
                pairs.push((k, count(v, "column count")?));
            }
            pairs.sort_unstable();
            array(b, &pairs, |b, &(k, v)| {
                long(b, i64::from(k));
                long(b, v);
            });
        }
        for bounds in [f.lower_bounds(), f.upper_bounds()] {
            long(b, 1);
            let mut pairs = Vec::with_capacity(bounds.len());
            for (&k, v) in bounds {
                pairs.push((k, v.to_bytes()?));
            }
            pairs.sort_unstable_by_key(|(k, _)| *k);
            array(b, &pairs, |b, (k, v)| {
                long(b, i64::from(*k));
                bytes(b, v);
            });
        }
        optional(b, f.key_metadata(), bytes);
        optional(b, f.split_offsets(), |b, v| array(b, v, |b, &o| long(b, o)));
        optional(b, f.equality_ids(), |b, v| {
            array(b, &v, |b, &id| long(b, i64::from(id)))
        });
        optional(b, f.sort_order_id(), |b, v| long(b, i64::from(v)));
        optional(b, f.first_row_id(), long);
        optional(b, f.referenced_data_file(), |b, v| bytes(b, v.as_bytes()));
        optional(b, f.content_offset(), long);
        optional(b, f.content_size_in_bytes(), long);
        Ok(())
    }

    /// The partition record of `f`, with the summary of each field updated.
    fn partition(&mut self, f: &DataFile) -> Result<()> {
        let values = f.partition();
        let fields = &self.format.fields;
        if values.fields().len() != fields.len() {
            return Err(Error::Internal(format!(
                "data file {} has {} partition values for {} partition fields",
                f.file_path(),
                values.fields().len(),
                fields.len()
            )));
        }
        for ((value, &(kind, nullable)), stats) in
            values.iter().zip(fields).zip(&mut self.partitions)
        {
            let literal = match value {
                None if nullable => {
                    long(&mut self.buf, 0);
                    stats.contains_null = true;
                    continue;
                }
                Some(Literal::Primitive(p)) if kind.fits(p) => Some(p),
                _ => None,
            };
            let Some(p) = literal else {
                return Err(Error::Internal(format!(
                    "data file {} has partition value {value:?} where {kind:?} is wanted",
                    f.file_path()
                )));
            };
            if nullable {
                long(&mut self.buf, 1);
            }
            primitive(&mut self.buf, p);
            stats.update(p);
        }
        Ok(())
    }

    /// The manifest file: header, then the entries as one block.
    fn container(&self, header: &Header) -> Vec<u8> {
        let spec_id = header.spec_id.to_string();
        let content = header.content.to_string();
        let metadata: [(&str, &[u8]); 8] = [
            ("avro.schema", &self.format.avro_schema),
            ("avro.codec", b"null"),
            ("schema", &header.schema),
            ("schema-id", header.schema_id.as_bytes()),
            ("partition-spec", &header.spec),
            ("partition-spec-id", spec_id.as_bytes()),
            ("format-version", header.format_version.as_bytes()),
            ("content", content.as_bytes()),
        ];
        container(&metadata, self.count, &self.buf)
    }

    fn manifest_file(&self, path: String, length: i64, spec_id: i32) -> ManifestFile {
        ManifestFile {
            manifest_path: path,
            manifest_length: length,
            partition_spec_id: spec_id,
            content: self.content,
            // Assigned by the manifest list, as iceberg-rust's writer leaves them.
            sequence_number: iceberg::spec::UNASSIGNED_SEQUENCE_NUMBER,
            min_sequence_number: self
                .min_sequence_number
                .unwrap_or(iceberg::spec::UNASSIGNED_SEQUENCE_NUMBER),
            added_snapshot_id: self.snapshot_id.unwrap_or(-1),
            added_files_count: Some(self.added.0),
            existing_files_count: Some(self.existing.0),
            deleted_files_count: Some(self.deleted.0),
            added_rows_count: Some(self.added.1),
            existing_rows_count: Some(self.existing.1),
            deleted_rows_count: Some(self.deleted.1),
            partitions: Some(self.partitions.iter().map(FieldStats::summary).collect()),
            key_metadata: None,
            first_row_id: None,
        }
    }
}

/// What a manifest list says of one partition field over a manifest's files.
#[derive(Default)]
struct FieldStats {
    contains_null: bool,
    contains_nan: bool,
    lower: Option<PrimitiveLiteral>,
    upper: Option<PrimitiveLiteral>,
}

impl FieldStats {
    fn update(&mut self, v: &PrimitiveLiteral) {
        if v.is_nan() {
            self.contains_nan = true;
            return;
        }
        if self.lower.as_ref().is_none_or(|l| v < l) {
            self.lower = Some(v.clone());
        }
        if self.upper.as_ref().is_none_or(|u| v > u) {
            self.upper = Some(v.clone());
        }
    }

    fn summary(&self) -> FieldSummary {
        FieldSummary {
            contains_null: self.contains_null,
            contains_nan: Some(self.contains_nan),
            // Iceberg's binary single-value serialization.
            lower_bound: self
                .lower
                .as_ref()
                .and_then(datum)
                .and_then(|d| d.to_bytes().ok()),
            upper_bound: self
                .upper
                .as_ref()
                .and_then(datum)
                .and_then(|d| d.to_bytes().ok()),
        }
    }
}

/// A partition value as a datum.
fn datum(v: &PrimitiveLiteral) -> Option<Datum> {
    Some(match v {
        PrimitiveLiteral::Boolean(b) => Datum::bool(*b),
        PrimitiveLiteral::Int(i) => Datum::int(*i),
        PrimitiveLiteral::Long(l) => Datum::long(*l),
        PrimitiveLiteral::Float(f) => Datum::float(f.0),
        PrimitiveLiteral::Double(d) => Datum::double(d.0),
        PrimitiveLiteral::String(s) => Datum::string(s),
        PrimitiveLiteral::Binary(b) => Datum::binary(b.clone()),
        // Not a partition value floe encodes (`Kind::fits`).
        _ => return None,
    })
}

/// A partition value in Avro's binary encoding (`Kind::fits` holds).
fn primitive(b: &mut Vec<u8>, v: &PrimitiveLiteral) {
    match v {
        PrimitiveLiteral::Boolean(v) => b.push(u8::from(*v)),
        PrimitiveLiteral::Int(v) => long(b, i64::from(*v)),
        PrimitiveLiteral::Long(v) => long(b, *v),
        PrimitiveLiteral::Float(v) => b.extend_from_slice(&v.0.to_le_bytes()),
        PrimitiveLiteral::Double(v) => b.extend_from_slice(&v.0.to_le_bytes()),
        PrimitiveLiteral::String(v) => bytes(b, v.as_bytes()),
        PrimitiveLiteral::Binary(v) => bytes(b, v),
        _ => {}
    }
}

/// An Avro object container file: `metadata` (the schema and codec among it), then `count`
/// objects encoded in `block` as one block (none when there are none).
pub(super) fn container(metadata: &[(&str, &[u8])], count: u64, block: &[u8]) -> Vec<u8> {
    let sync = *uuid::Uuid::new_v4().as_bytes();
    let size = metadata
        .iter()
        .map(|(k, v)| k.len() + v.len() + 4)
        .sum::<usize>();
    let mut out = Vec::with_capacity(size + block.len() + 64);
    out.extend_from_slice(b"Obj\x01");
    array(&mut out, metadata, |b, (k, v)| {
        bytes(b, k.as_bytes());
        bytes(b, v);
    });
    out.extend_from_slice(&sync);
    if count > 0 {
        long(&mut out, count as i64);
        bytes(&mut out, block);
        out.extend_from_slice(&sync);
    }
    out
}

fn count(v: u64, what: &str) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::Internal(format!("{what} {v} does not fit a long")))
}

/// Avro's `int` and `long`: zig-zag, then 7 bits a byte, low bits first.
pub(super) fn long(b: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        b.push((z as u8) | 0x80);
        z >>= 7;
    }
    b.push(z as u8);
}

/// Avro's `bytes` and `string`: the length, then the bytes.
pub(super) fn bytes(b: &mut Vec<u8>, v: &[u8]) {
    long(b, v.len() as i64);
    b.extend_from_slice(v);
}

/// A `["null", T]` union: branch 0 for none, branch 1 and the value for some.
pub(super) fn optional<T>(b: &mut Vec<u8>, v: Option<T>, write: impl FnOnce(&mut Vec<u8>, T)) {
    match v {
        None => long(b, 0),
        Some(v) => {
            long(b, 1);
            write(b, v);
        }
    }
}

/// An Avro array (or map): one block of all items, then the empty block that ends it.
pub(super) fn array<T>(b: &mut Vec<u8>, items: &[T], mut write: impl FnMut(&mut Vec<u8>, &T)) {
    if !items.is_empty() {
        long(b, items.len() as i64);
        for item in items {
            write(b, item);
        }
    }
    long(b, 0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use iceberg::spec::{Manifest, NestedField, Schema, Transform};

    fn schema() -> SchemaRef {
        Arc::new(
            Schema::builder()
                .with_fields(vec![
                    NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
                    NestedField::optional(2, "name", Type::Primitive(PrimitiveType::String)).into(),
                    NestedField::optional(3, "ts", Type::Primitive(PrimitiveType::Timestamptz))
                        .into(),
                    NestedField::optional(4, "ok", Type::Primitive(PrimitiveType::Boolean)).into(),
                    NestedField::optional(5, "x", Type::Primitive(PrimitiveType::Double)).into(),
                    NestedField::optional(6, "f", Type::Primitive(PrimitiveType::Float)).into(),
                    NestedField::optional(7, "raw", Type::Primitive(PrimitiveType::Binary)).into(),
                    NestedField::optional(
                        8,
                        "price",
                        Type::Primitive(PrimitiveType::Decimal {
                            precision: 10,
                            scale: 2,
                        }),
                    )
                    .into(),
                ])
                .build()
                .unwrap(),
        )
    }

    fn spec(schema: &SchemaRef, fields: &[(&str, Transform)]) -> PartitionSpec {
        let mut b = PartitionSpec::builder(schema.clone()).with_spec_id(3);
        for (i, (column, transform)) in fields.iter().enumerate() {
            b = b
                .add_partition_field(*column, format!("p{i}"), *transform)
                .unwrap();
        }
        b.build().unwrap()
    }

    fn target<'a>(
        io: &FileIO,
        path: &str,
        schema: &'a SchemaRef,
        spec: &'a PartitionSpec,
        content: ManifestContentType,
    ) -> Target<'a> {
        Target {
            output: io.new_output(path).unwrap(),
            snapshot_id: 11,
            schema,
            spec,
            format_version: FormatVersion::V2,
            content,
        }
    }

    fn file(n: i64, partition: Vec<Option<Literal>>, content: DataContentType) -> DataFile {
        DataFileBuilder::default()
            .content(content)
            .file_path(format!("memory:///t/data/{n}.parquet"))
            .file_format(DataFileFormat::Parquet)
            .partition(partition.into_iter().collect())
            .record_count(n as u64 * 10)
            .file_size_in_bytes(1000 + n as u64)
            .column_sizes(HashMap::from([(1, 10), (2, 20), (3, 30)]))
            .value_counts(HashMap::from([(1, 100), (2, 100)]))
            .null_value_counts(HashMap::from([(2, 1)]))
            .lower_bounds(HashMap::from([
                (1, Datum::long(n)),
                (2, Datum::string("a")),
            ]))
            .upper_bounds(HashMap::from([
                (1, Datum::long(n * 2)),
                (2, Datum::string("q")),
            ]))
            .split_offsets(Some(vec![4]))
            .equality_ids((content == DataContentType::EqualityDeletes).then(|| vec![1]))
            .partition_spec_id(3)
            .build()
            .unwrap()
    }

    /// Every partition type floe encodes passes the probe: the fast path is taken.
    #[tokio::test]
    async fn common_partition_types_are_encoded_by_floe() {
        let schema = schema();
        let io = FileIO::new_with_memory();
        let own = |fields: &[(&str, Transform)]| {
            let (io, schema) = (io.clone(), schema.clone());
            let spec = spec(&schema, fields);
            async move {
                let t = target(
                    &io,
                    "memory:///m.avro",
                    &schema,
                    &spec,
                    ManifestContentType::Data,
                );
                ManifestWriter::new(t).await.unwrap().is_own()
            }
        };
        for fields in [
            vec![],
            vec![("id", Transform::Identity), ("name", Transform::Identity)],
            vec![("ts", Transform::Day), ("id", Transform::Bucket(16))],
            vec![("ts", Transform::Hour), ("name", Transform::Truncate(2))],
            vec![("ok", Transform::Identity), ("x", Transform::Identity)],
            vec![("f", Transform::Identity), ("raw", Transform::Identity)],
            vec![("ts", Transform::Identity), ("ts", Transform::Month)],
        ] {
            assert!(
                own(&fields).await,
                "partitioned by {fields:?}: iceberg-rust's writer kept"
            );
        }
        let decimal = [("price", Transform::Identity)];
        assert!(
            !own(&decimal).await,
            "a decimal partition is not floe's to encode"
        );
    }

    /// A manifest floe writes reads back through iceberg-rust's reader as the entries added,
    /// and its manifest-list entry is the one iceberg-rust's writer gives for the same files.
    #[tokio::test]
    async fn manifests_read_back_as_iceberg_rust_writes_them() {
        let schema = schema();
        let io = FileIO::new_with_memory();
        let spec = spec(
            &schema,
            &[("name", Transform::Identity), ("ts", Transform::Day)],
        );
        for content in [ManifestContentType::Data, ManifestContentType::Deletes] {
            let kind = match content {
                ManifestContentType::Data => DataContentType::Data,
                ManifestContentType::Deletes => DataContentType::EqualityDeletes,
            };
            let files: Vec<DataFile> = (1..=5)
                .map(|n| {
                    let name = (n % 2 == 0).then(|| Literal::string(format!("n{n}")));
                    file(n, vec![name, Some(Literal::date(19_000 + n as i32))], kind)
                })
                .collect();
            let mut ours =
                ManifestWriter::new(target(&io, "memory:///ours.avro", &schema, &spec, content))
                    .await
                    .unwrap();
            assert!(ours.is_own());
            let mut theirs = iceberg_writer(target(
                &io,
                "memory:///theirs.avro",
                &schema,
                &spec,
                content,
            ));
            for (i, f) in files.iter().enumerate() {
                match i % 3 {
                    0 => {
                        ours.add_file(f.clone(), -1).unwrap();
                        theirs.add_file(f.clone(), -1).unwrap();
                    }
                    1 => {
                        ours.add_existing_file(f.clone(), 4, 2, Some(2)).unwrap();
                        theirs.add_existing_file(f.clone(), 4, 2, Some(2)).unwrap();
                    }
                    _ => {
                        ours.add_delete_file(f.clone(), 1, Some(1)).unwrap();
                        theirs.add_delete_file(f.clone(), 1, Some(1)).unwrap();
                    }
                }
            }
            let our_file = ours.write_manifest_file().await.unwrap();
            let their_file = theirs.write_manifest_file().await.unwrap();
            let read = |path: &'static str| {
                let io = io.clone();
                async move {
                    let bytes = io.new_input(path).unwrap().read().await.unwrap();
                    Manifest::parse_avro(&bytes).unwrap()
                }
            };
            let (ours_read, theirs_read) = (
                read("memory:///ours.avro").await,
                read("memory:///theirs.avro").await,
            );
            assert_eq!(ours_read, theirs_read, "{content}");
            assert_eq!(ours_read.entries().len(), 5);
            assert_eq!(ours_read.metadata().content, content);
            assert_eq!(
                ManifestFile {
                    manifest_path: String::new(),
                    manifest_length: 0,
                    ..our_file
                },
                ManifestFile {
                    manifest_path: String::new(),
                    manifest_length: 0,
                    ..their_file
                }
            );
        }
    }

    #[tokio::test]
    async fn a_file_of_the_wrong_content_is_refused() {
        let schema = schema();
        let io = FileIO::new_with_memory();
        let spec = spec(&schema, &[]);
        let t = target(
            &io,
            "memory:///m.avro",
            &schema,
            &spec,
            ManifestContentType::Data,
        );
        let mut w = ManifestWriter::new(t).await.unwrap();
        let err = w
            .add_file(file(1, vec![], DataContentType::PositionDeletes), -1)
            .unwrap_err();
        assert!(
            err.to_string().contains("in a manifest of data files"),
            "{err}"
        );
        let err = w
            .add_existing_file(file(1, vec![], DataContentType::Data), 4, 2, None)
            .unwrap_err();
        assert!(
            err.to_string().contains("without its sequence numbers"),
            "{err}"
        );
    }

    #[test]
    fn longs_are_zig_zag_varints() {
        for (v, want) in [
            (0i64, vec![0u8]),
            (-1, vec![1]),
            (1, vec![2]),
            (-64, vec![0x7f]),
            (64, vec![0x80, 0x01]),
            (
                i64::MAX,
                vec![0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
            ),
            (
                i64::MIN,
                vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
            ),
        ] {
            let mut b = Vec::new();
            long(&mut b, v);
            assert_eq!(b, want, "{v}");
            assert_eq!(Read(&b).long(), Some(v));
        }
    }
}
