//! Opening a routed table on first sight: loaded, or created from its first rows' columns
//! and the partition candidates they have (and, for a change stream's rows, the key of their
//! source table).

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use iceberg::{Catalog, ErrorKind, NamespaceIdent, TableCreation, TableIdent};

use super::RouteOptions;
use crate::error::{Error, Reject, Result};
use crate::schema::changes::{split_changes, without_source_table};
use crate::schema::types::column_count;
use crate::schema::{iceberg_schema, with_key};
use crate::sink::table_sink::{TableSink, spec_for};

/// Tables opened or created at once when a poll names several new ones.
pub(super) const PARALLEL_OPENS: usize = 8;

/// What opening a routed table needs, apart from the sink's open writers (which must not be
/// borrowed across the catalog calls).
pub(super) struct Opener {
    pub(super) catalog_name: String,
    pub(super) catalog: Arc<dyn Catalog>,
    pub(super) namespace: NamespaceIdent,
    pub(super) options: RouteOptions,
}

impl Opener {
    /// The table `name`: loaded, or created from the columns of its first rows.
    pub(super) async fn open(&self, name: &str, rows: &RecordBatch) -> Result<TableSink> {
        let ident = TableIdent::new(self.namespace.clone(), name.to_string());
        let table = match self.catalog.load_table(&ident).await {
            Ok(t) => t,
            Err(e) if e.kind() == ErrorKind::TableNotFound => {
                // A change stream's rows name their source table's key: the new table's.
                let (data, changes) = split_changes(rows.clone())?;
                let data = without_source_table(data)?;
                let key: Vec<String> = changes
                    .as_ref()
                    .and_then(|c| c.distinct_key_names().into_iter().flatten().next())
                    .map(|names| names.split(',').map(str::to_string).collect())
                    .unwrap_or_default();
                let key: Vec<&str> = key.iter().map(String::as_str).collect();
                // Rows whose columns make no Iceberg schema (`a.b` beside a struct `a` with
                // a field `b`, say) are the rows' fault: dead letters, found by the job.
                let schema = iceberg_schema(data.schema().as_ref(), true)
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
        .created_on_sight()
        .with_max_columns(self.options.max_columns)
        .with_case_insensitive(self.options.case_insensitive))
    }
}
