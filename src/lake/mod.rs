//! The lake: Iceberg plumbing with no SQL engine above it. Opening catalogs, local
//! storage, writing and reading data files, the commit paths that turn files into snapshots,
//! and the maintenance that keeps tables healthy.
//!
//! Uses only `error` and `schema`; `checkpoint`, `sink` and everything above build on it.

pub mod commit;
pub mod connect;
pub mod dead_letter;
pub mod deletes;
pub mod glue;
pub mod key_index;
pub mod key_spill;
pub mod maintenance;
pub mod parquet_file;
pub mod read;
pub mod runtime;
pub mod storage;
pub mod upsert;
pub mod writer;

pub use commit::Committer;
pub use connect::{CatalogConfig, CatalogHandle, CatalogKind, RestTimeouts, connect, table_exists};
pub use writer::TableWriter;
