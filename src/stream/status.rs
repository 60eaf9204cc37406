//! What `SHOW JOBS` shows of a job, updated as it runs: its state and counters.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::time::Instant;

use iceberg::TableIdent;
use iceberg::table::Table;

/// How the reason of every late record's dead letter starts (behind its window, or its
/// join's reach): `SHOW JOBS` counts them apart.
pub const LATE: &str = "late: ";

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
    /// Of those, the records later than their window or join allowed ('late: ...').
    pub records_late: AtomicU64,
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
    /// The tables the job wrote, by name, as of their last commit and maintenance run.
    pub tables: Mutex<BTreeMap<String, TableHealth>>,
}

/// A table's name as `floe.table_health` shows it: `namespace.table`.
pub fn table_name(ident: &TableIdent) -> String {
    format!("{}.{}", ident.namespace().to_url_string(), ident.name())
}

/// What `floe.table_health` shows of one table a job writes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TableHealth {
    /// Data files in the current snapshot, and their bytes.
    pub data_files: u64,
    pub data_bytes: u64,
    pub snapshots: u64,
    /// The sequence number of the snapshot these figures are of: of two, the higher is newer.
    pub sequence: i64,
    /// When maintenance last ran on it (ms since the epoch), what it did, or why it failed.
    pub maintained_at_ms: Option<i64>,
    pub maintenance: Option<String>,
    pub error: Option<String>,
}

impl TableHealth {
    /// The mean size of its data files, if it has any.
    pub fn mean_file_size(&self) -> Option<u64> {
        (self.data_files > 0).then(|| self.data_bytes / self.data_files)
    }

    /// The figures of `table`'s current snapshot (its summary's totals).
    pub fn of(table: &iceberg::table::Table) -> Self {
        let mut h = Self::default();
        h.observe(table);
        h
    }

    /// These figures from `table`'s current snapshot (its summary's totals), keeping what
    /// is known of maintenance.
    pub fn observe(&mut self, table: &iceberg::table::Table) {
        let md = table.metadata();
        let total = |k: &str| {
            md.current_snapshot()
                .and_then(|s| s.summary().additional_properties.get(k).cloned())
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        self.data_files = total("total-data-files");
        self.data_bytes = total("total-files-size");
        self.snapshots = md.snapshots().count() as u64;
        self.sequence = md.current_snapshot().map_or(0, |s| s.sequence_number());
    }

    /// Take `other`'s table figures if they are of a newer snapshot than these.
    pub fn newer(&mut self, other: &TableHealth) {
        if other.sequence > self.sequence {
            self.data_files = other.data_files;
            self.data_bytes = other.data_bytes;
            self.snapshots = other.snapshots;
            self.sequence = other.sequence;
        }
    }
}

impl JobStatus {
    /// The tables it writes, as of now (a copy).
    pub fn tables_now(&self) -> BTreeMap<String, TableHealth> {
        self.tables.lock().map(|t| t.clone()).unwrap_or_default()
    }

    /// Note the tables just committed (`floe.table_health`).
    pub fn committed(&self, tables: &std::collections::HashMap<TableIdent, Table>) {
        if let Ok(mut health) = self.tables.lock() {
            for (ident, table) in tables {
                health.entry(table_name(ident)).or_default().observe(table);
            }
        }
    }

    pub fn new(name: String, target: String, sources: Vec<String>) -> Self {
        Self {
            name,
            target,
            sources,
            started: Instant::now(),
            records_in: AtomicU64::new(0),
            records_out: AtomicU64::new(0),
            records_dead: AtomicU64::new(0),
            records_late: AtomicU64::new(0),
            checkpoint: AtomicU64::new(0),
            checkpoint_time_ms: AtomicU64::new(0),
            checkpoint_duration_ms: AtomicU64::new(0),
            commit_duration_ms: AtomicU64::new(0),
            watermark: AtomicI64::new(i64::MIN),
            lag: AtomicU64::new(u64::MAX),
            state: Mutex::new((JobState::Starting, None)),
            tables: Mutex::default(),
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
