//! Opening a routed table on first sight: loaded, or created from its first rows' columns
//! and the partition candidates they have (and, for a change stream's rows, the key of their
//! source table).

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use iceberg::spec::{Schema, UnboundPartitionSpec};
use iceberg::{Catalog, ErrorKind, NamespaceIdent, TableCreation, TableIdent};

use super::RouteOptions;
use crate::error::{Error, Reject, Result};
use crate::lake::commit::Committer;
use crate::schema::changes::{split_changes, without_source_table};
use crate::schema::types::column_count;
use crate::schema::{iceberg_schema, with_key};
use crate::sink::table_sink::{TableSink, spec_for};

/// Tables opened (or created, one by one) at once when a poll names several new ones.
pub(super) const PARALLEL_OPENS: usize = 8;

/// What opening a routed table needs, apart from the sink's open writers (which must not be
/// borrowed across the catalog calls).
pub(super) struct Opener {
    pub(super) catalog_name: String,
    pub(super) catalog: Arc<dyn Catalog>,
    /// floe's commit path to the catalog: a SQL catalog's new tables are created by their
    /// first commit.
    pub(super) committer: Option<Arc<Committer>>,
    pub(super) namespace: NamespaceIdent,
    pub(super) options: RouteOptions,
    /// Table schemas and specs made so far, by the Arrow schema and key they were made from:
    /// the tables a source's rows create mostly share their columns.
    pub(super) made: std::sync::Mutex<Vec<Made>>,
}

/// A new table's schema and spec, and what they were made from.
pub(super) struct Made {
    arrow: SchemaRef,
    key: Vec<String>,
    schema: Schema,
    spec: Option<UnboundPartitionSpec>,
}

/// How many [`Made`] an [`Opener`] keeps.
const MADE_KEPT: usize = 8;

impl Opener {
    /// The tables `new` names, each with its first rows: loaded, or made from the rows'
    /// columns. A SQL catalog's new tables are made in memory, created by their first commit
    /// (see [`crate::lake::commit::SqlCommitter::new_tables`]: one metadata file and one row
    /// each, in the checkpoint's transaction); others, and tables that exist, are opened
    /// [`PARALLEL_OPENS`] at a time. A table its rows cannot create is an `Error::Record` in
    /// its place; other errors stop them all.
    pub(super) async fn open_all(
        &self,
        new: &[(String, &RecordBatch)],
    ) -> Result<Vec<Result<TableSink>>> {
        let mut opened: Vec<Option<Result<TableSink>>> = new.iter().map(|_| None).collect();
        if let Some(Committer::Sql(sql)) = self.committer.as_deref()
            && !new.is_empty()
        {
            let names: Vec<String> = new.iter().map(|(name, _)| name.clone()).collect();
            let existing = sql.existing(&self.namespace, &names).await?;
            let (mut creations, mut creating) = (Vec::new(), Vec::new());
            for (i, (name, rows)) in new.iter().enumerate() {
                if existing.contains(name) {
                    continue;
                }
                match self.creation(name, rows) {
                    Ok(c) => {
                        creations.push(c);
                        creating.push(i);
                    }
                    Err(e) => opened[i] = Some(Err(e)),
                }
            }
            if !creations.is_empty()
                && let Some(tables) = sql
                    .new_tables(self.catalog.as_ref(), &self.namespace, creations)
                    .await?
            {
                for (i, table) in creating.into_iter().zip(tables) {
                    opened[i] = Some(Ok(self.sink(table)));
                }
            }
        }
        let rest: Vec<usize> = (0..new.len()).filter(|&i| opened[i].is_none()).collect();
        for chunk in rest.chunks(PARALLEL_OPENS) {
            let opens = chunk.iter().map(|&i| self.open(&new[i].0, new[i].1));
            for (&i, sink) in chunk.iter().zip(futures::future::join_all(opens).await) {
                opened[i] = Some(sink);
            }
        }
        Ok(opened
            .into_iter()
            .map(|o| o.unwrap_or_else(|| Err(Error::Internal("a table was not opened".into()))))
            .collect())
    }

    /// The table `name`: loaded, or created from the columns of its first rows.
    async fn open(&self, name: &str, rows: &RecordBatch) -> Result<TableSink> {
        let ident = TableIdent::new(self.namespace.clone(), name.to_string());
        let table = match self.catalog.load_table(&ident).await {
            Ok(t) => t,
            Err(e) if e.kind() == ErrorKind::TableNotFound => {
                let creation = self.creation(name, rows)?;
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
        Ok(self.sink(table))
    }

    /// The new table `name` its first rows make: their columns (a change stream's rows name
    /// their source table's key: the table's), and the partition candidates they have.
    fn creation(&self, name: &str, rows: &RecordBatch) -> Result<TableCreation> {
        let (data, changes) = split_changes(rows.clone())?;
        let data = without_source_table(data)?;
        let key: Vec<String> = changes
            .as_ref()
            .and_then(|c| c.distinct_key_names().into_iter().flatten().next())
            .map(|names| names.split(',').map(str::to_string).collect())
            .unwrap_or_default();
        let arrow = data.schema();
        let (schema, spec) = match self.made_before(&arrow, &key) {
            Some(made) => made,
            None => {
                let (schema, spec) = self.make(name, &arrow, &key)?;
                let mut made = self.made.lock().unwrap_or_else(|e| e.into_inner());
                if made.len() == MADE_KEPT {
                    made.remove(0);
                }
                made.push(Made {
                    arrow,
                    key,
                    schema: schema.clone(),
                    spec: spec.clone(),
                });
                (schema, spec)
            }
        };
        Ok(TableCreation::builder()
            .name(name.to_string())
            .schema(schema)
            .partition_spec_opt(spec)
            .properties(self.options.table_properties.clone())
            .build())
    }

    /// The schema and spec made before from `arrow` and `key`.
    fn made_before(
        &self,
        arrow: &SchemaRef,
        key: &[String],
    ) -> Option<(Schema, Option<UnboundPartitionSpec>)> {
        let made = self.made.lock().unwrap_or_else(|e| e.into_inner());
        made.iter()
            .find(|m| (Arc::ptr_eq(&m.arrow, arrow) || m.arrow == *arrow) && m.key == key)
            .map(|m| (m.schema.clone(), m.spec.clone()))
    }

    /// The schema and spec of new table `name` whose rows have columns `arrow` and `key`.
    fn make(
        &self,
        name: &str,
        arrow: &SchemaRef,
        key: &[String],
    ) -> Result<(Schema, Option<UnboundPartitionSpec>)> {
        let key: Vec<&str> = key.iter().map(String::as_str).collect();
        // Rows whose columns make no Iceberg schema (`a.b` beside a struct `a` with a field
        // `b`, say) are the rows' fault: dead letters, found by the job.
        let schema = iceberg_schema(arrow.as_ref(), true)
            .map_err(|e| e.to_string())
            .and_then(|schema| with_key(schema, &key, true, &name))
            .map_err(|e| {
                Error::Record(Reject::new(format!(
                    "the rows' columns make no table schema for new table '{name}': {e}"
                )))
            })?;
        let columns = column_count(&schema);
        if columns > self.options.max_columns {
            return Err(Error::Record(Reject::new(format!(
                "the rows would give new table '{name}' {columns} columns, more than \
                 'schema.max-columns' ({})",
                self.options.max_columns
            ))));
        }
        let spec = spec_for(&schema, None, &self.options.candidates)?;
        Ok((schema, spec))
    }

    /// A routed table's sink.
    fn sink(&self, table: iceberg::table::Table) -> TableSink {
        TableSink::new(
            &self.catalog_name,
            &self.catalog,
            table,
            self.options.evolve,
            self.options.candidates.clone(),
        )
        .deferred()
        .created_on_sight()
        .with_max_columns(self.options.max_columns)
        .with_case_insensitive(self.options.case_insensitive)
    }
}
