//! Opening Iceberg catalogs (SQL on SQLite or PostgreSQL, REST, AWS Glue, in memory) from a
//! [`CatalogConfig`], which `CREATE CATALOG` reads from its options.
//!
//! Relative local paths are resolved against the working directory and stored as absolute
//! `file://` URIs, so that other tools (pyiceberg, DuckDB) can open the tables.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use iceberg::io::{FileIOBuilder, StorageFactory};

use super::storage::LocalStorageFactory;
use iceberg::memory::MemoryCatalogBuilder;
use iceberg::{Catalog, CatalogBuilder};
use iceberg_catalog_rest::RestCatalogBuilder;
use iceberg_catalog_sql::{SqlBindStyle, SqlCatalogBuilder};
use iceberg_storage_opendal::OpenDalStorageFactory;

use super::commit::{Committer, RestCommitter, SqlCommitter};
use super::glue::{GlueCatalog, GlueOptions};
use crate::error::{Error, Result};
use crate::secret::{self, MASK, is_secret};

/// A catalog registered in the session.
#[derive(Debug, Clone)]
pub struct CatalogHandle {
    /// The name it is known by in SQL.
    pub name: String,
    /// `sql`, `rest`, `glue` or `memory`.
    pub kind: String,
    /// The Iceberg catalog.
    pub catalog: Arc<dyn Catalog>,
    /// Its options as resolved, with secrets masked, for `SHOW CATALOGS`.
    pub display_options: BTreeMap<String, String>,
    /// floe's own commit path (schema and partition evolution), where it exists.
    pub committer: Option<Arc<Committer>>,
}

/// What `CREATE CATALOG ... WITH (...)` asks for, read and checked.
#[derive(Clone, PartialEq)]
pub struct CatalogConfig {
    pub kind: CatalogKind,
    /// Storage properties (`s3.*`, with their prefix), passed to the file IO.
    pub storage: BTreeMap<String, String>,
}

/// How long a REST catalog's calls may take (`rest.connect-timeout`, `rest.request-timeout`):
/// a server that stops answering fails the call (retried by a job) instead of stopping it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RestTimeouts {
    pub connect: std::time::Duration,
    pub request: std::time::Duration,
}

impl Default for RestTimeouts {
    fn default() -> Self {
        Self {
            connect: std::time::Duration::from_secs(10),
            request: std::time::Duration::from_secs(60),
        }
    }
}

impl RestTimeouts {
    /// An HTTP client with these timeouts.
    pub fn client(&self) -> reqwest::ClientBuilder {
        reqwest::Client::builder()
            .connect_timeout(self.connect)
            .timeout(self.request)
    }
}

/// The catalog implementation and its own properties.
#[derive(Clone, PartialEq)]
pub enum CatalogKind {
    /// A SQL catalog: `sqlite:path` or `postgres://...`, and a warehouse path or URI.
    Sql {
        uri: String,
        warehouse: String,
        max_connections: Option<u64>,
    },
    /// A REST catalog: `uri`, and `warehouse`, `credential`, `token`, `oauth2-server-uri`,
    /// `scope`, `prefix` and `header.*` as given; every call to it bounded by `timeouts`.
    Rest {
        props: BTreeMap<String, String>,
        timeouts: RestTimeouts,
    },
    /// The AWS Glue Data Catalog.
    Glue(GlueOptions),
    /// An in-memory catalog (tables vanish with the process); files under `warehouse`.
    Memory { warehouse: Option<String> },
}

impl std::fmt::Debug for CatalogConfig {
    /// Secrets masked ([`secret`]).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatalogConfig")
            .field("kind", &self.kind)
            .field("storage", &secret::Masked(&self.storage))
            .finish()
    }
}

impl std::fmt::Debug for CatalogKind {
    /// Secrets masked ([`secret`]): a URI's password, secret properties, headers.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CatalogKind::Sql {
                uri,
                warehouse,
                max_connections,
            } => f
                .debug_struct("Sql")
                .field("uri", &secret::mask_url(uri))
                .field("warehouse", warehouse)
                .field("max_connections", max_connections)
                .finish(),
            CatalogKind::Rest { props, timeouts } => {
                let shown: BTreeMap<String, String> = props
                    .iter()
                    .map(|(k, v)| match k.starts_with("header.") {
                        true => (k.clone(), MASK.to_string()),
                        false => (k.clone(), v.clone()),
                    })
                    .collect();
                f.debug_struct("Rest")
                    .field("props", &secret::Masked(&shown))
                    .field("timeouts", timeouts)
                    .finish()
            }
            CatalogKind::Glue(options) => options.fmt(f),
            CatalogKind::Memory { warehouse } => f
                .debug_struct("Memory")
                .field("warehouse", warehouse)
                .finish(),
        }
    }
}

impl CatalogKind {
    /// `sql`, `rest`, `glue` or `memory`.
    pub fn name(&self) -> &'static str {
        match self {
            CatalogKind::Sql { .. } => "sql",
            CatalogKind::Rest { .. } => "rest",
            CatalogKind::Glue(_) => "glue",
            CatalogKind::Memory { .. } => "memory",
        }
    }
}

/// Open the catalog `config` describes, as `name`.
pub async fn connect(name: &str, config: CatalogConfig) -> Result<CatalogHandle> {
    let kind = config.kind.name().to_string();
    let mut props: HashMap<String, String> = config.storage.into_iter().collect();
    let mut committer = None;
    let catalog: Arc<dyn Catalog> = match config.kind {
        CatalogKind::Sql {
            uri,
            warehouse,
            max_connections,
        } => {
            let uri = sql_uri(&uri)?;
            let warehouse = warehouse_uri(&warehouse)?;
            if let Some(n) = max_connections {
                props.insert("pool.max-connections".into(), n.to_string());
            }
            let is_sqlite = uri.starts_with("sqlite:");
            let bind = || {
                if is_sqlite {
                    SqlBindStyle::QMark
                } else {
                    SqlBindStyle::DollarNumeric
                }
            };
            if is_sqlite {
                create_sqlite_wal(&uri).await?;
            } else {
                probe_postgres(&uri).await?;
            }
            props.insert("uri".into(), uri);
            props.insert("warehouse".into(), warehouse.clone());
            // Several processes opening a fresh PostgreSQL catalog at once race on its
            // CREATE TABLE IF NOT EXISTS; the loser retries.
            let mut attempt = 0;
            let catalog = loop {
                let loaded = SqlCatalogBuilder::default()
                    .with_storage_factory(storage_for(&warehouse))
                    .sql_bind_style(bind())
                    .load(name, props.clone())
                    .await;
                match loaded {
                    Err(e)
                        if attempt < 3
                            && (e.to_string().contains("already exists")
                                || e.to_string().contains("pg_type_typname_nsp_index")) =>
                    {
                        attempt += 1;
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                    other => break other?,
                }
            };
            let uri = props.get("uri").cloned().unwrap_or_default();
            // The catalog's own file IO (its builder passes it every property too).
            let io = FileIOBuilder::new(storage_for(&warehouse))
                .with_props(props.clone())
                .build();
            committer = Some(Arc::new(Committer::Sql(
                SqlCommitter::connect(&uri, name)
                    .await?
                    .with_warehouse(&warehouse, io),
            )));
            Arc::new(catalog)
        }
        CatalogKind::Rest {
            props: rest,
            timeouts,
        } => {
            props.extend(rest);
            let warehouse = props.get("warehouse").cloned().unwrap_or_default();
            let storage = if is_local(&warehouse) && !warehouse.is_empty() {
                storage_for(&warehouse)
            } else {
                Arc::new(OpenDalStorageFactory::S3 {
                    customized_credential_load: None,
                }) as Arc<dyn StorageFactory>
            };
            let client = timeouts.client().build().map_err(|e| {
                Error::Internal(format!("building the REST catalog's HTTP client: {e}"))
            })?;
            let catalog = RestCatalogBuilder::default()
                .with_client(client)
                .with_storage_factory(storage)
                .load(name, props.clone())
                .await?;
            committer = Some(Arc::new(Committer::Rest(
                RestCommitter::connect(&props, timeouts).await?,
            )));
            Arc::new(catalog)
        }
        CatalogKind::Glue(options) => {
            let warehouse = warehouse_uri(&options.warehouse)?;
            let catalog = GlueCatalog::connect(
                &options,
                warehouse.clone(),
                storage_for(&warehouse),
                props.clone(),
            )
            .await?;
            committer = Some(Arc::new(Committer::Glue(catalog.committer())));
            props.insert("warehouse".into(), warehouse);
            let given = [
                ("glue.region", &options.region),
                ("glue.endpoint", &options.endpoint),
                ("glue.catalog-id", &options.catalog_id),
            ];
            for (k, v) in given {
                if let Some(v) = v {
                    props.insert(k.into(), v.clone());
                }
            }
            if let Some(c) = &options.credentials {
                props.insert("glue.access-key-id".into(), c.access_key_id.clone());
                props.insert("glue.secret-access-key".into(), MASK.into());
            }
            Arc::new(catalog)
        }
        CatalogKind::Memory { warehouse } => {
            let warehouse = match warehouse {
                Some(w) => warehouse_uri(&w)?,
                None => warehouse_uri(
                    &std::env::temp_dir()
                        .join(format!("floe-memory-{}-{name}", std::process::id()))
                        .to_string_lossy(),
                )?,
            };
            props.insert("warehouse".into(), warehouse.clone());
            let catalog = MemoryCatalogBuilder::default()
                .with_storage_factory(storage_for(&warehouse))
                .load(name, props.clone())
                .await?;
            Arc::new(catalog)
        }
    };

    let display_options = props
        .into_iter()
        .map(|(k, v)| {
            let shown = if is_secret(&k) || k.starts_with("header.") {
                MASK.to_string()
            } else if k == "uri" {
                secret::mask_url(&v)
            } else {
                v
            };
            (k, shown)
        })
        .chain([("catalog-type".to_string(), kind.clone())])
        .collect();
    Ok(CatalogHandle {
        name: name.to_string(),
        kind,
        catalog,
        display_options,
        committer,
    })
}

/// Whether `ident` exists in `catalog`; a missing namespace means a missing table, but a
/// catalog that cannot answer is an error (an outage is not "does not exist").
pub async fn table_exists(catalog: &dyn Catalog, ident: &iceberg::TableIdent) -> Result<bool> {
    match catalog.table_exists(ident).await {
        Ok(exists) => Ok(exists),
        Err(e) if e.kind() == iceberg::ErrorKind::NamespaceNotFound => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Create a SQLite catalog database that does not exist yet in write-ahead-log mode: a
/// commit then syncs one file once (the rollback journal syncs three), and readers (floe,
/// pyiceberg) never block a job's commits. A database that exists keeps its journal mode.
async fn create_sqlite_wal(uri: &str) -> Result<()> {
    use sqlx::ConnectOptions;
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};
    let Some(path) = uri
        .strip_prefix("sqlite://")
        .map(|p| p.split('?').next().unwrap_or(p))
        .filter(|p| p.starts_with('/'))
    else {
        return Ok(());
    };
    if Path::new(path).exists() {
        return Ok(());
    }
    let conn = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .connect()
        .await;
    match conn {
        Ok(conn) => {
            let _ = sqlx::Connection::close(conn).await;
            Ok(())
        }
        // Another process created it meanwhile (and holds it): it keeps its journal mode.
        Err(_) if Path::new(path).exists() => Ok(()),
        Err(e) => Err(Error::Option(format!(
            "cannot create the catalog database {path}: {e}"
        ))),
    }
}

/// Connect once to a PostgreSQL catalog database, so that a wrong address fails in seconds
/// with its cause (the pool would wait 30 s and report only a timeout).
async fn probe_postgres(uri: &str) -> Result<()> {
    use sqlx::Connection;
    let shown = secret::mask_url(uri);
    let connect = sqlx::PgConnection::connect(uri);
    match tokio::time::timeout(std::time::Duration::from_secs(10), connect).await {
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
            Ok(())
        }
        Ok(Err(e)) => Err(Error::Option(format!(
            "cannot connect to the catalog database {shown}: {e}"
        ))),
        Err(_) => Err(Error::Option(format!(
            "cannot connect to the catalog database {shown}: no answer in 10 s"
        ))),
    }
}

fn is_local(location: &str) -> bool {
    !location.contains("://") || location.starts_with("file:")
}

fn storage_for(warehouse: &str) -> Arc<dyn StorageFactory> {
    if is_local(warehouse) {
        Arc::new(LocalStorageFactory)
    } else {
        Arc::new(OpenDalStorageFactory::S3 {
            customized_credential_load: None,
        })
    }
}

fn absolute(path: &str) -> Result<PathBuf> {
    let p = Path::new(path);
    if p.is_absolute() {
        return Ok(p.to_path_buf());
    }
    let cwd = std::env::current_dir().map_err(|e| Error::io("reading the working directory", e))?;
    Ok(cwd.join(p))
}

/// A warehouse location as a URI: object-store URIs pass through, local paths become
/// absolute `file://` URIs (and the folder is created).
pub fn warehouse_uri(location: &str) -> Result<String> {
    if !is_local(location) {
        return Ok(location.trim_end_matches('/').to_string());
    }
    let path = location
        .strip_prefix("file://")
        .or_else(|| location.strip_prefix("file:"))
        .unwrap_or(location);
    let abs = absolute(path)?;
    std::fs::create_dir_all(&abs).map_err(|e| {
        Error::io(
            format!("creating the warehouse folder {}", abs.display()),
            e,
        )
    })?;
    let abs = abs
        .canonicalize()
        .map_err(|e| Error::io(format!("resolving {}", abs.display()), e))?;
    Ok(format!(
        "file://{}",
        abs.to_string_lossy().trim_end_matches('/')
    ))
}

/// A SQL catalog URI with a relative sqlite path made absolute, the folder created, and
/// the database file created on first use.
fn sql_uri(uri: &str) -> Result<String> {
    let Some(rest) = uri.strip_prefix("sqlite:") else {
        if uri.starts_with("postgres://") || uri.starts_with("postgresql://") {
            return Ok(uri.to_string());
        }
        return Err(Error::Option(format!(
            "'uri' = '{uri}' is not a SQL catalog URI: use 'sqlite:path/to/catalog.db' or \
             'postgres://user:password@host/db'"
        )));
    };
    let (path, query) = match rest.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rest, None),
    };
    let path = path.trim_start_matches("//");
    if path == ":memory:" || path.is_empty() {
        return Ok("sqlite::memory:".to_string());
    }
    let abs = absolute(path)?;
    if let Some(parent) = abs.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| Error::io(format!("creating {}", parent.display()), e))?;
    }
    let query = query.unwrap_or("mode=rwc");
    Ok(format!("sqlite://{}?{query}", abs.to_string_lossy()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_no_secret() {
        let sql = CatalogConfig {
            kind: CatalogKind::Sql {
                uri: "postgres://floe:pw1@h/db".into(),
                warehouse: "w".into(),
                max_connections: None,
            },
            storage: BTreeMap::from([("s3.secret-access-key".into(), "pw2".into())]),
        };
        let rest = CatalogKind::Rest {
            props: BTreeMap::from([
                ("credential".into(), "id:pw3".into()),
                ("header.X-Key".into(), "pw4".into()),
                ("uri".into(), "http://h".into()),
            ]),
            timeouts: RestTimeouts::default(),
        };
        let shown = format!("{sql:?} {rest:?}");
        for secret in ["pw1", "pw2", "pw3", "pw4"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(shown.contains("http://h"), "{shown}");
    }

    #[test]
    fn sqlite_uris_become_absolute_and_creatable() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/catalog.db");
        let uri = sql_uri(&format!("sqlite:{}", p.display())).unwrap();
        assert_eq!(uri, format!("sqlite://{}?mode=rwc", p.display()));
        assert!(p.parent().unwrap().is_dir());
        assert!(sql_uri("mysql://x").is_err());
        assert_eq!(sql_uri("postgres://a/b").unwrap(), "postgres://a/b");
    }

    #[test]
    fn warehouses_become_file_uris() {
        let dir = tempfile::tempdir().unwrap();
        let w = warehouse_uri(&dir.path().join("wh").to_string_lossy()).unwrap();
        assert!(w.starts_with("file:///"), "{w}");
        assert_eq!(warehouse_uri("s3://bucket/wh/").unwrap(), "s3://bucket/wh");
    }
}
