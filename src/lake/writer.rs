//! Writes Arrow batches into Parquet data files of one Iceberg table.
//!
//! A [`TableWriter`] splits each batch by the table's default partition spec, writes it
//! through iceberg-rust's rolling Parquet writers, and on [`TableWriter::close`] returns the
//! data files it wrote. Nothing is visible in the table until the files are committed
//! (see [`super::commit`]).

use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::parquet;
use datafusion::parquet::basic::{BrotliLevel, Compression, GzipLevel, ZstdLevel};
use datafusion::parquet::file::properties::WriterProperties;
use iceberg::arrow::{RecordBatchPartitionSplitter, schema_to_arrow_schema};
use iceberg::spec::PartitionKey;
use iceberg::spec::{DataFile, DataFileFormat, Struct};
use iceberg::table::Table;
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator, LocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::partitioning::PartitioningWriter;
use iceberg::writer::partitioning::fanout_writer::FanoutWriter;
use iceberg::writer::partitioning::unpartitioned_writer::UnpartitionedWriter;

use super::parquet_file::ParquetFiles;
use crate::error::{Error, Reject, Result};
use crate::schema::conform_array;

type FileWriterBuilder =
    DataFileWriterBuilder<ParquetFiles, EscapedLocationGenerator, DefaultFileNameGenerator>;

/// Data file locations with each partition value URL-encoded, as Iceberg's Java writers do:
/// a value holding `/` or `?` (a truncated URL, say) stays one path segment, which object
/// stores and other readers require.
#[derive(Clone, Debug)]
struct EscapedLocationGenerator {
    data_location: String,
}

impl EscapedLocationGenerator {
    fn new(table: &Table) -> Result<Self> {
        // The default generator knows where data goes (write.data.path and the like).
        let probe = DefaultLocationGenerator::new(table.metadata())?.generate_location(None, "");
        Ok(Self {
            data_location: probe.trim_end_matches('/').to_string(),
        })
    }
}

impl LocationGenerator for EscapedLocationGenerator {
    fn generate_location(&self, key: Option<&PartitionKey>, file_name: &str) -> String {
        let Some(key) = key.filter(|k| !PartitionKey::is_effectively_none(Some(k))) else {
            return format!("{}/{file_name}", self.data_location);
        };
        let spec = key.spec();
        let types = spec.partition_type(key.schema()).ok();
        let segments: Vec<String> = spec
            .fields()
            .iter()
            .enumerate()
            .map(|(i, field)| {
                let value = key.data()[i].as_ref();
                let human = match &types {
                    Some(t) => field
                        .transform
                        .to_human_string(&t.fields()[i].field_type, value),
                    None => "null".to_string(),
                };
                segment(&escape(&field.name), &escape(&human))
            })
            .collect();
        format!("{}/{}/{file_name}", self.data_location, segments.join("/"))
    }
}

/// The longest partition folder name, in bytes (a file name may have 255).
const MAX_SEGMENT_BYTES: usize = 160;

/// A partition folder `name=value`; when that is longer than a folder name may be (a long
/// identity-partition value), the value is cut and a hash of the whole of it added, so that
/// distinct values keep distinct folders. Readers take partition values from the manifests,
/// never from the paths.
fn segment(name: &str, value: &str) -> String {
    let whole = format!("{name}={value}");
    if whole.len() <= MAX_SEGMENT_BYTES {
        return whole;
    }
    // FNV-1a, 64 bits: stable, and enough to tell values apart within a partition.
    let hash = whole.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let mut cut = MAX_SEGMENT_BYTES - 17;
    // The escaped text is ASCII; do not end inside an escape (`%XX`).
    while cut > 0 && whole[..cut].rfind('%').is_some_and(|p| p + 3 > cut) {
        cut -= 1;
    }
    format!("{}-{hash:016x}", &whole[..cut])
}

/// Percent-encoding of everything but unreserved URL characters.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

enum Inner {
    Unpartitioned(Box<UnpartitionedWriter<FileWriterBuilder>>),
    Partitioned {
        writer: Box<FanoutWriter<FileWriterBuilder>>,
        splitter: Box<RecordBatchPartitionSplitter>,
    },
}

/// How large a writer's row groups grow.
#[derive(Debug, Clone, Copy)]
enum RowGroups {
    /// As the table's `write.parquet.row-group-size-bytes` says.
    Table,
    /// As the table says, or ended earlier by the caller ([`TableWriter::end_row_group`]).
    OnDemand,
    /// As the table says, but at most this many bytes.
    AtMost(usize),
}

/// Writes batches of one table's rows into uncommitted data files.
pub struct TableWriter {
    inner: Inner,
    /// Every file `inner` opens, to end their row groups.
    files: ParquetFiles,
    /// The table's schema as Arrow, with Iceberg field ids in the field metadata.
    schema: SchemaRef,
    rows: u64,
    /// The partitions written (one open file each).
    partitions: HashSet<Struct>,
    /// Bytes (in Arrow) written to the open files, when the storage holds what is written to
    /// a file in memory until a part's worth (object stores), else `None`.
    held: Option<usize>,
}

/// What an object store's writer holds in memory per open file at most: S3's multipart
/// uploads send parts of 5 MiB.
const OBJECT_STORE_PART: usize = 8 << 20;

impl TableWriter {
    /// A writer for `table`'s current schema and default partition spec, whose row groups
    /// are as large as the table's `write.parquet.row-group-size-bytes` (the rows of a row
    /// group being written are held encoded, with encoders and compression contexts per
    /// column).
    pub fn try_new(table: &Table) -> Result<Self> {
        Self::build(table, RowGroups::Table, None)
    }

    /// A writer as [`TableWriter::try_new`]'s whose files roll over at about `target` bytes
    /// instead of the table's `write.target-file-size-bytes`, and whose row groups hold at
    /// most `row_group_bytes` when given (compaction's target and memory budget).
    pub fn for_rewrite(table: &Table, target: u64, row_group_bytes: Option<usize>) -> Result<Self> {
        Self::build(
            table,
            row_group_bytes.map_or(RowGroups::Table, RowGroups::AtMost),
            Some(target),
        )
    }

    /// A writer whose caller ends its row groups ([`TableWriter::end_row_group`]): between
    /// row groups it holds open files only, none of the encoders of a row group under way
    /// (about a MiB per table whatever its rows). For callers that gather rows and choose
    /// the row groups' sizes themselves, as routed sinks writing many tables do.
    pub fn row_groups_on_demand(table: &Table) -> Result<Self> {
        Self::build(table, RowGroups::OnDemand, None)
    }

    fn build(table: &Table, row_groups: RowGroups, target: Option<u64>) -> Result<Self> {
        let metadata = table.metadata();
        let props = metadata.table_properties()?;
        let format = DataFileFormat::from_str(&props.write_format_default)?;
        if format != DataFileFormat::Parquet {
            return Err(Error::Unsupported(format!(
                "table {} has write.format.default = '{}'; floe writes Parquet only",
                table.identifier(),
                props.write_format_default
            )));
        }
        let iceberg_schema = metadata.current_schema().clone();
        let mut properties = writer_properties(metadata.properties())
            .map_err(|e| Error::Option(format!("table {}: {e}", table.identifier())))?;
        let cap = match row_groups {
            RowGroups::AtMost(bytes) => Some(bytes.max(1 << 20)),
            RowGroups::Table | RowGroups::OnDemand => None,
        };
        if let Some(cap) = cap {
            let cap = properties.max_row_group_bytes().map_or(cap, |t| t.min(cap));
            properties = properties
                .into_builder()
                .set_max_row_group_bytes(Some(cap))
                .build();
        }
        let arrow = Arc::new(schema_to_arrow_schema(&iceberg_schema)?);
        let parquet = ParquetFiles::new(properties, iceberg_schema.clone(), arrow.clone());
        let rolling = RollingFileWriterBuilder::new(
            parquet.clone(),
            target.map_or(props.write_target_file_size_bytes, |t| t as usize),
            // Synced together before a commit or checkpoint record names them.
            crate::lake::storage::deferring(table.file_io(), metadata.location()),
            EscapedLocationGenerator::new(table)?,
            DefaultFileNameGenerator::new(uuid_like_prefix(), None, DataFileFormat::Parquet),
        );
        let builder = DataFileWriterBuilder::new(rolling);
        let spec = metadata.default_partition_spec().clone();
        let inner = if spec.is_unpartitioned() {
            Inner::Unpartitioned(Box::new(UnpartitionedWriter::new(builder)))
        } else {
            Inner::Partitioned {
                writer: Box::new(FanoutWriter::new(builder)),
                splitter: Box::new(RecordBatchPartitionSplitter::try_new_with_computed_values(
                    iceberg_schema.clone(),
                    spec,
                )?),
            }
        };
        Ok(Self {
            inner,
            files: parquet,
            schema: arrow,
            rows: 0,
            partitions: HashSet::new(),
            held: Self::holds_open_files(table).then_some(0),
        })
    }

    /// Whether `table`'s open files hold something between writes (see
    /// [`Self::open_files`]): on an object store, not on a local disk.
    pub fn holds_open_files(table: &Table) -> bool {
        !is_local(table.metadata().location())
    }

    /// Rows written so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Files open that hold something of the process between writes: on an object store
    /// one per partition written (each holds its upload's part in memory and a connection);
    /// none on a local disk, whose files hold no descriptor between row groups.
    pub fn open_files(&self) -> usize {
        match self.held {
            Some(_) => self.partitions.len().max(1),
            None => 0,
        }
    }

    /// About how much memory the storage holds for the open files (object stores upload a
    /// file in parts, holding each part until it is complete; a local file holds nothing).
    pub fn held_bytes(&self) -> usize {
        self.held
            .map_or(0, |b| b.min(OBJECT_STORE_PART * self.open_files()))
    }

    /// Encode the columns of large writes on up to `threads` threads at once (the writing
    /// one and helpers; see [`ParquetFiles::encoding_on`]), rather than on the writing
    /// thread alone.
    pub fn encoding_on(self, threads: usize) -> Self {
        self.files.encoding_on(threads);
        self
    }

    /// Write one batch whose columns are the table's columns, in order.
    pub async fn write(&mut self, batch: RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let batch = self.conform(batch)?;
        self.rows += batch.num_rows() as u64;
        if let Some(held) = &mut self.held {
            *held += batch.get_array_memory_size();
        }
        match &mut self.inner {
            Inner::Unpartitioned(w) => w.write(batch).await?,
            Inner::Partitioned { writer, splitter } => {
                for (key, part) in splitter.split(&batch)? {
                    if !self.partitions.contains(key.data()) {
                        self.partitions.insert(key.data().clone());
                    }
                    writer.write(key, part).await?;
                }
            }
        }
        Ok(())
    }

    /// End the row group under way in every open file (the rows written since the last
    /// one become a row group of each file).
    pub async fn end_row_group(&mut self) -> Result<()> {
        Ok(self.files.end_row_groups().await?)
    }

    /// Close every open file and return the data files written.
    pub async fn close(self) -> Result<Vec<DataFile>> {
        Ok(match self.inner {
            Inner::Unpartitioned(w) => w.close().await?,
            Inner::Partitioned { writer, .. } => writer.close().await?,
        })
    }

    /// Re-label the batch with the table's Arrow schema (which carries the field ids the
    /// writers and the partition calculator look for), casting where only nested field
    /// metadata differs.
    fn conform(&self, batch: RecordBatch) -> Result<RecordBatch> {
        if batch.num_columns() != self.schema.fields().len() {
            return Err(Error::Internal(format!(
                "a batch with {} columns was sent to a table with {}",
                batch.num_columns(),
                self.schema.fields().len()
            )));
        }
        let columns = batch
            .columns()
            .iter()
            .zip(self.schema.fields())
            .map(|(col, field)| conform_array(field, col))
            .collect::<Result<Vec<_>>>()?;
        RecordBatch::try_new(self.schema.clone(), columns).map_err(|e| {
            Error::Record(Reject::new(format!(
                "rows do not fit the table's schema: {e}"
            )))
        })
    }
}

/// Whether a table location is on the local file system.
fn is_local(location: &str) -> bool {
    match url::Url::parse(location) {
        Ok(url) => url.scheme() == "file",
        // A path without a scheme.
        Err(_) => true,
    }
}

/// Parquet writer settings from a table's `write.parquet.*` properties, with Iceberg's
/// defaults: zstd, 1 MiB pages of at most 20,000 rows, 2 MiB dictionaries, 128 MiB row groups.
fn writer_properties(
    props: &HashMap<String, String>,
) -> std::result::Result<WriterProperties, String> {
    let number = |key: &str, default: usize| -> std::result::Result<usize, String> {
        match props.get(key) {
            None => Ok(default),
            Some(v) => v
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("'{key}' = '{v}' is not a positive number")),
        }
    };
    let level = props
        .get(COMPRESSION_LEVEL)
        .map(|v| {
            v.trim()
                .parse::<i32>()
                .map_err(|_| format!("'{COMPRESSION_LEVEL}' = '{v}' is not a number"))
        })
        .transpose()?;
    let codec = props
        .get(COMPRESSION_CODEC)
        .map(|c| c.trim().to_ascii_lowercase())
        .unwrap_or_else(|| "zstd".to_string());
    let bad_level = |e: parquet::errors::ParquetError| {
        format!("'{COMPRESSION_LEVEL}' does not suit '{codec}': {e}")
    };
    let compression = match codec.as_str() {
        "zstd" => Compression::ZSTD(match level {
            Some(l) => ZstdLevel::try_new(l).map_err(bad_level)?,
            None => ZstdLevel::default(),
        }),
        "gzip" => Compression::GZIP(match level {
            Some(l) => GzipLevel::try_new(l.max(0) as u32).map_err(bad_level)?,
            None => GzipLevel::default(),
        }),
        "brotli" => Compression::BROTLI(match level {
            Some(l) => BrotliLevel::try_new(l.max(0) as u32).map_err(bad_level)?,
            None => BrotliLevel::default(),
        }),
        "snappy" => Compression::SNAPPY,
        "lz4" => Compression::LZ4_RAW,
        "uncompressed" | "none" => Compression::UNCOMPRESSED,
        other => {
            return Err(format!(
                "'{COMPRESSION_CODEC}' = '{other}': use zstd, gzip, brotli, snappy, lz4 or \
                 uncompressed"
            ));
        }
    };
    Ok(WriterProperties::builder()
        .set_compression(compression)
        .set_data_page_size_limit(number("write.parquet.page-size-bytes", 1 << 20)?)
        .set_data_page_row_count_limit(number("write.parquet.page-row-limit", 20_000)?)
        .set_dictionary_page_size_limit(number("write.parquet.dict-size-bytes", 2 << 20)?)
        .set_max_row_group_bytes(Some(number(ROW_GROUP_SIZE, DEFAULT_ROW_GROUP_BYTES)?))
        .build())
}

const COMPRESSION_CODEC: &str = "write.parquet.compression-codec";
const ROW_GROUP_SIZE: &str = "write.parquet.row-group-size-bytes";
/// Iceberg's default `write.parquet.row-group-size-bytes`.
const DEFAULT_ROW_GROUP_BYTES: usize = 128 << 20;

/// The row-group size a table's writers aim at (`write.parquet.row-group-size-bytes`, else
/// Iceberg's default, 128 MiB; a value that is not a positive number reads as the default).
pub fn row_group_bytes(props: &HashMap<String, String>) -> u64 {
    props
        .get(ROW_GROUP_SIZE)
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(DEFAULT_ROW_GROUP_BYTES as u64)
}
const COMPRESSION_LEVEL: &str = "write.parquet.compression-level";

/// A unique file-name prefix per writer, so that concurrent writers never collide.
fn uuid_like_prefix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!(
        "{nanos:x}-{:x}-{:x}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_partition_values_make_folders_a_file_system_allows() {
        assert_eq!(segment("region", "eu"), "region=eu");
        let long = escape(&"é".repeat(300));
        let a = segment("name", &long);
        let b = segment("name", &format!("{long}x"));
        assert!(a.len() <= MAX_SEGMENT_BYTES, "{}", a.len());
        assert_ne!(a, b, "distinct values, distinct folders");
        assert!(a.starts_with("name=%C3%A9"), "{a}");
        let cut = a.rsplit_once('-').unwrap().0;
        assert!(
            !cut.ends_with('%') && !cut[cut.len() - 2..].contains('%'),
            "{a}"
        );
    }

    #[test]
    fn parquet_settings_follow_table_properties() {
        let props = |kv: &[(&str, &str)]| -> HashMap<String, String> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let default = writer_properties(&props(&[])).unwrap();
        let col = parquet::schema::types::ColumnPath::from("x");
        assert_eq!(
            default.compression(&col),
            Compression::ZSTD(ZstdLevel::default())
        );
        assert_eq!(default.data_page_size_limit(), 1 << 20);
        let gzip = writer_properties(&props(&[
            (COMPRESSION_CODEC, "GZIP"),
            (COMPRESSION_LEVEL, "9"),
            ("write.parquet.page-size-bytes", "65536"),
        ]))
        .unwrap();
        assert_eq!(
            gzip.compression(&col),
            Compression::GZIP(GzipLevel::try_new(9).unwrap())
        );
        assert_eq!(gzip.data_page_size_limit(), 65536);
        let err = writer_properties(&props(&[(COMPRESSION_CODEC, "lzo")])).unwrap_err();
        assert!(
            err.contains("'write.parquet.compression-codec' = 'lzo'"),
            "{err}"
        );
        let err = writer_properties(&props(&[(COMPRESSION_LEVEL, "99")])).unwrap_err();
        assert!(err.contains("compression-level"), "{err}");
        let err =
            writer_properties(&props(&[("write.parquet.page-size-bytes", "-1")])).unwrap_err();
        assert!(err.contains("page-size-bytes"), "{err}");
    }

    #[test]
    fn object_store_locations_are_not_local() {
        assert!(is_local("file:///tmp/wh/ns/t"));
        assert!(is_local("/tmp/wh/ns/t"));
        assert!(!is_local("s3://warehouse/ns/t"));
        assert!(!is_local("gs://b/ns/t"));
    }

    /// The checkpoint commit takes the files the writer returned as they are, where a commit
    /// after a restart reads them back from the checkpoint record's JSON: the two must be the
    /// same files, for every kind of column and partition.
    #[tokio::test]
    async fn written_files_read_back_from_json_as_they_were() {
        use datafusion::arrow::array::{
            BooleanArray, Date32Array, Decimal128Array, Float64Array, Int64Array, LargeBinaryArray,
            StringArray, TimestampMicrosecondArray,
        };
        use iceberg::spec::{
            FormatVersion, NestedField, PartitionSpec, PrimitiveType, Schema, Transform, Type,
            deserialize_data_file_from_json, serialize_data_file_to_json,
        };
        let p = |t| Type::Primitive(t);
        let schema = Schema::builder()
            .with_fields(vec![
                NestedField::required(1, "id", p(PrimitiveType::Long)).into(),
                NestedField::optional(2, "name", p(PrimitiveType::String)).into(),
                NestedField::optional(3, "ts", p(PrimitiveType::Timestamptz)).into(),
                NestedField::optional(4, "x", p(PrimitiveType::Double)).into(),
                NestedField::optional(5, "ok", p(PrimitiveType::Boolean)).into(),
                NestedField::optional(6, "day", p(PrimitiveType::Date)).into(),
                NestedField::optional(7, "raw", p(PrimitiveType::Binary)).into(),
                NestedField::optional(
                    8,
                    "price",
                    p(PrimitiveType::Decimal {
                        precision: 10,
                        scale: 2,
                    }),
                )
                .into(),
            ])
            .build()
            .unwrap();
        let spec = PartitionSpec::builder(schema.clone())
            .add_partition_field("name", "name", Transform::Identity)
            .unwrap()
            .add_partition_field("ts", "ts_day", Transform::Day)
            .unwrap()
            .add_partition_field("id", "id_bucket", Transform::Bucket(4))
            .unwrap()
            .add_partition_field("price", "price", Transform::Identity)
            .unwrap()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        for format in [FormatVersion::V2, FormatVersion::V3] {
            let io = iceberg::io::FileIOBuilder::new(Arc::new(
                crate::lake::storage::LocalStorageFactory,
            ))
            .build();
            let table = crate::lake::commit::new_table(
                schema.clone(),
                spec.clone().into_unbound(),
                format!("{}/t{format}", dir.path().display()),
                format,
                io,
            );
            let mut writer = TableWriter::try_new(&table).unwrap();
            let rows = 6;
            let batch = RecordBatch::try_new(
                writer.schema.clone(),
                vec![
                    Arc::new(Int64Array::from_iter_values(0..rows)),
                    Arc::new(StringArray::from(vec![
                        Some("a/b"),
                        None,
                        Some("a/b"),
                        Some("é"),
                        None,
                        Some("z"),
                    ])),
                    Arc::new(
                        TimestampMicrosecondArray::from(vec![
                            Some(0),
                            Some(86_400_000_001),
                            None,
                            Some(-5),
                            Some(1),
                            Some(2),
                        ])
                        .with_timezone("+00:00"),
                    ),
                    Arc::new(Float64Array::from(vec![
                        Some(f64::NAN),
                        Some(1.5),
                        None,
                        Some(-0.0),
                        Some(2.0),
                        Some(f64::INFINITY),
                    ])),
                    Arc::new(BooleanArray::from(vec![
                        Some(true),
                        None,
                        Some(false),
                        Some(true),
                        Some(true),
                        Some(false),
                    ])),
                    Arc::new(Date32Array::from(vec![
                        Some(0),
                        Some(-1),
                        None,
                        Some(9),
                        Some(1),
                        Some(2),
                    ])),
                    Arc::new(LargeBinaryArray::from(vec![
                        Some(&b"\x00\xff"[..]),
                        None,
                        Some(&b""[..]),
                        Some(&b"x"[..]),
                        Some(&b"y"[..]),
                        None,
                    ])),
                    Arc::new(
                        Decimal128Array::from(vec![
                            Some(1234),
                            None,
                            Some(-1),
                            Some(1234),
                            None,
                            Some(5),
                        ])
                        .with_precision_and_scale(10, 2)
                        .unwrap(),
                    ),
                ],
            )
            .unwrap();
            writer.write(batch).await.unwrap();
            let files = writer.close().await.unwrap();
            assert!(files.len() > 3, "{} files", files.len());
            let md = table.metadata();
            let partition_type = spec.partition_type(md.current_schema()).unwrap();
            for f in files {
                assert!(!f.lower_bounds().is_empty() && !f.nan_value_counts().is_empty());
                let json = serialize_data_file_to_json(f.clone(), &partition_type, format).unwrap();
                let back = deserialize_data_file_from_json(
                    &json,
                    md.default_partition_spec_id(),
                    &partition_type,
                    md.current_schema(),
                )
                .unwrap();
                assert_eq!(back, f, "{format}: {json}");
            }
        }
    }

    #[test]
    fn partition_values_are_one_path_segment() {
        assert_eq!(escape("firefox/"), "firefox%2F");
        assert_eq!(escape("2024-05-01"), "2024-05-01");
        assert_eq!(escape("a b?c=d"), "a%20b%3Fc%3Dd");
    }
}
