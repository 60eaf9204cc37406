//! The Kafka reader: partitions assigned directly, positions kept by floe.
//!
//! ```text
//! poll:  discovery due? -> list partitions (blocking pool) -> assign new ones
//!        gather messages (up to max_rows, ~100 ms) -> decode -> rows + rejects
//!        positions[topic:partition] = offset + 1 of every message returned
//! ```
//!
//! Every message taken from librdkafka is returned by the same poll, as a row or a reject,
//! and the positions move with it, so the offsets are exactly what was returned. The broker
//! being unreachable or a topic missing makes polls idle while librdkafka retries; when it
//! lasts longer than `scan.error-timeout`, the poll fails naming the topic and the broker.
//!
//! A bounded reader (`scan.bounded.mode` = `latest-offset`) reads one topic at a time and
//! finishes a partition at librdkafka's end-of-partition event, which comes from the fetch
//! answers' high watermark. It never stops on the list-offsets high watermark (some brokers
//! get it wrong), so it reads at least up to the end seen at start, and maybe records that
//! arrived while it caught up.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use super::context::ReaderContext;
use super::discovery::{self, Discovered, Request, Start};
use super::queue::{Fetched, Incoming, Taken};
use super::records::{Raw, decode};
use super::{KafkaOptions, StartupMode, TopicPartition, parse_offsets};
use crate::connector::{Offsets, Poll, SourceReader};
use crate::error::{Error, Result};
use crate::task::AbortOnDrop;

/// The longest a poll waits for messages.
const POLL_WAIT: Duration = Duration::from_millis(100);
/// How long a poll that has messages waits for more.
const POLL_LINGER: Duration = Duration::from_millis(50);
/// How often a poll waiting for messages looks at the queue without being woken.
const IDLE_LOOK: Duration = Duration::from_millis(5);
/// The most messages a poll makes room for at its start (a poll of the job's default size
/// never grows its list).
const GATHER_CAPACITY: usize = 32_768;
/// How soon a failed or incomplete discovery is tried again.
const RETRY: Duration = Duration::from_secs(1);
/// The longest one metadata or offsets request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest a dropped reader waits for its consumer to close.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// Reads one Kafka source.
pub struct KafkaReader {
    source: String,
    schema: SchemaRef,
    options: Arc<KafkaOptions>,
    consumer: Arc<BaseConsumer<ReaderContext>>,
    /// Where the assigned partitions' messages are taken from, a batch at a time.
    fetched: Fetched<ReaderContext>,
    /// Every partition known, and where it goes on.
    positions: BTreeMap<TopicPartition, Start>,
    /// The partitions librdkafka fetches.
    assigned: BTreeSet<TopicPartition>,
    /// Partitions that reached their end (bounded reads only).
    finished: BTreeSet<TopicPartition>,
    /// Positions from `seek`: a resumed reader starts unknown partitions at the earliest.
    resume: Option<BTreeMap<TopicPartition, i64>>,
    /// Whether a discovery succeeded once (the startup mode applies to its partitions).
    listed: bool,
    /// Topics missing at the last discovery.
    missing: Vec<String>,
    /// The running discovery. Blocking work cannot be aborted: a reader dropped midway
    /// leaves it to end by its request timeout.
    task: Option<AbortOnDrop<Result<Discovered, String>>>,
    next_discovery: Instant,
    /// Since when, and why, the source cannot be read.
    trouble: Option<(Instant, String)>,
}

impl KafkaReader {
    pub fn try_new(source: &str, schema: SchemaRef, options: KafkaOptions) -> Result<Self> {
        let mut consumer: BaseConsumer<ReaderContext> = options
            .client_config()
            .create_with_context(ReaderContext::default())
            .map_err(|e| {
                Error::Source(format!(
                    "Kafka source '{source}': cannot create a consumer for {}: {e}",
                    options.servers()
                ))
            })?;
        // A permit when no poll waits: a message queued between a poll finding the queues
        // empty and its waiting still wakes it.
        let ready = Arc::new(tokio::sync::Notify::new());
        let wake = ready.clone();
        consumer.set_nonempty_callback(move || wake.notify_one());
        let consumer = Arc::new(consumer);
        let fetched = Fetched::new(consumer.clone(), ready).ok_or_else(|| {
            Error::Internal(format!("Kafka source '{source}': librdkafka gave no queue"))
        })?;
        Ok(Self {
            source: source.to_string(),
            schema,
            options: Arc::new(options),
            consumer,
            fetched,
            positions: BTreeMap::new(),
            assigned: BTreeSet::new(),
            finished: BTreeSet::new(),
            resume: None,
            listed: false,
            missing: Vec::new(),
            task: None,
            next_discovery: Instant::now(),
            trouble: None,
        })
    }

    /// Start a discovery when one is due, apply its result when it is done, and fail when
    /// the source has been unreadable for too long.
    async fn discover(&mut self) -> Result<()> {
        if self.task.is_none() && Instant::now() >= self.next_discovery {
            let request = Request {
                known: self.positions.keys().cloned().collect(),
                resume: self.resume.clone().unwrap_or_default(),
                mode: match (&self.resume, self.listed) {
                    (None, false) => self.options.startup,
                    _ => StartupMode::Earliest,
                },
            };
            let consumer = self.consumer.clone();
            let options = self.options.clone();
            let timeout = REQUEST_TIMEOUT.min(self.options.error_timeout.max(RETRY));
            self.task = Some(AbortOnDrop::spawn_blocking(move || {
                discovery::discover(&consumer, &options, &request, timeout)
            }));
        }
        if let Some(task) = &mut self.task {
            // Wait a little (a first listing takes milliseconds), never a whole request.
            if let Ok(done) = tokio::time::timeout(POLL_WAIT, task).await {
                self.task = None;
                let found = done.map_err(|e| {
                    Error::Internal(format!("Kafka partition discovery panicked: {e}"))
                })?;
                self.apply(found)?;
            }
        }
        if let Some((since, _)) = &self.trouble
            && since.elapsed() >= self.options.error_timeout
            && let Some(why) = self.stalled()
        {
            let message = format!(
                "{why}; for {} s now ('scan.error-timeout')",
                since.elapsed().as_secs()
            );
            // A topic that does not exist on a broker that answers is the statement's
            // mistake: the job fails. A broker that does not answer is an outage: the job
            // retries from its last checkpoint until it is back.
            return Err(if self.missing.is_empty() {
                Error::Source(message)
            } else {
                Error::NotFound(message)
            });
        }
        Ok(())
    }

    fn apply(&mut self, found: Result<Discovered, String>) -> Result<()> {
        let servers = self.options.servers().to_string();
        let found = match found {
            Ok(found) => found,
            Err(e) => {
                let why = format!("cannot reach the Kafka broker(s) at {servers}: {e}");
                self.set_trouble(why);
                self.next_discovery = Instant::now() + RETRY;
                return Ok(());
            }
        };
        // New partitions are taken from the first listing, from listings while a topic is
        // missing, and from every listing of an unbounded reader with discovery on.
        let may_add = !self.listed
            || !self.missing.is_empty()
            || (self.options.discovery_interval.is_some() && !self.options.bounded);
        self.listed = true;
        self.missing = found.missing;
        if self.missing.is_empty() {
            self.trouble = None;
            self.consumer.context().clear();
            let every = self
                .options
                .discovery_interval
                .unwrap_or(Duration::from_secs(10));
            self.next_discovery = Instant::now() + every;
        } else {
            let why = format!("{} does not exist on {servers}", self.missing.join(", "));
            self.set_trouble(why);
            self.next_discovery = Instant::now() + RETRY;
        }
        if !may_add {
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        for (tp, start) in found.new {
            if !self.options.bounded {
                add(&mut tpl, &tp, start)?;
                self.assigned.insert(tp.clone());
            }
            self.positions.insert(tp, start);
        }
        if tpl.count() > 0 {
            self.forward(&tpl)?;
            self.consumer.incremental_assign(&tpl).map_err(|e| {
                Error::Source(format!(
                    "Kafka source '{}': assigning partitions: {e}",
                    self.source
                ))
            })?;
        }
        Ok(())
    }

    fn set_trouble(&mut self, why: String) {
        match &mut self.trouble {
            Some((_, w)) => *w = why,
            None => self.trouble = Some((Instant::now(), why)),
        }
    }

    /// Bounded reads: when the current topic is done, assign the next one. Whether every
    /// partition has finished.
    fn advance_bounded(&mut self) -> Result<bool> {
        if !self.assigned.is_empty() {
            return Ok(false);
        }
        let Some(topic) = self
            .positions
            .keys()
            .find(|tp| !self.finished.contains(*tp))
            .map(|tp| tp.topic.clone())
        else {
            return Ok(self.listed && self.missing.is_empty());
        };
        let mut tpl = TopicPartitionList::new();
        for (tp, start) in self.positions.iter().filter(|(tp, _)| tp.topic == topic) {
            add(&mut tpl, tp, *start)?;
            self.assigned.insert(tp.clone());
        }
        self.forward(&tpl)?;
        self.consumer.incremental_assign(&tpl).map_err(|e| {
            Error::Source(format!(
                "Kafka source '{}': assigning {topic}: {e}",
                self.source
            ))
        })?;
        Ok(false)
    }

    /// A partition of the bounded topic being read has caught up.
    fn end_of_partition(&mut self, partition: i32) -> Result<()> {
        let Some(tp) = self
            .assigned
            .iter()
            .find(|tp| tp.partition == partition)
            .cloned()
        else {
            return Ok(());
        };
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&tp.topic, tp.partition);
        self.consumer.incremental_unassign(&tpl).map_err(|e| {
            Error::Source(format!(
                "Kafka source '{}': releasing {tp}: {e}",
                self.source
            ))
        })?;
        self.assigned.remove(&tp);
        self.finished.insert(tp);
        Ok(())
    }

    /// Forward the partitions of `tpl` to the reader's queue. Done before they are assigned:
    /// librdkafka then never forwards them to the consumer's queue.
    fn forward(&self, tpl: &TopicPartitionList) -> Result<()> {
        for e in tpl.elements() {
            if !self.fetched.forward(e.topic(), e.partition()) {
                return Err(Error::Internal(format!(
                    "Kafka source '{}': librdkafka gave no queue for {}:{}",
                    self.source,
                    e.topic(),
                    e.partition()
                )));
            }
        }
        Ok(())
    }

    /// Take messages from librdkafka: up to `max_rows`, for at most `POLL_WAIT`.
    ///
    /// Per message this only compares the partition with the previous message's (they come
    /// in runs of a fetch's batch) and copies the key and payload: the partitions' positions
    /// are looked up once per run and written back once per poll.
    async fn gather(&mut self, max_rows: usize) -> Result<Vec<Raw>> {
        let max_rows = max_rows.max(1);
        let mut taking = Taking {
            raw: Vec::with_capacity(max_rows.min(GATHER_CAPACITY)),
            runs: Vec::new(),
            current: None,
        };
        let mut ends = Vec::new();
        // librdkafka clears a partition's forwarding when it stops fetching it (which may
        // come after a new assignment forwarded it): forward again, and the messages the
        // partition kept meanwhile follow in order.
        for tp in &self.assigned {
            self.fetched.forward(&tp.topic, tp.partition);
        }
        let mut deadline = tokio::time::Instant::now() + POLL_WAIT;
        while taking.raw.len() < max_rows {
            let before = taking.raw.len();
            let mut served = false;
            // The consumer's own queue: librdkafka's errors (and the messages of a partition
            // that was never forwarded).
            while taking.raw.len() < max_rows
                && let Some(next) = self.consumer.poll(Duration::ZERO)
            {
                served = true;
                match next {
                    Ok(m) => taking.message(
                        self,
                        Incoming {
                            topic: m.topic(),
                            partition: m.partition(),
                            offset: m.offset(),
                            key: m.key(),
                            payload: m.payload(),
                            timestamp_ms: m.timestamp().to_millis(),
                        },
                    ),
                    Err(KafkaError::PartitionEOF(p)) => ends.push(p),
                    Err(KafkaError::MessageConsumptionFatal(code)) => {
                        return Err(Error::Source(format!(
                            "Kafka source '{}': fatal error from {}: {code}",
                            self.source,
                            self.options.servers()
                        )));
                    }
                    // librdkafka retries by itself; the error is kept for messages.
                    Err(e) => self.consumer.context().note(e.to_string()),
                }
            }
            let room = max_rows - taking.raw.len();
            let mut errors = Vec::new();
            let took = self.fetched.take(room, |t| match t {
                Taken::Message(m) => taking.message(self, m),
                Taken::End(p) => ends.push(p),
                Taken::Error(code) => errors.push(code),
            });
            for code in errors {
                self.consumer
                    .context()
                    .note(KafkaError::MessageConsumption(code).to_string());
            }
            // Partitions that caught up leave the assignment: the runs start afresh.
            if !ends.is_empty() {
                self.keep(&taking.runs);
                taking.runs.clear();
                taking.current = None;
                for p in ends.drain(..) {
                    self.end_of_partition(p)?;
                }
            }
            if before == 0 && !taking.raw.is_empty() {
                deadline = deadline.min(tokio::time::Instant::now() + POLL_LINGER);
            }
            if took == 0 && !served {
                // Nothing queued: wait for a message (librdkafka wakes the reader when a
                // queue stops being empty), looking again at least every `IDLE_LOOK`.
                let now = tokio::time::Instant::now();
                if now >= deadline {
                    break;
                }
                let wait = deadline.min(now + IDLE_LOOK);
                let _ = tokio::time::timeout_at(wait, self.fetched.ready().notified()).await;
            }
        }
        self.keep(&taking.runs);
        Ok(taking.raw)
    }

    /// Where `tp`'s messages go on, as [`Self::gather`] starts a run of them.
    fn run(&self, tp: TopicPartition) -> Run {
        let start = match self.positions.get(&tp) {
            _ if !self.assigned.contains(&tp) => None,
            Some(Start::At(next)) => Some(Some(*next)),
            Some(Start::Earliest) => Some(None),
            None => None,
        };
        Run {
            tp: Arc::new(tp),
            start,
            next: None,
        }
    }

    /// The positions after the messages `runs` returned.
    fn keep(&mut self, runs: &[Run]) {
        for run in runs {
            if let Some(next) = run.next {
                self.positions
                    .insert(TopicPartition::clone(&run.tp), Start::At(next));
            }
        }
    }
}

impl Drop for KafkaReader {
    /// Close the consumer here: rdkafka's own close on drop waits for it 100 ms at a time,
    /// which every bounded job paid at its end.
    fn drop(&mut self) {
        if self.consumer.close_queue().is_err() {
            return;
        }
        let until = Instant::now() + CLOSE_WAIT;
        while !self.consumer.closed() && Instant::now() < until {
            // Serves the close; a message still queued is dropped (its position was never
            // returned).
            let _ = self.consumer.poll(Duration::from_millis(1));
        }
    }
}

/// What a poll has taken so far.
struct Taking {
    raw: Vec<Raw>,
    runs: Vec<Run>,
    /// The run of the last message, in `runs`.
    current: Option<usize>,
}

impl Taking {
    /// Keep `m` unless it is not the reader's or was returned before.
    fn message(&mut self, reader: &KafkaReader, m: Incoming<'_>) {
        let same = |r: &Run| r.tp.partition == m.partition && r.tp.topic == m.topic;
        let run = match self.current.filter(|&i| same(&self.runs[i])) {
            Some(i) => i,
            None => {
                let i = match self.runs.iter().position(same) {
                    Some(i) => i,
                    None => {
                        let tp = TopicPartition::new(m.topic, m.partition);
                        self.runs.push(reader.run(tp));
                        self.runs.len() - 1
                    }
                };
                self.current = Some(i);
                i
            }
        };
        let run = &mut self.runs[run];
        // Not ours, from before a reassignment, or already returned.
        if !run.fresh(m.offset) {
            return;
        }
        run.next = Some(m.offset + 1);
        self.raw.push(Raw {
            tp: run.tp.clone(),
            offset: m.offset,
            key: m.key.map(<[u8]>::to_vec),
            payload: m.payload.map(<[u8]>::to_vec),
            timestamp_ms: m.timestamp_ms,
        });
    }
}

/// The messages of one partition a poll took, in offset order.
struct Run {
    tp: Arc<TopicPartition>,
    /// Where the partition went on when the run started: `None` when it is not ours
    /// (unknown or unassigned), `Some(None)` from its earliest record.
    start: Option<Option<i64>>,
    /// The offset after the last message returned.
    next: Option<i64>,
}

impl Run {
    /// Whether the message at `offset` is to be returned: the partition is ours and the
    /// message not returned before.
    fn fresh(&self, offset: i64) -> bool {
        match (self.start, self.next) {
            (None, _) => false,
            (Some(_), Some(next)) => offset >= next,
            (Some(Some(next)), None) => offset >= next,
            (Some(None), None) => true,
        }
    }
}

/// Add `tp` at `start` to an assignment.
fn add(tpl: &mut TopicPartitionList, tp: &TopicPartition, start: Start) -> Result<()> {
    let offset = match start {
        Start::Earliest => Offset::Beginning,
        Start::At(o) => Offset::Offset(o),
    };
    tpl.add_partition_offset(&tp.topic, tp.partition, offset)
        .map_err(|e| Error::Internal(format!("assignment of {tp}: {e}")))
}

#[async_trait]
impl SourceReader for KafkaReader {
    async fn poll(&mut self, max_rows: usize) -> Result<Poll> {
        self.discover().await?;
        if self.options.bounded && self.advance_bounded()? {
            return Ok(Poll::Finished);
        }
        // Even with no partition assigned: receiving serves librdkafka's error events.
        let raw = self.gather(max_rows).await?;
        if raw.is_empty() {
            return Ok(Poll::Idle);
        }
        let (batches, rejects, origins) = decode(
            &self.schema,
            &self.options.decoder,
            self.options.upsert.as_ref(),
            raw,
        )
        .await?;
        Ok(Poll::Records {
            batches,
            rejects,
            origins: Some(Arc::new(origins)),
        })
    }

    fn offsets(&self) -> Offsets {
        self.positions
            .iter()
            .filter_map(|(tp, start)| match start {
                Start::At(o) => Some((tp.to_string(), o.to_string())),
                Start::Earliest => None,
            })
            .collect()
    }

    fn seek(&mut self, offsets: &Offsets) -> Result<()> {
        let resume = parse_offsets(offsets)?;
        if !self.assigned.is_empty() {
            self.consumer.unassign().map_err(|e| {
                Error::Source(format!("Kafka source '{}': unassigning: {e}", self.source))
            })?;
        }
        // A discovery under way knows the old partitions: forget it.
        self.task = None;
        self.positions.clear();
        self.assigned.clear();
        self.finished.clear();
        self.listed = false;
        self.next_discovery = Instant::now();
        self.resume = Some(resume);
        Ok(())
    }

    fn is_bounded(&self) -> bool {
        self.options.bounded
    }

    fn stalled(&self) -> Option<String> {
        let last = self.consumer.context().last_error();
        let last = last
            .map(|e| format!(" (librdkafka: {e})"))
            .unwrap_or_default();
        match &self.trouble {
            Some((_, why)) => Some(format!("Kafka source '{}': {why}{last}", self.source)),
            None if !self.listed && !last.is_empty() => Some(format!(
                "Kafka source '{}': no answer from {} yet{last}",
                self.source,
                self.options.servers()
            )),
            None => None,
        }
    }
}
