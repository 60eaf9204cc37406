//! Everything a job writes to one table during a checkpoint: the open writer, the files
//! closed so far, and the schema and partition-spec changes the rows needed.
//!
//! ```text
//! batch --evolve--> (schema grows? spec grows?) --restage + new writer--> conform --> write
//! checkpoint: close --> PendingCommit {files per spec, new schema, new spec}
//! ```
//!
//! Nothing reaches the catalog before the checkpoint commits: the schema change and the data
//! land in one commit (see `catalog::commit`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::SchemaRef;
use iceberg::Catalog;
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::spec::{
    DataFile, Schema, Transform, UnboundPartitionField, UnboundPartitionSpec,
    serialize_data_file_to_json,
};
use iceberg::table::Table;

use super::evolve::{conform_to, evolve, match_case};
use super::writer::TableWriter;
use crate::catalog::commit::staged;
use crate::checkpoint::{FileGroup, PendingCommit};
use crate::error::{Error, Result};

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
    /// The table with this checkpoint's schema and spec changes: what files are written for.
    staged: Table,
    schema: Option<Schema>,
    spec: Option<UnboundPartitionSpec>,
    writer: Option<TableWriter>,
    /// Files closed earlier in this checkpoint, with their spec (before a change).
    closed: Vec<(i32, DataFile)>,
    rows: u64,
    /// Whether new columns and wider types may change the table's schema.
    evolve: bool,
    candidates: Vec<Candidate>,
    /// Whether top-level columns match the table's ignoring ASCII case.
    case_insensitive: bool,
    /// When `base` was loaded or committed.
    loaded: Instant,
    /// The staged schema and its Arrow form.
    arrow: Option<(iceberg::spec::SchemaRef, SchemaRef)>,
    /// Rows accepted (conformed to the staged schema) but not yet handed to the writer:
    /// routed slices of a few rows each are gathered so the Parquet writer sees batches of
    /// [`WRITE_ROWS`] (its cost is per batch and column as much as per row).
    pending: Vec<RecordBatch>,
    pending_rows: usize,
    pending_bytes: usize,
}

/// Rows gathered before a batch goes to the Parquet writer.
pub const WRITE_ROWS: usize = 8192;

impl TableSink {
    pub fn new(
        catalog_name: &str,
        catalog: &Arc<dyn Catalog>,
        table: Table,
        evolve: bool,
        candidates: Vec<Candidate>,
    ) -> Self {
        Self {
            catalog_name: catalog_name.to_string(),
            catalog: catalog.clone(),
            staged: table.clone(),
            base: table,
            schema: None,
            spec: None,
            writer: None,
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
        }
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

    /// Write `batch` (columns matched by name). `Ok(Err(reason))` when its records do not fit
    /// the table and it may not evolve to take them: they go to the dead-letter table.
    pub async fn write(&mut self, batch: RecordBatch) -> Result<std::result::Result<u64, String>> {
        if batch.num_rows() == 0 {
            return Ok(Ok(0));
        }
        let batch = if self.case_insensitive {
            match match_case(self.staged.metadata().current_schema(), &batch) {
                Ok(b) => b,
                Err(reason) => return Ok(Err(reason)),
            }
        } else {
            batch
        };
        let md = self.staged.metadata();
        let wanted = match evolve(
            md.current_schema(),
            md.last_column_id(),
            batch.schema().as_ref(),
            batch.columns(),
        ) {
            Ok(w) => w,
            Err(reason) => return Ok(Err(reason)),
        };
        let batch = match wanted {
            Some(schema) if self.evolve => {
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
            None => batch,
        };
        let rows = conform_to(&self.arrow_schema()?, &batch)?;
        let n = rows.num_rows();
        self.rows += n as u64;
        self.pending_rows += n;
        self.pending_bytes += rows.get_array_memory_size();
        self.pending.push(rows);
        if self.pending_rows >= WRITE_ROWS {
            self.flush().await?;
        }
        Ok(Ok(n as u64))
    }

    /// Memory held by rows not yet handed to the writer, in bytes.
    pub fn buffered_bytes(&self) -> usize {
        self.pending_bytes
    }

    /// Hand the gathered rows to the writer (opening its files if none are open).
    pub async fn flush(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let pending = std::mem::take(&mut self.pending);
        self.pending_rows = 0;
        self.pending_bytes = 0;
        let batch = match <[RecordBatch; 1]>::try_from(pending) {
            Ok([one]) => one,
            Err(many) => concat_batches(&self.arrow_schema()?, &many)
                .map_err(|e| Error::Internal(format!("gathering rows for a write: {e}")))?,
        };
        if self.writer.is_none() {
            self.writer = Some(TableWriter::try_new(&self.staged)?);
        }
        if let Some(w) = &mut self.writer {
            w.write(batch).await?;
        }
        Ok(())
    }

    /// Move to `schema` (and the spec the candidates give it): close the open files, which
    /// keep the spec they were written with.
    async fn restage(&mut self, schema: Schema) -> Result<()> {
        self.close_writer().await?;
        let current_spec = self.spec.clone().unwrap_or_else(|| {
            self.base
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
        self.staged = staged(&self.base, self.schema.clone(), self.spec.clone())?;
        Ok(())
    }

    /// Whether a writer (open files) or rows waiting for one are held.
    pub fn has_open_files(&self) -> bool {
        self.writer.is_some() || !self.pending.is_empty()
    }

    /// Close the open files now (they are committed at the checkpoint); the next rows open
    /// new ones. Bounds how many files a job holds open across many tables.
    pub async fn close_writer(&mut self) -> Result<()> {
        self.flush().await?;
        if let Some(w) = self.writer.take() {
            let spec_id = self.staged.metadata().default_partition_spec_id();
            self.closed
                .extend(w.close().await?.into_iter().map(|f| (spec_id, f)));
        }
        Ok(())
    }

    /// Close every file; what the checkpoint must commit for this table, if anything.
    pub async fn close(&mut self) -> Result<Option<PendingCommit>> {
        self.close_writer().await?;
        let files = std::mem::take(&mut self.closed);
        if files.is_empty() {
            return Ok(None);
        }
        let md = self.staged.metadata();
        let format = md.format_version();
        let mut groups: Vec<FileGroup> = Vec::new();
        for (spec_id, file) in files {
            let spec = md.partition_spec_by_id(spec_id).ok_or_else(|| {
                Error::Internal(format!("staged table lacks partition spec {spec_id}"))
            })?;
            let partition_type = spec.partition_type(md.current_schema())?;
            let json = serialize_data_file_to_json(file, &partition_type, format)?;
            match groups.iter_mut().find(|g| g.spec_id == spec_id) {
                Some(g) => g.files.push(json),
                None => groups.push(FileGroup {
                    spec_id,
                    files: vec![json],
                }),
            }
        }
        let ident = self.base.identifier();
        let pending = PendingCommit {
            catalog: self.catalog_name.clone(),
            namespace: ident.namespace().clone().inner(),
            table: ident.name().to_string(),
            table_uuid: self.base.metadata().uuid().to_string(),
            groups,
            schema: self.schema.as_ref().map(to_json).transpose()?,
            spec: self.spec.as_ref().map(to_json).transpose()?,
            base_schema_id: Some(self.base.metadata().current_schema_id()),
            rows: std::mem::take(&mut self.rows),
        };
        Ok(Some(pending))
    }

    /// After the checkpoint committed: the committed table (`committed`, or as loaded from the
    /// catalog when the commit did not give it) is the new base.
    pub async fn after_commit(&mut self, committed: Option<&Table>) -> Result<()> {
        self.base = match committed {
            Some(t) => t.clone(),
            None => self.catalog.load_table(self.base.identifier()).await?,
        };
        self.loaded = Instant::now();
        self.staged = self.base.clone();
        self.schema = None;
        self.spec = None;
        Ok(())
    }

    /// Whether nothing is written or staged since the last commit.
    pub fn is_idle(&self) -> bool {
        self.writer.is_none()
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

fn to_json<T: serde::Serialize>(v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(|e| Error::Internal(format!("encoding a pending commit: {e}")))
}
