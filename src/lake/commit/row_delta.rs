//! Row-level changes (`DELETE`, `UPDATE`, `MERGE INTO`, upserts): position delete files
//! (v2) or deletion vectors (v3) removing rows of existing data files, and data files adding
//! rows, in one snapshot.
//!
//! ```text
//! base's manifests (kept as they are; in v3, delete manifests naming a deletion vector of a
//!   file this delta gives a new one are rewritten with it marked deleted)
//! + a delete manifest per partition spec of the delete files
//! + a data manifest of the added files
//! -> manifest list -> `delete` (deletes only), `append` (rows only) or `overwrite` snapshot
//!    (with a schema and spec change first, for a keyed table's evolved rows)
//! -> Prepared
//! ```
//!
//! The rows deleted were found in the snapshot `read_snapshot`; the delta is valid on the
//! table as it is only if every snapshot since then is an append (which adds rows and
//! removes none). Otherwise a file whose rows it deletes may be gone (compacted), or another
//! statement may have deleted the same rows: preparing fails with [`Error::Conflict`] and the
//! statement is planned again on the newer table.

use std::collections::{BTreeMap, HashMap, HashSet};

use iceberg::spec::{
    DataFile, FormatVersion, ManifestContentType, ManifestEntry, Operation, Schema,
    SnapshotSummaryCollector, UnboundPartitionSpec,
};
use iceberg::table::Table;

use super::Prepared;
use super::replace::{conflict, rewrite_manifest};
use super::snapshot;
use crate::error::{Error, Result};
use crate::lake::deletes;

/// Rows removed from and added to a table.
#[derive(Debug, Default)]
pub struct RowDelta {
    /// Position delete files, each of rows of one data file, with the id of its
    /// partition spec.
    pub deletes: Vec<(DataFile, i32)>,
    /// Data files of rows added, written with the table's default partition spec.
    pub added: Vec<DataFile>,
    /// The snapshot the deleted rows were read from (`None`: the table had none).
    pub read_snapshot: Option<i64>,
    /// More snapshot summary properties.
    pub summary: HashMap<String, String>,
    /// Table properties the commit sets.
    pub properties: HashMap<String, String>,
}

impl RowDelta {
    pub fn is_empty(&self) -> bool {
        self.deletes.is_empty() && self.added.is_empty()
    }
}

/// Fails with [`Error::Conflict`] unless every snapshot of `base` after `read` (back along
/// its `main` history) is an append.
pub fn only_appends_since(base: &Table, read: Option<i64>) -> Result<()> {
    let md = base.metadata();
    let mut at = md.current_snapshot();
    while let Some(s) = at {
        if Some(s.snapshot_id()) == read {
            return Ok(());
        }
        if s.summary().operation != Operation::Append {
            return Err(conflict(
                base,
                format!(
                    "snapshot {} ({}) changed rows after this statement read them; it is \
                     planned again",
                    s.snapshot_id(),
                    s.summary().operation.as_str()
                ),
            ));
        }
        at = s.parent_snapshot_id().and_then(|p| md.snapshot_by_id(p));
    }
    match read {
        None => Ok(()),
        Some(id) => Err(conflict(
            base,
            format!("snapshot {id}, which this statement read, is no longer in its history"),
        )),
    }
}

/// [`prepare_row_delta`] with a schema and partition-spec change in the same snapshot (the
/// added files written for the table with them: a keyed table whose rows evolved).
pub async fn prepare_evolving_row_delta(
    base: &Table,
    delta: &RowDelta,
    schema: Option<Schema>,
    spec: Option<UnboundPartitionSpec>,
) -> Result<Prepared> {
    let mut updates = super::evolving::schema_updates(schema.clone(), spec.clone());
    if updates.is_empty() {
        return prepare_row_delta(base, delta).await;
    }
    let stage = super::staged(base, schema, spec)?;
    let prepared = prepare_row_delta(&stage, delta).await?;
    updates.extend(prepared.updates);
    Prepared::of(base, updates)
}

/// The snapshot applying `delta` on top of `base`, written but not committed.
pub async fn prepare_row_delta(base: &Table, delta: &RowDelta) -> Result<Prepared> {
    if delta.is_empty() {
        return Err(Error::Internal("a row delta without files".into()));
    }
    only_appends_since(base, delta.read_snapshot)?;
    let md = base.metadata();
    let id = snapshot::new_id(md);
    let commit_id = uuid::Uuid::new_v4();
    let io = base.file_io();
    let mut manifests = Vec::new();
    let mut collector = SnapshotSummaryCollector::default();
    let schema = md.current_schema().clone();
    let mut n = 0;
    // A v3 data file has one deletion vector: the one this delta adds replaces (holds the
    // deletes of) every delete file scoped to that file, removed here.
    let replaced: HashSet<String> = if md.format_version() >= FormatVersion::V3 {
        delta
            .deletes
            .iter()
            .filter_map(|(d, _)| d.referenced_data_file())
            .collect()
    } else {
        HashSet::new()
    };
    if let Some(current) = md.current_snapshot() {
        let list = super::lists::load(base, current).await?;
        let mut kept = Vec::new();
        for file in list.iter() {
            if replaced.is_empty() || file.content != ManifestContentType::Deletes {
                kept.push(file.clone());
                continue;
            }
            let scoped = |e: &ManifestEntry| {
                deletes::scoped_to(&e.data_file).is_some_and(|p| replaced.contains(&p))
            };
            match rewrite_manifest(base, file, (id, commit_id), n, scoped).await? {
                Some((written, removed)) => {
                    n += 1;
                    manifests.push(written);
                    for (f, spec_id) in removed {
                        let spec = snapshot::spec(md, spec_id)?;
                        collector.remove_file(&f, schema.clone(), spec.clone());
                    }
                }
                None => kept.push(file.clone()),
            }
        }
        let ids = (id, commit_id);
        manifests.extend(super::merge::merge_small(md, io, kept, ids, &mut n).await?);
    }
    let mut by_spec: BTreeMap<i32, Vec<&DataFile>> = BTreeMap::new();
    for (d, spec_id) in &delta.deletes {
        by_spec.entry(*spec_id).or_default().push(d);
    }
    for (spec_id, files) in by_spec {
        let spec = snapshot::spec(md, spec_id)?;
        let mut writer = snapshot::manifest_writer(
            md,
            io,
            (id, commit_id),
            n,
            spec_id,
            ManifestContentType::Deletes,
        )
        .await?;
        n += 1;
        for f in files {
            collector.add_file(f, schema.clone(), spec.clone());
            // A negative sequence number: the entry inherits the snapshot's.
            writer.add_file(f.clone(), -1)?;
        }
        manifests.push(writer.write_manifest_file().await?);
    }
    if !delta.added.is_empty() {
        let spec = md.default_partition_spec();
        let mut writer = snapshot::manifest_writer(
            md,
            io,
            (id, commit_id),
            n,
            md.default_partition_spec_id(),
            ManifestContentType::Data,
        )
        .await?;
        for f in &delta.added {
            collector.add_file(f, schema.clone(), spec.clone());
            writer.add_file(f.clone(), -1)?;
        }
        manifests.push(writer.write_manifest_file().await?);
    }
    let mut props = delta.summary.clone();
    props.extend(collector.build());
    let operation = if delta.added.is_empty() {
        Operation::Delete
    } else if delta.deletes.is_empty() {
        Operation::Append
    } else {
        Operation::Overwrite
    };
    snapshot::finish(
        base,
        (id, commit_id),
        manifests,
        operation,
        props,
        delta.properties.clone(),
    )
    .await
}
