//! `ROUTE BY`: every row goes to the table its route value names, in one namespace.
//!
//! ```text
//! query output + __floe_route --group rows by route--> table name (lower-cased, [a-z0-9_])
//!     unknown table: created on first sight (its columns, the partition candidates it has)
//!     known table:   TableSink (schema and spec evolve with the rows)
//!     NULL or empty route, too many tables, rows a table cannot take: dead letters
//! a table's rows: slices of the routed batches, gathered
//!     --32 MiB, or route.buffer-size for all tables--> a row group of its open file
//!     --checkpoint (or route.max-open-files)--> file closed, committed
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, RecordBatch, UInt32Array};
use datafusion::arrow::compute::{cast, interleave_record_batch, take_record_batch};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::datatypes::{DataType, Schema as ArrowSchema};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser as SqlParser;
use iceberg::table::Table;
use iceberg::{Catalog, ErrorKind, NamespaceIdent, TableCreation, TableIdent};

use super::table_sink::{Candidate, TableSink, Unwritten, Written, spec_for};
use crate::checkpoint::PendingCommit;
use crate::error::{Error, Reject, Result, joined};
use crate::lake::storage::with_inline_io;
use crate::schema::iceberg_schema;
use crate::schema::narrow_integers;
use crate::schema::partition::partition_field;
use crate::sql::Options;

/// The column the routed query adds with each row's route value.
pub const ROUTE_COLUMN: &str = "__floe_route";

/// The options of a routed INSERT.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteOptions {
    pub candidates: Vec<Candidate>,
    pub evolve: bool,
    pub table_properties: BTreeMap<String, String>,
    pub dead_letter_table: String,
    pub max_tables: usize,
    /// Data files open at once (one per table and partition written since the last
    /// checkpoint); beyond it the least recently written tables' files are closed.
    pub max_open_files: usize,
    /// Routed rows gathered for the tables' next row groups, in bytes (see [`BUFFER_SIZE`]).
    pub buffer_size: usize,
    /// Match top-level columns to tables' ignoring ASCII case.
    pub case_insensitive: bool,
    /// `'json.infer.integers' = 'int'`: inferred integers are ints until a value needs a long.
    pub int_integers: bool,
    /// Tables whose metadata (and sink) the job keeps between checkpoints.
    pub cache_max_size: usize,
    /// How old an idle table's metadata may be before it is loaded again.
    pub cache_refresh: std::time::Duration,
}

impl RouteOptions {
    /// Read the `WITH (...)` options of a routed INSERT; unknown keys are errors.
    pub fn try_new(mut options: Options) -> Result<Self> {
        let candidates = match options.take_str("partition.candidates") {
            Some(list) => parse_candidates(&list)?,
            None => Vec::new(),
        };
        let evolve = options.take_choice("schema.evolution", &["on", "off"])? != Some("off");
        let case_insensitive = options
            .take_bool("schema.case-insensitive")?
            .unwrap_or(false);
        let int_integers =
            options.take_choice("json.infer.integers", &["long", "int"])? == Some("int");
        let table_properties = options.take_prefixed("table.properties.");
        let dead_letter_table = options
            .take_str("dead-letter.table")
            .unwrap_or_else(|| crate::sink::dead_letter::DEAD_LETTER_TABLE.to_string());
        let max_tables = positive(&mut options, "route.max-tables", 10_000)?;
        let max_open_files = positive(&mut options, "route.max-open-files", 1_000)?;
        let buffer_size = match options.take_size("route.buffer-size")? {
            None => BUFFER_SIZE,
            Some(0) => {
                return Err(Error::Option(
                    "'route.buffer-size' must be more than 0 bytes".into(),
                ));
            }
            Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        };
        let cache_max_size = positive(&mut options, "table-cache.max-size", 1_000)?;
        let cache_refresh = options
            .take_duration("table-cache.refresh-interval")?
            .unwrap_or(std::time::Duration::from_secs(60));
        options.finish()?;
        Ok(Self {
            candidates,
            evolve,
            table_properties,
            dead_letter_table,
            max_tables,
            max_open_files,
            buffer_size,
            case_insensitive,
            int_integers,
            cache_max_size,
            cache_refresh,
        })
    }
}

/// The positive number option `key`, or `default`.
fn positive(options: &mut Options, key: &str, default: usize) -> Result<usize> {
    Ok(options
        .take_positive(key)?
        .map_or(default, |n| usize::try_from(n).unwrap_or(usize::MAX)))
}

/// `'days(event_time), region, bucket(16, id)'` as candidates.
fn parse_candidates(list: &str) -> Result<Vec<Candidate>> {
    let exprs = SqlParser::new(&GenericDialect {})
        .try_with_sql(list)
        .and_then(|mut p| p.parse_comma_separated(|p| p.parse_expr()))
        .map_err(|e| Error::Option(format!("'partition.candidates' = '{list}': {e}")))?;
    exprs
        .iter()
        .map(|e| {
            let (column, transform, suffix) = partition_field(e)?;
            let name = match suffix {
                None => column.clone(),
                Some(s) => format!("{column}_{s}"),
            };
            Ok(Candidate {
                column,
                transform,
                name,
            })
        })
        .collect()
}

/// The table name for a route value: lower-cased, every character outside `[a-z0-9_]` as
/// `_`; `None` for an empty value.
pub fn table_name(route: &str) -> Option<String> {
    let name: String = route
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    (!name.is_empty()).then_some(name)
}

/// Rows that could not be routed or written, with why.
pub struct Rejected {
    pub rows: RecordBatch,
    pub reject: Reject,
    pub table: Option<String>,
}

/// The tables one routed job writes.
pub struct RoutedSink {
    catalog_name: String,
    catalog: Arc<dyn Catalog>,
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
    /// Gatherings being written out as files on the blocking pool (see `bound_buffers`).
    closing: Option<Closing>,
}

/// What writing gave back, per table.
type WrittenTables = Vec<(String, Written)>;

/// Tables' gathered rows being written (and files closed) in the background.
struct Closing {
    tables: std::collections::HashSet<String>,
    task: tokio::task::JoinHandle<Result<WrittenTables>>,
}

/// Write `unwritten` (per table) on the blocking pool, on a few threads per core, each
/// taking the next table when done (few threads: each keeps the memory its work allocated
/// for its next work, rather than every thread of the pool keeping some).
async fn write_unwritten(unwritten: Vec<(String, Unwritten)>) -> Result<WrittenTables> {
    if unwritten.is_empty() {
        return Ok(Vec::new());
    }
    let runtime = tokio::runtime::Handle::current();
    let threads = std::thread::available_parallelism().map_or(2, |n| 2 * n.get());
    let queue = Arc::new(std::sync::Mutex::new(unwritten));
    let closers: Vec<_> = (0..threads)
        .map(|_| {
            let (queue, runtime) = (queue.clone(), runtime.clone());
            tokio::task::spawn_blocking(move || {
                let mut closed = Vec::new();
                loop {
                    let next = queue
                        .lock()
                        .map_err(|_| Error::Internal("a table's files failed to close".into()))?
                        .pop();
                    let Some((name, u)) = next else {
                        return Ok::<_, Error>(closed);
                    };
                    closed.push((name, with_inline_io(|| runtime.block_on(u.write()))?));
                }
            })
        })
        .collect();
    let mut closed = Vec::new();
    for c in closers {
        closed.extend(joined(c, "writing tables' files").await?);
    }
    Ok(closed)
}

/// By default (`route.buffer-size`): beyond this many bytes of routed batches whose rows
/// tables gather (as slices of them), every table's gathering becomes a row group of its
/// table's open files, in the background; the next time waits for that. So rows gathered
/// and rows being written take at most twice this. (Rows are gathered in Arrow rather than in row groups under way: a
/// row group being written costs about a MiB per table in encoders and compression contexts
/// however few rows it holds.)
const BUFFER_SIZE: usize = 128 << 20;

/// A table's gathered rows become a row group of its file at this size (in Arrow), or at a
/// quarter of `route.buffer-size` if less.
const ROW_GROUP_BYTES: usize = 32 << 20;

/// Tables opened or created at once when a poll names several new ones.
const PARALLEL_OPENS: usize = 8;

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
        }
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

    /// Forget the routed batches no table gathers rows of any more.
    fn release(&mut self) {
        let oldest = self.holds.values().min().copied().unwrap_or(u64::MAX);
        while let Some(&(seq, bytes)) = self.routed.front() {
            if seq >= oldest {
                break;
            }
            self.routed.pop_front();
            self.routed_bytes -= bytes;
        }
    }

    /// Keep the job's memory bounded: a table's gathering of [`ROW_GROUP_BYTES`] becomes a
    /// row group of its open files; beyond `route.buffer-size` of routed batches gathered,
    /// every table's gathering does; beyond `route.max-open-files`, the least recently
    /// written tables' files are closed, down to seven eighths of the cap, and so are the
    /// files an object store holds most bytes of beyond `route.buffer-size`. All on the
    /// blocking pool while the job goes on (the next time waits for it).
    async fn bound(&mut self) -> Result<()> {
        self.release();
        if self.closing.as_ref().is_some_and(|c| c.task.is_finished()) {
            self.finish_closing().await?;
        }
        // Per table: whether to close its files.
        let mut victims: HashMap<String, bool> = HashMap::new();
        let mut open: Vec<(u64, usize, &String)> = self
            .tables
            .iter()
            .map(|(n, t)| {
                (
                    self.last_write.get(n).copied().unwrap_or(0),
                    t.open_files(),
                    n,
                )
            })
            .filter(|(_, files, _)| *files > 0)
            .collect();
        let cap = self.options.max_open_files;
        let mut files: usize = open.iter().map(|(_, f, _)| f).sum();
        if files > cap {
            open.sort_unstable();
            let keep = (cap - cap / 8).max(1);
            for (_, f, name) in open {
                if files <= keep {
                    break;
                }
                files -= f;
                victims.insert(name.clone(), true);
            }
        }
        let buffer = self.options.buffer_size;
        if self.routed_bytes > buffer {
            for name in self.holds.keys() {
                victims.entry(name.clone()).or_insert(false);
            }
        } else {
            for (name, t) in &self.tables {
                if t.buffered_bytes() >= ROW_GROUP_BYTES.min(buffer / 4) {
                    victims.entry(name.clone()).or_insert(false);
                }
            }
        }
        if victims.is_empty() {
            return Ok(());
        }
        // (The writers are all back: their files' bytes count.)
        self.finish_closing().await?;
        self.close_holding(&mut victims);
        let mut unwritten = Vec::new();
        for (name, close) in victims {
            self.holds.remove(&name);
            let Some(sink) = self.tables.get_mut(&name) else {
                continue;
            };
            if let Some(u) = sink.take_unwritten(close)? {
                unwritten.push((name, u));
            }
        }
        self.release();
        self.closing = Some(Closing {
            tables: unwritten.iter().map(|(n, _)| n.clone()).collect(),
            task: tokio::spawn(write_unwritten(unwritten)),
        });
        Ok(())
    }

    /// Object stores hold what is written to a file in memory until a part's worth: beyond
    /// `route.buffer-size` held, the files holding most are to be closed (uploaded), down to
    /// half.
    fn close_holding(&self, victims: &mut HashMap<String, bool>) {
        let buffer = self.options.buffer_size;
        let mut held: Vec<(usize, &String)> = self
            .tables
            .iter()
            .map(|(n, t)| (t.held_bytes(), n))
            .filter(|(b, _)| *b > 0)
            .collect();
        let mut holding: usize = held.iter().map(|(b, _)| b).sum();
        if holding <= buffer {
            return;
        }
        held.sort_unstable_by(|a, b| b.cmp(a));
        for (b, name) in held {
            if holding <= buffer / 2 {
                break;
            }
            holding -= b;
            victims.insert(name.clone(), true);
        }
    }

    /// Wait for the gatherings being written out, and give each table its files.
    async fn finish_closing(&mut self) -> Result<()> {
        let Some(closing) = self.closing.take() else {
            return Ok(());
        };
        let written = joined(closing.task, "writing out gathered rows").await?;
        self.give_back(written).await
    }

    /// What writing gave back, to each table's sink.
    async fn give_back(&mut self, written: WrittenTables) -> Result<()> {
        for (name, w) in written {
            if let Some(sink) = self.tables.get_mut(&name) {
                sink.give_back(w).await?;
            }
        }
        Ok(())
    }

    /// The name of the dead-letter table in the namespace.
    pub fn dead_letter_table(&self) -> &str {
        &self.options.dead_letter_table
    }

    /// Route and write `batches` (the query's output with [`ROUTE_COLUMN`], of one schema).
    /// Returns the rows written and the rows rejected.
    pub async fn write(&mut self, batches: &[RecordBatch]) -> Result<(u64, Vec<Rejected>)> {
        let Some(first) = batches.first() else {
            return Ok((0, Vec::new()));
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
        let groups = Groups::of(&routes)?;
        let mut rejected = Vec::new();
        // Each table's rows, in slices of the routed batches.
        let mut slices: Vec<(String, RecordBatch)> = Vec::new();
        let routed = if groups.is_identity() {
            if let Some(name) = groups.names.first() {
                slices.extend(data.iter().map(|b| (name.clone(), b.clone())));
            }
            data
        } else {
            // One gather puts each table's rows next to each other; a table's rows are then
            // a slice of it (a take per table costs per call as much as per row).
            let sorted = groups.gather(&data)?;
            if groups.unroutable > 0 {
                let start = sorted.num_rows() - groups.unroutable;
                rejected.push(Rejected {
                    rows: sorted.slice(start, groups.unroutable),
                    reject: Reject::new("the ROUTE BY value is NULL or empty"),
                    table: None,
                });
            }
            let mut start = 0;
            for (name, &end) in groups.names.iter().zip(&groups.ends) {
                slices.push((name.clone(), sorted.slice(start, end - start)));
                start = end;
            }
            vec![sorted]
        };
        let seq = self.seq;
        self.seq += 1;
        let bytes = routed.iter().map(RecordBatch::get_array_memory_size).sum();
        self.routed.push_back((seq, bytes));
        self.routed_bytes += bytes;
        for (name, rows) in &mut slices {
            *rows = drop_all_null_columns(rows)?;
            if self.options.int_integers {
                *rows = narrow_integers(self.tables.get(name).map(TableSink::schema), rows)?;
            }
        }
        // Tables seen for the first time are opened (or created) several at a time.
        let mut new: Vec<(String, &RecordBatch)> = Vec::new();
        for (name, rows) in &slices {
            if self.tables.contains_key(name) || new.iter().any(|(n, _)| n == name) {
                continue;
            }
            if self.tables.len() + new.len() < self.options.max_tables {
                new.push((name.clone(), rows));
            }
        }
        let opener = Opener {
            catalog_name: self.catalog_name.clone(),
            catalog: self.catalog.clone(),
            namespace: self.namespace.clone(),
            options: self.options.clone(),
        };
        for chunk in new.chunks(PARALLEL_OPENS) {
            let opens = chunk.iter().map(|(name, rows)| opener.open(name, rows));
            let sinks = futures::future::try_join_all(opens).await?;
            for ((name, _), sink) in chunk.iter().zip(sinks) {
                self.tables.insert(name.clone(), sink);
            }
        }
        let mut written = 0;
        for (name, rows) in slices {
            if !self.tables.contains_key(&name) {
                rejected.push(Rejected {
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
                t.after_commit(None).await?;
            }
            self.writes += 1;
            self.last_write.insert(name.clone(), self.writes);
            let Some(sink) = self.tables.get_mut(&name) else {
                continue;
            };
            let result = sink.write(rows.clone()).await;
            if sink.buffered_bytes() > 0 {
                self.holds.entry(name.clone()).or_insert(seq);
            }
            match result {
                Ok(n) => written += n,
                Err(Error::Record(reject)) => rejected.push(Rejected {
                    rows,
                    reject,
                    table: Some(name),
                }),
                Err(e) => return Err(e),
            }
        }
        self.bound().await?;
        Ok((written, rejected))
    }
}

/// What opening a routed table needs, apart from the sink's open writers (which must not be
/// borrowed across the catalog calls).
struct Opener {
    catalog_name: String,
    catalog: Arc<dyn Catalog>,
    namespace: NamespaceIdent,
    options: RouteOptions,
}

impl Opener {
    /// The table `name`: loaded, or created from the columns of its first rows.
    async fn open(&self, name: &str, rows: &RecordBatch) -> Result<TableSink> {
        let ident = TableIdent::new(self.namespace.clone(), name.to_string());
        let table = match self.catalog.load_table(&ident).await {
            Ok(t) => t,
            Err(e) if e.kind() == ErrorKind::TableNotFound => {
                let schema = iceberg_schema(rows.schema().as_ref(), true)?;
                let spec = spec_for(&schema, None, &self.options.candidates)?;
                let creation = TableCreation::builder()
                    .name(name.to_string())
                    .schema(schema)
                    .partition_spec_opt(spec)
                    .properties(self.options.table_properties.clone())
                    .build();
                match self.catalog.create_table(&self.namespace, creation).await {
                    Ok(t) => t,
                    Err(e) if e.kind() == ErrorKind::TableAlreadyExists => {
                        self.catalog.load_table(&ident).await?
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        };
        Ok(TableSink::new(
            &self.catalog_name,
            &self.catalog,
            table,
            self.options.evolve,
            self.options.candidates.clone(),
        )
        .deferred()
        .with_case_insensitive(self.options.case_insensitive))
    }
}

impl RoutedSink {
    /// Close every table's files: what the checkpoint commits. The rows gathered are written
    /// and the files closed on the blocking pool, several tables at once (the job waits
    /// for them: using every core shortens the pause).
    pub async fn close(&mut self) -> Result<Vec<PendingCommit>> {
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
    pub fn known(&self) -> HashMap<TableIdent, Table> {
        self.tables
            .values()
            .map(|t| (t.table().identifier().clone(), t.table().clone()))
            .collect()
    }

    /// After a checkpoint committed `tables` (`committed` has those the commit gave back):
    /// each is its sink's new base. Then, beyond `table-cache.max-size`, the least recently
    /// written tables are forgotten (opened again when rows for them come).
    pub async fn after_commit(
        &mut self,
        tables: &[PendingCommit],
        committed: &HashMap<TableIdent, Table>,
    ) -> Result<()> {
        // Files still being closed belong to the tables' next commit: they must be there
        // before a table is refreshed or forgotten.
        self.finish_closing().await?;
        let names: std::collections::HashSet<&str> =
            tables.iter().map(|p| p.table.as_str()).collect();
        let mut sinks: Vec<&mut TableSink> = self
            .tables
            .iter_mut()
            .filter(|(name, _)| names.contains(name.as_str()))
            .map(|(_, sink)| sink)
            .collect();
        for chunk in sinks.chunks_mut(8) {
            let reloads = chunk.iter_mut().map(|s| {
                let ident = s.table().identifier().clone();
                s.after_commit(committed.get(&ident))
            });
            futures::future::try_join_all(reloads).await?;
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
        Ok(())
    }

    /// How many tables the job has written.
    pub fn table_count(&self) -> usize {
        self.tables.len()
    }
}

/// A batch's rows grouped by the table their route value names.
struct Groups {
    /// The tables, in first-seen order (two route values may name one: `A`, `a`).
    names: Vec<String>,
    /// Row numbers (across the batches routed): each table's rows in turn (in their order),
    /// then the unroutable ones.
    order: Vec<u32>,
    /// Where each routed batch's rows start in the row numbers.
    starts: Vec<usize>,
    /// Where each table's rows end in `order`.
    ends: Vec<usize>,
    /// Rows whose route value is NULL or names no table (empty), last in `order`.
    unroutable: usize,
}

/// The group of a row whose route names no table.
const UNROUTABLE: u32 = u32::MAX;

impl Groups {
    /// Group the rows of `routes` (the route column of each batch routed, in turn).
    fn of(routes: &[&dyn Array]) -> Result<Self> {
        // Text as it comes (Utf8 and Utf8View without a copy), other types cast.
        let mut cast_ones = Vec::new();
        for r in routes {
            if r.as_string_opt::<i32>().is_none() && r.as_string_view_opt().is_none() {
                cast_ones.push(cast(*r, &DataType::Utf8).map_err(|e| {
                    Error::Record(Reject::new(format!("ROUTE BY value is not text: {e}")))
                })?);
            }
        }
        let mut cast_ones = cast_ones.iter();
        let texts: Vec<&dyn Array> = routes
            .iter()
            .map(|r| {
                if r.as_string_opt::<i32>().is_some() || r.as_string_view_opt().is_some() {
                    *r
                } else {
                    cast_ones.next().map_or(*r, |c| c.as_ref())
                }
            })
            .collect();
        let values = texts
            .iter()
            .flat_map(|a| -> Box<dyn Iterator<Item = Option<&str>>> {
                match a.as_string_opt::<i32>() {
                    Some(s) => Box::new(s.iter()),
                    None => Box::new(a.as_string_view().iter()),
                }
            });
        let mut starts = Vec::with_capacity(routes.len());
        let mut len = 0;
        for r in routes {
            starts.push(len);
            len += r.len();
        }
        let mut groups = Self::group(values, len);
        groups.starts = starts;
        Ok(groups)
    }

    /// The rows of `batches` (those routed) in the order of [`Self::order`].
    fn gather(&self, batches: &[RecordBatch]) -> Result<RecordBatch> {
        let gathered = if let [one] = batches {
            take_record_batch(one, &UInt32Array::from(self.order.clone()))
        } else {
            let indices: Vec<(usize, usize)> = self
                .order
                .iter()
                .map(|&row| {
                    let row = row as usize;
                    let b = self.starts.partition_point(|&s| s <= row) - 1;
                    (b, row - self.starts[b])
                })
                .collect();
            let batches: Vec<&RecordBatch> = batches.iter().collect();
            interleave_record_batch(&batches, &indices)
        };
        gathered.map_err(|e| Error::Internal(format!("grouping rows by route: {e}")))
    }

    fn group<'a>(routes: impl Iterator<Item = Option<&'a str>>, len: usize) -> Self {
        // Each distinct value is named once; a run of one value is looked up once.
        let mut names: Vec<String> = Vec::new();
        let mut counts: Vec<usize> = Vec::new();
        let mut group_of_name: HashMap<String, u32> = HashMap::new();
        let mut group_of_value: datafusion::common::HashMap<&str, u32> = Default::default();
        let mut last: Option<(&str, u32)> = None;
        let mut of_row: Vec<u32> = Vec::with_capacity(len);
        let mut unroutable = 0;
        for value in routes {
            let group = match value {
                None => UNROUTABLE,
                Some(v) => match last {
                    Some((l, g)) if l == v => g,
                    _ => {
                        let g = *group_of_value.entry(v).or_insert_with(|| {
                            table_name(v).map_or(UNROUTABLE, |name| {
                                *group_of_name.entry(name.clone()).or_insert_with(|| {
                                    names.push(name);
                                    counts.push(0);
                                    (counts.len() - 1) as u32
                                })
                            })
                        });
                        last = Some((v, g));
                        g
                    }
                },
            };
            match counts.get_mut(group as usize) {
                Some(c) => *c += 1,
                None => unroutable += 1,
            }
            of_row.push(group);
        }
        let ends: Vec<usize> = counts
            .iter()
            .scan(0, |end, c| {
                *end += c;
                Some(*end)
            })
            .collect();
        let mut next: Vec<usize> = std::iter::once(0)
            .chain(ends.iter().copied())
            .take(counts.len())
            .collect();
        let mut next_unroutable = len - unroutable;
        let mut order = vec![0u32; len];
        for (row, group) in of_row.into_iter().enumerate() {
            let slot = next.get_mut(group as usize).unwrap_or(&mut next_unroutable);
            order[*slot] = row as u32;
            *slot += 1;
        }
        Self {
            names,
            order,
            starts: vec![0],
            ends,
            unroutable,
        }
    }

    /// Whether every row goes to one table, in order: no gather is needed.
    fn is_identity(&self) -> bool {
        self.names.len() <= 1 && self.unroutable == 0
    }
}

/// A table's rows without the columns that are NULL in every row: a field its records did
/// not carry creates no column.
fn drop_all_null_columns(batch: &RecordBatch) -> Result<RecordBatch> {
    let keep: Vec<usize> = (0..batch.num_columns())
        .filter(|&i| batch.column(i).null_count() < batch.num_rows())
        .collect();
    if keep.len() == batch.num_columns() {
        return Ok(batch.clone());
    }
    let fields: Vec<_> = keep
        .iter()
        .map(|&i| batch.schema().field(i).clone())
        .collect();
    RecordBatch::try_new(
        Arc::new(ArrowSchema::new(fields)),
        keep.iter().map(|&i| batch.column(i).clone()).collect(),
    )
    .map_err(|e| Error::Internal(format!("dropping NULL columns: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_values_become_table_names() {
        assert_eq!(table_name("Order").as_deref(), Some("order"));
        assert_eq!(table_name("page-view").as_deref(), Some("page_view"));
        assert_eq!(table_name("a.b c/é").as_deref(), Some("a_b_c__"));
        assert_eq!(table_name(""), None);
    }

    #[test]
    fn rows_of_several_batches_gather_by_table() {
        use datafusion::arrow::array::{Int64Array, StringArray};
        let batch = |routes: Vec<Option<&str>>, ids: Vec<i64>| {
            RecordBatch::try_from_iter(vec![
                (
                    "route",
                    Arc::new(StringArray::from(routes)) as Arc<dyn Array>,
                ),
                ("id", Arc::new(Int64Array::from(ids))),
            ])
            .unwrap()
        };
        let batches = [
            batch(vec![Some("b"), Some("A"), None], vec![0, 1, 2]),
            batch(
                vec![Some("a"), Some("b"), Some(""), Some("a")],
                vec![3, 4, 5, 6],
            ),
        ];
        let routes: Vec<&dyn Array> = batches.iter().map(|b| b.column(0).as_ref()).collect();
        let g = Groups::of(&routes).unwrap();
        assert_eq!(g.names, vec!["b", "a"]);
        assert_eq!(g.ends, vec![2, 5]);
        assert_eq!(g.unroutable, 2);
        let sorted = g.gather(&batches).unwrap();
        let ids = sorted
            .column(1)
            .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
        assert_eq!(ids.values().to_vec(), vec![0, 4, 1, 3, 6, 2, 5]);
    }

    #[test]
    fn rows_group_by_table_in_first_seen_order() {
        use datafusion::arrow::array::{StringArray, StringViewArray};
        let values = vec![
            Some("b"),
            Some("A"),
            None,
            Some("a"),
            Some("b"),
            Some(""),
            Some("a"),
        ];
        for routes in [
            Arc::new(StringArray::from(values.clone())) as Arc<dyn Array>,
            Arc::new(StringViewArray::from(values.clone())),
        ] {
            let g = Groups::of(&[routes.as_ref()]).unwrap();
            // `A` and `a` name one table; NULL and empty name none and come last.
            assert_eq!(g.names, vec!["b", "a"]);
            assert_eq!(g.ends, vec![2, 5]);
            assert_eq!(g.unroutable, 2);
            assert_eq!(g.order, vec![0, 4, 1, 3, 6, 2, 5]);
            assert!(!g.is_identity());
        }
        let one = StringArray::from(vec!["x", "x", "X"]);
        let g = Groups::of(&[&one]).unwrap();
        assert!(g.is_identity());
        assert_eq!(g.order, vec![0, 1, 2]);
    }

    #[test]
    fn candidates_parse() {
        let c = parse_candidates("days(event_time), region, bucket(16, id)").unwrap();
        let names: Vec<&str> = c.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, vec!["event_time_day", "region", "id_bucket"]);
        assert!(parse_candidates("weeks(x)").is_err());
    }
}
