//! What `SHOW JOBS` shows of a job, updated as it runs: its state and counters.

use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::time::Instant;

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
