//! DataFusion catalog and schema providers over an Iceberg catalog that look everything up
//! on demand, so that tables, columns and snapshots committed by anyone (this session, a
//! running job, another process) are visible to the next statement.
//!
//! iceberg-datafusion's own providers list tables once and cache schemas; these do not
//! cache at all: each `table()` call loads the table's current metadata.
//!
//! A table name may carry a suffix after `$`:
//!
//! ```text
//! t$snapshots  t$history  t$files  t$partitions  t$manifests   metadata tables
//! t$version=<snapshot id>                                     time travel by id
//! t$timestamp=<epoch millis>                                  time travel by time
//! ```

use std::any::Any;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::{CatalogProvider, SchemaProvider};
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::{DataFusionError, Result as DFResult};
use iceberg::table::Table;
use iceberg::{Catalog, ErrorKind, NamespaceIdent, TableIdent};

use super::metadata::{MetadataTable, metadata_table};
use super::table::LakeTable;
use crate::error::Error;
use crate::lake::commit::Committer;

/// Run an async catalog call from one of DataFusion's synchronous callbacks.
fn block_on<F: Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}

/// The namespaces of an Iceberg catalog as DataFusion schemas.
#[derive(Debug)]
pub struct LakeCatalogProvider {
    name: String,
    catalog: Arc<dyn Catalog>,
    /// floe's own commit path to it, where it has one (INSERTs commit through it).
    committer: Option<Arc<Committer>>,
}

impl LakeCatalogProvider {
    pub fn new(
        name: impl Into<String>,
        catalog: Arc<dyn Catalog>,
        committer: Option<Arc<Committer>>,
    ) -> Self {
        Self {
            name: name.into(),
            catalog,
            committer,
        }
    }
}

impl CatalogProvider for LakeCatalogProvider {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema_names(&self) -> Vec<String> {
        block_on(self.catalog.list_namespaces(None))
            .map(|ns| ns.iter().map(|n| n.to_url_string()).collect())
            .unwrap_or_default()
    }

    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        // No I/O here: a missing namespace is reported by `table()` with its name.
        let namespace = NamespaceIdent::from_strs(name.split('\u{1f}')).ok()?;
        Some(Arc::new(LakeSchemaProvider {
            catalog_name: self.name.clone(),
            catalog: self.catalog.clone(),
            committer: self.committer.clone(),
            namespace,
        }))
    }

    fn register_schema(
        &self,
        name: &str,
        _schema: Arc<dyn SchemaProvider>,
    ) -> DFResult<Option<Arc<dyn SchemaProvider>>> {
        Err(Error::Plan(format!(
            "use CREATE SCHEMA {}.{name} to create an Iceberg namespace",
            self.name
        ))
        .into())
    }
}

/// The tables of one Iceberg namespace as a DataFusion schema.
#[derive(Debug)]
pub struct LakeSchemaProvider {
    catalog_name: String,
    catalog: Arc<dyn Catalog>,
    committer: Option<Arc<Committer>>,
    namespace: NamespaceIdent,
}

impl LakeSchemaProvider {
    fn qualified(&self, table: &str) -> String {
        format!(
            "{}.{}.{table}",
            self.catalog_name,
            self.namespace.to_url_string()
        )
    }

    async fn load(&self, name: &str) -> DFResult<Option<Table>> {
        let ident = TableIdent::new(self.namespace.clone(), name.to_string());
        match self.catalog.load_table(&ident).await {
            Ok(t) => Ok(Some(t)),
            Err(e)
                if e.kind() == ErrorKind::TableNotFound
                    && self
                        .catalog
                        .namespace_exists(&self.namespace)
                        .await
                        .unwrap_or(true) =>
            {
                Ok(None)
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::NamespaceNotFound | ErrorKind::TableNotFound
                ) =>
            {
                Err(Error::NotFound(format!(
                    "namespace '{}.{}' does not exist (CREATE SCHEMA {}.{} creates it)",
                    self.catalog_name,
                    self.namespace.to_url_string(),
                    self.catalog_name,
                    self.namespace.to_url_string()
                ))
                .into())
            }
            Err(e) => Err(Error::from(e).into()),
        }
    }
}

/// Whether `name` is one of DataFusion's table functions.
fn is_table_function(name: &str) -> bool {
    datafusion::functions_table::all_default_table_functions()
        .iter()
        .any(|f| f.name() == name)
}

#[async_trait]
impl SchemaProvider for LakeSchemaProvider {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn table_names(&self) -> Vec<String> {
        block_on(self.catalog.list_tables(&self.namespace))
            .map(|ts| ts.into_iter().map(|t| t.name().to_string()).collect())
            .unwrap_or_default()
    }

    async fn table(&self, name: &str) -> DFResult<Option<Arc<dyn TableProvider>>> {
        let (base, suffix) = match name.rsplit_once('$') {
            Some((b, s)) if !b.is_empty() => (b, Some(s)),
            _ => (name, None),
        };
        // DataFusion looks up a table function's name (`FROM generate_series(1, 3)`) as a
        // table of the default schema before it calls the function: not a missing namespace.
        let table = match self.load(base).await {
            Ok(Some(table)) => table,
            Ok(None) => return Ok(None),
            Err(_) if suffix.is_none() && is_table_function(base) => return Ok(None),
            Err(e) => return Err(e),
        };
        let Some(suffix) = suffix else {
            let table = LakeTable::try_new(table, self.catalog.clone())
                .await?
                .committing_with(self.committer.clone());
            return Ok(Some(Arc::new(table)));
        };
        if let Some(id) = suffix.strip_prefix("version=") {
            let id: i64 = id.parse().map_err(|_| {
                DataFusionError::from(Error::Plan(format!("'{id}' is not a snapshot id")))
            })?;
            return Ok(Some(self.at_snapshot(table, base, id).await?));
        }
        if let Some(ms) = suffix.strip_prefix("timestamp=") {
            let ms: i64 = ms.parse().map_err(|_| {
                DataFusionError::from(Error::Plan(format!("'{ms}' is not a timestamp")))
            })?;
            let id = snapshot_as_of(&table, ms).ok_or_else(|| {
                DataFusionError::from(Error::NotFound(format!(
                    "table {} has no snapshot at or before {} (its first snapshot is later, \
                     or it has none)",
                    self.qualified(base),
                    chrono::DateTime::from_timestamp_millis(ms)
                        .map(|t| t.to_rfc3339())
                        .unwrap_or_else(|| ms.to_string())
                )))
            })?;
            return Ok(Some(self.at_snapshot(table, base, id).await?));
        }
        let kind = MetadataTable::parse(suffix).ok_or_else(|| {
            DataFusionError::from(Error::NotFound(format!(
                "'{}' is not a metadata table; there are $snapshots, $history, $files, \
                 $partitions and $manifests",
                self.qualified(name)
            )))
        })?;
        Ok(Some(metadata_table(kind, &table).await?))
    }

    fn table_exist(&self, name: &str) -> bool {
        let ident = TableIdent::new(self.namespace.clone(), name.to_string());
        block_on(self.catalog.table_exists(&ident)).unwrap_or(false)
    }

    /// Every table of an Iceberg catalog is a base table: known without loading it (the
    /// default loads the table's metadata; `information_schema.tables` and `pg_class` ask
    /// this of every table). Existence is asked of the catalog, not of the table's metadata.
    async fn table_type(&self, name: &str) -> DFResult<Option<TableType>> {
        let ident = TableIdent::new(self.namespace.clone(), name.to_string());
        match self.catalog.table_exists(&ident).await {
            Ok(true) => Ok(Some(TableType::Base)),
            Ok(false) => Ok(None),
            Err(e) => Err(Error::from(e).into()),
        }
    }
}

impl LakeSchemaProvider {
    async fn at_snapshot(
        &self,
        table: Table,
        base: &str,
        id: i64,
    ) -> DFResult<Arc<dyn TableProvider>> {
        if table.metadata().snapshot_by_id(id).is_none() {
            return Err(Error::NotFound(format!(
                "table {} has no snapshot {id} (SELECT snapshot_id FROM {}.{}.\"{base}$snapshots\" \
                 lists them)",
                self.qualified(base),
                self.catalog_name,
                self.namespace.to_url_string()
            ))
            .into());
        }
        if crate::lake::read::needs_own_reader(table.metadata(), Some(id)) {
            let provider = super::evolved_scan::FileByFile::try_new(table, Some(id))?;
            return Ok(Arc::new(provider));
        }
        let provider = LakeTable::at_snapshot(table, self.catalog.clone(), id).await?;
        Ok(Arc::new(provider))
    }
}

/// The snapshot that was current at `ms` (epoch millis), from the table's snapshot log.
pub fn snapshot_as_of(table: &Table, ms: i64) -> Option<i64> {
    table
        .metadata()
        .history()
        .iter()
        .filter(|log| log.timestamp_ms <= ms)
        .max_by_key(|log| log.timestamp_ms)
        .map(|log| log.snapshot_id)
}
