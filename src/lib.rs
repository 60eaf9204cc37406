//! # floe
//!
//! A streaming SQL engine for the lakehouse, on Apache DataFusion and Apache Iceberg.
//!
//! ## Ad-hoc statements
//!
//! ```text
//!  SQL text --> sql::parser --> Statement --> session (one match over statements)
//!                                  |                  |
//!              floe's own DDL -----+                  +--> DataFusion plan --> execute
//!              (session::ddl: catalogs,                          |
//!               namespaces, tables, SHOW)          catalog::provider (tables looked up on
//!                                                  demand: always fresh), floe.jobs
//!                                                                |
//!                        scans: iceberg-datafusion (pushdown, pruning), catalog::evolved_scan
//!                        INSERT: lake::writer --> data files --> lake::commit (one snapshot)
//! ```
//!
//! ## Continuous jobs
//!
//! ```text
//!  connector (Kafka, Kinesis, files, datagen) --poll--> format (decode to Arrow; JSON shapes
//!      inferred by schema::infer) --> stream::query (the job's SQL, planned per input schema
//!      in the user's session, run per batch) --> sink::Sink
//!          TableTarget: one table            RoutedSink: ROUTE BY, a table per value,
//!                                            created on first sight
//!      --> sink::table_sink per table (schema::evolve grows schema and partition spec)
//!      --> lake::writer (Parquet files, invisible until committed)
//!  rows no table takes (Error::Record) --> sink::dead_letter (committed with the data),
//!      with their record's place and bytes (connector::Origins, carried with the poll)
//!  memory, I/O and outage errors --> the job retries from its last checkpoint
//!      (a target table created again under the job: Error::Restart, afresh into it)
//! ```
//!
//! ## Checkpoints: exactly once
//!
//! ```text
//!  every checkpoint.interval (stream::barrier):
//!    1. sinks flush and close their files            (nothing visible yet)
//!    2. checkpoint::state: record {id, source offsets, files per table}, written durably
//!    3. checkpoint::commit: each table committed once, its mark in the summary and the
//!       properties {floe.job, floe.checkpoint, floe.offsets};
//!       a table that already holds this checkpoint is skipped (idempotent)
//!       -- on a thread of its own while the job reads on; the next record waits for it
//!  on start: read the record -> commit what a table lacks -> seek every source -> go on
//!            (no record: the tables' marks, floe.checkpoint + floe.offsets, say where)
//! ```
//!
//! ## Layers
//!
//! `error < schema < lake < checkpoint < sink < stream < catalog/session < server < cli`: each uses
//! only those to its left ([`task`], [`secret`], [`failpoint`], [`sql`], [`config`],
//! [`connector`] and [`mod@format`] are used across them). New commit actions go in
//! [`lake::commit`], new statements in [`session`], new operators in [`stream`].

pub mod catalog;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod connector;
pub mod error;
pub mod failpoint;
pub mod format;
pub mod interrupt;
pub mod lake;
pub mod process;
pub mod schema;
pub mod secret;
pub mod server;
pub mod session;
pub mod sink;
pub mod sql;
pub mod stream;
pub mod task;
#[cfg(target_os = "linux")]
pub mod zstd_contexts;

pub use error::{Error, Result};
pub use session::{Output, Session};
