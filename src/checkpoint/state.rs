//! The job state store: one checkpoint record per job, written durably.
//!
//! ```text
//! <state.dir>/<job>/checkpoint.json      the last complete checkpoint record
//! <state.dir>/<job>/lock                 held (flock) by the process running the job
//! <state.dir>/<job>/window-<n>.arrow     a windowed job's open windows at checkpoint n
//! <state.dir>/<job>/join-<n>-<i>.arrow   a stream join's rows of its i-th source then
//! <state.dir>/<job>/*-spill-*.arrow      state beyond the memory budget (named by the record)
//! ```
//!
//! A job's record (and its state's files) is also copied with its tables
//! ([`super::lake_copy`]).
//!
//! A record is written to a temporary file, synced, and renamed over the previous one, so a
//! crash leaves either the old record or the new one, never a torn one. A job's folder is
//! its name with every byte outside `[A-Za-z0-9_.-]` percent-encoded: two names never share
//! a folder, and no name leaves `state.dir`. One process at a time runs a job: the second
//! owner cannot take the lock. A record names its job; a record of another job is not read.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::ipc::reader::FileReader;
use datafusion::arrow::ipc::writer::FileWriter;
use serde::{Deserialize, Serialize};

use crate::connector::Offsets;
use crate::error::{Error, Result};

/// What a job had done at one checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointRecord {
    /// The job's name.
    pub job: String,
    /// The checkpoint id, counting from 1.
    pub checkpoint: u64,
    /// Milliseconds since the epoch when the record was written.
    pub time_ms: i64,
    /// The offsets to resume from, per source name.
    pub sources: BTreeMap<String, Offsets>,
    /// Data files written for this checkpoint, per table; committed after the record.
    pub tables: Vec<PendingCommit>,
    /// The UUID of the target table the job writes. A record for another UUID belongs to
    /// a dropped table of the same name and is not resumed from.
    #[serde(default)]
    pub table_uuid: Option<String>,
    /// Where the job's dead letters go: rows a commit must leave out go there too.
    #[serde(default)]
    pub dead_letters: Option<DeadLetterTarget>,
    /// A stateful job's state at this checkpoint: its open windows, the rows of the streams
    /// it joins, its sources' watermarks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<StateRecord>,
    /// Where the record (and its state's files) is copied with the job's tables (a folder's
    /// URI), when it is: the checkpoint's commits name the copy (see [`super::lake_copy`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copied_to: Option<String>,
}

/// A stateful job's state at a checkpoint: files in the job's folder.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct StateRecord {
    /// The file holding the open windows' partial aggregates, for a windowed job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub windows: Option<String>,
    /// Per source a join between streams keeps the rows of, the file holding them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub joins: BTreeMap<String, String>,
    /// Each source's watermark (microseconds since the epoch), once it had one.
    #[serde(default)]
    pub watermarks: BTreeMap<String, i64>,
    /// Open windows' state moved to disk beyond the job's memory budget.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spilled: Vec<SpillRun>,
    /// Per source a join between streams keeps the rows of, the files of those moved to disk
    /// beyond the job's memory budget.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub joins_spilled: BTreeMap<String, Vec<String>>,
}

impl StateRecord {
    /// The files it names, each once.
    pub fn files(&self) -> impl Iterator<Item = &String> {
        self.windows
            .iter()
            .chain(self.joins.values())
            .chain(self.spilled.iter().flat_map(|run| &run.files))
            .chain(self.joins_spilled.values().flatten())
    }
}

/// Open windows' partial aggregates a job moved to local disk beyond its memory budget (in
/// its state folder): one run, split by the hash of each row's group into files, so that a
/// group's rows are in the same file of every run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpillRun {
    pub files: Vec<String>,
    /// The earliest window end (microseconds) of its rows: none closes before it.
    pub first_end: i64,
}

/// A job's dead-letter table, and the target its letters name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetterTarget {
    pub namespace: Vec<String>,
    pub table: String,
    pub target: String,
}

/// Data files of one table waiting for (or done with) their commit, with the schema and
/// partition-spec changes they need, committed together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingCommit {
    pub catalog: String,
    pub namespace: Vec<String>,
    pub table: String,
    /// The table the files were written for; a re-created table of the same name is not it.
    pub table_uuid: String,
    /// The files, per partition spec they were written with.
    pub groups: Vec<FileGroup>,
    /// The schema the table changes to (Iceberg JSON), when it evolves in this checkpoint.
    #[serde(default)]
    pub schema: Option<String>,
    /// The partition spec the table changes to (Iceberg JSON), when it evolves.
    #[serde(default)]
    pub spec: Option<String>,
    /// The schema id the evolution started from: a table whose schema another writer has
    /// changed since is not evolved over that change.
    #[serde(default)]
    pub base_schema_id: Option<i32>,
    /// The id `spec` had on the table the files were written for (the files written after
    /// the change name it): another writer's spec may have that id on the table by the commit.
    #[serde(default)]
    pub spec_id: Option<i32>,
    /// Rows in the files.
    pub rows: u64,
    /// The job creates this table on sight (routed tables, dead letters): when it is gone at
    /// the commit, it is created again, and a table created again under the job takes the
    /// files' rows. Otherwise files of a table that is gone are not committed (the job starts
    /// afresh into a re-created table).
    #[serde(default)]
    pub recreate: bool,
    /// The table keeps one row per key (its identifier fields): the commit also deletes the
    /// rows whose keys the files' rows have (see `lake::upsert`).
    #[serde(default)]
    pub upsert: bool,
    /// Files of the keys whose rows the commit deletes (the key columns of the rows a change
    /// stream deleted), for a table with a primary key; not part of the table.
    #[serde(default)]
    pub deleted_keys: Vec<String>,
}

impl PendingCommit {
    /// The paths of the files it needs: the data files it commits, and the files of keys it
    /// deletes.
    pub fn file_paths(&self) -> Vec<String> {
        self.groups
            .iter()
            .flat_map(|g| &g.files)
            .filter_map(|json| {
                let v: serde_json::Value = serde_json::from_str(json).ok()?;
                Some(v.get("file_path")?.as_str()?.to_string())
            })
            .chain(self.deleted_keys.iter().cloned())
            .collect()
    }

    /// The table's identifier.
    pub fn ident(&self) -> Result<iceberg::TableIdent> {
        Ok(iceberg::TableIdent::new(
            iceberg::NamespaceIdent::from_vec(self.namespace.clone())?,
            self.table.clone(),
        ))
    }
}

/// Data files written with one partition spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileGroup {
    pub spec_id: i32,
    /// Each data file as Iceberg's JSON form of a manifest entry's data file.
    pub files: Vec<String>,
    /// The same files as the sink that wrote them has them, in this process only (a record
    /// read back has the JSON alone): the commit takes these rather than parse `files` when
    /// the table is still the one they were written for.
    #[serde(skip)]
    pub written: std::sync::Arc<[iceberg::spec::DataFile]>,
}

/// Where a job's checkpoint records live.
#[derive(Debug, Clone)]
pub struct StateStore {
    dir: PathBuf,
}

impl StateStore {
    /// A store under `dir` (created on first write).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The folder the store keeps its jobs' folders in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, job: &str) -> PathBuf {
        self.dir.join(folder(job)).join("checkpoint.json")
    }

    /// The job's last checkpoint record, if it has one. (A job whose name had characters
    /// outside `[A-Za-z0-9_.-]` kept its record under an older folder naming, which is read
    /// when it holds this job's record.)
    pub fn load(&self, job: &str) -> Result<Option<CheckpointRecord>> {
        if let Some(r) = self.read(&self.path(job))? {
            return Ok(Some(r).filter(|r| r.job == job));
        }
        let legacy = self.dir.join(legacy_folder(job)).join("checkpoint.json");
        Ok(self.read(&legacy)?.filter(|r| r.job == job))
    }

    fn read(&self, path: &Path) -> Result<Option<CheckpointRecord>> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                Error::Internal(format!(
                    "checkpoint record {} is unreadable: {e}",
                    path.display()
                ))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(format!("reading {}", path.display()), e)),
        }
    }

    /// Take the job's lock, held until the returned value is dropped: fails when another
    /// process (or another session of this one) runs the job.
    pub fn lock(&self, job: &str) -> Result<JobLock> {
        use std::os::fd::AsRawFd;
        let dir = self.dir.join(folder(job));
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let path = dir.join("lock");
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        // SAFETY: flock on a file descriptor this function owns, open for its whole call.
        let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if locked != 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::WouldBlock {
                let holder = std::fs::read_to_string(&path).unwrap_or_default();
                return Err(Error::Plan(format!(
                    "job '{job}' is running already ({}): its state folder {} is locked; stop \
                     it first, or give this job another 'pipeline.name'",
                    match holder.trim() {
                        "" => "in another session".to_string(),
                        pid => format!("process {pid}"),
                    },
                    dir.display()
                )));
            }
            return Err(Error::io(format!("locking {}", path.display()), err));
        }
        let pid = std::process::id().to_string();
        let _ = file.set_len(0).and_then(|_| file.write_all(pid.as_bytes()));
        Ok(JobLock { _file: file })
    }

    /// Every job's last checkpoint record under this store (unreadable ones are errors: a
    /// caller protecting their files must not skip one).
    pub fn records(&self) -> Result<Vec<CheckpointRecord>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io(format!("listing {}", self.dir.display()), e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry =
                entry.map_err(|e| Error::io(format!("listing {}", self.dir.display()), e))?;
            out.extend(self.read(&entry.path().join("checkpoint.json"))?);
        }
        Ok(out)
    }

    /// Write `record` durably, replacing the job's previous one.
    pub fn save(&self, record: &CheckpointRecord) -> Result<()> {
        let path = self.path(&record.job);
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let tmp = dir.join(format!("checkpoint.json.{}.tmp", record.checkpoint));
        let bytes = serde_json::to_vec_pretty(record)
            .map_err(|e| Error::Internal(format!("encoding a checkpoint record: {e}")))?;
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            std::fs::File::open(dir)?.sync_all()
        };
        write().map_err(|e| Error::io(format!("writing {}", path.display()), e))
    }
}

impl StateStore {
    /// Write part of a stateful job's state (`batches` of `schema`) durably as file `name` of
    /// the job's folder.
    pub fn save_state(
        &self,
        job: &str,
        name: &str,
        schema: &SchemaRef,
        batches: &[RecordBatch],
    ) -> Result<()> {
        let file = self.create_state(job, name)?;
        let path = file.path.clone();
        let mut w = FileWriter::try_new(file, schema)
            .map_err(|e| Error::Internal(format!("writing {}: {e}", path.display())))?;
        for b in batches {
            w.write(b)
                .map_err(|e| Error::Internal(format!("writing {}: {e}", path.display())))?;
        }
        w.finish()
            .map_err(|e| Error::Internal(format!("writing {}: {e}", path.display())))?;
        w.into_inner()
            .map_err(|e| Error::Internal(format!("writing {}: {e}", path.display())))?
            .finish()
    }

    /// Where file `name` of a stateful job's state is.
    pub fn state_path(&self, job: &str, name: &str) -> PathBuf {
        self.dir.join(folder(job)).join(name)
    }

    /// A new file `name` of a stateful job's state, in place (durably) once finished.
    pub fn create_state(&self, job: &str, name: &str) -> Result<StateFile> {
        let dir = self.dir.join(folder(job));
        let path = dir.join(name);
        let tmp = dir.join(format!("{name}.tmp"));
        let file = std::fs::create_dir_all(&dir)
            .and_then(|_| std::fs::File::create(&tmp))
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
        Ok(StateFile {
            file,
            tmp,
            path,
            dir,
        })
    }

    /// Part of a stateful job's state as saved by [`Self::save_state`].
    pub fn load_state(&self, job: &str, file: &str) -> Result<Vec<RecordBatch>> {
        self.read_state(job, file)?.collect()
    }

    /// The batches of a state file, read one at a time.
    pub fn read_state(
        &self,
        job: &str,
        file: &str,
    ) -> Result<impl Iterator<Item = Result<RecordBatch>> + use<>> {
        let path = self.dir.join(folder(job)).join(file);
        let f = std::fs::File::open(&path).map_err(|e| {
            Error::Plan(format!(
                "job '{job}' keeps its state in {}, which cannot be read ({e}): restore the \
                 job's state folder, or give the job another 'pipeline.name'",
                path.display()
            ))
        })?;
        let reader = FileReader::try_new(f, None)
            .map_err(|e| Error::Internal(format!("window state {}: {e}", path.display())))?;
        Ok(reader.map(move |b| {
            b.map_err(|e| Error::Internal(format!("window state {}: {e}", path.display())))
        }))
    }

    /// Remove a stateful job's state files other than `keep` (older checkpoints').
    pub fn prune_state(&self, job: &str, keep: &[&str]) {
        let dir = self.dir.join(folder(job));
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let state = name.ends_with(".arrow");
            if state && !keep.contains(&name.as_str()) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// A state file being written (see [`StateStore::create_state`]): under a temporary name
/// until [`StateFile::finish`] syncs it and renames it into place.
#[derive(Debug)]
pub struct StateFile {
    file: std::fs::File,
    tmp: PathBuf,
    path: PathBuf,
    dir: PathBuf,
}

impl StateFile {
    /// Sync the file and name it (durably).
    pub fn finish(self) -> Result<()> {
        let done = self
            .file
            .sync_all()
            .and_then(|_| std::fs::rename(&self.tmp, &self.path))
            .and_then(|_| std::fs::File::open(&self.dir)?.sync_all());
        done.map_err(|e| Error::io(format!("writing {}", self.path.display()), e))
    }
}

impl Write for StateFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.file.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// A running job's hold on its state folder (see [`StateStore::lock`]); released on drop.
#[derive(Debug)]
pub struct JobLock {
    _file: std::fs::File,
}

/// A job name as a folder name: bytes outside `[A-Za-z0-9_.-]` as `%XX`, so that distinct
/// names have distinct folders; `.` and `..` (and the empty name) are encoded whole.
pub(super) fn folder(job: &str) -> String {
    let safe = |b: u8| b.is_ascii_alphanumeric() || b"-_.".contains(&b);
    let special = matches!(job, "" | "." | "..");
    let mut out = String::with_capacity(job.len());
    for b in job.bytes() {
        if safe(b) && !(special && b == b'.') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if out.is_empty() { "%".to_string() } else { out }
}

/// The folder name floe gave a job before [`folder`]: other characters as `_`.
fn legacy_folder(job: &str) -> String {
    job.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_replace() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        assert_eq!(store.load("j/1").unwrap(), None);
        let mut r = CheckpointRecord {
            job: "j/1".into(),
            checkpoint: 1,
            time_ms: 5,
            sources: BTreeMap::from([("s".into(), Offsets::from([("0".into(), "10".into())]))]),
            tables: vec![],
            table_uuid: None,
            dead_letters: None,
            state: None,
            copied_to: None,
        };
        store.save(&r).unwrap();
        r.checkpoint = 2;
        store.save(&r).unwrap();
        assert_eq!(store.load("j/1").unwrap(), Some(r));
        assert!(dir.path().join("j%2F1/checkpoint.json").is_file());
    }

    #[test]
    fn names_never_share_a_folder_or_leave_the_state_dir() {
        let names = [
            "a b", "a/b", "a_b", "a%2Fb", "..", ".", "", "../x", "東京", "大阪",
        ];
        let folders: std::collections::BTreeSet<String> = names.iter().map(|n| folder(n)).collect();
        assert_eq!(folders.len(), names.len(), "{folders:?}");
        for f in &folders {
            assert!(
                !f.contains('/') && f != "." && f != ".." && !f.is_empty(),
                "{f}"
            );
        }
        assert_eq!(folder("events-to-lake.v2"), "events-to-lake.v2");
    }

    #[test]
    fn a_record_of_another_job_is_not_read_and_old_folders_still_are() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        let record = |job: &str| CheckpointRecord {
            job: job.into(),
            checkpoint: 3,
            time_ms: 5,
            sources: BTreeMap::new(),
            tables: vec![],
            table_uuid: None,
            dead_letters: None,
            state: None,
            copied_to: None,
        };
        // Written by an older floe for 'a b' into the folder 'a_b' (also 'a_b''s old one).
        let legacy = dir.path().join("a_b");
        std::fs::create_dir_all(&legacy).unwrap();
        let bytes = serde_json::to_vec(&record("a b")).unwrap();
        std::fs::write(legacy.join("checkpoint.json"), bytes).unwrap();
        assert_eq!(store.load("a b").unwrap(), Some(record("a b")));
        assert_eq!(
            store.load("a_b").unwrap(),
            None,
            "the record names another job"
        );
    }

    #[test]
    fn one_owner_holds_a_job() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        let held = store.lock("j").unwrap();
        let err = store.lock("j").unwrap_err().to_string();
        assert!(err.contains("job 'j' is running already"), "{err}");
        assert!(
            err.contains(&format!("process {}", std::process::id())),
            "{err}"
        );
        store.lock("other").unwrap();
        drop(held);
        store.lock("j").unwrap();
    }
}
