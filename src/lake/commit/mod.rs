//! How data files become a snapshot: every commit floe makes goes through here.
//!
//! ```text
//! data files (lake::writer) ─┬─ no schema/spec change, format v1 ─> append (iceberg-rust fast_append)
//!                            └─ otherwise ─> evolving::prepare: manifests (small ones merged
//!                                            as they accumulate: merge), manifest list,
//!                                            snapshot, schema/spec updates  (nothing visible)
//!                                               │
//!                                   Committer ──┼─ sql:  compare-and-set of the metadata location
//!                                               ├─ rest: POST updates + requirements
//!                                               └─ glue: UpdateTable on the table's VersionId
//!                                   (a conflict is retryable: reload, merge, prepare again)
//! ```
//!
//! The exactly-once protocol on top of these (which checkpoint a table holds, what to
//! commit after a crash) is `checkpoint::commit`.

pub mod append;
pub mod evolving;
pub mod glue;
pub mod lists;
pub mod manifest;
pub mod merge;
pub mod replace;
pub mod rest;
pub mod row_delta;
pub mod snapshot;
pub mod sql;

pub use append::{append, without_retries};
pub use evolving::{EvolvingAppend, Prepared, prepare, staged};
pub use glue::GlueCommitter;
pub use rest::RestCommitter;
pub use sql::SqlCommitter;

use std::str::FromStr;

use iceberg::MetadataLocation;
use iceberg::spec::{TableMetadata, TableMetadataRef};
use iceberg::table::Table;

use crate::error::Result;

/// `base` (its identifier and file IO) with other metadata, at `location`.
///
/// Without iceberg-rust's object cache (of manifests and lists, for repeated scans of one
/// `Table`): a commit's table serves the next commit, where building and dropping the cache
/// cost 4% of a job routing to 10,000 tables.
pub fn table_like(
    base: &Table,
    metadata: impl Into<TableMetadataRef>,
    location: Option<&str>,
) -> Result<Table> {
    let mut builder = Table::builder()
        .disable_cache()
        .metadata(metadata)
        .identifier(base.identifier().clone())
        .file_io(base.file_io().clone())
        .runtime(iceberg::Runtime::try_current()?);
    if let Some(location) = location {
        builder = builder.metadata_location(location);
    }
    Ok(builder.build()?)
}

/// A new table `ns.t` of `schema` and `spec` at `location`, read and written through `io`:
/// what the commit and writer tests start from.
#[cfg(test)]
pub fn new_table(
    schema: iceberg::spec::Schema,
    spec: iceberg::spec::UnboundPartitionSpec,
    location: String,
    format: iceberg::spec::FormatVersion,
    io: iceberg::io::FileIO,
) -> Table {
    let metadata = iceberg::spec::TableMetadataBuilder::new(
        schema,
        spec,
        iceberg::spec::SortOrder::unsorted_order(),
        location,
        format,
        std::collections::HashMap::new(),
    )
    .unwrap()
    .build()
    .unwrap()
    .metadata;
    Table::builder()
        .metadata(metadata)
        .identifier(iceberg::TableIdent::from_strs(["ns", "t"]).unwrap())
        .file_io(io)
        .runtime(iceberg::Runtime::try_current().unwrap())
        .build()
        .unwrap()
}

/// Write `metadata` as the next version of `base`'s metadata file (the first, for a table
/// not created yet: see [`SqlCommitter::new_tables`]) and return its location; nothing is
/// visible until a committer makes that location the table's (after
/// [`crate::lake::storage::sync_written`]: like the commit's manifests, the file is not synced
/// on its own).
pub async fn write_next_metadata(base: &Table, metadata: &TableMetadata) -> Result<String> {
    let location = match base.metadata_location() {
        Some(base_location) => MetadataLocation::from_str(base_location)?.with_next_version(),
        None => MetadataLocation::new_with_metadata(metadata.location(), metadata),
    };
    if crate::failpoint::fires(crate::failpoint::IN_METADATA_WRITE) {
        let json = serde_json::to_vec(metadata)
            .map_err(|e| crate::error::Error::Internal(format!("encoding table metadata: {e}")))?;
        let torn = bytes::Bytes::copy_from_slice(&json[..json.len() / 2]);
        base.file_io()
            .new_output(location.to_string())?
            .write(torn)
            .await?;
        crate::failpoint::crash();
    }
    let io = crate::lake::storage::deferring(base.file_io(), metadata.location());
    metadata.write_to(&io, &location).await?;
    Ok(location.to_string())
}

/// floe's commit path to a catalog, by catalog type.
#[derive(Debug)]
pub enum Committer {
    Sql(SqlCommitter),
    Rest(RestCommitter),
    Glue(std::sync::Arc<GlueCommitter>),
}

impl Committer {
    /// Make `prepared` the table's state, unless `base` is no longer current (a retryable
    /// conflict).
    pub async fn commit(&self, base: &Table, prepared: Prepared) -> Result<Table> {
        match self {
            Committer::Sql(c) => c.commit(base, prepared.metadata).await,
            Committer::Rest(c) => {
                crate::lake::storage::sync_written().await?;
                c.commit(base, prepared.updates).await
            }
            Committer::Glue(c) => c.commit(base, prepared.metadata).await,
        }
    }
}
