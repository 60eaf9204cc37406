//! Checkpoints: the job state store, the exactly-once commit, and recovery.
//!
//! ```text
//! barrier: writers close files (nothing visible yet)
//!    -> record {checkpoint id, source offsets, data files per table} written durably
//!    -> each table committed once, summary {floe.job, floe.checkpoint, floe.offsets}
//! start: read the record -> commit what a table lacks (idempotent) -> seek sources -> go on
//!        (no record: the tables' marks say where, see resume)
//! ```
//!
//! A crash between any two steps loses nothing and duplicates nothing: files written after
//! the last record are never committed (orphans), commits of the last record are redone only
//! where missing, and sources resume from the recorded offsets. A lost record loses only the
//! commits it alone named: those of a checkpoint interrupted by the same crash; a record is
//! copied with the tables it commits to ([`lake_copy`]), so not even those.

pub mod commit;
pub mod lake_copy;
pub mod resume;
pub mod rewrite;
pub mod state;

pub use commit::{Mark, commit_all, commit_once, committed_checkpoint};
pub use lake_copy::LakeCopy;
pub use resume::{Resume, TableMarks, resume};
pub use state::{
    CheckpointRecord, DeadLetterTarget, FileGroup, JobLock, PendingCommit, SpillRun, StateRecord,
    StateStore,
};
