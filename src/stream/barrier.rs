//! The checkpoint barrier of a job, and the overlap of one checkpoint's commits with the
//! reads of the next.
//!
//! ```text
//! barrier:  flush the sink -> wait for the last checkpoint's commits -> close files
//!           -> write the checkpoint record (durably) -> commit each table once, on a thread
//!              of its own while the job reads on (awaited when the job ends)
//! settle:   the commits are done -> each table's new base (sinks re-base what they staged
//!           meanwhile) -> the tables' maintenance (stream::maintain), never waited for
//!           -> SHOW JOBS shows the checkpoint
//! ```
//!
//! The next record waits for the last one's commits: recovery commits what the last record
//! names, so it must name every table not yet committed.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use iceberg::TableIdent;

use super::job::Destination;
use super::job::Runner;
use super::status::JobState;
use crate::checkpoint::{CheckpointRecord, LakeCopy, StateRecord, commit_all};
use crate::connector::Offsets;
use crate::error::Result;
use crate::failpoint;
use crate::lake::runtime;
use crate::task::{AbortOnDrop, joined};

/// A checkpoint whose record is saved and whose tables are being committed, on a thread of
/// its own while the job reads on. The next checkpoint's record is written only after these
/// commits are done: recovery commits what the last record names, so it must name them all.
pub(super) struct Committing {
    record: CheckpointRecord,
    /// How long the job paused for it (closing files, writing the record).
    closed: Duration,
    commits: Instant,
    task: AbortOnDrop<Result<HashMap<TableIdent, iceberg::table::Table>>>,
}

impl Committing {
    /// Whether its commits are done.
    pub(super) fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Wait for its commits, whatever they give (a retry starts by committing the record
    /// again: not while these still do).
    pub(super) async fn wait(self) {
        let _ = self.task.await;
    }
}

impl Runner<'_> {
    /// Close files, record the checkpoint durably, then commit each table once: on a thread
    /// of its own while the job reads on, unless `last` (the job ends: the commits are
    /// awaited). The previous checkpoint's commits are awaited first.
    pub(super) async fn checkpoint(&mut self, last: bool) -> Result<()> {
        let began = Instant::now();
        self.emit_updates().await?;
        let outcome = self.data.flush().await?;
        self.take(outcome).await?;
        self.settle().await?;
        let offsets: BTreeMap<String, Offsets> = self
            .readers
            .iter()
            .map(|(name, r, _)| (name.clone(), r.offsets()))
            .collect();
        let mut tables = self.data.close().await?;
        tables.extend(self.dead.close().await?);
        // The record (and its copy with the tables) names the data files closed above: they
        // are durable before it is.
        crate::lake::storage::sync_written().await?;
        if tables.is_empty() && offsets == self.committed_offsets {
            return Ok(());
        }
        let state = self.save_state().await?;
        let mut record = CheckpointRecord {
            job: self.job.name.clone(),
            checkpoint: self.checkpoint + 1,
            time_ms: chrono::Utc::now().timestamp_millis(),
            sources: offsets.clone(),
            tables,
            table_uuid: Some(self.identity.clone()),
            dead_letters: Some(self.dead.target()),
            state,
            copied_to: None,
        };
        let job = self.job;
        if let Some(copy) = self.lake_copy_for(&record)
            && let Err(e) = copy.copy(&job.store, &mut record).await
        {
            // A storage that takes only a table's own files (a table bucket): the job goes on
            // without copies, saying so.
            record.copied_to = None;
            self.lake_copy = None;
            self.copies = false;
            job.status.set_state(JobState::Running, Some(e.to_string()));
        }
        self.job.store.save(&record)?;
        if let Some(state) = &record.state {
            // The record names the new state: the older files are no longer needed.
            let keep: Vec<&str> = state.files().map(String::as_str).collect();
            self.job.store.prune_state(&self.job.name, &keep);
        }
        failpoint::reach(failpoint::AFTER_RECORD);
        self.checkpoint = record.checkpoint;
        self.committed_offsets = offsets;
        let mut known = self.data.known();
        known.extend(self.dead.known());
        let target = self.job.target.clone();
        let committed = record.clone();
        // The commits' own work (manifests, metadata) on the write runtime.
        let task = runtime::spawn(async move {
            commit_all(
                &target.catalog,
                target.committer.as_ref(),
                &committed,
                &known,
            )
            .await
        });
        self.committing = Some(Committing {
            record,
            closed: began.elapsed(),
            commits: Instant::now(),
            task,
        });
        if last {
            self.settle().await?;
            // Rows the commits left out became dead letters: they need a checkpoint too.
            if self.dead.has_pending() {
                return Box::pin(self.checkpoint(true)).await;
            }
        }
        Ok(())
    }

    /// A stateful job's state (open windows, joined streams' rows) and watermarks, saved for
    /// the next checkpoint.
    async fn save_state(&mut self) -> Result<Option<StateRecord>> {
        if self.aggregate.is_none() && self.joins.is_none() {
            return Ok(None);
        }
        let next = self.checkpoint + 1;
        let store = &self.job.store;
        let job = &self.job.name;
        let mut record = StateRecord::default();
        if let (Some(aggregate), Some(state)) =
            (self.job.query.aggregate(), self.aggregate.as_mut())
        {
            aggregate.compact(state).await?;
            let schema = state
                .batches()
                .first()
                .map_or_else(|| aggregate.state_schema(), |b| b.schema());
            let name = format!("window-{next}.arrow");
            store.save_state(job, &name, &schema, state.batches())?;
            record.windows = Some(name);
            record.spilled = state.spilled().to_vec();
        }
        if let Some(joins) = &self.joins {
            for (i, (source, batches)) in joins.sources().enumerate() {
                let Some(first) = batches.first() else {
                    continue;
                };
                let name = format!("join-{next}-{i}.arrow");
                store.save_state(job, &name, &first.schema(), &batches)?;
                record.joins.insert(source.clone(), name);
            }
            record.joins_spilled = joins.spilled().clone();
        }
        record.watermarks = self
            .readers
            .iter()
            .zip(&self.watermarks)
            .filter_map(|((name, _, _), t)| Some((name.clone(), t.as_ref()?.current()?)))
            .collect();
        Ok(Some(record))
    }

    /// Where `record` is copied (see [`crate::checkpoint::lake_copy`]): nowhere unless it
    /// commits a table (whose mark names the copy). A routed job's copies go with the table
    /// its resumed record's copy is with, else with the first table it knows.
    fn lake_copy_for(&mut self, record: &CheckpointRecord) -> Option<&mut LakeCopy> {
        if record.tables.is_empty() {
            return None;
        }
        let routed = matches!(self.job.target.destination, Destination::Routed { .. });
        if self.lake_copy.is_none() && routed && self.copies {
            let mut known: Vec<_> = self.data.known().into_iter().collect();
            known.extend(self.dead.known());
            known.sort_by(|a, b| a.0.cmp(&b.0));
            let resumed = self.resumed_copy.as_deref().unwrap_or_default();
            let (_, table) = known
                .iter()
                .find(|(_, t)| {
                    let location = t.metadata().location().trim_end_matches('/');
                    resumed.starts_with(&format!("{location}/"))
                })
                .or(known.first())?;
            let copy = LakeCopy::with_table(table, &self.job.name, self.started_after);
            self.lake_copy = Some(copy.resumed(self.resumed_copy.take().as_deref()));
        }
        self.lake_copy.as_mut()
    }

    /// Wait for the commits under way, if any, and make the committed tables the sinks'
    /// new bases.
    pub(super) async fn settle(&mut self) -> Result<()> {
        let Some(c) = self.committing.take() else {
            return Ok(());
        };
        let committed = joined(c.task, "checkpoint commit task").await?;
        let commit_ms = c.commits.elapsed().as_millis() as u64;
        let left_out = self.data.after_commit(&c.record.tables, &committed).await?;
        if let Some(copy) = &mut self.lake_copy
            && c.record.copied_to.as_deref() == Some(copy.location())
        {
            // The tables' marks name this record now: the older copies are no longer needed.
            copy.prune(&c.record).await;
        }
        self.dead.after_commit(&c.record.tables, &committed).await?;
        self.job.status.committed(&committed);
        if let Some(m) = &mut self.maintainer {
            m.committed(&committed).await?;
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
        // Rows written since that a table changed by another writer cannot take.
        self.take(left_out).await
    }
}
