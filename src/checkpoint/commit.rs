//! Committing a checkpoint's files to their table, exactly once.
//!
//! The snapshot a checkpoint commits carries `floe.job` and `floe.checkpoint` in its
//! summary. Before committing, the table's snapshots are searched for this job's
//! checkpoint (or a later one): if it is there, the commit happened before a crash and is
//! skipped. Commit conflicts with other writers are retried by iceberg-rust.

use std::collections::HashMap;
use std::sync::Arc;

use iceberg::spec::deserialize_data_file_from_json;
use iceberg::table::Table;
use iceberg::{Catalog, NamespaceIdent, TableIdent};

use super::state::PendingCommit;
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

/// Commit `pending` as checkpoint `checkpoint` of `job`, unless the table has it already.
/// Returns whether a snapshot was added.
pub async fn commit_once(
    catalog: &Arc<dyn Catalog>,
    pending: &PendingCommit,
    job: &str,
    checkpoint: u64,
) -> Result<bool> {
    let ident = TableIdent::new(
        NamespaceIdent::from_vec(pending.namespace.clone())?,
        pending.table.clone(),
    );
    let table = catalog.load_table(&ident).await?;
    if committed_checkpoint(&table, job).is_some_and(|c| c >= checkpoint) {
        return Ok(false);
    }
    let md = table.metadata();
    let spec = md.partition_spec_by_id(pending.spec_id).ok_or_else(|| {
        Error::Internal(format!(
            "table {ident} has no partition spec {} for checkpoint {checkpoint}",
            pending.spec_id
        ))
    })?;
    let partition_type = spec.partition_type(md.current_schema())?;
    let files = pending
        .files
        .iter()
        .map(|json| {
            deserialize_data_file_from_json(
                json,
                pending.spec_id,
                &partition_type,
                md.current_schema(),
            )
        })
        .collect::<iceberg::Result<Vec<_>>>()?;
    let summary = HashMap::from([
        (SUMMARY_JOB.to_string(), job.to_string()),
        (SUMMARY_CHECKPOINT.to_string(), checkpoint.to_string()),
    ]);
    commit::append(catalog, &table, files, summary).await?;
    Ok(true)
}
