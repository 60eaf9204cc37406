//! The part of every snapshot floe builds itself (evolving appends, rewrites): a fresh id,
//! the manifest list naming its manifests, and the updates that make it `main`.

use std::collections::HashMap;

use iceberg::TableUpdate;
use iceberg::io::FileIO;
use iceberg::spec::{
    DataFileFormat, FormatVersion, MAIN_BRANCH, ManifestContentType, ManifestFile,
    ManifestListWriter, Operation, PartitionSpecRef, Snapshot, SnapshotReference,
    SnapshotRetention, Summary, TableMetadata,
};
use iceberg::table::Table;

use super::lists::{self, ListHeader};
use super::manifest::{ManifestWriter, Target};
use crate::error::{Error, Result};

/// A snapshot id no snapshot of `md` has.
pub fn new_id(md: &TableMetadata) -> i64 {
    loop {
        let (a, b) = uuid::Uuid::new_v4().as_u64_pair();
        let id = ((a ^ b) >> 1) as i64;
        if md.snapshot_by_id(id).is_none() {
            return id;
        }
    }
}

/// What a snapshot following the table's current one holds.
pub struct NewSnapshot {
    pub id: i64,
    /// Names this commit's files (manifests and the list) apart from others'.
    pub commit_id: uuid::Uuid,
    pub manifests: Vec<ManifestFile>,
    pub summary: Summary,
    pub schema_id: i32,
}

/// Where a commit's manifests go: `<table>/metadata/<commit>-m<n>.avro`.
pub fn manifest_path(md: &TableMetadata, commit_id: uuid::Uuid, n: usize) -> String {
    format!(
        "{}/metadata/{commit_id}-m{n}.{}",
        md.location(),
        DataFileFormat::Avro
    )
}

/// A writer of manifest `n` of commit `commit_id` (snapshot `id`) of a table whose
/// metadata is `md` (the schema is its current one), for data or delete files (`content`)
/// of partition spec `spec_id`.
pub async fn manifest_writer(
    md: &TableMetadata,
    io: &FileIO,
    (id, commit_id): (i64, uuid::Uuid),
    n: usize,
    spec_id: i32,
    content: ManifestContentType,
) -> Result<ManifestWriter> {
    ManifestWriter::new(Target {
        // Synced with the rest of the commit, before the catalog names it.
        output: crate::lake::storage::deferring(io, md.location())
            .new_output(manifest_path(md, commit_id, n))?,
        snapshot_id: id,
        schema: md.current_schema(),
        spec: spec(md, spec_id)?,
        format_version: md.format_version(),
        content,
    })
    .await
}

/// The table's partition spec `spec_id` (files name the spec they were written with).
pub fn spec(md: &TableMetadata, spec_id: i32) -> Result<&PartitionSpecRef> {
    md.partition_spec_by_id(spec_id).ok_or_else(|| {
        Error::Internal(format!(
            "the table at {} has no partition spec {spec_id}",
            md.location()
        ))
    })
}

/// Write the manifest list of `new` and return the snapshot naming it (committing nothing).
///
/// In a format-version 3 table the list gives each data manifest without one its first row
/// id (row lineage), counting on from the table's `next-row-id`, and the snapshot records
/// the range it assigned, as the spec requires of every v3 snapshot.
pub async fn write(base: &Table, new: NewSnapshot) -> Result<Snapshot> {
    let md = base.metadata();
    let sequence_number = md.next_sequence_number();
    let list_path = format!(
        "{}/metadata/snap-{}-0-{}.{}",
        md.location(),
        new.id,
        new.commit_id,
        DataFileFormat::Avro
    );
    let output =
        crate::lake::storage::deferring(base.file_io(), md.location()).new_output(&list_path)?;
    let first_row_id = md.next_row_id();
    let v3 = md.format_version() >= FormatVersion::V3;
    let header = ListHeader {
        format: md.format_version(),
        snapshot_id: new.id,
        parent_snapshot_id: md.current_snapshot_id(),
        sequence_number,
        first_row_id: v3.then_some(first_row_id),
    };
    // Assigned here, so that what is kept is what the file holds (iceberg-rust's writer
    // leaves assigned numbers alone).
    let mut manifests = new.manifests;
    let next_row_id = lists::assign(
        header.format,
        new.id,
        sequence_number,
        header.first_row_id,
        &mut manifests,
    )?;
    match lists::encode(&header, &manifests).await? {
        Some(bytes) => output.write(bytes.into()).await?,
        None => {
            let out = output.writer().await?;
            let (id, parent) = (new.id, header.parent_snapshot_id);
            let mut list = match header.first_row_id {
                Some(first) => {
                    ManifestListWriter::v3(out, id, parent, sequence_number, Some(first))
                }
                None => ManifestListWriter::v2(out, id, parent, sequence_number),
            };
            list.add_manifests(manifests.iter().cloned())?;
            list.close().await?;
        }
    }
    let parent = md.current_snapshot().map(|s| s.manifest_list());
    lists::keep(&list_path, parent, manifests);
    let snapshot = Snapshot::builder()
        .with_snapshot_id(new.id)
        .with_parent_snapshot_id(md.current_snapshot_id())
        .with_sequence_number(sequence_number)
        .with_timestamp_ms(chrono::Utc::now().timestamp_millis())
        .with_manifest_list(list_path)
        .with_summary(new.summary)
        .with_schema_id(new.schema_id);
    Ok(match next_row_id {
        Some(next) => snapshot
            .with_row_range(first_row_id, next - first_row_id)
            .build(),
        None => snapshot.build(),
    })
}

/// The updates adding `snapshot` and making it the head of `main`.
pub fn updates(snapshot: Snapshot) -> [TableUpdate; 2] {
    let id = snapshot.snapshot_id();
    [
        TableUpdate::AddSnapshot { snapshot },
        TableUpdate::SetSnapshotRef {
            ref_name: MAIN_BRANCH.to_string(),
            reference: SnapshotReference::new(id, SnapshotRetention::branch(None, None, None)),
        },
    ]
}

/// The commit of a snapshot of `operation` after `base`'s current one, naming `manifests`,
/// with `props` (what it changed) and the totals in its summary, and setting the table
/// properties `properties`: its manifest list is written, nothing is committed.
pub async fn finish(
    base: &Table,
    (id, commit_id): (i64, uuid::Uuid),
    manifests: Vec<ManifestFile>,
    operation: Operation,
    mut props: HashMap<String, String>,
    properties: HashMap<String, String>,
) -> Result<super::Prepared> {
    let md = base.metadata();
    add_totals(md, &mut props);
    let snapshot = write(
        base,
        NewSnapshot {
            id,
            commit_id,
            manifests,
            summary: Summary {
                operation,
                additional_properties: props,
            },
            schema_id: md.current_schema_id(),
        },
    )
    .await?;
    let mut all = Vec::new();
    if !properties.is_empty() {
        all.push(TableUpdate::SetProperties {
            updates: properties,
        });
    }
    all.extend(updates(snapshot));
    super::Prepared::of(base, all)
}

/// The commit of `snapshot` on top of `base`: it added and made the head of `main`.
pub fn prepared(base: &Table, snapshot: Snapshot) -> Result<super::Prepared> {
    super::Prepared::of(base, updates(snapshot).into())
}

/// Iceberg's `total-*` summary keys for a snapshot after `base`'s current one whose summary
/// `props` holds the `added-*` / `deleted-*` / `removed-*` counts of what it changed.
pub fn add_totals(base: &TableMetadata, props: &mut HashMap<String, String>) {
    let previous = base
        .current_snapshot()
        .map(|s| s.summary().additional_properties.clone())
        .unwrap_or_default();
    let number = |map: &HashMap<String, String>, k: &str| {
        map.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
    };
    for (total, added, removed) in [
        ("total-records", "added-records", "deleted-records"),
        ("total-data-files", "added-data-files", "deleted-data-files"),
        ("total-files-size", "added-files-size", "removed-files-size"),
        (
            "total-delete-files",
            "added-delete-files",
            "removed-delete-files",
        ),
        (
            "total-position-deletes",
            "added-position-deletes",
            "removed-position-deletes",
        ),
        (
            "total-equality-deletes",
            "added-equality-deletes",
            "removed-equality-deletes",
        ),
    ] {
        let v = (number(&previous, total) + number(props, added))
            .saturating_sub(number(props, removed));
        props.insert(total.to_string(), v.to_string());
    }
}
