//! One continuous job: poll sources, run the query, write the target table, checkpoint.
//!
//! ```text
//! loop:  poll a source -> run the query on the batch -> write rows (files stay invisible)
//!        every checkpoint.interval, at the end of bounded sources, and on STOP:
//!          wait for the last checkpoint's commits -> close files
//!          -> write the checkpoint record -> commit each table once (on a thread of its
//!             own while the loop goes on; awaited at the end)
//! start: last record -> commit what the table lacks -> seek sources -> loop
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use iceberg::{Catalog, NamespaceIdent, TableIdent};
use tokio::sync::watch;

use super::query::ContinuousQuery;
use super::watermark::WatermarkTracker;
use crate::checkpoint::{CheckpointRecord, StateStore, commit_all};
use crate::connector::{Offsets, Poll, SourceReader};
use crate::error::{Error, ErrorKind, Result, joined};
use crate::lake::Committer;
use crate::sink::dead_letter::{self, DeadLetter};
use crate::sink::route::{RouteOptions, RoutedSink};
use crate::sink::table_sink::TableSink;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::concat_batches;

/// Rows asked of a source per poll.
const POLL_ROWS: usize = 32768;

/// Rows a routed job gathers before routing them: each table's share of a routed batch costs
/// per slice (checks, bookkeeping) as well as per row, and a thousand tables' shares of one
/// poll are a few rows each.
const ROUTE_ROWS: usize = 262_144;

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

/// A job's life cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    Starting,
    Running,
    Stopping,
    /// A catalog, store or source failed; the job restarts from its last checkpoint.
    Retrying,
    /// Its bounded sources are exhausted and the last checkpoint is committed.
    Finished,
    /// Stopped by `STOP JOB` or a signal, after a final checkpoint.
    Stopped,
    Failed,
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            JobState::Starting => "starting",
            JobState::Running => "running",
            JobState::Stopping => "stopping",
            JobState::Retrying => "retrying",
            JobState::Finished => "finished",
            JobState::Stopped => "stopped",
            JobState::Failed => "failed",
        })
    }
}

/// What `SHOW JOBS` shows of a job, updated as it runs.
#[derive(Debug)]
pub struct JobStatus {
    pub name: String,
    pub target: String,
    pub sources: Vec<String>,
    pub started: Instant,
    pub records_in: AtomicU64,
    pub records_out: AtomicU64,
    pub records_dead: AtomicU64,
    pub checkpoint: AtomicU64,
    pub checkpoint_time_ms: AtomicU64,
    /// How long the last checkpoint took, and the table commits within it, in ms.
    pub checkpoint_duration_ms: AtomicU64,
    pub commit_duration_ms: AtomicU64,
    /// The job's watermark in microseconds since the epoch; `i64::MIN` until known.
    pub watermark: AtomicI64,
    /// Records waiting in the sources, when every source can tell; `u64::MAX` otherwise.
    pub lag: AtomicU64,
    state: Mutex<(JobState, Option<String>)>,
}

impl JobStatus {
    pub fn new(name: String, target: String, sources: Vec<String>) -> Self {
        Self {
            name,
            target,
            sources,
            started: Instant::now(),
            records_in: AtomicU64::new(0),
            records_out: AtomicU64::new(0),
            records_dead: AtomicU64::new(0),
            checkpoint: AtomicU64::new(0),
            checkpoint_time_ms: AtomicU64::new(0),
            checkpoint_duration_ms: AtomicU64::new(0),
            commit_duration_ms: AtomicU64::new(0),
            watermark: AtomicI64::new(i64::MIN),
            lag: AtomicU64::new(u64::MAX),
            state: Mutex::new((JobState::Starting, None)),
        }
    }

    pub fn state(&self) -> (JobState, Option<String>) {
        self.state
            .lock()
            .map(|s| s.clone())
            .unwrap_or((JobState::Failed, Some("status lock poisoned".into())))
    }

    pub fn set_state(&self, state: JobState, error: Option<String>) {
        if let Ok(mut s) = self.state.lock() {
            *s = (state, error);
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
}

/// What a job writes its rows to.
enum Sink {
    Table(Box<TableSink>),
    Routed(Box<RoutedSink>),
}

struct Runner<'a> {
    job: &'a Job,
    readers: Vec<(String, Box<dyn SourceReader>, bool)>,
    /// Per reader, its source's watermark, if it declares one.
    watermarks: Vec<Option<WatermarkTracker>>,
    data: Sink,
    dead: Option<TableSink>,
    /// What identifies the destination across restarts (see `start`).
    identity: String,
    checkpoint: u64,
    committed_offsets: BTreeMap<String, Offsets>,
    /// The last checkpoint, while its commits run.
    committing: Option<Committing>,
    /// A routed job's query output not yet routed, with its source (see [`ROUTE_ROWS`]).
    routing: Vec<(String, RecordBatch)>,
    routing_rows: usize,
}

/// A checkpoint whose record is saved and whose tables are being committed, on a thread of
/// its own while the job reads on. The next checkpoint's record is written only after these
/// commits are done: recovery commits what the last record names, so it must name them all.
struct Committing {
    record: CheckpointRecord,
    /// How long the job paused for it (closing files, writing the record).
    closed: Duration,
    commits: Instant,
    task: tokio::task::JoinHandle<Result<HashMap<TableIdent, iceberg::table::Table>>>,
}

/// The first wait after an external failure; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

impl Job {
    /// Run until the sources end or `stop` turns true; the last step is always a checkpoint.
    ///
    /// When a catalog, store or source fails, the job shows `retrying` with the error and
    /// starts again from its last checkpoint after a growing pause: recovery commits what a
    /// table lacks and resumes the sources, so a retry neither loses nor duplicates. Errors in
    /// the job itself (a bad plan) end it as `failed`.
    pub async fn run(self, mut stop: watch::Receiver<bool>) -> Result<JobState> {
        let mut backoff = FIRST_BACKOFF;
        loop {
            let started = Instant::now();
            match self.run_once(&mut stop).await {
                Ok(end) => return Ok(end),
                Err(e) if e.kind() == ErrorKind::External => {
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
            let _ = c.task.await;
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
                .is_some_and(|c| c.task.is_finished())
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
                Poll::Records { batches, rejects } => {
                    let source = runner.readers[i].0.clone();
                    let letters = rejects
                        .into_iter()
                        .map(|r| DeadLetter {
                            source: source.clone(),
                            partition: Some(r.partition),
                            offset: i64::try_from(r.offset).ok(),
                            payload: r.payload,
                            error: r.error,
                        })
                        .collect();
                    runner.dead_letter(letters).await?;
                    for batch in batches {
                        runner.observe_watermark(i, &batch).await?;
                        runner.process(&source, batch).await?;
                    }
                    runner.update_lag();
                }
                Poll::Finished => runner.readers[i].2 = true,
                Poll::Idle => {
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
        runner.checkpoint(true).await?;
        Ok(end)
    }
}

impl<'a> Runner<'a> {
    async fn start(job: &'a Job) -> Result<Self> {
        let mut readers = Vec::new();
        let mut watermarks = Vec::new();
        for source in job.query.sources() {
            readers.push((source.name.clone(), source.reader()?, false));
            watermarks.push(WatermarkTracker::try_new(source, job.query.state()).await?);
        }
        let mut checkpoint = 0;
        let mut committed_offsets = BTreeMap::new();
        let target = &job.target;
        // What identifies the destination across restarts: a table's UUID (a re-created
        // table of the same name starts the job afresh), or a routed namespace's name.
        let identity = match &target.destination {
            Destination::Table(ident) => {
                let table = target.catalog.load_table(ident).await?;
                table.metadata().uuid().to_string()
            }
            Destination::Routed { .. } => target.to_string(),
        };
        let record = job
            .store
            .load(&job.name)?
            .filter(|r| r.table_uuid.as_deref() == Some(identity.as_str()));
        if let Some(record) = record {
            // Finish the commits of the last checkpoint (idempotent), then resume after it.
            commit_all(
                &target.catalog,
                target.committer.as_deref(),
                &record.tables,
                &job.name,
                record.checkpoint,
                &HashMap::new(),
            )
            .await?;
            for (name, reader, _) in &mut readers {
                if let Some(offsets) = record.sources.get(name) {
                    reader.seek(offsets)?;
                }
            }
            checkpoint = record.checkpoint;
            committed_offsets = record.sources.clone();
            job.status.checkpoint.store(checkpoint, Ordering::Relaxed);
            job.status
                .checkpoint_time_ms
                .store(record.time_ms.max(0) as u64, Ordering::Relaxed);
        }
        let data = match &target.destination {
            Destination::Table(ident) => {
                let table = target.catalog.load_table(ident).await?;
                Sink::Table(Box::new(TableSink::new(
                    &target.catalog_name,
                    &target.catalog,
                    table,
                    false,
                    Vec::new(),
                )))
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
                Sink::Routed(Box::new(RoutedSink::new(
                    &target.catalog_name,
                    &target.catalog,
                    namespace.clone(),
                    options.clone(),
                )))
            }
        };
        let identity = identity.clone();
        Ok(Self {
            job,
            readers,
            watermarks,
            data,
            dead: None,
            identity,
            checkpoint,
            committed_offsets,
            committing: None,
            routing: Vec::new(),
            routing_rows: 0,
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

    /// Advance reader `i`'s watermark past `batch`; the job's is the smallest of its sources'.
    async fn observe_watermark(&mut self, i: usize, batch: &RecordBatch) -> Result<()> {
        let Some(tracker) = &mut self.watermarks[i] else {
            return Ok(());
        };
        tracker.observe(batch).await?;
        let job = self
            .watermarks
            .iter()
            .flatten()
            .map(|t| t.current())
            .collect::<Option<Vec<i64>>>()
            .and_then(|w| w.into_iter().min());
        if let Some(w) = job {
            self.job.status.watermark.store(w, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Run the query on a batch and write its rows. Rows the query or the table rejects
    /// are found by bisecting the batch and sent to the dead-letter table.
    async fn process(&mut self, source: &str, batch: RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        self.job
            .status
            .records_in
            .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
        let mut pending = vec![batch];
        let mut letters = Vec::new();
        while let Some(part) = pending.pop() {
            match self.write_rows(source, part.clone()).await {
                Ok(()) => {}
                Err(e) if e.is_record() && part.num_rows() > 1 => {
                    let half = part.num_rows() / 2;
                    pending.push(part.slice(half, part.num_rows() - half));
                    pending.push(part.slice(0, half));
                }
                Err(e) if e.is_record() => letters.push(DeadLetter {
                    source: source.to_string(),
                    partition: None,
                    offset: None,
                    payload: row_json(&part),
                    error: e.to_string(),
                }),
                Err(e) => return Err(e),
            }
        }
        self.dead_letter(letters).await
    }

    /// The query's output for `batch`, written as one batch (so that a bad row writes
    /// nothing of the batch).
    async fn write_rows(&mut self, source: &str, batch: RecordBatch) -> Result<()> {
        let out = self.job.query.run(source, batch).await?;
        let Some(first) = out.first() else {
            return Ok(());
        };
        let out = concat_batches(&first.schema(), &out)
            .map_err(|e| Error::Internal(format!("joining query output: {e}")))?;
        if out.num_rows() == 0 {
            return Ok(());
        }
        let rows = match &mut self.data {
            // The query casts to the table's columns: what still does not fit (a value out
            // of range) is an Error::Record, found and dead-lettered by the caller.
            Sink::Table(sink) => sink.write(out.clone()).await?,
            Sink::Routed(_) => {
                self.routing_rows += out.num_rows();
                self.routing.push((source.to_string(), out));
                if self.routing_rows >= ROUTE_ROWS {
                    self.route().await?;
                }
                return Ok(());
            }
        };
        self.job
            .status
            .records_out
            .fetch_add(rows, Ordering::Relaxed);
        Ok(())
    }

    /// Route the rows gathered for a routed job (per source, for their dead letters).
    async fn route(&mut self) -> Result<()> {
        let Sink::Routed(routed) = &mut self.data else {
            return Ok(());
        };
        let gathered = std::mem::take(&mut self.routing);
        self.routing_rows = 0;
        let mut letters = Vec::new();
        let mut written = 0;
        for (source, batches) in by_source(gathered) {
            let (n, rejected) = routed.write(&batches).await?;
            written += n;
            for r in rejected {
                for i in 0..r.rows.num_rows() {
                    letters.push(DeadLetter {
                        source: source.clone(),
                        partition: None,
                        offset: None,
                        payload: row_json(&r.rows.slice(i, 1)),
                        error: match &r.table {
                            Some(t) => format!("table {t}: {}", r.reject),
                            None => r.reject.to_string(),
                        },
                    });
                }
            }
        }
        self.dead_letter(letters).await?;
        self.job
            .status
            .records_out
            .fetch_add(written, Ordering::Relaxed);
        Ok(())
    }

    async fn dead_letter(&mut self, letters: Vec<DeadLetter>) -> Result<()> {
        if letters.is_empty() {
            return Ok(());
        }
        let dead = match &mut self.dead {
            Some(d) => d,
            None => {
                let target = &self.job.target;
                let name = match &target.destination {
                    Destination::Routed { options, .. } => options.dead_letter_table.clone(),
                    Destination::Table(_) => dead_letter::DEAD_LETTER_TABLE.to_string(),
                };
                let table =
                    dead_letter::ensure_table(&target.catalog, target.namespace(), &name).await?;
                self.dead.insert(TableSink::new(
                    &target.catalog_name,
                    &target.catalog,
                    table,
                    false,
                    Vec::new(),
                ))
            }
        };
        let batch = dead_letter::batch(
            &self.job.name,
            &self.job.target.to_string(),
            &letters,
            dead.table(),
        )?;
        match dead.write(batch).await {
            Ok(_) => {}
            Err(Error::Record(reason)) => {
                return Err(Error::Plan(format!(
                    "the dead-letter table {} cannot take dead letters: {reason}",
                    dead.table().identifier()
                )));
            }
            Err(e) => return Err(e),
        }
        self.job
            .status
            .records_dead
            .fetch_add(letters.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Close files, record the checkpoint durably, then commit each table once: on a thread
    /// of its own while the job reads on, unless `last` (the job ends: the commits are
    /// awaited). The previous checkpoint's commits are awaited first.
    async fn checkpoint(&mut self, last: bool) -> Result<()> {
        let began = Instant::now();
        self.route().await?;
        self.settle().await?;
        let offsets: BTreeMap<String, Offsets> = self
            .readers
            .iter()
            .map(|(name, r, _)| (name.clone(), r.offsets()))
            .collect();
        let mut tables = match &mut self.data {
            Sink::Table(sink) => sink.close().await?.into_iter().collect(),
            Sink::Routed(routed) => routed.close().await?,
        };
        if let Some(dead) = &mut self.dead {
            tables.extend(dead.close().await?);
        }
        if tables.is_empty() && offsets == self.committed_offsets {
            return Ok(());
        }
        let record = CheckpointRecord {
            job: self.job.name.clone(),
            checkpoint: self.checkpoint + 1,
            time_ms: chrono::Utc::now().timestamp_millis(),
            sources: offsets.clone(),
            tables,
            table_uuid: Some(self.identity.clone()),
        };
        self.job.store.save(&record)?;
        self.checkpoint = record.checkpoint;
        self.committed_offsets = offsets;
        let mut known = match &self.data {
            Sink::Table(sink) => {
                HashMap::from([(sink.table().identifier().clone(), sink.table().clone())])
            }
            Sink::Routed(routed) => routed.known(),
        };
        if let Some(dead) = &self.dead {
            known.insert(dead.table().identifier().clone(), dead.table().clone());
        }
        let target = self.job.target.clone();
        let (job, checkpoint, tables) = (
            self.job.name.clone(),
            record.checkpoint,
            record.tables.clone(),
        );
        let runtime = tokio::runtime::Handle::current();
        // The commits' own work (manifests, metadata) on another thread than the job's.
        let task = tokio::task::spawn_blocking(move || {
            runtime.block_on(commit_all(
                &target.catalog,
                target.committer.as_deref(),
                &tables,
                &job,
                checkpoint,
                &known,
            ))
        });
        self.committing = Some(Committing {
            record,
            closed: began.elapsed(),
            commits: Instant::now(),
            task,
        });
        if last {
            self.settle().await?;
        }
        Ok(())
    }

    /// Wait for the commits under way, if any, and make the committed tables the sinks'
    /// new bases.
    async fn settle(&mut self) -> Result<()> {
        let Some(c) = self.committing.take() else {
            return Ok(());
        };
        let committed = joined(c.task, "checkpoint commit task").await?;
        let commit_ms = c.commits.elapsed().as_millis() as u64;
        let in_commit = |t: &TableSink| {
            let ident = t.table().identifier();
            c.record.tables.iter().any(|p| {
                p.table == ident.name() && p.namespace == ident.namespace().clone().inner()
            })
        };
        match &mut self.data {
            Sink::Table(sink) if in_commit(sink) => {
                let after = committed.get(sink.table().identifier()).cloned();
                sink.after_commit(after.as_ref()).await?;
            }
            Sink::Table(_) => {}
            Sink::Routed(routed) => routed.after_commit(&c.record.tables, &committed).await?,
        }
        if let Some(dead) = self.dead.as_mut().filter(|d| in_commit(d)) {
            let after = committed.get(dead.table().identifier()).cloned();
            dead.after_commit(after.as_ref()).await?;
        }
        let status = &self.job.status;
        status
            .commit_duration_ms
            .store(commit_ms, Ordering::Relaxed);
        // The pause the checkpoint made (closing files, the record) and its commits.
        status
            .checkpoint_duration_ms
            .store(c.closed.as_millis() as u64 + commit_ms, Ordering::Relaxed);
        status
            .checkpoint
            .store(c.record.checkpoint, Ordering::Relaxed);
        status
            .checkpoint_time_ms
            .store(c.record.time_ms.max(0) as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// Runs of batches of one source, schema and set of columns that are NULL throughout, in
/// order: rows keep their order within each table, and a column that starts (or stops)
/// carrying values starts a run of its own, so that routed tables see it appear as they
/// would batch by batch (created without it, then evolved: partition candidates included).
fn by_source(batches: Vec<(String, RecordBatch)>) -> Vec<(String, Vec<RecordBatch>)> {
    let all_null = |b: &RecordBatch| -> Vec<bool> {
        b.columns()
            .iter()
            .map(|c| c.null_count() == c.len())
            .collect()
    };
    let mut runs: Vec<(String, Vec<RecordBatch>)> = Vec::new();
    for (source, batch) in batches {
        match runs.last_mut() {
            Some((s, run))
                if *s == source
                    && run[0].schema() == batch.schema()
                    && all_null(&run[0]) == all_null(&batch) =>
            {
                run.push(batch)
            }
            _ => runs.push((source, vec![batch])),
        }
    }
    runs
}

/// One row as a JSON object: the payload of a record rejected after decoding.
fn row_json(batch: &RecordBatch) -> Vec<u8> {
    let mut out = Vec::new();
    let mut w = datafusion::arrow::json::LineDelimitedWriter::new(&mut out);
    if w.write(batch).is_ok() && w.finish().is_ok() {
        drop(w);
        while out.last() == Some(&b'\n') {
            out.pop();
        }
    }
    out
}
