//! Manifest rewrite (`rewrite_manifests`): the one-manifest-per-commit growth of a table
//! that commits often, merged into few manifests clustered by partition (see
//! `lake::commit::replace::prepare_manifest_rewrite`).

use iceberg::spec::FormatVersion;

use super::Maintained;
use crate::error::{Error, Result};
use crate::lake::commit::replace::prepare_manifest_rewrite;

/// Data file entries per manifest written (a manifest of about 8 MiB, as Iceberg's
/// `commit.manifest.target-size-bytes`).
pub const ENTRIES_PER_MANIFEST: usize = 20_000;

/// What a manifest rewrite did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Rewritten {
    pub manifests_before: u64,
    pub manifests_after: u64,
    pub snapshot_id: Option<i64>,
}

/// Rewrite `table`'s manifests (nothing happens when it has at most one).
pub async fn rewrite_manifests(table: &Maintained) -> Result<Rewritten> {
    let committed = table
        .commit(|base| async move {
            let md = base.metadata();
            let Some(current) = md.current_snapshot() else {
                return Ok(None);
            };
            if md.format_version() == FormatVersion::V1 {
                return Err(Error::Unsupported(format!(
                    "rewriting the manifests of format-version 1 table {}",
                    base.identifier()
                )));
            }
            let list = crate::lake::commit::lists::load(&base, current).await?;
            if list.len() <= 1 {
                return Ok(None);
            }
            let (prepared, before, after) =
                prepare_manifest_rewrite(&base, ENTRIES_PER_MANIFEST).await?;
            Ok(Some((prepared, (before, after))))
        })
        .await?;
    Ok(match committed {
        Some((table, (before, after))) => Rewritten {
            manifests_before: before as u64,
            manifests_after: after as u64,
            snapshot_id: table.metadata().current_snapshot_id(),
        },
        None => Rewritten::default(),
    })
}
