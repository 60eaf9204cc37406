//! How data files become a snapshot: every commit floe makes goes through here.
//!
//! ```text
//! data files (lake::writer) ─┬─ no schema/spec change, format v1 ─> append (iceberg-rust fast_append)
//!                            └─ otherwise ─> evolving::prepare: manifests, manifest list,
//!                                            snapshot, schema/spec updates  (nothing visible)
//!                                               │
//!                                   Committer ──┼─ sql:  compare-and-set of the metadata location
//!                                               └─ rest: POST updates + requirements
//!                                   (a conflict is retryable: reload, merge, prepare again)
//! ```
//!
//! The exactly-once protocol on top of these (which checkpoint a table holds, what to
//! commit after a crash) is `checkpoint::commit`.

pub mod append;
pub mod evolving;
pub mod replace;
pub mod rest;
pub mod row_delta;
pub mod snapshot;
pub mod sql;

pub use append::{append, without_retries};
pub use evolving::{EvolvingAppend, Prepared, prepare, staged};
pub use rest::RestCommitter;
pub use sql::SqlCommitter;

use iceberg::spec::TableMetadataRef;
use iceberg::table::Table;

use crate::error::Result;

/// `base` (its identifier and file IO) with other metadata, at `location`.
pub fn table_like(
    base: &Table,
    metadata: impl Into<TableMetadataRef>,
    location: Option<&str>,
) -> Result<Table> {
    let mut builder = Table::builder()
        .metadata(metadata)
        .identifier(base.identifier().clone())
        .file_io(base.file_io().clone())
        .runtime(iceberg::Runtime::try_current()?);
    if let Some(location) = location {
        builder = builder.metadata_location(location);
    }
    Ok(builder.build()?)
}

/// floe's commit path to a catalog, by catalog type.
#[derive(Debug)]
pub enum Committer {
    Sql(SqlCommitter),
    Rest(RestCommitter),
}

impl Committer {
    /// Make `prepared` the table's state, unless `base` is no longer current (a retryable
    /// conflict).
    pub async fn commit(&self, base: &Table, prepared: Prepared) -> Result<Table> {
        match self {
            Committer::Sql(c) => c.commit(base, prepared.metadata).await,
            Committer::Rest(c) => c.commit(base, prepared.updates).await,
        }
    }
}
