//! Avro records: the Confluent wire format with a schema registry, or a schema given with the
//! source (`'avro.schema'`, `'avro.schema-file'`).
//!
//! ```text
//! 'avro-confluent'   0x00 | schema id (4 bytes, big-endian) | Avro binary body
//! 'avro-glue'        0x03 | compression (0 none, 5 zlib) | schema version UUID (16) | body
//! 'avro'             Avro binary body, written with the given schema
//! ```
//!
//! Each writer schema is fetched once (`GET <url>/schemas/ids/<id>`, or Glue's
//! `GetSchemaVersion`) and kept, with the Arrow
//! schema arrow-avro gives it. Records are grouped by writer schema and each group decoded by
//! arrow-avro in one go, so a new schema version is simply a new group (a new input schema
//! for the job's query, and new columns for a routed table). Enums are read as strings, and
//! field docs become column docs.
//!
//! A registry that cannot be reached fails the poll (the job retries); a schema id the
//! registry does not know, a body that does not decode, or a schema floe cannot map (a union
//! other than `[null, T]`) makes the records dead letters with the reason.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Read;
use std::sync::{Arc, Mutex};

use arrow_avro::reader::ReaderBuilder;
use arrow_avro::schema::{AvroSchema, Fingerprint, FingerprintAlgorithm, SchemaStore};
use datafusion::arrow::array::{RecordBatch, RecordBatchOptions};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Fields, Schema, SchemaRef};

use super::{Decoded, Group};
use crate::connector::aws::sdk_config;
use crate::error::{Error, Result};
use crate::sql::Options;

/// Where writer schemas come from.
enum Source {
    /// A Confluent-compatible registry.
    Registry {
        url: String,
        /// `user:password` for basic auth.
        user_info: Option<String>,
        client: reqwest::Client,
    },
    /// The AWS Glue Schema Registry.
    Glue {
        region: Option<String>,
        endpoint: Option<String>,
        /// The registry's name (records name their schema version by UUID alone).
        registry: Option<String>,
        client: tokio::sync::OnceCell<aws_sdk_glue::Client>,
    },
    /// The one schema given with the source.
    Given,
}

impl std::fmt::Debug for Source {
    /// The registry's credentials masked.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Registry { url, user_info, .. } => f
                .debug_struct("Registry")
                .field("url", &crate::secret::mask_url(url))
                .field(
                    "user_info",
                    &user_info.as_ref().map(|_| crate::secret::MASK),
                )
                .finish_non_exhaustive(),
            Source::Glue {
                region,
                endpoint,
                registry,
                ..
            } => f
                .debug_struct("Glue")
                .field("region", region)
                .field("endpoint", endpoint)
                .field("registry", registry)
                .finish_non_exhaustive(),
            Source::Given => f.write_str("Given"),
        }
    }
}

/// A writer schema as floe knows it.
#[derive(Debug, Clone)]
enum Writer {
    /// Decodable: the Avro schema and the Arrow schema of its records.
    Known { avro: AvroSchema, arrow: SchemaRef },
    /// Records written with it cannot be read, and why.
    Unusable(String),
}

/// Decodes Avro records, fetching writer schemas as they appear.
#[derive(Debug)]
pub struct AvroDecoder {
    source: Source,
    /// By schema id (Confluent) or schema version UUID (Glue).
    writers: Mutex<HashMap<u128, Writer>>,
    /// arrow-avro decoders not in use, by writer schema key: building one parses its
    /// schema, so decoders are kept between polls (one per thread decoding at a time).
    idle: Mutex<Vec<(u128, arrow_avro::reader::Decoder)>>,
}

/// The most idle arrow-avro decoders kept.
const IDLE_DECODERS: usize = 16;

/// The key the given schema is filed under.
const GIVEN: u32 = 0;
/// The schema id in the header floe puts before each body for arrow-avro (a value records
/// are unlikely to end with).
const FRAME: u32 = 0xf10e_a7b0;

/// Glue's header: version byte 3, then the compression byte.
const GLUE_VERSION: u8 = 3;
const GLUE_UNCOMPRESSED: u8 = 0;
const GLUE_ZLIB: u8 = 5;

impl AvroDecoder {
    /// A decoder for `format` (`avro-confluent` or `avro`) and its options.
    pub fn try_new(format: &str, options: &mut Options) -> Result<Self> {
        match format {
            "avro-confluent" | "debezium-avro-confluent" => {
                // Flink names the options after the format.
                let url = options.require_str(&format!("{format}.url"))?;
                let given = options.take_str(&format!("{format}.basic-auth.user-info"));
                // Credentials in the URL (`http://user:password@host`) are taken out of it,
                // so that errors and SHOW JOBS name the registry without them.
                let (url, in_url) = split_user_info(&url);
                Ok(Self {
                    source: Source::Registry {
                        url: url.trim_end_matches('/').to_string(),
                        user_info: given.or(in_url),
                        client: reqwest::Client::new(),
                    },
                    writers: Mutex::default(),
                    idle: Mutex::default(),
                })
            }
            "avro-glue" => Ok(Self {
                source: Source::Glue {
                    region: options.take_str("avro-glue.region"),
                    endpoint: options.take_str("avro-glue.endpoint"),
                    registry: options.take_str("avro-glue.registry"),
                    client: tokio::sync::OnceCell::new(),
                },
                writers: Mutex::default(),
                idle: Mutex::default(),
            }),
            _ => {
                let text = match (
                    options.take_str("avro.schema"),
                    options.take_str("avro.schema-file"),
                ) {
                    (Some(s), None) => s,
                    (None, Some(path)) => std::fs::read_to_string(&path)
                        .map_err(|e| Error::io(format!("reading 'avro.schema-file' {path}"), e))?,
                    _ => {
                        return Err(Error::Option(
                            "'format' = 'avro' needs the writer schema: 'avro.schema' (the schema \
                             as JSON) or 'avro.schema-file' (a path), one of them"
                                .to_string(),
                        ));
                    }
                };
                // A schema that cannot be read is an error now, not a dead letter per record.
                let writer = writer(&text);
                if let Writer::Unusable(why) = &writer {
                    return Err(Error::Plan(format!("'avro.schema': {why}")));
                }
                Ok(Self {
                    source: Source::Given,
                    writers: Mutex::new(HashMap::from([(u128::from(GIVEN), writer)])),
                    idle: Mutex::default(),
                })
            }
        }
    }

    /// The names of the fields of an Avro record key (its writer schema's, fetched by
    /// [`Self::resolve`] like a record's), joined by `,`; `None` when `key` is not in the
    /// registry's wire format or its schema is not a known record.
    pub fn key_names(&self, key: &[u8]) -> Option<String> {
        let (id, _) = self.split(key).ok()?;
        match self.lock().ok()?.get(&id)? {
            Writer::Known { arrow, .. } if !arrow.fields().is_empty() => Some(
                arrow
                    .fields()
                    .iter()
                    .map(|f| f.name().as_str())
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            _ => None,
        }
    }

    /// The writer schema key (a Confluent id or a Glue UUID) and body of `record`.
    fn split<'a>(&self, record: &'a [u8]) -> std::result::Result<(u128, Cow<'a, [u8]>), String> {
        let (id, body) = self.header(record)?;
        Ok((id, body.inflated()?))
    }

    /// The writer schema key of `record` and its body as it is (compressed or not), from
    /// its header.
    fn header<'a>(&self, record: &'a [u8]) -> std::result::Result<(u128, Body<'a>), String> {
        match self.source {
            Source::Given => Ok((u128::from(GIVEN), Body::Plain(record))),
            Source::Registry { .. } => match record {
                [0, a, b, c, d, body @ ..] => Ok((
                    u128::from(u32::from_be_bytes([*a, *b, *c, *d])),
                    Body::Plain(body),
                )),
                [m, ..] => Err(format!(
                    "not in the Confluent wire format: the first byte is {m}, not the magic byte 0"
                )),
                [] => Err("empty record".to_string()),
            },
            Source::Glue { .. } => {
                if record.len() < 18 || record[0] != GLUE_VERSION {
                    return Err(format!(
                        "not in the Glue Schema Registry wire format (header version byte 3, a \
                         compression byte, a 16-byte schema version id){}",
                        record
                            .first()
                            .map(|b| format!(": the first byte is {b}"))
                            .unwrap_or_default()
                    ));
                }
                let id = u128::from_be_bytes(record[2..18].try_into().unwrap_or_default());
                let body = &record[18..];
                match record[1] {
                    GLUE_UNCOMPRESSED => Ok((id, Body::Plain(body))),
                    GLUE_ZLIB => Ok((id, Body::Zlib(body))),
                    other => Err(format!(
                        "unknown Glue compression byte {other} (0 is none, 5 is zlib)"
                    )),
                }
            }
        }
    }

    /// Fetch the writer schemas of `records` not seen before. Fails when the registry cannot
    /// be reached (a retryable error); a schema it does not know is remembered as unusable.
    pub async fn resolve(&self, records: &[&[u8]]) -> Result<()> {
        if matches!(self.source, Source::Given) {
            return Ok(());
        }
        let mut missing: Vec<u128> = Vec::new();
        {
            let writers = self.lock()?;
            let mut last = None;
            for r in records {
                let Ok((id, _)) = self.header(r) else {
                    continue;
                };
                // Records come in runs of one schema: a run is looked up once.
                if last.replace(id) != Some(id)
                    && !writers.contains_key(&id)
                    && !missing.contains(&id)
                {
                    missing.push(id);
                }
            }
        }
        for id in missing {
            let found = match &self.source {
                Source::Registry {
                    url,
                    user_info,
                    client,
                } => fetch_confluent(client, url, user_info.as_deref(), id as u32).await?,
                Source::Glue {
                    region,
                    endpoint,
                    registry,
                    client,
                } => {
                    let client = client
                        .get_or_init(|| async {
                            let config =
                                sdk_config(region.as_deref(), endpoint.as_deref(), None).await;
                            aws_sdk_glue::Client::new(&config)
                        })
                        .await;
                    fetch_glue(client, registry.as_deref(), uuid::Uuid::from_u128(id)).await?
                }
                Source::Given => continue,
            };
            self.lock()?.insert(id, found);
        }
        Ok(())
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, HashMap<u128, Writer>>> {
        self.writers
            .lock()
            .map_err(|_| Error::Internal("Avro schema cache lock poisoned".into()))
    }

    /// Decode `records` (resolved first, see [`AvroDecoder::resolve`]) in groups of one writer
    /// schema each; the others are returned with their errors.
    pub fn decode(&self, records: &[&[u8]]) -> Result<Decoded> {
        let mut errors = Vec::new();
        // Rows by writer schema, in the order the schemas first appear (a poll has few).
        let mut by_id: Vec<(u128, Vec<usize>)> = Vec::new();
        let mut at = 0;
        let mut bodies: Vec<Cow<'_, [u8]>> = Vec::with_capacity(records.len());
        for (i, r) in records.iter().enumerate() {
            let id = match self.split(r) {
                Ok((id, body)) => {
                    bodies.push(body);
                    id
                }
                Err(e) => {
                    errors.push((i, e));
                    bodies.push(Cow::Borrowed(&[]));
                    continue;
                }
            };
            if by_id.get(at).is_none_or(|(k, _)| *k != id) {
                at = match by_id.iter().position(|(k, _)| *k == id) {
                    Some(j) => j,
                    None => {
                        by_id.push((id, Vec::new()));
                        by_id.len() - 1
                    }
                };
            }
            by_id[at].1.push(i);
        }
        let mut groups = Vec::new();
        for (id, rows) in by_id {
            let writer = self.lock()?.get(&id).cloned();
            let (avro, arrow) = match writer {
                Some(Writer::Known { avro, arrow }) => (avro, arrow),
                Some(Writer::Unusable(why)) => {
                    errors.extend(rows.iter().map(|&i| (i, why.clone())));
                    continue;
                }
                None => {
                    let why = format!("schema {id} was not fetched from the registry");
                    errors.extend(rows.iter().map(|&i| (i, why.clone())));
                    continue;
                }
            };
            let framed = Framed::new(rows.iter().map(|&i| bodies[i].as_ref()));
            let frames = framed.frames();
            match self.decode_group(id, &avro, &arrow, &frames) {
                Ok(batch) => groups.push(Group { batch, rows }),
                Err(_) => {
                    // Find the bad ones: decode one by one.
                    let mut good = Vec::new();
                    let mut kept = Vec::new();
                    for (j, frame) in frames.iter().enumerate() {
                        let one = build_decoder(&avro).and_then(|mut decoder| {
                            decode_frames(&mut decoder, &arrow, std::slice::from_ref(frame))
                        });
                        match one {
                            Ok(b) => {
                                good.push(b);
                                kept.push(rows[j]);
                            }
                            Err(e) => errors.push((rows[j], e)),
                        }
                    }
                    if !good.is_empty() {
                        let batch = datafusion::arrow::compute::concat_batches(&arrow, &good)
                            .map_err(|e| Error::Internal(format!("joining Avro records: {e}")))?;
                        groups.push(Group { batch, rows: kept });
                    }
                }
            }
        }
        errors.sort_by_key(|(i, _)| *i);
        Ok(Decoded { groups, errors })
    }

    /// Decode `frames` of writer schema `id` with an idle decoder of it (or a new one), kept
    /// for the next poll when they all decode.
    fn decode_group(
        &self,
        id: u128,
        avro: &AvroSchema,
        arrow: &SchemaRef,
        frames: &[&[u8]],
    ) -> std::result::Result<RecordBatch, String> {
        let idle = {
            let mut idle = self.idle.lock().map_err(|_| "decoder pool poisoned")?;
            idle.iter()
                .position(|(k, _)| *k == id)
                .map(|j| idle.swap_remove(j).1)
        };
        let mut decoder = match idle {
            Some(d) => d,
            None => build_decoder(avro)?,
        };
        // A decoder that failed may hold part of a record: it is dropped.
        let batch = decode_frames(&mut decoder, arrow, frames)?;
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < IDLE_DECODERS
        {
            idle.push((id, decoder));
        }
        Ok(batch)
    }
}

/// A record's body after its header: as it is, or compressed with zlib.
enum Body<'a> {
    Plain(&'a [u8]),
    Zlib(&'a [u8]),
}

impl<'a> Body<'a> {
    fn inflated(self) -> std::result::Result<Cow<'a, [u8]>, String> {
        match self {
            Body::Plain(body) => Ok(Cow::Borrowed(body)),
            Body::Zlib(body) => {
                let mut out = Vec::new();
                flate2::read::ZlibDecoder::new(body)
                    .read_to_end(&mut out)
                    .map_err(|e| format!("the zlib-compressed body does not inflate: {e}"))?;
                Ok(Cow::Owned(out))
            }
        }
    }
}

/// Bodies behind a Confluent header naming [`FRAME`], one after the other: a body is never
/// mistaken for a header, whatever its first bytes, and bytes left over after a body are
/// taken for a header only when they are exactly this one.
struct Framed {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl Framed {
    fn new<'a>(bodies: impl ExactSizeIterator<Item = &'a [u8]> + Clone) -> Self {
        let size = bodies.clone().map(|b| b.len() + 5).sum();
        let mut bytes = Vec::with_capacity(size);
        let mut ends = Vec::with_capacity(bodies.len());
        for b in bodies {
            bytes.push(0);
            bytes.extend_from_slice(&FRAME.to_be_bytes());
            bytes.extend_from_slice(b);
            ends.push(bytes.len());
        }
        Self { bytes, ends }
    }

    fn frames(&self) -> Vec<&[u8]> {
        let mut start = 0;
        self.ends
            .iter()
            .map(|&end| {
                let frame = &self.bytes[start..end];
                start = end;
                frame
            })
            .collect()
    }
}

/// `url` without its `user:password@`, and that user info (percent-decoded), if it had one.
fn split_user_info(url: &str) -> (String, Option<String>) {
    let Ok(mut u) = url::Url::parse(url) else {
        return (url.to_string(), None);
    };
    if u.username().is_empty() && u.password().is_none() {
        return (url.to_string(), None);
    }
    let decode = |s: &str| {
        url::form_urlencoded::parse(format!("x={s}").as_bytes())
            .next()
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default()
    };
    let info = format!(
        "{}:{}",
        decode(u.username()),
        decode(u.password().unwrap_or(""))
    );
    let _ = u.set_username("");
    let _ = u.set_password(None);
    (u.to_string(), Some(info))
}

/// Schema `id` from the Confluent-compatible registry at `url`.
async fn fetch_confluent(
    client: &reqwest::Client,
    url: &str,
    user_info: Option<&str>,
    id: u32,
) -> Result<Writer> {
    let mut request = client.get(format!("{url}/schemas/ids/{id}"));
    if let Some(info) = user_info {
        let (user, password) = info.split_once(':').unwrap_or((info, ""));
        request = request.basic_auth(user, Some(password));
    }
    let unreachable =
        |e: String| Error::Source(format!("schema registry {url}: fetching schema {id}: {e}"));
    let response = request
        .send()
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let status = response.status();
    if status == reqwest::StatusCode::NOT_FOUND {
        return Ok(Writer::Unusable(format!(
            "schema id {id} is unknown to the registry at {url}"
        )));
    }
    if !status.is_success() {
        return Err(unreachable(format!("HTTP {status}")));
    }
    let body: serde_json::Value = response
        .json()
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    Ok(
        match (
            body.get("schema").and_then(|s| s.as_str()),
            body.get("schemaType"),
        ) {
            (Some(text), None) => writer(text),
            (Some(text), Some(t)) if t == "AVRO" => writer(text),
            (_, Some(t)) => Writer::Unusable(format!("schema id {id} is a {t} schema, not Avro")),
            (None, None) => Writer::Unusable(format!(
                "the registry's answer for schema id {id} has no schema"
            )),
        },
    )
}

/// Schema version `id` from the Glue Schema Registry.
async fn fetch_glue(
    client: &aws_sdk_glue::Client,
    registry: Option<&str>,
    id: uuid::Uuid,
) -> Result<Writer> {
    use aws_sdk_glue::error::ProvideErrorMetadata;
    let answer = client
        .get_schema_version()
        .schema_version_id(id.to_string())
        .send()
        .await;
    let registry = registry.unwrap_or("the Glue Schema Registry");
    match answer {
        Ok(v) => Ok(match (v.data_format(), v.schema_definition()) {
            (Some(aws_sdk_glue::types::DataFormat::Avro), Some(text)) => writer(text),
            (Some(f), _) => Writer::Unusable(format!(
                "schema version {id} in {registry} is {f}, not Avro"
            )),
            (None, _) => Writer::Unusable(format!(
                "schema version {id} in {registry} has no Avro schema"
            )),
        }),
        Err(e) if e.code() == Some("EntityNotFoundException") => Ok(Writer::Unusable(format!(
            "schema version {id} is unknown to {registry}"
        ))),
        Err(e) => Err(Error::Source(format!(
            "{registry}: fetching schema version {id}: {}",
            e.message()
                .map(str::to_string)
                .unwrap_or_else(|| e.to_string())
        ))),
    }
}

/// The writer schema of `text` (Avro schema JSON), if floe can read its records.
fn writer(text: &str) -> Writer {
    let avro = AvroSchema::new(text.to_string());
    let arrow = match probe_schema(&avro) {
        Ok(s) => s,
        Err(e) => return Writer::Unusable(format!("the Avro schema cannot be read: {e}")),
    };
    if let Some(name) = union_field(arrow.fields(), "") {
        return Writer::Unusable(format!(
            "field '{name}' is a union of several types; floe reads unions only as \
             [\"null\", T] (an optional T)"
        ));
    }
    let json: serde_json::Value = serde_json::from_str(text).unwrap_or_default();
    let arrow = Arc::new(Schema::new(
        arrow
            .fields()
            .iter()
            .map(|f| floe_field(f, field_named(Some(&json), f.name())))
            .collect::<Vec<_>>(),
    ));
    Writer::Known { avro, arrow }
}

/// The Arrow schema arrow-avro reads records of `avro` as.
fn probe_schema(avro: &AvroSchema) -> std::result::Result<SchemaRef, String> {
    Ok(build_decoder(avro)?.schema())
}

/// A decoder of bodies of `avro` each behind a Confluent header naming [`FRAME`].
fn build_decoder(avro: &AvroSchema) -> std::result::Result<arrow_avro::reader::Decoder, String> {
    let mut store = SchemaStore::new_with_type(FingerprintAlgorithm::Id);
    store
        .set(Fingerprint::Id(FRAME), avro.clone())
        .map_err(|e| e.to_string())?;
    ReaderBuilder::new()
        .with_batch_size(1 << 20)
        .with_writer_schema_store(store)
        .with_active_fingerprint(Fingerprint::Id(FRAME))
        .build_decoder()
        .map_err(|e| e.to_string())
}

/// The first field (a path) whose type is a union arrow-avro kept as a union.
fn union_field(fields: &Fields, path: &str) -> Option<String> {
    fields.iter().find_map(|f| {
        let name = format!("{path}{}", f.name());
        match f.data_type() {
            DataType::Union(_, _) => Some(name),
            DataType::Struct(children) => union_field(children, &format!("{name}.")),
            DataType::List(e) | DataType::LargeList(e) => {
                union_field(&Fields::from(vec![e.clone()]), &format!("{name}."))
            }
            DataType::Map(entries, _) => {
                union_field(&Fields::from(vec![entries.clone()]), &format!("{name}."))
            }
            _ => None,
        }
    })
}

/// The field `name` of the Avro record type `t` (a record, or a union of null and one), as JSON.
fn field_named<'a>(t: Option<&'a serde_json::Value>, name: &str) -> Option<&'a serde_json::Value> {
    let t = match t? {
        serde_json::Value::Array(branches) => branches.iter().find(|b| !b.is_string())?,
        other => other,
    };
    t.get("fields")?
        .as_array()?
        .iter()
        .find(|f| f.get("name").and_then(|n| n.as_str()) == Some(name))
}

/// The type of Avro field `avro` (its JSON), unwrapping a union with null.
fn field_type(avro: Option<&serde_json::Value>) -> Option<&serde_json::Value> {
    match avro?.get("type")? {
        serde_json::Value::Array(branches) => branches.iter().find(|b| b.as_str() != Some("null")),
        other => Some(other),
    }
}

/// `f` as floe keeps it: enums (dictionaries) as strings, and the Avro field's doc (from
/// `avro`, the field's JSON) as Iceberg's column doc, nested fields included.
fn floe_field(f: &FieldRef, avro: Option<&serde_json::Value>) -> Field {
    let ty = field_type(avro);
    let data_type = match f.data_type() {
        DataType::Struct(children) => DataType::Struct(
            children
                .iter()
                .map(|c| floe_field(c, field_named(ty, c.name())))
                .collect::<Vec<_>>()
                .into(),
        ),
        DataType::List(e) => {
            let items = ty
                .and_then(|t| t.get("items"))
                .map(|i| serde_json::json!({ "type": i }));
            DataType::List(Arc::new(floe_field(e, items.as_ref())))
        }
        other => plain_type(other),
    };
    let mut out = f.as_ref().clone().with_data_type(data_type);
    if let Some(doc) = avro.and_then(|a| a.get("doc")).and_then(|d| d.as_str()) {
        let mut metadata = out.metadata().clone();
        metadata.insert(crate::schema::FIELD_DOC.to_string(), doc.to_string());
        out = out.with_metadata(metadata);
    }
    out
}

/// `t` with dictionaries (Avro enums) as their value type.
fn plain_type(t: &DataType) -> DataType {
    match t {
        DataType::Dictionary(_, v) => plain_type(v),
        DataType::Struct(fields) => DataType::Struct(
            fields
                .iter()
                .map(|f| f.as_ref().clone().with_data_type(plain_type(f.data_type())))
                .collect::<Vec<_>>()
                .into(),
        ),
        DataType::List(e) => DataType::List(Arc::new(
            e.as_ref().clone().with_data_type(plain_type(e.data_type())),
        )),
        DataType::Map(e, sorted) => DataType::Map(
            Arc::new(e.as_ref().clone().with_data_type(plain_type(e.data_type()))),
            *sorted,
        ),
        other => other.clone(),
    }
}

/// Decode `frames` (each one record in the Confluent framing `decoder` reads) into a batch
/// of `arrow` (their floe schema). Fails at the first record that does not decode or has
/// bytes left over.
fn decode_frames(
    decoder: &mut arrow_avro::reader::Decoder,
    arrow: &SchemaRef,
    frames: &[&[u8]],
) -> std::result::Result<RecordBatch, String> {
    const LEFT_OVER: &str = "bytes left over after the record";
    for frame in frames {
        let room = decoder.capacity();
        let taken = decoder.decode(frame);
        // arrow-avro goes on past a record's end: what follows it must be the next one.
        match (taken, room - decoder.capacity()) {
            (Ok(n), 1) if n == frame.len() => {}
            (_, rows) if rows > 0 => return Err(LEFT_OVER.to_string()),
            (Err(e), _) => return Err(e.to_string()),
            (Ok(_), _) => return Err("the record ends before its last field".to_string()),
        }
    }
    // Bytes left over that read as a header leave the decoder waiting for a body (and read
    // the next record's header as one): a byte that is no header is then taken as the start
    // of a body, where a decoder between records refuses it.
    if decoder.decode(&[0xff]).is_ok() {
        return Err(LEFT_OVER.to_string());
    }
    let batch = decoder
        .flush()
        .map_err(|e| e.to_string())?
        .ok_or_else(|| "no record to decode".to_string())?;
    let columns = crate::schema::types::cast_to_fields(batch.columns(), arrow.fields())
        .map_err(|(_, e)| e.to_string())?;
    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    RecordBatch::try_new_with_options(arrow.clone(), columns, &options).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::Int64Type;

    use super::*;

    #[test]
    fn debug_shows_no_registry_credentials() {
        let mut o = Options::try_new(
            "test",
            [
                ("avro-confluent.url", "http://u:pw7@127.0.0.1:1/"),
                ("avro-confluent.basic-auth.user-info", "u:pw8"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string())),
        )
        .unwrap();
        let decoder = AvroDecoder::try_new("avro-confluent", &mut o).unwrap();
        let shown = format!("{decoder:?}");
        assert!(!shown.contains("pw7") && !shown.contains("pw8"), "{shown}");
        assert!(shown.contains("127.0.0.1:1"), "{shown}");
    }

    #[tokio::test]
    async fn registry_credentials_in_the_url_never_show() {
        let (url, info) = split_user_info("http://reader:hunter%232@127.0.0.1:1/registry/");
        assert_eq!(url, "http://127.0.0.1:1/registry/");
        assert_eq!(info.as_deref(), Some("reader:hunter#2"));
        assert_eq!(split_user_info("http://127.0.0.1:1").1, None);
        // An unreachable registry's error names it without the password.
        let client = reqwest::Client::new();
        let err = match fetch_confluent(&client, &url, info.as_deref(), 7).await {
            Err(e) => e.to_string(),
            Ok(_) => panic!("nothing listens on port 1"),
        };
        assert!(err.contains("127.0.0.1:1"), "{err}");
        assert!(!err.contains("hunter"), "{err}");
    }

    /// Avro's zig-zag varint.
    fn long(n: i64) -> Vec<u8> {
        let mut z = ((n << 1) ^ (n >> 63)) as u64;
        let mut out = Vec::new();
        loop {
            let b = (z & 0x7f) as u8;
            z >>= 7;
            if z == 0 {
                out.push(b);
                return out;
            }
            out.push(b | 0x80);
        }
    }

    fn string(s: &str) -> Vec<u8> {
        let mut out = long(s.len() as i64);
        out.extend_from_slice(s.as_bytes());
        out
    }

    pub const SCHEMA: &str = r#"{"type": "record", "name": "Order", "fields": [
        {"name": "id", "type": "long", "doc": "the order id"},
        {"name": "status", "type": {"type": "enum", "name": "S", "symbols": ["NEW", "PAID"]}},
        {"name": "note", "type": ["null", "string"], "default": null},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
        {"name": "who", "type": {"type": "record", "name": "W", "fields": [{"name": "n", "type": "string", "doc": "who's name"}]}},
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "at", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "fx", "type": {"type": "fixed", "name": "F", "size": 3}},
        {"name": "f", "type": "float"},
        {"name": "ok", "type": "boolean"}
    ]}"#;

    /// One record of [`SCHEMA`].
    pub fn order(id: i64, paid: bool, note: Option<&str>) -> Vec<u8> {
        let mut b = long(id);
        b.extend(long(i64::from(paid)));
        match note {
            None => b.extend(long(0)),
            Some(n) => {
                b.extend(long(1));
                b.extend(string(n));
            }
        }
        b.extend(long(2)); // 12.34 as the two-byte big-endian unscaled 1234
        b.extend([0x04, 0xd2]);
        b.extend(long(1_714_557_600_000_000));
        b.extend(long(19_844));
        b.extend(long(2));
        b.extend(string("a"));
        b.extend(string("b"));
        b.extend(long(0));
        b.extend(long(1));
        b.extend(string("k"));
        b.extend(long(7));
        b.extend(long(0));
        b.extend(string("ann"));
        b.extend(string("6f1c2a9e-3b6d-4c1a-9a57-2f0e8d4b7c11"));
        b.extend(long(3_600_000_000));
        b.extend(long(1_714_557_600_000_000));
        b.extend(long(1_714_557_600_000));
        b.extend([1, 2, 3]);
        b.extend(1.5f32.to_le_bytes());
        b.push(1);
        b
    }

    fn given(schema: &str) -> AvroDecoder {
        let pair = ("avro.schema".to_string(), schema.to_string());
        let mut o = Options::try_new("t", [pair]).unwrap();
        AvroDecoder::try_new("avro", &mut o).unwrap()
    }

    #[test]
    fn records_with_bytes_left_over_or_cut_short_are_named_alone() {
        let d = given(SCHEMA);
        let a = order(1, false, None);
        let mut long = order(2, true, None);
        long.push(7);
        let mut twice = order(3, true, None);
        twice.extend(order(4, true, None));
        let short = &a[..a.len() - 1];
        let b = order(5, false, Some("ok"));
        let Decoded { groups, errors } = d.decode(&[&a, &long, &twice, short, &b]).unwrap();
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].rows, vec![0, 4]);
        let ids = groups[0].batch.column(0).as_primitive::<Int64Type>();
        assert_eq!(ids.values().to_vec(), vec![1, 5]);
        let why: Vec<(usize, &str)> = errors.iter().map(|(i, e)| (*i, e.as_str())).collect();
        assert_eq!(why[0], (1, "bytes left over after the record"));
        assert_eq!(why[1], (2, "bytes left over after the record"));
        assert_eq!(why[2].0, 3);
        assert_eq!(errors.len(), 3);
        // The decoder kept from the first poll decodes the next one.
        let Decoded { groups, errors } = d.decode(&[&b, &a]).unwrap();
        assert!(errors.is_empty(), "{errors:?}");
        let ids = groups[0].batch.column(0).as_primitive::<Int64Type>();
        assert_eq!(ids.values().to_vec(), vec![5, 1]);
    }

    #[test]
    fn registry_records_group_by_schema_and_bad_ones_are_named() {
        let d = AvroDecoder {
            source: Source::Registry {
                url: "http://127.0.0.1:1".into(),
                user_info: None,
                client: reqwest::Client::new(),
            },
            writers: Mutex::new(HashMap::from([(7, writer(SCHEMA))])),
            idle: Mutex::default(),
        };
        let framed = |id: u32, body: Vec<u8>| [vec![0], id.to_be_bytes().to_vec(), body].concat();
        let a = framed(7, order(1, false, None));
        let mut long = framed(7, order(2, true, None));
        long.extend([0, 0, 0, 0, 7]);
        let b = framed(7, order(3, true, Some("x")));
        let other = framed(8, order(4, true, None));
        let Decoded { groups, errors } = d.decode(&[&a, &long, &other, &b]).unwrap();
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].rows, vec![0, 3]);
        let ids = groups[0].batch.column(0).as_primitive::<Int64Type>();
        assert_eq!(ids.values().to_vec(), vec![1, 3]);
        let why: Vec<(usize, &str)> = errors.iter().map(|(i, e)| (*i, e.as_str())).collect();
        assert_eq!(
            why,
            vec![
                (1, "bytes left over after the record"),
                (2, "schema 8 was not fetched from the registry")
            ]
        );
    }

    #[test]
    fn types_map_exactly_and_bad_bodies_are_named() {
        let d = given(SCHEMA);
        let a = order(1, false, None);
        let b = order(2, true, Some("gift"));
        let bad = vec![0x02, 0x09]; // id 1, then an enum index out of range, then nothing
        let Decoded { groups, errors } = d.decode(&[&a, &bad, &b]).unwrap();
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].rows, vec![0, 2]);
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].0, 1);
        let batch = &groups[0].batch;
        let types: Vec<String> = batch
            .schema()
            .fields()
            .iter()
            .map(|f| format!("{} {}", f.name(), f.data_type()))
            .collect();
        assert_eq!(
            types,
            vec![
                "id Int64",
                "status Utf8",
                "note Utf8",
                "amount Decimal128(10, 2)",
                "ts Timestamp(µs, \"+00:00\")",
                "day Date32",
                "tags List(non-null Utf8)",
                "attrs Map(\"entries\": non-null Struct(\"key\": non-null Utf8, \"value\": \
                 non-null Int64), unsorted)",
                "who Struct(\"n\": non-null Utf8, metadata: {\"doc\": \"who's name\"})",
                "ref FixedSizeBinary(16)",
                "at Time64(µs)",
                "local Timestamp(µs)",
                "ms Timestamp(ms, \"+00:00\")",
                "fx FixedSizeBinary(3)",
                "f Float32",
                "ok Boolean",
            ]
        );
        assert_eq!(
            batch
                .column(0)
                .as_primitive::<Int64Type>()
                .values()
                .to_vec(),
            vec![1, 2]
        );
        assert_eq!(
            batch
                .schema()
                .field(0)
                .metadata()
                .get("doc")
                .map(String::as_str),
            Some("the order id")
        );
    }

    #[test]
    fn the_schema_can_come_from_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("order.avsc");
        std::fs::write(&path, SCHEMA).unwrap();
        let pair = ("avro.schema-file".to_string(), path.display().to_string());
        let mut o = Options::try_new("t", [pair]).unwrap();
        let d = AvroDecoder::try_new("avro", &mut o).unwrap();
        let rec = order(5, true, None);
        let out = d.decode(&[&rec]).unwrap();
        assert_eq!(out.groups[0].rows, vec![0]);
        let missing = (
            "avro.schema-file".to_string(),
            "/nonexistent.avsc".to_string(),
        );
        let mut o = Options::try_new("t", [missing]).unwrap();
        let e = AvroDecoder::try_new("avro", &mut o)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("reading 'avro.schema-file' /nonexistent.avsc"),
            "{e}"
        );
    }

    #[test]
    fn unions_of_several_types_are_refused_with_the_field() {
        let schema = r#"{"type": "record", "name": "R", "fields": [
            {"name": "v", "type": ["null", "string", "long"]}]}"#;
        let pair = ("avro.schema".to_string(), schema.to_string());
        let mut o = Options::try_new("t", [pair]).unwrap();
        let e = AvroDecoder::try_new("avro", &mut o)
            .unwrap_err()
            .to_string();
        assert!(e.contains("field 'v' is a union of several types"), "{e}");
    }
}
