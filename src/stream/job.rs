//! One continuous job: poll sources, run the query, write the target table, checkpoint.
//!
//! ```text
//! loop:  poll a source -> run the query on the batch -> write rows (files stay invisible)
//!        every checkpoint.interval, at the end of bounded sources, and on STOP:
//!          close files -> write the checkpoint record -> commit the table once
//! start: last record -> commit what the table lacks -> seek sources -> loop
//! ```

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use iceberg::spec::serialize_data_file_to_json;
use iceberg::table::Table;
use iceberg::{Catalog, TableIdent};
use tokio::sync::watch;

use super::query::ContinuousQuery;
use crate::checkpoint::{CheckpointRecord, PendingCommit, StateStore, commit_once};
use crate::connector::{Offsets, Poll, SourceReader};
use crate::error::Result;
use crate::sink::TableWriter;

/// Rows asked of a source per poll.
const POLL_ROWS: usize = 8192;

/// Where a job writes.
#[derive(Debug, Clone)]
pub struct Target {
    pub catalog_name: String,
    pub catalog: Arc<dyn Catalog>,
    pub ident: TableIdent,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.catalog_name, self.ident)
    }
}

/// A job's life cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    Starting,
    Running,
    Stopping,
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
    pub checkpoint: AtomicU64,
    pub checkpoint_time_ms: AtomicU64,
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
            checkpoint: AtomicU64::new(0),
            checkpoint_time_ms: AtomicU64::new(0),
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

struct Runner {
    job: Job,
    readers: Vec<(String, Box<dyn SourceReader>, bool)>,
    table: Table,
    writer: Option<TableWriter>,
    checkpoint: u64,
    committed_offsets: BTreeMap<String, Offsets>,
}

impl Job {
    /// Run until the sources end or `stop` turns true; the last step is always a checkpoint.
    pub async fn run(self, mut stop: watch::Receiver<bool>) -> Result<JobState> {
        let status = self.status.clone();
        let mut runner = Runner::start(self).await?;
        status.set_state(JobState::Running, None);
        let mut next_checkpoint = Instant::now() + runner.job.interval;
        let mut turn = 0usize;
        let end = loop {
            if *stop.borrow_and_update() {
                status.set_state(JobState::Stopping, None);
                break JobState::Stopped;
            }
            if Instant::now() >= next_checkpoint {
                runner.checkpoint().await?;
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
                Poll::Batch(batch) => runner.process(i, batch).await?,
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
        runner.checkpoint().await?;
        Ok(end)
    }
}

impl Runner {
    async fn start(job: Job) -> Result<Self> {
        let mut readers = Vec::new();
        for source in job.query.sources() {
            readers.push((source.name.clone(), source.reader()?, false));
        }
        let mut checkpoint = 0;
        let mut committed_offsets = BTreeMap::new();
        let table = job.target.catalog.load_table(&job.target.ident).await?;
        let uuid = table.metadata().uuid().to_string();
        let record = job
            .store
            .load(&job.name)?
            // A record of a dropped table of the same name: start afresh.
            .filter(|r| r.table_uuid.as_deref() == Some(uuid.as_str()));
        if let Some(record) = record {
            // Finish the commits of the last checkpoint (idempotent), then resume after it.
            for pending in &record.tables {
                commit_once(&job.target.catalog, pending, &job.name, record.checkpoint).await?;
            }
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
        let table = job.target.catalog.load_table(&job.target.ident).await?;
        Ok(Self {
            job,
            readers,
            table,
            writer: None,
            checkpoint,
            committed_offsets,
        })
    }

    async fn process(
        &mut self,
        reader: usize,
        batch: datafusion::arrow::array::RecordBatch,
    ) -> Result<()> {
        let status = &self.job.status;
        status
            .records_in
            .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
        let name = self.readers[reader].0.clone();
        let out = self.job.query.run(&name, batch).await?;
        for b in out {
            if b.num_rows() == 0 {
                continue;
            }
            let writer = match &mut self.writer {
                Some(w) => w,
                None => self.writer.insert(TableWriter::try_new(&self.table)?),
            };
            status
                .records_out
                .fetch_add(b.num_rows() as u64, Ordering::Relaxed);
            writer.write(b).await?;
        }
        Ok(())
    }

    /// Close files, record the checkpoint durably, then commit the table once.
    async fn checkpoint(&mut self) -> Result<()> {
        let offsets: BTreeMap<String, Offsets> = self
            .readers
            .iter()
            .map(|(name, r, _)| (name.clone(), r.offsets()))
            .collect();
        let (files, rows) = match self.writer.take() {
            Some(w) => {
                let rows = w.rows();
                (w.close().await?, rows)
            }
            None => (Vec::new(), 0),
        };
        if files.is_empty() && offsets == self.committed_offsets {
            return Ok(());
        }
        let md = self.table.metadata();
        let partition_type = md.default_partition_type().clone();
        let format = md.format_version();
        let files_json = files
            .into_iter()
            .map(|f| serialize_data_file_to_json(f, &partition_type, format))
            .collect::<iceberg::Result<Vec<_>>>()?;
        let tables = if files_json.is_empty() {
            Vec::new()
        } else {
            vec![PendingCommit {
                catalog: self.job.target.catalog_name.clone(),
                namespace: self.job.target.ident.namespace().clone().inner(),
                table: self.job.target.ident.name().to_string(),
                spec_id: md.default_partition_spec_id(),
                files: files_json,
                rows,
            }]
        };
        let record = CheckpointRecord {
            job: self.job.name.clone(),
            checkpoint: self.checkpoint + 1,
            time_ms: chrono::Utc::now().timestamp_millis(),
            sources: offsets.clone(),
            tables,
            table_uuid: Some(md.uuid().to_string()),
        };
        self.job.store.save(&record)?;
        self.checkpoint = record.checkpoint;
        for pending in &record.tables {
            commit_once(
                &self.job.target.catalog,
                pending,
                &self.job.name,
                record.checkpoint,
            )
            .await?;
        }
        if !record.tables.is_empty() {
            self.table = self
                .job
                .target
                .catalog
                .load_table(&self.job.target.ident)
                .await?;
        }
        self.committed_offsets = offsets;
        let status = &self.job.status;
        status
            .checkpoint
            .store(record.checkpoint, Ordering::Relaxed);
        status
            .checkpoint_time_ms
            .store(record.time_ms.max(0) as u64, Ordering::Relaxed);
        Ok(())
    }
}
