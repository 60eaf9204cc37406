//! Catalogs, namespaces and tables: `CREATE`/`DROP`/`SHOW CATALOG`, `SCHEMA`, `TABLE`, and
//! `DESCRIBE`.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::Statement as SQLStatement;
use iceberg::spec::{Schema as IcebergSchema, Transform};
use iceberg::table::Table;
use iceberg::{NamespaceIdent, TableCreation, TableIdent};

use super::columns::schema_from_columns;
use super::{
    CATALOG_COLUMNS, COLUMN_COLUMNS, Output, SCHEMA_COLUMNS, Session, TABLE_COLUMNS, string_rows,
    unregister,
};
use crate::catalog::LakeCatalogProvider;
use crate::catalog::jobs::JOBS_SCHEMA;
use crate::connector::aws::StaticCredentials;
use crate::error::{Error, Result};
use crate::lake::glue::GlueOptions;
use crate::lake::{CatalogConfig, CatalogKind, RestTimeouts, connect, table_exists};
use crate::schema::partition::partition_spec;
use crate::schema::{iceberg_schema, type_name, with_key};
use crate::sql::Options;
use crate::sql::statement::*;

impl Session {
    pub(super) async fn create_catalog(&self, s: CreateCatalog) -> Result<Output> {
        if self.ctx.catalog(&s.name).is_some() {
            if s.if_not_exists {
                return Ok(Output::Done("CREATE CATALOG".into()));
            }
            return Err(Error::AlreadyExists(format!(
                "catalog '{}' exists already (DROP CATALOG {} first, or add IF NOT EXISTS)",
                s.name, s.name
            )));
        }
        let options = Options::try_new(format!("CREATE CATALOG {}", s.name), s.options)?;
        let handle = connect(&s.name, catalog_config(options)?).await?;
        self.ctx.register_catalog(
            &s.name,
            Arc::new(LakeCatalogProvider::new(
                &s.name,
                handle.catalog.clone(),
                handle.committer.clone(),
            )),
        );
        if let Ok(mut c) = self.catalogs.write() {
            c.insert(s.name.clone(), handle);
        }
        Ok(Output::Done("CREATE CATALOG".into()))
    }

    pub(super) fn drop_catalog(&self, s: DropCatalog) -> Result<Output> {
        let removed = unregister(&self.catalogs, &s.name, s.if_exists, || {
            format!(
                "catalog '{}' does not exist or is not an Iceberg catalog",
                s.name
            )
        })?;
        if removed {
            self.catalog_list.deregister(&s.name);
        }
        Ok(Output::Done("DROP CATALOG".into()))
    }

    pub(super) fn show_catalogs(&self) -> Result<Output> {
        let catalogs = self.catalogs();
        let mut names = self.ctx.catalog_names();
        names.sort();
        let mut kind = Vec::new();
        let mut opts = Vec::new();
        for n in &names {
            match catalogs.get(n) {
                Some(h) => {
                    kind.push(format!("iceberg ({})", h.kind));
                    opts.push(
                        h.display_options
                            .iter()
                            .filter(|(k, _)| k.as_str() != "catalog-type")
                            .map(|(k, v)| format!("{k}={v}"))
                            .collect::<Vec<_>>()
                            .join(", "),
                    );
                }
                None => {
                    kind.push("datafusion (in-memory)".to_string());
                    opts.push(String::new());
                }
            }
        }
        string_rows(CATALOG_COLUMNS, vec![names, kind, opts])
    }

    pub(super) async fn create_schema(&self, s: CreateSchema) -> Result<Output> {
        let (catalog, ns) = self.namespace_name(&s.name)?;
        if !self.is_iceberg(&catalog) {
            return self.run_text(&s.to_string()).await;
        }
        let cat = self.iceberg(&catalog)?;
        let exists = || {
            Error::AlreadyExists(format!(
                "namespace '{catalog}.{}' exists already",
                ns.to_url_string()
            ))
        };
        if cat.namespace_exists(&ns).await? {
            if s.if_not_exists {
                return Ok(Output::Done("CREATE SCHEMA".into()));
            }
            return Err(exists());
        }
        // Another session may create it meanwhile (two scripts starting at once).
        match cat
            .create_namespace(&ns, s.options.into_iter().collect())
            .await
        {
            Ok(_) => Ok(Output::Done("CREATE SCHEMA".into())),
            Err(e) if e.kind() == iceberg::ErrorKind::NamespaceAlreadyExists => {
                match s.if_not_exists {
                    true => Ok(Output::Done("CREATE SCHEMA".into())),
                    false => Err(exists()),
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    pub(super) async fn drop_schema(&self, s: DropSchema) -> Result<Output> {
        let (catalog, ns) = self.namespace_name(&s.name)?;
        if !self.is_iceberg(&catalog) {
            return self.run_text(&s.to_string()).await;
        }
        let cat = self.iceberg(&catalog)?;
        if !cat.namespace_exists(&ns).await? {
            if s.if_exists {
                return Ok(Output::Done("DROP SCHEMA".into()));
            }
            return Err(Error::NotFound(format!(
                "namespace '{catalog}.{}' does not exist",
                ns.to_url_string()
            )));
        }
        let tables = cat.list_tables(&ns).await?;
        if !tables.is_empty() {
            return Err(Error::Plan(format!(
                "namespace '{catalog}.{}' still has {} table(s); drop them first",
                ns.to_url_string(),
                tables.len()
            )));
        }
        cat.drop_namespace(&ns).await?;
        Ok(Output::Done("DROP SCHEMA".into()))
    }

    pub(super) async fn show_schemas(&self, s: ShowSchemas) -> Result<Output> {
        let mut catalogs = Vec::new();
        let mut schemas = Vec::new();
        let names = match s.catalog {
            Some(c) => {
                if self.ctx.catalog(&c).is_none() {
                    self.iceberg(&c)?;
                }
                vec![c]
            }
            None => {
                let mut n = self.ctx.catalog_names();
                n.sort();
                n
            }
        };
        for c in names {
            let mut list = if self.is_iceberg(&c) {
                self.iceberg(&c)?
                    .list_namespaces(None)
                    .await?
                    .iter()
                    .map(|n| n.to_url_string())
                    .collect()
            } else {
                self.ctx
                    .catalog(&c)
                    .map(|p| p.schema_names())
                    .unwrap_or_default()
            };
            list.sort();
            for n in list {
                catalogs.push(c.clone());
                schemas.push(n);
            }
        }
        string_rows(SCHEMA_COLUMNS, vec![catalogs, schemas])
    }

    pub(super) async fn create_table(&self, s: CreateTable) -> Result<Output> {
        let name = self.table_name(&s.name)?;
        if !self.is_iceberg(&name.catalog) {
            if !s.partitioned_by.is_empty() || !s.options.is_empty() {
                return Err(Error::Plan(format!(
                    "PARTITIONED BY and WITH need an Iceberg table; '{}' is in DataFusion's \
                     in-memory catalog",
                    s.name
                )));
            }
            return self.run_text(&s.to_string()).await;
        }
        let cat = self.iceberg(&name.catalog)?;
        let ident = TableIdent::new(name.namespace.clone(), name.table.clone());
        if table_exists(cat.as_ref(), &ident).await? {
            if s.if_not_exists {
                return Ok(Output::Done("CREATE TABLE".into()));
            }
            return Err(Error::AlreadyExists(format!("table {name} exists already")));
        }
        if !cat.namespace_exists(&name.namespace).await? {
            return Err(Error::NotFound(format!(
                "namespace '{}.{}' does not exist (CREATE SCHEMA {}.{} creates it)",
                name.catalog,
                name.namespace.to_url_string(),
                name.catalog,
                name.namespace.to_url_string()
            )));
        }
        let schema: IcebergSchema = if !s.columns.is_empty() {
            schema_from_columns(&s.columns)?
        } else if let Some(q) = &s.query {
            let stmt = DFStatement::Statement(Box::new(SQLStatement::Query(q.clone())));
            let plan = self.ctx.state().statement_to_plan(stmt).await?;
            iceberg_schema(plan.schema().as_arrow(), true)?
        } else {
            return Err(Error::Internal(
                "CREATE TABLE without columns or query".into(),
            ));
        };
        let key: Vec<&str> = s.primary_key.iter().map(|k| k.value.as_str()).collect();
        let schema = with_key(schema, &key, false, &name).map_err(Error::Plan)?;
        let spec = partition_spec(&s.partitioned_by, &schema)?;
        let mut options = Options::try_new(format!("CREATE TABLE {}", s.name), s.options)?;
        let format_version = match options.take_choice("format-version", &["1", "2", "3"])? {
            Some("1") => iceberg::spec::FormatVersion::V1,
            Some("3") => iceberg::spec::FormatVersion::V3,
            _ => iceberg::spec::FormatVersion::V2,
        };
        let location = options.take_str("location");
        // Every other key is an Iceberg table property, kept verbatim.
        let properties = options.take_all();
        let creation = TableCreation::builder()
            .name(name.table.clone())
            .schema(schema)
            .partition_spec(spec)
            .properties(properties)
            .format_version(format_version)
            .location_opt(location)
            .build();
        match cat.create_table(&name.namespace, creation).await {
            Ok(_) => {}
            // Created by another session meanwhile.
            Err(e) if e.kind() == iceberg::ErrorKind::TableAlreadyExists => {
                return match s.if_not_exists {
                    true => Ok(Output::Done("CREATE TABLE".into())),
                    false => Err(Error::AlreadyExists(format!("table {name} exists already"))),
                };
            }
            Err(e) => return Err(e.into()),
        }
        if let Some(q) = s.query {
            let insert = format!("INSERT INTO {} {q}", s.name);
            if let Err(e) = self.run_text(&insert).await {
                // The statement is atomic: a failed CTAS leaves no table behind.
                let _ = cat.drop_table(&ident).await;
                return Err(e);
            }
        }
        Ok(Output::Done("CREATE TABLE".into()))
    }

    pub(super) async fn drop_table(&self, s: DropTable) -> Result<Output> {
        let name = self.table_name(&s.name)?;
        if !self.is_iceberg(&name.catalog) {
            return self.run_text(&s.to_string()).await;
        }
        let cat = self.iceberg(&name.catalog)?;
        let ident = TableIdent::new(name.namespace.clone(), name.table.clone());
        if !table_exists(cat.as_ref(), &ident).await? {
            if s.if_exists {
                return Ok(Output::Done("DROP TABLE".into()));
            }
            return Err(Error::NotFound(format!("table {name} does not exist")));
        }
        cat.drop_table(&ident).await?;
        Ok(Output::Done("DROP TABLE".into()))
    }

    pub(super) async fn show_tables(&self, s: ShowTables) -> Result<Output> {
        let mut cols: [Vec<String>; 3] = Default::default();
        let mut push = |c: &str, n: &str, t: String| {
            cols[0].push(c.to_string());
            cols[1].push(n.to_string());
            cols[2].push(t);
        };
        let scopes: Vec<(String, Option<String>)> = match &s.namespace {
            Some(n) => {
                let (c, ns) = self.namespace_name(n)?;
                vec![(c, Some(ns.to_url_string()))]
            }
            None => {
                let mut n = self.ctx.catalog_names();
                n.sort();
                n.into_iter().map(|c| (c, None)).collect()
            }
        };
        for (catalog, ns) in scopes {
            if self.is_iceberg(&catalog) {
                let cat = self.iceberg(&catalog)?;
                let namespaces = match ns {
                    Some(n) => {
                        let ident = NamespaceIdent::new(n.clone());
                        if !cat.namespace_exists(&ident).await? {
                            return Err(Error::NotFound(format!(
                                "namespace '{catalog}.{n}' does not exist"
                            )));
                        }
                        vec![ident]
                    }
                    None => {
                        let mut all = cat.list_namespaces(None).await?;
                        all.sort_by_key(|n| n.to_url_string());
                        all
                    }
                };
                for n in namespaces {
                    let mut tables = cat.list_tables(&n).await?;
                    tables.sort_by(|a, b| a.name().cmp(b.name()));
                    for t in tables {
                        push(&catalog, &n.to_url_string(), t.name().to_string());
                    }
                }
            } else if let Some(provider) = self.ctx.catalog(&catalog) {
                // System schemas are listed only when named (`SHOW TABLES IN floe`).
                let (schemas, system) = match ns {
                    Some(n) => (vec![n], true),
                    None => (provider.schema_names(), false),
                };
                for n in schemas {
                    if n == "information_schema" || (n == JOBS_SCHEMA && !system) {
                        continue;
                    }
                    if let Some(schema) = provider.schema(&n) {
                        let mut names = schema.table_names();
                        names.sort();
                        for t in names {
                            push(&catalog, &n, t);
                        }
                    }
                }
            } else {
                self.iceberg(&catalog)?;
            }
        }
        let [a, b, c] = cols;
        string_rows(TABLE_COLUMNS, vec![a, b, c])
    }

    pub(super) async fn describe(&self, s: Describe) -> Result<Output> {
        let name = self.table_name(&s.name)?;
        if !self.is_iceberg(&name.catalog) {
            return self.run_text(&format!("DESCRIBE {}", s.name)).await;
        }
        let cat = self.iceberg(&name.catalog)?;
        let ident = TableIdent::new(name.namespace.clone(), name.table.clone());
        let table = match cat.load_table(&ident).await {
            Ok(t) => t,
            Err(e) if e.kind() == iceberg::ErrorKind::TableNotFound => {
                return Err(Error::NotFound(format!("table {name} does not exist")));
            }
            Err(e) => return Err(e.into()),
        };
        describe_rows(&table)
    }
}

/// The catalog `CREATE CATALOG ... WITH (...)` describes:
///
/// ```text
/// 'type'          = 'iceberg'                   (required)
/// 'catalog-type'  = 'sql' | 'rest' | 'glue' | 'memory'   (default 'sql')
/// sql:    'uri' = 'sqlite:path/catalog.db' | 'postgres://...', 'warehouse' = path or URI,
///         'pool.max-connections'
/// rest:   'uri', 'warehouse', 'credential' (OAuth2 id:secret), 'token', 'oauth2-server-uri',
///         'scope', 'prefix', 'header.*' (HTTP headers)
/// glue:   'warehouse' (s3://bucket/path), 'glue.region', 'glue.endpoint', 'glue.catalog-id',
///         'glue.access-key-id' + 'glue.secret-access-key' (+ 'glue.session-token'); what is
///         not given comes from the AWS chain (environment, profile, ...)
/// memory: 'warehouse' (default: a folder under the system temp dir)
/// all:    's3.*' storage options (endpoint, region, access-key-id, secret-access-key,
///         path-style-access, ...), passed to the file IO
/// ```
fn catalog_config(mut options: Options) -> Result<CatalogConfig> {
    let ty = options.require_str("type")?;
    if !ty.eq_ignore_ascii_case("iceberg") {
        return Err(Error::Option(format!(
            "catalog type '{ty}' is not supported: floe has 'type' = 'iceberg' catalogs"
        )));
    }
    // Every other option is read before any is found missing: a misspelled key is named as
    // unknown together with the key it misspells.
    let kind = options
        .take_choice("catalog-type", &["sql", "rest", "glue", "memory"])?
        .unwrap_or("sql");
    let storage = options
        .take_prefixed("s3.")
        .into_iter()
        .map(|(k, v)| (format!("s3.{k}"), v))
        .collect();
    let kind = match kind {
        "sql" => {
            let uri = options.take_required("uri");
            let warehouse = options.take_required("warehouse");
            let max_connections = options.take_positive("pool.max-connections")?;
            options.finish()?;
            CatalogKind::Sql {
                uri: uri.unwrap_or_default(),
                warehouse: warehouse.unwrap_or_default(),
                max_connections,
            }
        }
        "rest" => {
            let mut props = BTreeMap::new();
            for key in [
                "warehouse",
                "credential",
                "token",
                "oauth2-server-uri",
                "scope",
                "prefix",
            ] {
                if let Some(v) = options.take_str(key) {
                    props.insert(key.to_string(), v);
                }
            }
            // Extra HTTP headers, as iceberg-catalog-rest takes them.
            for (k, v) in options.take_prefixed("header.") {
                props.insert(format!("header.{k}"), v);
            }
            let uri = options.take_required("uri");
            let defaults = RestTimeouts::default();
            let timeouts = RestTimeouts {
                connect: options
                    .take_duration("rest.connect-timeout")?
                    .unwrap_or(defaults.connect),
                request: options
                    .take_duration("rest.request-timeout")?
                    .unwrap_or(defaults.request),
            };
            options.finish()?;
            props.insert("uri".to_string(), uri.unwrap_or_default());
            CatalogKind::Rest { props, timeouts }
        }
        "glue" => {
            let warehouse = options.take_required("warehouse");
            let region = options.take_str("glue.region");
            let endpoint = options.take_str("glue.endpoint");
            let catalog_id = options.take_str("glue.catalog-id");
            let credentials = StaticCredentials::from_options(&mut options, "glue.")?;
            options.finish()?;
            CatalogKind::Glue(GlueOptions {
                warehouse: warehouse.unwrap_or_default(),
                region,
                endpoint,
                catalog_id,
                credentials,
            })
        }
        _ => {
            let warehouse = options.take_str("warehouse");
            options.finish()?;
            CatalogKind::Memory { warehouse }
        }
    };
    Ok(CatalogConfig { kind, storage })
}

/// `DESCRIBE` output: one row per column, then the partition spec and table facts, in the
/// three columns DataFusion's own DESCRIBE has.
fn describe_rows(table: &Table) -> Result<Output> {
    let md = table.metadata();
    let schema = md.current_schema();
    let mut cols: [Vec<String>; 3] = Default::default();
    let mut push = |a: String, b: String, c: String| {
        cols[0].push(a);
        cols[1].push(b);
        cols[2].push(c);
    };
    for f in schema.as_struct().fields() {
        push(
            f.name.clone(),
            type_name(&f.field_type),
            if f.required { "NO" } else { "YES" }.to_string(),
        );
    }
    let spec = md.default_partition_spec();
    push(String::new(), String::new(), String::new());
    push("# Partitioning".into(), String::new(), String::new());
    if spec.is_unpartitioned() {
        push("Not partitioned".into(), String::new(), String::new());
    }
    for (i, f) in spec.fields().iter().enumerate() {
        let source = schema
            .field_by_id(f.source_id)
            .map(|s| s.name.clone())
            .unwrap_or_else(|| format!("<field {}>", f.source_id));
        let expr = match f.transform {
            Transform::Identity => source,
            Transform::Year => format!("years({source})"),
            Transform::Month => format!("months({source})"),
            Transform::Day => format!("days({source})"),
            Transform::Hour => format!("hours({source})"),
            Transform::Bucket(n) => format!("bucket({n}, {source})"),
            Transform::Truncate(n) => format!("truncate({n}, {source})"),
            other => format!("{other}({source})"),
        };
        push(format!("Part {i}"), expr, f.name.clone());
    }
    push(String::new(), String::new(), String::new());
    push("# Table".into(), String::new(), String::new());
    push("Location".into(), md.location().to_string(), String::new());
    let key = crate::lake::upsert::key_names(schema);
    push(
        "Primary key".into(),
        if key.is_empty() {
            "none".into()
        } else {
            key.join(", ")
        },
        String::new(),
    );
    push(
        "Format version".into(),
        (md.format_version() as u8).to_string(),
        String::new(),
    );
    let (snap, when) = match md.current_snapshot() {
        Some(s) => (
            s.snapshot_id().to_string(),
            s.timestamp().map(|t| t.to_rfc3339()).unwrap_or_default(),
        ),
        None => ("none".into(), String::new()),
    };
    push("Current snapshot".into(), snap, when);
    push(
        "Snapshots".into(),
        md.snapshots().len().to_string(),
        String::new(),
    );
    let [a, b, c] = cols;
    string_rows(COLUMN_COLUMNS, vec![a, b, c])
}
