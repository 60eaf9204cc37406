//! # floe
//!
//! A streaming SQL engine for the lakehouse, on Apache DataFusion and Apache Iceberg.
//!
//! ## Data path
//!
//! ```text
//!  SQL text --> sql::parser --> Statement --> session (one match over statements)
//!                                   |                 |
//!                 floe's own DDL ---+                 +--> DataFusion plan --> execute
//!                 (catalogs, namespaces,                          |
//!                  Iceberg tables, SHOW)            catalog::provider (tables looked up
//!                                                   on demand: always fresh)
//!                                                                 |
//!                         scans: iceberg-datafusion (pushdown, pruning)
//!                         inserts: sink::TableWriter --> data files --> sink::commit
//!                                  (one fast_append snapshot per statement)
//! ```
//!
//! Continuous jobs (sources, `ROUTE BY`, checkpoints with exactly-once commits) build on
//! the same writer and commit path; see `DESIGN` in the README.

pub mod catalog;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod connector;
pub mod error;
pub mod format;
pub mod interrupt;
pub mod lake;
pub mod process;
pub mod schema;
pub mod session;
pub mod sink;
pub mod sql;
pub mod stream;
pub mod task;

pub use error::{Error, Result};
pub use session::{Output, Session};
