//! `kafka`: records of Kafka topics, read through librdkafka (the `rdkafka` crate).
//!
//! ```text
//! 'connector' = 'kafka'
//! 'topic'         = 'events' | 'a;b;c'      one topic, or several separated by ';'
//! 'topic-pattern' = 'events-.*'             or every topic whose whole name matches a regex
//! 'properties.bootstrap.servers' = 'host:9092'
//! 'properties.<key>' = '...'                any librdkafka setting, passed verbatim
//! 'format' = 'json' | 'csv' | 'raw'         (and the format's own options)
//! 'scan.startup.mode' = 'earliest-offset'   (default) | 'latest-offset' | 'timestamp'
//!                     | 'group-offsets'     (needs 'properties.group.id')
//! 'scan.startup.timestamp-millis' = '1700000000000'   with 'timestamp'
//! 'scan.bounded.mode' = 'unbounded'         (default) | 'latest-offset': finish each
//!                                           partition once it has caught up with its end
//! 'scan.topic-partition-discovery.interval' = '10s'   '0' turns discovery off
//! 'scan.error-timeout' = '60s'              how long a topic may be missing or the broker
//!                                           unreachable before the job fails
//! 'scan.upsert' = 'true'                    each record upserts the source's PRIMARY KEY,
//!                                           a tombstone (a key, no value) deletes it
//! 'key.format' = 'json' | 'raw'             an upsert topic's keys: JSON objects of the
//!                                           key columns (default), or one column's text
//! ```
//!
//! Columns are declared. Declare any of `_key STRING`, `_partition INT`, `_offset BIGINT`,
//! `_timestamp TIMESTAMP` and `_topic STRING` to get the record's key, partition, offset,
//! timestamp and topic.
//!
//! Partitions are assigned directly (no consumer-group rebalancing) and their positions are
//! the source's offsets, `"<topic>:<partition>"` -> the next offset to read, kept in floe's
//! checkpoints: exactly-once does not rely on offsets committed to Kafka, and floe commits
//! none. Partitions that appear while a job runs (more partitions, or a new topic matching
//! the pattern) are read from their earliest offset, and so are partitions a resumed job
//! finds that its checkpoint does not know.

mod context;
mod discovery;
mod offsets;
mod queue;
mod records;
mod source;

use std::collections::BTreeMap;
use std::time::Duration;

use datafusion::arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use regex::Regex;

pub use self::offsets::{TopicPartition, parse_offsets};
pub use self::source::KafkaReader;
use super::data_schema;
use crate::error::{Error, Result};
use crate::format::Decoder;
use crate::sql::Options;
use crate::sql::options::unsupported;

/// Parsed `kafka` options.
#[derive(Clone)]
pub struct KafkaOptions {
    pub topics: Topics,
    /// librdkafka settings, verbatim (`properties.` removed).
    pub properties: BTreeMap<String, String>,
    pub decoder: Decoder,
    pub startup: StartupMode,
    pub bounded: bool,
    /// `None`: the partitions of the first listing are all there is.
    pub discovery_interval: Option<Duration>,
    pub error_timeout: Duration,
    /// `'scan.upsert' = 'true'`: each record upserts its key, a tombstone deletes it.
    pub upsert: Option<UpsertKey>,
}

/// How an upsert topic's records name their key: the source's primary key, in the record's
/// key as JSON (`'key.format' = 'json'`, the default) or as the text of its one column
/// (`'raw'`).
#[derive(Debug, Clone, PartialEq)]
pub struct UpsertKey {
    /// The primary key's columns (set from the source's `PRIMARY KEY`).
    pub columns: Vec<String>,
    pub raw: bool,
}

impl std::fmt::Debug for KafkaOptions {
    /// librdkafka settings with secrets masked ([`crate::secret`]).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaOptions")
            .field("topics", &self.topics)
            .field("properties", &crate::secret::Masked(&self.properties))
            .field("decoder", &self.decoder)
            .field("startup", &self.startup)
            .field("bounded", &self.bounded)
            .field("discovery_interval", &self.discovery_interval)
            .field("error_timeout", &self.error_timeout)
            .field("upsert", &self.upsert)
            .finish()
    }
}

/// Which topics a source reads.
#[derive(Debug, Clone)]
pub enum Topics {
    /// These topics, in this order.
    List(Vec<String>),
    /// Every topic whose whole name matches.
    Pattern(Regex),
}

impl Topics {
    /// Whether `topic` is one of them.
    pub fn matches(&self, topic: &str) -> bool {
        match self {
            Topics::List(l) => l.iter().any(|t| t == topic),
            Topics::Pattern(p) => p.is_match(topic),
        }
    }
}

impl std::fmt::Display for Topics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Topics::List(l) if l.len() == 1 => write!(f, "topic '{}'", l[0]),
            Topics::List(l) => write!(f, "topics '{}'", l.join(";")),
            Topics::Pattern(p) => {
                let p = p.as_str();
                let p = p.strip_prefix("^(?:").unwrap_or(p);
                write!(f, "topic pattern '{}'", p.strip_suffix(")$").unwrap_or(p))
            }
        }
    }
}

/// Where partitions that the checkpoint does not know start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartupMode {
    Earliest,
    Latest,
    /// The group's committed offsets; partitions without one follow `auto.offset.reset`.
    GroupOffsets,
    /// The first record at or after this time (milliseconds since the epoch).
    Timestamp(i64),
}

pub(crate) const KEY_COLUMN: &str = "_key";
pub(crate) const PARTITION_COLUMN: &str = "_partition";
pub(crate) const OFFSET_COLUMN: &str = "_offset";
pub(crate) const TIMESTAMP_COLUMN: &str = "_timestamp";
pub(crate) const TOPIC_COLUMN: &str = "_topic";

fn metadata_columns() -> [(&'static str, DataType); 5] {
    [
        (KEY_COLUMN, DataType::Utf8),
        (PARTITION_COLUMN, DataType::Int32),
        (OFFSET_COLUMN, DataType::Int64),
        (
            TIMESTAMP_COLUMN,
            DataType::Timestamp(TimeUnit::Microsecond, None),
        ),
        (TOPIC_COLUMN, DataType::Utf8),
    ]
}

impl KafkaOptions {
    pub fn try_new(schema: &SchemaRef, options: &mut Options) -> Result<Self> {
        let topics = match (options.take_str("topic"), options.take_str("topic-pattern")) {
            (Some(t), None) => {
                let list: Vec<String> = t
                    .split(';')
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .map(str::to_string)
                    .collect();
                if list.is_empty() {
                    return Err(Error::Option(format!("'topic' = '{t}' names no topic")));
                }
                Topics::List(list)
            }
            (None, Some(p)) => Topics::Pattern(Regex::new(&format!("^(?:{p})$")).map_err(|e| {
                Error::Option(format!("'topic-pattern' = '{p}' is not a regex: {e}"))
            })?),
            (Some(_), Some(_)) => {
                return Err(Error::Option(
                    "give either 'topic' or 'topic-pattern', not both".to_string(),
                ));
            }
            (None, None) => {
                return Err(Error::Option(
                    "the kafka connector needs 'topic' (one or several separated by ';') \
                     or 'topic-pattern'"
                        .to_string(),
                ));
            }
        };
        let properties = options.take_prefixed("properties.");
        if !properties.contains_key("bootstrap.servers") {
            return Err(Error::Option(
                "the kafka connector needs 'properties.bootstrap.servers', e.g. \
                 'properties.bootstrap.servers' = '127.0.0.1:9092'"
                    .to_string(),
            ));
        }
        let format = options.require_str("format")?;
        let decoder =
            Decoder::try_new(&format, options, data_schema(schema, &metadata_columns())?)?;
        let upsert = options.take_bool("scan.upsert")?.unwrap_or(false);
        let key_format = options.take_choice("key.format", &["json", "raw"])?;
        if key_format.is_some() && !upsert {
            return Err(Error::Option(
                "'key.format' says how an upsert topic's keys are written: it goes with \
                 'scan.upsert' = 'true'"
                    .to_string(),
            ));
        }
        if upsert && format != "json" {
            return Err(Error::Option(format!(
                "'scan.upsert' = 'true' reads JSON values ('format' = 'json'), not '{format}'"
            )));
        }
        let upsert = upsert.then(|| UpsertKey {
            columns: Vec::new(),
            raw: key_format == Some("raw"),
        });
        let startup = startup_mode(options, &properties)?;
        let bounded = options.take_choice("scan.bounded.mode", &["unbounded", "latest-offset"])?
            == Some("latest-offset");
        let discovery_interval = options
            .take_duration("scan.topic-partition-discovery.interval")?
            .unwrap_or(Duration::from_secs(10));
        let error_timeout = options
            .take_duration("scan.error-timeout")?
            .unwrap_or(Duration::from_secs(60));
        let o = Self {
            topics,
            properties,
            decoder,
            startup,
            bounded,
            discovery_interval: (!discovery_interval.is_zero()).then_some(discovery_interval),
            error_timeout,
            upsert,
        };
        // Unknown or malformed librdkafka settings fail here, not when a job starts.
        o.client_config()
            .create_native_config()
            .map_err(|e| match e {
                KafkaError::ClientConfig(_, why, key, value) => Error::Option(format!(
                    "'properties.{key}' = '{}': {} (librdkafka's settings are listed in its \
                     CONFIGURATION.md)",
                    crate::secret::shown(&key, &value),
                    // librdkafka's own words may quote the value.
                    why.replace(value.as_str(), crate::secret::shown(&key, &value)),
                )),
                e => Error::Option(format!("kafka 'properties.*': {e}")),
            })?;
        Ok(o)
    }

    /// The consumer's configuration: the user's properties over floe's defaults.
    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        // floe keeps the positions in its checkpoints.
        config.set("enable.auto.commit", "false");
        config.set("enable.auto.offset.store", "false");
        // A position that no longer exists (retention) restarts at the oldest record.
        config.set("auto.offset.reset", "earliest");
        // librdkafka assigns partitions only to a consumer with a group; floe never joins
        // it (no subscription) and commits nothing to it.
        config.set("group.id", "floe");
        // librdkafka's default (1 s) stops fetching a partition for a second each time its
        // local queue is full: a reader that decodes slower than the broker sends then
        // waits most of the time (one core, the test broker: 105 K events/s against 430 K
        // with 10 ms).
        config.set("fetch.queue.backoff.ms", "10");
        if self.bounded {
            // A bounded reader learns that a partition has caught up from a fetch that
            // finds nothing new, which the broker holds up to this long (librdkafka's
            // default: 500 ms, which every bounded job waited at its end).
            config.set("fetch.wait.max.ms", "20");
        }
        for (k, v) in &self.properties {
            config.set(k, v);
        }
        // A bounded source learns that a partition has caught up from this event.
        config.set(
            "enable.partition.eof",
            if self.bounded { "true" } else { "false" },
        );
        config
    }

    /// The brokers, for messages.
    pub fn servers(&self) -> &str {
        self.properties
            .get("bootstrap.servers")
            .map(String::as_str)
            .unwrap_or("?")
    }

    /// Whether a partition without a committed offset starts at the oldest record
    /// (`auto.offset.reset`), for `group-offsets`.
    pub fn reset_to_earliest(&self) -> bool {
        !matches!(
            self.properties.get("auto.offset.reset").map(String::as_str),
            Some("latest" | "largest" | "end")
        )
    }
}

fn startup_mode(
    options: &mut Options,
    properties: &BTreeMap<String, String>,
) -> Result<StartupMode> {
    let mode = options.take_str("scan.startup.mode");
    let millis = options.take_str("scan.startup.timestamp-millis");
    let mode = match (mode.as_deref(), millis) {
        (None | Some("earliest-offset"), None) => StartupMode::Earliest,
        (Some("latest-offset"), None) => StartupMode::Latest,
        (Some("group-offsets"), None) => {
            if !properties.contains_key("group.id") {
                return Err(Error::Option(
                    "'scan.startup.mode' = 'group-offsets' needs 'properties.group.id'".to_string(),
                ));
            }
            StartupMode::GroupOffsets
        }
        (Some("timestamp"), Some(ms)) => match ms.trim().parse::<i64>() {
            Ok(ms) if ms >= 0 => StartupMode::Timestamp(ms),
            _ => {
                return Err(Error::Option(format!(
                    "'scan.startup.timestamp-millis' = '{ms}' is not a number of \
                     milliseconds since 1970-01-01"
                )));
            }
        },
        (Some("timestamp"), None) => {
            return Err(Error::Option(
                "'scan.startup.mode' = 'timestamp' needs 'scan.startup.timestamp-millis'"
                    .to_string(),
            ));
        }
        (_, Some(_)) => {
            return Err(Error::Option(
                "'scan.startup.timestamp-millis' goes with 'scan.startup.mode' = 'timestamp'"
                    .to_string(),
            ));
        }
        (Some(other), None) => {
            return Err(unsupported(
                "scan.startup.mode",
                other,
                &[
                    "earliest-offset",
                    "latest-offset",
                    "group-offsets",
                    "timestamp",
                ],
            ));
        }
    };
    Ok(mode)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::datatypes::{Field, Schema};

    use super::*;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("_partition", DataType::Int32, true),
            Field::new("_key", DataType::Utf8, true),
        ]))
    }

    fn parse(pairs: &[(&str, &str)]) -> Result<KafkaOptions> {
        let mut all = vec![
            ("properties.bootstrap.servers", "127.0.0.1:9092"),
            ("format", "json"),
        ];
        all.extend_from_slice(pairs);
        let mut o = Options::try_new(
            "CREATE SOURCE s",
            all.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        )?;
        let k = KafkaOptions::try_new(&schema(), &mut o)?;
        o.finish()?;
        Ok(k)
    }

    fn err(pairs: &[(&str, &str)]) -> String {
        parse(pairs).unwrap_err().to_string()
    }

    #[test]
    fn topics_and_patterns() {
        let o = parse(&[("topic", "a; b;;c")]).unwrap();
        assert!(matches!(&o.topics, Topics::List(l) if l == &["a", "b", "c"]));
        assert_eq!(o.topics.to_string(), "topics 'a;b;c'");
        let o = parse(&[("topic-pattern", "ev-[0-9]+")]).unwrap();
        assert!(o.topics.matches("ev-12"));
        assert!(!o.topics.matches("ev-12x"), "the whole name must match");
        assert!(!o.topics.matches("xev-1"));
        assert_eq!(o.topics.to_string(), "topic pattern 'ev-[0-9]+'");
        assert!(err(&[]).contains("needs 'topic'"));
        assert!(err(&[("topic", "a"), ("topic-pattern", "b")]).contains("not both"));
        assert!(err(&[("topic", " ; ")]).contains("names no topic"));
        assert!(err(&[("topic-pattern", "(")]).contains("is not a regex"));
    }

    #[test]
    fn defaults_and_modes() {
        let o = parse(&[("topic", "t")]).unwrap();
        assert_eq!(o.startup, StartupMode::Earliest);
        assert!(!o.bounded);
        assert_eq!(o.discovery_interval, Some(Duration::from_secs(10)));
        assert_eq!(o.error_timeout, Duration::from_secs(60));
        let o = parse(&[
            ("topic", "t"),
            ("scan.startup.mode", "timestamp"),
            ("scan.startup.timestamp-millis", "1700000000000"),
            ("scan.bounded.mode", "latest-offset"),
            ("scan.topic-partition-discovery.interval", "0"),
        ])
        .unwrap();
        assert_eq!(o.startup, StartupMode::Timestamp(1_700_000_000_000));
        assert!(o.bounded);
        assert_eq!(o.discovery_interval, None);
        let o = parse(&[
            ("topic", "t"),
            ("scan.startup.mode", "group-offsets"),
            ("properties.group.id", "g"),
            ("properties.auto.offset.reset", "latest"),
        ])
        .unwrap();
        assert_eq!(o.startup, StartupMode::GroupOffsets);
        assert!(!o.reset_to_earliest());
        assert!(
            err(&[("topic", "t"), ("scan.startup.mode", "group-offsets")])
                .contains("needs 'properties.group.id'")
        );
        assert!(
            err(&[("topic", "t"), ("scan.startup.mode", "timestamp")])
                .contains("needs 'scan.startup.timestamp-millis'")
        );
        assert!(
            err(&[("topic", "t"), ("scan.startup.timestamp-millis", "5")]).contains("goes with")
        );
        assert!(
            err(&[("topic", "t"), ("scan.startup.mode", "specific-offsets")])
                .contains("is not supported")
        );
        assert!(
            err(&[("topic", "t"), ("scan.bounded.mode", "timestamp")])
                .contains("'scan.bounded.mode' = 'timestamp' is not supported")
        );
    }

    #[test]
    fn options_must_be_known() {
        let e = err(&[("topic", "t"), ("scan.startup.mod", "x")]);
        assert!(e.contains("did you mean 'scan.startup.mode'"), "{e}");
        let e = err(&[("topic", "t"), ("properties.no.such.setting", "1")]);
        assert!(
            e.starts_with("'properties.no.such.setting' = '1': No such"),
            "{e}"
        );
        let mut o = Options::try_new("CREATE SOURCE s", [("topic".into(), "t".into())]).unwrap();
        let e = KafkaOptions::try_new(&schema(), &mut o)
            .unwrap_err()
            .to_string();
        assert!(e.contains("'properties.bootstrap.servers'"), "{e}");
    }

    #[test]
    fn a_bad_secret_setting_is_named_without_its_value() {
        let jaas = "org.apache.kafka.common.security.plain.PlainLoginModule required \
                    username=\"u\" password=\"hunter2\";";
        let e = err(&[("topic", "t"), ("properties.sasl.jaas.config", jaas)]);
        assert!(
            e.starts_with("'properties.sasl.jaas.config' = '****'"),
            "{e}"
        );
        assert!(!e.contains("hunter2"), "{e}");
    }

    #[test]
    fn debug_shows_no_secret() {
        let o = parse(&[("topic", "t"), ("properties.sasl.password", "hunter2")]).unwrap();
        let shown = format!("{o:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("sasl.password"), "{shown}");
    }

    #[test]
    fn user_properties_win_over_defaults() {
        let o = parse(&[("topic", "t"), ("properties.auto.offset.reset", "latest")]).unwrap();
        let c = o.client_config();
        assert_eq!(c.get("auto.offset.reset"), Some("latest"));
        assert_eq!(c.get("enable.auto.commit"), Some("false"));
        assert_eq!(c.get("enable.partition.eof"), Some("false"));
        assert_eq!(o.servers(), "127.0.0.1:9092");
    }

    #[test]
    fn metadata_columns_have_fixed_types() {
        let bad: SchemaRef = Arc::new(Schema::new(vec![Field::new(
            "_partition",
            DataType::Int64,
            true,
        )]));
        let mut o = Options::try_new(
            "s",
            [
                ("topic", "t"),
                ("properties.bootstrap.servers", "b:1"),
                ("format", "json"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string())),
        )
        .unwrap();
        let e = KafkaOptions::try_new(&bad, &mut o).unwrap_err().to_string();
        assert!(e.contains("'_partition' must be declared as Int32"), "{e}");
    }
}
