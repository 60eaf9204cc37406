//! The AWS Glue Data Catalog as an Iceberg catalog: databases are namespaces, a Glue table
//! with `table_type = ICEBERG` points at its metadata file (`metadata_location`), as
//! iceberg-java, pyiceberg and Athena lay them out. Commits swap that pointer with Glue's
//! optimistic `UpdateTable` ([`GlueCommitter`]), iceberg-rust's own and floe's alike.
//!
//! floe has its own catalog on `aws-sdk-glue` rather than iceberg-catalog-glue 0.10: that
//! crate reports every AWS error as `Unexpected`, so a table created by another writer
//! meanwhile is not "already exists" (two routed jobs creating one table fail) and a
//! missing table is not "not found"; its calls have no timeouts (a dead endpoint hangs a
//! job), and its errors are debug dumps of the SDK's.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_glue::types::DatabaseInput;
use iceberg::io::{FileIO, FileIOBuilder, StorageFactory};
use iceberg::spec::{TableMetadata, TableMetadataBuilder};
use iceberg::table::Table;
use iceberg::{
    Catalog, Error, ErrorKind, MetadataLocation, Namespace, NamespaceIdent, Result, TableCommit,
    TableCreation, TableIdent,
};

use super::commit::GlueCommitter;
use super::commit::glue::{ICEBERG, TABLE_TYPE, database_of, is_not_found, metadata_location};
use crate::connector::aws::{StaticCredentials, sdk_config};

/// Where a Glue catalog is and how to reach it (`CREATE CATALOG ... 'catalog-type' = 'glue'`).
#[derive(Debug, Clone, PartialEq)]
pub struct GlueOptions {
    /// Where new tables go: `s3://bucket/path` (or a local folder).
    pub warehouse: String,
    /// `glue.region`; otherwise the AWS chain's.
    pub region: Option<String>,
    /// `glue.endpoint`: a Glue-compatible endpoint instead of AWS's.
    pub endpoint: Option<String>,
    /// `glue.catalog-id`: another account's catalog.
    pub catalog_id: Option<String>,
    /// `glue.access-key-id`, ...; otherwise the AWS chain's.
    pub credentials: Option<StaticCredentials>,
}

impl GlueOptions {
    /// `the AWS Glue Data Catalog at <endpoint>` (or in a region), for messages.
    pub fn describe(&self) -> String {
        let catalog = match &self.catalog_id {
            Some(id) => format!("the AWS Glue Data Catalog {id}"),
            None => "the AWS Glue Data Catalog".to_string(),
        };
        match (&self.endpoint, &self.region) {
            (Some(e), _) => format!("{catalog} at {e}"),
            (None, Some(r)) => format!("{catalog} in {r}"),
            (None, None) => format!("{catalog} of the environment's AWS region"),
        }
    }
}

/// An Iceberg catalog on the AWS Glue Data Catalog.
#[derive(Debug)]
pub struct GlueCatalog {
    glue: Arc<GlueCommitter>,
    warehouse: String,
    file_io: FileIO,
}

impl GlueCatalog {
    /// Connect to the catalog `options` describe, with `storage` (`s3.*`) for its files;
    /// fails with the cause when Glue cannot be reached or refuses the credentials.
    pub async fn connect(
        options: &GlueOptions,
        warehouse: String,
        storage: Arc<dyn StorageFactory>,
        storage_props: HashMap<String, String>,
    ) -> crate::error::Result<Self> {
        let config = sdk_config(
            options.region.as_deref(),
            options.endpoint.as_deref(),
            options.credentials.as_ref(),
        )
        .await;
        let glue = GlueCommitter {
            client: aws_sdk_glue::Client::new(&config),
            catalog_id: options.catalog_id.clone(),
            at: options.describe(),
        };
        glue.client
            .get_databases()
            .set_catalog_id(glue.catalog_id.clone())
            .max_results(1)
            .send()
            .await
            .map_err(|e| crate::error::Error::Catalog {
                context: format!("cannot use {}", glue.at),
                source: crate::connector::aws::describe(&e).into(),
                retryable: false,
            })?;
        let file_io = FileIOBuilder::new(storage)
            .with_props(storage_props)
            .build();
        Ok(Self {
            glue: Arc::new(glue),
            warehouse,
            file_io,
        })
    }

    /// floe's committer on this catalog.
    pub fn committer(&self) -> Arc<GlueCommitter> {
        self.glue.clone()
    }

    fn table(
        &self,
        ident: &TableIdent,
        location: String,
        metadata: TableMetadata,
    ) -> Result<Table> {
        Table::builder()
            .file_io(self.file_io.clone())
            .metadata_location(location)
            .metadata(metadata)
            .identifier(ident.clone())
            .runtime(iceberg::Runtime::try_current()?)
            .build()
    }

    /// The Glue table of `ident`, which must be an Iceberg table, and its metadata location.
    async fn glue_table(&self, ident: &TableIdent) -> Result<(aws_sdk_glue::types::Table, String)> {
        let Some(table) = self.glue.get(ident).await? else {
            return Err(Error::new(
                ErrorKind::TableNotFound,
                format!("table {ident} does not exist"),
            ));
        };
        let Some(location) = metadata_location(&table).map(str::to_string) else {
            return Err(Error::new(
                ErrorKind::DataInvalid,
                format!("{ident} in {} is not an Iceberg table", self.glue.at),
            ));
        };
        Ok((table, location))
    }

    async fn create_glue_table(
        &self,
        ident: &TableIdent,
        location: &str,
        metadata: &TableMetadata,
    ) -> Result<()> {
        let parameters = HashMap::from([
            (TABLE_TYPE.to_string(), ICEBERG.to_string()),
            (
                super::commit::glue::METADATA_LOCATION.to_string(),
                location.to_string(),
            ),
        ]);
        let input = super::commit::glue::table_input(ident.name(), metadata, parameters, None)?;
        let created = self
            .glue
            .client
            .create_table()
            .set_catalog_id(self.glue.catalog_id.clone())
            .database_name(database_of(ident.namespace())?)
            .table_input(input)
            .send()
            .await;
        match created {
            Ok(_) => Ok(()),
            Err(e) if code(&e) == Some("AlreadyExistsException") => Err(Error::new(
                ErrorKind::TableAlreadyExists,
                format!("table {ident} already exists"),
            )),
            Err(e) if is_not_found(&e) => Err(no_namespace(ident.namespace().as_ref())),
            Err(e) => Err(self.glue.error(&format!("creating table {ident}"), e)),
        }
    }

    async fn database(&self, namespace: &NamespaceIdent) -> Result<Option<Namespace>> {
        let got = self
            .glue
            .client
            .get_database()
            .set_catalog_id(self.glue.catalog_id.clone())
            .name(database_of(namespace)?)
            .send()
            .await;
        match got {
            Ok(out) => Ok(out.database.map(|db| {
                let mut props = db.parameters.clone().unwrap_or_default();
                if let Some(l) = db.location_uri {
                    props.insert("location".into(), l);
                }
                if let Some(d) = db.description {
                    props.insert("comment".into(), d);
                }
                Namespace::with_properties(namespace.clone(), props)
            })),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(self
                .glue
                .error(&format!("reading namespace {}", namespace.join(".")), e)),
        }
    }
}

/// A Glue database for `namespace` with `properties`: `location` and `comment` (as
/// iceberg-java and pyiceberg name them) become its location and description.
fn database_input(
    namespace: &NamespaceIdent,
    properties: &HashMap<String, String>,
) -> Result<DatabaseInput> {
    let mut input = DatabaseInput::builder().name(database_of(namespace)?);
    for (k, v) in properties {
        input = match k.as_str() {
            "location" | "location_uri" => input.location_uri(v),
            "comment" | "description" => input.description(v),
            _ => input.parameters(k, v),
        };
    }
    input.build().map_err(|e| {
        Error::new(
            ErrorKind::DataInvalid,
            format!("namespace {}: {e}", namespace.join(".")),
        )
    })
}

fn no_namespace(namespace: &[impl AsRef<str>]) -> Error {
    let name: Vec<&str> = namespace.iter().map(AsRef::as_ref).collect();
    Error::new(
        ErrorKind::NamespaceNotFound,
        format!("namespace {} does not exist", name.join(".")),
    )
}

/// Every item of a paged Glue listing: `fetch` is given the page token (none for the first
/// page) and gives the page's items and the next token.
async fn all_pages<T, F, Fut>(mut fetch: F) -> Result<Vec<T>>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: std::future::Future<Output = Result<(Vec<T>, Option<String>)>>,
{
    let mut out = Vec::new();
    let mut token = None;
    loop {
        let (items, next) = fetch(token).await?;
        out.extend(items);
        match next {
            Some(t) => token = Some(t),
            None => return Ok(out),
        }
    }
}

fn code<E: aws_sdk_glue::error::ProvideErrorMetadata>(
    e: &aws_sdk_glue::error::SdkError<E>,
) -> Option<&str> {
    use aws_sdk_glue::error::ProvideErrorMetadata;
    e.code()
}

#[async_trait]
impl Catalog for GlueCatalog {
    async fn list_namespaces(
        &self,
        parent: Option<&NamespaceIdent>,
    ) -> Result<Vec<NamespaceIdent>> {
        if parent.is_some() {
            return Ok(Vec::new());
        }
        all_pages(|token| async move {
            let page = self
                .glue
                .client
                .get_databases()
                .set_catalog_id(self.glue.catalog_id.clone())
                .set_next_token(token)
                .send()
                .await
                .map_err(|e| self.glue.error("listing namespaces", e))?;
            let names = page
                .database_list()
                .iter()
                .map(|db| NamespaceIdent::new(db.name().to_string()))
                .collect();
            Ok((names, page.next_token))
        })
        .await
    }

    async fn create_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> Result<Namespace> {
        let created = self
            .glue
            .client
            .create_database()
            .set_catalog_id(self.glue.catalog_id.clone())
            .database_input(database_input(namespace, &properties)?)
            .send()
            .await;
        match created {
            Ok(_) => Ok(Namespace::with_properties(namespace.clone(), properties)),
            Err(e) if code(&e) == Some("AlreadyExistsException") => Err(Error::new(
                ErrorKind::NamespaceAlreadyExists,
                format!("namespace {} already exists", namespace.join(".")),
            )),
            Err(e) => Err(self
                .glue
                .error(&format!("creating namespace {}", namespace.join(".")), e)),
        }
    }

    async fn get_namespace(&self, namespace: &NamespaceIdent) -> Result<Namespace> {
        self.database(namespace)
            .await?
            .ok_or_else(|| no_namespace(namespace.as_ref()))
    }

    async fn namespace_exists(&self, namespace: &NamespaceIdent) -> Result<bool> {
        Ok(self.database(namespace).await?.is_some())
    }

    async fn update_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> Result<()> {
        let updated = self
            .glue
            .client
            .update_database()
            .set_catalog_id(self.glue.catalog_id.clone())
            .name(database_of(namespace)?)
            .database_input(database_input(namespace, &properties)?)
            .send()
            .await;
        match updated {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Err(no_namespace(namespace.as_ref())),
            Err(e) => Err(self
                .glue
                .error(&format!("updating namespace {}", namespace.join(".")), e)),
        }
    }

    async fn drop_namespace(&self, namespace: &NamespaceIdent) -> Result<()> {
        let db = database_of(namespace)?;
        // Glue refuses to drop a database with tables of any kind in it; say so plainly.
        let tables = self
            .glue
            .client
            .get_tables()
            .set_catalog_id(self.glue.catalog_id.clone())
            .database_name(db)
            .max_results(1)
            .send()
            .await;
        match tables {
            Ok(t) if !t.table_list().is_empty() => {
                return Err(Error::new(
                    ErrorKind::DataInvalid,
                    format!("namespace {db} is not empty"),
                ));
            }
            Ok(_) => {}
            Err(e) if is_not_found(&e) => return Err(no_namespace(&[db])),
            Err(e) => return Err(self.glue.error(&format!("listing namespace {db}"), e)),
        }
        self.glue
            .client
            .delete_database()
            .set_catalog_id(self.glue.catalog_id.clone())
            .name(db)
            .send()
            .await
            .map_err(|e| self.glue.error(&format!("dropping namespace {db}"), e))?;
        Ok(())
    }

    async fn list_tables(&self, namespace: &NamespaceIdent) -> Result<Vec<TableIdent>> {
        let db = database_of(namespace)?;
        all_pages(|token| async move {
            let page = self
                .glue
                .client
                .get_tables()
                .set_catalog_id(self.glue.catalog_id.clone())
                .database_name(db)
                .set_next_token(token)
                .send()
                .await;
            let page = match page {
                Ok(p) => p,
                Err(e) if is_not_found(&e) => return Err(no_namespace(&[db])),
                Err(e) => return Err(self.glue.error(&format!("listing namespace {db}"), e)),
            };
            let tables = page
                .table_list()
                .iter()
                .filter(|t| metadata_location(t).is_some())
                .map(|t| TableIdent::new(namespace.clone(), t.name().to_string()))
                .collect();
            Ok((tables, page.next_token))
        })
        .await
    }

    async fn create_table(
        &self,
        namespace: &NamespaceIdent,
        mut creation: TableCreation,
    ) -> Result<Table> {
        let db = database_of(namespace)?.to_string();
        let ident = TableIdent::new(namespace.clone(), creation.name.clone());
        let location = match &creation.location {
            Some(l) => l.clone(),
            None => {
                let ns = self.get_namespace(namespace).await?;
                match ns.properties().get("location") {
                    Some(l) => format!("{}/{}", l.trim_end_matches('/'), creation.name),
                    None => format!("{}/{db}.db/{}", self.warehouse, creation.name),
                }
            }
        };
        creation.location = Some(location.clone());
        let metadata = TableMetadataBuilder::from_table_creation(creation)?
            .build()?
            .metadata;
        let metadata_location = MetadataLocation::new_with_metadata(location, &metadata);
        metadata.write_to(&self.file_io, &metadata_location).await?;
        let metadata_location = metadata_location.to_string();
        self.create_glue_table(&ident, &metadata_location, &metadata)
            .await?;
        self.table(&ident, metadata_location, metadata)
    }

    async fn load_table(&self, ident: &TableIdent) -> Result<Table> {
        let (_, location) = self.glue_table(ident).await?;
        let metadata = TableMetadata::read_from(&self.file_io, &location).await?;
        self.table(ident, location, metadata)
    }

    async fn drop_table(&self, ident: &TableIdent) -> Result<()> {
        let dropped = self
            .glue
            .client
            .delete_table()
            .set_catalog_id(self.glue.catalog_id.clone())
            .database_name(database_of(ident.namespace())?)
            .name(ident.name())
            .send()
            .await;
        match dropped {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Err(Error::new(
                ErrorKind::TableNotFound,
                format!("table {ident} does not exist"),
            )),
            Err(e) => Err(self.glue.error(&format!("dropping table {ident}"), e)),
        }
    }

    async fn purge_table(&self, ident: &TableIdent) -> Result<()> {
        let table = self.load_table(ident).await?;
        self.drop_table(ident).await?;
        iceberg::drop_table_data(&table).await
    }

    async fn table_exists(&self, ident: &TableIdent) -> Result<bool> {
        Ok(self
            .glue
            .get(ident)
            .await?
            .is_some_and(|t| metadata_location(&t).is_some()))
    }

    async fn rename_table(&self, src: &TableIdent, dest: &TableIdent) -> Result<()> {
        let (_, location) = self.glue_table(src).await?;
        let metadata = TableMetadata::read_from(&self.file_io, &location).await?;
        // Glue has no rename: the table is created under its new name, then the old dropped.
        self.create_glue_table(dest, &location, &metadata).await?;
        if let Err(e) = self.drop_table(src).await {
            let _ = self.drop_table(dest).await;
            return Err(e);
        }
        Ok(())
    }

    async fn register_table(&self, ident: &TableIdent, metadata_location: String) -> Result<Table> {
        let metadata = TableMetadata::read_from(&self.file_io, &metadata_location).await?;
        self.create_glue_table(ident, &metadata_location, &metadata)
            .await?;
        self.table(ident, metadata_location, metadata)
    }

    async fn update_table(&self, commit: TableCommit) -> Result<Table> {
        let ident = commit.identifier().clone();
        let (current, base_location) = self.glue_table(&ident).await?;
        let metadata = TableMetadata::read_from(&self.file_io, &base_location).await?;
        let base = self.table(&ident, base_location.clone(), metadata)?;
        let staged = commit.apply(base)?;
        let location = staged.metadata_location_result()?.to_string();
        staged
            .metadata()
            .write_to(&self.file_io, &MetadataLocation::from_str(&location)?)
            .await?;
        self.glue
            .swap(
                &ident,
                &current,
                &base_location,
                &location,
                staged.metadata(),
            )
            .await?;
        Ok(staged)
    }
}
