//! floe's Parquet data-file writer, behind iceberg-rust's file-writer traits (so its rolling,
//! partitioning and data-file writers wrap it): iceberg-rust's own ends a row group only
//! when it reaches its size, while a routed table's rows arrive in slices that belong in one
//! row group and the table's files stay open between row groups. [`ParquetFiles::end_row_groups`]
//! ends the row group under way in every file the writer has open, so the slices are
//! encoded as they come, without joining them first.
//!
//! It is Parquet's Arrow writer taken apart (`Encoder`): a row group's column writers are
//! independent of each other until it ends, so a large write's columns, and a row group's
//! ends, are encoded on several threads at once when the files may use more than one
//! ([`ParquetFiles::encoding_on`]; the file is byte for byte the one a thread writes).
//!
//! A closed file's statistics (sizes, value, NULL and NaN counts, lower and upper bounds by
//! field id) are taken from the Parquet footer and the rows, as Iceberg's writers record
//! them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Float32Type, Float64Type, SchemaRef};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::arrow::PARQUET_FIELD_ID_META_KEY;
use datafusion::parquet::arrow::arrow_writer::{
    ArrowColumnWriter, ArrowLeafColumn, ArrowRowGroupWriterFactory, compute_leaves,
};
use datafusion::parquet::errors::ParquetError;
use datafusion::parquet::file::metadata::ParquetMetaData;
use datafusion::parquet::file::properties::WriterProperties;
use datafusion::parquet::file::statistics::Statistics;
use datafusion::parquet::file::writer::SerializedFileWriter;
use iceberg::io::{FileWrite, OutputFile};
use iceberg::spec::{
    DataContentType, DataFileBuilder, DataFileFormat, Datum, PrimitiveType, Struct, Type,
};
use iceberg::writer::CurrentFileStatus;
use iceberg::writer::file_writer::{FileWriter, FileWriterBuilder};
use iceberg::{Error, ErrorKind, Result};

type ParquetResult<T> = datafusion::parquet::errors::Result<T>;

/// A write of at least this many rows has its columns encoded on several threads at once,
/// when the files may use more than one (see [`ParquetFiles::encoding_on`]): below it,
/// handing columns out costs about what it saves.
const SHARED_ROWS: usize = 2048;

/// Builds a [`ParquetFile`] per data file; every clone shares the set of files open, whose
/// row groups under way [`Self::end_row_groups`] ends.
#[derive(Clone)]
pub struct ParquetFiles {
    props: WriterProperties,
    schema: iceberg::spec::SchemaRef,
    /// The table's schema as Arrow, with the field ids (what the rows come as).
    arrow: SchemaRef,
    open: Arc<Mutex<Vec<Weak<Mutex<Encoding>>>>>,
    /// The threads a file's columns are encoded on at once (see [`Self::encoding_on`]).
    threads: Arc<AtomicUsize>,
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
            threads: Arc::new(AtomicUsize::new(1)),
        }
    }

    /// Encode the columns of a file's large writes and row group ends on up to `threads`
    /// threads at once (the writing one and `task::share_out`'s helpers); 1, the
    /// default, encodes on the writing thread only. Every clone's files, open or to come.
    pub fn encoding_on(&self, threads: usize) {
        self.threads.store(threads.max(1), Ordering::Relaxed);
    }

    /// End the row group under way in every file open (written out: nothing of it stays
    /// held but the file's footer entry).
    pub async fn end_row_groups(&self) -> Result<()> {
        let open: Vec<Arc<Mutex<Encoding>>> = {
            let mut open = lock(&self.open);
            open.retain(|f| f.strong_count() > 0);
            open.iter().filter_map(Weak::upgrade).collect()
        };
        let threads = self.threads.load(Ordering::Relaxed);
        for file in open {
            let encoder = lock(&file).encoder.take();
            let Some(mut encoder) = encoder else { continue };
            let ended = encoder.end_row_group(threads).await;
            let mut encoding = lock(&file);
            encoding.size = encoder.size();
            encoding.encoder = Some(encoder);
            ended?;
        }
        Ok(())
    }
}

impl FileWriterBuilder for ParquetFiles {
    type R = ParquetFile;

    async fn build(&self, output: OutputFile) -> Result<ParquetFile> {
        let encoding = Arc::new(Mutex::new(Encoding {
            encoder: None,
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
    encoder: Option<Encoder>,
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
        let taken = lock(&self.encoding).encoder.take();
        let mut encoder = match taken {
            Some(e) => e,
            None => Encoder::start(&self.files, self.output.writer().await?)?,
        };
        let written = encoder
            .write(batch, self.files.threads.load(Ordering::Relaxed))
            .await;
        let mut encoding = lock(&self.encoding);
        encoding.size = encoder.size();
        encoding.encoder = Some(encoder);
        written
    }

    async fn close(self) -> Result<Vec<DataFileBuilder>> {
        let taken = lock(&self.encoding).encoder.take();
        let Some(encoder) = taken else {
            return Ok(Vec::new());
        };
        let (metadata, size) = encoder
            .finish(self.files.threads.load(Ordering::Relaxed))
            .await?;
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

/// A Parquet file being encoded: Parquet's Arrow writer taken apart, so that the column
/// writers of a row group, which are independent of each other until it ends, encode on
/// several threads at once. Row groups end as Parquet's Arrow writer ends them (the
/// properties' rows and bytes at most) or when told; each is sent to the file as it ends.
struct Encoder {
    /// Holds the encoded bytes of the row groups ended since the last send.
    file: SerializedFileWriter<Vec<u8>>,
    factory: ArrowRowGroupWriterFactory,
    arrow: SchemaRef,
    /// The row group under way: a writer per leaf column, in the schema's order (none
    /// between row groups), and the rows written to them.
    columns: Vec<ArrowColumnWriter>,
    rows: usize,
    max_rows: Option<usize>,
    max_bytes: Option<usize>,
    output: Box<dyn FileWrite>,
}

impl Encoder {
    fn start(files: &ParquetFiles, output: Box<dyn FileWrite>) -> Result<Self> {
        // Parquet's own writer converts the schema and adds the Arrow schema to the footer's
        // metadata, as readers expect of files it writes.
        let (file, factory) =
            ArrowWriter::try_new(Vec::new(), files.arrow.clone(), Some(files.props.clone()))
                .and_then(ArrowWriter::into_serialized_writer)
                .map_err(|e| parquet_error("starting a Parquet file", e))?;
        Ok(Self {
            file,
            factory,
            arrow: files.arrow.clone(),
            columns: Vec::new(),
            rows: 0,
            max_rows: files.props.max_row_group_row_count(),
            max_bytes: files.props.max_row_group_bytes(),
            output,
        })
    }

    /// Bytes written and in the row group under way (as encoded so far).
    fn size(&self) -> usize {
        self.file.bytes_written() + self.under_way()
    }

    fn under_way(&self) -> usize {
        self.columns
            .iter()
            .map(ArrowColumnWriter::get_estimated_total_bytes)
            .sum()
    }

    /// Encode `batch`, ending row groups where the limits on their rows and bytes fall
    /// (the rows split between them as Parquet's Arrow writer splits them).
    async fn write(&mut self, batch: &RecordBatch, threads: usize) -> Result<()> {
        let mut rest = batch.clone();
        while rest.num_rows() > 0 {
            let mut rows = rest.num_rows();
            if let Some(max) = self.max_rows {
                rows = rows.min(max.saturating_sub(self.rows).max(1));
            }
            if let (Some(max), true) = (self.max_bytes, self.rows > 0) {
                let bytes = self.under_way();
                let fit = max.saturating_sub(bytes) / (bytes / self.rows).max(1);
                if fit == 0 {
                    self.end_row_group(threads).await?;
                    continue;
                }
                rows = rows.min(fit);
            }
            let part = rest.slice(0, rows);
            rest = rest.slice(rows, rest.num_rows() - rows);
            self.encode(&part, threads)
                .map_err(|e| parquet_error("writing rows to a Parquet file", e))?;
            let full = self.max_rows.is_some_and(|max| self.rows >= max)
                || self.max_bytes.is_some_and(|max| self.under_way() >= max);
            if full {
                self.end_row_group(threads).await?;
            }
        }
        Ok(())
    }

    fn encode(&mut self, batch: &RecordBatch, threads: usize) -> ParquetResult<()> {
        if self.columns.is_empty() {
            let row_group = self.file.flushed_row_groups().len();
            self.columns = self.factory.create_column_writers(row_group)?;
        }
        let mut leaves = Vec::with_capacity(self.columns.len());
        let mut costs = Vec::with_capacity(self.columns.len());
        for (field, column) in self.arrow.fields().iter().zip(batch.columns()) {
            let of_column = compute_leaves(field, column)?;
            let cost = column.get_buffer_memory_size() / of_column.len().max(1);
            costs.extend(std::iter::repeat_n(cost, of_column.len()));
            leaves.extend(of_column);
        }
        if leaves.len() != self.columns.len() {
            return Err(ParquetError::General(format!(
                "{} leaf columns for {} column writers",
                leaves.len(),
                self.columns.len()
            )));
        }
        self.rows += batch.num_rows();
        let columns = std::mem::take(&mut self.columns);
        let work = columns.into_iter().zip(leaves).collect();
        let helpers = helpers(threads, batch.num_rows());
        self.columns = encode_columns(work, costs, helpers, write_column)?;
        Ok(())
    }

    /// End the row group under way, if any, and send it to the file.
    async fn end_row_group(&mut self, threads: usize) -> Result<()> {
        if self.columns.is_empty() {
            return Ok(());
        }
        let columns = std::mem::take(&mut self.columns);
        let costs = columns
            .iter()
            .map(ArrowColumnWriter::get_estimated_total_bytes)
            .collect();
        let helpers = helpers(threads, std::mem::take(&mut self.rows));
        let ended = (|| {
            let closed = encode_columns(columns, costs, helpers, ArrowColumnWriter::close)?;
            let mut row_group = self.file.next_row_group()?;
            for chunk in closed {
                chunk.append_to_row_group(&mut row_group)?;
            }
            row_group.close().map(drop)
        })();
        ended.map_err(|e| parquet_error("ending a row group", e))?;
        self.send().await
    }

    /// Send the bytes encoded since the last send to the file.
    async fn send(&mut self) -> Result<()> {
        // (The file writer buffers some bytes of its own; they follow these.)
        let bytes = std::mem::take(self.file.inner_mut());
        if bytes.is_empty() {
            return Ok(());
        }
        self.output.write(Bytes::from(bytes)).await
    }

    /// End the file: its footer, its metadata and its size.
    async fn finish(mut self, threads: usize) -> Result<(ParquetMetaData, usize)> {
        self.end_row_group(threads).await?;
        let metadata = self
            .file
            .finish()
            .map_err(|e| parquet_error("finishing a Parquet file", e))?;
        self.send().await?;
        self.output.close().await?;
        Ok((metadata, self.file.bytes_written()))
    }
}

/// The helpers a write of `rows` rows may have (see [`SHARED_ROWS`]).
fn helpers(threads: usize, rows: usize) -> usize {
    if rows >= SHARED_ROWS {
        threads.saturating_sub(1)
    } else {
        0
    }
}

/// `work` done on each column, on the calling thread and `helpers` more, the costliest
/// first (a large column left for last would keep the others waiting); the results in the
/// columns' order.
fn encode_columns<T: Send + 'static, R: Send + 'static>(
    columns: Vec<T>,
    costs: Vec<usize>,
    helpers: usize,
    work: fn(T) -> ParquetResult<R>,
) -> ParquetResult<Vec<R>> {
    if helpers == 0 {
        return columns.into_iter().map(work).collect();
    }
    let mut order: Vec<usize> = (0..columns.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(costs[i]));
    let mut slots: Vec<Option<T>> = columns.into_iter().map(Some).collect();
    let ordered: Vec<(usize, T)> = order
        .iter()
        .filter_map(|&i| slots[i].take().map(|c| (i, c)))
        .collect();
    let done = crate::task::share_out(ordered, helpers, move |(i, c)| (i, work(c)));
    let mut encoded: Vec<Option<ParquetResult<R>>> = done.iter().map(|_| None).collect();
    for (i, result) in done {
        encoded[i] = Some(result);
    }
    encoded
        .into_iter()
        .map(|e| e.unwrap_or_else(|| Err(ParquetError::General("a column was lost".into()))))
        .collect()
}

fn write_column(
    (mut writer, leaf): (ArrowColumnWriter, ArrowLeafColumn),
) -> ParquetResult<ArrowColumnWriter> {
    writer.write(&leaf).map(|()| writer)
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

    /// The test table's schema, and as Arrow with the field ids.
    fn schemas() -> (Arc<Schema>, datafusion::arrow::datatypes::SchemaRef) {
        let schema = Arc::new(schema());
        let arrow = Arc::new(schema_to_arrow_schema(&schema).unwrap());
        (schema, arrow)
    }

    /// Writer properties whose row groups hold at most `rows` rows.
    fn rows_at_most(rows: usize) -> WriterProperties {
        WriterProperties::builder()
            .set_max_row_group_row_count(Some(rows))
            .build()
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
        let (schema, arrow) = schemas();
        // Row groups of four rows: three groups over two writes, in both writers.
        let props = rows_at_most(4);
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

    /// A file whose columns were encoded on several threads is byte for byte the file one
    /// thread encodes: large writes, row groups ended by the row limit inside a write and
    /// on demand, nested columns.
    #[tokio::test]
    async fn columns_encoded_on_several_threads_make_the_same_file() {
        let (schema, arrow) = schemas();
        let props = rows_at_most(3000);
        let one = batch(&arrow, 0);
        let large = datafusion::arrow::compute::concat_batches(&arrow, &vec![one; 700]).unwrap();
        assert!(large.num_rows() >= 2 * super::SHARED_ROWS);
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = Vec::new();
        for threads in [1, 3] {
            let files = ParquetFiles::new(props.clone(), schema.clone(), arrow.clone());
            files.encoding_on(threads);
            let path = format!("{}/{threads}.parquet", dir.path().display());
            let mut writer = files.build(io().new_output(&path).unwrap()).await.unwrap();
            writer.write(&large).await.unwrap();
            files.end_row_groups().await.unwrap();
            writer.write(&large).await.unwrap();
            let entry = writer
                .close()
                .await
                .unwrap()
                .pop()
                .unwrap()
                .build()
                .unwrap();
            // 4,200 rows, as 3,000 (the limit) and 1,200 (ended on demand); twice.
            assert_eq!(entry.split_offsets().map(<[i64]>::len), Some(4));
            assert_eq!(entry.record_count(), 2 * large.num_rows() as u64);
            bytes.push(std::fs::read(&path).unwrap());
        }
        assert!(bytes[0] == bytes[1], "the files differ");
    }

    /// Ending the row groups makes the rows written since a row group of every open file,
    /// read back as written.
    #[tokio::test]
    async fn row_groups_end_on_demand() {
        let (schema, arrow) = schemas();
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
