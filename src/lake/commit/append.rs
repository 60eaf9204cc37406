//! Appending data files with iceberg-rust's own action: one `fast_append` snapshot per
//! commit, carrying summary properties (a job's name and checkpoint id).

use std::collections::HashMap;
use std::sync::Arc;

use iceberg::Catalog;
use iceberg::spec::{DataFile, TableProperties};
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};

use crate::error::Result;

/// Append `files` to `table` in one snapshot with `summary` in its summary, and set
/// `properties` in the same commit. Commit conflicts are retried by iceberg-rust (it reloads
/// the table and re-applies the append). An empty list commits nothing and returns the table
/// unchanged.
pub async fn append(
    catalog: &Arc<dyn Catalog>,
    table: &Table,
    files: Vec<DataFile>,
    summary: HashMap<String, String>,
    properties: HashMap<String, String>,
) -> Result<Table> {
    if files.is_empty() {
        return Ok(table.clone());
    }
    let tx = Transaction::new(table);
    let action = tx
        .fast_append()
        .with_check_duplicate(false)
        .add_data_files(files)
        .set_snapshot_properties(summary);
    let mut tx = action.apply(tx)?;
    if !properties.is_empty() {
        let mut update = tx.update_table_properties();
        for (k, v) in properties {
            update = update.set(k, v);
        }
        tx = update.apply(tx)?;
    }
    // The data files were written without syncing each (see `lake::storage`).
    crate::lake::storage::sync_written().await?;
    Ok(tx.commit(catalog.as_ref()).await?)
}

/// `table` with iceberg-rust's commit retries off, for [`append`] to return a conflict
/// instead of retrying it: iceberg-rust's retry re-applies the append to the table as it is
/// then, and so does its first attempt (it loads the table again), without asking whether
/// the commit is still wanted. The caller asks the table (a checkpoint's mark,
/// [`crate::checkpoint::commit`]) and tries again itself. The transaction's retries come from
/// the properties of the table it starts from; its commit starts over from the table as
/// loaded, so this copy is never committed (nor returned: give it files).
pub fn without_retries(table: &Table) -> Result<Table> {
    let mut settings = table.metadata().properties().clone();
    settings.insert(
        TableProperties::PROPERTY_COMMIT_NUM_RETRIES.to_string(),
        "0".to_string(),
    );
    let metadata = table
        .metadata()
        .clone()
        .into_builder(table.metadata_location().map(str::to_string))
        .set_properties(settings)?
        .build()?
        .metadata;
    super::table_like(table, metadata, table.metadata_location())
}
