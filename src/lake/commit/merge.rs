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
//!
//! Iceberg's table properties say when: `commit.manifest-merge.enabled` (`false`: never),
//! `commit.manifest.min-count-to-merge` and `commit.manifest.target-size-bytes`. Where the
//! count is not set, each table's lies between 100 and 150, fixed by its UUID: the tables a
//! job commits together grow in step, and with one count for all they would all merge in
//! the same checkpoint (at 100 tables, seconds of reading every hundred checkpoints); spread
//! out, a checkpoint merges a table or two.

use std::collections::{BTreeMap, HashMap};

use iceberg::io::FileIO;
use iceberg::spec::{ManifestContentType, ManifestFile, TableMetadata};

use super::replace::sequence_numbers;
use super::snapshot;
use crate::error::Result;

/// Small manifests of one kind and spec merged once there are this many (Iceberg's
/// `commit.manifest.min-count-to-merge`); where the table does not set it, up to half as
/// many more (see the module's notes).
pub const MIN_COUNT_TO_MERGE: usize = 100;

/// A manifest this large (bytes) is not merged (Iceberg's
/// `commit.manifest.target-size-bytes`).
pub const TARGET_SIZE: i64 = 8 << 20;

const ENABLED: &str = "commit.manifest-merge.enabled";
const MIN_COUNT: &str = "commit.manifest.min-count-to-merge";
const TARGET_SIZE_BYTES: &str = "commit.manifest.target-size-bytes";

/// When a table's small manifests are merged: how many of a kind, and below what size a
/// manifest counts as small; `None` when the table turns merging off. A property that does
/// not parse counts as unset (a tuning knob never fails a commit).
pub fn when_to_merge(
    properties: &HashMap<String, String>,
    table: uuid::Uuid,
) -> Option<(usize, i64)> {
    let get = |name: &str| properties.get(name).map(|v| v.trim());
    if get(ENABLED).is_some_and(|v| v.eq_ignore_ascii_case("false")) {
        return None;
    }
    let count = get(MIN_COUNT)
        .and_then(|v| v.parse::<usize>().ok())
        .map(|n| n.max(2))
        .unwrap_or_else(|| {
            let spread = (MIN_COUNT_TO_MERGE / 2) as u128;
            MIN_COUNT_TO_MERGE + (table.as_u128() % spread) as usize
        });
    let size = get(TARGET_SIZE_BYTES)
        .and_then(|v| v.parse::<i64>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(TARGET_SIZE);
    Some((count, size))
}

/// Manifests read at once while merging.
const READS_AT_ONCE: usize = 8;

/// `kept` (the base snapshot's manifests a commit keeps) with the small ones of each kind
/// and partition spec merged into one manifest of snapshot `ids` wherever there are enough
/// of them ([`when_to_merge`]); `n` numbers the manifests written (and is advanced).
/// `md` is the table as the commit leaves it (its current schema goes in the manifests).
pub async fn merge_small(
    md: &TableMetadata,
    io: &FileIO,
    kept: Vec<ManifestFile>,
    ids: (i64, uuid::Uuid),
    n: &mut usize,
) -> Result<Vec<ManifestFile>> {
    let Some((min_count, target_size)) = when_to_merge(md.properties(), md.uuid()) else {
        return Ok(kept);
    };
    let mut groups: BTreeMap<(bool, i32), Vec<usize>> = BTreeMap::new();
    for (i, file) in kept.iter().enumerate() {
        if file.manifest_length < target_size {
            let data = file.content == ManifestContentType::Data;
            groups
                .entry((data, file.partition_spec_id))
                .or_default()
                .push(i);
        }
    }
    groups.retain(|_, group| group.len() >= min_count);
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
            snapshot::manifest_writer(md, io, ids, *n, first.partition_spec_id, first.content)
                .await?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_merge_at_their_own_count_unless_told() {
        let none = HashMap::new();
        let counts: std::collections::BTreeSet<usize> = (0..200)
            .map(|_| when_to_merge(&none, uuid::Uuid::new_v4()).unwrap())
            .map(|(count, size)| {
                assert_eq!(size, TARGET_SIZE);
                count
            })
            .collect();
        assert!(counts.iter().all(|c| (100..150).contains(c)), "{counts:?}");
        assert!(counts.len() > 20, "spread: {counts:?}");
        let table = uuid::Uuid::new_v4();
        assert_eq!(when_to_merge(&none, table), when_to_merge(&none, table));
        let set = |pairs: &[(&str, &str)]| {
            let properties = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            when_to_merge(&properties, table)
        };
        assert_eq!(
            set(&[(MIN_COUNT, "100"), (TARGET_SIZE_BYTES, "1024")]),
            Some((100, 1024))
        );
        assert_eq!(set(&[(ENABLED, "false"), (MIN_COUNT, "100")]), None);
        assert_eq!(
            set(&[(ENABLED, "true"), (MIN_COUNT, "7")]),
            Some((7, TARGET_SIZE))
        );
        assert_eq!(set(&[(MIN_COUNT, "many")]), set(&[]));
    }
}
