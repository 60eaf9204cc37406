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
use crate::connector::{BadRecord, Offsets, Poll, RecordOrigins, SourceReader, source_rows};
use crate::error::{Error, Reject, Result};

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
    /// The first iterator of a `latest` start is taken at the tip (LATEST); any later one
    /// at the start time kept in the offsets (nothing was read from the shard yet).
    latest_first: bool,
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
                // Refused credentials are the statement's to fix: the job fails.
                return Err(Error::Option(format!(
                    "{at}: {what} failed: {}{hint}",
                    f.message
                )));
            }
            FailureKind::NotFound if what == "listing shards" => {
                return Err(Error::NotFound(format!(
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
            return Err(Error::Source(format!(
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
        let first = !self.tracker.listed_before();
        match client.list_shards().await {
            Ok(listing) => {
                self.failing = None;
                self.tracker.merge_listing(&listing, &initial);
                if first && self.options.startup == StartupMode::Latest {
                    for shard in &listing {
                        self.cursors
                            .entry(shard.id.clone())
                            .or_default()
                            .latest_first = true;
                    }
                }
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
        let cursor = self.cursors.entry(shard.to_string()).or_default();
        let iterator = match (cursor.iterator.clone(), cursor.latest_first) {
            (Some(it), _) => it,
            (None, latest) => match client.shard_iterator(shard, &position, latest).await {
                Ok(it) => {
                    self.cursors
                        .entry(shard.to_string())
                        .or_default()
                        .latest_first = false;
                    it
                }
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
        self.take(shard, fetched).await
    }

    /// Turn a GetRecords answer into a poll, and move the shard's position past it.
    async fn take(&mut self, shard: &str, fetched: Fetched) -> Result<Option<Poll>> {
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
        let fetched_count = records.len();
        let mut records = records;
        records.truncate(keep);
        let last = records.last().map(|r| r.sequence_number().to_string());
        let poll = if keep > 0 {
            Some(self.decode(shard, records).await?)
        } else {
            None
        };
        // Decoded: now the records count as consumed.
        if let Some(last) = &last {
            self.tracker.consumed(shard, last);
        }
        let closed = self.tracker.is_closed(shard);
        let cursor = self.cursors.entry(shard.to_string()).or_default();
        cursor.backoff = Duration::ZERO;
        // An open shard that has nothing more now has nothing from before the stop time
        // left (the stop time was taken before the listing that showed it open). A closed
        // one is read to its end instead: its children may hold earlier records.
        let caught_up = fetched_count == 0
            && next_iterator.is_some()
            && millis_behind_latest == Some(0)
            && !closed;
        if stop_at.is_some() && (keep < fetched_count || caught_up) {
            // Past the stop time, or caught up with the stream after it.
            self.tracker.reached_bound(shard);
            cursor.iterator = None;
        } else if let Some(next) = next_iterator {
            cursor.iterator = Some(next);
            cursor.rest(if fetched_count == 0 && !closed {
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
    async fn decode(&self, shard: &str, records: Vec<Record>) -> Result<Poll> {
        let data: Vec<&[u8]> = records.iter().map(|r| r.data().as_ref()).collect();
        let decoded = self.options.decoder.decode(&data).await?;
        let rejects = decoded
            .errors
            .iter()
            .map(|(i, e)| {
                let seq = records[*i].sequence_number();
                BadRecord {
                    partition: shard.to_string(),
                    // Sequence numbers (up to 128 digits) do not fit; the error names it.
                    offset: 0,
                    payload: data[*i].to_vec(),
                    reject: Reject::new(format!(
                        "{} shard {shard} sequence number {seq}: cannot decode the record: {e}",
                        self.options.describe()
                    )),
                }
            })
            .collect();
        let strings = |rows: &[usize], f: &dyn Fn(&Record) -> &str| -> ArrayRef {
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|&i| f(&records[i])),
            ))
        };
        let inferred = self.options.decoder.is_inferred();
        let batches = source_rows(&self.schema, &decoded, inferred, |name, rows| match name {
            SHARD_COLUMN => Some(Arc::new(StringArray::from(vec![shard; rows.len()])) as ArrayRef),
            SEQUENCE_COLUMN => Some(strings(rows, &|r| r.sequence_number())),
            PARTITION_KEY_COLUMN => Some(strings(rows, &|r| r.partition_key())),
            ARRIVAL_COLUMN => Some(Arc::new(TimestampMicrosecondArray::from_iter(
                rows.iter().map(|&i| arrival_micros(&records[i])),
            )) as ArrayRef),
            _ => None,
        })?;
        // (Offset 0: sequence numbers do not fit, as for records that do not decode.)
        let shard = shard.to_string();
        let origins = RecordOrigins::new(records, decoded.group_rows(), move |r: &Record| {
            Some((shard.clone(), 0, r.data().as_ref().to_vec()))
        });
        Ok(Poll::Records {
            batches,
            rejects,
            origins: Some(Arc::new(origins)),
        })
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

#[cfg(test)]
mod tests {
    use aws_sdk_kinesis::primitives::{Blob, DateTime};
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, TimeUnit};

    use super::*;
    use crate::connector::kinesis::shards::ListedShard;
    use crate::sql::Options;

    fn reader(extra: &[(&str, &str)]) -> KinesisReader {
        let schema: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("_sequence", DataType::Utf8, true),
            Field::new(
                "_arrival_time",
                DataType::Timestamp(TimeUnit::Microsecond, None),
                true,
            ),
        ]));
        let mut pairs = vec![("stream", "s"), ("format", "json")];
        pairs.extend_from_slice(extra);
        let mut o = Options::try_new(
            "test",
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        )
        .unwrap();
        let options = KinesisOptions::try_new(&schema, &mut o).unwrap();
        o.finish().unwrap();
        let mut r = KinesisReader::new(schema, options);
        let shard = |id: &str, closed| ListedShard {
            id: id.into(),
            parents: vec![],
            closed,
        };
        r.tracker.merge_listing(
            &[shard("s0", false), shard("s1", true)],
            &Position::TrimHorizon,
        );
        r
    }

    fn record(seq: &str, data: &str, arrival_ms: i64) -> Record {
        Record::builder()
            .sequence_number(seq)
            .data(Blob::new(data))
            .partition_key("k")
            .approximate_arrival_timestamp(DateTime::from_secs_f64(arrival_ms as f64 / 1000.0))
            .build()
            .unwrap()
    }

    fn fetched(records: Vec<Record>, next: Option<&str>) -> Fetched {
        Fetched {
            records,
            next_iterator: next.map(str::to_string),
            millis_behind_latest: Some(0),
        }
    }

    #[tokio::test]
    async fn records_become_rows_and_rejects_and_move_the_offset() {
        let mut r = reader(&[]);
        let records = vec![
            record("11", r#"{"id": 1}"#, 1_714_521_600_054),
            record("12", "not json", 1_714_521_600_055),
            record("13", r#"{"id": 3}"#, 1_714_521_600_056),
        ];
        let Some(Poll::Records {
            batches: batch,
            rejects,
            origins,
        }) = r.take("s0", fetched(records, Some("it"))).await.unwrap()
        else {
            panic!("no records")
        };
        // The second row's record, for a dead letter of a row refused after decoding.
        let origin = origins.unwrap().origin(0, 1).unwrap();
        assert_eq!(origin, ("s0".to_string(), 0, br#"{"id": 3}"#.to_vec()));
        let batch = crate::connector::concat(&batch);
        assert_eq!(
            batch.column(0).as_primitive::<Int64Type>().values(),
            &[1, 3]
        );
        let seqs: Vec<&str> = batch
            .column(1)
            .as_string::<i32>()
            .iter()
            .flatten()
            .collect();
        assert_eq!(seqs, vec!["11", "13"]);
        let arrival = batch
            .column(2)
            .as_primitive::<datafusion::arrow::datatypes::TimestampMicrosecondType>();
        assert_eq!(
            arrival.value(0),
            1_714_521_600_054_000,
            "rounded to the millisecond"
        );
        assert_eq!(rejects.len(), 1);
        assert_eq!(rejects[0].partition, "s0");
        assert!(
            rejects[0].reject.reason.contains("sequence number 12"),
            "{}",
            rejects[0].reject.reason
        );
        assert_eq!(
            r.offsets()["s0"],
            "13",
            "the last record returned, bad or not"
        );
        assert_eq!(r.offsets()["s1"], "trim-horizon");
    }

    #[tokio::test]
    async fn a_closed_shard_without_a_next_iterator_is_drained() {
        let mut r = reader(&[]);
        let last = vec![record("7", r#"{"id": 7}"#, 1)];
        assert!(r.take("s1", fetched(last, None)).await.unwrap().is_some());
        assert_eq!(r.offsets()["s1"], "drained");
        assert!(!r.tracker.readable().contains(&"s1".to_string()));
    }

    #[tokio::test]
    async fn a_bounded_source_returns_nothing_after_its_stop_time() {
        let mut r = reader(&[("scan.bounded.mode", "latest")]);
        r.tracker.set_stop_at_once(1_000);
        let records = vec![
            record("1", r#"{"id": 1}"#, 999),
            record("2", r#"{"id": 2}"#, 1_000),
            record("3", r#"{"id": 3}"#, 1_001),
        ];
        let Some(Poll::Records { batches: batch, .. }) =
            r.take("s0", fetched(records, Some("i"))).await.unwrap()
        else {
            panic!("no records")
        };
        let batch = crate::connector::concat(&batch);
        assert_eq!(batch.num_rows(), 2);
        assert_eq!(r.offsets()["s0"], "2");
        assert!(
            r.tracker.readable().iter().all(|s| s != "s0"),
            "s0 is at its bound"
        );
        // The closed shard is read to its end, even when an empty answer says caught up.
        assert!(
            r.take("s1", fetched(vec![], Some("i")))
                .await
                .unwrap()
                .is_none()
        );
        assert!(!r.tracker.finished());
        assert!(r.take("s1", fetched(vec![], None)).await.unwrap().is_none());
        assert!(r.tracker.finished());
    }
}
