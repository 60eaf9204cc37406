//! Iceberg's `replace` snapshots, which change how rows are stored and never which rows:
//! data files replaced by others holding the same rows (compaction, [`prepare_rewrite`]),
//! and manifests replaced by others listing the same files ([`prepare_manifest_rewrite`]).
//!
//! ```text
//! base's manifests ─┬─ names none of the files replaced ─> kept as they are
//!                   └─ names some ─> rewritten: those DELETED, the others EXISTING
//!                      (delete manifests too: a position delete file of a replaced file's
//!                      rows is removed with it, its deletes folded into the new files)
//! + a manifest of the new files (with the data sequence number of the snapshot read)
//! -> manifest list -> replace snapshot -> Prepared (nothing visible until committed)
//! ```
//!
//! A rewrite is prepared against the table as it is at commit time, so files appended
//! meanwhile are kept; if a file it read is gone (another rewrite or a delete removed it),
//! preparing fails with [`Error::Conflict`] and nothing is written.

use std::collections::{BTreeMap, HashMap, HashSet};

use iceberg::spec::{
    DataContentType, DataFile, ManifestContentType, ManifestEntry, ManifestFile, Operation,
    SnapshotSummaryCollector,
};
use iceberg::table::Table;

use super::Prepared;
use super::snapshot;
use crate::error::{Error, Result};
use crate::lake::deletes;

/// Data files replaced by files holding the same rows.
#[derive(Debug, Default)]
pub struct Rewrite {
    /// The paths of the files replaced; each must still be live when committed.
    pub removed: HashSet<String>,
    /// The files holding their rows, written with the table's default partition spec.
    pub added: Vec<DataFile>,
    /// The data sequence number of the snapshot the rewrite read: the new files carry it,
    /// so that deletes committed after that snapshot still apply to their rows.
    pub sequence_number: i64,
    /// What earlier attempts wrote, for the next (see [`prepare_rewrite`]).
    pub cache: tokio::sync::Mutex<RewriteCache>,
}

/// A manifest written with some of a table's files marked deleted, and those files (with
/// the id of their partition spec).
pub(super) type Marked = (ManifestFile, Vec<(DataFile, i32)>);

/// The manifests a rewrite wrote, kept across its attempts: all are written for one
/// snapshot id, kept while no snapshot of the table takes it.
#[derive(Debug, Default)]
pub struct RewriteCache {
    id: Option<(i64, uuid::Uuid)>,
    /// By the path of the manifest of the table they replace: the manifest written and the
    /// files it marks deleted (with their spec), or `None` if it lists none of them.
    manifests: HashMap<String, Option<Marked>>,
    /// The manifest of the added files.
    added: Option<ManifestFile>,
    /// The number of the next manifest written.
    next: usize,
}

/// A rewrite that cannot be committed because the table no longer holds what it read.
pub fn conflict(table: &Table, why: String) -> Error {
    Error::Conflict(format!("table {}: {why}", table.identifier()))
}

/// The live entries of the data manifests of `base`'s current snapshot, by manifest, and
/// the other manifests (delete manifests), which rewrites keep.
pub async fn live_data_entries(
    base: &Table,
) -> Result<(Vec<(ManifestFile, Vec<ManifestEntry>)>, Vec<ManifestFile>)> {
    let md = base.metadata();
    let Some(current) = md.current_snapshot() else {
        return Ok((Vec::new(), Vec::new()));
    };
    let list = super::lists::load(base, current).await?;
    let mut data = Vec::new();
    let mut other = Vec::new();
    for file in list.iter() {
        if file.content != ManifestContentType::Data {
            other.push(file.clone());
            continue;
        }
        let manifest = file.load_manifest(base.file_io()).await?;
        let live = manifest
            .entries()
            .iter()
            .filter(|e| e.is_alive())
            .map(|e| e.as_ref().clone())
            .collect();
        data.push((file.clone(), live));
    }
    Ok((data, other))
}

/// The snapshot replacing `rewrite.removed` with `rewrite.added` on top of `base`, written
/// but not committed. Prepared again after another commit won, it reuses what it wrote for
/// the manifests still in the table (an append only adds manifests), so a retry costs the
/// new manifests only. `carried` are position delete files of rows of `rewrite.added`
/// (each with its spec id): deletes committed since the rewrite read its files, of rows it
/// copied, carried over to the copies.
pub async fn prepare_rewrite(
    base: &Table,
    rewrite: &Rewrite,
    carried: &[(DataFile, i32)],
) -> Result<Prepared> {
    let md = base.metadata();
    let Some(current) = md.current_snapshot() else {
        return Err(conflict(
            base,
            "the table has no snapshot any more".to_string(),
        ));
    };
    let mut cache = rewrite.cache.lock().await;
    let (id, commit_id) = match cache.id {
        Some(id) if md.snapshot_by_id(id.0).is_none() => id,
        _ => {
            let id = (snapshot::new_id(md), uuid::Uuid::new_v4());
            *cache = RewriteCache {
                id: Some(id),
                ..RewriteCache::default()
            };
            id
        }
    };
    let list = super::lists::load(base, current).await?;
    let mut manifests = Vec::new();
    let mut removed = Vec::new();
    let mut removed_deletes = Vec::new();
    for file in list.iter() {
        if !cache.manifests.contains_key(&file.manifest_path) {
            let done = rewrite_manifest(base, file, (id, commit_id), cache.next, |e| {
                removes(rewrite, e)
            })
            .await?;
            cache.next += 1;
            cache.manifests.insert(file.manifest_path.clone(), done);
        }
        match &cache.manifests[&file.manifest_path] {
            Some((written, files)) => {
                manifests.push(written.clone());
                if file.content == ManifestContentType::Data {
                    removed.extend(files.iter().cloned());
                } else {
                    removed_deletes.extend(files.iter().cloned());
                }
            }
            None => manifests.push(file.clone()),
        }
    }
    if removed.len() != rewrite.removed.len() {
        return Err(conflict(
            base,
            format!(
                "{} of the {} files this rewrite read are no longer in the table (another \
                 commit removed them); nothing was committed",
                rewrite.removed.len().saturating_sub(removed.len()),
                rewrite.removed.len()
            ),
        ));
    }
    let mut collector = SnapshotSummaryCollector::default();
    for (f, spec_id) in removed.iter().chain(&removed_deletes) {
        let spec = snapshot::spec(md, *spec_id)?;
        collector.remove_file(f, md.current_schema().clone(), spec.clone());
    }
    if !rewrite.added.is_empty() {
        let spec = md.default_partition_spec();
        for f in &rewrite.added {
            collector.add_file(f, md.current_schema().clone(), spec.clone());
        }
        if cache.added.is_none() {
            let mut writer = snapshot::manifest_writer(
                md,
                base.file_io(),
                (id, commit_id),
                cache.next,
                md.default_partition_spec_id(),
                ManifestContentType::Data,
            )
            .await?;
            cache.next += 1;
            for f in &rewrite.added {
                writer.add_file(f.clone(), rewrite.sequence_number)?;
            }
            cache.added = Some(writer.write_manifest_file().await?);
        }
        manifests.extend(cache.added.clone());
    }
    if !carried.is_empty() {
        // Written for this attempt only: what is carried depends on the table as it is.
        let spec_id = md.default_partition_spec_id();
        let spec = md.default_partition_spec();
        let mut writer = snapshot::manifest_writer(
            md,
            base.file_io(),
            (id, commit_id),
            cache.next,
            spec_id,
            ManifestContentType::Deletes,
        )
        .await?;
        cache.next += 1;
        for (f, _) in carried {
            collector.add_file(f, md.current_schema().clone(), spec.clone());
            writer.add_file(f.clone(), -1)?;
        }
        manifests.push(writer.write_manifest_file().await?);
    }
    snapshot::finish(
        base,
        (id, commit_id),
        manifests,
        Operation::Replace,
        collector.build(),
        HashMap::new(),
    )
    .await
}

/// Whether a live manifest entry is one `rewrite` removes: a data file it replaces, or a
/// delete file of the rows of only such a file (its deletes are folded into the new
/// files; left in the table, they would name a file no snapshot holds).
fn removes(rewrite: &Rewrite, e: &ManifestEntry) -> bool {
    let f = &e.data_file;
    match f.content_type() {
        DataContentType::Data => rewrite.removed.contains(f.file_path()),
        _ => deletes::scoped_to(f).is_some_and(|p| rewrite.removed.contains(&p)),
    }
}

/// Manifest `file` with the live entries `removes` picks marked deleted, and those files
/// with their spec; `None` when it lists none of them.
pub(super) async fn rewrite_manifest(
    base: &Table,
    file: &ManifestFile,
    (id, commit_id): (i64, uuid::Uuid),
    n: usize,
    removes: impl Fn(&ManifestEntry) -> bool,
) -> Result<Option<Marked>> {
    let md = base.metadata();
    let manifest = file.load_manifest(base.file_io()).await?;
    let live: Vec<&ManifestEntry> = manifest
        .entries()
        .iter()
        .filter(|e| e.is_alive())
        .map(|e| e.as_ref())
        .collect();
    if !live.iter().any(|e| removes(e)) {
        return Ok(None);
    }
    let ids = (id, commit_id);
    let mut writer = snapshot::manifest_writer(
        md,
        base.file_io(),
        ids,
        n,
        file.partition_spec_id,
        file.content,
    )
    .await?;
    let mut removed = Vec::new();
    for e in live {
        let (seq, file_seq) = sequence_numbers(e)?;
        if removes(e) {
            removed.push((e.data_file.clone(), file.partition_spec_id));
            writer.add_delete_file(e.data_file.clone(), seq, file_seq)?;
        } else {
            let added_by = e.snapshot_id.unwrap_or(file.added_snapshot_id);
            writer.add_existing_file(e.data_file.clone(), added_by, seq, file_seq)?;
        }
    }
    Ok(Some((writer.write_manifest_file().await?, removed)))
}

/// The snapshot listing the same files as `base`'s current one in fewer manifests: the
/// data files of each partition spec in manifests of at most `entries_per_manifest`
/// entries, clustered by partition. Delete manifests are kept as they are.
pub async fn prepare_manifest_rewrite(
    base: &Table,
    entries_per_manifest: usize,
) -> Result<(Prepared, usize, usize)> {
    let md = base.metadata();
    let id = snapshot::new_id(md);
    let commit_id = uuid::Uuid::new_v4();
    let (data, mut manifests) = live_data_entries(base).await?;
    let before = data.len() + manifests.len();
    let mut by_spec: BTreeMap<i32, Vec<(ManifestEntry, i64)>> = BTreeMap::new();
    for (file, entries) in data {
        for e in entries {
            let added_by = e.snapshot_id.unwrap_or(file.added_snapshot_id);
            by_spec
                .entry(file.partition_spec_id)
                .or_default()
                .push((e, added_by));
        }
    }
    let mut n = 0;
    for (spec_id, mut entries) in by_spec {
        // Clustered by partition (Struct has no order; its printed form sorts alike).
        entries.sort_by_cached_key(|(e, _)| {
            (
                format!("{:?}", e.data_file.partition()),
                e.file_path().to_string(),
            )
        });
        for chunk in entries.chunks(entries_per_manifest.max(1)) {
            let mut writer = snapshot::manifest_writer(
                md,
                base.file_io(),
                (id, commit_id),
                n,
                spec_id,
                ManifestContentType::Data,
            )
            .await?;
            n += 1;
            for (e, added_by) in chunk {
                let (seq, file_seq) = sequence_numbers(e)?;
                writer.add_existing_file(e.data_file.clone(), *added_by, seq, file_seq)?;
            }
            manifests.push(writer.write_manifest_file().await?);
        }
    }
    let after = manifests.len();
    let mut props = HashMap::new();
    props.insert("manifests-replaced".to_string(), before.to_string());
    props.insert("manifests-created".to_string(), n.to_string());
    let prepared = snapshot::finish(
        base,
        (id, commit_id),
        manifests,
        Operation::Replace,
        props,
        HashMap::new(),
    )
    .await?;
    Ok((prepared, before, after))
}

/// The data and file sequence numbers of a live entry (inherited when it was loaded).
pub(super) fn sequence_numbers(e: &ManifestEntry) -> Result<(i64, Option<i64>)> {
    let seq = e.sequence_number.ok_or_else(|| {
        Error::Internal(format!(
            "manifest entry {} has no sequence number",
            e.file_path()
        ))
    })?;
    Ok((seq, e.file_sequence_number.or(Some(seq))))
}
