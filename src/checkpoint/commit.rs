//! Committing a checkpoint's files to their table, exactly once.
//!
//! The snapshot a checkpoint commits carries its [`Mark`] in its summary (`floe.job`,
//! `floe.checkpoint`, `floe.offsets`: the job, the checkpoint id and the source offsets to
//! resume after it), and the same commit sets the table properties
//! `floe.checkpoint.<job>` and `floe.offsets.<job>`, which snapshot expiry cannot remove.
//! Before committing, the table is asked for this job's checkpoint (or a later one), in its
//! snapshots and in those properties: if it is there, the commit happened before a crash and
//! is skipped. A commit another writer beat is retried on the table as it is then, asked
//! again. What the tables carry is also where a job whose checkpoint record is lost resumes
//! ([`mod@super::resume`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use iceberg::spec::{FormatVersion, Schema, UnboundPartitionSpec, deserialize_data_file_from_json};
use iceberg::table::Table;
use iceberg::{Catalog, TableIdent};

use super::rewrite::rewrite_files;
use super::state::{CheckpointRecord, DeadLetterTarget, PendingCommit};
use crate::connector::Offsets;
use crate::error::{Error, Reject, Result};
use crate::failpoint;
use crate::lake::commit::row_delta::{RowDelta, prepare_evolving_row_delta};
use crate::lake::commit::{self, Committer, EvolvingAppend, prepare, staged};
use crate::lake::dead_letter::{DeadLetter, batch, ensure_table, row_json};
use crate::lake::{runtime, upsert};
use crate::schema::merge::{merge_schemas, remap_spec};
use crate::task::joined;

/// Summary key: the job that wrote a snapshot.
pub const SUMMARY_JOB: &str = "floe.job";
/// Summary key: the checkpoint id a snapshot commits.
pub const SUMMARY_CHECKPOINT: &str = "floe.checkpoint";
/// Summary key: how many keys a checkpoint's change stream deleted that the table did not
/// hold (deletes that changed nothing).
pub const SUMMARY_UNKNOWN_DELETES: &str = "floe.deletes-of-unknown-keys";

/// Summary key: where an upsert found the rows it replaced:
/// `memory` or `disk` (the key index), or `table` (the key columns read).
pub const SUMMARY_KEY_INDEX: &str = "floe.key-index";
/// Summary key: the source offsets (JSON, per source name) the job resumes from after it.
pub const SUMMARY_OFFSETS: &str = "floe.offsets";
/// Summary key: where the checkpoint's record is copied with the tables (its URI, see
/// [`super::lake_copy`]).
pub const SUMMARY_COPY: &str = "floe.copy";

/// The table property that holds the last checkpoint of `job` committed to a table.
pub fn checkpoint_property(job: &str) -> String {
    format!("{SUMMARY_CHECKPOINT}.{job}")
}

/// The table property that holds the offsets of that checkpoint.
pub fn offsets_property(job: &str) -> String {
    format!("{SUMMARY_OFFSETS}.{job}")
}

/// The table property that holds where that checkpoint's record is copied (empty: nowhere).
pub fn copy_property(job: &str) -> String {
    format!("{SUMMARY_COPY}.{job}")
}

/// What a committed checkpoint leaves in a table: whose it is, which, and where its job
/// resumes after it.
#[derive(Debug, Clone, PartialEq)]
pub struct Mark {
    pub job: String,
    pub checkpoint: u64,
    /// The source offsets after the checkpoint; `None` in tables written by a floe that did
    /// not record them.
    pub offsets: Option<BTreeMap<String, Offsets>>,
    /// When it was committed (ms since the epoch; 0 when only the properties tell).
    pub time_ms: i64,
    /// Where the checkpoint's record (with the state after it) is copied with the tables
    /// (its URI; empty when it is not). `None` in tables written by a floe that did not copy.
    pub copy: Option<String>,
}

impl Mark {
    /// The mark of checkpoint `checkpoint` of `job`, without offsets.
    pub fn new(job: &str, checkpoint: u64) -> Self {
        Self {
            job: job.to_string(),
            checkpoint,
            offsets: None,
            time_ms: 0,
            copy: None,
        }
    }

    /// The mark a checkpoint record's commits leave.
    pub fn of(record: &CheckpointRecord) -> Self {
        Self {
            job: record.job.clone(),
            checkpoint: record.checkpoint,
            offsets: Some(record.sources.clone()),
            time_ms: record.time_ms,
            copy: Some(super::lake_copy::record_uri(record)),
        }
    }

    /// Where the checkpoint's record is copied, when it is.
    pub fn record_copy(&self) -> Option<&str> {
        self.copy.as_deref().filter(|s| !s.is_empty())
    }

    /// The latest mark of `job` in `table`, if any: in the snapshots that carry one, or in
    /// the table properties expiry leaves.
    pub fn read(table: &Table, job: &str) -> Option<Self> {
        let md = table.metadata();
        let offsets = |json: Option<&String>| json.and_then(|j| serde_json::from_str(j).ok());
        let in_properties = md
            .properties()
            .get(&checkpoint_property(job))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|checkpoint| Self {
                job: job.to_string(),
                checkpoint,
                offsets: offsets(md.properties().get(&offsets_property(job))),
                time_ms: 0,
                copy: md.properties().get(&copy_property(job)).cloned(),
            });
        // The latest first, its offsets parsed after: a table keeps a snapshot per commit.
        let in_snapshots = md
            .snapshots()
            .filter_map(|s| {
                let summary = &s.summary().additional_properties;
                if summary.get(SUMMARY_JOB).map(String::as_str) != Some(job) {
                    return None;
                }
                let checkpoint: u64 = summary.get(SUMMARY_CHECKPOINT)?.parse().ok()?;
                Some((checkpoint, s))
            })
            .max_by_key(|(checkpoint, _)| *checkpoint)
            .map(|(checkpoint, s)| {
                let summary = &s.summary().additional_properties;
                Self {
                    job: job.to_string(),
                    checkpoint,
                    offsets: offsets(summary.get(SUMMARY_OFFSETS)),
                    time_ms: s.timestamp_ms(),
                    copy: summary.get(SUMMARY_COPY).cloned(),
                }
            });
        match (in_properties, in_snapshots) {
            (Some(p), Some(s)) if p.checkpoint > s.checkpoint => Some(p),
            (p, s) => s.or(p),
        }
    }

    fn offsets_json(&self) -> Option<String> {
        self.offsets
            .as_ref()
            .map(|o| serde_json::to_string(o).unwrap_or_default())
    }

    /// The snapshot summary a commit of this checkpoint carries.
    fn summary(&self) -> HashMap<String, String> {
        let mut summary = HashMap::from([
            (SUMMARY_JOB.to_string(), self.job.clone()),
            (SUMMARY_CHECKPOINT.to_string(), self.checkpoint.to_string()),
        ]);
        summary.extend(
            self.offsets_json()
                .map(|o| (SUMMARY_OFFSETS.to_string(), o)),
        );
        summary.extend(
            self.record_copy()
                .map(|s| (SUMMARY_COPY.to_string(), s.to_string())),
        );
        summary
    }

    /// The table properties a commit of this checkpoint sets.
    fn properties(&self) -> HashMap<String, String> {
        let mut properties =
            HashMap::from([(checkpoint_property(&self.job), self.checkpoint.to_string())]);
        properties.extend(
            self.offsets_json()
                .map(|o| (offsets_property(&self.job), o)),
        );
        // Set when the job keeps state, even to nothing: an earlier checkpoint's copy is not
        // this one's.
        properties.extend(
            self.copy
                .as_ref()
                .map(|s| (copy_property(&self.job), s.clone())),
        );
        properties
    }
}

/// The highest checkpoint of `job` committed to `table`, if any (see [`Mark::read`]).
pub fn committed_checkpoint(table: &Table, job: &str) -> Option<u64> {
    Mark::read(table, job).map(|m| m.checkpoint)
}

/// Tables committed at once by [`commit_all`]. Each commit's own work is small; what bounds a
/// checkpoint of many tables is the latency of making them durable (the SQL committer syncs
/// the files and runs the compare-and-sets of every commit waiting, together): the more
/// commits wait together, the fewer rounds (10,000 tables: 8 at a time took ~6 s, mostly
/// waiting on the disk; 64 at a time 10.2 s for the whole job, 512 or 4,096 9.2-10.0 s).
const PARALLEL_COMMITS: usize = 1024;

/// Commit every table of a checkpoint record, several at a time, each as a task of its own
/// on the write runtime (each table's commit is independent, and its work, manifests and
/// metadata, grows with the table's history: a checkpoint of many tables would otherwise
/// wait on each in turn, on one core). `known` holds tables as the job last saw them
/// (saving a catalog load each; a stale one only costs a retry). Returns the tables as
/// committed.
pub async fn commit_all(
    catalog: &Arc<dyn Catalog>,
    committer: Option<&Arc<Committer>>,
    record: &CheckpointRecord,
    known: &HashMap<TableIdent, Table>,
) -> Result<HashMap<TableIdent, Table>> {
    use futures::StreamExt;
    let mark = Arc::new(Mark::of(record));
    let many = record.tables.len() > 1;
    let inputs: Vec<(PendingCommit, Option<Table>)> = record
        .tables
        .iter()
        .map(|p| {
            (
                p.clone(),
                p.ident().ok().and_then(|i| known.get(&i)).cloned(),
            )
        })
        .collect();
    let (catalog, committer) = (catalog.clone(), committer.cloned());
    let dead = record.dead_letters.clone();
    let commits = inputs.into_iter().map(move |(pending, known)| {
        let (catalog, committer) = (catalog.clone(), committer.clone());
        let (mark, dead) = (mark.clone(), dead.clone());
        runtime::spawn(async move {
            let ident = pending.ident()?;
            let c = committer.as_deref();
            let table =
                commit_once(&catalog, c, &pending, &mark, dead.as_ref(), known.as_ref()).await?;
            if many {
                failpoint::reach(failpoint::BETWEEN_COMMITS);
            }
            Ok::<_, Error>((ident, table))
        })
    });
    // Spawned as they are reached: at most PARALLEL_COMMITS at once. The first error drops
    // the rest (a task dropped is aborted; what it committed, the next attempt finds).
    let mut commits = futures::stream::iter(commits).buffer_unordered(PARALLEL_COMMITS);
    let mut committed = HashMap::new();
    while let Some(done) = commits.next().await {
        let (ident, table) = joined(async { done }, "table commit task").await?;
        if let Some(t) = table {
            committed.insert(ident, t);
        }
    }
    failpoint::reach(failpoint::AFTER_COMMITS);
    Ok(committed)
}

/// Attempts at a commit that another writer's commit keeps beating.
const CONFLICT_ATTEMPTS: u32 = 10;

/// Commit `pending` with `mark` (its job's checkpoint), unless the table has it already.
/// Rows the table cannot take (a column another writer gave another type) go to `dead`.
/// Returns the table as committed, or `None` when nothing was committed. Files of a table that
/// was dropped and re-created since are not committed to the new one. A commit another writer
/// beat is tried again on the table as that writer left it (merging schema changes, see
/// [`crate::schema::merge`]). `known` is the table as last seen, if it is (else it is loaded).
pub async fn commit_once(
    catalog: &Arc<dyn Catalog>,
    committer: Option<&Committer>,
    pending: &PendingCommit,
    mark: &Mark,
    dead: Option<&DeadLetterTarget>,
    known: Option<&Table>,
) -> Result<Option<Table>> {
    let mut attempt = 1;
    let mut known = known.cloned();
    loop {
        match try_commit(catalog, committer, pending, mark, dead, known.take()).await {
            Err(e) if is_conflict(&e) && attempt < CONFLICT_ATTEMPTS => {
                // Jitter, so that two writers retrying do not collide again in step.
                let ms =
                    10 * (1 << attempt.min(6)) + u64::from(uuid::Uuid::new_v4().as_u128() as u8);
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// Commit `change` to `table`: on floe's own commit path when the catalog has one (format
/// v2 and later, or a schema or spec change), else with iceberg-rust's append.
async fn commit_files(
    catalog: &Arc<dyn Catalog>,
    committer: Option<&Committer>,
    table: &Table,
    mut change: EvolvingAppend,
) -> Result<Table> {
    let md = table.metadata();
    let evolves = change.schema.is_some() || change.spec.is_some();
    let default_spec = match change.spec {
        Some(_) => None,
        None => Some(md.default_partition_spec_id()),
    };
    let single_default_spec = change.files.len() == 1 && Some(change.files[0].0) == default_spec;
    // floe's own commit path (format v2 and later) starts from the table as the job last saw
    // it; iceberg-rust's append loads the table twice more (a catalog read and a metadata
    // file each).
    // A table not created yet (see `SqlCommitter::new_tables`) is created by its commit there.
    let own = committer.filter(|_| {
        evolves || md.format_version() != FormatVersion::V1 || table.metadata_location().is_none()
    });
    let Some(committer) = own else {
        if !evolves && single_default_spec {
            let files = change.files.pop().map(|(_, f)| f).unwrap_or_default();
            let (summary, properties) = (change.summary, change.properties);
            // (Not empty: a commit with no files returns before.)
            let unretried = commit::without_retries(table)?;
            return commit::append(catalog, &unretried, files, summary, properties).await;
        }
        return Err(Error::Unsupported(format!(
            "evolving table {} needs floe's own commit path, which this catalog type \
             does not have",
            table.identifier()
        )));
    };
    let prepared = prepare(table, change).await?;
    committer.commit(table, prepared).await
}

/// Commit `change` to a table keeping one row per key: its files, and position deletes of
/// the rows whose keys they hold, found on `table` as it is (a commit that loses a race
/// finds them again on the table the winner left).
async fn commit_upsert(
    committer: Option<&Committer>,
    table: &Table,
    change: EvolvingAppend,
    deleted_keys: &[String],
) -> Result<Table> {
    let ident = table.identifier();
    let Some(committer) = committer else {
        return Err(Error::Unsupported(format!(
            "keeping one row per key in table {ident}: floe writes position deletes through \
             its own commit path, which sql, rest and glue catalogs have"
        )));
    };
    let md = table.metadata();
    // The files are written with the checkpoint's schema and spec, which the commit adds.
    let stage = staged(table, change.schema.clone(), change.spec.clone())?;
    let mut added = Vec::new();
    for (spec_id, files) in change.files {
        if spec_id != stage.metadata().default_partition_spec_id() {
            return Err(Error::Restart(format!(
                "table {ident}'s partitioning changed while the job wrote rows to it"
            )));
        }
        added.extend(files);
    }
    let keys = upsert::key_names(md.current_schema());
    if keys.is_empty() {
        return Err(Error::Restart(format!(
            "table {ident} no longer has a primary key (identifier fields)"
        )));
    }
    let (deletes, update, unknown) = upsert::superseded(table, &keys, &added, deleted_keys).await?;
    if deletes.is_empty() && added.is_empty() {
        // Deletes of keys the table does not hold: nothing changes.
        return Ok(table.clone());
    }
    let mut summary = change.summary;
    if !update.found_in.is_empty() {
        summary.insert(SUMMARY_KEY_INDEX.to_string(), update.found_in.to_string());
    }
    if unknown > 0 {
        // Deletes of keys the table does not hold change nothing; the count says so.
        summary.insert(SUMMARY_UNKNOWN_DELETES.to_string(), unknown.to_string());
    }
    let delta = RowDelta {
        deletes,
        added,
        read_snapshot: md.current_snapshot_id(),
        summary,
        properties: change.properties,
    };
    let committed =
        match prepare_evolving_row_delta(table, &delta, change.schema, change.spec).await {
            Ok(prepared) => committer.commit(table, prepared).await,
            Err(e) => Err(e),
        };
    match &committed {
        Ok(t) => upsert::committed(t, update, t.metadata().current_snapshot_id()).await,
        Err(_) => upsert::discard(table, &delta.deletes).await,
    }
    committed
}

/// Delete the files of keys deleted by a checkpoint whose commit is done (best effort: one
/// left behind is an orphan file, in no snapshot).
async fn forget_deleted_keys(table: &Table, pending: &PendingCommit) {
    for path in &pending.deleted_keys {
        let _ = table.file_io().delete(path).await;
    }
}

/// What a table's rows left out of its commit are marked with in the dead-letter table: a
/// job of their own per table, so that each is committed once however the commits go.
fn left_out_job(job: &str, table: &TableIdent) -> String {
    format!("{job}#left-out:{table}")
}

/// Commit `rows` (left out of `table`'s commit for checkpoint `mark`, each with why) to the
/// job's dead-letter table, unless they are there already.
async fn leave_out(
    catalog: &Arc<dyn Catalog>,
    committer: Option<&Committer>,
    dead: Option<&DeadLetterTarget>,
    mark: &Mark,
    table: &TableIdent,
    rows: Vec<(datafusion::arrow::array::RecordBatch, Reject)>,
    why: &str,
) -> Result<()> {
    let Some(dead) = dead else {
        return Err(Error::Plan(format!(
            "{} rows of checkpoint {} do not fit table {table} ({why}), and the job has no \
             dead-letter table to keep them",
            rows.len(),
            mark.checkpoint
        )));
    };
    let namespace = iceberg::NamespaceIdent::from_vec(dead.namespace.clone())?;
    let own = Mark {
        job: left_out_job(&mark.job, table),
        checkpoint: mark.checkpoint,
        offsets: None,
        time_ms: mark.time_ms,
        copy: None,
    };
    let letters: Vec<DeadLetter> = rows
        .iter()
        .map(|(row, reject)| DeadLetter {
            source: String::new(),
            partition: None,
            offset: None,
            payload: row_json(row),
            error: format!("table {table}: {reject} ({why})"),
        })
        .collect();
    let mut attempt = 1;
    loop {
        let letters_table = ensure_table(catalog, &namespace, &dead.table).await?;
        if Mark::read(&letters_table, &own.job).is_some_and(|m| m.checkpoint >= own.checkpoint) {
            return Ok(());
        }
        let mut writer = crate::lake::TableWriter::try_new(&letters_table)?;
        writer
            .write(batch(&mark.job, &dead.target, &letters, &letters_table)?)
            .await?;
        let files = writer.close().await?;
        let change = EvolvingAppend {
            schema: None,
            spec: None,
            files: vec![(letters_table.metadata().default_partition_spec_id(), files)],
            summary: own.summary(),
            properties: own.properties(),
        };
        match commit_files(catalog, committer, &letters_table, change).await {
            Err(e) if is_conflict(&e) && attempt < CONFLICT_ATTEMPTS => attempt += 1,
            other => return other.map(|_| ()),
        }
    }
}

/// Create the table of `pending` again, after it was dropped under the job that creates it
/// on sight: with no columns, which the commit then adds from its files (as it merges any
/// table created again); its partitioning comes back as the job's rows ask for it.
async fn create_again(catalog: &Arc<dyn Catalog>, pending: &PendingCommit) -> Result<Table> {
    let ident = pending.ident()?;
    let creation = iceberg::TableCreation::builder()
        .name(ident.name().to_string())
        .schema(Schema::builder().build()?)
        .build();
    match catalog.create_table(ident.namespace(), creation).await {
        Ok(t) => Ok(t),
        // Another writer (another job) created it meanwhile.
        Err(e) if e.kind() == iceberg::ErrorKind::TableAlreadyExists => {
            Ok(catalog.load_table(&ident).await?)
        }
        Err(e) => Err(e.into()),
    }
}

/// The schema `pending`'s files were written with (their own field ids), from the first.
async fn files_schema(table: &Table, pending: &PendingCommit) -> Result<Schema> {
    use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let first = pending
        .groups
        .iter()
        .flat_map(|g| &g.files)
        .next()
        .ok_or_else(|| Error::Internal("a commit without files".to_string()))?;
    let path = file_path(first)?;
    let bytes = table.file_io().new_input(&path)?.read().await?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes)
        .map_err(|e| Error::Internal(format!("reading {path}: {e}")))?;
    Ok(iceberg::arrow::arrow_schema_to_schema(builder.schema())?)
}

/// The path of a data file in its checkpoint-record JSON.
fn file_path(json: &str) -> Result<String> {
    #[derive(serde::Deserialize)]
    struct Path {
        file_path: String,
    }
    serde_json::from_str::<Path>(json)
        .map(|p| p.file_path)
        .map_err(|e| Error::Internal(format!("a data file in a checkpoint record: {e}")))
}

fn is_conflict(e: &Error) -> bool {
    matches!(e, Error::Iceberg(e) if e.kind() == iceberg::ErrorKind::CatalogCommitConflicts)
}

async fn try_commit(
    catalog: &Arc<dyn Catalog>,
    committer: Option<&Committer>,
    pending: &PendingCommit,
    mark: &Mark,
    dead: Option<&DeadLetterTarget>,
    known: Option<Table>,
) -> Result<Option<Table>> {
    let ident = pending.ident()?;
    let (job, checkpoint) = (mark.job.as_str(), mark.checkpoint);
    // iceberg-rust's append (format v1, catalogs without floe's committer) commits onto the
    // table as it loads it then, not as it was asked here: for that path, ask the table as it
    // is now.
    // A table not created yet is created by floe's commit path, whatever its format.
    let evolving = pending.schema.is_some() || pending.spec.is_some();
    let known = known.filter(|t| {
        committer.is_some()
            && (evolving
                || t.metadata().format_version() != FormatVersion::V1
                || t.metadata_location().is_none())
    });
    let table = match known {
        Some(t) => t,
        None => match catalog.load_table(&ident).await {
            Ok(t) => t,
            // Dropped since: a table the job creates on sight is created again; the files of
            // any other have no table to go to (the job starts afresh, see `resume`).
            Err(e) if e.kind() == iceberg::ErrorKind::TableNotFound && pending.recreate => {
                create_again(catalog, pending).await?
            }
            Err(e) if e.kind() == iceberg::ErrorKind::TableNotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        },
    };
    if committed_checkpoint(&table, job).is_some_and(|c| c >= checkpoint) {
        forget_deleted_keys(&table, pending).await;
        return Ok(None);
    }
    let recreated = table.metadata().uuid().to_string() != pending.table_uuid;
    if recreated && !pending.recreate {
        return Ok(None);
    }
    let (summary, properties) = (mark.summary(), mark.properties());
    let schema: Option<Schema> = pending
        .schema
        .as_deref()
        .map(serde_json::from_str)
        .transpose()
        .map_err(|e| Error::Internal(format!("schema in checkpoint {checkpoint}: {e}")))?;
    let spec: Option<UnboundPartitionSpec> = pending
        .spec
        .as_deref()
        .map(serde_json::from_str)
        .transpose()
        .map_err(|e| Error::Internal(format!("spec in checkpoint {checkpoint}: {e}")))?;
    // The files' rows are written again for the table as it is (`rewrite`) when another
    // writer changed its schema since ours was derived (the two are merged), or when the
    // table was created again since the files were written.
    let mut rewrite = false;
    let mut conflicts = Vec::new();
    let (schema, spec) = match (schema, pending.base_schema_id) {
        (ours, _) if recreated => {
            let ours = match ours {
                Some(s) => s,
                None => files_schema(&table, pending).await?,
            };
            let md = table.metadata();
            let merged = merge_schemas(md.current_schema(), &ours, md.last_column_id())?;
            rewrite = true;
            conflicts = merged.conflicts;
            let changed = merged.schema.as_struct() != md.current_schema().as_struct();
            (changed.then_some(merged.schema), None)
        }
        (Some(ours), Some(base)) if table.metadata().current_schema_id() != base => {
            let md = table.metadata();
            let merged = merge_schemas(md.current_schema(), &ours, md.last_column_id())?;
            // Our partition spec ids may name other specs now too: rewrite with a spec change.
            // A column whose type is theirs now (a conflict) holds values of ours.
            rewrite = !merged.remap.is_empty() || spec.is_some() || !merged.conflicts.is_empty();
            let spec = spec.map(|s| remap_spec(&s, &merged.remap)).transpose()?;
            conflicts = merged.conflicts;
            (Some(merged.schema), spec)
        }
        other => (other.0, spec),
    };
    let stage = staged(&table, schema.clone(), spec.clone())?;
    let md = stage.metadata();
    // The files written after our spec change name the id it had where they were written;
    // on the table as it is now (another writer may have added a spec) it may have another.
    let ours = pending.spec_id.filter(|_| spec.is_some());
    let spec_id = |written: i32| match ours {
        Some(id) if id == written => md.default_partition_spec_id(),
        _ => written,
    };
    let mut groups = Vec::new();
    let mut replaced = Vec::new();
    if rewrite {
        // Our files carry field ids (and spec ids) that the merged table gives other columns
        // (and specs), or that a table created again does not have: write their rows again
        // against it.
        for json in pending.groups.iter().flat_map(|g| &g.files) {
            replaced.push(file_path(json)?);
        }
        let rewritten = rewrite_files(&stage, &replaced).await?;
        if !rewritten.rejected.is_empty() {
            // Rows whose values the table's types (another writer's) cannot take: dead
            // letters, committed before the table's commit (and once: by their own mark).
            let why = conflicts.join("; ");
            leave_out(
                catalog,
                committer,
                dead,
                mark,
                &ident,
                rewritten.rejected,
                &why,
            )
            .await?;
        }
        groups.push((md.default_partition_spec_id(), rewritten.files));
    }
    // The table is the one the files were written for, with the schema they were written
    // against: the files as the sink has them are what their JSON reads back as (see
    // `lake::writer`'s tests), without parsing it.
    let as_written =
        !rewrite && pending.base_schema_id == Some(table.metadata().current_schema_id());
    for group in pending.groups.iter().filter(|_| !rewrite) {
        let id = spec_id(group.spec_id);
        if as_written && id == group.spec_id && group.written.len() == group.files.len() {
            groups.push((id, group.written.to_vec()));
            continue;
        }
        let spec_ref = md.partition_spec_by_id(id).ok_or_else(|| {
            Error::Internal(format!(
                "table {ident} has no partition spec {id} for checkpoint {checkpoint}"
            ))
        })?;
        let partition_type = spec_ref.partition_type(md.current_schema())?;
        let files = group
            .files
            .iter()
            .map(|json| {
                deserialize_data_file_from_json(json, id, &partition_type, md.current_schema())
            })
            .collect::<iceberg::Result<Vec<_>>>()?;
        groups.push((id, files));
    }
    if groups.iter().all(|(_, files)| files.is_empty()) && pending.deleted_keys.is_empty() {
        // Every row was left out (dead letters, committed above): nothing to commit, and a
        // retry finds the same.
        for path in replaced {
            let _ = table.file_io().delete(&path).await;
        }
        return Ok(None);
    }
    let change = EvolvingAppend {
        schema,
        spec,
        files: groups,
        summary,
        properties,
    };
    let committed = if pending.upsert {
        let committed = commit_upsert(committer, &table, change, &pending.deleted_keys).await?;
        forget_deleted_keys(&committed, pending).await;
        committed
    } else {
        commit_files(catalog, committer, &table, change).await?
    };
    // The files the rewrite replaced are in no snapshot: remove them (a crash before this
    // leaves them as orphans, which recovery never commits: the snapshot is there).
    for path in replaced {
        let _ = table.file_io().delete(&path).await;
    }
    Ok(Some(committed))
}
