//! Checkpoints: the job state store, the exactly-once commit, and recovery.
//!
//! ```text
//! barrier: writers close files (nothing visible yet)
//!    -> record {checkpoint id, source offsets, data files per table} written durably
//!    -> each table committed once, summary {floe.job, floe.checkpoint}
//! start: read the record -> commit what a table lacks (idempotent) -> seek sources -> go on
//! ```
//!
//! A crash between any two steps loses nothing and duplicates nothing: files written after
//! the last record are never committed (orphans), commits of the last record are redone only
//! where missing, and sources resume from the recorded offsets.

pub mod commit;
pub mod rewrite;
pub mod state;

pub use commit::{commit_all, commit_once, committed_checkpoint};
pub use state::{CheckpointRecord, FileGroup, JobLock, PendingCommit, StateStore};
