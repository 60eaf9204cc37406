//! The sink of a continuous `INSERT INTO cat.ns.table SELECT ...`: one table, its rows
//! written as they come (the query casts them to the table's columns).

use std::collections::HashMap;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use iceberg::TableIdent;
use iceberg::table::Table;

use super::table_sink::TableSink;
use super::{Outcome, RowOrigins, Sink, commits};
use crate::checkpoint::PendingCommit;
use crate::error::Result;

/// One target table.
pub struct TableTarget {
    sink: TableSink,
}

impl TableTarget {
    pub fn new(sink: TableSink) -> Self {
        Self { sink }
    }
}

#[async_trait]
impl Sink for TableTarget {
    /// A row the table refuses fails the write: the job finds it (and its record).
    async fn write(
        &mut self,
        _source: &str,
        rows: RecordBatch,
        _origins: Option<RowOrigins>,
    ) -> Result<Outcome> {
        Ok(Outcome {
            rows: self.sink.write(rows).await?,
            rejected: Vec::new(),
        })
    }

    async fn flush(&mut self) -> Result<Outcome> {
        Ok(Outcome::default())
    }

    async fn close(&mut self) -> Result<Vec<PendingCommit>> {
        Ok(self.sink.close().await?.into_iter().collect())
    }

    fn known(&self) -> HashMap<TableIdent, Table> {
        let table = self.sink.table();
        HashMap::from([(table.identifier().clone(), table.clone())])
    }

    async fn after_commit(
        &mut self,
        pending: &[PendingCommit],
        committed: &HashMap<TableIdent, Table>,
    ) -> Result<Outcome> {
        let ident = self.sink.table().identifier().clone();
        if !commits(pending, &ident) {
            return Ok(Outcome::default());
        }
        let left_out = self.sink.after_commit(committed.get(&ident)).await?;
        Ok(Outcome::left_out(&ident.to_string(), left_out))
    }
}
