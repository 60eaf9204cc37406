//! The jobs of a session: started by continuous `INSERT`s, listed by `SHOW JOBS`, stopped
//! by `STOP JOB` (or when the session ends). Each job runs in its own task; the registry
//! owns the task, so dropping the registry stops every job.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::job::Job;
use super::status::{JobState, JobStatus, TableHealth};
use crate::error::{Error, Result};
use crate::task::AbortOnDrop;

struct Entry {
    status: Arc<JobStatus>,
    stop: watch::Sender<bool>,
    task: Option<AbortOnDrop<()>>,
}

/// One row of `SHOW JOBS`.
#[derive(Debug, Clone, Default)]
pub struct JobRow {
    pub name: String,
    pub state: String,
    pub target: String,
    pub sources: String,
    pub records_in: u64,
    pub records_out: u64,
    pub records_dead: u64,
    pub records_late: u64,
    pub rate: f64,
    pub checkpoint: u64,
    pub checkpoint_time_ms: u64,
    pub checkpoint_duration_ms: u64,
    pub commit_duration_ms: u64,
    /// Microseconds since the epoch, when the job's sources declare watermarks.
    pub watermark: Option<i64>,
    /// Records waiting in the sources, when they can tell.
    pub lag: Option<u64>,
    pub error: Option<String>,
    /// The data files of the tables it writes, and their mean size.
    pub data_files: Option<u64>,
    pub mean_file_size: Option<u64>,
    /// Its latest maintenance run: the table and what was done (or why it failed).
    pub last_maintenance: Option<String>,
}

/// The session's jobs.
#[derive(Default)]
pub struct Jobs {
    jobs: Mutex<BTreeMap<String, Entry>>,
}

impl Jobs {
    /// Whether a job of this name is running.
    pub fn is_active(&self, name: &str) -> bool {
        self.jobs.lock().is_ok_and(|j| {
            j.get(name).is_some_and(|e| {
                matches!(
                    e.status.state().0,
                    JobState::Starting
                        | JobState::Running
                        | JobState::Stopping
                        | JobState::Retrying
                )
            })
        })
    }

    /// Start `job` in the background.
    pub fn start(&self, job: Job) -> Result<()> {
        let name = job.name.clone();
        if self.is_active(&name) {
            return Err(Error::AlreadyExists(format!(
                "job '{name}' is running already (STOP JOB '{name}' first, or SET \
                 'pipeline.name' to another name)"
            )));
        }
        let status = job.status.clone();
        let (stop, stop_rx) = watch::channel(false);
        let task_status = status.clone();
        let task = AbortOnDrop::spawn(async move {
            match job.run(stop_rx).await {
                Ok(end) => task_status.set_state(end, None),
                Err(e) => task_status.set_state(JobState::Failed, Some(e.to_string())),
            }
        });
        let mut jobs = self
            .jobs
            .lock()
            .map_err(|_| Error::Internal("job registry lock poisoned".into()))?;
        jobs.insert(
            name,
            Entry {
                status,
                stop,
                task: Some(task),
            },
        );
        Ok(())
    }

    fn take_task(&self, name: &str) -> Result<Option<AbortOnDrop<()>>> {
        let mut jobs = self
            .jobs
            .lock()
            .map_err(|_| Error::Internal("job registry lock poisoned".into()))?;
        let entry = jobs.get_mut(name).ok_or_else(|| {
            Error::NotFound(format!("there is no job '{name}' (SHOW JOBS lists them)"))
        })?;
        let _ = entry.stop.send(true);
        Ok(entry.task.take())
    }

    /// Stop `name`: it takes a final checkpoint, then ends. Returns its final state.
    pub async fn stop(&self, name: &str) -> Result<JobState> {
        if let Some(mut task) = self.take_task(name)? {
            let _ = (&mut task).await;
        }
        Ok(self
            .status_of(name)
            .map(|s| s.state().0)
            .unwrap_or(JobState::Stopped))
    }

    /// Stop every job, each with a final checkpoint.
    pub async fn stop_all(&self) {
        for name in self.names() {
            let _ = self.stop(&name).await;
        }
    }

    /// Wait until every job has ended. Returns the failed ones with their errors.
    ///
    /// # Cancel safety
    /// Cancel safe: it only watches the jobs, which go on if the wait is dropped.
    pub async fn wait_all(&self) -> Vec<(String, String)> {
        while self.any_active() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        self.failures()
    }

    /// Wait until job `name` has ended; returns its final state and error.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Jobs::wait_all`].
    pub async fn wait(&self, name: &str) -> (JobState, Option<String>) {
        while self.is_active(name) {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        self.status_of(name)
            .map(|s| s.state())
            .unwrap_or((JobState::Stopped, None))
    }

    fn failures(&self) -> Vec<(String, String)> {
        self.rows()
            .into_iter()
            .filter(|r| r.state == JobState::Failed.to_string())
            .map(|r| (r.name, r.error.unwrap_or_default()))
            .collect()
    }

    fn names(&self) -> Vec<String> {
        self.jobs
            .lock()
            .map(|j| j.keys().cloned().collect())
            .unwrap_or_default()
    }

    fn status_of(&self, name: &str) -> Option<Arc<JobStatus>> {
        self.jobs.lock().ok()?.get(name).map(|e| e.status.clone())
    }

    /// Whether any job is still going.
    pub fn any_active(&self) -> bool {
        self.names().iter().any(|n| self.is_active(n))
    }

    /// `SHOW JOBS`.
    pub fn rows(&self) -> Vec<JobRow> {
        let Ok(jobs) = self.jobs.lock() else {
            return Vec::new();
        };
        jobs.values()
            .map(|e| {
                let s = &e.status;
                let (state, error) = s.state();
                let out = s.records_out.load(Ordering::Relaxed);
                let secs = s.started.elapsed().as_secs_f64().max(1e-3);
                JobRow {
                    name: s.name.clone(),
                    state: state.to_string(),
                    target: s.target.clone(),
                    sources: s.sources.join(", "),
                    records_in: s.records_in.load(Ordering::Relaxed),
                    records_out: out,
                    records_dead: s.records_dead.load(Ordering::Relaxed),
                    records_late: s.records_late.load(Ordering::Relaxed),
                    rate: s.records_in.load(Ordering::Relaxed) as f64 / secs,
                    checkpoint: s.checkpoint.load(Ordering::Relaxed),
                    checkpoint_time_ms: s.checkpoint_time_ms.load(Ordering::Relaxed),
                    checkpoint_duration_ms: s.checkpoint_duration_ms.load(Ordering::Relaxed),
                    commit_duration_ms: s.commit_duration_ms.load(Ordering::Relaxed),
                    watermark: Some(s.watermark.load(Ordering::Relaxed)).filter(|w| *w != i64::MIN),
                    lag: Some(s.lag.load(Ordering::Relaxed)).filter(|l| *l != u64::MAX),
                    error,
                    ..health_of(s)
                }
            })
            .collect()
    }

    /// Each table each job writes, with its health: `(job, table, health)`.
    pub fn table_health(&self) -> Vec<(String, String, TableHealth)> {
        let Ok(jobs) = self.jobs.lock() else {
            return Vec::new();
        };
        jobs.values()
            .flat_map(|e| {
                let tables = e.status.tables_now();
                let job = e.status.name.clone();
                tables
                    .into_iter()
                    .map(move |(table, h)| (job.clone(), table, h))
            })
            .collect()
    }
}

/// The table figures of a job's row (the rest left empty).
fn health_of(status: &JobStatus) -> JobRow {
    let tables = status.tables_now();
    let files: u64 = tables.values().map(|h| h.data_files).sum();
    let bytes: u64 = tables.values().map(|h| h.data_bytes).sum();
    let last = tables
        .iter()
        .filter_map(|(name, h)| Some((h.maintained_at_ms?, name, h)))
        .max_by_key(|(at, _, _)| *at)
        .map(|(_, name, h)| match (&h.error, &h.maintenance) {
            (Some(e), _) => format!("{name}: failed: {e}"),
            (None, Some(what)) => format!("{name}: {what}"),
            (None, None) => name.clone(),
        });
    JobRow {
        data_files: (!tables.is_empty()).then_some(files),
        mean_file_size: (files > 0).then(|| bytes / files),
        last_maintenance: last,
        ..JobRow::default()
    }
}
