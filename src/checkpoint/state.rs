//! The job state store: one checkpoint record per job, written durably.
//!
//! ```text
//! <state.dir>/<job>/checkpoint.json      the last complete checkpoint record
//! ```
//!
//! A record is written to a temporary file, synced, and renamed over the previous one, so a
//! crash leaves either the old record or the new one, never a torn one.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

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
    /// Rows in the files.
    pub rows: u64,
}

impl PendingCommit {
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

    fn path(&self, job: &str) -> PathBuf {
        self.dir.join(sanitize(job)).join("checkpoint.json")
    }

    /// The job's last checkpoint record, if it has one.
    pub fn load(&self, job: &str) -> Result<Option<CheckpointRecord>> {
        let path = self.path(job);
        match std::fs::read(&path) {
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

/// A job name as a folder name.
fn sanitize(job: &str) -> String {
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
        };
        store.save(&r).unwrap();
        r.checkpoint = 2;
        store.save(&r).unwrap();
        assert_eq!(store.load("j/1").unwrap(), Some(r));
        assert!(dir.path().join("j_1/checkpoint.json").is_file());
    }
}
