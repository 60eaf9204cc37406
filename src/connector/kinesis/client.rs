//! The few Kinesis calls a source makes (ListShards, GetShardIterator, GetRecords), on the
//! AWS SDK, with each failure sorted into what the reader should do about it.
//!
//! The SDK's own retries are cut to two attempts and its calls bounded by timeouts, so a
//! poll never hangs on a dead server: the reader retries on its own schedule and gives up
//! after `scan.failure-timeout`.

use std::time::Duration;

use aws_sdk_kinesis::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_kinesis::primitives::DateTime;
use aws_sdk_kinesis::types::{Record, ShardIteratorType};

use super::options::KinesisOptions;
use super::shards::{ListedShard, Position};
use crate::connector::aws::sdk_config;
use crate::error::{Error, Result};

/// Most records one GetRecords call returns (a Kinesis limit).
pub const MAX_RECORDS_PER_CALL: usize = 10_000;
/// How long a GetShardIterator call may take (see [`StreamClient::shard_iterator`]).
const ITERATOR_TIMEOUT: Duration = Duration::from_secs(2);

/// What went wrong with a call, sorted by what to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailureKind {
    /// The server is down, slow or failing: retry later.
    Unavailable,
    /// Over the stream's or the account's limits: back off, then retry.
    Throttled,
    /// The shard iterator is older than five minutes: take a new one.
    ExpiredIterator,
    /// The stream or shard does not exist.
    NotFound,
    /// Refused for good (bad credentials, bad argument): retrying will not help.
    Refused,
}

/// A failed call: its kind and the SDK's full message.
#[derive(Debug, Clone)]
pub struct Failure {
    pub kind: FailureKind,
    pub message: String,
}

/// What one GetRecords call returned.
#[derive(Debug)]
pub struct Fetched {
    pub records: Vec<Record>,
    /// `None` when a closed shard has no more records.
    pub next_iterator: Option<String>,
    pub millis_behind_latest: Option<i64>,
}

/// A Kinesis client for one stream.
#[derive(Debug, Clone)]
pub struct StreamClient {
    client: aws_sdk_kinesis::Client,
    stream: String,
}

impl StreamClient {
    /// A client for the stream of `options`: region, endpoint and credentials from the
    /// options, the rest (and whatever the options leave out) from the usual AWS chain.
    pub async fn connect(options: &KinesisOptions) -> Result<Self> {
        let config = sdk_config(
            options.region.as_deref(),
            options.endpoint.as_deref(),
            options.credentials.as_ref(),
        )
        .await;
        if config.region().is_none() {
            return Err(Error::Option(format!(
                "{}: no AWS region; set 'aws.region' (or AWS_REGION)",
                options.describe()
            )));
        }
        Ok(Self {
            client: aws_sdk_kinesis::Client::new(&config),
            stream: options.stream.clone(),
        })
    }

    /// Every shard of the stream, open and closed, following pages when there are any.
    pub async fn list_shards(&self) -> Result<Vec<ListedShard>, Failure> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            // A page token replaces the stream name (the API refuses both together).
            let call = match &token {
                Some(t) => self.client.list_shards().next_token(t),
                None => self.client.list_shards().stream_name(&self.stream),
            };
            let page = call.send().await.map_err(failure)?;
            for s in page.shards() {
                out.push(ListedShard {
                    id: s.shard_id().to_string(),
                    parents: s
                        .parent_shard_id()
                        .into_iter()
                        .chain(s.adjacent_parent_shard_id())
                        .map(str::to_string)
                        .collect(),
                    closed: s
                        .sequence_number_range()
                        .is_some_and(|r| r.ending_sequence_number().is_some()),
                });
            }
            match page.next_token() {
                Some(t) if !t.is_empty() && !page.shards().is_empty() => token = Some(t.into()),
                _ => return Ok(out),
            }
        }
    }

    /// A shard iterator at `position` (which is never [`Position::Drained`]), or at the
    /// shard's tip when `latest`.
    ///
    /// kinesalite never answers an AT_TIMESTAMP request when no record arrived after the
    /// time (AWS returns the tip), so this call has a short timeout of its own: the reader
    /// treats the timeout as a passing failure and asks again later.
    pub async fn shard_iterator(
        &self,
        shard: &str,
        position: &Position,
        latest: bool,
    ) -> Result<String, Failure> {
        let call = self
            .client
            .get_shard_iterator()
            .stream_name(&self.stream)
            .shard_id(shard);
        let call = match position {
            _ if latest => call.shard_iterator_type(ShardIteratorType::Latest),
            Position::TrimHorizon => call.shard_iterator_type(ShardIteratorType::TrimHorizon),
            Position::AtTimestamp(ms) => call
                .shard_iterator_type(ShardIteratorType::AtTimestamp)
                .timestamp(DateTime::from_millis(*ms)),
            Position::After(seq) => call
                .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                .starting_sequence_number(seq),
            Position::Drained => {
                return Err(Failure {
                    kind: FailureKind::Refused,
                    message: format!("shard {shard} is drained (a bug: it is never read again)"),
                });
            }
        };
        let short = aws_config::timeout::TimeoutConfig::builder()
            .operation_attempt_timeout(ITERATOR_TIMEOUT)
            .operation_timeout(ITERATOR_TIMEOUT)
            .build();
        let out = call
            .customize()
            .config_override(aws_sdk_kinesis::config::Builder::default().timeout_config(short))
            .send()
            .await
            .map_err(failure)?;
        out.shard_iterator.ok_or_else(|| Failure {
            kind: FailureKind::Unavailable,
            message: format!("GetShardIterator for {shard} returned no iterator"),
        })
    }

    /// Up to `limit` records at `iterator`.
    pub async fn get_records(&self, iterator: &str, limit: usize) -> Result<Fetched, Failure> {
        let limit = limit.clamp(1, MAX_RECORDS_PER_CALL) as i32;
        let out = self
            .client
            .get_records()
            .shard_iterator(iterator)
            .limit(limit)
            .send()
            .await
            .map_err(failure)?;
        Ok(Fetched {
            millis_behind_latest: out.millis_behind_latest,
            next_iterator: out.next_shard_iterator,
            records: out.records,
        })
    }
}

/// Sort an SDK error by what to do about it.
fn failure<E>(e: SdkError<E>) -> Failure
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let status = e.raw_response().map(|r| r.status().as_u16());
    let kind = match (e.code(), &e) {
        (Some("ExpiredIteratorException"), _) => FailureKind::ExpiredIterator,
        (
            Some(
                "ProvisionedThroughputExceededException"
                | "LimitExceededException"
                | "KMSThrottlingException"
                | "ThrottlingException",
            ),
            _,
        ) => FailureKind::Throttled,
        (Some("ResourceNotFoundException"), _) => FailureKind::NotFound,
        (Some("ResourceInUseException" | "InternalFailure" | "ServiceUnavailable"), _) => {
            FailureKind::Unavailable
        }
        (Some(_), _) if status.is_some_and(|s| s >= 500) => FailureKind::Unavailable,
        (Some(_), _) => FailureKind::Refused,
        (None, SdkError::ConstructionFailure(_)) => FailureKind::Refused,
        // Not a network failure: no credentials, or a request the client will not send.
        (None, SdkError::DispatchFailure(d)) if !d.is_io() && !d.is_timeout() => {
            FailureKind::Refused
        }
        (None, _) if status.is_some_and(|s| (400..500).contains(&s) && s != 429) => {
            FailureKind::Refused
        }
        (None, _) => FailureKind::Unavailable,
    };
    Failure {
        kind,
        message: crate::connector::aws::describe(&e),
    }
}
