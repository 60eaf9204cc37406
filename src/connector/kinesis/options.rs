//! The `WITH (...)` options of a Kinesis source, parsed and checked at `CREATE SOURCE`.
//!
//! Everything that can be wrong with the options is found here, before a job starts:
//! unknown keys (the bag must end empty), a startup timestamp that does not parse, a
//! bounded mode that does not exist, a metadata column of the wrong type.

use std::time::Duration;

use datafusion::arrow::datatypes::{DataType, SchemaRef, TimeUnit};

use super::{ARRIVAL_COLUMN, PARTITION_KEY_COLUMN, SEQUENCE_COLUMN, SHARD_COLUMN};
use crate::connector::aws::StaticCredentials;
use crate::connector::data_schema;
use crate::error::{Error, Result};
use crate::format::Decoder;
use crate::sql::Options;
use crate::sql::options::unsupported;

/// Default time between two listings of the stream's shards.
const DISCOVERY_INTERVAL: Duration = Duration::from_secs(10);
/// Default time a server may keep failing before the source gives up.
const FAILURE_TIMEOUT: Duration = Duration::from_secs(60);

/// Where the shards that exist when a job first starts are read from. Shards that appear
/// later (children of a split or merge) are always read from their first record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartupMode {
    /// The oldest record each shard keeps.
    TrimHorizon,
    /// Records that arrive after the job first started: each shard's tip, kept in the
    /// offsets as that time until a record of the shard is read, so a restart does not
    /// skip the records that arrived while the job was down.
    Latest,
    /// Records that arrived at or after this time (epoch milliseconds).
    AtTimestamp(i64),
}

/// Where a source ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoundedMode {
    /// Never: the source follows the stream until the job is stopped.
    Unbounded,
    /// At the records that had arrived when the job first started.
    Latest,
}

/// Parsed `kinesis` options.
#[derive(Debug, Clone)]
pub struct KinesisOptions {
    pub stream: String,
    pub region: Option<String>,
    pub endpoint: Option<String>,
    pub credentials: Option<StaticCredentials>,
    pub decoder: Decoder,
    pub startup: StartupMode,
    pub bounded: BoundedMode,
    pub discovery_interval: Duration,
    pub failure_timeout: Duration,
}

/// The metadata columns a Kinesis source fills, with their types.
pub fn metadata_columns() -> [(&'static str, DataType); 4] {
    [
        (SHARD_COLUMN, DataType::Utf8),
        (SEQUENCE_COLUMN, DataType::Utf8),
        (PARTITION_KEY_COLUMN, DataType::Utf8),
        (
            ARRIVAL_COLUMN,
            DataType::Timestamp(TimeUnit::Microsecond, None),
        ),
    ]
}

impl KinesisOptions {
    /// Read the Kinesis options of a source with the declared `schema` out of `options`.
    pub fn try_new(schema: &SchemaRef, options: &mut Options) -> Result<Self> {
        let stream = options.require_str("stream")?;
        if stream.is_empty() {
            return Err(Error::Option("'stream' must not be empty".to_string()));
        }
        let region = options.take_str("aws.region");
        let endpoint = options.take_str("aws.endpoint");
        if let Some(e) = &endpoint
            && !(e.starts_with("http://") || e.starts_with("https://"))
        {
            return Err(Error::Option(format!(
                "'aws.endpoint' must be an http:// or https:// URL, got '{e}'"
            )));
        }
        let credentials = StaticCredentials::from_options(options, "aws.")?;
        let format = options.require_str("format")?;
        let decoder =
            Decoder::try_new(&format, options, data_schema(schema, &metadata_columns())?)?;
        let startup = match options.take_str("scan.startup.mode").as_deref() {
            None | Some("trim-horizon") => StartupMode::TrimHorizon,
            Some("latest") => StartupMode::Latest,
            Some("at-timestamp") => {
                let ts = options.take_str("scan.startup.timestamp").ok_or_else(|| {
                    Error::Option(
                        "'scan.startup.mode' = 'at-timestamp' needs 'scan.startup.timestamp' \
                         (e.g. '2024-05-01T12:00:00Z' or epoch milliseconds)"
                            .to_string(),
                    )
                })?;
                StartupMode::AtTimestamp(parse_timestamp(&ts)?)
            }
            Some(other) => {
                return Err(unsupported(
                    "scan.startup.mode",
                    other,
                    &["trim-horizon", "latest", "at-timestamp"],
                ));
            }
        };
        if !matches!(startup, StartupMode::AtTimestamp(_))
            && options.take_str("scan.startup.timestamp").is_some()
        {
            return Err(Error::Option(
                "'scan.startup.timestamp' needs 'scan.startup.mode' = 'at-timestamp'".to_string(),
            ));
        }
        // 'latest': stop at the records that had arrived when the job started.
        let bounded = match options.take_choice("scan.bounded.mode", &["unbounded", "latest"])? {
            Some("latest") => BoundedMode::Latest,
            _ => BoundedMode::Unbounded,
        };
        let discovery_interval = positive(
            "scan.shard-discovery.interval",
            options.take_duration("scan.shard-discovery.interval")?,
            DISCOVERY_INTERVAL,
        )?;
        let failure_timeout = positive(
            "scan.failure-timeout",
            options.take_duration("scan.failure-timeout")?,
            FAILURE_TIMEOUT,
        )?;
        Ok(Self {
            stream,
            region,
            endpoint,
            credentials,
            decoder,
            startup,
            bounded,
            discovery_interval,
            failure_timeout,
        })
    }

    /// Where the stream is, for messages: `stream 'clicks' at http://127.0.0.1:4567`.
    pub fn describe(&self) -> String {
        let at = match (&self.endpoint, &self.region) {
            (Some(e), _) => e.clone(),
            (None, Some(r)) => format!("AWS region {r}"),
            (None, None) => "the AWS region of the environment".to_string(),
        };
        format!("Kinesis stream '{}' at {at}", self.stream)
    }
}

fn positive(key: &str, value: Option<Duration>, default: Duration) -> Result<Duration> {
    match value {
        None => Ok(default),
        Some(d) if d.is_zero() => Err(Error::Option(format!("'{key}' must be more than 0"))),
        Some(d) => Ok(d),
    }
}

/// Parse a startup timestamp: epoch milliseconds, RFC 3339 (`2024-05-01T12:00:00Z`), or a
/// date and time without an offset, taken as UTC (`2024-05-01 12:00:00`).
pub fn parse_timestamp(s: &str) -> Result<i64> {
    let t = s.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return t.parse::<i64>().map_err(|_| bad_timestamp(s));
    }
    if let Ok(ts) = chrono::DateTime::parse_from_rfc3339(t) {
        return Ok(ts.timestamp_millis());
    }
    for format in ["%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S%.f"] {
        if let Ok(ts) = chrono::NaiveDateTime::parse_from_str(t, format) {
            return Ok(ts.and_utc().timestamp_millis());
        }
    }
    if let Ok(d) = chrono::NaiveDate::parse_from_str(t, "%Y-%m-%d") {
        return Ok(d
            .and_time(chrono::NaiveTime::MIN)
            .and_utc()
            .timestamp_millis());
    }
    Err(bad_timestamp(s))
}

fn bad_timestamp(s: &str) -> Error {
    Error::Option(format!(
        "'scan.startup.timestamp' = '{s}' is not a time; use epoch milliseconds or \
         '2024-05-01T12:00:00Z'"
    ))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::datatypes::{Field, Schema};

    use super::*;

    fn schema(extra: &[(&str, DataType)]) -> SchemaRef {
        let mut fields = vec![Field::new("id", DataType::Int64, true)];
        fields.extend(extra.iter().map(|(n, t)| Field::new(*n, t.clone(), true)));
        Arc::new(Schema::new(fields))
    }

    fn parse(pairs: &[(&str, &str)]) -> Result<KinesisOptions> {
        parse_with(&schema(&[]), pairs)
    }

    fn parse_with(schema: &SchemaRef, pairs: &[(&str, &str)]) -> Result<KinesisOptions> {
        let mut all = vec![("stream", "s"), ("format", "json")];
        all.extend_from_slice(pairs);
        let mut o = Options::try_new(
            "CREATE SOURCE k",
            all.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        )?;
        let parsed = KinesisOptions::try_new(schema, &mut o)?;
        o.finish()?;
        Ok(parsed)
    }

    #[test]
    fn defaults() {
        let o = parse(&[]).unwrap();
        assert_eq!(o.stream, "s");
        assert_eq!(o.startup, StartupMode::TrimHorizon);
        assert_eq!(o.bounded, BoundedMode::Unbounded);
        assert_eq!(o.discovery_interval, Duration::from_secs(10));
        assert!(o.credentials.is_none() && o.region.is_none() && o.endpoint.is_none());
        assert_eq!(
            o.describe(),
            "Kinesis stream 's' at the AWS region of the environment"
        );
    }

    #[test]
    fn everything_given() {
        let o = parse(&[
            ("aws.region", "eu-west-1"),
            ("aws.endpoint", "http://127.0.0.1:4567"),
            ("aws.access-key-id", "AKID"),
            ("aws.secret-access-key", "very-secret"),
            ("aws.session-token", "tok"),
            ("scan.startup.mode", "at-timestamp"),
            ("scan.startup.timestamp", "2024-05-01T00:00:01Z"),
            ("scan.bounded.mode", "latest"),
            ("scan.shard-discovery.interval", "500ms"),
            ("scan.failure-timeout", "5s"),
        ])
        .unwrap();
        assert_eq!(o.startup, StartupMode::AtTimestamp(1_714_521_601_000));
        assert_eq!(o.bounded, BoundedMode::Latest);
        assert_eq!(o.discovery_interval, Duration::from_millis(500));
        assert_eq!(o.failure_timeout, Duration::from_secs(5));
        assert_eq!(o.region.as_deref(), Some("eu-west-1"));
        let debug = format!("{o:?}");
        assert!(
            !debug.contains("very-secret") && !debug.contains("tok\""),
            "{debug}"
        );
        assert_eq!(o.describe(), "Kinesis stream 's' at http://127.0.0.1:4567");
    }

    #[test]
    fn bad_options_are_named() {
        let err = |pairs: &[(&str, &str)]| parse(pairs).unwrap_err().to_string();
        assert!(err(&[("scan.startup.mode", "earliest")]).contains("'earliest'"));
        assert!(err(&[("scan.startup.mode", "at-timestamp")]).contains("scan.startup.timestamp"));
        assert!(err(&[("scan.startup.timestamp", "1")]).contains("at-timestamp"));
        assert!(err(&[("scan.bounded.mode", "forever")]).contains("'forever'"));
        assert!(err(&[("aws.access-key-id", "k")]).contains("together"));
        assert!(err(&[("aws.endpoint", "127.0.0.1:4567")]).contains("http://"));
        assert!(err(&[("scan.shard-discovery.interval", "0s")]).contains("more than 0"));
        let unknown = err(&[("aws.regoin", "x")]);
        assert!(unknown.contains("did you mean 'aws.region'?"), "{unknown}");
    }

    #[tokio::test]
    async fn metadata_columns_must_have_their_types() {
        let ok = schema(&[
            ("_shard", DataType::Utf8),
            (
                "_arrival_time",
                DataType::Timestamp(TimeUnit::Microsecond, None),
            ),
        ]);
        let o = parse_with(&ok, &[]).unwrap();
        // The decoder sees only the data columns.
        let decoded = o.decoder.decode(&[br#"{"id": 7}"#]).await.unwrap();
        assert_eq!(decoded.groups[0].batch.num_columns(), 1);
        let bad = schema(&[("_sequence", DataType::Int64)]);
        let err = parse_with(&bad, &[]).unwrap_err().to_string();
        assert!(
            err.contains("'_sequence' must be declared as Utf8"),
            "{err}"
        );
    }

    #[test]
    fn timestamps_parse() {
        assert_eq!(parse_timestamp("1714521600000").unwrap(), 1_714_521_600_000);
        assert_eq!(
            parse_timestamp("2024-05-01T02:00:00+02:00").unwrap(),
            1_714_521_600_000
        );
        assert_eq!(
            parse_timestamp("2024-05-01 00:00:00.250").unwrap(),
            1_714_521_600_250
        );
        assert_eq!(parse_timestamp("2024-05-01").unwrap(), 1_714_521_600_000);
        assert!(parse_timestamp("yesterday").is_err());
        assert!(parse_timestamp("-5").is_err());
    }
}
