//! The Kinesis [`SourceReader`]: lists shards, reads the ready ones with GetRecords,
//! decodes their data and keeps each shard's position.
//!
//! ```text
//! poll:  list shards (first poll, every discovery interval, after a shard drains)
//!        -> a ready shard (parents drained, its pause over), in turn
//!        -> GetShardIterator (once per position) -> GetRecords
//!        -> decode -> Poll::Records, position = last sequence number returned
//!        (no next iterator: the closed shard is drained, its children become ready)
//! ```
//!
//! A shard is polled at most five times a second (the Kinesis limit per shard) and, when
//! it had nothing, rests a little longer. Throttling backs that shard off. A server that
//! fails makes `poll` return [`Poll::Idle`]; only when it keeps failing for
//! `scan.failure-timeout` does `poll` fail, naming the stream and endpoint.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_sdk_kinesis::types::Record;
use datafusion::arrow::array::{ArrayRef, StringArray, TimestampMicrosecondArray};
use datafusion::arrow::datatypes::SchemaRef;

use super::client::{Failure, FailureKind, Fetched, StreamClient};
use super::options::{BoundedMode, KinesisOptions, StartupMode};
use super::shards::{Position, ShardTracker};
use super::{ARRIVAL_COLUMN, PARTITION_KEY_COLUMN, SEQUENCE_COLUMN, SHARD_COLUMN};
use crate::connector::{Offsets, Poll, Reject, SourceReader, with_metadata};
use crate::error::{Error, Result};

/// Least time between two GetRecords calls on one shard (Kinesis allows five a second).
const SHARD_GAP: Duration = Duration::from_millis(200);
/// Rest of an open shard after a GetRecords call that found nothing.
const EMPTY_GAP: Duration = Duration::from_millis(400);
/// First and longest back-off of a throttled or failing shard (doubling in between).
const BACKOFF_MIN: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// How long one poll keeps trying shards that have nothing.
const POLL_BUDGET: Duration = Duration::from_millis(250);
/// Longest sleep of a poll with no shard ready.
const IDLE_SLEEP: Duration = Duration::from_millis(50);

/// A shard's read state that is not part of the offsets.
#[derive(Debug, Default)]
struct Cursor {
    iterator: Option<String>,
    not_before: Option<Instant>,
    backoff: Duration,
}

impl Cursor {
    fn rest(&mut self, gap: Duration) {
        self.not_before = Some(Instant::now() + gap);
    }

    fn back_off(&mut self) {
        self.backoff = (self.backoff * 2).clamp(BACKOFF_MIN, BACKOFF_MAX);
        self.rest(self.backoff);
    }
}

/// Reads one Kinesis stream.
pub struct KinesisReader {
    schema: SchemaRef,
    options: KinesisOptions,
    client: Option<StreamClient>,
    tracker: ShardTracker,
    cursors: HashMap<String, Cursor>,
    next_listing: Instant,
    /// Rotates the shard tried first, so that a busy shard does not starve the others.
    turn: usize,
    /// Since when calls have been failing, and the last failure.
    failing: Option<(Instant, String)>,
}

impl KinesisReader {
    pub fn new(schema: SchemaRef, options: KinesisOptions) -> Self {
        Self {
            schema,
            options,
            client: None,
            tracker: ShardTracker::new(),
            cursors: HashMap::new(),
            next_listing: Instant::now(),
            turn: 0,
            failing: None,
        }
    }

    async fn client(&mut self) -> Result<StreamClient> {
        if let Some(c) = &self.client {
            return Ok(c.clone());
        }
        let c = StreamClient::connect(&self.options).await?;
        self.client = Some(c.clone());
        Ok(c)
    }

    /// A failed call: an error when it cannot get better or has failed for too long,
    /// otherwise `Ok` (the caller retries later).
    fn failed(&mut self, what: &str, f: Failure) -> Result<()> {
        let at = self.options.describe();
        match f.kind {
            FailureKind::Refused => {
                let hint = if f.message.contains("credential") {
                    " (give 'aws.access-key-id' and 'aws.secret-access-key', or AWS \
                     credentials in the environment or a profile)"
                } else {
                    ""
                };
                return Err(Error::Connector(format!(
                    "{at}: {what} failed: {}{hint}",
                    f.message
                )));
            }
            FailureKind::NotFound if what == "listing shards" => {
                return Err(Error::Connector(format!(
                    "{at} does not exist (create it first): {}",
                    f.message
                )));
            }
            _ => {}
        }
        let since = self
            .failing
            .get_or_insert_with(|| (Instant::now(), String::new()));
        since.1 = format!("{what}: {}", f.message);
        if since.0.elapsed() >= self.options.failure_timeout {
            return Err(Error::Connector(format!(
                "{at} kept failing for {:?} (scan.failure-timeout); last error: {}",
                self.options.failure_timeout, since.1
            )));
        }
        Ok(())
    }

    /// List the shards and take in new ones.
    async fn discover(&mut self, client: &StreamClient) -> Result<()> {
        // Taken before the listing: every shard it shows open was still open after this
        // time, which is what lets a bounded source stop at a shard that caught up.
        let initial = self.initial_position();
        match client.list_shards().await {
            Ok(listing) => {
                self.failing = None;
                self.tracker.merge_listing(&listing, &initial);
                self.next_listing = Instant::now() + self.options.discovery_interval;
            }
            Err(f) => {
                self.failed("listing shards", f)?;
                self.next_listing = Instant::now() + BACKOFF_MIN;
            }
        }
        Ok(())
    }

    /// Where the shards of the first listing start; sets a bounded source's stop time
    /// (once: a restored or earlier one is kept).
    fn initial_position(&mut self) -> Position {
        let now = chrono::Utc::now().timestamp_millis();
        if self.options.bounded == BoundedMode::Latest && !self.tracker.listed_before() {
            self.tracker.set_stop_at_once(now);
        }
        match self.options.startup {
            StartupMode::TrimHorizon => Position::TrimHorizon,
            StartupMode::Latest => Position::AtTimestamp(now),
            StartupMode::AtTimestamp(ms) => Position::AtTimestamp(ms),
        }
    }

    /// The shards to read now: readable, rested, starting from this turn's.
    fn ready(&mut self) -> Vec<String> {
        let now = Instant::now();
        let mut ready: Vec<String> = self
            .tracker
            .readable()
            .into_iter()
            .filter(|s| {
                self.cursors
                    .get(s)
                    .and_then(|c| c.not_before)
                    .is_none_or(|t| t <= now)
            })
            .collect();
        if !ready.is_empty() {
            let first = self.turn % ready.len();
            ready.rotate_left(first);
            self.turn = self.turn.wrapping_add(1);
        }
        ready
    }

    /// One GetRecords on `shard`: the records it returned, if any.
    async fn read_shard(
        &mut self,
        client: &StreamClient,
        shard: &str,
        max_rows: usize,
    ) -> Result<Option<Poll>> {
        let position = self
            .tracker
            .position(shard)
            .cloned()
            .unwrap_or(Position::Drained);
        if position == Position::Drained {
            return Ok(None);
        }
        let iterator = match self.cursors.get(shard).and_then(|c| c.iterator.clone()) {
            Some(it) => it,
            None => match client.shard_iterator(shard, &position).await {
                Ok(it) => it,
                Err(f) => {
                    return self
                        .shard_failed(shard, "GetShardIterator", f)
                        .map(|()| None);
                }
            },
        };
        let fetched = match client.get_records(&iterator, max_rows).await {
            Ok(f) => f,
            Err(f) => return self.shard_failed(shard, "GetRecords", f).map(|()| None),
        };
        self.failing = None;
        self.take(shard, fetched)
    }

    /// Turn a GetRecords answer into a poll, and move the shard's position past it.
    fn take(&mut self, shard: &str, fetched: Fetched) -> Result<Option<Poll>> {
        let Fetched {
            records,
            next_iterator,
            millis_behind_latest,
        } = fetched;
        // A bounded source returns no record that arrived after its stop time.
        let stop_at = self
            .tracker
            .stop_at()
            .filter(|_| self.options.bounded == BoundedMode::Latest);
        let keep = match stop_at {
            Some(stop) => records
                .iter()
                .position(|r| arrival_millis(r).is_some_and(|t| t > stop))
                .unwrap_or(records.len()),
            None => records.len(),
        };
        let poll = if keep > 0 {
            Some(self.decode(shard, &records[..keep])?)
        } else {
            None
        };
        // Decoded: now the records count as consumed.
        if let Some(last) = records[..keep].last() {
            self.tracker.consumed(shard, last.sequence_number());
        }
        let closed = self.tracker.is_closed(shard);
        let cursor = self.cursors.entry(shard.to_string()).or_default();
        cursor.backoff = Duration::ZERO;
        // An open shard that has nothing more now has nothing from before the stop time
        // left (the stop time was taken before the listing that showed it open). A closed
        // one is read to its end instead: its children may hold earlier records.
        let caught_up = records.is_empty()
            && next_iterator.is_some()
            && millis_behind_latest == Some(0)
            && !closed;
        if stop_at.is_some() && (keep < records.len() || caught_up) {
            // Past the stop time, or caught up with the stream after it.
            self.tracker.reached_bound(shard);
            cursor.iterator = None;
        } else if let Some(next) = next_iterator {
            cursor.iterator = Some(next);
            cursor.rest(if records.is_empty() && !closed {
                EMPTY_GAP
            } else {
                SHARD_GAP
            });
        } else {
            // A closed shard read to its end: its children may be new to us.
            self.tracker.drained(shard);
            self.cursors.remove(shard);
            self.next_listing = Instant::now();
        }
        Ok(poll)
    }

    fn shard_failed(&mut self, shard: &str, call: &str, f: Failure) -> Result<()> {
        let cursor = self.cursors.entry(shard.to_string()).or_default();
        match f.kind {
            FailureKind::ExpiredIterator => {
                // The position is intact: take a new iterator at it.
                cursor.iterator = None;
                Ok(())
            }
            FailureKind::Throttled => {
                cursor.back_off();
                Ok(())
            }
            FailureKind::NotFound if !self.tracker.is_listed(shard) => {
                // Gone from the stream's listing too: its records expired.
                self.tracker.drained(shard);
                self.cursors.remove(shard);
                Ok(())
            }
            FailureKind::NotFound => {
                // Perhaps expired since the last listing: list again, and retry.
                cursor.iterator = None;
                cursor.back_off();
                self.next_listing = Instant::now();
                self.failed(&format!("{call} on {shard}"), f)
            }
            _ => {
                cursor.iterator = None;
                cursor.back_off();
                self.failed(&format!("{call} on {shard}"), f)
            }
        }
    }

    /// Decode records of `shard` into a batch (with metadata columns) and rejects.
    fn decode(&self, shard: &str, records: &[Record]) -> Result<Poll> {
        let data: Vec<&[u8]> = records.iter().map(|r| r.data().as_ref()).collect();
        let decoded = self.options.decoder.decode(&data)?;
        let rejects = decoded
            .errors
            .iter()
            .map(|(i, e)| {
                let seq = records[*i].sequence_number();
                Reject {
                    partition: shard.to_string(),
                    // Sequence numbers (up to 128 digits) do not fit; the error names it.
                    offset: 0,
                    payload: data[*i].to_vec(),
                    error: format!(
                        "{} shard {shard} sequence number {seq}: cannot decode the record: {e}",
                        self.options.describe()
                    ),
                }
            })
            .collect();
        let rows = &decoded.rows;
        let n = rows.len();
        let strings = |f: &dyn Fn(&Record) -> &str| -> ArrayRef {
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|&i| f(&records[i])),
            ))
        };
        let batch = with_metadata(&self.schema, &decoded.batch, |name| match name {
            SHARD_COLUMN => Some(Arc::new(StringArray::from(vec![shard; n])) as ArrayRef),
            SEQUENCE_COLUMN => Some(strings(&|r| r.sequence_number())),
            PARTITION_KEY_COLUMN => Some(strings(&|r| r.partition_key())),
            ARRIVAL_COLUMN => Some(Arc::new(TimestampMicrosecondArray::from_iter(
                rows.iter().map(|&i| arrival_micros(&records[i])),
            )) as ArrayRef),
            _ => None,
        })?;
        Ok(Poll::Records { batch, rejects })
    }
}

/// The arrival time in microseconds, rounded to the millisecond Kinesis gives (the wire
/// format is fractional epoch seconds: 1714521600.054 reads as ...600.053999).
fn arrival_micros(r: &Record) -> Option<i64> {
    let t = r.approximate_arrival_timestamp()?;
    let millis = (i64::from(t.subsec_nanos()) + 500_000) / 1_000_000;
    t.secs()
        .checked_mul(1_000)?
        .checked_add(millis)?
        .checked_mul(1_000)
}

fn arrival_millis(r: &Record) -> Option<i64> {
    arrival_micros(r).map(|us| us.div_euclid(1_000))
}

#[async_trait]
impl SourceReader for KinesisReader {
    async fn poll(&mut self, max_rows: usize) -> Result<Poll> {
        let client = self.client().await?;
        if Instant::now() >= self.next_listing {
            self.discover(&client).await?;
        }
        if self.options.bounded == BoundedMode::Latest && self.tracker.finished() {
            return Ok(Poll::Finished);
        }
        let start = Instant::now();
        for shard in self.ready() {
            if let Some(poll) = self.read_shard(&client, &shard, max_rows).await? {
                return Ok(poll);
            }
            if start.elapsed() >= POLL_BUDGET {
                return Ok(Poll::Idle);
            }
        }
        // Nothing now: rest until a shard may be polled again (briefly).
        let now = Instant::now();
        let wake = self
            .cursors
            .values()
            .filter_map(|c| c.not_before)
            .chain([self.next_listing])
            .min()
            .map_or(IDLE_SLEEP, |t| t.saturating_duration_since(now));
        tokio::time::sleep(wake.min(IDLE_SLEEP)).await;
        Ok(Poll::Idle)
    }

    fn offsets(&self) -> Offsets {
        self.tracker.offsets()
    }

    fn seek(&mut self, offsets: &Offsets) -> Result<()> {
        self.tracker = ShardTracker::restore(offsets)?;
        self.cursors.clear();
        self.next_listing = Instant::now();
        Ok(())
    }

    fn is_bounded(&self) -> bool {
        self.options.bounded != BoundedMode::Unbounded
    }
}
