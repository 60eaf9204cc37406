//! Record formats: bytes of one record each, decoded into Arrow columns.
//!
//! ```text
//! 'format' = 'json'    one JSON object per record, into the declared columns, or, when the
//!                      source declares none, into columns inferred per record (see `schema::infer`)
//! 'format' = 'csv'     one CSV line per record ('csv.delimiter', default ',')
//! 'format' = 'raw'     the whole record into the one declared column (STRING or BYTES)
//! 'format' = 'debezium-json'  Debezium change events into the declared columns (or
//!                      inferred ones, with their source table and key columns), with
//!                      whether each deletes its row (see `debezium`)
//! ```
//!
//! Decoding is columnar (arrow-json / arrow-csv over a poll's records, in pieces of at most
//! 4,096 that stay in the core's caches). Only when a piece holds a bad record are its
//! records decoded one by one, to keep the good ones and reject the bad ones with their
//! reason. Inferred records are first grouped by shape, then each group is decoded the same
//! way into its own schema. A large poll's pieces are decoded on several threads at once, one
//! per core the job may use (`parallelism.default`) besides the polling one: its groups come
//! piece by piece, in order.

pub mod avro;
pub mod debezium;
mod flat_json;

use std::collections::HashMap;
use std::io::Cursor;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{ArrayRef, BinaryArray, BooleanArray, RecordBatch, StringArray};
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::{DataType, Schema, SchemaRef};

use crate::error::{Error, Result};
use crate::schema::changes::{
    Changes, SOURCE_TABLE_COLUMN, with_change_columns, with_changes, with_columns,
};
use crate::schema::infer::{ShapeCache, record_shape};
use crate::schema::shape_key;
use crate::sql::Options;
use crate::sql::options::unsupported;
use avro::AvroDecoder;
use flat_json::{FlatDecoder, Kinds};

/// How records are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Csv {
        delimiter: u8,
    },
    Raw,
    /// Avro, with the writer schema from a registry or the source's options.
    Avro,
    /// Debezium change events in JSON.
    DebeziumJson,
    /// Debezium change events in Avro, in the Confluent wire format.
    DebeziumAvro,
}

impl Format {
    /// Whether its records are changes of keyed rows (Debezium's), not rows to append.
    pub fn is_changes(self) -> bool {
        matches!(self, Format::DebeziumJson | Format::DebeziumAvro)
    }
}

/// Decodes records of one format into the declared schema, or into a schema per record
/// shape when the schema is inferred.
#[derive(Debug, Clone)]
pub struct Decoder {
    format: Format,
    schema: SchemaRef,
    /// Set when the columns are inferred from each record.
    inference: Option<Inference>,
    /// Set for Avro: the writer schemas and how to get them.
    avro: Option<Arc<AvroDecoder>>,
    /// `'record.max-size'`: larger records are not decoded but rejected.
    max_record_size: usize,
    /// The threads a poll's records may be decoded on at once (see [`Self::split`]).
    parallelism: usize,
}

/// Fewer records than this per thread, and a poll is not split further: a chunk handed to
/// another thread for less decodes too little to pay for itself.
const MIN_CHUNK: usize = 4096;

/// The most records decoded at once (by one decoder call): the decoder's tape and the columns
/// it fills stay in the core's caches. A whole 16 MiB poll at once spent a third more time
/// decoding than 8,192 records at a time, most of it copying strings and parsing numbers off
/// a tape the cache no longer held; at 4,096 (~1.2 MB of JSON) a job on one core ran 5-8%
/// faster again than at 8,192, and a poll's threads wait less for its last piece.
const MAX_PIECE: usize = 4096;

/// The threads polls' chunks are decoded on besides the polling one: as many as the cores,
/// kept for the process (a thread's allocator heap stays warm: threads started per poll
/// spent a quarter of their time faulting fresh pages in).
fn decoders() -> &'static rayon::ThreadPool {
    static POOL: std::sync::OnceLock<rayon::ThreadPool> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(crate::task::cores())
            .thread_name(|i| format!("floe-decode-{i}"))
            .build()
            // Only the OS refusing threads makes this fail: nothing can run then.
            .unwrap_or_else(|e| panic!("cannot start floe's decoding threads: {e}"))
    })
}

/// The default `'record.max-size'`.
pub const MAX_RECORD_SIZE: usize = 16 << 20;

/// Per-record schema inference for JSON.
#[derive(Debug, Clone)]
struct Inference {
    /// `'json.timestamp-inference'`: strings that read as timestamps become timestamps.
    timestamps: bool,
    shapes: Arc<Mutex<ShapeCache>>,
}

/// What a decode produced: the good records in groups of one schema each (one group when the
/// schema is declared), and the bad ones with their errors.
#[derive(Debug)]
pub struct Decoded {
    pub groups: Vec<Group>,
    /// Index in the input and error of each record that did not decode.
    pub errors: Vec<(usize, String)>,
}

impl Decoded {
    /// Per group, the input index of each of its rows.
    pub fn group_rows(&self) -> Vec<Vec<usize>> {
        self.groups.iter().map(|g| g.rows.clone()).collect()
    }
}

/// Records of one schema.
#[derive(Debug)]
pub struct Group {
    pub batch: RecordBatch,
    /// Index in the input of each row of `batch`.
    pub rows: Vec<usize>,
}

impl Decoder {
    /// A decoder for the `'format'` option (and its own options) into `schema`; with no
    /// columns in `schema`, a JSON decoder infers them per record.
    pub fn try_new(format: &str, options: &mut Options, schema: SchemaRef) -> Result<Self> {
        let max_record_size = options
            .take_positive_size("record.max-size")?
            .unwrap_or(MAX_RECORD_SIZE);
        if matches!(
            format,
            "avro" | "avro-confluent" | "avro-glue" | "debezium-avro-confluent"
        ) {
            if !schema.fields().is_empty() {
                return Err(Error::Plan(format!(
                    "'format' = '{format}' takes its columns from the Avro writer schema; \
                     declare only metadata columns (or none)"
                )));
            }
            return Ok(Self {
                format: if format == "debezium-avro-confluent" {
                    Format::DebeziumAvro
                } else {
                    Format::Avro
                },
                schema,
                inference: None,
                avro: Some(Arc::new(AvroDecoder::try_new(format, options)?)),
                max_record_size,
                parallelism: crate::task::cores(),
            });
        }
        let timestamps = options.take_bool("json.timestamp-inference")?;
        let inferred = matches!(format, "json" | "debezium-json") && schema.fields().is_empty();
        if timestamps.is_some() && !inferred {
            return Err(Error::Option(
                "'json.timestamp-inference' applies to JSON sources whose columns are \
                 inferred (declare no data columns); declared columns have their types"
                    .to_string(),
            ));
        }
        let inference = inferred.then(|| Inference {
            timestamps: timestamps.unwrap_or(false),
            shapes: Arc::default(),
        });
        let format = match format {
            "json" => Format::Json,
            "debezium-json" => Format::DebeziumJson,
            "csv" => {
                if schema.fields().is_empty() {
                    return Err(Error::Plan(
                        "'format' = 'csv' needs declared columns, e.g. (id BIGINT, name \
                         STRING); only 'json' infers them"
                            .to_string(),
                    ));
                }
                let delimiter = match options.take_str("csv.delimiter") {
                    None => b',',
                    Some(d) if d.len() == 1 => d.as_bytes()[0],
                    Some(d) => {
                        return Err(Error::Option(format!(
                            "'csv.delimiter' must be one character, got '{d}'"
                        )));
                    }
                };
                Format::Csv { delimiter }
            }
            "raw" => {
                let ok = schema.fields().len() == 1
                    && matches!(
                        schema.field(0).data_type(),
                        DataType::Utf8 | DataType::Binary
                    );
                if !ok {
                    return Err(Error::Plan(
                        "'format' = 'raw' needs exactly one column, of type STRING or BYTES"
                            .to_string(),
                    ));
                }
                Format::Raw
            }
            other => {
                return Err(unsupported(
                    "format",
                    other,
                    &[
                        "json",
                        "csv",
                        "raw",
                        "avro",
                        "avro-confluent",
                        "avro-glue",
                        "debezium-json",
                        "debezium-avro-confluent",
                    ],
                ));
            }
        };
        Ok(Self {
            format,
            schema,
            inference,
            avro: None,
            max_record_size,
            parallelism: crate::task::cores(),
        })
    }

    /// Decode a poll's records on `threads` decoding threads at once besides the polling
    /// one; one decodes on the polling thread alone.
    pub fn set_parallelism(&mut self, threads: usize) {
        self.parallelism = threads.max(1);
    }

    /// The largest record decoded (`'record.max-size'`); larger ones are rejected.
    pub fn max_record_size(&self) -> usize {
        self.max_record_size
    }

    /// Where the columns come from when they are not declared, in words.
    pub fn columns_from(&self) -> Option<&'static str> {
        if self.avro.is_some() {
            Some("each record's Avro writer schema")
        } else if self.inference.is_some() {
            Some("inferred from each JSON record")
        } else {
            None
        }
    }

    /// Whether the columns come from the records (JSON inferred per record, or Avro writer
    /// schemas) rather than from the declaration.
    pub fn is_inferred(&self) -> bool {
        self.inference.is_some() || self.avro.is_some()
    }

    /// The format.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Decode `records`. Fails only when something outside the records fails (a schema
    /// registry that cannot be reached): bad records are returned as errors.
    pub async fn decode(&self, records: &[&[u8]]) -> Result<Decoded> {
        self.decode_keyed(records, None).await
    }

    /// [`Self::decode`], with each record's message key where the source has keys (Kafka):
    /// the rows of a Debezium change stream whose columns are inferred name the key columns
    /// of their source table from it ([`KEY_NAMES_COLUMN`](crate::schema::changes::KEY_NAMES_COLUMN)).
    pub async fn decode_keyed(
        &self,
        records: &[&[u8]],
        keys: Option<&[Option<&[u8]>]>,
    ) -> Result<Decoded> {
        let max = self.max_record_size;
        if records.iter().all(|r| r.len() <= max) {
            return self.decode_all(records, keys).await;
        }
        // Larger records are rejected undecoded; the others decode as if alone.
        let (kept, larger): (Vec<usize>, Vec<usize>) =
            (0..records.len()).partition(|&i| records[i].len() <= max);
        let these: Vec<&[u8]> = kept.iter().map(|&i| records[i]).collect();
        let their_keys: Option<Vec<Option<&[u8]>>> =
            keys.map(|k| kept.iter().map(|&i| k[i]).collect());
        let mut decoded = self.decode_all(&these, their_keys.as_deref()).await?;
        for group in &mut decoded.groups {
            for row in &mut group.rows {
                *row = kept[*row];
            }
        }
        for (i, _) in &mut decoded.errors {
            *i = kept[*i];
        }
        let why = format!("the record is larger than 'record.max-size' ({max} bytes)");
        decoded
            .errors
            .extend(larger.into_iter().map(|i| (i, why.clone())));
        decoded.errors.sort_by_key(|(i, _)| *i);
        Ok(decoded)
    }

    async fn decode_all(
        &self,
        records: &[&[u8]],
        keys: Option<&[Option<&[u8]>]>,
    ) -> Result<Decoded> {
        if let Some(avro) = &self.avro {
            if self.format == Format::DebeziumAvro {
                // Tombstones (empty records) are no change: not decoded, not errors.
                let kept: Vec<usize> = (0..records.len())
                    .filter(|&i| !records[i].is_empty())
                    .collect();
                let these: Vec<&[u8]> = kept.iter().map(|&i| records[i]).collect();
                avro.resolve(&these).await?;
                // The message keys name the key columns: Avro records in the registry, or JSON.
                let names = match keys {
                    None => None,
                    Some(keys) => {
                        let framed: Vec<&[u8]> = kept.iter().filter_map(|&i| keys[i]).collect();
                        avro.resolve(&framed).await?;
                        Some(
                            kept.iter()
                                .map(|&i| message_key(avro, keys[i]))
                                .collect::<Vec<_>>(),
                        )
                    }
                };
                let mut decoded = self.split(&these, names.as_deref(), |records, names| {
                    debezium::rows_of_envelopes(avro.decode(records)?, names)
                })?;
                for group in &mut decoded.groups {
                    for row in &mut group.rows {
                        *row = kept[*row];
                    }
                }
                for (i, _) in &mut decoded.errors {
                    *i = kept[*i];
                }
                return Ok(decoded);
            }
            avro.resolve(records).await?;
            return self.split(records, keys, |records, _| avro.decode(records));
        }
        match (self.format, &self.inference) {
            (Format::DebeziumJson, None) => self.split(records, keys, |records, _| {
                decode_changes(&self.schema, records)
            }),
            (Format::DebeziumJson, Some(inference)) => {
                self.split(records, keys, |records, keys| {
                    decode_inferred_changes(inference, records, keys)
                })
            }
            (format, None) => self.split(records, keys, |records, _| {
                if format == Format::Json
                    && let Some(group) = decode_flat(&self.schema, records)
                {
                    return Ok(Decoded {
                        groups: vec![group],
                        errors: Vec::new(),
                    });
                }
                let (group, errors) = decode_group(format, &self.schema, records, |i| i)?;
                Ok(Decoded {
                    groups: vec![group],
                    errors,
                })
            }),
            (format, Some(inference)) => self.split(records, keys, |records, _| {
                decode_shapes(format, inference, records)
            }),
        }
    }

    /// `decode` over `records` (with their `keys`, where there are), in pieces of at most
    /// [`MAX_PIECE`] records: on several threads at once (each taking the next piece left)
    /// when there are records enough and the decoder may use more than one; the pieces'
    /// groups in order, their rows and errors numbered in `records`.
    fn split<K: Sync>(
        &self,
        records: &[&[u8]],
        keys: Option<&[K]>,
        decode: impl Fn(&[&[u8]], Option<&[K]>) -> Result<Decoded> + Sync,
    ) -> Result<Decoded> {
        // The polling thread decodes too, beside a decoding thread per core: one thread more
        // than the cores, so that they stay busy while a thread waits for its core (the
        // writer's, say) or for another's last piece.
        let helpers = if self.parallelism > 1 {
            self.parallelism
        } else {
            0
        };
        let threads = (helpers + 1).min(records.len() / MIN_CHUNK).max(1);
        let pieces = records.len().div_ceil(MAX_PIECE).max(threads);
        if pieces <= 1 {
            return decode(records, keys);
        }
        let size = records.len().div_ceil(pieces);
        let decode_piece = |p: usize| {
            let range = (p * size).min(records.len())..((p + 1) * size).min(records.len());
            decode(&records[range.clone()], keys.map(|k| &k[range]))
        };
        // Each thread takes the next piece not taken until none is left: a thread that gets
        // its core late (the core busy writing files, say) decodes fewer pieces rather than
        // holding the poll up.
        let decoded: Vec<std::sync::OnceLock<Result<Decoded>>> =
            (0..pieces).map(|_| std::sync::OnceLock::new()).collect();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let take_pieces = || {
            loop {
                let p = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(slot) = decoded.get(p) else { break };
                // (Each piece is taken once: its slot is empty.)
                let _ = slot.set(decode_piece(p));
            }
        };
        if threads <= 1 {
            take_pieces();
        } else {
            let take_pieces = &take_pieces;
            decoders().in_place_scope(|scope| {
                for _ in 1..threads {
                    scope.spawn(move |_| take_pieces());
                }
                take_pieces();
            });
        }
        let mut all = Decoded {
            groups: Vec::new(),
            errors: Vec::new(),
        };
        for (p, decoded) in decoded.into_iter().enumerate() {
            let Decoded { groups, errors } = decoded
                .into_inner()
                .ok_or_else(|| Error::Internal("a piece of a poll was not decoded".into()))??;
            let start = p * size;
            for mut group in groups {
                group.rows.iter_mut().for_each(|row| *row += start);
                all.groups.push(group);
            }
            all.errors
                .extend(errors.into_iter().map(|(i, e)| (i + start, e)));
        }
        Ok(all)
    }
}

/// What a Debezium Avro record's message key says (see [`debezium::MessageKey`]).
fn message_key(avro: &AvroDecoder, key: Option<&[u8]>) -> debezium::MessageKey {
    use debezium::MessageKey;
    match key {
        None => MessageKey::Absent,
        Some(k) => match avro
            .key_names(k)
            .or_else(|| debezium::key_names(k).ok().flatten())
        {
            Some(names) => MessageKey::Names(names),
            None => MessageKey::Unknown,
        },
    }
}

/// Decode `records` (JSON objects) into a schema per record shape.
fn decode_shapes(format: Format, inference: &Inference, records: &[&[u8]]) -> Result<Decoded> {
    // Group the records by shape, in order of first appearance: by the shape's key where it
    // can be read off the record, by the shape built otherwise. A shape's schema is one `Arc`
    // in the cache, so groups are found by its address. A flat shape's records decode as they
    // are grouped (`FlatDecoder`); a record is first offered to the decoder that took the
    // record before it, and walked for its shape only when refused.
    let mut errors = Vec::new();
    let mut groups: Vec<Grouping> = Vec::new();
    // Per schema, its flat decoder's group (`None` for a shape that has none) and the group
    // decoded by arrow-json.
    let mut flat_of: HashMap<*const Schema, Option<usize>> = HashMap::new();
    let mut json_of: HashMap<*const Schema, usize> = HashMap::new();
    let mut last: Option<usize> = None;
    // Records taken, and refused, by the decoder offered them first: while records mostly
    // change shape, they are walked first.
    let (mut taken, mut refused) = (0usize, 0usize);
    let mut key = Vec::new();
    // The cache is held only to look a shape up or add one: threads decoding other chunks
    // of the poll use it too.
    let shapes = || {
        inference
            .shapes
            .lock()
            .map_err(|_| Error::Internal("shape cache lock poisoned".into()))
    };
    // The shapes this call met, by key, so that most records take no lock.
    let mut met: datafusion::common::HashMap<Vec<u8>, SchemaRef> = Default::default();
    for (i, r) in records.iter().enumerate() {
        if let Some(g) = last
            && refused <= taken / 8 + 16
        {
            if let Grouping::Flat(decoder) = &mut groups[g]
                && decoder.push(r, i)
            {
                taken += 1;
                continue;
            }
            refused += 1;
        }
        let known = match shape_key::scan(r, inference.timestamps, &mut key) {
            true => match met.get(&key) {
                Some(schema) => Some(schema.clone()),
                None => {
                    let schema = shapes()?.get(&key);
                    if let Some(schema) = &schema {
                        met.insert(key.clone(), schema.clone());
                    }
                    schema
                }
            },
            false => None,
        };
        let schema = match known {
            Some(schema) => schema,
            None => match record_shape(r, inference.timestamps) {
                Ok(fields) => {
                    shape_key::write(&fields, &mut key);
                    shapes()?.schema(&key, &fields)
                }
                Err(e) => {
                    errors.push((i, e));
                    continue;
                }
            },
        };
        let flat = *flat_of.entry(Arc::as_ptr(&schema)).or_insert_with(|| {
            // Room for every record left for the first shape, the others grow as they need.
            let left = records.len() - i;
            let rows = if groups.is_empty() {
                left
            } else {
                left.min(256)
            };
            let decoder = match format {
                Format::Json => {
                    let kinds = Kinds::Inferred {
                        timestamps: inference.timestamps,
                    };
                    FlatDecoder::new(&schema, kinds, rows)
                }
                _ => None,
            };
            decoder.map(|d| {
                groups.push(Grouping::Flat(Box::new(d)));
                groups.len() - 1
            })
        });
        if let Some(g) = flat
            && let Grouping::Flat(decoder) = &mut groups[g]
            && decoder.push(r, i)
        {
            last = Some(g);
            continue;
        }
        let g = *json_of.entry(Arc::as_ptr(&schema)).or_insert_with(|| {
            groups.push(Grouping::Json(schema.clone(), Vec::new()));
            groups.len() - 1
        });
        if let Grouping::Json(_, rows) = &mut groups[g] {
            rows.push(i);
        }
    }
    let mut out = Vec::with_capacity(groups.len());
    for grouping in groups {
        match grouping {
            Grouping::Flat(decoder) => {
                let group = decoder.finish().map_err(|e| {
                    Error::Internal(format!("decoding records of a flat shape: {e}"))
                })?;
                if group.batch.num_rows() > 0 {
                    out.push(group);
                }
            }
            Grouping::Json(schema, rows) => {
                let these: Vec<&[u8]> = rows.iter().map(|&i| records[i]).collect();
                let (mut group, bad) = decode_group(format, &schema, &these, |j| rows[j])?;
                errors.extend(bad);
                group.rows = group.rows.iter().map(|&j| rows[j]).collect();
                out.push(group);
            }
        }
    }
    errors.sort_by_key(|(i, _)| *i);
    Ok(Decoded {
        groups: out,
        errors,
    })
}

/// The records of one schema found so far.
enum Grouping {
    /// Decoded as they are found.
    Flat(Box<FlatDecoder>),
    /// Their input indices, for arrow-json.
    Json(SchemaRef, Vec<usize>),
}

/// Decode Debezium change events into columns inferred from each row, with
/// [`SOURCE_TABLE_COLUMN`] (the event's `source.table`) after them and the change columns
/// last: whether each row deletes its key, and (from the message keys) its source table's
/// key columns. An update or a delete without a key cannot say which row it changes: a bad
/// record.
fn decode_inferred_changes(
    inference: &Inference,
    records: &[&[u8]],
    keys: Option<&[Option<&[u8]>]>,
) -> Result<Decoded> {
    struct Meta {
        input: usize,
        delete: bool,
        table: Option<String>,
        key: Option<String>,
    }
    let mut rows = Vec::new();
    let mut meta = Vec::new();
    let mut errors = Vec::new();
    for (i, r) in records.iter().enumerate() {
        let (json, delete, existing, table) = match debezium::change(r) {
            Ok(debezium::Change::Row {
                json,
                delete,
                existing,
                table,
            }) => (json, delete, existing, table),
            Ok(debezium::Change::Skip) => continue,
            Err(e) => {
                errors.push((i, e));
                continue;
            }
        };
        let key = match keys.and_then(|k| k[i]).map(debezium::key_names) {
            None => None,
            Some(Ok(names)) => names,
            Some(Err(e)) => {
                errors.push((i, e));
                continue;
            }
        };
        if key.is_none() && existing {
            errors.push((i, debezium::NO_KEY.to_string()));
            continue;
        }
        rows.push(json);
        meta.push(Meta {
            input: i,
            delete,
            table,
            key,
        });
    }
    let these: Vec<&[u8]> = rows.iter().map(Vec::as_slice).collect();
    let mut decoded = decode_shapes(Format::Json, inference, &these)?;
    for group in &mut decoded.groups {
        let of = |j: &usize| &meta[*j];
        let tables: ArrayRef = Arc::new(StringArray::from_iter(
            group.rows.iter().map(|j| of(j).table.as_deref()),
        ));
        let rows = with_columns(
            &group.batch,
            vec![(SOURCE_TABLE_COLUMN, DataType::Utf8, true, tables)],
        )?;
        let changes = Changes {
            deletes: BooleanArray::from_iter(group.rows.iter().map(|j| Some(of(j).delete))),
            key_names: Some(StringArray::from_iter(
                group.rows.iter().map(|j| of(j).key.as_deref()),
            )),
            seq: None,
        };
        group.batch = with_change_columns(&rows, &changes)?;
        group.rows = group.rows.iter().map(|j| of(j).input).collect();
    }
    for (j, _) in &mut decoded.errors {
        *j = meta[*j].input;
    }
    decoded.errors.extend(errors);
    decoded.errors.sort_by_key(|(i, _)| *i);
    Ok(decoded)
}

/// Decode Debezium change events into `schema`, with [`CHANGE_COLUMN`] last: whether each
/// row deletes its key. Tombstones give no row and no error.
fn decode_changes(schema: &SchemaRef, records: &[&[u8]]) -> Result<Decoded> {
    let mut rows = Vec::new();
    let mut flags = Vec::new();
    let mut inputs = Vec::new();
    let mut errors = Vec::new();
    for (i, r) in records.iter().enumerate() {
        match debezium::change(r) {
            Ok(debezium::Change::Row { json, delete, .. }) => {
                rows.push(json);
                flags.push(delete);
                inputs.push(i);
            }
            Ok(debezium::Change::Skip) => {}
            Err(e) => errors.push((i, e)),
        }
    }
    let these: Vec<&[u8]> = rows.iter().map(Vec::as_slice).collect();
    let (group, bad) = decode_group(Format::Json, schema, &these, |j| inputs[j])?;
    errors.extend(bad);
    errors.sort_by_key(|(i, _)| *i);
    let deletes = BooleanArray::from_iter(group.rows.iter().map(|&j| Some(flags[j])));
    let batch = with_changes(&group.batch, Arc::new(deletes))?;
    let rows = group.rows.iter().map(|&j| inputs[j]).collect();
    Ok(Decoded {
        groups: vec![Group { batch, rows }],
        errors,
    })
}

/// `records` into declared columns `schema` by a [`FlatDecoder`], when it takes every one
/// (records with the columns' fields in their order, some missing or NULL, with values of
/// their types): the rows keep the records' order, which a part taken by arrow-json would
/// break.
fn decode_flat(schema: &SchemaRef, records: &[&[u8]]) -> Option<Group> {
    if records.is_empty() {
        return None;
    }
    let mut decoder = FlatDecoder::new(schema, Kinds::Declared, records.len())?;
    for (i, r) in records.iter().enumerate() {
        if !decoder.push(r, i) {
            return None;
        }
    }
    decoder.finish().ok()
}

/// Decode `records` into `schema`: all at once, or one by one when some are bad. Errors carry
/// the index `index` gives each record.
fn decode_group(
    format: Format,
    schema: &SchemaRef,
    records: &[&[u8]],
    index: impl Fn(usize) -> usize,
) -> Result<(Group, Vec<(usize, String)>)> {
    if let Ok(batch) = decode_all(format, schema, records) {
        let rows = (0..records.len()).collect();
        return Ok((Group { batch, rows }, Vec::new()));
    }
    let mut good = Vec::new();
    let mut rows = Vec::new();
    let mut errors = Vec::new();
    for (i, r) in records.iter().enumerate() {
        match decode_all(format, schema, std::slice::from_ref(r)) {
            Ok(b) => {
                good.push(b);
                rows.push(i);
            }
            Err(e) => errors.push((index(i), e)),
        }
    }
    let batch = concat_batches(schema, &good)
        .map_err(|e| Error::Internal(format!("joining decoded records: {e}")))?;
    Ok((Group { batch, rows }, errors))
}

/// arrow-json decoders kept by each thread for the schemas it decoded last, most recent
/// last: a decoder's tape and string buffers keep their size from one poll to the next (built
/// per poll, they grew from nothing by copying each time, on memory the allocator had given
/// back to the system: a third of a declared job's time).
const KEPT_JSON_DECODERS: usize = 8;

/// The most record bytes the decoders a thread keeps have decoded in one call, together:
/// past it the oldest are dropped (a decoder's buffers are as large as the most it decoded).
const KEPT_JSON_BYTES: usize = 64 << 20;

thread_local! {
    static JSON_DECODERS: std::cell::RefCell<Vec<KeptJsonDecoder>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

struct KeptJsonDecoder {
    /// Held, so that the address it is found by stays this schema's.
    schema: SchemaRef,
    /// The most rows a batch of it holds.
    rows: usize,
    /// The most record bytes it decoded in one call.
    bytes: usize,
    decoder: datafusion::arrow::json::reader::Decoder,
}

/// `records` (one JSON object each) into `schema`: one batch, or a reason the records as a
/// whole do not decode. A decoder this thread kept for `schema` is used when it holds enough
/// rows, and kept again after a decode that succeeded (a failed one may leave it part way
/// through a record).
fn decode_json(
    schema: &SchemaRef,
    records: &[&[u8]],
) -> std::result::Result<Option<RecordBatch>, String> {
    // One more than the records: a decoder stops short of the end of a record holding two
    // objects only when it is full.
    let rows = records.len() + 1;
    let kept = JSON_DECODERS.with_borrow_mut(|kept| {
        let at = kept
            .iter()
            .position(|k| Arc::ptr_eq(&k.schema, schema) && k.rows >= rows)?;
        Some(kept.remove(at))
    });
    let mut kept = match kept {
        Some(kept) => kept,
        None => {
            let rows = rows.next_power_of_two();
            let decoder = datafusion::arrow::json::ReaderBuilder::new(schema.clone())
                .with_batch_size(rows)
                .build_decoder()
                .map_err(|e| e.to_string())?;
            KeptJsonDecoder {
                schema: schema.clone(),
                rows,
                bytes: 0,
                decoder,
            }
        }
    };
    let decoder = &mut kept.decoder;
    for r in records {
        if r.iter().all(u8::is_ascii_whitespace) {
            return Err("empty record".to_string());
        }
        let before = decoder.len();
        let mut buf = *r;
        while !buf.is_empty() {
            let n = decoder.decode(buf).map_err(|e| e.to_string())?;
            if n == 0 || decoder.len() > before + 1 {
                return Err("a record holds more than one JSON value".to_string());
            }
            buf = &buf[n..];
        }
        // One record each: a record that is not a whole object fails here.
        decoder.decode(b"\n").map_err(|e| e.to_string())?;
    }
    let batch = decoder.flush().map_err(|e| e.to_string())?;
    kept.bytes = kept.bytes.max(records.iter().map(|r| r.len()).sum());
    JSON_DECODERS.with_borrow_mut(|all| {
        // Others of the schema hold fewer rows: this one replaces them.
        all.retain(|k| !Arc::ptr_eq(&k.schema, schema));
        all.push(kept);
        let mut bytes: usize = all.iter().map(|k| k.bytes).sum();
        while all.len() > KEPT_JSON_DECODERS || (all.len() > 1 && bytes > KEPT_JSON_BYTES) {
            bytes -= all.remove(0).bytes;
        }
    });
    Ok(batch)
}

fn decode_all(
    format: Format,
    schema: &SchemaRef,
    records: &[&[u8]],
) -> std::result::Result<RecordBatch, String> {
    let rows = records.len().max(1);
    let mut batches = Vec::new();
    match format {
        Format::Json => batches.extend(decode_json(schema, records)?),
        Format::Csv { delimiter } => {
            let mut text = Vec::new();
            for r in records {
                text.extend_from_slice(r);
                text.push(b'\n');
            }
            let reader = datafusion::arrow::csv::ReaderBuilder::new(schema.clone())
                .with_header(false)
                .with_delimiter(delimiter)
                .with_batch_size(rows)
                .build(Cursor::new(text))
                .map_err(|e| e.to_string())?;
            for b in reader {
                batches.push(b.map_err(|e| e.to_string())?);
            }
        }
        Format::Avro => return Err("Avro is decoded by the Avro decoder".to_string()),
        Format::DebeziumJson | Format::DebeziumAvro => {
            return Err("Debezium events are decoded by decode_changes".to_string());
        }
        Format::Raw => {
            let column: ArrayRef = match schema.field(0).data_type() {
                DataType::Utf8 => Arc::new(StringArray::from_iter_values(
                    records
                        .iter()
                        .map(|r| std::str::from_utf8(r).map_err(|e| e.to_string()))
                        .collect::<std::result::Result<Vec<_>, _>>()?,
                )),
                _ => Arc::new(BinaryArray::from_iter_values(records.iter())),
            };
            batches.push(
                RecordBatch::try_new(schema.clone(), vec![column]).map_err(|e| e.to_string())?,
            );
        }
    }
    let batch = concat_batches(schema, &batches).map_err(|e| e.to_string())?;
    if batch.num_rows() != records.len() {
        return Err(format!(
            "{} records decoded into {} rows",
            records.len(),
            batch.num_rows()
        ));
    }
    Ok(batch)
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::{Field, Int64Type, Schema};

    use super::*;

    fn decoder(format: &str) -> Decoder {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("name", DataType::Utf8, true),
        ]));
        let mut o = Options::try_new("t", []).unwrap();
        Decoder::try_new(format, &mut o, schema).unwrap()
    }

    #[tokio::test]
    async fn json_keeps_the_good_records_and_names_the_bad() {
        let d = decoder("json");
        let recs: Vec<&[u8]> = vec![
            br#"{"id": 1, "name": "a"}"#,
            br#"{"id": "x"}"#,
            b"{}",
            br#"{"id": 3} {"id": 4}"#,
            br#"{"id": 5, "extra": true}"#,
        ];
        let out = d.decode(&recs).await.unwrap();
        let g = &out.groups[0];
        assert_eq!(g.rows, vec![0, 2, 4]);
        assert_eq!(
            g.batch
                .column(0)
                .as_primitive::<Int64Type>()
                .iter()
                .collect::<Vec<_>>(),
            vec![Some(1), None, Some(5)]
        );
        let bad: Vec<usize> = out.errors.iter().map(|(i, _)| *i).collect();
        assert_eq!(bad, vec![1, 3]);
    }

    /// The decoder a thread keeps for a schema, through polls that fail part way (a record
    /// cut short, two objects in one), grow past its rows and shrink again: each poll gives
    /// its own rows and errors, as a decoder built for it would.
    #[test]
    fn a_kept_decoder_serves_poll_after_poll() {
        let schema = decoder("json").schema.clone();
        let ids = |texts: &[String]| -> std::result::Result<Vec<Option<i64>>, String> {
            let records: Vec<&[u8]> = texts.iter().map(String::as_bytes).collect();
            let batch = decode_json(&schema, &records)?.expect("rows");
            Ok(batch.column(0).as_primitive::<Int64Type>().iter().collect())
        };
        let poll = |from: i64, n: i64| -> Vec<String> {
            (from..from + n)
                .map(|i| format!(r#"{{"id": {i}, "name": "n{i}"}}"#))
                .collect()
        };
        let expect = |from: i64, n: i64| (from..from + n).map(Some).collect::<Vec<_>>();
        assert_eq!(ids(&poll(0, 3)).unwrap(), expect(0, 3));
        let cut = vec![r#"{"id": 1"#.to_string(), r#"{"id": 2}"#.to_string()];
        assert!(ids(&cut).is_err());
        let two = vec![r#"{"id": 1} {"id": 2}"#.to_string()];
        assert_eq!(
            ids(&two).unwrap_err(),
            "a record holds more than one JSON value"
        );
        assert_eq!(ids(&poll(10, 3)).unwrap(), expect(10, 3));
        assert_eq!(ids(&poll(100, 5000)).unwrap(), expect(100, 5000));
        assert_eq!(ids(&poll(7, 2)).unwrap(), expect(7, 2));
        assert_eq!(ids(&[" ".to_string()]).unwrap_err(), "empty record");
        assert_eq!(ids(&poll(20, 1)).unwrap(), expect(20, 1));
    }

    /// Records of a large poll decoded in pieces, on three threads at once: the pieces' groups
    /// in order, every row and error numbered in the poll, the same rows as one thread gives.
    #[tokio::test]
    async fn a_large_poll_decodes_in_chunks_in_order() {
        let texts: Vec<String> = (0..2 * MAX_PIECE + 5)
            .map(|i| match i % 1000 {
                7 => "not json".to_string(),
                _ if i % 3 == 0 => format!(r#"{{"id": {i}, "name": "n{i}", "agent": "x"}}"#),
                _ => format!(r#"{{"id": {i}, "name": "n{i}"}}"#),
            })
            .collect();
        let records: Vec<&[u8]> = texts.iter().map(String::as_bytes).collect();
        let bad: Vec<usize> = (0..records.len()).filter(|i| i % 1000 == 7).collect();
        let ids = |out: &Decoded| -> Vec<(usize, i64)> {
            let mut ids: Vec<(usize, i64)> = out
                .groups
                .iter()
                .flat_map(|g| {
                    let id = g.batch.column(0).as_primitive::<Int64Type>().clone();
                    g.rows.iter().copied().zip(id.values().to_vec())
                })
                .collect();
            ids.sort_unstable();
            ids
        };
        for format in ["declared", "inferred"] {
            let mut d = match format {
                "declared" => decoder("json"),
                _ => {
                    let mut o = Options::try_new("t", []).unwrap();
                    Decoder::try_new("json", &mut o, Arc::new(Schema::empty())).unwrap()
                }
            };
            d.set_parallelism(1);
            let one = d.decode(&records).await.unwrap();
            d.set_parallelism(3);
            let three = d.decode(&records).await.unwrap();
            // Three pieces of at most MAX_PIECE records on one thread or three, each piece
            // a group per shape.
            let shapes = if format == "declared" { 1 } else { 2 };
            assert_eq!(one.groups.len(), 3 * shapes, "{format}");
            assert_eq!(three.groups.len(), 3 * shapes, "{format}");
            // Each row is the record it says it is, and every good record is there once.
            let expected: Vec<(usize, i64)> = (0..records.len())
                .filter(|i| !bad.contains(i))
                .map(|i| (i, i as i64))
                .collect();
            assert_eq!(ids(&one), expected, "{format}");
            assert_eq!(ids(&three), expected, "{format}");
            let errors: Vec<usize> = three.errors.iter().map(|(i, _)| *i).collect();
            assert_eq!(errors, bad, "{format}");
            // Piece by piece: the groups' first rows rise.
            let firsts: Vec<usize> = three.groups.iter().map(|g| g.rows[0]).collect();
            assert!(
                firsts.windows(2).all(|w| w[0] < w[1]),
                "{format}: {firsts:?}"
            );
            // Shapes are shared across the pieces' threads.
            for group in &three.groups {
                let schema = group.batch.schema();
                assert!(
                    one.groups
                        .iter()
                        .any(|g| Arc::ptr_eq(&g.batch.schema(), &schema)),
                    "{format}"
                );
            }
        }
    }

    #[tokio::test]
    async fn csv_and_raw() {
        let out = decoder("csv")
            .decode(&[b"1,a", b"oops,b", b"3,"])
            .await
            .unwrap();
        assert_eq!(out.groups[0].rows, vec![0, 2]);
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Utf8, true)]));
        let mut o = Options::try_new("t", []).unwrap();
        let raw = Decoder::try_new("raw", &mut o, schema).unwrap();
        let out = raw.decode(&[b"hello", &[0xff, 0xfe]]).await.unwrap();
        assert_eq!(out.groups[0].rows, vec![0]);
        assert_eq!(
            out.groups[0].batch.column(0).as_string::<i32>().value(0),
            "hello"
        );
    }

    #[tokio::test]
    async fn inferred_json_is_grouped_by_shape() {
        let mut o = Options::try_new("t", []).unwrap();
        let d = Decoder::try_new("json", &mut o, Arc::new(Schema::empty())).unwrap();
        assert!(d.is_inferred());
        let recs: Vec<&[u8]> = vec![
            br#"{"id": 1, "name": "a"}"#,
            br#"{"id": 2, "name": "b", "agent": "x"}"#,
            br#"not json"#,
            br#"{"id": 3, "name": "c", "extra": null}"#,
            br#"{"id": 4.5, "name": "d"}"#,
        ];
        let out = d.decode(&recs).await.unwrap();
        let rows: Vec<Vec<usize>> = out.groups.iter().map(|g| g.rows.clone()).collect();
        assert_eq!(rows, vec![vec![0, 3], vec![1], vec![4]]);
        assert_eq!(out.errors.len(), 1);
        assert_eq!(out.errors[0].0, 2);
        let types: Vec<String> = out
            .groups
            .iter()
            .map(|g| {
                let s = g.batch.schema();
                s.fields()
                    .iter()
                    .map(|f| format!("{} {}", f.name(), f.data_type()))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .collect();
        assert_eq!(
            types,
            vec![
                "id Int64, name Utf8",
                "id Int64, name Utf8, agent Utf8",
                "id Float64, name Utf8",
            ]
        );
        // A second poll of the same shape gets the same schema, so plans keyed by it hold.
        let again = d.decode(&[br#"{"id": 9, "name": "z"}"#]).await.unwrap();
        assert!(Arc::ptr_eq(
            &again.groups[0].batch.schema(),
            &out.groups[0].batch.schema()
        ));
    }

    #[test]
    fn timestamp_inference_needs_inferred_columns() {
        let pair = ("json.timestamp-inference".to_string(), "true".to_string());
        let mut o = Options::try_new("t", [pair]).unwrap();
        let declared = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)]));
        let e = Decoder::try_new("json", &mut o, declared).unwrap_err();
        assert!(e.to_string().contains("inferred"), "{e}");
    }

    #[tokio::test]
    async fn debezium_rows_without_declared_columns_name_their_table_and_key() {
        use datafusion::arrow::array::Array;
        let mut o = Options::try_new("t", []).unwrap();
        let d = Decoder::try_new("debezium-json", &mut o, Arc::new(Schema::empty())).unwrap();
        let source = |t: &str| format!(r#""source": {{"db": "inventory", "table": "{t}"}}"#);
        let recs: Vec<String> = vec![
            format!(
                r#"{{"after": {{"id": 1, "name": "a"}}, "op": "c", {}}}"#,
                source("customers")
            ),
            format!(
                r#"{{"before": {{"id": 1}}, "op": "d", {}}}"#,
                source("customers")
            ),
            format!(
                r#"{{"after": {{"sku": "x", "qty": 2}}, "op": "r", {}}}"#,
                source("stock")
            ),
            format!(
                r#"{{"after": {{"note": "n"}}, "op": "u", {}}}"#,
                source("notes")
            ),
            format!(
                r#"{{"after": {{"note": "m"}}, "op": "c", {}}}"#,
                source("notes")
            ),
        ];
        let records: Vec<&[u8]> = recs.iter().map(|r| r.as_bytes()).collect();
        let keys: Vec<Option<&[u8]>> = vec![
            Some(br#"{"id": 1}"#),
            Some(br#"{"id": 1}"#),
            Some(br#"{"schema": {}, "payload": {"sku": "x"}}"#),
            None,
            None,
        ];
        let out = d.decode_keyed(&records, Some(&keys)).await.unwrap();
        // The keyless update cannot say which row it changes; the keyless insert is a row.
        assert_eq!(out.errors.len(), 1, "{:?}", out.errors);
        assert_eq!(out.errors[0].0, 3);
        assert!(
            out.errors[0].1.contains("no primary key"),
            "{}",
            out.errors[0].1
        );
        let mut seen = Vec::new();
        for g in &out.groups {
            let (rows, changes) = crate::schema::changes::split_changes(g.batch.clone()).unwrap();
            let changes = changes.unwrap();
            let tables = rows
                .column_by_name(SOURCE_TABLE_COLUMN)
                .unwrap()
                .as_string::<i32>();
            let names = changes.key_names.unwrap();
            for (r, &input) in g.rows.iter().enumerate() {
                seen.push((
                    input,
                    tables.value(r).to_string(),
                    names.is_valid(r).then(|| names.value(r).to_string()),
                    changes.deletes.value(r),
                ));
            }
        }
        seen.sort();
        let s = |v: &str| v.to_string();
        assert_eq!(
            seen,
            vec![
                (0, s("customers"), Some(s("id")), false),
                (1, s("customers"), Some(s("id")), true),
                (2, s("stock"), Some(s("sku")), false),
                (4, s("notes"), None, false),
            ]
        );
    }
}
