//! Manifests merged as they accumulate, as Iceberg's merge append does
//! (`commit.manifest-merge.enabled`, on by default in Iceberg Java). A job commits each
//! table once per checkpoint, and each commit adds a manifest: without merging, every
//! commit after reads and rewrites a list naming them all, and every scan opens them all.
//! Once a table holds [`MIN_COUNT_TO_MERGE`] small manifests of one kind (data or deletes)
//! and partition spec, the commit that finds them lists their live entries in one manifest
//! instead (as EXISTING, each with its sequence numbers and the snapshot that added it, so
//! deletes apply to the same rows as before). A commit's work stays bounded however long
//! the table's history: the small manifests are read once per hundred commits, never all
//! on every commit.
//!
//! ```text
//! base's manifests ─┬─ large (>= TARGET_SIZE), or fewer than 100 small of their kind ─> kept
//!                   └─ 100 or more small of one kind and spec ─> one manifest of their live entries
//! + this commit's own manifests -> manifest list
//! ```

use std::collections::BTreeMap;

use iceberg::io::FileIO;
use iceberg::spec::{ManifestContentType, ManifestFile, TableMetadata};

use super::replace::sequence_numbers;
use super::snapshot;
use crate::error::Result;

/// Small manifests of one kind and spec merged once there are this many (Iceberg's
/// `commit.manifest.min-count-to-merge`).
pub const MIN_COUNT_TO_MERGE: usize = 100;

/// A manifest this large (bytes) is not merged (Iceberg's
/// `commit.manifest.target-size-bytes`).
pub const TARGET_SIZE: i64 = 8 << 20;

/// Manifests read at once while merging.
const READS_AT_ONCE: usize = 8;

/// `kept` (the base snapshot's manifests a commit keeps) with the small ones of each kind
/// and partition spec merged into one manifest of snapshot `ids` wherever there are
/// [`MIN_COUNT_TO_MERGE`] of them; `n` numbers the manifests written (and is advanced).
/// `md` is the table as the commit leaves it (its current schema goes in the manifests).
pub async fn merge_small(
    md: &TableMetadata,
    io: &FileIO,
    kept: Vec<ManifestFile>,
    ids: (i64, uuid::Uuid),
    n: &mut usize,
) -> Result<Vec<ManifestFile>> {
    let mut groups: BTreeMap<(bool, i32), Vec<usize>> = BTreeMap::new();
    for (i, file) in kept.iter().enumerate() {
        if file.manifest_length < TARGET_SIZE {
            let data = file.content == ManifestContentType::Data;
            groups
                .entry((data, file.partition_spec_id))
                .or_default()
                .push(i);
        }
    }
    groups.retain(|_, group| group.len() >= MIN_COUNT_TO_MERGE);
    if groups.is_empty() {
        return Ok(kept);
    }
    let mut merged = vec![false; kept.len()];
    let mut out = Vec::new();
    for group in groups.values() {
        let first = &kept[group[0]];
        let mut loaded = Vec::with_capacity(group.len());
        for chunk in group.chunks(READS_AT_ONCE) {
            let reads = chunk.iter().map(|&i| kept[i].load_manifest(io));
            loaded.extend(futures::future::try_join_all(reads).await?);
        }
        let mut writer =
            snapshot::manifest_writer(md, io, ids, *n, first.partition_spec_id, first.content)?;
        *n += 1;
        let mut entries = 0;
        for (&i, manifest) in group.iter().zip(&loaded) {
            let file = &kept[i];
            for e in manifest.entries().iter().filter(|e| e.is_alive()) {
                let (seq, file_seq) = sequence_numbers(e)?;
                let added_by = e.snapshot_id.unwrap_or(file.added_snapshot_id);
                writer.add_existing_file(e.data_file.clone(), added_by, seq, file_seq)?;
                entries += 1;
            }
        }
        for &i in group {
            merged[i] = true;
        }
        if entries > 0 {
            out.push(writer.write_manifest_file().await?);
        }
    }
    out.extend(
        kept.into_iter()
            .zip(merged)
            .filter(|(_, merged)| !merged)
            .map(|(file, _)| file),
    );
    Ok(out)
}
