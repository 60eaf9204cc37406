//! An append iceberg-rust has no action for: a new schema and/or partition spec together
//! with the snapshot that first uses them, built as one set of table updates.
//!
//! ```text
//! base metadata --AddSchema/SetCurrentSchema, AddSpec/SetDefaultSpec--> staged metadata
//!     (data files are written against the staged schema and spec)
//! manifest of the new files + the base snapshot's manifests -> manifest list -> snapshot
//! base --[schema, spec, snapshot, main ref]--> Prepared { updates, metadata }
//! ```
//!
//! [`prepare`] writes the manifests and commits nothing; a [`super::Committer`] makes the
//! result current.

use std::collections::HashMap;

use iceberg::TableUpdate;
use iceberg::spec::{
    DataFile, FormatVersion, Operation, Schema, SnapshotSummaryCollector, Summary, TableMetadata,
    UnboundPartitionSpec,
};
use iceberg::table::Table;

use crate::error::{Error, Result};

/// What to commit.
#[derive(Debug, Default)]
pub struct EvolvingAppend {
    /// The new current schema (with field ids assigned), if the schema changes.
    pub schema: Option<Schema>,
    /// The new default partition spec, if it changes.
    pub spec: Option<UnboundPartitionSpec>,
    /// Data files, per id of the partition spec they were written with (the staged table's
    /// default spec, or an older one of the table).
    pub files: Vec<(i32, Vec<DataFile>)>,
    /// Extra snapshot summary properties.
    pub summary: HashMap<String, String>,
    /// Table properties set in the same commit.
    pub properties: HashMap<String, String>,
}

/// `base` with the schema and spec changes of `append` applied: the table the new data
/// files must be written against.
pub fn staged(
    base: &Table,
    schema: Option<Schema>,
    spec: Option<UnboundPartitionSpec>,
) -> Result<Table> {
    if schema.is_none() && spec.is_none() {
        // (A table built anew costs a metadata cache of its own, a few KiB.)
        return Ok(base.clone());
    }
    let metadata = evolve(base, schema, spec)?;
    super::table_like(base, metadata, base.metadata_location())
}

pub fn schema_updates(
    schema: Option<Schema>,
    spec: Option<UnboundPartitionSpec>,
) -> Vec<TableUpdate> {
    let mut updates = Vec::new();
    if let Some(schema) = schema {
        updates.push(TableUpdate::AddSchema { schema });
        updates.push(TableUpdate::SetCurrentSchema { schema_id: -1 });
    }
    if let Some(spec) = spec {
        updates.push(TableUpdate::AddSpec { spec });
        updates.push(TableUpdate::SetDefaultSpec { spec_id: -1 });
    }
    updates
}

fn apply(base: &Table, updates: Vec<TableUpdate>) -> Result<TableMetadata> {
    let mut builder = base
        .metadata()
        .clone()
        .into_builder(base.metadata_location().map(str::to_string));
    for u in updates {
        builder = u.apply(builder)?;
    }
    Ok(builder.build()?.metadata)
}

fn evolve(
    base: &Table,
    schema: Option<Schema>,
    spec: Option<UnboundPartitionSpec>,
) -> Result<TableMetadata> {
    apply(base, schema_updates(schema, spec))
}

/// The summary of a snapshot adding `files` after `base`'s current one: Iceberg's standard
/// added-* and total-* keys, and `extra`.
fn summary(
    staged: &TableMetadata,
    base: &TableMetadata,
    files: &[(i32, Vec<DataFile>)],
    extra: HashMap<String, String>,
) -> Summary {
    let mut collector = SnapshotSummaryCollector::default();
    for (spec_id, group) in files {
        let spec = staged
            .partition_spec_by_id(*spec_id)
            .cloned()
            .unwrap_or_else(|| staged.default_partition_spec().clone());
        for f in group {
            collector.add_file(f, staged.current_schema().clone(), spec.clone());
        }
    }
    let mut props = extra;
    props.extend(collector.build());
    super::snapshot::add_totals(base, &mut props);
    Summary {
        operation: Operation::Append,
        additional_properties: props,
    }
}

/// A commit ready to send: the updates to `base` and the metadata they give.
#[derive(Debug)]
pub struct Prepared {
    pub updates: Vec<TableUpdate>,
    pub metadata: TableMetadata,
}

impl Prepared {
    /// The commit of `updates` to `base`.
    pub fn of(base: &Table, updates: Vec<TableUpdate>) -> Result<Self> {
        let metadata = apply(base, updates.clone())?;
        Ok(Self { updates, metadata })
    }
}

/// Build the new metadata: `base` plus the schema/spec changes plus a snapshot appending
/// `append.files`. Writes the manifest and manifest list; commits nothing.
pub async fn prepare(base: &Table, append: EvolvingAppend) -> Result<Prepared> {
    if append.files.iter().all(|(_, f)| f.is_empty()) {
        return Err(Error::Internal("an evolving append without files".into()));
    }
    let md = base.metadata();
    if md.format_version() == FormatVersion::V1 {
        return Err(Error::Unsupported(format!(
            "schema or partition evolution of format-version 1 table {}",
            base.identifier()
        )));
    }
    let updates = schema_updates(append.schema, append.spec);
    let staged = apply(base, updates.clone())?;
    let snapshot_id = super::snapshot::new_id(md);
    let commit_id = uuid::Uuid::new_v4();
    let io = base.file_io();
    let summary = summary(&staged, md, &append.files, append.summary);
    let mut written = Vec::new();
    let mut next = append.files.len();
    for (n, (spec_id, files)) in append.files.into_iter().enumerate() {
        if files.is_empty() {
            continue;
        }
        let mut writer = super::snapshot::manifest_writer(
            &staged,
            io,
            (snapshot_id, commit_id),
            n,
            spec_id,
            iceberg::spec::ManifestContentType::Data,
        )
        .await?;
        for f in files {
            // A negative sequence number: the entry inherits the snapshot's (format v2+).
            writer.add_file(f, -1)?;
        }
        written.push(writer.write_manifest_file().await?);
    }
    let mut manifests = Vec::new();
    if md.current_snapshot().is_some() {
        let ids = (snapshot_id, commit_id);
        let kept = super::lists::current(base).await?.to_vec();
        manifests = super::merge::merge_small(&staged, io, kept, ids, &mut next).await?;
    }
    manifests.extend(written);
    let snapshot = super::snapshot::write(
        base,
        super::snapshot::NewSnapshot {
            id: snapshot_id,
            commit_id,
            manifests,
            summary,
            schema_id: staged.current_schema_id(),
        },
    )
    .await?;
    let mut all = updates;
    if !append.properties.is_empty() {
        all.push(TableUpdate::SetProperties {
            updates: append.properties,
        });
    }
    all.extend(super::snapshot::updates(snapshot));
    let metadata = apply(base, all.clone())?;
    Ok(Prepared {
        updates: all,
        metadata,
    })
}
