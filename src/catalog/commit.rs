//! Commits iceberg-rust has no action for: a new schema and/or partition spec together with
//! the snapshot that first uses them, in one atomic catalog update.
//!
//! ```text
//! base metadata --AddSchema/SetCurrentSchema, AddSpec/SetDefaultSpec--> staged metadata
//!     (data files are written against the staged schema and spec)
//! manifest of the new files + the base snapshot's manifests -> manifest list -> snapshot
//! base --[schema, spec, snapshot, main ref]--> new metadata file
//! SQL catalog: UPDATE iceberg_tables SET metadata_location = new WHERE metadata_location = base
//!              (0 rows: someone else committed first -> a retryable conflict)
//! ```
//!
//! A crash before the compare-and-set leaves the table as it was (the new metadata file is an
//! orphan), so a schema is never visible without the snapshot that uses it.

use std::collections::HashMap;
use std::str::FromStr;

use iceberg::spec::{
    DataFile, DataFileFormat, FormatVersion, MAIN_BRANCH, ManifestListWriter,
    ManifestWriterBuilder, Operation, Schema, Snapshot, SnapshotReference, SnapshotRetention,
    SnapshotSummaryCollector, Summary, TableMetadata, UnboundPartitionSpec,
};
use iceberg::table::Table;
use iceberg::{MetadataLocation, TableUpdate};
use sqlx::AnyPool;

use crate::error::{Error, Result};

/// What to commit.
#[derive(Debug, Default)]
pub struct EvolvingAppend {
    /// The new current schema (with field ids assigned), if the schema changes.
    pub schema: Option<Schema>,
    /// The new default partition spec, if it changes.
    pub spec: Option<UnboundPartitionSpec>,
    /// Data files, per id of the partition spec they were written with (the staged table's
    /// default spec, or an older one of the table).
    pub files: Vec<(i32, Vec<DataFile>)>,
    /// Extra snapshot summary properties.
    pub summary: HashMap<String, String>,
}

/// `base` with the schema and spec changes of `append` applied: the table the new data
/// files must be written against.
pub fn staged(
    base: &Table,
    schema: Option<Schema>,
    spec: Option<UnboundPartitionSpec>,
) -> Result<Table> {
    if schema.is_none() && spec.is_none() {
        // (A table built anew costs a metadata cache of its own, a few KiB.)
        return Ok(base.clone());
    }
    let metadata = evolve(base, schema, spec)?;
    let mut builder = Table::builder()
        .metadata(metadata)
        .identifier(base.identifier().clone())
        .file_io(base.file_io().clone())
        .runtime(iceberg::Runtime::try_current()?);
    if let Some(loc) = base.metadata_location() {
        builder = builder.metadata_location(loc.to_string());
    }
    Ok(builder.build()?)
}

fn schema_updates(schema: Option<Schema>, spec: Option<UnboundPartitionSpec>) -> Vec<TableUpdate> {
    let mut updates = Vec::new();
    if let Some(schema) = schema {
        updates.push(TableUpdate::AddSchema { schema });
        updates.push(TableUpdate::SetCurrentSchema { schema_id: -1 });
    }
    if let Some(spec) = spec {
        updates.push(TableUpdate::AddSpec { spec });
        updates.push(TableUpdate::SetDefaultSpec { spec_id: -1 });
    }
    updates
}

fn apply(base: &Table, updates: Vec<TableUpdate>) -> Result<TableMetadata> {
    let mut builder = base
        .metadata()
        .clone()
        .into_builder(base.metadata_location().map(str::to_string));
    for u in updates {
        builder = u.apply(builder)?;
    }
    Ok(builder.build()?.metadata)
}

fn evolve(
    base: &Table,
    schema: Option<Schema>,
    spec: Option<UnboundPartitionSpec>,
) -> Result<TableMetadata> {
    apply(base, schema_updates(schema, spec))
}

/// The summary of a snapshot adding `files` after `base`'s current one: Iceberg's standard
/// added-* and total-* keys, and `extra`.
fn summary(
    staged: &TableMetadata,
    base: &TableMetadata,
    files: &[(i32, Vec<DataFile>)],
    extra: HashMap<String, String>,
) -> Summary {
    let mut collector = SnapshotSummaryCollector::default();
    for (spec_id, group) in files {
        let spec = staged
            .partition_spec_by_id(*spec_id)
            .cloned()
            .unwrap_or_else(|| staged.default_partition_spec().clone());
        for f in group {
            collector.add_file(f, staged.current_schema().clone(), spec.clone());
        }
    }
    let mut props = extra;
    props.extend(collector.build());
    let previous = base
        .current_snapshot()
        .map(|s| s.summary().additional_properties.clone())
        .unwrap_or_default();
    let prev = |k: &str| {
        previous
            .get(k)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let added = |k: &str, props: &HashMap<String, String>| {
        props
            .get(k)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    for (total, add) in [
        ("total-records", "added-records"),
        ("total-data-files", "added-data-files"),
        ("total-files-size", "added-files-size"),
    ] {
        let v = prev(total) + added(add, &props);
        props.insert(total.to_string(), v.to_string());
    }
    for total in [
        "total-delete-files",
        "total-position-deletes",
        "total-equality-deletes",
    ] {
        props.insert(total.to_string(), prev(total).to_string());
    }
    Summary {
        operation: Operation::Append,
        additional_properties: props,
    }
}

/// A commit ready to send: the updates to `base` and the metadata they give.
#[derive(Debug)]
pub struct Prepared {
    pub updates: Vec<TableUpdate>,
    pub metadata: TableMetadata,
}

/// Build the new metadata: `base` plus the schema/spec changes plus a snapshot appending
/// `append.files`. Writes the manifest and manifest list; commits nothing.
pub async fn prepare(base: &Table, append: EvolvingAppend) -> Result<Prepared> {
    if append.files.iter().all(|(_, f)| f.is_empty()) {
        return Err(Error::Internal("an evolving append without files".into()));
    }
    let md = base.metadata();
    if md.format_version() == FormatVersion::V1 {
        return Err(Error::Unsupported(format!(
            "schema or partition evolution of format-version 1 table {}",
            base.identifier()
        )));
    }
    let updates = schema_updates(append.schema, append.spec);
    let staged = apply(base, updates.clone())?;
    let snapshot_id = loop {
        let (a, b) = uuid::Uuid::new_v4().as_u64_pair();
        let id = ((a ^ b) >> 1) as i64;
        if md.snapshot_by_id(id).is_none() {
            break id;
        }
    };
    let commit_id = uuid::Uuid::new_v4();
    let io = base.file_io();
    let meta_dir = format!("{}/metadata", md.location());
    let summary = summary(&staged, md, &append.files, append.summary);
    let mut written = Vec::new();
    for (n, (spec_id, files)) in append.files.into_iter().enumerate() {
        if files.is_empty() {
            continue;
        }
        let spec = staged.partition_spec_by_id(spec_id).ok_or_else(|| {
            Error::Internal(format!(
                "table {} has no partition spec {spec_id}",
                base.identifier()
            ))
        })?;
        let path = format!("{meta_dir}/{commit_id}-m{n}.{}", DataFileFormat::Avro);
        let mut writer = ManifestWriterBuilder::new(
            io.new_output(&path)?,
            Some(snapshot_id),
            staged.current_schema().clone(),
            spec.as_ref().clone(),
        )
        .build_v2_data();
        for f in files {
            // A negative sequence number: the entry inherits the snapshot's (format v2+).
            writer.add_file(f, -1)?;
        }
        written.push(writer.write_manifest_file().await?);
    }
    let mut manifests = Vec::new();
    if let Some(current) = md.current_snapshot() {
        let list = base.manifest_list_reader(current).load().await?;
        manifests.extend(list.entries().iter().cloned());
    }
    manifests.extend(written);
    let sequence_number = md.next_sequence_number();
    let list_path = format!(
        "{meta_dir}/snap-{snapshot_id}-0-{commit_id}.{}",
        DataFileFormat::Avro
    );
    let mut list = ManifestListWriter::v2(
        io.new_output(&list_path)?.writer().await?,
        snapshot_id,
        md.current_snapshot_id(),
        sequence_number,
    );
    list.add_manifests(manifests.into_iter())?;
    list.close().await?;
    let snapshot = Snapshot::builder()
        .with_snapshot_id(snapshot_id)
        .with_parent_snapshot_id(md.current_snapshot_id())
        .with_sequence_number(sequence_number)
        .with_timestamp_ms(chrono::Utc::now().timestamp_millis())
        .with_manifest_list(list_path)
        .with_summary(summary)
        .with_schema_id(staged.current_schema_id())
        .build();
    let mut all = updates;
    all.push(TableUpdate::AddSnapshot { snapshot });
    all.push(TableUpdate::SetSnapshotRef {
        ref_name: MAIN_BRANCH.to_string(),
        reference: SnapshotReference::new(snapshot_id, SnapshotRetention::branch(None, None, None)),
    });
    let metadata = apply(base, all.clone())?;
    Ok(Prepared {
        updates: all,
        metadata,
    })
}

/// floe's commit path to a catalog, by catalog type.
#[derive(Debug)]
pub enum Committer {
    Sql(SqlCommitter),
    Rest(RestCommitter),
}

impl Committer {
    /// Make `prepared` the table's state, unless `base` is no longer current (a retryable
    /// conflict).
    pub async fn commit(&self, base: &Table, prepared: Prepared) -> Result<Table> {
        match self {
            Committer::Sql(c) => c.commit(base, prepared.metadata).await,
            Committer::Rest(c) => c.commit(base, prepared.updates).await,
        }
    }
}

/// Commits to an Iceberg SQL catalog by compare-and-set on its `iceberg_tables` row.
#[derive(Debug, Clone)]
pub struct SqlCommitter {
    pool: AnyPool,
    catalog_name: String,
    dollar_params: bool,
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
        })
    }

    /// Write `metadata` as the next version of `base` and make it current, unless `base`
    /// is no longer current (a retryable conflict).
    pub async fn commit(&self, base: &Table, metadata: TableMetadata) -> Result<Table> {
        let base_location = base.metadata_location_result()?.to_string();
        let location = MetadataLocation::from_str(&base_location)?.with_next_version();
        metadata.write_to(base.file_io(), &location).await?;
        let location = location.to_string();
        let ident = base.identifier();
        let p = |i: usize| {
            if self.dollar_params {
                format!("${i}")
            } else {
                "?".to_string()
            }
        };
        let sql = format!(
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
        let done = sqlx::query(&sql)
            .bind(location.clone())
            .bind(base_location.clone())
            .bind(self.catalog_name.clone())
            .bind(ident.namespace().join("."))
            .bind(ident.name().to_string())
            .bind(base_location)
            .execute(&self.pool)
            .await
            .map_err(|e| Error::catalog_database(format!("committing {ident}"), e))?;
        if done.rows_affected() == 0 {
            return Err(iceberg::Error::new(
                iceberg::ErrorKind::CatalogCommitConflicts,
                format!("table {ident} changed while floe was committing to it"),
            )
            .with_retryable(true)
            .into());
        }
        Ok(Table::builder()
            .metadata(metadata)
            .metadata_location(location)
            .identifier(ident.clone())
            .file_io(base.file_io().clone())
            .runtime(iceberg::Runtime::try_current()?)
            .build()?)
    }
}

/// Commits to an Iceberg REST catalog: `POST /v1/{prefix}/namespaces/{ns}/tables/{table}`
/// with the updates and requirements that make the server refuse (409) if the table moved on
/// since `base`.
#[derive(Debug)]
pub struct RestCommitter {
    client: reqwest::Client,
    uri: String,
    prefix: Option<String>,
    /// A fixed token, or one obtained from the OAuth2 client credentials (and renewed).
    auth: RestAuth,
}

#[derive(Debug)]
enum RestAuth {
    None,
    Token(String),
    Credential {
        token_uri: String,
        id: String,
        secret: String,
        scope: String,
        token: tokio::sync::Mutex<Option<String>>,
    },
}

impl RestCommitter {
    /// A committer for the REST catalog at `uri` with the catalog's properties.
    pub async fn connect(props: &HashMap<String, String>) -> Result<Self> {
        let uri = props
            .get("uri")
            .ok_or_else(|| Error::Internal("REST catalog without a uri".into()))?
            .trim_end_matches('/')
            .to_string();
        let client = reqwest::Client::builder()
            .default_headers(rest_headers(props)?)
            .build()
            .map_err(|e| rest_error("building an HTTP client", e))?;
        let auth = if let Some(token) = props.get("token") {
            RestAuth::Token(token.clone())
        } else if let Some(credential) = props.get("credential") {
            let (id, secret) = credential
                .split_once(':')
                .unwrap_or(("", credential.as_str()));
            RestAuth::Credential {
                token_uri: props
                    .get("oauth2-server-uri")
                    .cloned()
                    .unwrap_or_else(|| format!("{uri}/v1/oauth/tokens")),
                id: id.to_string(),
                secret: secret.to_string(),
                scope: props
                    .get("scope")
                    .cloned()
                    .unwrap_or_else(|| "catalog".to_string()),
                token: tokio::sync::Mutex::new(None),
            }
        } else {
            RestAuth::None
        };
        let mut committer = Self {
            client,
            uri,
            prefix: props.get("prefix").cloned(),
            auth,
        };
        if committer.prefix.is_none() {
            committer.prefix = committer.config_prefix(props.get("warehouse")).await?;
        }
        Ok(committer)
    }

    async fn token(&self, renew: bool) -> Result<Option<String>> {
        match &self.auth {
            RestAuth::None => Ok(None),
            RestAuth::Token(t) => Ok(Some(t.clone())),
            RestAuth::Credential {
                token_uri,
                id,
                secret,
                scope,
                token,
            } => {
                let mut cached = token.lock().await;
                if !renew && let Some(t) = cached.as_ref() {
                    return Ok(Some(t.clone()));
                }
                let resp = self
                    .client
                    .post(token_uri)
                    .form(&[
                        ("grant_type", "client_credentials"),
                        ("client_id", id),
                        ("client_secret", secret),
                        ("scope", scope),
                    ])
                    .send()
                    .await
                    .map_err(|e| rest_error("getting an OAuth2 token", e))?;
                let status = resp.status();
                let body: serde_json::Value = resp
                    .json()
                    .await
                    .map_err(|e| rest_error("reading the OAuth2 token", e))?;
                let t = body
                    .get("access_token")
                    .and_then(|v| v.as_str())
                    .ok_or_else(|| {
                        Error::Option(format!(
                            "the REST catalog refused the credential ({status}): {body}"
                        ))
                    })?
                    .to_string();
                *cached = Some(t.clone());
                Ok(Some(t))
            }
        }
    }

    async fn config_prefix(&self, warehouse: Option<&String>) -> Result<Option<String>> {
        let mut req = self.client.get(format!("{}/v1/config", self.uri));
        if let Some(w) = warehouse {
            req = req.query(&[("warehouse", w)]);
        }
        if let Some(t) = self.token(false).await? {
            req = req.bearer_auth(t);
        }
        let body: serde_json::Value = req
            .send()
            .await
            .map_err(|e| rest_error("reading the REST catalog's config", e))?
            .json()
            .await
            .map_err(|e| rest_error("reading the REST catalog's config", e))?;
        Ok(["overrides", "defaults"]
            .iter()
            .find_map(|k| body.get(k)?.get("prefix")?.as_str().map(str::to_string)))
    }

    /// Send `updates` to the table of `base`, requiring it to be as `base` has it.
    pub async fn commit(&self, base: &Table, updates: Vec<TableUpdate>) -> Result<Table> {
        use iceberg::TableRequirement as R;
        let md = base.metadata();
        let ident = base.identifier();
        let requirements = vec![
            R::UuidMatch { uuid: md.uuid() },
            R::RefSnapshotIdMatch {
                r#ref: MAIN_BRANCH.to_string(),
                snapshot_id: md.current_snapshot_id(),
            },
            R::CurrentSchemaIdMatch {
                current_schema_id: md.current_schema_id(),
            },
            R::LastAssignedFieldIdMatch {
                last_assigned_field_id: md.last_column_id(),
            },
            R::DefaultSpecIdMatch {
                default_spec_id: md.default_partition_spec_id(),
            },
            R::LastAssignedPartitionIdMatch {
                last_assigned_partition_id: md.last_partition_id(),
            },
        ];
        let request = iceberg_catalog_rest::CommitTableRequest {
            identifier: Some(ident.clone()),
            requirements,
            updates,
        };
        let url = format!(
            "{}/v1/{}namespaces/{}/tables/{}",
            self.uri,
            self.prefix
                .as_ref()
                .map(|p| format!("{p}/"))
                .unwrap_or_default(),
            ident.namespace().to_url_string(),
            ident.name()
        );
        let mut renewed = false;
        loop {
            let mut req = self.client.post(&url).json(&request);
            if let Some(t) = self.token(renewed).await? {
                req = req.bearer_auth(t);
            }
            let resp = req
                .send()
                .await
                .map_err(|e| rest_error(&format!("committing {ident}"), e))?;
            let status = resp.status();
            if status == reqwest::StatusCode::UNAUTHORIZED && !renewed {
                // Tokens expire; get a new one once.
                renewed = true;
                continue;
            }
            if status == reqwest::StatusCode::CONFLICT {
                return Err(iceberg::Error::new(
                    iceberg::ErrorKind::CatalogCommitConflicts,
                    format!("table {ident} changed while floe was committing to it"),
                )
                .with_retryable(true)
                .into());
            }
            if !status.is_success() {
                let text = resp.text().await.unwrap_or_default();
                return Err(Error::Iceberg(iceberg::Error::new(
                    iceberg::ErrorKind::Unexpected,
                    format!("the REST catalog refused the commit to {ident} ({status}): {text}"),
                )));
            }
            let body: iceberg_catalog_rest::CommitTableResponse = resp
                .json()
                .await
                .map_err(|e| rest_error(&format!("reading the commit of {ident}"), e))?;
            return Ok(Table::builder()
                .metadata(body.metadata)
                .metadata_location(body.metadata_location)
                .identifier(ident.clone())
                .file_io(base.file_io().clone())
                .runtime(iceberg::Runtime::try_current()?)
                .build()?);
        }
    }
}

/// A failed HTTP exchange with the REST catalog: external, so jobs retry; retryable when
/// the server could not be reached or did not answer in time.
fn rest_error(what: &str, e: reqwest::Error) -> Error {
    let retryable = e.is_connect() || e.is_timeout() || e.is_request() || e.is_body();
    Error::Catalog {
        context: format!("REST catalog: {what}"),
        source: Box::new(e),
        retryable,
    }
}

/// The `header.<name>` catalog properties as HTTP headers, sent with every request (as
/// iceberg-catalog-rest does with the same properties).
fn rest_headers(props: &HashMap<String, String>) -> Result<reqwest::header::HeaderMap> {
    use reqwest::header::{HeaderName, HeaderValue};
    let mut headers = reqwest::header::HeaderMap::new();
    for (key, value) in props {
        let Some(name) = key.strip_prefix("header.") else {
            continue;
        };
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|e| Error::Option(format!("'{key}' does not name an HTTP header: {e}")))?;
        let value = HeaderValue::from_str(value)
            .map_err(|e| Error::Option(format!("'{key}' is not a valid header value: {e}")))?;
        headers.insert(name, value);
    }
    Ok(headers)
}
