//! Orphan-file removal (`remove_orphan_files`): files under a table's location that no
//! snapshot, no metadata file and no in-flight checkpoint references, older than a time.
//!
//! ```text
//! referenced = every metadata file the table's log names, every snapshot's manifest list,
//!              its manifests, every file they list (live or not), statistics files,
//!              and the files `keep` names (checkpoint records not yet committed)
//! orphans    = files listed under the table location, not referenced, last written
//!              before `older_than` (default 3 days ago: longer than any checkpoint runs),
//!              outside hidden folders (`.x`, `_x`; `_x=1` is a partition's), as Iceberg's
//!              own action leaves them (floe copies jobs' records there, see
//!              `checkpoint::lake_copy`)
//! ```
//!
//! Crashed writers leave orphans (a checkpoint's files written but never committed, a
//! commit's manifests whose compare-and-set lost); this finds and deletes them.

use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::TryStreamExt;
use iceberg::table::Table;

use super::Maintained;
use crate::error::{Error, Result};

/// Which orphans to look for.
#[derive(Debug, Clone)]
pub struct OrphanOptions {
    /// Only files last written before this (ms since the epoch) are orphans.
    pub older_than_ms: i64,
    /// List the orphans without deleting them.
    pub dry_run: bool,
}

/// Find (and unless `dry_run`, delete) `table`'s orphan files; `keep` holds paths that
/// in-flight checkpoints will commit. Returns the orphans' paths, sorted.
pub async fn remove_orphan_files(
    table: &Maintained,
    options: &OrphanOptions,
    keep: &HashSet<String>,
) -> Result<Vec<String>> {
    let base = table.load().await?;
    let mut referenced: HashSet<String> = keep.iter().map(|p| normalize(p)).collect();
    referenced.extend(references(&base).await?.iter().map(|p| normalize(p)));
    let cutoff = UNIX_EPOCH + Duration::from_millis(options.older_than_ms.max(0) as u64);
    let mut orphans: Vec<String> = list(&base)
        .await?
        .into_iter()
        .filter(|(path, modified)| {
            !referenced.contains(&normalize(path))
                && modified.is_some_and(|m| m < cutoff)
                && !hidden(base.metadata().location(), path)
        })
        .map(|(path, _)| path)
        .collect();
    orphans.sort();
    // A table loaded again after listing: a commit that landed meanwhile may name a file
    // listed before it (the cutoff keeps young files anyway; this keeps the rule exact).
    let now = table.load().await?;
    let again: HashSet<String> = references(&now)
        .await?
        .iter()
        .map(|p| normalize(p))
        .collect();
    orphans.retain(|p| !again.contains(&normalize(p)));
    if !options.dry_run {
        for path in &orphans {
            base.file_io().delete(path).await?;
        }
    }
    Ok(orphans)
}

/// Every file the table's metadata reaches.
async fn references(table: &Table) -> Result<HashSet<String>> {
    let md = table.metadata();
    let io = table.file_io();
    let mut out = HashSet::new();
    out.extend(table.metadata_location().map(str::to_string));
    out.extend(md.metadata_log().iter().map(|l| l.metadata_file.clone()));
    out.extend(md.statistics_iter().map(|s| s.statistics_path.clone()));
    out.extend(
        md.partition_statistics_iter()
            .map(|s| s.statistics_path.clone()),
    );
    let mut manifests = HashSet::new();
    for s in md.snapshots() {
        out.insert(s.manifest_list().to_string());
        let list = table.manifest_list_reader(s).load().await?;
        for m in list.entries() {
            if !manifests.insert(m.manifest_path.clone()) {
                continue;
            }
            let manifest = m.load_manifest(io).await?;
            out.extend(manifest.entries().iter().map(|e| e.file_path().to_string()));
        }
    }
    out.extend(manifests);
    Ok(out)
}

/// Whether `path` is in a hidden folder under the table's `location`.
fn hidden(location: &str, path: &str) -> bool {
    let (location, path) = (normalize(location), normalize(path));
    let relative = path
        .strip_prefix(location.trim_end_matches('/'))
        .unwrap_or(&path);
    let mut folders: Vec<&str> = relative.split('/').filter(|c| !c.is_empty()).collect();
    folders.pop();
    folders
        .iter()
        .any(|c| (c.starts_with('.') || c.starts_with('_')) && !c.contains('='))
}

/// A path as comparable across its spellings: `file:` prefixes dropped.
fn normalize(path: &str) -> String {
    let p = path
        .strip_prefix("file://")
        .or_else(|| path.strip_prefix("file:"))
        .unwrap_or(path);
    p.replace("//", "/")
}

/// Every file under the table's location, with when it was last written.
async fn list(table: &Table) -> Result<Vec<(String, Option<SystemTime>)>> {
    let location = table
        .metadata()
        .location()
        .trim_end_matches('/')
        .to_string();
    if let Some(rest) = location
        .strip_prefix("s3://")
        .or_else(|| location.strip_prefix("s3a://"))
    {
        return list_s3(table, &location, rest).await;
    }
    let root = normalize(&location);
    tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        let mut dirs = vec![std::path::PathBuf::from(&root)];
        while let Some(dir) = dirs.pop() {
            let entries = match std::fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io(format!("listing {}", dir.display()), e)),
            };
            for entry in entries {
                let entry =
                    entry.map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
                let meta = entry
                    .metadata()
                    .map_err(|e| Error::io(format!("reading {}", entry.path().display()), e))?;
                if meta.is_dir() {
                    dirs.push(entry.path());
                } else {
                    out.push((
                        entry.path().to_string_lossy().into_owned(),
                        meta.modified().ok(),
                    ));
                }
            }
        }
        Ok(out)
    })
    .await
    .map_err(|e| Error::Internal(format!("listing a table's files: {e}")))?
}

/// The objects under `location` (`s3://<bucket>/<prefix>`, `rest` without the scheme), by
/// the table's own storage settings.
async fn list_s3(
    table: &Table,
    location: &str,
    rest: &str,
) -> Result<Vec<(String, Option<SystemTime>)>> {
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let props = table.file_io().config().props();
    let get = |k: &str| props.get(k).map(String::as_str);
    let mut builder = opendal::services::S3::default().bucket(bucket).root("/");
    if let Some(v) = get("s3.endpoint") {
        builder = builder.endpoint(v);
    }
    if let Some(v) = get("s3.region").or(get("client.region")) {
        builder = builder.region(v);
    }
    if let Some(v) = get("s3.access-key-id") {
        builder = builder.access_key_id(v);
    }
    if let Some(v) = get("s3.secret-access-key") {
        builder = builder.secret_access_key(v);
    }
    if let Some(v) = get("s3.session-token") {
        builder = builder.session_token(v);
    }
    if !get("s3.path-style-access").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        builder = builder.enable_virtual_host_style();
    }
    let fail = |e: opendal::Error| Error::Source(format!("listing {location}: {e}"));
    let op = opendal::Operator::new(builder).map_err(fail)?.finish();
    let scheme = &location[..location.find("://").unwrap_or(0) + 3];
    let mut out = Vec::new();
    let mut lister = op
        .lister_with(&format!("{prefix}/"))
        .recursive(true)
        .await
        .map_err(fail)?;
    while let Some(entry) = lister.try_next().await.map_err(fail)? {
        if !entry.metadata().is_file() {
            continue;
        }
        let modified = match entry.metadata().last_modified() {
            Some(t) => Some(SystemTime::from(t)),
            None => op
                .stat(entry.path())
                .await
                .map_err(fail)?
                .last_modified()
                .map(SystemTime::from),
        };
        out.push((
            format!("{scheme}{bucket}/{}", entry.path().trim_start_matches('/')),
            modified,
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::hidden;

    #[test]
    fn files_in_hidden_folders_are_never_orphans() {
        let t = "s3://b/wh/ns/t";
        assert!(hidden(
            t,
            "s3://b/wh/ns/t/.floe-state/job/run-3/record-4.json"
        ));
        assert!(hidden(t, "s3://b/wh/ns/t/data/_tmp/x.parquet"));
        assert!(!hidden(t, "s3://b/wh/ns/t/data/_c=1/x.parquet"));
        assert!(!hidden(t, "s3://b/wh/ns/t/data/.x.parquet"));
        assert!(!hidden(t, "s3://b/wh/ns/t/metadata/v1.metadata.json"));
        assert!(hidden("file:/w/t", "/w/t/.floe-state/j/record-1.json"));
    }
}
