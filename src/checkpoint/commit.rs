//! Committing a checkpoint's files to their table, exactly once.
//!
//! The snapshot a checkpoint commits carries `floe.job` and `floe.checkpoint` in its
//! summary. Before committing, the table's snapshots are searched for this job's
//! checkpoint (or a later one): if it is there, the commit happened before a crash and is
//! skipped. Commit conflicts with other writers are retried by iceberg-rust.

use std::collections::HashMap;
use std::sync::Arc;

use iceberg::spec::{Schema, UnboundPartitionSpec, deserialize_data_file_from_json};
use iceberg::table::Table;
use iceberg::{Catalog, NamespaceIdent, TableIdent};

use super::state::PendingCommit;
use crate::catalog::commit::{Committer, EvolvingAppend, prepare, staged};
use crate::error::{Error, Result};
use crate::sink::commit;

/// Summary key: the job that wrote a snapshot.
pub const SUMMARY_JOB: &str = "floe.job";
/// Summary key: the checkpoint id a snapshot commits.
pub const SUMMARY_CHECKPOINT: &str = "floe.checkpoint";

/// The highest checkpoint of `job` committed to `table`, if any.
pub fn committed_checkpoint(table: &Table, job: &str) -> Option<u64> {
    table
        .metadata()
        .snapshots()
        .filter(|s| {
            s.summary()
                .additional_properties
                .get(SUMMARY_JOB)
                .map(String::as_str)
                == Some(job)
        })
        .filter_map(|s| {
            s.summary()
                .additional_properties
                .get(SUMMARY_CHECKPOINT)?
                .parse::<u64>()
                .ok()
        })
        .max()
}

/// Tables committed at once by [`commit_all`].
const PARALLEL_COMMITS: usize = 8;

/// Commit every table of a checkpoint, several at a time (each table's commit is
/// independent; a checkpoint of many tables would otherwise wait on each in turn).
pub async fn commit_all(
    catalog: &Arc<dyn Catalog>,
    committer: Option<&Committer>,
    tables: &[PendingCommit],
    job: &str,
    checkpoint: u64,
) -> Result<()> {
    for chunk in tables.chunks(PARALLEL_COMMITS) {
        let commits = chunk
            .iter()
            .map(|p| commit_once(catalog, committer, p, job, checkpoint));
        futures::future::try_join_all(commits).await?;
    }
    Ok(())
}

/// Commit `pending` as checkpoint `checkpoint` of `job`, unless the table has it already.
/// Returns whether a snapshot was added. Files of a table that was dropped and re-created
/// since are not committed to the new one.
pub async fn commit_once(
    catalog: &Arc<dyn Catalog>,
    committer: Option<&Committer>,
    pending: &PendingCommit,
    job: &str,
    checkpoint: u64,
) -> Result<bool> {
    let ident = TableIdent::new(
        NamespaceIdent::from_vec(pending.namespace.clone())?,
        pending.table.clone(),
    );
    let table = match catalog.load_table(&ident).await {
        Ok(t) => t,
        // Dropped since: its files have no table to go to.
        Err(e) if e.kind() == iceberg::ErrorKind::TableNotFound => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    if table.metadata().uuid().to_string() != pending.table_uuid {
        return Ok(false);
    }
    if committed_checkpoint(&table, job).is_some_and(|c| c >= checkpoint) {
        return Ok(false);
    }
    let summary = HashMap::from([
        (SUMMARY_JOB.to_string(), job.to_string()),
        (SUMMARY_CHECKPOINT.to_string(), checkpoint.to_string()),
    ]);
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
    let evolves = schema.is_some() || spec.is_some();
    if evolves
        && let Some(base) = pending.base_schema_id
        && table.metadata().current_schema_id() != base
    {
        return Err(Error::Unsupported(format!(
            "table {ident} had its schema changed by another writer while job '{job}' \
             evolved it; concurrent schema evolution of one table is not supported yet"
        )));
    }
    let stage = staged(&table, schema.clone(), spec.clone())?;
    let md = stage.metadata();
    let mut groups = Vec::new();
    for group in &pending.groups {
        let spec_ref = md.partition_spec_by_id(group.spec_id).ok_or_else(|| {
            Error::Internal(format!(
                "table {ident} has no partition spec {} for checkpoint {checkpoint}",
                group.spec_id
            ))
        })?;
        let partition_type = spec_ref.partition_type(md.current_schema())?;
        let files = group
            .files
            .iter()
            .map(|json| {
                deserialize_data_file_from_json(
                    json,
                    group.spec_id,
                    &partition_type,
                    md.current_schema(),
                )
            })
            .collect::<iceberg::Result<Vec<_>>>()?;
        groups.push((group.spec_id, files));
    }
    let single_default_spec = groups.len() == 1 && groups[0].0 == md.default_partition_spec_id();
    if !evolves && single_default_spec {
        let files = groups.pop().map(|(_, f)| f).unwrap_or_default();
        commit::append(catalog, &table, files, summary).await?;
        return Ok(true);
    }
    let committer = committer.ok_or_else(|| {
        Error::Unsupported(format!(
            "evolving table {ident} needs floe's own commit path, which this catalog type \
             does not have"
        ))
    })?;
    let prepared = prepare(
        &table,
        EvolvingAppend {
            schema,
            spec,
            files: groups,
            summary,
        },
    )
    .await?;
    committer.commit(&table, prepared).await?;
    Ok(true)
}
