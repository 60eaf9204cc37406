//! floe's Parquet data-file writer, behind iceberg-rust's file-writer traits (so its rolling,
//! partitioning and data-file writers wrap it): iceberg-rust's own ends a row group only
//! when it reaches its size, while a routed table's rows arrive in slices that belong in one
//! row group and the table's files stay open between row groups. [`ParquetFiles::end_row_groups`]
//! ends the row group under way in every file the writer has open, so the slices are
//! encoded as they come, without joining them first.
//!
//! A closed file's statistics (sizes, value, NULL and NaN counts, lower and upper bounds by
//! field id) are taken from the Parquet footer and the rows, as Iceberg's writers record
//! them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Float32Type, Float64Type, SchemaRef};
use datafusion::parquet::arrow::AsyncArrowWriter;
use datafusion::parquet::arrow::PARQUET_FIELD_ID_META_KEY;
use datafusion::parquet::arrow::async_writer::AsyncFileWriter;
use datafusion::parquet::errors::ParquetError;
use datafusion::parquet::file::metadata::ParquetMetaData;
use datafusion::parquet::file::properties::WriterProperties;
use datafusion::parquet::file::statistics::Statistics;
use futures::future::BoxFuture;
use iceberg::io::{FileWrite, OutputFile};
use iceberg::spec::{
    DataContentType, DataFileBuilder, DataFileFormat, Datum, PrimitiveType, Struct, Type,
};
use iceberg::writer::CurrentFileStatus;
use iceberg::writer::file_writer::{FileWriter, FileWriterBuilder};
use iceberg::{Error, ErrorKind, Result};

/// Builds a [`ParquetFile`] per data file; every clone shares the set of files open, whose
/// row groups under way [`Self::end_row_groups`] ends.
#[derive(Clone)]
pub struct ParquetFiles {
    props: WriterProperties,
    schema: iceberg::spec::SchemaRef,
    /// The table's schema as Arrow, with the field ids (what the rows come as).
    arrow: SchemaRef,
    open: Arc<Mutex<Vec<Weak<Mutex<Encoding>>>>>,
}

impl ParquetFiles {
    pub fn new(
        props: WriterProperties,
        schema: iceberg::spec::SchemaRef,
        arrow: SchemaRef,
    ) -> Self {
        Self {
            props,
            schema,
            arrow,
            open: Default::default(),
        }
    }

    /// End the row group under way in every file open (written out: nothing of it stays
    /// held but the file's footer entry).
    pub async fn end_row_groups(&self) -> Result<()> {
        let open: Vec<Arc<Mutex<Encoding>>> = {
            let mut open = lock(&self.open);
            open.retain(|f| f.strong_count() > 0);
            open.iter().filter_map(Weak::upgrade).collect()
        };
        for file in open {
            let writer = lock(&file).writer.take();
            let Some(mut writer) = writer else { continue };
            let flushed = writer.flush().await;
            let mut encoding = lock(&file);
            encoding.size = writer.bytes_written() + writer.in_progress_size();
            encoding.writer = Some(writer);
            flushed.map_err(|e| parquet_error("ending a row group", e))?;
        }
        Ok(())
    }
}

impl FileWriterBuilder for ParquetFiles {
    type R = ParquetFile;

    async fn build(&self, output: OutputFile) -> Result<ParquetFile> {
        let encoding = Arc::new(Mutex::new(Encoding {
            writer: None,
            size: 0,
        }));
        {
            // (Files closed since are forgotten here too, for writers never told to end
            // their row groups.)
            let mut open = lock(&self.open);
            open.retain(|f| f.strong_count() > 0);
            open.push(Arc::downgrade(&encoding));
        }
        Ok(ParquetFile {
            files: self.clone(),
            output,
            encoding,
            rows: 0,
            nans: HashMap::new(),
        })
    }
}

/// One data file being written.
pub struct ParquetFile {
    files: ParquetFiles,
    output: OutputFile,
    encoding: Arc<Mutex<Encoding>>,
    rows: usize,
    /// NaN values per float and double field id (every such field written counted, zero or not).
    nans: HashMap<i32, u64>,
}

/// The encoder of a file, shared with the [`ParquetFiles`] that made it (it ends its row
/// groups). Out of the lock while it writes.
struct Encoding {
    writer: Option<AsyncArrowWriter<Output>>,
    /// Bytes written and under way, as of the last write.
    size: usize,
}

impl FileWriter for ParquetFile {
    async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        self.rows += batch.num_rows();
        count_nans(batch, &mut self.nans);
        let taken = lock(&self.encoding).writer.take();
        let mut writer = match taken {
            Some(w) => w,
            None => AsyncArrowWriter::try_new(
                Output(self.output.writer().await?),
                self.files.arrow.clone(),
                Some(self.files.props.clone()),
            )
            .map_err(|e| parquet_error("starting a Parquet file", e))?,
        };
        let written = writer.write(batch).await;
        let mut encoding = lock(&self.encoding);
        encoding.size = writer.bytes_written() + writer.in_progress_size();
        encoding.writer = Some(writer);
        written.map_err(|e| parquet_error("writing rows to a Parquet file", e))
    }

    async fn close(self) -> Result<Vec<DataFileBuilder>> {
        let taken = lock(&self.encoding).writer.take();
        let Some(mut writer) = taken else {
            return Ok(Vec::new());
        };
        let metadata = writer
            .finish()
            .await
            .map_err(|e| parquet_error("finishing a Parquet file", e))?;
        let size = writer.bytes_written();
        if self.rows == 0 {
            self.output.delete().await?;
            return Ok(Vec::new());
        }
        let mut builder = data_file(&self.files.schema, &metadata, size as u64)?;
        builder
            .file_path(self.output.location().to_string())
            .nan_value_counts(self.nans);
        Ok(vec![builder])
    }
}

impl CurrentFileStatus for ParquetFile {
    fn current_file_path(&self) -> String {
        self.output.location().to_string()
    }

    fn current_row_num(&self) -> usize {
        self.rows
    }

    fn current_written_size(&self) -> usize {
        lock(&self.encoding).size
    }
}

/// A data file's entry, but for its path and NaN counts, from its Parquet footer: sizes and
/// counts per column, and the exact minimum and maximum values Parquet recorded as the
/// field's lower and upper bounds.
fn data_file(
    schema: &iceberg::spec::Schema,
    metadata: &ParquetMetaData,
    size: u64,
) -> Result<DataFileBuilder> {
    let mut sizes: HashMap<i32, u64> = HashMap::new();
    let mut values: HashMap<i32, u64> = HashMap::new();
    let mut nulls: HashMap<i32, u64> = HashMap::new();
    let mut lower: HashMap<i32, Datum> = HashMap::new();
    let mut upper: HashMap<i32, Datum> = HashMap::new();
    for group in metadata.row_groups() {
        for column in group.columns() {
            let leaf = column.column_descr().self_type();
            let info = leaf.get_basic_info();
            if !info.has_id() {
                continue;
            }
            let id = info.id();
            let Some(Type::Primitive(ty)) = schema.field_by_id(id).map(|f| f.field_type.as_ref())
            else {
                continue;
            };
            *sizes.entry(id).or_default() += column.compressed_size() as u64;
            *values.entry(id).or_default() += column.num_values() as u64;
            let Some(stats) = column.statistics() else {
                continue;
            };
            if let Some(n) = stats.null_count_opt() {
                *nulls.entry(id).or_default() += n;
            }
            if stats.min_is_exact()
                && let Some(min) = bound(ty, stats, stats.min_bytes_opt())?
            {
                match lower.get(&id) {
                    Some(l) if *l <= min => {}
                    _ => {
                        lower.insert(id, min);
                    }
                }
            }
            if stats.max_is_exact()
                && let Some(max) = bound(ty, stats, stats.max_bytes_opt())?
            {
                match upper.get(&id) {
                    Some(u) if *u >= max => {}
                    _ => {
                        upper.insert(id, max);
                    }
                }
            }
        }
    }
    let mut builder = DataFileBuilder::default();
    builder
        .content(DataContentType::Data)
        .file_format(DataFileFormat::Parquet)
        .partition(Struct::empty())
        .record_count(metadata.file_metadata().num_rows() as u64)
        .file_size_in_bytes(size)
        .column_sizes(sizes)
        .value_counts(values)
        .null_value_counts(nulls)
        .lower_bounds(lower)
        .upper_bounds(upper)
        .split_offsets(Some(
            metadata
                .row_groups()
                .iter()
                .filter_map(|g| g.file_offset())
                .collect(),
        ));
    Ok(builder)
}

/// A Parquet statistic's value (`bytes`, as Parquet keeps it: little-endian numbers) as a
/// value of the field's type. Iceberg's single-value form is the same but for decimals
/// (big-endian, however Parquet stores them) and UUIDs (Parquet's 16 bytes, as Iceberg's).
fn bound(ty: &PrimitiveType, stats: &Statistics, bytes: Option<&[u8]>) -> Result<Option<Datum>> {
    let Some(bytes) = bytes else {
        return Ok(None);
    };
    let decimal;
    let bytes = match (ty, stats) {
        (PrimitiveType::Decimal { .. }, Statistics::Int32(_)) => {
            let v = i32::from_le_bytes(bytes.try_into()?);
            decimal = i128::from(v).to_be_bytes();
            &decimal[..]
        }
        (PrimitiveType::Decimal { .. }, Statistics::Int64(_)) => {
            let v = i64::from_le_bytes(bytes.try_into()?);
            decimal = i128::from(v).to_be_bytes();
            &decimal[..]
        }
        (_, Statistics::Int96(_)) => return Ok(None),
        _ => bytes,
    };
    Datum::try_from_bytes(bytes, ty.clone()).map(Some)
}

/// Count the NaN values of `batch`'s float and double columns (at any depth) by field id.
fn count_nans(batch: &RecordBatch, nans: &mut HashMap<i32, u64>) {
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        count_column_nans(field, column, nans);
    }
}

fn count_column_nans(field: &Field, column: &ArrayRef, nans: &mut HashMap<i32, u64>) {
    let id = || {
        field
            .metadata()
            .get(PARQUET_FIELD_ID_META_KEY)
            .and_then(|v| v.parse::<i32>().ok())
    };
    match column.data_type() {
        DataType::Float32 => {
            if let Some(id) = id() {
                let a = column.as_primitive::<Float32Type>();
                let n = a.iter().filter(|v| v.is_some_and(f32::is_nan)).count();
                *nans.entry(id).or_default() += n as u64;
            }
        }
        DataType::Float64 => {
            if let Some(id) = id() {
                let a = column.as_primitive::<Float64Type>();
                let n = a.iter().filter(|v| v.is_some_and(f64::is_nan)).count();
                *nans.entry(id).or_default() += n as u64;
            }
        }
        DataType::Struct(fields) => {
            let s = column.as_struct();
            for (f, c) in fields.iter().zip(s.columns()) {
                count_column_nans(f, c, nans);
            }
        }
        DataType::List(element) => {
            let list = column.as_list::<i32>();
            count_column_nans(
                element,
                &values_of(list.values(), list.value_offsets()),
                nans,
            );
        }
        DataType::LargeList(element) => {
            let list = column.as_list::<i64>();
            let offsets: Vec<i32> = list.value_offsets().iter().map(|&o| o as i32).collect();
            count_column_nans(element, &values_of(list.values(), &offsets), nans);
        }
        DataType::Map(entries, _) => {
            let map = column.as_map();
            let entries_array: ArrayRef = Arc::new(map.entries().clone());
            count_column_nans(
                entries,
                &values_of(&entries_array, map.value_offsets()),
                nans,
            );
        }
        _ => {}
    }
}

/// The part of a list's values its (possibly sliced) offsets cover.
fn values_of(values: &ArrayRef, offsets: &[i32]) -> ArrayRef {
    match (offsets.first(), offsets.last()) {
        (Some(&first), Some(&last)) => values.slice(first as usize, (last - first) as usize),
        _ => values.slice(0, 0),
    }
}

/// An iceberg-rust output file as the sink of Parquet's async writer.
struct Output(Box<dyn FileWrite>);

impl AsyncFileWriter for Output {
    fn write(&mut self, bytes: Bytes) -> BoxFuture<'_, datafusion::parquet::errors::Result<()>> {
        Box::pin(async move {
            self.0
                .write(bytes)
                .await
                .map_err(|e| ParquetError::External(Box::new(e)))
        })
    }

    fn complete(&mut self) -> BoxFuture<'_, datafusion::parquet::errors::Result<()>> {
        Box::pin(async move {
            self.0
                .close()
                .await
                .map_err(|e| ParquetError::External(Box::new(e)))
        })
    }
}

fn parquet_error(doing: &str, e: ParquetError) -> Error {
    Error::new(ErrorKind::Unexpected, format!("{doing}: {e}")).with_source(e)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{
        ArrayRef, BooleanArray, Date32Array, Decimal128Array, FixedSizeBinaryArray, Float32Array,
        Float64Array, Int32Array, Int64Array, LargeBinaryArray, ListArray, MapArray, RecordBatch,
        StringArray, StructArray, Time64MicrosecondArray, TimestampMicrosecondArray,
        TimestampNanosecondArray,
    };
    use datafusion::arrow::buffer::OffsetBuffer;
    use datafusion::arrow::datatypes::{DataType, Float32Type};
    use datafusion::parquet::file::properties::WriterProperties;
    use iceberg::arrow::schema_to_arrow_schema;
    use iceberg::io::{FileIO, FileIOBuilder};
    use iceberg::spec::{
        DataFile, ListType, MapType, NestedField, PrimitiveType, Schema, StructType, Type,
    };
    use iceberg::writer::file_writer::{FileWriter, FileWriterBuilder, ParquetWriterBuilder};

    use super::ParquetFiles;

    fn schema() -> Schema {
        let p = Type::Primitive;
        let decimal = |precision, scale| PrimitiveType::Decimal { precision, scale };
        Schema::builder()
            .with_fields(vec![
                NestedField::optional(1, "i", p(PrimitiveType::Int)).into(),
                NestedField::required(2, "l", p(PrimitiveType::Long)).into(),
                NestedField::optional(3, "f", p(PrimitiveType::Float)).into(),
                NestedField::optional(4, "d", p(PrimitiveType::Double)).into(),
                NestedField::optional(5, "b", p(PrimitiveType::Boolean)).into(),
                NestedField::optional(6, "s", p(PrimitiveType::String)).into(),
                NestedField::optional(7, "day", p(PrimitiveType::Date)).into(),
                NestedField::optional(8, "t", p(PrimitiveType::Time)).into(),
                NestedField::optional(9, "ts", p(PrimitiveType::Timestamp)).into(),
                NestedField::optional(10, "tz", p(PrimitiveType::Timestamptz)).into(),
                NestedField::optional(11, "ns", p(PrimitiveType::TimestampNs)).into(),
                NestedField::optional(12, "d9", p(decimal(9, 2))).into(),
                NestedField::optional(13, "d18", p(decimal(18, 3))).into(),
                NestedField::optional(14, "d38", p(decimal(38, 4))).into(),
                NestedField::optional(15, "raw", p(PrimitiveType::Binary)).into(),
                NestedField::optional(16, "u", p(PrimitiveType::Uuid)).into(),
                NestedField::optional(17, "fx", p(PrimitiveType::Fixed(3))).into(),
                NestedField::optional(
                    18,
                    "st",
                    Type::Struct(StructType::new(vec![
                        NestedField::optional(19, "x", p(PrimitiveType::Float)).into(),
                        NestedField::optional(20, "y", p(PrimitiveType::String)).into(),
                    ])),
                )
                .into(),
                NestedField::optional(
                    21,
                    "xs",
                    Type::List(ListType::new(
                        NestedField::list_element(22, p(PrimitiveType::Double), false).into(),
                    )),
                )
                .into(),
                NestedField::optional(
                    23,
                    "m",
                    Type::Map(MapType::new(
                        NestedField::map_key_element(24, p(PrimitiveType::String)).into(),
                        NestedField::map_value_element(25, p(PrimitiveType::Float), false).into(),
                    )),
                )
                .into(),
            ])
            .build()
            .unwrap()
    }

    /// Six rows of every type, with NULLs, NaNs, negative values and a long string (whose
    /// statistics Parquet truncates).
    fn batch(arrow: &datafusion::arrow::datatypes::SchemaRef, offset: i64) -> RecordBatch {
        let long = "z".repeat(100);
        let field = |i: usize| arrow.field(i).clone();
        let DataType::Struct(st) = field(17).data_type().clone() else {
            panic!("st is a struct")
        };
        let DataType::List(element) = field(18).data_type().clone() else {
            panic!("xs is a list")
        };
        let DataType::Map(entries, _) = field(19).data_type().clone() else {
            panic!("m is a map")
        };
        let DataType::Struct(kv) = entries.data_type().clone() else {
            panic!("map entries are a struct")
        };
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int32Array::from(vec![Some(3), None, Some(-7), Some(0), Some(9), None])),
            Arc::new(Int64Array::from_iter_values((0..6).map(|v| v * 1000 - offset))),
            Arc::new(Float32Array::from(vec![
                Some(f32::NAN),
                Some(1.5),
                None,
                Some(-2.0),
                Some(f32::NAN),
                Some(0.0),
            ])),
            Arc::new(Float64Array::from(vec![
                Some(-0.0),
                Some(f64::INFINITY),
                None,
                Some(f64::NAN),
                Some(2.5),
                Some(-1e300),
            ])),
            Arc::new(BooleanArray::from(vec![Some(true), None, Some(true), Some(true), None, Some(true)])),
            Arc::new(StringArray::from(vec![
                Some("é"),
                None,
                Some("apple"),
                Some(long.as_str()),
                Some(""),
                Some("b"),
            ])),
            Arc::new(Date32Array::from(vec![Some(0), Some(-1), None, Some(19000), Some(1), Some(2)])),
            Arc::new(Time64MicrosecondArray::from(vec![
                Some(0),
                Some(86_399_999_999),
                None,
                Some(5),
                Some(1),
                Some(2),
            ])),
            Arc::new(TimestampMicrosecondArray::from(vec![
                Some(-5),
                Some(1_700_000_000_000_000 + offset),
                None,
                Some(0),
                Some(1),
                Some(2),
            ])),
            Arc::new(
                TimestampMicrosecondArray::from(vec![Some(7), None, Some(-3), Some(0), Some(1), Some(2)])
                    .with_timezone("+00:00"),
            ),
            Arc::new(TimestampNanosecondArray::from(vec![
                Some(1),
                Some(-1),
                None,
                Some(i64::MAX),
                Some(0),
                Some(2),
            ])),
            Arc::new(
                Decimal128Array::from(vec![Some(-12345), None, Some(99), Some(0), Some(1), Some(2)])
                    .with_precision_and_scale(9, 2)
                    .unwrap(),
            ),
            Arc::new(
                Decimal128Array::from(vec![Some(-1), Some(1 << 50), None, Some(0), Some(1), Some(2)])
                    .with_precision_and_scale(18, 3)
                    .unwrap(),
            ),
            Arc::new(
                Decimal128Array::from(vec![
                    Some(-(10_i128.pow(30))),
                    Some(10_i128.pow(37)),
                    None,
                    Some(0),
                    Some(1),
                    Some(-2),
                ])
                .with_precision_and_scale(38, 4)
                .unwrap(),
            ),
            Arc::new(LargeBinaryArray::from(vec![
                Some(&b"\x00\xff"[..]),
                None,
                Some(&b""[..]),
                Some(&b"x"[..]),
                Some(&b"y"[..]),
                None,
            ])),
            Arc::new(
                FixedSizeBinaryArray::try_from_sparse_iter_with_size(
                    [
                        Some([0xffu8; 16]),
                        None,
                        Some([1u8; 16]),
                        Some([0x80u8; 16]),
                        Some([0u8; 16]),
                        Some([2u8; 16]),
                    ]
                    .into_iter(),
                    16,
                )
                .unwrap(),
            ),
            Arc::new(
                FixedSizeBinaryArray::try_from_sparse_iter_with_size(
                    [Some(*b"abc"), Some(*b"\xff\x00\x01"), None, Some(*b"aaa"), Some(*b"b\x00c"), None]
                        .into_iter(),
                    3,
                )
                .unwrap(),
            ),
            Arc::new(StructArray::new(
                st,
                vec![
                    Arc::new(Float32Array::from(vec![
                        Some(f32::NAN),
                        None,
                        Some(3.0),
                        Some(-1.0),
                        Some(0.5),
                        Some(f32::NAN),
                    ])),
                    Arc::new(StringArray::from(vec![Some("q"), Some("a"), None, Some("z"), None, Some("m")])),
                ],
                None,
            )),
            Arc::new(ListArray::new(
                element,
                OffsetBuffer::from_lengths([2, 0, 3, 1, 0, 1]),
                Arc::new(Float64Array::from(vec![
                    Some(1.0),
                    Some(f64::NAN),
                    Some(-4.0),
                    None,
                    Some(8.0),
                    Some(0.25),
                    Some(f64::NAN),
                ])),
                None,
            )),
            Arc::new(
                MapArray::try_new(
                    entries,
                    OffsetBuffer::from_lengths([1, 2, 0, 0, 1, 0]),
                    StructArray::new(
                        kv,
                        vec![
                            Arc::new(StringArray::from(vec!["k", "a", "zz", "k"])),
                            Arc::new(
                                [Some(f32::NAN), Some(1.0), None, Some(-3.5)]
                                    .into_iter()
                                    .collect::<datafusion::arrow::array::PrimitiveArray<Float32Type>>(),
                            ),
                        ],
                        None,
                    ),
                    None,
                    false,
                )
                .unwrap(),
            ),
        ];
        RecordBatch::try_new(arrow.clone(), columns).unwrap()
    }

    fn io() -> FileIO {
        FileIOBuilder::new(Arc::new(crate::lake::storage::LocalStorageFactory)).build()
    }

    async fn write<B: FileWriterBuilder>(
        builder: B,
        path: String,
        batches: &[RecordBatch],
    ) -> DataFile {
        let mut writer = builder.build(io().new_output(path).unwrap()).await.unwrap();
        for b in batches {
            writer.write(b).await.unwrap();
        }
        let mut files = writer.close().await.unwrap();
        assert_eq!(files.len(), 1);
        files.pop().unwrap().build().unwrap()
    }

    /// The same rows written by floe's writer and by iceberg-rust's give the same file and
    /// the same data-file entry: sizes, counts, NaN counts, bounds and row-group offsets.
    #[tokio::test]
    async fn statistics_match_iceberg_rust() {
        let schema = Arc::new(schema());
        let arrow = Arc::new(schema_to_arrow_schema(&schema).unwrap());
        // Row groups of four rows: three groups over two writes, in both writers.
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(4))
            .build();
        let batches = [batch(&arrow, 0), batch(&arrow, 77)];
        let dir = tempfile::tempdir().unwrap();
        let ours = write(
            ParquetFiles::new(props.clone(), schema.clone(), arrow.clone()),
            format!("{}/ours.parquet", dir.path().display()),
            &batches,
        )
        .await;
        let theirs = write(
            ParquetWriterBuilder::new(props, schema.clone()),
            format!("{}/theirs.parquet", dir.path().display()),
            &batches,
        )
        .await;
        assert_eq!(ours.record_count(), 12);
        assert_eq!(ours.record_count(), theirs.record_count());
        assert_eq!(ours.file_size_in_bytes(), theirs.file_size_in_bytes());
        assert_eq!(ours.column_sizes(), theirs.column_sizes());
        assert_eq!(ours.value_counts(), theirs.value_counts());
        assert_eq!(ours.null_value_counts(), theirs.null_value_counts());
        assert_eq!(ours.nan_value_counts(), theirs.nan_value_counts());
        assert_eq!(ours.nan_value_counts().get(&3), Some(&4));
        assert_eq!(ours.lower_bounds(), theirs.lower_bounds());
        assert_eq!(ours.upper_bounds(), theirs.upper_bounds());
        assert_eq!(ours.lower_bounds().len(), 22, "{:?}", ours.lower_bounds());
        assert_eq!(ours.split_offsets(), theirs.split_offsets());
        assert_eq!(ours.split_offsets().map(<[i64]>::len), Some(3));
    }

    /// Ending the row groups makes the rows written since a row group of every open file,
    /// read back as written.
    #[tokio::test]
    async fn row_groups_end_on_demand() {
        let schema = Arc::new(schema());
        let arrow = Arc::new(schema_to_arrow_schema(&schema).unwrap());
        let files = ParquetFiles::new(WriterProperties::builder().build(), schema, arrow.clone());
        let dir = tempfile::tempdir().unwrap();
        let paths: Vec<String> = (0..2)
            .map(|i| format!("{}/{i}.parquet", dir.path().display()))
            .collect();
        let mut writers = Vec::new();
        for p in &paths {
            writers.push(files.build(io().new_output(p).unwrap()).await.unwrap());
        }
        let b = batch(&arrow, 0);
        // File 0: three writes, ended; two more, ended. File 1: one write, ended twice
        // (the second time with nothing under way).
        for _ in 0..3 {
            writers[0].write(&b).await.unwrap();
        }
        writers[1].write(&b).await.unwrap();
        files.end_row_groups().await.unwrap();
        for _ in 0..2 {
            writers[0].write(&b).await.unwrap();
        }
        files.end_row_groups().await.unwrap();
        let mut entries = Vec::new();
        for w in writers {
            entries.push(w.close().await.unwrap().pop().unwrap().build().unwrap());
        }
        assert_eq!(entries[0].record_count(), 30);
        assert_eq!(entries[0].split_offsets().map(<[i64]>::len), Some(2));
        assert_eq!(entries[1].record_count(), 6);
        assert_eq!(entries[1].split_offsets().map(<[i64]>::len), Some(1));
        let file = std::fs::File::open(&paths[0]).unwrap();
        let reader =
            datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
                file,
            )
            .unwrap();
        let groups: Vec<i64> = reader
            .metadata()
            .row_groups()
            .iter()
            .map(|g| g.num_rows())
            .collect();
        assert_eq!(groups, vec![18, 12]);
        let read: Vec<RecordBatch> = reader.build().unwrap().map(Result::unwrap).collect();
        let read = datafusion::arrow::compute::concat_batches(&read[0].schema(), &read).unwrap();
        let written = datafusion::arrow::compute::concat_batches(&arrow, &vec![b; 5]).unwrap();
        assert_eq!(read.num_rows(), 30);
        for (r, w) in read.columns().iter().zip(written.columns()) {
            assert_eq!(r.to_data(), w.to_data());
        }
    }
}
