//! Everything a job writes to one table during a checkpoint: the open writer, the files
//! closed so far, and the schema and partition-spec changes the rows needed.
//!
//! ```text
//! batch --evolve--> (schema grows? spec grows?) --restage + new writer--> conform --> write
//! checkpoint: close --> PendingCommit {files per spec, new schema, new spec}
//! ```
//!
//! Nothing reaches the catalog before the checkpoint commits: the schema change and the data
//! land in one commit (see `lake::commit`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{BooleanArray, Int64Array, RecordBatch};
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::{DataType, Schema as ArrowSchema, SchemaRef};
use iceberg::Catalog;
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::spec::{
    DataFile, Schema, Transform, Type, UnboundPartitionField, UnboundPartitionSpec,
    serialize_data_file_to_json,
};
use iceberg::table::Table;

use crate::checkpoint::rewrite::rewrite_files;
use crate::checkpoint::{FileGroup, PendingCommit};
use crate::error::{Error, Reject, Result};
use crate::lake::commit::staged;
use crate::lake::{TableWriter, runtime, upsert};
use crate::schema::changes::{Changes, split_changes, without_source_table};
use crate::schema::merge::merge_schemas;
use crate::schema::types::column_count;
use crate::schema::{conform_to, evolve, match_case};
use crate::task::{AbortOnDrop, joined};

/// One partition candidate: a transform of a column, used by every table that has the
/// column with a type the transform takes.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub column: String,
    pub transform: Transform,
    /// The partition field's name (`ts_day`, `region`).
    pub name: String,
}

/// The partition spec `schema` gets from `candidates`, extending `current` (whose fields
/// are kept as they are); `None` when `current` already has every candidate that applies.
pub fn spec_for(
    schema: &Schema,
    current: Option<&UnboundPartitionSpec>,
    candidates: &[Candidate],
) -> Result<Option<UnboundPartitionSpec>> {
    let mut fields: Vec<UnboundPartitionField> =
        current.map(|s| s.fields().to_vec()).unwrap_or_default();
    let before = fields.len();
    for c in candidates {
        let Some(field) = schema.field_by_name(&c.column) else {
            continue;
        };
        if field.field_type.as_primitive_type().is_none()
            || c.transform.result_type(&field.field_type).is_err()
        {
            continue;
        }
        if fields
            .iter()
            .any(|f| f.source_id == field.id && f.transform == c.transform)
        {
            continue;
        }
        fields.push(UnboundPartitionField {
            source_id: field.id,
            field_id: None,
            name: c.name.clone(),
            transform: c.transform,
        });
    }
    if fields.len() == before {
        return Ok(None);
    }
    let mut builder = UnboundPartitionSpec::builder();
    for f in fields {
        builder = match f.field_id {
            Some(_) => builder.add_partition_fields(vec![f])?,
            None => builder.add_partition_field(f.source_id, f.name, f.transform)?,
        };
    }
    Ok(Some(builder.build()))
}

/// A job's writes to one table within the current checkpoint.
pub struct TableSink {
    catalog_name: String,
    catalog: Arc<dyn Catalog>,
    /// The table as committed.
    base: Table,
    /// The table as the checkpoint being committed leaves it, while its commit runs (the
    /// next checkpoint's changes start from it).
    committing: Option<Table>,
    /// The table with this checkpoint's schema and spec changes: what files are written for.
    staged: Table,
    schema: Option<Schema>,
    spec: Option<UnboundPartitionSpec>,
    writer: Option<TableWriter>,
    /// The writer is out, writing a row group elsewhere (see [`Self::take_unwritten`]); it
    /// comes back with [`Self::give_back`].
    lent: bool,
    /// The files open (see [`TableWriter::open_files`]) out with the writer.
    lent_files: usize,
    /// Rows are gathered until the caller takes them to write as a row group of the open
    /// files (routed sinks, see [`Self::deferred`]); otherwise they go to the writer every
    /// [`WRITE_ROWS`] rows, its row groups as large as the table's properties say.
    deferred: bool,
    /// See [`Self::writing_on`].
    behind: Option<AbortOnDrop<Result<Written>>>,
    writes_behind: bool,
    /// See [`Self::writing_on`].
    threads: usize,
    /// See [`Self::created_on_sight`].
    recreate: bool,
    /// Columns the schema may evolve to (see [`Self::with_max_columns`]).
    max_columns: usize,
    /// Files closed earlier in this checkpoint, with their spec (before a change).
    closed: Vec<(i32, DataFile)>,
    rows: u64,
    /// Whether new columns and wider types may change the table's schema.
    evolve: bool,
    candidates: Vec<Candidate>,
    /// Whether top-level columns match the table's ignoring ASCII case.
    case_insensitive: bool,
    /// The table's primary key (its identifier fields' names), if it has one: it keeps one
    /// row per key, so a checkpoint's rows are held until it closes and only the last row
    /// of each key is written (see `lake::upsert`). When the schema evolves, the rows held
    /// are conformed to the new one ([`Self::conform_held`]).
    keys: Vec<String>,
    /// For a table with a primary key: whether each row of `pending` deletes its key, and
    /// the order of its key's changes where the source says (see `schema::changes`).
    deletes: Vec<BooleanArray>,
    seqs: Vec<Option<Int64Array>>,
    /// When `base` was loaded or committed.
    loaded: Instant,
    /// The staged schema and its Arrow form.
    arrow: Option<(iceberg::spec::SchemaRef, SchemaRef)>,
    /// Rows accepted (conformed to the staged schema) but not yet handed to the writer:
    /// routed slices of a few rows each are gathered so the Parquet writer sees batches of
    /// [`WRITE_ROWS`] (its cost is per batch and column as much as per row), or taken by
    /// the caller (deferred). Often slices of the batches they came in.
    pending: Vec<RecordBatch>,
    pending_rows: usize,
    pending_bytes: usize,
    /// A batch schema whose rows fit the staged schema (the second) whatever their values:
    /// rows of that schema skip the evolution check.
    fits: Option<(SchemaRef, iceberg::spec::SchemaRef)>,
}

/// A table's gathered rows and open files, out of its sink: writing them (and closing the
/// files) is the bulk of a job's work for many tables, done for several tables at once
/// elsewhere.
pub struct Unwritten {
    writer: Option<TableWriter>,
    rows: Vec<RecordBatch>,
    /// The rows' schema: the table's, as Arrow.
    schema: SchemaRef,
    /// The table the files are written for.
    staged: Table,
    /// Close the files after writing the rows (else they stay open for more row groups).
    close: bool,
    /// New writers write a row group per write (see [`TableSink::deferred`]).
    deferred: bool,
    /// The threads a new writer encodes on (see [`TableSink::writing_on`]).
    threads: usize,
}

/// What writing an [`Unwritten`] gives back to its sink.
pub struct Written {
    /// The files closed, with their partition spec id.
    files: Vec<(i32, DataFile)>,
    /// The writer, files still open, when they were not to be closed.
    writer: Option<(TableWriter, Table)>,
}

impl Unwritten {
    /// Write the rows (one row group of each file for a deferred sink's), and close the files
    /// if asked to.
    pub async fn write(self) -> Result<Written> {
        let mut writer = match self.writer {
            Some(w) => w,
            None if self.deferred => TableWriter::row_groups_on_demand(&self.staged)?,
            None => TableWriter::try_new(&self.staged)?.encoding_on(self.threads),
        };
        let row_group = self.deferred && !self.rows.is_empty();
        write_gathered(&mut writer, &self.schema, self.rows).await?;
        if row_group {
            // The rows gathered, as one row group.
            writer.end_row_group().await?;
        }
        if !self.close {
            return Ok(Written {
                files: Vec::new(),
                writer: Some((writer, self.staged)),
            });
        }
        let spec_id = self.staged.metadata().default_partition_spec_id();
        let files = writer
            .close()
            .await?
            .into_iter()
            .map(|f| (spec_id, f))
            .collect();
        Ok(Written {
            files,
            writer: None,
        })
    }
}

/// An error writing rows gathered from earlier writes: not the latest batch's rows' fault
/// (the job dead-letters a batch's rows by halving the batch), so never a record error; the
/// job starts again from its last checkpoint.
fn gathered(e: Error) -> Error {
    match e {
        Error::Record(reject) => Error::Internal(format!(
            "writing rows gathered for the table, they do not fit: {reject}"
        )),
        e => e,
    }
}

/// Rows gathered before a batch goes to the Parquet writer.
pub const WRITE_ROWS: usize = 8192;

/// A batch this large goes to the Parquet writer as it is: joining it with others would copy
/// its rows for a saving (the writer's cost per batch and column) it no longer makes.
const WRITE_BATCH_ROWS: usize = 1024;

impl TableSink {
    pub fn new(
        catalog_name: &str,
        catalog: &Arc<dyn Catalog>,
        table: Table,
        evolve: bool,
        candidates: Vec<Candidate>,
    ) -> Self {
        let keys = upsert::key_names(table.metadata().current_schema());
        Self {
            catalog_name: catalog_name.to_string(),
            catalog: catalog.clone(),
            keys,
            deletes: Vec::new(),
            seqs: Vec::new(),
            staged: table.clone(),
            base: table,
            committing: None,
            schema: None,
            spec: None,
            writer: None,
            lent: false,
            lent_files: 0,
            deferred: false,
            behind: None,
            writes_behind: false,
            threads: 1,
            recreate: false,
            max_columns: usize::MAX,
            closed: Vec::new(),
            rows: 0,
            evolve,
            candidates,
            case_insensitive: false,
            loaded: Instant::now(),
            arrow: None,
            pending: Vec::new(),
            pending_rows: 0,
            pending_bytes: 0,
            fits: None,
        }
    }

    /// Gather rows until the caller takes them ([`Self::take_unwritten`]) to write as a row
    /// group of the table's open files: the caller chooses row groups' sizes, and files stay
    /// open between row groups at the cost of the open files only (a job writing many
    /// tables writes one file per table and partition per checkpoint, however little memory
    /// it gives each table's rows).
    pub fn deferred(mut self) -> Self {
        self.deferred = true;
        self
    }

    /// With more than one thread, every [`WRITE_ROWS`] rows go to the writer on the write
    /// runtime (`lake::runtime`) while the sink takes more, one write at a time: encoding
    /// Parquet on another core while the job decodes and queries, a write's columns on up
    /// to `threads` at once. (A table with a primary key holds its rows until the
    /// checkpoint closes, as ever.)
    pub fn writing_on(mut self, threads: usize) -> Self {
        self.writes_behind = threads > 1;
        self.threads = threads.max(1);
        self
    }

    /// The job creates this table on sight: dropped under the job, it is created again with
    /// the rows in flight (see [`PendingCommit::recreate`]).
    pub fn created_on_sight(mut self) -> Self {
        self.recreate = true;
        self
    }

    /// Evolve the schema to at most `n` columns (nested fields included): rows that would
    /// take it further are rejected.
    pub fn with_max_columns(mut self, n: usize) -> Self {
        self.max_columns = n;
        self
    }

    /// Match top-level columns to the table's ignoring ASCII case.
    pub fn with_case_insensitive(mut self, on: bool) -> Self {
        self.case_insensitive = on;
        self
    }

    /// The table's schema with this checkpoint's changes.
    pub fn schema(&self) -> &Schema {
        self.staged.metadata().current_schema()
    }

    /// The staged schema as Arrow, converted once per schema. (Keyed by the schema itself:
    /// schema ids of two writers evolving one table can name different schemas.)
    fn arrow_schema(&mut self) -> Result<SchemaRef> {
        let schema = self.staged.metadata().current_schema();
        if let Some((iceberg, arrow)) = &self.arrow
            && (Arc::ptr_eq(iceberg, schema) || iceberg == schema)
        {
            return Ok(arrow.clone());
        }
        let arrow = Arc::new(schema_to_arrow_schema(schema)?);
        self.arrow = Some((schema.clone(), arrow.clone()));
        Ok(arrow)
    }

    /// The table as committed.
    pub fn table(&self) -> &Table {
        &self.base
    }

    /// What this checkpoint's changes start from: the table as committed, or as the commit
    /// under way leaves it.
    fn start(&self) -> &Table {
        self.committing.as_ref().unwrap_or(&self.base)
    }

    /// Write `batch` (columns matched by name). Fails with [`Error::Record`] when its
    /// records do not fit the table and it may not evolve to take them: they go to the
    /// dead-letter table.
    pub async fn write(&mut self, batch: RecordBatch) -> Result<u64> {
        if batch.num_rows() == 0 {
            return Ok(0);
        }
        let (batch, changes) = split_changes(batch)?;
        let batch = without_source_table(batch)?;
        if let Some(c) = &changes {
            self.check_key(c)?;
        }
        let (deletes, seq) = match changes {
            Some(c) => (Some(c.deletes), c.seq),
            None => (None, None),
        };
        if let Some(d) = &deletes
            && self.keys.is_empty()
            && d.true_count() > 0
        {
            return Err(Error::Record(Reject::new(format!(
                "the row deletes a row (a change stream), and table {} has no primary key to \
                 find it by: declare it, PRIMARY KEY (...) NOT ENFORCED",
                self.base.identifier()
            ))));
        }
        let batch = if self.case_insensitive {
            match_case(self.staged.metadata().current_schema(), &batch).map_err(Error::Record)?
        } else {
            batch
        };
        let batch = if self.known_fit(&batch) {
            batch
        } else {
            self.evolve(batch).await?
        };
        let rows = conform_to(&self.arrow_schema()?, &batch)?;
        let n = rows.num_rows();
        if !self.keys.is_empty() {
            self.deletes
                .push(deletes.unwrap_or_else(|| BooleanArray::from(vec![false; n])));
            self.seqs.push(seq);
        }
        self.rows += n as u64;
        self.pending_rows += n;
        self.pending_bytes += slice_bytes(&rows);
        self.pending.push(rows);
        if !self.deferred && self.keys.is_empty() && self.pending_rows >= WRITE_ROWS {
            match self.writes_behind {
                true => self.write_behind().await?,
                false => self.flush().await?,
            }
        }
        Ok(n as u64)
    }

    /// Rows whose source table's key (where the change stream names it) is not this table's
    /// primary key are not this table's to apply: a source table whose key changed, or rows
    /// routed to a table keyed otherwise. [`Error::Record`]: they go to the dead letters.
    fn check_key(&self, changes: &Changes) -> Result<()> {
        for names in changes.distinct_key_names().into_iter().flatten() {
            let mut theirs: Vec<&str> = names.split(',').collect();
            let mut ours: Vec<&str> = self.keys.iter().map(String::as_str).collect();
            theirs.sort_unstable();
            ours.sort_unstable();
            if theirs != ours {
                let ours = match self.keys.is_empty() {
                    true => "none".to_string(),
                    false => format!("({})", self.keys.join(", ")),
                };
                return Err(Error::Record(Reject::new(format!(
                    "the row's source table has the primary key ({}), and table {}'s is \
                     {ours}: a source table whose key changed needs a table of its own",
                    theirs.join(", "),
                    self.base.identifier()
                ))));
            }
        }
        Ok(())
    }

    /// Whether rows of `batch`'s schema were found to fit the staged schema whatever their
    /// values (it is the common case: the same columns batch after batch).
    fn known_fit(&self, batch: &RecordBatch) -> bool {
        self.fits.as_ref().is_some_and(|(b, s)| {
            Arc::ptr_eq(b, &batch.schema())
                && Arc::ptr_eq(s, self.staged.metadata().current_schema())
        })
    }

    /// Check `batch` against the staged schema: evolve the schema to take it, or (evolution
    /// off) drop the columns the table lacks; [`Error::Record`] when it cannot be taken.
    async fn evolve(&mut self, batch: RecordBatch) -> Result<RecordBatch> {
        let md = self.staged.metadata();
        let wanted = evolve(
            md.current_schema(),
            md.last_column_id(),
            batch.schema().as_ref(),
            batch.columns(),
        )
        .map_err(Error::Record)?;
        let batch = match wanted {
            Some(schema) if self.evolve => {
                let columns = column_count(&schema);
                if columns > self.max_columns {
                    return Err(Error::Record(Reject::new(format!(
                        "the rows would give table {} {columns} columns, more than \
                         'schema.max-columns' ({})",
                        self.base.identifier(),
                        self.max_columns
                    ))));
                }
                self.restage(schema).await?;
                batch
            }
            Some(_) => {
                // Evolution off: keep only the columns the table has, as they are.
                let keep: Vec<usize> = (0..batch.num_columns())
                    .filter(|&i| {
                        md.current_schema()
                            .field_by_name(batch.schema().field(i).name())
                            .is_some()
                    })
                    .collect();
                batch
                    .project(&keep)
                    .map_err(|e| Error::Internal(format!("projecting a batch: {e}")))?
            }
            None => {
                let current = md.current_schema().clone();
                if fits_any_values(&current, &*self.arrow_schema()?, &batch.schema()) {
                    self.fits = Some((batch.schema(), current));
                }
                batch
            }
        };
        Ok(batch)
    }

    /// Memory held by rows not yet handed to the writer, in bytes.
    pub fn buffered_bytes(&self) -> usize {
        self.pending_bytes
    }

    /// The gathered rows, in batches.
    fn take_pending(&mut self) -> Vec<RecordBatch> {
        let pending = std::mem::take(&mut self.pending);
        self.pending_rows = 0;
        self.pending_bytes = 0;
        pending
    }

    /// Hand the gathered rows to the writer (opening its files if none are open).
    pub async fn flush(&mut self) -> Result<()> {
        self.settle().await?;
        let pending = self.take_pending();
        if pending.is_empty() {
            return Ok(());
        }
        let schema = self.arrow_schema()?;
        if self.writer.is_none() {
            self.writer = Some(TableWriter::try_new(&self.staged)?.encoding_on(self.threads));
        }
        if let Some(w) = &mut self.writer {
            write_gathered(w, &schema, pending)
                .await
                .map_err(gathered)?;
        }
        Ok(())
    }

    /// Hand the gathered rows to the writer on the write runtime, once the write before is
    /// done (see [`Self::writing_on`]).
    async fn write_behind(&mut self) -> Result<()> {
        self.settle().await?;
        if let Some(unwritten) = self.unwritten(false)? {
            self.behind = Some(runtime::spawn(unwritten.write()));
        }
        Ok(())
    }

    /// Wait for the write behind, if one runs, and take the writer back.
    async fn settle(&mut self) -> Result<()> {
        if let Some(write) = self.behind.take() {
            let written = joined(write, "writing a table's rows")
                .await
                .map_err(gathered)?;
            self.give_back(written).await?;
        }
        Ok(())
    }

    /// The rows gathered and the open files, taken out to be written elsewhere (see
    /// [`Unwritten::write`]), and the files closed if `close`; what comes back goes to
    /// [`Self::give_back`]. Until then the sink gathers the rows that come.
    /// A keyed table's rows are held until the checkpoint closes ([`Self::close`] writes the
    /// last row of each key): nothing is taken.
    pub fn take_unwritten(&mut self, close: bool) -> Result<Option<Unwritten>> {
        if !self.keys.is_empty() {
            return Ok(None);
        }
        self.unwritten(close)
    }

    fn unwritten(&mut self, close: bool) -> Result<Option<Unwritten>> {
        if self.lent && !close {
            return Err(Error::Internal(
                "a table's files were taken while out being written".into(),
            ));
        }
        let rows = self.take_pending();
        if rows.is_empty() && (self.writer.is_none() || !close) {
            return Ok(None);
        }
        // (Rows to close while the writer is out, before a schema change, go to files of
        // their own.)
        if !close {
            self.lent = true;
            self.lent_files = match &self.writer {
                Some(w) => w.open_files(),
                None => usize::from(TableWriter::holds_open_files(&self.staged)),
            };
        }
        Ok(Some(Unwritten {
            writer: self.writer.take(),
            rows,
            schema: self.arrow_schema()?,
            staged: self.staged.clone(),
            close,
            deferred: self.deferred,
            threads: self.threads,
        }))
    }

    /// The files closed and the writer kept open by [`Unwritten::write`]. A writer whose
    /// files no longer suit the staged table (its schema or spec changed meanwhile) is
    /// closed: its files are part of the checkpoint as they are.
    pub async fn give_back(&mut self, written: Written) -> Result<()> {
        self.lent = false;
        self.closed.extend(written.files);
        let Some((writer, staged)) = written.writer else {
            return Ok(());
        };
        if self.writer.is_none() && same_layout(&staged, &self.staged) {
            self.writer = Some(writer);
            return Ok(());
        }
        let spec_id = staged.metadata().default_partition_spec_id();
        let files = writer.close().await?;
        self.closed.extend(files.into_iter().map(|f| (spec_id, f)));
        Ok(())
    }

    /// Move to `schema` (and the spec the candidates give it): close the open files, which
    /// keep the spec they were written with.
    async fn restage(&mut self, schema: Schema) -> Result<()> {
        if self.keys.is_empty() {
            self.close_writer().await?;
        }
        let current_spec = self.spec.clone().unwrap_or_else(|| {
            self.start()
                .metadata()
                .default_partition_spec()
                .as_ref()
                .clone()
                .into_unbound()
        });
        let spec = spec_for(&schema, Some(&current_spec), &self.candidates)?;
        if spec.is_some() {
            self.spec = spec;
        }
        self.schema = Some(schema);
        self.staged = staged(self.start(), self.schema.clone(), self.spec.clone())?;
        self.conform_held()
    }

    /// A keyed table's rows are held until the checkpoint closes (only the last row of each
    /// key is written): after a schema change they are conformed to the new schema, as the
    /// rows that follow are, instead of going to files of the old one.
    fn conform_held(&mut self) -> Result<()> {
        if self.keys.is_empty() || self.pending.is_empty() {
            return Ok(());
        }
        let arrow = self.arrow_schema()?;
        let held = std::mem::take(&mut self.pending);
        self.pending = held
            .iter()
            .map(|b| conform_to(&arrow, b))
            .collect::<Result<_>>()?;
        self.pending_bytes = self.pending.iter().map(slice_bytes).sum();
        Ok(())
    }

    /// About how much memory the storage holds for the open files (see
    /// [`TableWriter::held_bytes`]).
    pub fn held_bytes(&self) -> usize {
        self.writer.as_ref().map_or(0, TableWriter::held_bytes)
    }

    /// Files open (out being written counts as open).
    pub fn open_files(&self) -> usize {
        match &self.writer {
            Some(w) => w.open_files(),
            None if self.lent => self.lent_files,
            None => 0,
        }
    }

    /// Close the open files now (they are committed at the checkpoint); the next rows open
    /// new ones. Bounds how many files a job holds open across many tables.
    pub async fn close_writer(&mut self) -> Result<()> {
        self.settle().await?;
        if let Some(unwritten) = self.take_unwritten(true)? {
            let written = unwritten.write().await?;
            self.give_back(written).await?;
        }
        Ok(())
    }

    /// Write every row gathered or held and close the files.
    async fn write_out(&mut self) -> Result<()> {
        self.settle().await?;
        if let Some(unwritten) = self.unwritten(true)? {
            let written = unwritten.write().await?;
            self.give_back(written).await?;
        }
        Ok(())
    }

    /// Close every file; what the checkpoint must commit for this table, if anything.
    pub async fn close(&mut self) -> Result<Option<PendingCommit>> {
        let mut deleted_keys = Vec::new();
        if !self.keys.is_empty() && !self.pending.is_empty() {
            let pending = self.take_pending();
            let deletes = std::mem::take(&mut self.deletes);
            let seqs = std::mem::take(&mut self.seqs);
            let (upserts, deleted) = upsert::last_changes(&pending, &deletes, &seqs, &self.keys)?;
            drop(pending);
            if let Some(keys) = deleted {
                deleted_keys.push(upsert::write_keys(&self.staged, &keys).await?);
            }
            self.pending_rows = upserts.iter().map(RecordBatch::num_rows).sum();
            self.pending_bytes = upserts.iter().map(slice_bytes).sum();
            self.pending = upserts;
        }
        self.write_out().await?;
        let files = std::mem::take(&mut self.closed);
        if files.is_empty() && deleted_keys.is_empty() {
            return Ok(None);
        }
        let md = self.staged.metadata();
        let format = md.format_version();
        // Per spec id: the files' JSON and the files.
        let mut by_spec: Vec<(i32, Vec<String>, Vec<DataFile>)> = Vec::new();
        for (spec_id, file) in files {
            let spec = md.partition_spec_by_id(spec_id).ok_or_else(|| {
                Error::Internal(format!("staged table lacks partition spec {spec_id}"))
            })?;
            let partition_type = spec.partition_type(md.current_schema())?;
            let json = serialize_data_file_to_json(file.clone(), &partition_type, format)?;
            match by_spec.iter_mut().find(|g| g.0 == spec_id) {
                Some(g) => {
                    g.1.push(json);
                    g.2.push(file);
                }
                None => by_spec.push((spec_id, vec![json], vec![file])),
            }
        }
        let groups = by_spec
            .into_iter()
            .map(|(spec_id, files, written)| FileGroup {
                spec_id,
                files,
                written: written.into(),
            })
            .collect();
        let start = self.start();
        let ident = start.identifier();
        let pending = PendingCommit {
            catalog: self.catalog_name.clone(),
            namespace: ident.namespace().clone().inner(),
            table: ident.name().to_string(),
            table_uuid: start.metadata().uuid().to_string(),
            groups,
            schema: self.schema.as_ref().map(to_json).transpose()?,
            spec: self.spec.as_ref().map(to_json).transpose()?,
            base_schema_id: Some(start.metadata().current_schema_id()),
            spec_id: (self.spec.as_ref())
                .map(|_| self.staged.metadata().default_partition_spec_id()),
            rows: std::mem::take(&mut self.rows),
            recreate: self.recreate,
            upsert: !self.keys.is_empty(),
            deleted_keys,
        };
        // Until the commit is done, what follows starts from the table as it leaves it.
        self.committing = Some(self.staged.clone());
        self.schema = None;
        self.spec = None;
        Ok(Some(pending))
    }

    /// After the checkpoint committed: the committed table (`committed`, or as loaded from the
    /// catalog when the commit did not give it) is the new base. Changes staged since the
    /// checkpoint closed are kept: they apply to the committed table when its schema and
    /// specs are the ones they were staged on, else (another writer's changes were merged
    /// in) they are committed as a change of their own, merged at commit (rewriting files
    /// whose field ids moved, see `checkpoint::commit`). Returns the rows written since whose
    /// values the merged table cannot take, with why: they are the caller's dead letters.
    pub async fn after_commit(
        &mut self,
        committed: Option<&Table>,
    ) -> Result<Vec<(RecordBatch, Reject)>> {
        self.base = match committed {
            Some(t) => t.clone(),
            // A table its first commit creates (see `SqlCommitter::new_tables`), not made
            // yet: there is nothing to load (another writer's table of its name is found by
            // that commit, and merged with).
            None if self.base.metadata_location().is_none() => self.base.clone(),
            None => self.catalog.load_table(self.base.identifier()).await?,
        };
        self.loaded = Instant::now();
        let Some(expected) = self.committing.take() else {
            self.staged = self.base.clone();
            self.schema = None;
            self.spec = None;
            return Ok(Vec::new());
        };
        if same_layout(&self.base, &expected) {
            // The common case: committed as expected; changes since apply on top.
            self.staged = staged(&self.base, self.schema.clone(), self.spec.clone())?;
            return Ok(Vec::new());
        }
        if self.base.metadata().uuid() != expected.metadata().uuid() && !self.recreate {
            // Dropped and created again under the job, which does not create this table: its
            // rows since the checkpoint began are for the table that is gone. The job starts
            // again (afresh into the new table, see `checkpoint::resume`).
            return Err(Error::Restart(format!(
                "table {} was dropped and created again while the job wrote to it",
                self.base.identifier()
            )));
        }
        // Another writer's changes were merged in (or the table was created again, and took
        // the checkpoint's rows): the rows since were written for the table as this job
        // expected it. Write them again for the committed table with this job's
        // changes merged in (what a commit does when it loses a race, see
        // `checkpoint::commit`).
        if self.keys.is_empty() {
            self.close_writer().await?;
        }
        let md = self.base.metadata();
        let ours = self.staged.metadata().current_schema().clone();
        let merged = merge_schemas(md.current_schema(), &ours, md.last_column_id())?;
        let schema =
            (merged.schema.as_struct() != md.current_schema().as_struct()).then_some(merged.schema);
        let current_spec = md.default_partition_spec().as_ref().clone().into_unbound();
        let spec = spec_for(
            schema.as_ref().unwrap_or(md.current_schema()),
            Some(&current_spec),
            &self.candidates,
        )?;
        self.schema = schema;
        self.spec = spec;
        self.staged = staged(&self.base, self.schema.clone(), self.spec.clone())?;
        self.conform_held()?;
        let paths = self
            .closed
            .iter()
            .map(|(_, f)| f.file_path().to_string())
            .collect::<Vec<_>>();
        let mut left_out = Vec::new();
        if !paths.is_empty() {
            let spec_id = self.staged.metadata().default_partition_spec_id();
            let rewritten = rewrite_files(&self.staged, &paths).await?;
            self.closed = rewritten.files.into_iter().map(|f| (spec_id, f)).collect();
            for path in paths {
                // In no snapshot and no checkpoint record: nothing refers to them.
                let _ = self.staged.file_io().delete(&path).await;
            }
            // Rows whose values another writer's types cannot take: the caller's dead letters.
            let why = merged.conflicts.join("; ");
            for (row, reject) in rewritten.rejected {
                self.rows = self.rows.saturating_sub(row.num_rows() as u64);
                left_out.push((row, Reject::new(format!("{reject} ({why})"))));
            }
        }
        Ok(left_out)
    }

    /// Whether nothing is written or staged since the last commit.
    pub fn is_idle(&self) -> bool {
        self.committing.is_none()
            && self.writer.is_none()
            && !self.lent
            && self.pending.is_empty()
            && self.closed.is_empty()
            && self.schema.is_none()
            && self.spec.is_none()
    }

    /// How long ago the base was loaded or committed.
    pub fn age(&self) -> Duration {
        self.loaded.elapsed()
    }
}

/// Whether files written for `a` suit `b`: the same table, schema and default spec.
fn same_layout(a: &Table, b: &Table) -> bool {
    let (a, b) = (a.metadata(), b.metadata());
    a.uuid() == b.uuid()
        && a.current_schema() == b.current_schema()
        && a.default_partition_spec() == b.default_partition_spec()
}

/// Write `batches` (of `schema`) in row groups as the table's properties say: batches of
/// [`WRITE_BATCH_ROWS`] or more rows as they are, smaller ones joined in writes of about
/// [`WRITE_ROWS`] rows (never all the rows joined at once).
async fn write_gathered(
    writer: &mut TableWriter,
    schema: &SchemaRef,
    batches: Vec<RecordBatch>,
) -> Result<()> {
    let mut chunk = Vec::new();
    let mut n = 0;
    for rows in batches {
        if rows.num_rows() >= WRITE_BATCH_ROWS {
            if !chunk.is_empty() {
                writer
                    .write(concat(schema, std::mem::take(&mut chunk))?)
                    .await?;
                n = 0;
            }
            writer.write(rows).await?;
            continue;
        }
        n += rows.num_rows();
        chunk.push(rows);
        if n >= WRITE_ROWS {
            writer
                .write(concat(schema, std::mem::take(&mut chunk))?)
                .await?;
            n = 0;
        }
    }
    if !chunk.is_empty() {
        writer.write(concat(schema, chunk)?).await?;
    }
    Ok(())
}

/// `batches` as one batch (without a copy when there is one).
fn concat(schema: &SchemaRef, batches: Vec<RecordBatch>) -> Result<RecordBatch> {
    match <[RecordBatch; 1]>::try_from(batches) {
        Ok([one]) => Ok(one),
        Err(many) => concat_batches(schema, &many)
            .map_err(|e| Error::Internal(format!("gathering rows for a write: {e}"))),
    }
}

/// Memory of `batch`'s rows (of a slice: its part of the buffers, not the whole buffers).
fn slice_bytes(batch: &RecordBatch) -> usize {
    batch
        .columns()
        .iter()
        .map(|c| c.to_data().get_slice_memory_size().unwrap_or(0))
        .sum()
}

/// Whether rows of `batch` fit `table` (as Arrow: `arrow`) whatever their values: each column is
/// one of the table's, of the same type (so no value needs a check or conversion), and every
/// column of the table is optional (so NULLs or absent columns need no change).
fn fits_any_values(table: &Schema, arrow: &ArrowSchema, batch: &ArrowSchema) -> bool {
    fn all_optional(t: &Type) -> bool {
        match t {
            Type::Primitive(_) => true,
            Type::Struct(s) => s
                .fields()
                .iter()
                .all(|f| !f.required && all_optional(&f.field_type)),
            Type::List(l) => !l.element_field.required && all_optional(&l.element_field.field_type),
            Type::Map(m) => {
                !m.value_field.required
                    && all_optional(&m.key_field.field_type)
                    && all_optional(&m.value_field.field_type)
            }
        }
    }
    fn same(a: &DataType, b: &DataType) -> bool {
        match (a, b) {
            (DataType::Struct(a), DataType::Struct(b)) => {
                a.len() == b.len()
                    && a.iter()
                        .zip(b.iter())
                        .all(|(a, b)| a.name() == b.name() && same(a.data_type(), b.data_type()))
            }
            (DataType::List(a), DataType::List(b)) => same(a.data_type(), b.data_type()),
            (DataType::Map(a, _), DataType::Map(b, _)) => same(a.data_type(), b.data_type()),
            (a, b) => a == b,
        }
    }
    table
        .as_struct()
        .fields()
        .iter()
        .all(|f| !f.required && all_optional(&f.field_type))
        && batch.fields().iter().all(|f| {
            arrow
                .field_with_name(f.name())
                .is_ok_and(|t| same(t.data_type(), f.data_type()))
        })
}

fn to_json<T: serde::Serialize>(v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(|e| Error::Internal(format!("encoding a pending commit: {e}")))
}
