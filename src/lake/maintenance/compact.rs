//! Compaction (`rewrite_data_files`): small files of a partition bin-packed into files near
//! a target size, files of older partition specs rewritten into the current one, the
//! deletes that apply to the files read folded in.
//!
//! ```text
//! plan the current snapshot's files (optionally those a filter may match)
//! -> candidates: files under 3/4 of the target, files of an older spec, files with deletes
//! -> groups by (spec, partition) worth rewriting: at least `min_input_files` files, two or
//!    more with one older than `small_file_age`, more than a target's worth, or any old-spec
//!    file or file with deletes
//! -> bins of about the target size -> read (deletes applied) -> sorted by the table's
//!    sort order, if it has one (maintenance::sort) -> write (current spec)
//! -> one replace commit of every bin, prepared on the table as it is (lake::commit::replace);
//!    deletes committed meanwhile against the files read are carried to the new files (in
//!    tables with a primary key, by key: see `carry`), or the rewrite gives up
//! ```
//!
//! Nothing is visible until the commit; when it is given up, the files written are deleted.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use futures::TryStreamExt;
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::expr::Predicate;
use iceberg::scan::FileScanTask;
use iceberg::spec::{
    DataFile, DataFileFormat, FormatVersion, ManifestContentType, ManifestStatus, Struct,
};
use iceberg::table::Table;

use super::{Maintained, Pace, sort};
use crate::error::{Error, Result};
use crate::lake::TableWriter;
use crate::lake::commit::replace::{Rewrite, conflict, live_data_entries, prepare_rewrite};
use crate::lake::{deletes, read, upsert};

/// What to compact.
#[derive(Debug, Clone)]
pub struct CompactOptions {
    /// The size files are packed to (`None`: the table's `write.target-file-size-bytes`).
    pub target_file_size: Option<u64>,
    /// A partition's small files are rewritten once there are this many...
    pub min_input_files: usize,
    /// ...or once one of them (of two or more) is older than this.
    pub small_file_age: Option<std::time::Duration>,
    /// Only files that may hold rows matching this are considered.
    pub filter: Option<Predicate>,
    /// Memory a rewrite holds at most (its sort and its row groups being written); `None`:
    /// the table's row-group size and [`sort::SORT_MEMORY`].
    pub memory: Option<usize>,
    /// How fast to work: after each bin it rests (see [`Pace`]); `None`: at once.
    pub pace: Option<Pace>,
    /// Compact files only with files of about their size (within a factor of 4): each
    /// byte is rewritten a few times on its way to the target size, not at every run, as
    /// the small files of a partition a job keeps appending to would be. For compaction
    /// inside jobs; `rewrite_data_files` packs every small file, as Spark's does.
    pub tiered: bool,
}

impl Default for CompactOptions {
    fn default() -> Self {
        Self {
            target_file_size: None,
            min_input_files: 5,
            small_file_age: None,
            filter: None,
            memory: None,
            pace: None,
            tiered: false,
        }
    }
}

/// What a compaction did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Compacted {
    pub rewritten_files: u64,
    pub rewritten_bytes: u64,
    pub added_files: u64,
    pub added_bytes: u64,
    /// The partitions (of the spec each file was written with) rewritten.
    pub groups: u64,
    /// The snapshot committed, if anything was.
    pub snapshot_id: Option<i64>,
}

/// One file considered, as its manifest entry and scan task describe it.
struct Candidate {
    task: FileScanTask,
    size: u64,
    spec_id: i32,
    partition: Struct,
    /// When the snapshot that added it was committed, if it is still the table's.
    added_ms: Option<i64>,
}

/// Compact `table` (see the module doc).
pub async fn rewrite_data_files(table: &Maintained, options: &CompactOptions) -> Result<Compacted> {
    let base = table.load().await?;
    let md = base.metadata();
    let Some(snapshot) = md.current_snapshot() else {
        return Ok(Compacted::default());
    };
    if md.format_version() == FormatVersion::V1 {
        return Err(Error::Unsupported(format!(
            "compacting format-version 1 table {}",
            table.ident
        )));
    }
    let target = match options.target_file_size {
        Some(t) => t,
        None => md.table_properties()?.write_target_file_size_bytes as u64,
    };
    let bins = plan(&base, target, options).await?;
    if bins.is_empty() {
        return Ok(Compacted::default());
    }
    let mut done = Compacted {
        groups: bins.iter().map(|(g, _)| *g).collect::<HashSet<_>>().len() as u64,
        ..Compacted::default()
    };
    let mut rewrite = Rewrite {
        sequence_number: snapshot.sequence_number(),
        ..Rewrite::default()
    };
    let read_snapshot = snapshot.snapshot_id();
    for (_, bin) in bins {
        done.rewritten_files += bin.len() as u64;
        done.rewritten_bytes += bin.iter().map(|c| c.size).sum::<u64>();
        rewrite
            .removed
            .extend(bin.iter().map(|c| c.task.data_file_path.clone()));
        let written = rewrite_bin(&base, target, options.memory, bin).await;
        if let Some(pace) = &options.pace {
            pace.rest().await;
        }
        match written {
            Ok(files) => rewrite.added.extend(files),
            Err(e) => {
                discard(&base, &rewrite.added).await;
                return Err(e);
            }
        }
    }
    done.added_files = rewrite.added.len() as u64;
    done.added_bytes = rewrite.added.iter().map(|f| f.file_size_in_bytes()).sum();
    let committed = table
        .commit(|current| {
            let rewrite = &rewrite;
            async move {
                let since = deletes_since(&current, read_snapshot)?;
                let carried = carry(&current, rewrite, read_snapshot, &since).await?;
                let prepared = prepare_rewrite(&current, rewrite, &carried).await;
                if prepared.is_err() {
                    upsert::discard(&current, &carried).await;
                }
                Ok(Some((prepared?, ())))
            }
        })
        .await;
    match committed {
        Ok(Some((table, ()))) => {
            done.snapshot_id = table.metadata().current_snapshot_id();
            Ok(done)
        }
        Ok(None) => Ok(Compacted::default()),
        Err(e) => {
            discard(&base, &rewrite.added).await;
            Err(e)
        }
    }
}

/// The bins to rewrite, each with the index of the group (spec and partition) it is of.
async fn plan(
    base: &Table,
    target: u64,
    options: &CompactOptions,
) -> Result<Vec<(usize, Vec<Candidate>)>> {
    let md = base.metadata();
    let default_spec = md.default_partition_spec_id();
    let mut scan = base.scan().select_all();
    if let Some(filter) = &options.filter {
        scan = scan.with_filter(filter.clone());
    }
    let tasks: Vec<FileScanTask> = scan.build()?.plan_files().await?.try_collect().await?;
    let (data, _) = live_data_entries(base).await?;
    // Each live file's spec, and when the snapshot that added it was committed (unknown
    // once that snapshot expired: old).
    let entries: HashMap<String, (i32, DataFile, Option<i64>)> = data
        .into_iter()
        .flat_map(|(file, entries)| {
            entries.into_iter().map(move |e| {
                let added = e.snapshot_id.unwrap_or(file.added_snapshot_id);
                (
                    e.file_path().to_string(),
                    (
                        file.partition_spec_id,
                        e.data_file,
                        md.snapshot_by_id(added).map(|s| s.timestamp_ms()),
                    ),
                )
            })
        })
        .collect();
    let old_before = options.small_file_age.map(|age| {
        chrono::Utc::now().timestamp_millis() - i64::try_from(age.as_millis()).unwrap_or(i64::MAX)
    });
    let small = target / 4 * 3;
    let mut groups: BTreeMap<(i32, String, u32), Vec<Candidate>> = BTreeMap::new();
    let mut seen = HashSet::new();
    for task in tasks {
        if !seen.insert(task.data_file_path.clone()) {
            continue;
        }
        let Some((spec_id, file, added_ms)) = entries.get(&task.data_file_path) else {
            continue;
        };
        let size = file.file_size_in_bytes();
        if size >= small && *spec_id == default_spec && task.deletes.is_empty() {
            continue;
        }
        // Files of about one size (a power of 4) share a group when tiered.
        let tier = if options.tiered {
            size.max(1).ilog(4)
        } else {
            0
        };
        groups
            .entry((*spec_id, format!("{:?}", file.partition()), tier))
            .or_default()
            .push(Candidate {
                task,
                size,
                spec_id: *spec_id,
                partition: file.partition().clone(),
                added_ms: *added_ms,
            });
    }
    let mut bins = Vec::new();
    for (g, (_, mut files)) in groups.into_iter().enumerate() {
        let total: u64 = files.iter().map(|c| c.size).sum();
        let must = files
            .iter()
            .any(|c| c.spec_id != default_spec || !c.task.deletes.is_empty());
        // Small files left alone longer than `small_file_age` are packed however few.
        let aged = old_before.is_some_and(|before| {
            files.len() >= 2 && files.iter().any(|c| c.added_ms.is_none_or(|t| t < before))
        });
        if !(must || aged || files.len() >= options.min_input_files.max(2) || total > target) {
            continue;
        }
        // Largest first, each into the first bin it fits (first-fit decreasing).
        files.sort_by_key(|c| std::cmp::Reverse(c.size));
        let mut packed: Vec<(u64, Vec<Candidate>)> = Vec::new();
        for c in files {
            match packed.iter_mut().find(|(sum, _)| sum + c.size <= target) {
                Some((sum, bin)) => {
                    *sum += c.size;
                    bin.push(c);
                }
                None => packed.push((c.size, vec![c])),
            }
        }
        for (_, bin) in packed {
            // A bin of one file in the current spec with no deletes would be rewritten
            // as itself.
            let alone =
                bin.len() == 1 && bin[0].spec_id == default_spec && bin[0].task.deletes.is_empty();
            if !alone {
                bins.push((g, bin));
            }
        }
    }
    Ok(bins)
}

/// Read one bin's files (deletes applied) and write their rows into new files.
async fn rewrite_bin(
    base: &Table,
    target: u64,
    memory: Option<usize>,
    bin: Vec<Candidate>,
) -> Result<Vec<DataFile>> {
    debug_assert!(bin.iter().all(|c| c.partition == bin[0].partition));
    let tasks = bin.into_iter().map(|c| c.task).collect();
    let md = base.metadata();
    let arrow = Arc::new(schema_to_arrow_schema(md.current_schema())?);
    // Half the budget to the sort, a quarter to the row group being written.
    let mut rows = sort::sorted(
        read::whole_files(base, tasks)?,
        arrow,
        md.default_sort_order(),
        md.current_schema(),
        memory.map_or(sort::SORT_MEMORY, |m| m / 2),
    )?;
    let mut writer = TableWriter::for_rewrite(base, target, memory.map(|m| m / 4))?;
    while let Some(batch) = rows.try_next().await? {
        writer.write(batch).await?;
    }
    writer.close().await
}

/// The snapshots committed after `read` that added delete files: they may delete rows the
/// rewrite copied (see [`carry`]). Fails when `read` is no longer in the table's history.
fn deletes_since(current: &Table, read: i64) -> Result<Vec<i64>> {
    let md = current.metadata();
    let mut at = md.current_snapshot();
    let mut out = Vec::new();
    while let Some(s) = at {
        if s.snapshot_id() == read {
            return Ok(out);
        }
        let added = s
            .summary()
            .additional_properties
            .get("added-delete-files")
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        if added > 0 {
            out.push(s.snapshot_id());
        }
        at = s.parent_snapshot_id().and_then(|p| md.snapshot_by_id(p));
    }
    Err(conflict(
        current,
        format!("the snapshot the rewrite read ({read}) is no longer an ancestor of the table's"),
    ))
}

/// Position deletes that the snapshots `since` committed against files `rewrite` replaces,
/// carried over to the files it wrote: in a table with a primary key, the keys of the rows
/// deleted are found in the new files (a job upserting the table deletes rows at every
/// checkpoint, so a compaction that gave up on them would never land). In a table without
/// one the rewrite gives up (rows are not told apart there).
///
/// A deletion vector holds its file's earlier deletes too: the positions already deleted in
/// the snapshot the rewrite read (`read`), whose rows it did not copy, are not carried.
async fn carry(
    current: &Table,
    rewrite: &Rewrite,
    read: i64,
    since: &[i64],
) -> Result<Vec<(DataFile, i32)>> {
    let md = current.metadata();
    let io = current.file_io();
    let reader = deletes::DeleteReader::new(io.clone());
    // The positions deleted meanwhile, by replaced file.
    let mut deleted: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut vectors = false;
    for id in since {
        let Some(snapshot) = md.snapshot_by_id(*id) else {
            continue;
        };
        let list = current.manifest_list_reader(snapshot).load().await?;
        for m in list.entries() {
            if m.content != ManifestContentType::Deletes || m.added_snapshot_id != *id {
                continue;
            }
            for e in m.load_manifest(io).await?.entries() {
                if e.status() != ManifestStatus::Added {
                    continue;
                }
                let Some(target) = e.data_file.referenced_data_file() else {
                    continue;
                };
                if rewrite.removed.contains(&target) {
                    vectors |= e.data_file.file_format() == DataFileFormat::Puffin;
                    let ps = reader.read(e.data_file.file_path(), &target).await?;
                    deleted.entry(target).or_default().extend(ps);
                }
            }
        }
    }
    if vectors {
        let then = deletes::scoped_at(current, read, &rewrite.removed).await?;
        for (file, ps) in deleted.iter_mut() {
            if let Some(before) = then.get(file) {
                ps.retain(|p| before.binary_search(p).is_err());
            }
        }
        deleted.retain(|_, ps| !ps.is_empty());
    }
    if deleted.is_empty() {
        return Ok(Vec::new());
    }
    let keys = upsert::key_names(md.current_schema());
    if keys.is_empty() {
        return Err(conflict(
            current,
            format!(
                "{} of the files the rewrite read had rows deleted while it ran; nothing was \
                 committed",
                deleted.len()
            ),
        ));
    }
    let columns = read::columns_of(current, &keys)?;
    let mut converter = upsert::Keys::new(&keys);
    let mut gone = HashSet::new();
    for (path, mut ps) in deleted {
        ps.sort_unstable();
        ps.dedup();
        let rows = read::rows_at(io, &columns, &path, &ps).await?;
        gone.extend(converter.of(&rows)?);
    }
    let spec_id = md.default_partition_spec_id();
    let mut changes = Vec::new();
    for f in &rewrite.added {
        let mut ps = Vec::new();
        let mut pos = 0i64;
        for batch in read::conformed(io, &columns, f.file_path()).await? {
            for k in converter.of(&batch)? {
                if gone.contains(&k) {
                    ps.push(pos);
                }
                pos += 1;
            }
        }
        if ps.is_empty() {
            continue;
        }
        let target = deletes::Target {
            path: f.file_path().to_string(),
            partition: f.partition().clone(),
            spec_id,
            deletes: Vec::new(),
        };
        changes.push((target, ps));
    }
    deletes::write_all(current, &changes).await
}

/// Delete files written for a rewrite that is not committed.
async fn discard(base: &Table, files: &[DataFile]) {
    for f in files {
        let _ = base.file_io().delete(f.file_path()).await;
    }
}
