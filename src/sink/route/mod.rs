//! `ROUTE BY`: every row goes to the table its route value names, in one namespace.
//!
//! ```text
//! query output + __floe_route --group rows by route--> table name (lower-cased, [a-z0-9_])
//!     unknown table: created on first sight (its columns, the partition candidates it has)
//!     known table:   TableSink (schema and spec evolve with the rows)
//!     NULL, empty or too long route, too many tables, rows a table cannot take: dead letters
//! a table's rows: slices of the routed batches, gathered
//!     --32 MiB, or route.buffer-size for all tables--> a row group of its open file
//!     --checkpoint (or route.max-open-files)--> file closed, committed
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{Array, RecordBatch};
use datafusion::arrow::datatypes::SchemaRef;
use iceberg::table::Table;
use iceberg::{Catalog, NamespaceIdent, TableIdent};

mod budget;
mod groups;
mod open;
mod options;

pub use options::{MAX_TABLE_NAME_BYTES, RouteOptions, table_name};

use budget::{Closing, write_unwritten};
use groups::{Groups, drop_all_null_columns};
use open::Opener;

use super::table_sink::TableSink;
use super::{Outcome, Rejected, RowOrigins, Sink};
use crate::checkpoint::PendingCommit;
use crate::connector::Origin;
use crate::error::{Error, Reject, Result};
use crate::lake::commit::Committer;
use crate::schema::narrow_integers;

/// The column the routed query adds with each row's route value.
pub const ROUTE_COLUMN: &str = "__floe_route";

/// The tables one routed job writes.
pub struct RoutedSink {
    catalog_name: String,
    catalog: Arc<dyn Catalog>,
    /// floe's commit path to the catalog, when it has one (a SQL catalog's new tables are
    /// created by their first commit through it, see [`Opener::open_all`]).
    committer: Option<Arc<Committer>>,
    namespace: NamespaceIdent,
    options: RouteOptions,
    tables: HashMap<String, TableSink>,
    /// When each table was last written (a counter), to close the least recent.
    last_write: HashMap<String, u64>,
    writes: u64,
    /// Routed batches some table still gathers rows of (tables gather slices of them), the
    /// oldest first: sequence number and bytes. Together, the job's gathered rows.
    routed: std::collections::VecDeque<(u64, usize)>,
    /// Bytes of `routed`.
    routed_bytes: usize,
    /// The next routed batch's sequence number.
    seq: u64,
    /// Tables gathering rows, with the oldest routed batch they hold rows of.
    holds: HashMap<String, u64>,
    /// The routed rows' schema, one allocation shared by every batch that has it (a table
    /// recognises rows it took before by it, see [`TableSink::write`]).
    schema: Option<SchemaRef>,
    /// Gatherings being written out as files on the blocking pool (see `bound`).
    closing: Option<Closing>,
    /// The query's output not routed yet, with the source of its records (see
    /// [`ROUTE_ROWS`]), and its rows.
    gathered: Vec<(String, RecordBatch, Option<RowOrigins>)>,
    gathered_rows: usize,
    /// Their memory (Arrow buffers).
    gathered_bytes: usize,
    /// Every table the job has written since it started, cached or not: what
    /// `route.max-tables` bounds (the cache forgets idle tables; the bound does not).
    written_tables: std::collections::HashSet<String>,
}

/// Rows a routed job gathers before routing them: each table's share of a routed batch costs
/// per slice (checks, bookkeeping) as well as per row, and a thousand tables' shares of one
/// poll are a few rows each. Wide rows are routed sooner: at a quarter of
/// `route.buffer-size` in memory.
const ROUTE_ROWS: usize = 262_144;

impl RoutedSink {
    pub fn new(
        catalog_name: &str,
        catalog: &Arc<dyn Catalog>,
        namespace: NamespaceIdent,
        options: RouteOptions,
    ) -> Self {
        Self {
            catalog_name: catalog_name.to_string(),
            catalog: catalog.clone(),
            committer: None,
            namespace,
            options,
            tables: HashMap::new(),
            last_write: HashMap::new(),
            writes: 0,
            routed: Default::default(),
            routed_bytes: 0,
            seq: 0,
            holds: HashMap::new(),
            schema: None,
            closing: None,
            gathered: Vec::new(),
            gathered_rows: 0,
            gathered_bytes: 0,
            written_tables: Default::default(),
        }
    }

    /// The same sink, creating new tables through `committer` (a SQL catalog's by their
    /// first commit, with the checkpoint's other commits, in one transaction).
    pub fn with_committer(mut self, committer: Option<Arc<Committer>>) -> Self {
        self.committer = committer;
        self
    }

    /// `batch` with the schema allocation earlier batches of the same schema had.
    fn share_schema(&mut self, batch: RecordBatch) -> Result<RecordBatch> {
        match &self.schema {
            Some(s) if Arc::ptr_eq(s, &batch.schema()) => Ok(batch),
            Some(s) if **s == *batch.schema() => batch
                .with_schema(s.clone())
                .map_err(|e| Error::Internal(format!("sharing a batch schema: {e}"))),
            _ => {
                self.schema = Some(batch.schema());
                Ok(batch)
            }
        }
    }

    /// Route the rows gathered, in runs of one source, schema and set of all-NULL columns.
    async fn route_gathered(&mut self) -> Result<Outcome> {
        let gathered = std::mem::take(&mut self.gathered);
        self.gathered_rows = 0;
        self.gathered_bytes = 0;
        let mut outcome = Outcome::default();
        for (source, batches, origins) in runs(gathered) {
            outcome = outcome.and(self.route(&source, &batches, &origins).await?);
        }
        Ok(outcome)
    }

    /// Route and write `batches` (the query's output with [`ROUTE_COLUMN`], of one schema,
    /// for records of `source`). Returns the rows written and the rows rejected.
    async fn route(
        &mut self,
        source: &str,
        batches: &[RecordBatch],
        origins: &[Option<RowOrigins>],
    ) -> Result<Outcome> {
        let Some(first) = batches.first() else {
            return Ok(Outcome::default());
        };
        let route_at = first
            .schema()
            .index_of(ROUTE_COLUMN)
            .map_err(|_| Error::Internal(format!("routed output lacks {ROUTE_COLUMN}")))?;
        let keep: Vec<usize> = (0..first.num_columns())
            .filter(|&i| i != route_at)
            .collect();
        let mut data = Vec::with_capacity(batches.len());
        for b in batches {
            let projected = b
                .project(&keep)
                .map_err(|e| Error::Internal(format!("dropping the route column: {e}")))?;
            data.push(self.share_schema(projected)?);
        }
        let routes: Vec<&dyn Array> = batches
            .iter()
            .map(|b| b.column(route_at).as_ref())
            .collect();
        let groups = match Groups::of(&routes) {
            Ok(g) => g,
            // Route values that name no table at all (a struct, say): every row of the run
            // is a dead letter, none is lost.
            Err(Error::Record(reject)) => {
                let rejected = data
                    .into_iter()
                    .zip(origins)
                    .map(|(rows, o)| Rejected {
                        source: source.to_string(),
                        records: o.as_ref().map_or_else(Vec::new, |o| {
                            (0..rows.num_rows()).map(|r| o.origin(r)).collect()
                        }),
                        rows,
                        reject: reject.clone(),
                        table: None,
                    })
                    .collect();
                return Ok(Outcome { rows: 0, rejected });
            }
            Err(e) => return Err(e),
        };
        // The records of `n` rows from `at` in the routed order, when the rows say.
        let records = |at: usize, n: usize| -> Vec<Option<Origin>> {
            if origins.iter().all(Option::is_none) {
                return Vec::new();
            }
            (at..at + n)
                .map(|k| {
                    let (b, r) = groups.source_row(k);
                    origins.get(b)?.as_ref()?.origin(r)
                })
                .collect()
        };
        let mut rejected = Vec::new();
        // Each table's rows, in slices of the routed batches, with where each starts in the
        // routed order.
        let mut slices: Vec<(String, RecordBatch, usize)> = Vec::new();
        let routed = if groups.is_identity() {
            if let Some(name) = groups.names.first() {
                let mut at = 0;
                for b in &data {
                    slices.push((name.clone(), b.clone(), at));
                    at += b.num_rows();
                }
            }
            data
        } else {
            // One gather puts each table's rows next to each other; a table's rows are then
            // a slice of it (a take per table costs per call as much as per row).
            let sorted = groups.gather(&data)?;
            if groups.unroutable > 0 {
                let start = sorted.num_rows() - groups.unroutable;
                rejected.push(Rejected {
                    source: source.to_string(),
                    records: records(start, groups.unroutable),
                    rows: sorted.slice(start, groups.unroutable),
                    reject: Reject::new(format!(
                        "the ROUTE BY value is NULL, empty, or makes a table name longer than \
                         {MAX_TABLE_NAME_BYTES} bytes"
                    )),
                    table: None,
                });
            }
            let mut start = 0;
            for (name, &end) in groups.names.iter().zip(&groups.ends) {
                slices.push((name.clone(), sorted.slice(start, end - start), start));
                start = end;
            }
            vec![sorted]
        };
        // A route value may not name the dead-letter table: its rows would share that table,
        // and its checkpoint two commits for it.
        let reserved = &self.options.dead_letter_table;
        let is_reserved =
            |name: &String| name == reserved || table_name(reserved).as_ref() == Some(name);
        let (reserved_rows, kept): (Vec<_>, Vec<_>) = slices
            .into_iter()
            .partition(|(name, _, _)| is_reserved(name));
        slices = kept;
        for (name, rows, at) in reserved_rows {
            rejected.push(Rejected {
                source: source.to_string(),
                records: records(at, rows.num_rows()),
                rows,
                reject: Reject::new(format!(
                    "the ROUTE BY value names table '{name}', this job's dead-letter table"
                )),
                table: None,
            });
        }
        let seq = self.seq;
        self.seq += 1;
        let bytes = routed.iter().map(RecordBatch::get_array_memory_size).sum();
        self.routed.push_back((seq, bytes));
        self.routed_bytes += bytes;
        for (name, rows, _) in &mut slices {
            *rows = drop_all_null_columns(rows)?;
            if self.options.int_integers {
                *rows = narrow_integers(self.tables.get(name).map(TableSink::schema), rows)?;
            }
        }
        // Tables seen for the first time are opened (or created) several at a time.
        let mut new: Vec<(String, &RecordBatch)> = Vec::new();
        let mut seen: std::collections::HashSet<&str> = Default::default();
        for (name, rows, _) in &slices {
            if self.tables.contains_key(name) || !seen.insert(name) {
                continue;
            }
            if self.written_tables.contains(name)
                || self.written_tables.len() + new.len() < self.options.max_tables
            {
                new.push((name.clone(), rows));
            }
        }
        let opener = Opener {
            catalog_name: self.catalog_name.clone(),
            catalog: self.catalog.clone(),
            committer: self.committer.clone(),
            namespace: self.namespace.clone(),
            options: self.options.clone(),
            made: Default::default(),
        };
        // A table its rows cannot create (their columns make no schema) rejects them.
        let mut refused: HashMap<String, Reject> = HashMap::new();
        let names: Vec<String> = new.iter().map(|(name, _)| name.clone()).collect();
        for (name, sink) in names.into_iter().zip(opener.open_all(&new).await?) {
            match sink {
                Ok(sink) => {
                    self.written_tables.insert(name.clone());
                    self.tables.insert(name, sink);
                }
                Err(Error::Record(reject)) => {
                    refused.insert(name, reject);
                }
                Err(e) => return Err(e),
            }
        }
        let mut written = 0;
        for (name, rows, at) in slices {
            if let Some(reject) = refused.get(&name) {
                rejected.push(Rejected {
                    source: source.to_string(),
                    records: records(at, rows.num_rows()),
                    rows,
                    reject: reject.clone(),
                    table: None,
                });
                continue;
            }
            if !self.tables.contains_key(&name) {
                rejected.push(Rejected {
                    source: source.to_string(),
                    records: records(at, rows.num_rows()),
                    rows,
                    reject: Reject::new(format!(
                        "route.max-tables ({}) reached: table '{name}' is not created",
                        self.options.max_tables
                    )),
                    table: Some(name),
                });
                continue;
            }
            // An idle table's metadata older than the refresh interval is loaded again, so
            // that changes other writers made are seen before writing.
            let closing = self
                .closing
                .as_ref()
                .is_some_and(|c| c.tables.contains(&name));
            if let Some(t) = self.tables.get_mut(&name)
                && !closing
                && t.is_idle()
                && t.age() > self.options.cache_refresh
            {
                // (An idle table has no rows written since: none can be left out.)
                let left_out = t.after_commit(None).await?;
                rejected.extend(Outcome::left_out(&name, left_out).rejected);
            }
            self.writes += 1;
            self.last_write.insert(name.clone(), self.writes);
            let Some(sink) = self.tables.get_mut(&name) else {
                continue;
            };
            // A write that fails writes nothing: the rows the table refuses are found by
            // halving (the others are written).
            let mut parts = vec![(at, rows)];
            while let Some((at, part)) = parts.pop() {
                match sink.write(part.clone()).await {
                    Ok(n) => written += n,
                    Err(Error::Record(_)) if part.num_rows() > 1 => {
                        let half = part.num_rows() / 2;
                        parts.push((at + half, part.slice(half, part.num_rows() - half)));
                        parts.push((at, part.slice(0, half)));
                    }
                    Err(Error::Record(reject)) => rejected.push(Rejected {
                        source: source.to_string(),
                        records: records(at, part.num_rows()),
                        rows: part,
                        reject,
                        table: Some(name.clone()),
                    }),
                    Err(e) => return Err(e),
                }
            }
            if sink.buffered_bytes() > 0 {
                self.holds.entry(name.clone()).or_insert(seq);
            }
        }
        self.bound().await?;
        Ok(Outcome {
            rows: written,
            rejected,
        })
    }
}

#[async_trait]
impl Sink for RoutedSink {
    /// Gather `rows` (from `source`); route what is gathered once it is `ROUTE_ROWS`.
    async fn write(
        &mut self,
        source: &str,
        rows: RecordBatch,
        origins: Option<RowOrigins>,
    ) -> Result<Outcome> {
        self.gathered_rows += rows.num_rows();
        self.gathered_bytes += rows.get_array_memory_size();
        self.gathered.push((source.to_string(), rows, origins));
        if self.gathered_rows < ROUTE_ROWS && self.gathered_bytes < self.options.buffer_size / 4 {
            return Ok(Outcome::default());
        }
        self.route_gathered().await
    }

    async fn flush(&mut self) -> Result<Outcome> {
        self.route_gathered().await
    }

    /// Close every table's files: what the checkpoint commits. The rows gathered are written
    /// and the files closed on the blocking pool, several tables at once (the job waits
    /// for them: using every core shortens the pause).
    async fn close(&mut self) -> Result<Vec<PendingCommit>> {
        self.finish_closing().await?;
        let mut unwritten = Vec::new();
        for (name, sink) in &mut self.tables {
            if let Some(u) = sink.take_unwritten(true)? {
                unwritten.push((name.clone(), u));
            }
        }
        let written = write_unwritten(unwritten).await?;
        self.give_back(written).await?;
        let mut out = Vec::new();
        for sink in self.tables.values_mut() {
            out.extend(sink.close().await?);
        }
        self.holds.clear();
        self.release();
        Ok(out)
    }

    /// The tables as last committed, by identifier: what the next commit starts from.
    fn known(&self) -> HashMap<TableIdent, Table> {
        self.tables
            .values()
            .map(|t| (t.table().identifier().clone(), t.table().clone()))
            .collect()
    }

    /// After a checkpoint committed `tables` (`committed` has those the commit gave back):
    /// each is its sink's new base. Then, beyond `table-cache.max-size`, the least recently
    /// written tables are forgotten (opened again when rows for them come).
    async fn after_commit(
        &mut self,
        pending: &[PendingCommit],
        committed: &HashMap<TableIdent, Table>,
    ) -> Result<Outcome> {
        // Files still being closed belong to the tables' next commit: they must be there
        // before a table is refreshed or forgotten.
        self.finish_closing().await?;
        let names: std::collections::HashSet<&str> =
            pending.iter().map(|p| p.table.as_str()).collect();
        let mut sinks: Vec<&mut TableSink> = self
            .tables
            .iter_mut()
            .filter(|(name, _)| names.contains(name.as_str()))
            .map(|(_, sink)| sink)
            .collect();
        let mut outcome = Outcome::default();
        for chunk in sinks.chunks_mut(8) {
            let reloads = chunk.iter_mut().map(|s| async {
                let ident = s.table().identifier().clone();
                let left_out = s.after_commit(committed.get(&ident)).await?;
                Ok::<_, Error>(Outcome::left_out(ident.name(), left_out))
            });
            for left_out in futures::future::try_join_all(reloads).await? {
                outcome = outcome.and(left_out);
            }
        }
        if self.tables.len() > self.options.cache_max_size {
            let mut idle: Vec<(u64, String)> = self
                .tables
                .iter()
                .filter(|(_, t)| t.is_idle())
                .map(|(n, _)| (self.last_write.get(n).copied().unwrap_or(0), n.clone()))
                .collect();
            idle.sort();
            let excess = self.tables.len() - self.options.cache_max_size;
            for (_, name) in idle.into_iter().take(excess) {
                self.tables.remove(&name);
                self.last_write.remove(&name);
            }
        }
        Ok(outcome)
    }
}

/// Batches of one source routed together, with where each one's rows came from.
type Run = (String, Vec<RecordBatch>, Vec<Option<RowOrigins>>);

/// Runs of batches of one source, schema and set of columns that are NULL throughout, in
/// order: rows keep their order within each table, and a column that starts (or stops)
/// carrying values starts a run of its own, so that routed tables see it appear as they
/// would batch by batch (created without it, then evolved: partition candidates included).
fn runs(batches: Vec<(String, RecordBatch, Option<RowOrigins>)>) -> Vec<Run> {
    let all_null = |b: &RecordBatch| -> Vec<bool> {
        b.columns()
            .iter()
            .map(|c| c.null_count() == c.len())
            .collect()
    };
    let mut runs: Vec<Run> = Vec::new();
    for (source, batch, origins) in batches {
        match runs.last_mut() {
            Some((s, run, o))
                if *s == source
                    && run[0].schema() == batch.schema()
                    && all_null(&run[0]) == all_null(&batch) =>
            {
                run.push(batch);
                o.push(origins);
            }
            _ => runs.push((source, vec![batch], vec![origins])),
        }
    }
    runs
}
