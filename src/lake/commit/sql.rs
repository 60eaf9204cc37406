//! Committing to an Iceberg SQL catalog (SQLite, PostgreSQL) by compare-and-set on its
//! `iceberg_tables` row:
//!
//! ```text
//! new metadata file written next to base's
//! UPDATE iceberg_tables SET metadata_location = new WHERE metadata_location = base
//!   (0 rows: someone else committed first -> a retryable conflict)
//! ```
//!
//! A crash before the compare-and-set leaves the table as it was (the new metadata file is
//! an orphan), so a schema is never visible without the snapshot that uses it.
//!
//! Commits to many tables at once (a checkpoint's) share their work: each one's request
//! waits in a queue, and whoever's turn comes takes the whole queue, syncs the files written
//! for it (see [`crate::lake::storage::sync_written`]) and runs every compare-and-set in one
//! database transaction, one sync of the database for all. Each table's compare-and-set
//! still succeeds or conflicts on its own.
//!
//! A routed job's new tables are created by their first commit ([`SqlCommitter::new_tables`]):
//! until then they are metadata in memory, with no file and no row; their first commit
//! writes one metadata file (the table and its first snapshot) and inserts the row, in the
//! same transaction as the other tables' compare-and-sets:
//!
//! ```text
//! INSERT INTO iceberg_tables ... WHERE NOT EXISTS (the table's row)
//!   (0 rows: another writer created it first -> a retryable conflict: the commit is tried
//!    again on that table, its schema merged with ours)
//! ```

use std::sync::Mutex;

use iceberg::io::FileIO;
use iceberg::spec::{TableMetadata, TableMetadataBuilder};
use iceberg::table::Table;
use iceberg::{Catalog, NamespaceIdent, TableCreation, TableIdent};
use sqlx::AnyPool;
use tokio::sync::oneshot;

use crate::error::{Error, Result};

/// Commits to an Iceberg SQL catalog by compare-and-set on its `iceberg_tables` row.
#[derive(Debug)]
pub struct SqlCommitter {
    pool: AnyPool,
    catalog_name: String,
    dollar_params: bool,
    /// Compare-and-sets waiting for a transaction.
    queue: Mutex<Vec<Request>>,
    /// Whose turn it is to run the queue.
    turn: tokio::sync::Mutex<()>,
    /// Where new tables go and the file IO that writes them, when known (see
    /// [`Self::with_warehouse`]).
    home: Option<(String, FileIO)>,
}

/// One table's compare-and-set (or insert, for a table its commit creates), and where its
/// outcome goes (whether the row changed).
#[derive(Debug)]
struct Request {
    namespace: String,
    name: String,
    /// `None`: the commit creates the table.
    base_location: Option<String>,
    location: String,
    done: oneshot::Sender<Result<bool>>,
}

impl SqlCommitter {
    /// A committer on the catalog database at `uri` (the one the catalog uses).
    pub async fn connect(uri: &str, catalog_name: &str) -> Result<Self> {
        sqlx::any::install_default_drivers();
        let pool = sqlx::any::AnyPoolOptions::new()
            .max_connections(2)
            .connect(uri)
            .await
            .map_err(|e| Error::catalog_database("opening the catalog database for commits", e))?;
        Ok(Self {
            pool,
            catalog_name: catalog_name.to_string(),
            dollar_params: !uri.starts_with("sqlite:"),
            queue: Mutex::new(Vec::new()),
            turn: tokio::sync::Mutex::new(()),
            home: None,
        })
    }

    /// The same committer, making new tables (see [`Self::new_tables`]) under `warehouse`
    /// (for namespaces without a location of their own) through `io`, as the catalog does.
    pub fn with_warehouse(mut self, warehouse: &str, io: FileIO) -> Self {
        self.home = Some((warehouse.trim_end_matches('/').to_string(), io));
        self
    }

    /// Which of `names` are tables of `namespace` (one query per 500 names).
    pub async fn existing(
        &self,
        namespace: &NamespaceIdent,
        names: &[String],
    ) -> Result<std::collections::HashSet<String>> {
        let mut found = std::collections::HashSet::new();
        let ns = namespace.join(".");
        for chunk in names.chunks(500) {
            let at = |i: usize| self.param(i);
            let list: Vec<String> = (0..chunk.len()).map(|i| at(i + 3)).collect();
            let sql = format!(
                "SELECT table_name FROM iceberg_tables WHERE catalog_name = {} \
                 AND table_namespace = {} AND table_name IN ({})",
                at(1),
                at(2),
                list.join(", ")
            );
            let mut query = sqlx::query_as::<_, (String,)>(&sql)
                .bind(self.catalog_name.clone())
                .bind(ns.clone());
            for name in chunk {
                query = query.bind(name.clone());
            }
            let rows = query
                .fetch_all(&self.pool)
                .await
                .map_err(|e| Error::catalog_database(format!("listing tables of {ns}"), e))?;
            found.extend(rows.into_iter().map(|(name,)| name));
        }
        Ok(found)
    }

    /// The tables `creations` describe in `namespace` (of `catalog`, whose database this is),
    /// not created yet: each one's metadata, in memory, where the catalog would put it. A
    /// table is created by its first commit ([`Self::commit`] of a table with no metadata
    /// location), which fails as a retryable conflict when another writer created a table of
    /// its name first. `None` when this committer does not know where tables go: create them
    /// through the catalog.
    pub async fn new_tables(
        &self,
        catalog: &dyn Catalog,
        namespace: &NamespaceIdent,
        creations: Vec<TableCreation>,
    ) -> Result<Option<Vec<Table>>> {
        let Some((warehouse, io)) = &self.home else {
            return Ok(None);
        };
        // Where the namespace keeps its tables, as the catalog decides it.
        let props = catalog.get_namespace(namespace).await?.properties().clone();
        let home = props
            .get("location")
            .map(|l| l.trim_end_matches('/').to_string())
            .unwrap_or_else(|| format!("{warehouse}/{}", namespace.join("/")));
        let runtime = iceberg::Runtime::try_current()?;
        creations
            .into_iter()
            .map(|creation| {
                let name = creation.name.clone();
                let location = creation
                    .location
                    .clone()
                    .unwrap_or_else(|| format!("{home}/{name}"));
                let creation = TableCreation {
                    location: Some(location),
                    ..creation
                };
                let metadata = TableMetadataBuilder::from_table_creation(creation)?
                    .build()?
                    .metadata;
                Ok(Table::builder()
                    // (As a commit's, see `table_like`.)
                    .disable_cache()
                    .file_io(io.clone())
                    .identifier(TableIdent::new(namespace.clone(), name))
                    .metadata(metadata)
                    .runtime(runtime.clone())
                    .build()?)
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// The `i`th bind parameter (from 1), in the database's style.
    fn param(&self, i: usize) -> String {
        if self.dollar_params {
            format!("${i}")
        } else {
            "?".to_string()
        }
    }

    /// Write `metadata` as the next version of `base` and make it current, unless `base`
    /// is no longer current (a retryable conflict). A `base` not created yet (see
    /// [`Self::new_tables`]) is created, unless another writer created a table of its name
    /// first (a retryable conflict).
    pub async fn commit(&self, base: &Table, metadata: TableMetadata) -> Result<Table> {
        let base_location = base.metadata_location().map(str::to_string);
        let location = super::write_next_metadata(base, &metadata).await?;
        let ident = base.identifier();
        let (done, outcome) = oneshot::channel();
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Request {
                namespace: ident.namespace().join("."),
                name: ident.name().to_string(),
                base_location,
                location: location.clone(),
                done,
            });
        let mut outcome = outcome;
        let changed = {
            let _turn = self.turn.lock().await;
            match outcome.try_recv() {
                // The turn before ran this request with its own.
                Ok(changed) => changed,
                Err(_) => {
                    self.run_queue().await;
                    outcome.await.map_err(|_| {
                        Error::Internal(format!("the commit of {ident} was dropped"))
                    })?
                }
            }
        }?;
        if !changed {
            let what = match base.metadata_location() {
                Some(_) => "changed while floe was committing to it",
                None => "was created by another writer while floe was creating it",
            };
            return Err(iceberg::Error::new(
                iceberg::ErrorKind::CatalogCommitConflicts,
                format!("table {ident} {what}"),
            )
            .with_retryable(true)
            .into());
        }
        super::table_like(base, metadata, Some(&location))
    }

    /// Run every request queued: their files synced, then their compare-and-sets in one
    /// transaction; each request learns whether its row changed (or the error that stopped
    /// them all).
    async fn run_queue(&self) {
        let mut requests =
            std::mem::take(&mut *self.queue.lock().unwrap_or_else(|e| e.into_inner()));
        // A commit given up while it waited (its task dropped) is not made.
        requests.retain(|r| !r.done.is_closed());
        if requests.is_empty() {
            return;
        }
        let outcome = match crate::lake::storage::sync_written().await {
            Ok(()) => self.compare_and_set(&requests).await,
            Err(e) => Err(e.into()),
        };
        match outcome {
            Ok(changed) => {
                for (request, changed) in requests.into_iter().zip(changed) {
                    let _ = request.done.send(Ok(changed));
                }
            }
            // Each request gets the error, as retryable as it is.
            Err(e) => {
                let retryable = e.is_retryable();
                for request in requests {
                    let _ = request.done.send(Err(Error::Catalog {
                        context: format!("committing {}.{}", request.namespace, request.name),
                        source: e.to_string().into(),
                        retryable,
                    }));
                }
            }
        }
    }

    /// The compare-and-set (or insert) of each request, in one transaction: whether each row
    /// changed.
    async fn compare_and_set(&self, requests: &[Request]) -> Result<Vec<bool>> {
        let p = |i: usize| self.param(i);
        let update = format!(
            "UPDATE iceberg_tables SET metadata_location = {}, previous_metadata_location = {} \
             WHERE catalog_name = {} AND table_namespace = {} AND table_name = {} \
             AND metadata_location = {}",
            p(1),
            p(2),
            p(3),
            p(4),
            p(5),
            p(6)
        );
        let insert = format!(
            "INSERT INTO iceberg_tables (catalog_name, table_namespace, table_name, \
             metadata_location, iceberg_type) SELECT {}, {}, {}, {}, 'TABLE' \
             WHERE NOT EXISTS (SELECT 1 FROM iceberg_tables WHERE catalog_name = {} \
             AND table_namespace = {} AND table_name = {})",
            p(1),
            p(2),
            p(3),
            p(4),
            p(5),
            p(6),
            p(7)
        );
        let what = || match requests {
            [one] => format!("committing {}.{}", one.namespace, one.name),
            _ => format!("committing {} tables", requests.len()),
        };
        let failed = |e| Error::catalog_database(what(), e);
        let mut tx = self.pool.begin().await.map_err(failed)?;
        let mut changed = Vec::with_capacity(requests.len());
        for r in requests {
            let query = match &r.base_location {
                Some(base) => sqlx::query(&update)
                    .bind(r.location.clone())
                    .bind(base.clone())
                    .bind(self.catalog_name.clone())
                    .bind(r.namespace.clone())
                    .bind(r.name.clone())
                    .bind(base.clone()),
                None => sqlx::query(&insert)
                    .bind(self.catalog_name.clone())
                    .bind(r.namespace.clone())
                    .bind(r.name.clone())
                    .bind(r.location.clone())
                    .bind(self.catalog_name.clone())
                    .bind(r.namespace.clone())
                    .bind(r.name.clone()),
            };
            let done = query.execute(&mut *tx).await.map_err(failed)?;
            changed.push(done.rows_affected() > 0);
        }
        tx.commit().await.map_err(failed)?;
        Ok(changed)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// Requests for `(name, base)` (their outcomes dropped: only the transaction is tested).
    fn requests(rows: &[(&str, &str)]) -> Vec<Request> {
        rows.iter()
            .map(|(name, base)| Request {
                namespace: "ns".into(),
                name: name.to_string(),
                base_location: Some(base.to_string()),
                location: format!("{base}+1"),
                done: oneshot::channel().0,
            })
            .collect()
    }

    #[tokio::test]
    async fn new_tables_are_created_by_their_first_commit_unless_another_writer_was_first() {
        use iceberg::CatalogBuilder;
        use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
        use iceberg_catalog_sql::{SqlBindStyle, SqlCatalogBuilder};
        let dir = tempfile::tempdir().unwrap();
        let uri = format!("sqlite://{}/c.db?mode=rwc", dir.path().display());
        let warehouse = format!("{}/wh", dir.path().display());
        let factory = Arc::new(crate::lake::storage::LocalStorageFactory);
        let catalog = SqlCatalogBuilder::default()
            .with_storage_factory(factory.clone())
            .sql_bind_style(SqlBindStyle::QMark)
            .load(
                "lake",
                [
                    ("uri".to_string(), uri.clone()),
                    ("warehouse".to_string(), warehouse.clone()),
                ]
                .into(),
            )
            .await
            .unwrap();
        let ns = NamespaceIdent::new("ns".into());
        catalog
            .create_namespace(&ns, Default::default())
            .await
            .unwrap();
        let io = iceberg::io::FileIOBuilder::new(factory).build();
        let committer = SqlCommitter::connect(&uri, "lake")
            .await
            .unwrap()
            .with_warehouse(&warehouse, io);
        let creation = |name: &str| {
            TableCreation::builder()
                .name(name.to_string())
                .schema(
                    Schema::builder()
                        .with_fields(vec![Arc::new(NestedField::optional(
                            1,
                            "id",
                            Type::Primitive(PrimitiveType::Long),
                        ))])
                        .build()
                        .unwrap(),
                )
                .build()
        };
        catalog.create_table(&ns, creation("b")).await.unwrap();
        let names: Vec<String> = ["a", "b", "c"].map(String::from).into();
        let existing = committer.existing(&ns, &names).await.unwrap();
        assert_eq!(existing, ["b".to_string()].into());
        let made = committer
            .new_tables(&catalog, &ns, ["a", "c"].map(creation).into())
            .await
            .unwrap()
            .expect("a committer that knows the warehouse makes new tables");
        let locations: Vec<&str> = made.iter().map(|t| t.metadata().location()).collect();
        assert_eq!(
            locations,
            [format!("{warehouse}/ns/a"), format!("{warehouse}/ns/c")]
        );
        // Made, not created: no row, no file.
        assert_eq!(catalog.list_tables(&ns).await.unwrap().len(), 1);
        assert!(!std::path::Path::new(&format!("{warehouse}/ns/a")).exists());
        // Another writer creates `c` meanwhile: `a`'s first commit creates it, `c`'s
        // conflicts (retryable) and leaves the other writer's table as it was.
        let theirs = catalog.create_table(&ns, creation("c")).await.unwrap();
        let (a, c) = (&made[0], &made[1]);
        let created = committer.commit(a, a.metadata().clone()).await.unwrap();
        let loaded = catalog.load_table(a.identifier()).await.unwrap();
        assert_eq!(loaded.metadata_location(), created.metadata_location());
        assert_eq!(loaded.metadata().uuid(), a.metadata().uuid());
        assert!(
            loaded
                .metadata()
                .current_schema()
                .field_by_name("id")
                .is_some()
        );
        let lost = committer.commit(c, c.metadata().clone()).await.unwrap_err();
        assert!(lost.is_retryable(), "{lost}");
        assert!(
            lost.to_string().contains("created by another writer"),
            "{lost}"
        );
        let loaded = catalog.load_table(c.identifier()).await.unwrap();
        assert_eq!(loaded.metadata_location(), theirs.metadata_location());
        assert_eq!(catalog.list_tables(&ns).await.unwrap().len(), 3);
    }

    #[tokio::test]
    async fn each_compare_and_set_in_one_transaction_succeeds_or_conflicts_alone() {
        let dir = tempfile::tempdir().unwrap();
        let uri = format!("sqlite://{}/c.db?mode=rwc", dir.path().display());
        let committer = SqlCommitter::connect(&uri, "lake").await.unwrap();
        sqlx::query(
            "CREATE TABLE iceberg_tables (catalog_name TEXT, table_namespace TEXT, \
             table_name TEXT, metadata_location TEXT, previous_metadata_location TEXT)",
        )
        .execute(&committer.pool)
        .await
        .unwrap();
        for name in ["a", "b", "c"] {
            sqlx::query(&format!(
                "INSERT INTO iceberg_tables VALUES ('lake', 'ns', '{name}', '{name}-0', NULL)"
            ))
            .execute(&committer.pool)
            .await
            .unwrap();
        }
        // `b`'s base is not current (another writer committed): only it conflicts.
        let changed = committer
            .compare_and_set(&requests(&[("a", "a-0"), ("b", "b-old"), ("c", "c-0")]))
            .await
            .unwrap();
        assert_eq!(changed, [true, false, true]);
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SELECT table_name, metadata_location FROM iceberg_tables ORDER BY table_name",
        )
        .fetch_all(&committer.pool)
        .await
        .unwrap();
        let rows: Vec<(&str, &str)> = rows.iter().map(|(a, b)| (&a[..], &b[..])).collect();
        assert_eq!(rows, [("a", "a-0+1"), ("b", "b-0"), ("c", "c-0+1")]);
        // A queued commit whose caller gave up is not made.
        committer
            .queue
            .lock()
            .unwrap()
            .extend(requests(&[("c", "c-0+1")]));
        committer.run_queue().await;
        let c: (String,) =
            sqlx::query_as("SELECT metadata_location FROM iceberg_tables WHERE table_name = 'c'")
                .fetch_one(&committer.pool)
                .await
                .unwrap();
        assert_eq!(c.0, "c-0+1");
    }
}
