//! One continuous job's poll loop: poll sources, run the query, write to the sink.
//!
//! ```text
//! start: last record -> commit what the tables lack -> seek sources -> loop
//! loop:  poll a source -> run the query on the batch -> Sink::write (files stay invisible)
//!        (on more than one core the sources' next polls run ahead: connector::prefetch)
//!        rows that fail (Error::Record): the batch is halved until they are found, then
//!        dead-lettered; every checkpoint.interval, at the end of bounded sources and on
//!        STOP: the barrier (stream::barrier)
//! fail:  retryable errors (Error::is_retryable) -> `retrying`, start again after a pause
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use iceberg::{Catalog, NamespaceIdent, TableIdent};
use tokio::sync::watch;

use super::aggregate::{AggregateState, StateFiles};
use super::barrier::Committing;
use super::maintain::Maintainer;
use super::query::{ContinuousQuery, Output};
use super::status::{JobState, JobStatus, LATE};
use super::stream_join::JoinBuffers;
use super::watermark::WatermarkTracker;
use crate::checkpoint::resume::{load_if_there, marks_in};
use crate::checkpoint::{
    CheckpointRecord, LakeCopy, Resume, StateStore, TableMarks, commit_all, lake_copy, resume,
};
use crate::connector::prefetch::Prefetched;
use crate::connector::{Offsets, Origins, Poll, SourceReader};
use crate::error::{Error, Result};
use crate::lake::Committer;
use crate::lake::maintenance::policy::MaintenancePolicy;
use crate::schema::changes;
use crate::sink::dead_letter::{self, DeadLetter, DeadLetters, letters_of};
use crate::sink::route::{RouteOptions, RoutedSink};
use crate::sink::table::TableTarget;
use crate::sink::table_sink::TableSink;
use crate::sink::{Outcome, Rejected, RowOrigins, Sink};
use datafusion::arrow::array::{AsArray, BooleanArray, RecordBatch, UInt32Array};
use datafusion::arrow::compute::{filter, filter_record_batch};
use datafusion::arrow::datatypes::UInt32Type;

/// Rows asked of a source per poll.
const POLL_ROWS: usize = 32768;

/// The polls a job on more than one core reads and decodes ahead of the one it writes. Not
/// one: the writing is most of the work and comes in bursts (a row group's columns on several
/// threads), and decoding that has run ahead keeps the cores busy between them; 1.5 M events
/// into one table on two cores ran 5% faster at four than at one, holding ~25 MB more.
const POLLS_AHEAD: usize = 4;

/// Where a job writes.
#[derive(Clone)]
pub struct Target {
    pub catalog_name: String,
    pub catalog: Arc<dyn Catalog>,
    /// floe's own commit path, for schema and partition evolution (SQL catalogs).
    pub committer: Option<Arc<Committer>>,
    pub destination: Destination,
}

/// One table, or a namespace whose tables `ROUTE BY` picks per row.
#[derive(Debug, Clone)]
pub enum Destination {
    Table(TableIdent),
    Routed {
        namespace: NamespaceIdent,
        options: RouteOptions,
    },
}

impl Target {
    /// The namespace the job writes into (its dead-letter table lives there).
    pub fn namespace(&self) -> &NamespaceIdent {
        match &self.destination {
            Destination::Table(t) => t.namespace(),
            Destination::Routed { namespace, .. } => namespace,
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.destination {
            Destination::Table(t) => write!(f, "{}.{t}", self.catalog_name),
            Destination::Routed { namespace, .. } => {
                write!(f, "{}.{}.*", self.catalog_name, namespace.to_url_string())
            }
        }
    }
}

/// Everything a job needs to run.
pub struct Job {
    pub name: String,
    pub target: Target,
    pub query: ContinuousQuery,
    pub interval: Duration,
    pub store: StateStore,
    pub status: Arc<JobStatus>,
    /// How the job maintains the tables it writes, if it does.
    pub maintenance: Option<MaintenancePolicy>,
    /// How long a source may send nothing before it no longer holds the watermark back.
    pub idle_timeout: Option<Duration>,
    /// The cores its records are decoded on at once (`parallelism.default`); above one,
    /// a table's files are written while the job reads on.
    pub parallelism: usize,
}

pub(super) struct Runner<'a> {
    pub(super) job: &'a Job,
    pub(super) readers: Vec<(String, Box<dyn SourceReader>, bool)>,
    /// Per reader, its source's watermark, if it declares one.
    pub(super) watermarks: Vec<Option<WatermarkTracker>>,
    /// Per reader, when it last gave records (a source idle past the job's idle timeout
    /// no longer holds the watermark back).
    pub(super) last_records: Vec<Instant>,
    /// A windowed job's open windows.
    pub(super) aggregate: Option<AggregateState>,
    /// A job joining streams: the rows each joined source has delivered.
    pub(super) joins: Option<JoinBuffers>,
    pub(super) data: Box<dyn Sink>,
    pub(super) dead: DeadLetters,
    /// What identifies the destination across restarts (see `start`).
    pub(super) identity: String,
    pub(super) checkpoint: u64,
    pub(super) committed_offsets: BTreeMap<String, Offsets>,
    /// The last checkpoint, while its commits run.
    pub(super) committing: Option<Committing>,
    /// The tables' maintenance, when the job does it.
    pub(super) maintainer: Option<Maintainer>,
    /// Where the job copies its record and state with its tables (`state.lake-copy`): known
    /// from the start for a job writing one table, from its first table for a routed one.
    pub(super) lake_copy: Option<LakeCopy>,
    /// Where the record the job resumed from was copied, until a routed job knows where its
    /// copies go.
    pub(super) resumed_copy: Option<String>,
    /// The checkpoint the job (this run of it) started after.
    pub(super) started_after: u64,
    /// Whether it copies its records with its tables (`state.lake-copy`, until a copy
    /// fails).
    pub(super) copies: bool,
}

/// The first wait after an external failure; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

impl Job {
    /// Run until the sources end or `stop` turns true; the last step is always a checkpoint.
    ///
    /// When a catalog, store or source fails, or memory runs out
    /// ([`crate::error::Error::is_retryable`]), the job shows `retrying` with the error and
    /// starts again from its last checkpoint after a growing pause: recovery commits what a
    /// table lacks and resumes the sources, so a retry neither loses nor duplicates. Errors in the job itself (a bad plan) and
    /// failures that say a retry cannot help end it as `failed`.
    ///
    /// A job runs only while it holds its state folder's lock ([`StateStore::lock`]): a
    /// second owner of the name (another process, another session) fails, naming the first.
    pub async fn run(self, mut stop: watch::Receiver<bool>) -> Result<JobState> {
        let mut backoff = FIRST_BACKOFF;
        let mut lock = None;
        loop {
            let started = Instant::now();
            let attempt = match &lock {
                Some(_) => self.run_once(&mut stop).await,
                None => match self.store.lock(&self.name) {
                    Ok(held) => {
                        lock = Some(held);
                        self.run_once(&mut stop).await
                    }
                    Err(e) => Err(e),
                },
            };
            match attempt {
                Ok(end) => return Ok(end),
                Err(e) if e.is_retryable() => {
                    if started.elapsed() > MAX_BACKOFF {
                        backoff = FIRST_BACKOFF;
                    }
                    self.status
                        .set_state(JobState::Retrying, Some(e.to_string()));
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = stop.changed() => {}
                    }
                    if *stop.borrow() {
                        // Nothing uncommitted is lost: the last checkpoint stands.
                        return Ok(JobState::Stopped);
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn run_once(&self, stop: &mut watch::Receiver<bool>) -> Result<JobState> {
        let mut runner = Runner::start(self).await?;
        let result = Self::run_runner(&mut runner, stop).await;
        if result.is_err()
            && let Some(c) = runner.committing.take()
        {
            // The retry starts by committing the last record: not while this still does.
            c.wait().await;
        }
        result
    }

    async fn run_runner(
        runner: &mut Runner<'_>,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<JobState> {
        let status = runner.job.status.clone();
        status.set_state(JobState::Running, None);
        let mut next_checkpoint = Instant::now() + runner.job.interval;
        let mut turn = 0usize;
        let end = loop {
            if *stop.borrow_and_update() {
                status.set_state(JobState::Stopping, None);
                break JobState::Stopped;
            }
            if runner
                .committing
                .as_ref()
                .is_some_and(Committing::is_finished)
            {
                runner.settle().await?;
            }
            if Instant::now() >= next_checkpoint {
                runner.checkpoint(false).await?;
                next_checkpoint = Instant::now() + runner.job.interval;
            }
            let live: Vec<usize> = (0..runner.readers.len())
                .filter(|&i| !runner.readers[i].2)
                .collect();
            if live.is_empty() {
                break JobState::Finished;
            }
            let i = live[turn % live.len()];
            turn = turn.wrapping_add(1);
            let poll = {
                let (_, reader, _) = &mut runner.readers[i];
                reader.poll(POLL_ROWS).await?
            };
            match poll {
                Poll::Records {
                    batches,
                    rejects,
                    origins,
                } => {
                    let source = runner.readers[i].0.clone();
                    let letters = rejects
                        .into_iter()
                        .map(|r| DeadLetter {
                            source: source.clone(),
                            partition: Some(r.partition),
                            offset: i64::try_from(r.offset).ok(),
                            payload: r.payload,
                            error: r.reject.to_string(),
                        })
                        .collect();
                    runner.dead_letter(letters).await?;
                    runner.last_records[i] = Instant::now();
                    for (b, batch) in batches.into_iter().enumerate() {
                        let (own, job) = runner.advance_watermark(i, &batch).await?;
                        let origin = origins.as_ref().map(|o| (o, b));
                        runner.process(&source, batch, origin, &own, &job).await?;
                        runner.emit_windows().await?;
                        runner.let_joined_rows_go()?;
                    }
                    runner.update_lag();
                }
                Poll::Finished => runner.readers[i].2 = true,
                Poll::Idle => {
                    // A source idle past the timeout lets the watermark on.
                    runner.emit_windows().await?;
                    let wait = next_checkpoint
                        .saturating_duration_since(Instant::now())
                        .min(Duration::from_millis(20));
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = stop.changed() => {}
                    }
                }
            }
        };
        if end == JobState::Finished {
            // Every source ended: event time is over, every window closes.
            runner.emit_windows().await?;
        }
        runner.checkpoint(true).await?;
        if end == JobState::Finished
            && let Some(m) = &mut runner.maintainer
        {
            // STOP JOB (or a signal) meanwhile drops the run: the job is done already.
            tokio::select! {
                done = m.finish() => done?,
                _ = stop.changed() => {}
            }
        }
        Ok(end)
    }
}

impl<'a> Runner<'a> {
    async fn start(job: &'a Job) -> Result<Self> {
        let mut readers = Vec::new();
        let mut watermarks = Vec::new();
        for source in job.query.sources() {
            let reader = source.decoding_on(job.parallelism).reader()?;
            readers.push((source.name.clone(), reader, false));
            watermarks.push(WatermarkTracker::try_new(source, job.query.state()).await?);
        }
        let target = &job.target;
        let mut record = job.store.load(&job.name)?;
        // What identifies the destination across restarts: a table's UUID (a re-created
        // table of the same name starts the job afresh), or a routed namespace's name. And
        // what the tables carry of the job: where it resumes when the record is lost.
        let mut marks = TableMarks::default();
        let mut destination = None;
        let identity = match &target.destination {
            Destination::Table(ident) => {
                let table = target.catalog.load_table(ident).await?;
                marks.add_table(&table, &job.name, true);
                let dead = TableIdent::new(
                    ident.namespace().clone(),
                    dead_letter::DEAD_LETTER_TABLE.to_string(),
                );
                if let Some(dead) = load_if_there(&target.catalog, &dead).await? {
                    marks.add_table(&dead, &job.name, false);
                }
                let uuid = table.metadata().uuid().to_string();
                destination = Some(table);
                uuid
            }
            Destination::Routed { namespace, .. } => {
                if record.is_none() {
                    marks = marks_in(&target.catalog, namespace, &job.name).await?;
                }
                target.to_string()
            }
        };
        // A record lost (or older than the tables' latest checkpoint) that the tables name a
        // copy of: the copy stands in for it, state and all. (A copy gone with a table dropped
        // since leaves the tables' marks to resume from.)
        if let (Some((checkpoint, uri)), Some(io)) = (&marks.copy, &marks.io)
            && record.as_ref().is_none_or(|r| r.checkpoint < *checkpoint)
            && let Some(copy) = lake_copy::restore(io, &job.store, &job.name, uri).await?
        {
            record = Some(copy);
        }
        if let Some(record) = &record {
            // Finish the commits of the last checkpoint (idempotent; each table's only to the
            // table it was written for).
            let committed = commit_all(
                &target.catalog,
                target.committer.as_ref(),
                record,
                &HashMap::new(),
            )
            .await?;
            if let (Destination::Table(ident), Some(_)) = (&target.destination, &destination)
                && let Some(table) = committed.get(ident)
            {
                destination = Some(table.clone());
            }
        }
        // The tables the job wrote before this run: maintained like those it commits to now
        // (a bounded job whose last run only finishes what a killed one wrote still leaves
        // them maintained).
        let mut written_before: Vec<TableIdent> = record
            .iter()
            .flat_map(|r| &r.tables)
            .filter_map(|p| p.ident().ok())
            .collect();
        if let Destination::Table(ident) = &target.destination {
            written_before.push(ident.clone());
        }
        let start = resume(&job.name, record.as_ref(), &identity, &marks)?;
        let restored = restore_state(
            job,
            record.as_ref(),
            &start,
            &readers
                .iter()
                .map(|(name, _, _)| name.clone())
                .collect::<Vec<_>>(),
            &mut watermarks,
        )
        .await?;
        let (aggregate, joins) = (restored.windows, restored.joins);
        let copies = job.query.state_lake_copy();
        let resumed_copy = record.as_ref().and_then(|r| r.copied_to.clone());
        let mut lake_copy = None;
        let mut committed_offsets = BTreeMap::new();
        if let Some(sources) = &start.sources {
            for (name, reader, _) in &mut readers {
                if let Some(offsets) = sources.get(name) {
                    reader.seek(offsets)?;
                }
            }
            committed_offsets = sources.clone();
        }
        if job.parallelism > 1 {
            // The next polls are read and decoded while the job queries and writes this one.
            readers = readers
                .into_iter()
                .map(|(name, reader, done)| {
                    let ahead = Prefetched::new(reader, POLL_ROWS, POLLS_AHEAD);
                    (name, Box::new(ahead) as Box<dyn SourceReader>, done)
                })
                .collect();
        }
        let checkpoint = start.checkpoint;
        job.status.checkpoint.store(checkpoint, Ordering::Relaxed);
        job.status
            .checkpoint_time_ms
            .store(start.time_ms.max(0) as u64, Ordering::Relaxed);
        let (data, dead_letters): (Box<dyn Sink>, &str) = match &target.destination {
            Destination::Table(ident) => {
                let table = match destination {
                    Some(t) => t,
                    None => target.catalog.load_table(ident).await?,
                };
                if copies {
                    lake_copy = Some(LakeCopy::with_table(&table, &job.name, start.checkpoint));
                }
                let sink = TableSink::new(
                    &target.catalog_name,
                    &target.catalog,
                    table,
                    false,
                    Vec::new(),
                )
                .writing_on(job.parallelism);
                (
                    Box::new(TableTarget::new(sink)),
                    dead_letter::DEAD_LETTER_TABLE,
                )
            }
            Destination::Routed { namespace, options } => {
                if !target.catalog.namespace_exists(namespace).await? {
                    let created = target
                        .catalog
                        .create_namespace(namespace, Default::default())
                        .await;
                    // Another job may create it at the same moment.
                    match created {
                        Err(e) if e.kind() == iceberg::ErrorKind::NamespaceAlreadyExists => {}
                        other => {
                            other?;
                        }
                    }
                }
                let sink = RoutedSink::new(
                    &target.catalog_name,
                    &target.catalog,
                    namespace.clone(),
                    options.clone(),
                )
                .with_committer(target.committer.clone());
                (Box::new(sink), options.dead_letter_table.as_str())
            }
        };
        let dead = DeadLetters::new(
            &target.catalog_name,
            &target.catalog,
            target.namespace().clone(),
            dead_letters,
            &job.name,
            &target.to_string(),
        );
        Ok(Self {
            job,
            last_records: vec![Instant::now(); readers.len()],
            readers,
            watermarks,
            aggregate,
            joins,
            data,
            dead,
            identity,
            checkpoint,
            committed_offsets,
            committing: None,
            lake_copy: lake_copy.map(|c| c.resumed(resumed_copy.as_deref())),
            resumed_copy,
            started_after: checkpoint,
            copies,
            maintainer: job.maintenance.clone().zip(target.committer.clone()).map(
                |(policy, committer)| {
                    let mut m = Maintainer::new(
                        policy,
                        target.catalog.clone(),
                        committer,
                        job.status.clone(),
                    );
                    m.written_before(written_before);
                    if let Destination::Routed { namespace, .. } = &target.destination {
                        m.routed_into(namespace.clone(), &job.name);
                    }
                    m
                },
            ),
        })
    }

    /// The records waiting in all sources, when each can tell.
    fn update_lag(&self) {
        let lag = self
            .readers
            .iter()
            .map(|(_, r, done)| if *done { Some(0) } else { r.lag() })
            .sum::<Option<u64>>();
        self.job
            .status
            .lag
            .store(lag.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Advance reader `i`'s watermark past `batch`. Returns the source's watermark before
    /// each of `batch`'s records (`i64::MIN` before any), and, for a job that aggregates, the
    /// job's.
    async fn advance_watermark(
        &mut self,
        i: usize,
        batch: &RecordBatch,
    ) -> Result<(Vec<i64>, Vec<i64>)> {
        let Some(tracker) = &mut self.watermarks[i] else {
            return Ok((Vec::new(), Vec::new()));
        };
        let own = tracker.advance(batch).await?;
        if let Some(w) = self
            .watermark(None)
            .filter(|w| *w != i64::MIN && *w != i64::MAX)
        {
            self.job.status.watermark.store(w, Ordering::Relaxed);
        }
        if self.aggregate.is_none() {
            return Ok((own, Vec::new()));
        }
        let job = match self.watermark(Some(i)) {
            None => own.clone(),
            Some(others) => own.iter().map(|w| (*w).min(others)).collect(),
        };
        Ok((own, job))
    }

    /// For an interval join: let go of the kept rows no future row of the other source can
    /// meet, now that its watermark has passed their reach.
    fn let_joined_rows_go(&mut self) -> Result<()> {
        let (Some(bound), Some(joins)) = (self.job.query.time_bound(), self.joins.as_mut()) else {
            return Ok(());
        };
        let watermark = |source: &str| {
            self.readers
                .iter()
                .position(|(name, _, _)| name == source)
                .and_then(|i| self.watermarks[i].as_ref()?.current())
        };
        // A right row meets left rows up to `upper` after it; a left row, right rows from
        // `lower` before it.
        if let (Some(upper), Some(w)) = (bound.upper, watermark(&bound.left.0)) {
            joins.expire(&bound.right.0, &bound.right.1, w.saturating_sub(upper))?;
        }
        if let (Some(lower), Some(w)) = (bound.lower, watermark(&bound.right.0)) {
            joins.expire(&bound.left.0, &bound.left.1, w.saturating_add(lower))?;
        }
        Ok(())
    }

    /// The job's watermark (microseconds), leaving out reader `except`: the smallest of the
    /// sources that hold it back (`i64::MIN` while one of them has none yet). A source that
    /// ended holds nothing back; nor does one idle past the idle timeout, unless all are (then
    /// the largest of theirs). `None` when no source holds it back (`except` is the only one).
    fn watermark(&self, except: Option<usize>) -> Option<i64> {
        let idle = |i: usize| {
            self.job
                .idle_timeout
                .is_some_and(|t| self.last_records[i].elapsed() >= t)
        };
        let value = |i: usize| {
            self.watermarks[i]
                .as_ref()
                .and_then(WatermarkTracker::current)
                .unwrap_or(i64::MIN)
        };
        let others: Vec<usize> = (0..self.readers.len())
            .filter(|&i| Some(i) != except && self.watermarks[i].is_some() && !self.readers[i].2)
            .collect();
        if others.is_empty() {
            return match except {
                Some(_) => None,
                None => Some(i64::MAX),
            };
        }
        let active: Vec<usize> = others.iter().copied().filter(|&i| !idle(i)).collect();
        if active.is_empty() {
            return others.into_iter().map(value).max();
        }
        active.into_iter().map(value).min()
    }

    /// Emit the windows the job's watermark has closed.
    pub(super) async fn emit_windows(&mut self) -> Result<()> {
        let Some(aggregate) = self.job.query.aggregate() else {
            return Ok(());
        };
        if self
            .aggregate
            .as_ref()
            .is_some_and(|state| aggregate.update_due(state))
        {
            // An aggregate without windows whose new rows' state passed the budget.
            return self.emit_updates().await;
        }
        // Windows over processing time close as the clock passes them, all once every source
        // has ended.
        let watermark = match aggregate.is_processing_time() {
            true if self.readers.iter().all(|(_, _, ended)| *ended) => Some(i64::MAX),
            true => Some(chrono::Utc::now().timestamp_micros()),
            false => self.watermark(None),
        };
        let (Some(watermark), Some(state)) = (watermark, self.aggregate.as_mut()) else {
            return Ok(());
        };
        let files = StateFiles {
            store: &self.job.store,
            job: &self.job.name,
        };
        let emitted = aggregate.emit(state, watermark, &files).await?;
        // Windows read back from disk may leave open ones in memory.
        aggregate.spill(state, &files).await?;
        for rows in emitted {
            self.write_emitted(rows).await?;
        }
        Ok(())
    }

    /// For an aggregate without windows, before a checkpoint: the rows of the groups updated
    /// since the last.
    pub(super) async fn emit_updates(&mut self) -> Result<()> {
        let (Some(aggregate), Some(state)) = (self.job.query.aggregate(), self.aggregate.as_mut())
        else {
            return Ok(());
        };
        let files = StateFiles {
            store: &self.job.store,
            job: &self.job.name,
        };
        let rows = aggregate.emit_updates(state, &files).await?;
        // The groups' state past the memory budget goes to disk.
        aggregate.spill(state, &files).await?;
        match rows {
            Some(rows) => self.write_emitted(rows).await,
            None => Ok(()),
        }
    }

    /// Write rows an aggregate emitted (made of many records: a bad one is dead-lettered as
    /// the row).
    async fn write_emitted(&mut self, rows: RecordBatch) -> Result<()> {
        let source = self.job.status.sources.join(", ");
        // Rows a table takes whole or not at all are halved until the bad ones are found.
        let mut pending = vec![rows];
        let mut letters = Vec::new();
        while let Some(part) = pending.pop() {
            match self.data.write(&source, part.clone(), None).await {
                Ok(outcome) => self.take(outcome).await?,
                Err(e) if e.is_record() && part.num_rows() > 1 => {
                    let half = part.num_rows() / 2;
                    pending.push(part.slice(half, part.num_rows() - half));
                    pending.push(part.slice(0, half));
                }
                Err(e) if e.is_record() => {
                    letters.push(dead_letter::letter(&source, None, &part, e.to_string()))
                }
                Err(e) => return Err(e),
            }
        }
        self.dead_letter(letters).await
    }

    /// Run the query on a batch and write its rows. Rows the query or the table rejects
    /// are found by bisecting the batch and sent to the dead-letter table, with their
    /// record's partition, offset and bytes when `origin` (the poll's, and the batch's
    /// index in it) can say.
    async fn process(
        &mut self,
        source: &str,
        batch: RecordBatch,
        origin: Option<(&Arc<dyn Origins>, usize)>,
        own: &[i64],
        watermarks: &[i64],
    ) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        self.job
            .status
            .records_in
            .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
        let mut letters = Vec::new();
        // Records an interval join is too late for: dead letters, and left out below.
        let late = self.late_for_join(source, &batch, own)?;
        let mut late_rows = vec![false; if late.is_empty() { 0 } else { batch.num_rows() }];
        for (i, why) in late {
            late_rows[i] = true;
            let record = origin.and_then(|(o, b)| o.origin(b, i));
            letters.push(dead_letter::letter(source, record, &batch.slice(i, 1), why));
        }
        // Parts of the batch still to write, with where each starts in it.
        let mut pending = vec![(0, batch)];
        while let Some((start, part)) = pending.pop() {
            let rows = origin.map(|(o, b)| RowOrigins {
                origins: o.clone(),
                batch: b,
                start,
                inputs: None,
            });
            let marks = watermarks
                .get(start..start + part.num_rows())
                .unwrap_or_default();
            let late = late_rows.get(start..start + part.num_rows());
            if late.is_some_and(|l| l.iter().all(|late| *late)) {
                continue;
            }
            match self
                .write_rows(source, part.clone(), rows, marks, late)
                .await
            {
                Ok(()) => {
                    if let Some(joins) = &mut self.joins {
                        // Joined and written: the later batches of the other sources join it.
                        let kept = match late {
                            Some(late) => without(&part, late)?,
                            None => part,
                        };
                        joins.keep(source, kept)?;
                    }
                }
                Err(e) if e.is_record() && part.num_rows() > 1 => {
                    let half = part.num_rows() / 2;
                    pending.push((start + half, part.slice(half, part.num_rows() - half)));
                    pending.push((start, part.slice(0, half)));
                }
                Err(e) if e.is_record() => {
                    let record = origin.and_then(|(o, b)| o.origin(b, start));
                    letters.push(dead_letter::letter(source, record, &part, e.to_string()))
                }
                Err(e) => return Err(e),
            }
        }
        self.dead_letter(letters).await
    }

    /// The records of `batch` (from `source`, whose watermark before each is `own`) that
    /// come after their source's watermark passed them, when the job is an interval join
    /// that may have let their partners go: each with why, in order.
    fn late_for_join(
        &self,
        source: &str,
        batch: &RecordBatch,
        own: &[i64],
    ) -> Result<Vec<(usize, String)>> {
        let Some(bound) = self.job.query.time_bound() else {
            return Ok(Vec::new());
        };
        let column = match source {
            s if s == bound.left.0 => &bound.left.1,
            s if s == bound.right.0 => &bound.right.1,
            _ => return Ok(Vec::new()),
        };
        let times = crate::stream::stream_join::micros(batch, column)?;
        Ok(times
            .iter()
            .enumerate()
            .filter_map(|(i, t)| {
                let watermark = own.get(i).copied().unwrap_or(i64::MIN);
                let t = t?;
                (t < watermark).then(|| {
                    (
                        i,
                        format!(
                            "late: its {column} is behind the watermark of {source}, and the \
                             interval join may have let go of the rows it would have met"
                        ),
                    )
                })
            })
            .collect())
    }

    /// The query's output for `batch`, written as one batch (so that a bad row writes
    /// nothing of the batch). `origins` (of `batch`'s rows) go with the output, mapped to
    /// its rows, when the query says which input row each output row came from; the rows
    /// `late` marks are left out.
    async fn write_rows(
        &mut self,
        source: &str,
        batch: RecordBatch,
        origins: Option<RowOrigins>,
        watermarks: &[i64],
        late: Option<&[bool]>,
    ) -> Result<()> {
        let (batch, changes) = changes::split_changes(batch)?;
        let query = &self.job.query;
        let mut out = query
            .run(source, batch.clone(), self.joins.as_ref())
            .await?;
        if let Some(late) = late.filter(|l| l.iter().any(|late| *late)) {
            // Late records are left out: the rows they made, or (when the rows do not say
            // which record made them) the records, before the query runs again.
            out = match out.inputs {
                Some(inputs) => {
                    let keep: BooleanArray = inputs
                        .values()
                        .iter()
                        .map(|&r| Some(!late[r as usize]))
                        .collect();
                    let left_out = |e| Error::Internal(format!("leaving out late rows: {e}"));
                    Output {
                        rows: filter_record_batch(&out.rows, &keep).map_err(left_out)?,
                        inputs: Some(
                            filter(&inputs, &keep)
                                .map_err(left_out)?
                                .as_primitive::<UInt32Type>()
                                .clone(),
                        ),
                    }
                }
                None => {
                    let on_time = without(&batch, late)?;
                    let rows = query.run(source, on_time, self.joins.as_ref()).await?.rows;
                    Output { rows, inputs: None }
                }
            };
        }
        if out.rows.num_rows() == 0 {
            return Ok(());
        }
        if let (Some(aggregate), Some(state)) =
            (self.job.query.aggregate(), self.aggregate.as_mut())
        {
            // Each row's watermark is its record's.
            let marks: Vec<i64> = match &out.inputs {
                Some(inputs) => inputs
                    .values()
                    .iter()
                    .map(|&r| watermarks.get(r as usize).copied().unwrap_or(i64::MIN))
                    .collect(),
                None => vec![watermarks.first().copied().unwrap_or(i64::MIN); out.rows.num_rows()],
            };
            let files = StateFiles {
                store: &self.job.store,
                job: &self.job.name,
            };
            let late = aggregate
                .absorb(state, out.rows.clone(), &marks, &files)
                .await?;
            aggregate.spill(state, &files).await?;
            let origins = origins.zip(out.inputs).map(|(o, inputs)| o.through(inputs));
            let rejected = late
                .into_iter()
                .map(|(row, reject)| Rejected {
                    source: source.to_string(),
                    rows: out.rows.slice(row, 1),
                    reject,
                    table: None,
                    records: vec![origins.as_ref().and_then(|o| o.origin(row))],
                })
                .collect();
            return self.take(Outcome { rows: 0, rejected }).await;
        }
        let rows = match &changes {
            Some(changes) => with_changes(out.rows, changes, out.inputs.as_ref())?,
            None => out.rows,
        };
        let origins = origins.zip(out.inputs).map(|(o, inputs)| o.through(inputs));
        let outcome = self.data.write(source, rows, origins).await?;
        self.take(outcome).await
    }

    /// Count what a sink wrote, and dead-letter what it rejected.
    pub(super) async fn take(&mut self, outcome: Outcome) -> Result<()> {
        self.job
            .status
            .records_out
            .fetch_add(outcome.rows, Ordering::Relaxed);
        self.dead_letter(letters_of(outcome.rejected)).await
    }

    async fn dead_letter(&mut self, letters: Vec<DeadLetter>) -> Result<()> {
        let n = self.dead.write(&letters).await?;
        self.job.status.records_dead.fetch_add(n, Ordering::Relaxed);
        let late = letters.iter().filter(|l| l.error.starts_with(LATE)).count();
        self.job
            .status
            .records_late
            .fetch_add(late as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// `batch` without its rows that `late` marks.
fn without(batch: &RecordBatch, late: &[bool]) -> Result<RecordBatch> {
    let keep = BooleanArray::from(late.iter().map(|l| !l).collect::<Vec<_>>());
    filter_record_batch(batch, &keep)
        .map_err(|e| Error::Internal(format!("leaving out late rows: {e}")))
}

/// The query's output `rows` of a change stream's batch, with its change columns last again
/// (see [`changes`]): each row changes what the input row it came from (`inputs`) did.
fn with_changes(
    rows: RecordBatch,
    changes: &changes::Changes,
    inputs: Option<&UInt32Array>,
) -> Result<RecordBatch> {
    let Some(inputs) = inputs else {
        return Err(Error::Plan(
            "the job's query reads a change stream, but its rows cannot be traced to the \
             changes they come from (a column named __floe_input_row?)"
                .into(),
        ));
    };
    changes::with_change_columns(&rows, &changes.take(inputs)?)
}

/// A stateful job's state where it resumes.
pub(super) struct Restored {
    /// Its open windows (or groups), for a job that aggregates.
    pub windows: Option<AggregateState>,
    /// The rows of the streams it joins, for a job joining streams.
    pub joins: Option<JoinBuffers>,
}

/// A stateful job's state where it resumes (open windows, joined streams' rows), and its
/// sources' watermarks then: the record's (the local one, or its copy with the tables, see
/// [`lake_copy`]), when the job resumes from it. A job resuming from its tables' marks without
/// a record (lost, or older than what the tables hold, with no copy) would have lost that
/// state: it fails, saying so, rather than emit incomplete windows or miss joined rows.
/// The names of `schema`'s columns, for messages.
fn column_names(schema: &datafusion::arrow::datatypes::Schema) -> String {
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    names.join(", ")
}

async fn restore_state(
    job: &Job,
    record: Option<&CheckpointRecord>,
    start: &Resume,
    sources: &[String],
    watermarks: &mut [Option<WatermarkTracker>],
) -> Result<Restored> {
    let windowed = job.query.aggregate().is_some();
    let joins = job.query.joins_streams();
    let mut windows = windowed.then(AggregateState::default);
    let mut kept = joins.then(|| {
        JoinBuffers::new(
            job.query.join_keys(),
            job.query.state_budget(),
            Some((job.store.clone(), job.name.clone())),
        )
    });
    let empty = |windows, joins| Restored { windows, joins };
    let Some(offsets) = &start.sources else {
        return Ok(empty(windows, kept));
    };
    if !windowed && !joins {
        return Ok(empty(None, None));
    }
    let saved = record
        .filter(|r| &r.sources == offsets)
        .and_then(|r| r.state.as_ref());
    let saved = match saved {
        Some(saved) => saved,
        None => {
            return Err(Error::Plan(format!(
                "job '{}' keeps state ({}), and its checkpoint record with that state is {} \
                 (state.dir {}), with no copy of it with its tables (state.lake-copy): \
                 resuming from the offsets its tables carry would lose it. Restore the job's \
                 state folder, or give the job another 'pipeline.name' to start afresh",
                job.name,
                if windowed {
                    "open windows"
                } else {
                    "the rows of the streams it joins"
                },
                if record.is_some() {
                    "older than its tables"
                } else {
                    "missing"
                },
                job.store.dir().display()
            )));
        }
    };
    if let (Some(w), Some(file), Some(aggregate)) =
        (&mut windows, &saved.windows, job.query.aggregate())
    {
        let batches = job.store.load_state(&job.name, file)?;
        let expected = aggregate.state_schema();
        let fits = |schema: &datafusion::arrow::datatypes::Schema| {
            schema.fields().len() == expected.fields().len()
                && schema
                    .fields()
                    .iter()
                    .zip(expected.fields())
                    .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type())
        };
        if let Some(other) = batches.iter().find(|b| !fits(&b.schema())) {
            return Err(Error::Plan(format!(
                "job '{}' saved state of columns ({}), and its query keeps ({}): the query                  changed since (or an older floe saved it). Give the job another                  'pipeline.name' to start afresh",
                job.name,
                column_names(&other.schema()),
                column_names(&expected)
            )));
        }
        *w = AggregateState::restore(batches, saved.spilled.clone());
    }
    if let Some(k) = &mut kept {
        let joined: std::collections::BTreeSet<&String> = saved
            .joins
            .keys()
            .chain(saved.joins_spilled.keys())
            .collect();
        for source in joined {
            let batches = match saved.joins.get(source) {
                Some(file) => job.store.load_state(&job.name, file)?,
                None => Vec::new(),
            };
            let spilled = saved.joins_spilled.get(source).cloned().unwrap_or_default();
            k.restore(source, batches, spilled)?;
        }
    }
    for (name, tracker) in sources.iter().zip(watermarks.iter_mut()) {
        if let (Some(t), Some(w)) = (tracker, saved.watermarks.get(name)) {
            t.restore(*w);
        }
    }
    Ok(Restored {
        windows,
        joins: kept,
    })
}
