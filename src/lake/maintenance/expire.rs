//! Snapshot expiry (`expire_snapshots`): snapshots older than a time, beyond the newest
//! ones kept, removed from the table's metadata, then the files no remaining snapshot
//! reaches deleted.
//!
//! ```text
//! expired = snapshots older than `older_than`, except the current one, every branch and
//!           tag head, and the `retain_last` newest ancestors of main
//! commit RemoveSnapshots (prepared on the table as it is)
//! then delete: manifest lists of the expired; their manifests no kept snapshot lists;
//!              files in those manifests no kept snapshot's manifest holds live
//! ```
//!
//! Files are deleted only after the commit, so a crash leaves at worst orphans (which
//! `remove_orphan_files` finds), never a snapshot missing its files. floe's exactly-once
//! marks are table properties as well as summaries, so expiry never loses a job's place.

use std::collections::HashSet;

use iceberg::TableUpdate;
use iceberg::spec::{DataContentType, ManifestContentType, TableMetadata};
use iceberg::table::Table;

use super::Maintained;
use crate::error::Result;
use crate::lake::commit::Prepared;

/// Which snapshots to expire.
#[derive(Debug, Clone)]
pub struct ExpireOptions {
    /// Snapshots committed before this (ms since the epoch) may expire.
    pub older_than_ms: i64,
    /// The newest ancestors of main always kept, however old.
    pub retain_last: usize,
}

/// What an expiry removed.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Expired {
    pub snapshots: u64,
    pub data_files: u64,
    pub position_delete_files: u64,
    pub equality_delete_files: u64,
    pub manifests: u64,
    pub manifest_lists: u64,
}

/// Expire `table`'s snapshots (see the module doc).
pub async fn expire_snapshots(table: &Maintained, options: &ExpireOptions) -> Result<Expired> {
    let committed = table
        .commit(|base| async move {
            let ids = expired(base.metadata(), options);
            if ids.is_empty() {
                return Ok(None);
            }
            let updates = vec![TableUpdate::RemoveSnapshots {
                snapshot_ids: ids.clone(),
            }];
            Ok(Some((Prepared::of(&base, updates)?, (base, ids))))
        })
        .await?;
    let Some((after, (before, ids))) = committed else {
        return Ok(Expired::default());
    };
    delete_unreachable(&before, &after, &ids).await
}

/// The ids of the snapshots of `md` that `options` expire.
fn expired(md: &TableMetadata, options: &ExpireOptions) -> Vec<i64> {
    let mut keep = ref_heads(md);
    let mut at = md.current_snapshot();
    let mut kept = 0;
    while let Some(s) = at {
        if kept >= options.retain_last.max(1) {
            break;
        }
        keep.insert(s.snapshot_id());
        kept += 1;
        at = s.parent_snapshot_id().and_then(|p| md.snapshot_by_id(p));
    }
    let mut ids: Vec<i64> = md
        .snapshots()
        .filter(|s| !keep.contains(&s.snapshot_id()) && s.timestamp_ms() < options.older_than_ms)
        .map(|s| s.snapshot_id())
        .collect();
    ids.sort_unstable();
    ids
}

/// The snapshots every branch and tag names (iceberg-rust has no accessor for the refs;
/// they are read from the metadata's own JSON form).
fn ref_heads(md: &TableMetadata) -> HashSet<i64> {
    let json = serde_json::to_value(md).unwrap_or_default();
    let mut heads: HashSet<i64> = json
        .get("refs")
        .and_then(|r| r.as_object())
        .map(|refs| {
            refs.values()
                .filter_map(|r| r.get("snapshot-id").and_then(|id| id.as_i64()))
                .collect()
        })
        .unwrap_or_default();
    heads.extend(md.current_snapshot_id());
    heads
}

/// Delete the files of `before`'s snapshots `ids` that no snapshot of `after` reaches.
async fn delete_unreachable(before: &Table, after: &Table, ids: &[i64]) -> Result<Expired> {
    let io = after.file_io();
    let mut kept_lists = HashSet::new();
    let mut kept_manifests = HashSet::new();
    let mut kept_files = HashSet::new();
    for s in after.metadata().snapshots() {
        kept_lists.insert(s.manifest_list().to_string());
        let list = after.manifest_list_reader(s).load().await?;
        for m in list.entries() {
            if kept_manifests.insert(m.manifest_path.clone()) {
                let manifest = m.load_manifest(io).await?;
                kept_files.extend(
                    manifest
                        .entries()
                        .iter()
                        .filter(|e| e.is_alive())
                        .map(|e| e.file_path().to_string()),
                );
            }
        }
    }
    let mut out = Expired {
        snapshots: ids.len() as u64,
        ..Expired::default()
    };
    let mut gone_manifests = HashSet::new();
    let mut gone_files = HashSet::new();
    for id in ids {
        let Some(s) = before.metadata().snapshot_by_id(*id) else {
            continue;
        };
        let list = before.manifest_list_reader(s).load().await?;
        for m in list.entries() {
            if kept_manifests.contains(&m.manifest_path)
                || !gone_manifests.insert(m.manifest_path.clone())
            {
                continue;
            }
            let manifest = m.load_manifest(io).await?;
            for e in manifest.entries() {
                let path = e.file_path().to_string();
                if kept_files.contains(&path) || !gone_files.insert(path.clone()) {
                    continue;
                }
                io.delete(&path).await?;
                match (m.content, e.content_type()) {
                    (ManifestContentType::Data, _) => out.data_files += 1,
                    (_, DataContentType::EqualityDeletes) => out.equality_delete_files += 1,
                    _ => out.position_delete_files += 1,
                }
            }
            io.delete(&m.manifest_path).await?;
            out.manifests += 1;
        }
        if !kept_lists.contains(s.manifest_list()) {
            io.delete(s.manifest_list()).await?;
            out.manifest_lists += 1;
        }
    }
    Ok(out)
}
