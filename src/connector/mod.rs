//! Sources: where continuous jobs read records from.
//!
//! A source is declared with `CREATE SOURCE` and read through a [`SourceReader`]: `poll`
//! returns the next batch of records as Arrow, and the reader's [`Offsets`] say how far it
//! got, per partition (a Kafka partition, a Kinesis shard, a file). A checkpoint records the
//! offsets; recovery calls [`SourceReader::seek`] with them, so every record after the last
//! checkpoint is read again and nothing before it is.
//!
//! Readers are deterministic for the same offsets: re-reading gives the same records.

pub mod aws;
pub mod datagen;
pub mod filesystem;
pub mod kafka;
pub mod kinesis;
pub mod nexmark;
pub mod prefetch;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions};
use datafusion::arrow::datatypes::{DataType, Schema, SchemaRef};

use crate::error::{Error, Reject, Result};
use crate::format::Decoded;
use crate::schema::changes::{is_change_column, split_changes, with_change_columns};
use crate::sql::Options;

/// How far a reader got, per partition: the position to resume from, in the connector's
/// own notation (a Kafka offset, a Kinesis sequence number, a line count), as text so that
/// any connector's positions fit the checkpoint record.
pub type Offsets = BTreeMap<String, String>;

/// A record the source could not decode: it goes to the dead-letter table.
#[derive(Debug, Clone, PartialEq)]
pub struct BadRecord {
    /// The partition (Kafka partition, Kinesis shard, file) it came from.
    pub partition: String,
    /// Its offset (Kafka offset, sequence, line) in the partition.
    pub offset: u64,
    /// The raw record.
    pub payload: Vec<u8>,
    /// Why it could not be read.
    pub reject: Reject,
}

/// The outcome of one poll.
#[derive(Debug)]
pub enum Poll {
    /// Decoded records and the ones that could not be decoded; the two together are what
    /// the poll consumed (the batch may have no rows when every record was rejected).
    /// (An inferred source gives a batch per record shape; a declared one, one batch; a
    /// poll decoded in chunks, that for each chunk, in order.)
    Records {
        batches: Vec<RecordBatch>,
        rejects: Vec<BadRecord>,
        /// Where each row of `batches` came from, when the source can say (see [`Origins`]).
        origins: Option<Arc<dyn Origins>>,
    },
    /// Nothing right now; poll again later.
    Idle,
    /// A bounded source has no more records.
    Finished,
}

impl Poll {
    /// Decoded records, none rejected.
    pub fn batch(batch: RecordBatch) -> Self {
        Poll::Records {
            batches: vec![batch],
            rejects: Vec::new(),
            origins: None,
        }
    }
}

/// Where the rows of a poll's batches came from: a row rejected after decoding (by the query
/// or a table) is a dead letter with its record's partition, offset and bytes, as a record
/// that does not decode is. Kept until the poll's rows are written.
pub trait Origins: Send + Sync {
    /// The partition, offset and bytes of the record row `row` of batch `batch` came from.
    fn origin(&self, batch: usize, row: usize) -> Option<Origin>;
}

/// A record's partition, offset and bytes.
pub type Origin = (String, u64, Vec<u8>);

/// [`Origins`] of a poll's records as a source keeps them (`T`): per batch, each row's record
/// (an index into `records`), and how a record tells its place.
pub struct RecordOrigins<T> {
    records: Vec<T>,
    rows: Vec<Vec<usize>>,
    place: Box<Place<T>>,
}

/// How a source's record tells its partition, offset and bytes.
type Place<T> = dyn Fn(&T) -> Option<Origin> + Send + Sync;

impl<T> RecordOrigins<T> {
    pub fn new(
        records: Vec<T>,
        rows: Vec<Vec<usize>>,
        place: impl Fn(&T) -> Option<Origin> + Send + Sync + 'static,
    ) -> Self {
        Self {
            records,
            rows,
            place: Box::new(place),
        }
    }
}

impl<T: Send + Sync> Origins for RecordOrigins<T> {
    fn origin(&self, batch: usize, row: usize) -> Option<Origin> {
        (self.place)(self.records.get(*self.rows.get(batch)?.get(row)?)?)
    }
}

impl std::fmt::Debug for dyn Origins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Origins")
    }
}

/// Reads one source.
#[async_trait]
pub trait SourceReader: Send {
    /// The next records, up to about `max_rows`.
    ///
    /// # Cancel safety
    /// Not cancel safe: a poll dropped midway may lose the records it was reading. Callers
    /// await it to completion.
    async fn poll(&mut self, max_rows: usize) -> Result<Poll>;

    /// The offsets after the last record returned.
    fn offsets(&self) -> Offsets;

    /// Continue after `offsets` (from a checkpoint).
    fn seek(&mut self, offsets: &Offsets) -> Result<()>;

    /// Whether this source ends on its own.
    fn is_bounded(&self) -> bool;

    /// Records known to be waiting after the current position, when the source can tell
    /// (shown as lag in `SHOW JOBS`); `None` when it cannot.
    fn lag(&self) -> Option<u64> {
        None
    }

    /// Why the source cannot be read right now (a missing topic, an unreachable server),
    /// when it cannot: a preview that found no records reports this rather than no rows.
    fn stalled(&self) -> Option<String> {
        None
    }
}

/// A source as declared by `CREATE SOURCE`: its schema and how to read it.
#[derive(Debug, Clone)]
pub struct SourceDef {
    pub name: String,
    pub schema: SchemaRef,
    pub connector: Connector,
    /// `WATERMARK FOR column AS expression`, if declared.
    pub watermark: Option<WatermarkDef>,
}

/// A source's watermark declaration: the event-time column and the watermark expression.
#[derive(Debug, Clone, PartialEq)]
pub struct WatermarkDef {
    pub column: String,
    /// The expression over the source's columns, as parsed.
    pub expr: datafusion::sql::sqlparser::ast::Expr,
}

/// The connectors floe has, with their parsed options.
#[derive(Debug, Clone)]
pub enum Connector {
    Datagen(datagen::DatagenOptions),
    Filesystem(filesystem::FilesystemOptions),
    Kafka(kafka::KafkaOptions),
    Kinesis(kinesis::KinesisOptions),
}

impl SourceDef {
    /// Build a source from its declared columns (may be empty) and `WITH` options.
    /// `primary_key`: the key the source declares (`PRIMARY KEY (...) NOT ENFORCED`).
    pub fn try_new(
        name: &str,
        declared: Option<SchemaRef>,
        primary_key: &[String],
        mut options: Options,
    ) -> Result<Self> {
        let connector = options.require_str("connector")?;
        // No columns declared: a JSON decoder infers them per record.
        let declared_or_inferred = || {
            declared
                .clone()
                .unwrap_or_else(|| Arc::new(Schema::empty()))
        };
        let (schema, connector) = match connector.as_str() {
            "datagen" => {
                let (schema, o) = datagen::DatagenOptions::try_new(declared, &mut options)?;
                (schema, Connector::Datagen(o))
            }
            "filesystem" => {
                let schema = declared_or_inferred();
                let o = filesystem::FilesystemOptions::try_new(&schema, &mut options)?;
                (schema, Connector::Filesystem(o))
            }
            "kafka" => {
                let schema = declared_or_inferred();
                let o = kafka::KafkaOptions::try_new(&schema, &mut options)?;
                (schema, Connector::Kafka(o))
            }
            "kinesis" => {
                let schema = declared_or_inferred();
                let o = kinesis::KinesisOptions::try_new(&schema, &mut options)?;
                (schema, Connector::Kinesis(o))
            }
            other => {
                return Err(Error::Option(format!(
                    "source {name}: connector '{other}' is not supported; floe has 'datagen', \
                     'filesystem', 'kafka' and 'kinesis'"
                )));
            }
        };
        options.finish()?;
        let mut connector = connector;
        if let Connector::Kafka(o) = &mut connector
            && let Some(u) = &mut o.upsert
        {
            if primary_key.is_empty() {
                return Err(Error::Plan(format!(
                    "source {name}: 'scan.upsert' = 'true' needs the records' key: declare \
                     PRIMARY KEY (...) NOT ENFORCED"
                )));
            }
            if u.raw && primary_key.len() != 1 {
                return Err(Error::Plan(format!(
                    "source {name}: 'key.format' = 'raw' holds one key column; the primary key \
                     has {}",
                    primary_key.len()
                )));
            }
            u.columns = primary_key.to_vec();
        }
        Ok(Self {
            name: name.to_string(),
            schema,
            connector,
            watermark: None,
        })
    }

    /// The connector's name.
    pub fn connector_name(&self) -> &'static str {
        match self.connector {
            Connector::Datagen(_) => "datagen",
            Connector::Filesystem(_) => "filesystem",
            Connector::Kafka(_) => "kafka",
            Connector::Kinesis(_) => "kinesis",
        }
    }

    /// Whether the source's data columns come from the records (JSON inferred per record, or
    /// Avro writer schemas): its `schema` then holds only the metadata columns declared.
    pub fn is_inferred(&self) -> bool {
        self.columns_from().is_some()
    }

    /// Whether its records are changes (inserts, updates and deletes of keyed rows, as
    /// Debezium's) rather than rows to append.
    pub fn is_change_stream(&self) -> bool {
        let decoder = match &self.connector {
            Connector::Datagen(_) => return false,
            Connector::Filesystem(o) => &o.decoder,
            Connector::Kafka(o) => &o.decoder,
            Connector::Kinesis(o) => &o.decoder,
        };
        let upsert = matches!(&self.connector, Connector::Kafka(o) if o.upsert.is_some());
        upsert || decoder.format().is_changes()
    }

    /// Where the data columns come from when they are not declared, in words.
    pub fn columns_from(&self) -> Option<&'static str> {
        match &self.connector {
            Connector::Datagen(_) => None,
            Connector::Filesystem(o) => o.decoder.columns_from(),
            Connector::Kafka(o) => o.decoder.columns_from(),
            Connector::Kinesis(o) => o.decoder.columns_from(),
        }
    }

    /// The source, its records decoded on at most `threads` threads at once.
    pub fn decoding_on(&self, threads: usize) -> SourceDef {
        let mut source = self.clone();
        match &mut source.connector {
            Connector::Datagen(_) => {}
            Connector::Filesystem(o) => o.decoder.set_parallelism(threads),
            Connector::Kafka(o) => o.decoder.set_parallelism(threads),
            Connector::Kinesis(o) => o.decoder.set_parallelism(threads),
        }
        source
    }

    /// A reader from the start of the source.
    pub fn reader(&self) -> Result<Box<dyn SourceReader>> {
        Ok(match &self.connector {
            Connector::Datagen(o) => {
                Box::new(datagen::DatagenReader::new(self.schema.clone(), o.clone()))
            }
            Connector::Filesystem(o) => Box::new(filesystem::FilesystemReader::new(
                self.schema.clone(),
                o.clone(),
            )),
            Connector::Kafka(o) => Box::new(kafka::KafkaReader::try_new(
                &self.name,
                self.schema.clone(),
                o.clone(),
            )?),
            Connector::Kinesis(o) => {
                Box::new(kinesis::KinesisReader::new(self.schema.clone(), o.clone()))
            }
        })
    }
}

/// The declared columns a connector fills from record metadata (`_file`, `_offset`, ...),
/// checked against the types the connector gives them; returns the other columns, which
/// the format decodes.
pub fn data_schema(schema: &SchemaRef, metadata: &[(&str, DataType)]) -> Result<SchemaRef> {
    for (name, ty) in metadata {
        if let Ok(f) = schema.field_with_name(name)
            && f.data_type() != ty
        {
            return Err(Error::Plan(format!(
                "metadata column '{name}' must be declared as {ty}, not {}",
                f.data_type()
            )));
        }
    }
    Ok(Arc::new(Schema::new(
        schema
            .fields()
            .iter()
            .filter(|f| !metadata.iter().any(|(n, _)| f.name() == n))
            .cloned()
            .collect::<Vec<_>>(),
    )))
}

/// The source's rows from `decoded`, one batch per group: the decoded columns, and the
/// metadata columns `metadata` builds for the group's records (given their indices in the
/// input). Declared columns come in their declared order; inferred ones come first, followed
/// by the declared metadata columns.
pub fn source_rows(
    schema: &SchemaRef,
    decoded: &Decoded,
    inferred: bool,
    metadata: impl Fn(&str, &[usize]) -> Option<ArrayRef>,
) -> Result<Vec<RecordBatch>> {
    let mut out = Vec::with_capacity(decoded.groups.len());
    for group in &decoded.groups {
        let data = &group.batch;
        let schema = if inferred {
            let data_schema = data.schema();
            // (A change stream's rows say last whether each deletes its key, below.)
            let fields = data_schema
                .fields()
                .iter()
                .filter(|f| !is_change_column(f.name()))
                .chain(schema.fields())
                .cloned();
            Arc::new(Schema::new(fields.collect::<Vec<_>>()))
        } else {
            schema.clone()
        };
        let columns = schema
            .fields()
            .iter()
            .map(|f| {
                data.column_by_name(f.name())
                    .cloned()
                    .or_else(|| metadata(f.name(), &group.rows))
                    .ok_or_else(|| Error::Internal(format!("no values for column {}", f.name())))
            })
            .collect::<Result<Vec<_>>>()?;
        // A change stream's rows say last whether each deletes its key.
        let options = RecordBatchOptions::new().with_row_count(Some(data.num_rows()));
        let rows = RecordBatch::try_new_with_options(schema, columns, &options)
            .map_err(|e| Error::Internal(format!("source batch: {e}")))?;
        out.push(match split_changes(data.clone())?.1 {
            Some(changes) => with_change_columns(&rows, &changes)?,
            None => rows,
        });
    }
    Ok(out)
}

/// Shared handle to a source definition.
pub type SourceRef = Arc<SourceDef>;

/// The batches of a poll as one (they share a schema when the columns are declared).
#[cfg(test)]
pub fn concat(batches: &[RecordBatch]) -> RecordBatch {
    datafusion::arrow::compute::concat_batches(&batches[0].schema(), batches).unwrap()
}
