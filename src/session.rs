//! A floe session: one DataFusion [`SessionContext`] with the Iceberg catalogs the user
//! registered, and the one `match` that plans every statement.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use datafusion::arrow::array::{RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::TableProvider;
use datafusion::catalog::{CatalogProvider, CatalogProviderList};
use datafusion::datasource::MemTable;
use datafusion::execution::context::SessionContext;
use datafusion::execution::session_state::{SessionState, SessionStateBuilder};
use datafusion::prelude::SessionConfig;
use datafusion::sql::parser::{DFParserBuilder, Statement as DFStatement};
use datafusion::sql::sqlparser::ast::{Ident, ObjectName, Set, Statement as SQLStatement};
use iceberg::spec::{Schema as IcebergSchema, Transform};
use iceberg::table::Table;
use iceberg::{Catalog, NamespaceIdent, TableCreation, TableIdent};

use crate::catalog::LakeCatalogProvider;
use crate::catalog::schema::{arrow_schema_from_columns, schema_from_columns};
use crate::catalog::table::LakeTable;
use crate::checkpoint::StateStore;
use crate::config::{FloeOptions, qualify_setting};
use crate::connector::{SourceDef, SourceRef};
use crate::error::{Error, Result};
use crate::lake::{CatalogConfig, CatalogHandle, CatalogKind, Committer, connect, table_exists};
use crate::schema::infer::{conform_preview, merge_schemas};
use crate::schema::partition::partition_spec;
use crate::schema::{iceberg_schema, type_name};
use crate::sink::route::RouteOptions;
use crate::sql::parser::name_parts;
use crate::sql::statement::*;
use crate::sql::{Options, Statement, parse_sql};
use crate::stream::job::Destination;
use crate::stream::source_table::preview;
use crate::stream::watermark::{WatermarkDef, WatermarkTracker};
use crate::stream::{ContinuousQuery, Job, JobStatus, Jobs, QueryPlanner, SourceTable, Target};
use datafusion::datasource::source_as_provider;
use datafusion::logical_expr::LogicalPlan;

/// What a statement produced.
#[derive(Debug)]
pub enum Output {
    /// Rows (possibly none) with their schema.
    Rows(SchemaRef, Vec<RecordBatch>),
    /// A statement with no rows; the text says what it did (`CREATE CATALOG`).
    Done(String),
}

impl Output {
    /// The number of rows in the output.
    pub fn row_count(&self) -> usize {
        match self {
            Output::Rows(_, b) => b.iter().map(|b| b.num_rows()).sum(),
            Output::Done(_) => 0,
        }
    }
}

/// A session: catalogs, settings, and the statements run in it.
pub struct Session {
    ctx: SessionContext,
    catalog_list: Arc<SessionCatalogs>,
    catalogs: RwLock<BTreeMap<String, CatalogHandle>>,
    sources: RwLock<BTreeMap<String, SourceRef>>,
    jobs: Jobs,
}

/// The session's DataFusion catalogs; unlike DataFusion's own list, one can be removed
/// (`DROP CATALOG`).
#[derive(Debug, Default)]
struct SessionCatalogs {
    catalogs: RwLock<BTreeMap<String, Arc<dyn CatalogProvider>>>,
}

impl SessionCatalogs {
    fn deregister(&self, name: &str) -> Option<Arc<dyn CatalogProvider>> {
        self.catalogs.write().ok()?.remove(name)
    }
}

impl CatalogProviderList for SessionCatalogs {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn register_catalog(
        &self,
        name: String,
        catalog: Arc<dyn CatalogProvider>,
    ) -> Option<Arc<dyn CatalogProvider>> {
        self.catalogs.write().ok()?.insert(name, catalog)
    }

    fn catalog_names(&self) -> Vec<String> {
        self.catalogs
            .read()
            .map(|c| c.keys().cloned().collect())
            .unwrap_or_default()
    }

    fn catalog(&self, name: &str) -> Option<Arc<dyn CatalogProvider>> {
        self.catalogs.read().ok()?.get(name).cloned()
    }
}

/// A table's name, resolved to its catalog, namespace and name.
struct TableName {
    catalog: String,
    namespace: NamespaceIdent,
    table: String,
}

impl std::fmt::Display for TableName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}.{}.{}",
            self.catalog,
            self.namespace.to_url_string(),
            self.table
        )
    }
}

impl Default for Session {
    fn default() -> Self {
        Self::new()
    }
}

impl Session {
    /// A new session with no catalogs but DataFusion's in-memory default.
    pub fn new() -> Self {
        let config = SessionConfig::new()
            .with_information_schema(true)
            .with_create_default_catalog_and_schema(true)
            .with_option_extension(FloeOptions::default());
        let catalog_list = Arc::new(SessionCatalogs::default());
        let state = SessionStateBuilder::new()
            .with_config(config)
            .with_catalog_list(catalog_list.clone())
            .with_default_features()
            .build();
        Self {
            ctx: SessionContext::new_with_state(state),
            catalog_list,
            catalogs: RwLock::new(BTreeMap::new()),
            sources: RwLock::new(BTreeMap::new()),
            jobs: Jobs::default(),
        }
    }

    /// The DataFusion context behind the session.
    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }

    /// Parse and run every statement in `sql`, in order, stopping at the first error.
    pub async fn sql(&self, sql: &str) -> Result<Vec<Output>> {
        let mut out = Vec::new();
        for stmt in parse_sql(sql)? {
            out.push(self.execute(stmt).await?);
        }
        Ok(out)
    }

    /// The Iceberg catalogs registered, by name.
    pub fn catalogs(&self) -> BTreeMap<String, CatalogHandle> {
        self.catalogs.read().map(|c| c.clone()).unwrap_or_default()
    }

    fn iceberg(&self, catalog: &str) -> Result<Arc<dyn Catalog>> {
        if let Some(h) = self
            .catalogs
            .read()
            .ok()
            .and_then(|c| c.get(catalog).cloned())
        {
            return Ok(h.catalog);
        }
        if self.ctx.catalog(catalog).is_some() {
            return Err(Error::Plan(format!(
                "catalog '{catalog}' is DataFusion's in-memory catalog, not an Iceberg catalog"
            )));
        }
        Err(Error::NotFound(format!(
            "catalog '{catalog}' does not exist (SHOW CATALOGS lists them; CREATE CATALOG \
             registers one)"
        )))
    }

    fn is_iceberg(&self, catalog: &str) -> bool {
        self.catalogs
            .read()
            .map(|c| c.contains_key(catalog))
            .unwrap_or(false)
    }

    fn defaults(&self) -> (String, String) {
        let state = self.ctx.state();
        let opts = &state.config().options().catalog;
        (opts.default_catalog.clone(), opts.default_schema.clone())
    }

    /// `[catalog.][namespace.]table` with the session's defaults filled in.
    fn table_name(&self, name: &ObjectName) -> Result<TableName> {
        let parts = name_parts(name)?;
        let (dc, ds) = self.defaults();
        let (catalog, ns, table) = match parts.as_slice() {
            [t] => (dc, ds, t.clone()),
            [n, t] => (dc, n.clone(), t.clone()),
            [c, n, t] => (c.clone(), n.clone(), t.clone()),
            _ => {
                return Err(Error::Plan(format!(
                    "'{name}' has too many parts: write catalog.namespace.table"
                )));
            }
        };
        Ok(TableName {
            catalog,
            namespace: NamespaceIdent::new(ns),
            table,
        })
    }

    /// `[catalog.]namespace` with the default catalog filled in.
    fn namespace_name(&self, name: &ObjectName) -> Result<(String, NamespaceIdent)> {
        let parts = name_parts(name)?;
        let (dc, _) = self.defaults();
        match parts.as_slice() {
            [n] => Ok((dc, NamespaceIdent::new(n.clone()))),
            [c, n] => Ok((c.clone(), NamespaceIdent::new(n.clone()))),
            _ => Err(Error::Plan(format!(
                "'{name}' is not a namespace name: write catalog.namespace"
            ))),
        }
    }

    /// Run one statement.
    pub async fn execute(&self, stmt: Statement) -> Result<Output> {
        match stmt {
            Statement::DataFusion(s) => self.run_datafusion(*s).await,
            Statement::CreateCatalog(s) => self.create_catalog(s).await,
            Statement::DropCatalog(s) => self.drop_catalog(s),
            Statement::ShowCatalogs => self.show_catalogs(),
            Statement::CreateSchema(s) => self.create_schema(s).await,
            Statement::DropSchema(s) => self.drop_schema(s).await,
            Statement::ShowSchemas(s) => self.show_schemas(s).await,
            Statement::CreateTable(s) => self.create_table(*s).await,
            Statement::DropTable(s) => self.drop_table(s).await,
            Statement::ShowTables(s) => self.show_tables(s).await,
            Statement::Describe(s) => self.describe(s).await,
            Statement::CreateSource(s) => self.create_source(*s).await,
            Statement::DropSource(s) => self.drop_source(s),
            Statement::ShowSources => self.show_sources(),
            Statement::DescribeSource(s) => self.describe_source(s),
            Statement::ShowJobs => self.show_jobs(),
            Statement::RoutedInsert(s) => self.routed_insert(*s).await,
            Statement::StopJob(s) => {
                let state = self.jobs.stop(&s.name).await?;
                Ok(Output::Done(format!("job '{}' {state}", s.name)))
            }
        }
    }

    /// The session's continuous jobs.
    pub fn jobs(&self) -> &Jobs {
        &self.jobs
    }

    async fn create_source(&self, s: CreateSource) -> Result<Output> {
        if self.sources.read().is_ok_and(|m| m.contains_key(&s.name)) {
            if s.if_not_exists {
                return Ok(Output::Done("CREATE SOURCE".into()));
            }
            return Err(Error::AlreadyExists(format!(
                "source '{}' exists already (DROP SOURCE {} first)",
                s.name, s.name
            )));
        }
        if self.ctx.table_exist(s.name.as_str()).unwrap_or(false) {
            return Err(Error::AlreadyExists(format!(
                "a table named '{}' exists in the default schema; name the source differently",
                s.name
            )));
        }
        let declared = if s.columns.is_empty() {
            None
        } else {
            Some(Arc::new(arrow_schema_from_columns(&s.columns)?))
        };
        let options = Options::try_new(format!("CREATE SOURCE {}", s.name), s.options)?;
        let mut def = SourceDef::try_new(&s.name, declared, options)?;
        def.watermark = s.watermark.map(|w| WatermarkDef {
            column: w.column.value,
            expr: w.expr,
        });
        // Check the watermark against the columns now, not when a job starts.
        WatermarkTracker::try_new(&def, &self.ctx.state()).await?;
        let def: SourceRef = Arc::new(def);
        self.ctx
            .register_table(s.name.as_str(), Arc::new(SourceTable::new(def.clone())))?;
        if let Ok(mut m) = self.sources.write() {
            m.insert(s.name.clone(), def);
        }
        Ok(Output::Done("CREATE SOURCE".into()))
    }

    fn drop_source(&self, s: DropSource) -> Result<Output> {
        let removed = unregister(&self.sources, &s.name, s.if_exists, || {
            format!(
                "source '{}' does not exist (SHOW SOURCES lists them)",
                s.name
            )
        })?;
        if removed {
            self.ctx.deregister_table(s.name.as_str())?;
        }
        Ok(Output::Done("DROP SOURCE".into()))
    }

    fn show_sources(&self) -> Result<Output> {
        let sources = self.sources.read().map(|m| m.clone()).unwrap_or_default();
        let names = sources.keys().cloned().collect();
        let connectors = sources
            .values()
            .map(|d| d.connector_name().to_string())
            .collect();
        let columns = sources
            .values()
            .map(|d| match (d.is_inferred(), d.schema.fields().len()) {
                (false, n) => n.to_string(),
                (true, 0) => "inferred".to_string(),
                (true, n) => format!("inferred + {n}"),
            })
            .collect();
        string_rows(
            &["source_name", "connector", "columns"],
            vec![names, connectors, columns],
        )
    }

    fn describe_source(&self, s: DescribeSource) -> Result<Output> {
        let def = self
            .sources
            .read()
            .ok()
            .and_then(|m| m.get(&s.name).cloned())
            .ok_or_else(|| {
                Error::NotFound(format!(
                    "source '{}' does not exist (SHOW SOURCES lists them)",
                    s.name
                ))
            })?;
        let mut cols: [Vec<String>; 3] = Default::default();
        if let Some(from) = def.columns_from() {
            cols[0].push("# Columns".to_string());
            cols[1].push(from.to_string());
            cols[2].push(String::new());
        }
        for f in def.schema.fields() {
            cols[0].push(f.name().clone());
            cols[1].push(f.data_type().to_string());
            cols[2].push(if f.is_nullable() { "YES" } else { "NO" }.to_string());
        }
        if let Some(w) = &def.watermark {
            cols[0].push("# Watermark".to_string());
            cols[1].push(format!("{} AS {}", w.column, w.expr));
            cols[2].push(String::new());
        }
        let [a, b, c] = cols;
        string_rows(&["column_name", "data_type", "is_nullable"], vec![a, b, c])
    }

    fn show_jobs(&self) -> Result<Output> {
        use datafusion::arrow::array::{Float64Array, UInt64Array};
        let rows = self.jobs.rows();
        let schema = Arc::new(Schema::new(vec![
            Field::new("name", DataType::Utf8, false),
            Field::new("state", DataType::Utf8, false),
            Field::new("target", DataType::Utf8, false),
            Field::new("sources", DataType::Utf8, false),
            Field::new("records_in", DataType::UInt64, false),
            Field::new("records_out", DataType::UInt64, false),
            Field::new("records_dead_lettered", DataType::UInt64, false),
            Field::new("records_per_second", DataType::Float64, false),
            Field::new("lag", DataType::UInt64, true),
            Field::new("last_checkpoint", DataType::UInt64, false),
            Field::new("last_checkpoint_at", DataType::Utf8, true),
            Field::new("watermark", DataType::Utf8, true),
            Field::new("error", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from_iter_values(
                    rows.iter().map(|r| r.name.clone()),
                )),
                Arc::new(StringArray::from_iter_values(
                    rows.iter().map(|r| r.state.clone()),
                )),
                Arc::new(StringArray::from_iter_values(
                    rows.iter().map(|r| r.target.clone()),
                )),
                Arc::new(StringArray::from_iter_values(
                    rows.iter().map(|r| r.sources.clone()),
                )),
                Arc::new(UInt64Array::from_iter_values(
                    rows.iter().map(|r| r.records_in),
                )),
                Arc::new(UInt64Array::from_iter_values(
                    rows.iter().map(|r| r.records_out),
                )),
                Arc::new(UInt64Array::from_iter_values(
                    rows.iter().map(|r| r.records_dead),
                )),
                Arc::new(Float64Array::from_iter_values(
                    rows.iter().map(|r| (r.rate * 10.0).round() / 10.0),
                )),
                Arc::new(UInt64Array::from_iter(rows.iter().map(|r| r.lag))),
                Arc::new(UInt64Array::from_iter_values(
                    rows.iter().map(|r| r.checkpoint),
                )),
                Arc::new(StringArray::from_iter(rows.iter().map(|r| {
                    (r.checkpoint_time_ms > 0)
                        .then(|| {
                            chrono::DateTime::from_timestamp_millis(r.checkpoint_time_ms as i64)
                        })
                        .flatten()
                        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
                }))),
                Arc::new(StringArray::from_iter(rows.iter().map(|r| {
                    r.watermark
                        .and_then(chrono::DateTime::from_timestamp_micros)
                        .map(|t| t.naive_utc().to_string())
                }))),
                Arc::new(StringArray::from_iter(rows.iter().map(|r| r.error.clone()))),
            ],
        )
        .map_err(|e| Error::Internal(format!("building SHOW JOBS: {e}")))?;
        Ok(Output::Rows(schema, vec![batch]))
    }

    /// Start the continuous job for `stmt`, an `INSERT INTO target SELECT ...` that reads
    /// sources.
    async fn start_job(&self, stmt: DFStatement) -> Result<Output> {
        let planner = QueryPlanner::new(self.ctx.state(), stmt);
        let (query, plan) = ContinuousQuery::try_new(planner, &self.sources()).await?;
        let LogicalPlan::Dml(dml) = &plan else {
            return Err(Error::Internal(format!(
                "a continuous INSERT planned as {}",
                plan.display()
            )));
        };
        let provider = source_as_provider(&dml.target)?;
        let lake = provider
            .as_any()
            .downcast_ref::<LakeTable>()
            .ok_or_else(|| {
                Error::Plan(format!(
                    "a continuous INSERT writes an Iceberg table; {} is not one",
                    dml.table_name
                ))
            })?;
        let (default_catalog, _) = self.defaults();
        let catalog_name = dml
            .table_name
            .catalog()
            .map(str::to_string)
            .unwrap_or(default_catalog);
        let ident = lake.table().identifier().clone();
        let target = Target {
            catalog_name: catalog_name.clone(),
            catalog: lake.catalog().clone(),
            committer: self.committer(&catalog_name),
            destination: Destination::Table(ident),
        };
        self.launch_job(target, query).await
    }

    /// `INSERT INTO ns SELECT ... ROUTE BY expr`: a continuous job routing each row to a
    /// table of `ns`.
    async fn routed_insert(&self, s: RoutedInsert) -> Result<Output> {
        let (catalog_name, namespace) = self.namespace_name(&s.namespace)?;
        let catalog = self.iceberg(&catalog_name)?;
        let options = Options::try_new(
            format!("INSERT INTO {} ... ROUTE BY", s.namespace),
            s.options,
        )?;
        let options = RouteOptions::try_new(options)?;
        let planner = QueryPlanner::routed(self.ctx.state(), s.query, s.route);
        if self.sources_read_by(planner.statement()).is_empty() {
            return Err(Error::Plan(
                "ROUTE BY runs as a continuous job: its SELECT must read a source (CREATE \
                 SOURCE); to copy a table, INSERT INTO each target table"
                    .to_string(),
            ));
        }
        let (query, _) = ContinuousQuery::try_new(planner, &self.sources()).await?;
        let target = Target {
            catalog_name: catalog_name.clone(),
            catalog,
            committer: self.committer(&catalog_name),
            destination: Destination::Routed { namespace, options },
        };
        self.launch_job(target, query).await
    }

    /// The declared sources, by name.
    fn sources(&self) -> BTreeMap<String, SourceRef> {
        self.sources.read().map(|m| m.clone()).unwrap_or_default()
    }

    /// The declared sources `stmt` names.
    fn sources_read_by(&self, stmt: &DFStatement) -> Vec<SourceRef> {
        let (catalog, schema) = self.defaults();
        let sources = self.sources();
        let Ok(references) = self.ctx.state().resolve_table_references(stmt) else {
            return Vec::new();
        };
        references
            .iter()
            .filter(|r| {
                r.schema().is_none_or(|s| s == schema) && r.catalog().is_none_or(|c| c == catalog)
            })
            .filter_map(|r| sources.get(r.table()).cloned())
            .collect()
    }

    /// Plan `stmt`, which reads sources whose columns are inferred, over a preview of each:
    /// its first records (see [`preview`]), in one schema that all their shapes fit.
    async fn plan_over_previews(
        &self,
        state: SessionState,
        stmt: DFStatement,
        sources: Vec<SourceRef>,
    ) -> Result<LogicalPlan> {
        let mut tables: BTreeMap<String, Arc<dyn TableProvider>> = BTreeMap::new();
        for source in sources.iter().filter(|s| s.is_inferred()) {
            let batches = preview(source, None).await?;
            let schema = merge_schemas(batches.iter().map(|b| b.schema_ref()));
            let batches = batches
                .iter()
                .map(|b| conform_preview(b, &schema))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| Error::Internal(format!("previewing {}: {e}", source.name)))?;
            tables.insert(
                source.name.clone(),
                Arc::new(MemTable::try_new(schema, vec![batches])?),
            );
        }
        Ok(QueryPlanner::new(state, stmt).plan(tables).await?.plan)
    }

    fn committer(&self, catalog: &str) -> Option<Arc<Committer>> {
        self.catalogs
            .read()
            .ok()?
            .get(catalog)
            .and_then(|h| h.committer.clone())
    }

    /// Start a continuous job writing `query`'s rows to `target`; with `table.dml-sync`,
    /// wait for it to end.
    async fn launch_job(&self, target: Target, query: ContinuousQuery) -> Result<Output> {
        let options = self.options();
        let name = options
            .pipeline_name
            .clone()
            .unwrap_or_else(|| format!("insert-into-{target}"));
        let status = Arc::new(JobStatus::new(
            name.clone(),
            target.to_string(),
            query.sources().map(|s| s.name.clone()).collect(),
        ));
        self.jobs.start(Job {
            name: name.clone(),
            target,
            query,
            interval: options.checkpoint_interval,
            store: StateStore::new(&options.state_dir),
            status,
        })?;
        if !options.dml_sync {
            return Ok(Output::Done(format!("job '{name}' started")));
        }
        // Wait for the job; Ctrl-C stops it with a final checkpoint.
        let (state, error) = tokio::select! {
            end = self.jobs.wait(&name) => end,
            _ = crate::interrupt::interrupted() => {
                self.jobs.stop(&name).await?;
                self.jobs.wait(&name).await
            }
        };
        match error {
            Some(e) => Err(Error::Plan(format!("job '{name}' failed: {e}"))),
            None => Ok(Output::Done(format!("job '{name}' {state}"))),
        }
    }

    /// floe's settings as they are now.
    pub fn options(&self) -> FloeOptions {
        self.ctx
            .state()
            .config()
            .options()
            .extensions
            .get::<FloeOptions>()
            .cloned()
            .unwrap_or_default()
    }

    async fn run_datafusion(&self, mut stmt: DFStatement) -> Result<Output> {
        qualify_set(&mut stmt);
        let is_insert =
            matches!(&stmt, DFStatement::Statement(s) if matches!(**s, SQLStatement::Insert(_)));
        let sources = self.sources_read_by(&stmt);
        if is_insert && !sources.is_empty() {
            return self.start_job(stmt).await;
        }
        let state = self.ctx.state();
        let plan = if sources.iter().any(|s| s.is_inferred()) {
            self.plan_over_previews(state, stmt, sources).await?
        } else {
            state.statement_to_plan(stmt).await?
        };
        let df = self.ctx.execute_logical_plan(plan).await?;
        let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
        let batches = df.collect().await?;
        if schema.fields().is_empty() {
            // SET, CREATE VIEW and the like: nothing to show.
            return Ok(Output::Done("OK".into()));
        }
        Ok(Output::Rows(schema, batches))
    }

    /// Run SQL text that floe built (one of its statements printed back) through
    /// DataFusion's own parser: used where a statement targets DataFusion's in-memory catalog.
    async fn run_text(&self, sql: &str) -> Result<Output> {
        let stmt = DFParserBuilder::new(sql).build()?.parse_statement()?;
        self.run_datafusion(stmt).await
    }

    async fn create_catalog(&self, s: CreateCatalog) -> Result<Output> {
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
            Arc::new(LakeCatalogProvider::new(&s.name, handle.catalog.clone())),
        );
        if let Ok(mut c) = self.catalogs.write() {
            c.insert(s.name.clone(), handle);
        }
        Ok(Output::Done("CREATE CATALOG".into()))
    }

    fn drop_catalog(&self, s: DropCatalog) -> Result<Output> {
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

    fn show_catalogs(&self) -> Result<Output> {
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
        string_rows(
            &["catalog_name", "type", "options"],
            vec![names, kind, opts],
        )
    }

    async fn create_schema(&self, s: CreateSchema) -> Result<Output> {
        let (catalog, ns) = self.namespace_name(&s.name)?;
        if !self.is_iceberg(&catalog) {
            return self.run_text(&s.to_string()).await;
        }
        let cat = self.iceberg(&catalog)?;
        if cat.namespace_exists(&ns).await? {
            if s.if_not_exists {
                return Ok(Output::Done("CREATE SCHEMA".into()));
            }
            return Err(Error::AlreadyExists(format!(
                "namespace '{catalog}.{}' exists already",
                ns.to_url_string()
            )));
        }
        cat.create_namespace(&ns, s.options.into_iter().collect())
            .await?;
        Ok(Output::Done("CREATE SCHEMA".into()))
    }

    async fn drop_schema(&self, s: DropSchema) -> Result<Output> {
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

    async fn show_schemas(&self, s: ShowSchemas) -> Result<Output> {
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
        string_rows(&["catalog_name", "schema_name"], vec![catalogs, schemas])
    }

    async fn create_table(&self, s: CreateTable) -> Result<Output> {
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
        cat.create_table(&name.namespace, creation).await?;
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

    async fn drop_table(&self, s: DropTable) -> Result<Output> {
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

    async fn show_tables(&self, s: ShowTables) -> Result<Output> {
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
                let schemas = match ns {
                    Some(n) => vec![n],
                    None => provider.schema_names(),
                };
                for n in schemas {
                    if n == "information_schema" {
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
        string_rows(
            &["table_catalog", "table_schema", "table_name"],
            vec![a, b, c],
        )
    }

    async fn describe(&self, s: Describe) -> Result<Output> {
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

/// `SET key = value` with a key under no known prefix sets floe's setting of that name.
/// The catalog `CREATE CATALOG ... WITH (...)` describes:
///
/// ```text
/// 'type'          = 'iceberg'                   (required)
/// 'catalog-type'  = 'sql' | 'rest' | 'memory'   (default 'sql')
/// sql:    'uri' = 'sqlite:path/catalog.db' | 'postgres://...', 'warehouse' = path or URI,
///         'pool.max-connections'
/// rest:   'uri', 'warehouse', 'credential' (OAuth2 id:secret), 'token', 'oauth2-server-uri',
///         'scope', 'prefix', 'header.*' (HTTP headers)
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
    let kind = options
        .take_choice("catalog-type", &["sql", "rest", "memory"])?
        .unwrap_or("sql");
    let storage = options
        .take_prefixed("s3.")
        .into_iter()
        .map(|(k, v)| (format!("s3.{k}"), v))
        .collect();
    let kind = match kind {
        "sql" => CatalogKind::Sql {
            uri: options.require_str("uri")?,
            warehouse: options.require_str("warehouse")?,
            max_connections: options.take_positive("pool.max-connections")?,
        },
        "rest" => {
            let mut props = BTreeMap::from([("uri".to_string(), options.require_str("uri")?)]);
            for key in [
                "warehouse",
                "credential",
                "token",
                "oauth2-server-uri",
                "scope",
                "prefix",
            ] {
                if let Some(v) = options.take_str(key) {
                    props.insert(key.into(), v);
                }
            }
            // Extra HTTP headers, as iceberg-catalog-rest takes them.
            for (k, v) in options.take_prefixed("header.") {
                props.insert(format!("header.{k}"), v);
            }
            CatalogKind::Rest { props }
        }
        _ => CatalogKind::Memory {
            warehouse: options.take_str("warehouse"),
        },
    };
    options.finish()?;
    Ok(CatalogConfig { kind, storage })
}

fn qualify_set(stmt: &mut DFStatement) {
    if let DFStatement::Statement(s) = stmt
        && let SQLStatement::Set(Set::SingleAssignment { variable, .. }) = s.as_mut()
    {
        let key = variable.to_string().trim_matches('\'').to_string();
        let full = qualify_setting(&key);
        if full != key {
            *variable = ObjectName::from(vec![Ident::with_quote('\'', full)]);
        }
    }
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
    string_rows(&["column_name", "data_type", "is_nullable"], vec![a, b, c])
}

/// A result of string columns.
fn string_rows(names: &[&str], columns: Vec<Vec<String>>) -> Result<Output> {
    let schema = Arc::new(Schema::new(
        names
            .iter()
            .map(|n| Field::new(*n, DataType::Utf8, false))
            .collect::<Vec<_>>(),
    ));
    let arrays = columns
        .into_iter()
        .map(|c| Arc::new(StringArray::from(c)) as _)
        .collect();
    let batch = RecordBatch::try_new(schema.clone(), arrays)
        .map_err(|e| Error::Internal(format!("building a result: {e}")))?;
    Ok(Output::Rows(schema, vec![batch]))
}

/// Take `name` out of `registry` (`DROP ... [IF EXISTS]`): whether it was there. Absent, it
/// is an error naming it (`missing`), unless `if_exists`.
fn unregister<T>(
    registry: &RwLock<BTreeMap<String, T>>,
    name: &str,
    if_exists: bool,
    missing: impl FnOnce() -> String,
) -> Result<bool> {
    let removed = registry
        .write()
        .map(|mut m| m.remove(name).is_some())
        .unwrap_or(false);
    if !removed && !if_exists {
        return Err(Error::NotFound(missing()));
    }
    Ok(removed)
}
