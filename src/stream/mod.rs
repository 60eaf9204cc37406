//! The continuous executor: sources polled into Arrow batches, the job's query planned once
//! on DataFusion and run per batch, rows written to the target, checkpoints committed.

pub mod aggregate;
pub mod barrier;
pub mod branches;
pub mod job;
pub mod lookup;
pub mod maintain;
pub mod planner;
pub mod query;
pub mod registry;
pub mod slot;
pub mod source_table;
pub mod status;
pub mod stream_join;
pub mod top_n;
pub mod upper;
pub mod watermark;

pub use job::{Job, Target};
pub use planner::QueryPlanner;
pub use query::{ContinuousQuery, sources_of};
pub use registry::Jobs;
pub use source_table::SourceTable;
pub use status::{JobState, JobStatus, TableHealth};
