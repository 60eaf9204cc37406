//! A job's checkpoint record (and a stateful job's state) copied with the tables it writes,
//! so that a lost state folder loses none of it.
//!
//! ```text
//! <table's location>/.floe-state/<job>/run-<s>/record-<n>.json, window-<n>.arrow,
//!                                              join-..., spill files
//!
//! barrier: save the state locally -> copy its files not copied yet, then the record -> save
//!          the record locally -> commits (each commit's mark names the record's copy)
//! settle:  the commits are done -> delete the copies the committed record no longer names,
//!          and (once) the folders of the runs before
//! start:   no record (or an older one than the tables' latest mark names a copy of) -> copy
//!          the record and its state back, and go on from it as from the local record
//!          (commit what a table lacks, resume the sources at its offsets, with its state)
//! ```
//!
//! So a lost state folder loses nothing: not the state, and not the commits of the checkpoint a
//! crash interrupted (which only the record named: a routed job's tables, the dead letters).
//!
//! The folder is in the table's (where a catalog's credentials, vended for the table, may
//! write) and hidden: files under a table's location that its metadata does not name are
//! orphans, but Iceberg's orphan-file removal (and floe's) leaves hidden folders. Each run of
//! the job (each start) copies into a folder of its own, named by the checkpoint it starts
//! after (`s`), so that what a crash leaves behind (copies of a checkpoint whose commits it
//! interrupted, of one whose prune it did) goes with that run's folder once a later run's
//! state is committed: the folder of the run it resumed from, and those of the runs since
//! (which started after the same or a later checkpoint, and committed nothing).

use std::collections::BTreeSet;
use std::io::Read;

use bytes::Bytes;
use iceberg::io::FileIO;
use iceberg::table::Table;

use super::state::{CheckpointRecord, StateRecord, StateStore, folder};
use crate::error::{Error, Result};

/// Bytes read or written at once when copying a state file.
const CHUNK: usize = 8 << 20;

/// Where a job copies its state, and what it copied there.
#[derive(Debug, Clone)]
pub struct LakeCopy {
    io: FileIO,
    /// The folder's URI, without a trailing `/`.
    location: String,
    /// Files copied by this run of the job.
    copied: BTreeSet<String>,
    /// The folders of the runs before this one, deleted once this run's state is committed.
    previous: Vec<String>,
}

/// How many runs before it a run looks for the folders of (see [`LakeCopy::with_table`]).
const EARLIER_RUNS: u64 = 64;

impl LakeCopy {
    /// Copies into `location` (a folder's URI), written through `io`.
    pub fn at(io: FileIO, location: &str) -> Self {
        Self {
            io,
            location: location.trim_end_matches('/').to_string(),
            copied: BTreeSet::new(),
            previous: Vec::new(),
        }
    }

    /// Copies of job `job`'s record and state with `table` by the run starting after checkpoint
    /// `start`: in `.floe-state/<job>/run-<start>` of the table's folder. The
    /// folders of runs that started after the last few checkpoints before are deleted with
    /// the one the job resumed from (see [`Self::resumed`]): those runs committed nothing
    /// (else this one would start after their checkpoints).
    pub fn with_table(table: &Table, job: &str, start: u64) -> Self {
        let location = table.metadata().location().trim_end_matches('/');
        let base = format!("{location}/.floe-state/{}", folder(job));
        let mut copy = Self::at(table.file_io().clone(), &format!("{base}/run-{start}"));
        copy.previous = (start.saturating_sub(EARLIER_RUNS)..start)
            .map(|s| format!("{base}/run-{s}"))
            .collect();
        copy
    }

    /// The folder's URI.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// The copy of a job resuming from a record copied to `folder`: that folder goes once this
    /// run's first record is committed. (Only a folder beside this one: a record copied
    /// elsewhere, with a table since moved, is left alone.)
    pub fn resumed(mut self, folder: Option<&str>) -> Self {
        let base = self.location.rsplit_once('/').map(|(b, _)| format!("{b}/"));
        let resumed = folder
            .map(str::to_string)
            .filter(|l| *l != self.location && base.as_ref().is_some_and(|b| l.starts_with(b)));
        if let Some(folder) = resumed
            && !self.previous.contains(&folder)
        {
            self.previous.push(folder);
        }
        self
    }

    /// Copy the files of `record`'s state (in `store`'s folder of its job) not copied yet,
    /// then the record itself, naming the copy in it.
    pub async fn copy(&mut self, store: &StateStore, record: &mut CheckpointRecord) -> Result<()> {
        let job = &record.job;
        let names: Vec<String> = record
            .state
            .iter()
            .flat_map(StateRecord::files)
            .filter(|f| !self.copied.contains(*f))
            .cloned()
            .collect();
        for name in names {
            let from = store.state_path(job, &name);
            let to = format!("{}/{name}", self.location);
            let failed = |e: String| refused(&to, e);
            let mut file = std::fs::File::open(&from).map_err(|e| failed(e.to_string()))?;
            let output = self.io.new_output(&to).map_err(|e| failed(e.to_string()))?;
            let mut writer = output.writer().await.map_err(|e| failed(e.to_string()))?;
            loop {
                let mut chunk = Vec::with_capacity(CHUNK);
                (&mut file)
                    .take(CHUNK as u64)
                    .read_to_end(&mut chunk)
                    .map_err(|e| failed(e.to_string()))?;
                if chunk.is_empty() {
                    break;
                }
                writer
                    .write(Bytes::from(chunk))
                    .await
                    .map_err(|e| failed(e.to_string()))?;
            }
            writer.close().await.map_err(|e| failed(e.to_string()))?;
            self.copied.insert(name);
        }
        record.copied_to = Some(self.location.clone());
        let name = record_name(record.checkpoint);
        let json = serde_json::to_vec(record)
            .map_err(|e| Error::Internal(format!("job '{}''s record: {e}", record.job)))?;
        let to = format!("{}/{name}", self.location);
        self.io
            .new_output(&to)?
            .write(Bytes::from(json))
            .await
            .map_err(|e| {
                Error::Internal(format!(
                    "copying job '{}''s record to {to}: {e}",
                    record.job
                ))
            })?;
        self.copied.insert(name);
        Ok(())
    }

    /// Delete the copies `committed` (the record the tables' marks now name) no longer needs.
    /// A copy that cannot be deleted is left (and forgotten): it costs only its space.
    pub async fn prune(&mut self, committed: &CheckpointRecord) {
        let record = record_name(committed.checkpoint);
        let keep: BTreeSet<&String> = committed
            .state
            .iter()
            .flat_map(StateRecord::files)
            .chain([&record])
            .collect();
        let gone: Vec<String> = self
            .copied
            .iter()
            .filter(|f| !keep.contains(f))
            .cloned()
            .collect();
        for name in gone {
            let _ = self.io.delete(format!("{}/{name}", self.location)).await;
            self.copied.remove(&name);
        }
        // (In the background: on an object store each is a listing.)
        let previous = std::mem::take(&mut self.previous);
        if !previous.is_empty() {
            let io = self.io.clone();
            tokio::spawn(async move {
                for folder in previous {
                    let _ = io.delete_prefix(format!("{folder}/")).await;
                }
            });
        }
    }
}

/// A copy that could not be written to `to`.
fn refused(to: &str, e: String) -> Error {
    Error::Source(format!(
        "its checkpoint records are not copied with its tables: {to} cannot be written \
         ({e}); a lost state.dir would lose the commits of a checkpoint a crash interrupts, \
         and a stateful job's state (SET 'state.lake-copy' = 'false' not to try)"
    ))
}

/// The name of checkpoint `checkpoint`'s record in the copy.
fn record_name(checkpoint: u64) -> String {
    format!("record-{checkpoint}.json")
}

/// Where the tables' mark of `record`'s checkpoint finds the copy of it: its URI (empty when
/// it has no copy).
pub fn record_uri(record: &CheckpointRecord) -> String {
    record
        .copied_to
        .as_ref()
        .map(|l| format!("{l}/{}", record_name(record.checkpoint)))
        .unwrap_or_default()
}

/// Copy back, through `io`, the record of job `job` the tables' mark names (`uri`, see
/// [`record_uri`]), and its state's files into `store`'s folder of the job (where missing).
/// `None` when the copy is gone (with the table it was in, dropped since).
pub async fn restore(
    io: &FileIO,
    store: &StateStore,
    job: &str,
    uri: &str,
) -> Result<Option<CheckpointRecord>> {
    let unreadable = |what: &str, e: String| {
        Error::Plan(format!(
            "job '{job}' resumes from the checkpoint record its tables name, whose copy {what} \
             cannot be read ({e}): restore the job's state folder, or give the job another \
             'pipeline.name' to start afresh"
        ))
    };
    if !io.exists(uri).await? {
        return Ok(None);
    }
    let json = io
        .new_input(uri)
        .map_err(|e| unreadable(uri, e.to_string()))?
        .read()
        .await
        .map_err(|e| unreadable(uri, e.to_string()))?;
    let record: CheckpointRecord =
        serde_json::from_slice(&json).map_err(|e| unreadable(uri, e.to_string()))?;
    if record.job != job {
        return Err(unreadable(uri, format!("it is job '{}''s", record.job)));
    }
    let Some(state) = &record.state else {
        return Ok(Some(record));
    };
    let Some(location) = &record.copied_to else {
        return Err(unreadable(uri, "it names no folder".into()));
    };
    for name in state.files() {
        if store.state_path(job, name).exists() {
            continue;
        }
        let from = format!("{location}/{name}");
        let failed = |e: iceberg::Error| unreadable(&from, e.to_string());
        let input = io.new_input(&from).map_err(failed)?;
        let size = input.metadata().await.map_err(failed)?.size;
        let reader = input.reader().await.map_err(failed)?;
        let mut file = store.create_state(job, name)?;
        let mut at = 0;
        while at < size {
            let end = (at + CHUNK as u64).min(size);
            let chunk = reader.read(at..end).await.map_err(failed)?;
            std::io::Write::write_all(&mut file, &chunk)
                .map_err(|e| Error::io(format!("copying {from} back"), e))?;
            at = end;
        }
        file.finish()?;
    }
    Ok(Some(record))
}
