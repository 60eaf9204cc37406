//! A floe session: one DataFusion [`SessionContext`] with the Iceberg catalogs the user
//! registered, and the one `match` that plans every statement. The statements' work is
//! by concern: `names` (resolving names against the session's defaults), `ddl`
//! (catalogs, namespaces, tables), `sources` (`CREATE SOURCE` and previews), `jobs`
//! (continuous `INSERT`s, `SHOW JOBS` as `floe.jobs`), `procedures` (`CALL` for table
//! maintenance).

mod columns;
mod ddl;
mod dml;
mod jobs;
mod names;
mod procedures;
mod sources;

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use datafusion::arrow::array::{RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{
    CatalogProvider, CatalogProviderList, MemorySchemaProvider, SchemaProvider,
};
use datafusion::execution::context::SessionContext;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::prelude::SessionConfig;
use datafusion::sql::parser::{DFParserBuilder, Statement as DFStatement};
use datafusion::sql::sqlparser::ast::{Ident, ObjectName, Set, Statement as SQLStatement};

use crate::catalog::jobs::{JOBS_COLUMNS, JOBS_SCHEMA, jobs_table, table_health};
use crate::config::{FloeOptions, qualify_setting};
use crate::connector::SourceRef;
use crate::error::{Error, Result};
use crate::lake::CatalogHandle;
use crate::sql::{Statement, parse_sql};
use crate::stream::Jobs;

/// What a statement produced.
#[derive(Debug)]
pub enum Output {
    /// Rows (possibly none) with their schema.
    Rows(SchemaRef, Vec<RecordBatch>),
    /// A statement with no rows; the text says what it did (`CREATE CATALOG`).
    Done(String),
    /// A continuous job started and runs on (the session does not wait for it).
    Started {
        /// The job's name (`STOP JOB` takes it).
        job: String,
    },
}

impl std::fmt::Display for Output {
    /// What a statement without rows did, as a tag (`CREATE CATALOG`, `job 'x' started`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Output::Rows(_, b) => write!(
                f,
                "SELECT {}",
                b.iter().map(|b| b.num_rows()).sum::<usize>()
            ),
            Output::Done(tag) => f.write_str(tag),
            Output::Started { job } => write!(f, "job '{job}' started"),
        }
    }
}

impl Output {
    /// The number of rows in the output.
    pub fn row_count(&self) -> usize {
        match self {
            Output::Rows(_, b) => b.iter().map(|b| b.num_rows()).sum(),
            Output::Done(_) | Output::Started { .. } => 0,
        }
    }
}

/// A session: catalogs, settings, and the statements run in it.
///
/// Sessions [forked](Session::fork) from one share its catalogs, sources, views and jobs;
/// each has settings of its own (the connections of a server).
pub struct Session {
    ctx: SessionContext,
    catalog_list: Arc<SessionCatalogs>,
    catalogs: Arc<RwLock<BTreeMap<String, CatalogHandle>>>,
    sources: Arc<RwLock<BTreeMap<String, SourceRef>>>,
    jobs: Arc<Jobs>,
    /// Where `floe.jobs` is, by its full name.
    jobs_table: String,
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
            .with_relation_planners(vec![Arc::new(crate::sql::windows::WindowFunctions)])
            .with_analyzer_rule(Arc::new(crate::sql::windows::SessionWindows))
            .build();
        let ctx = SessionContext::new_with_state(state);
        ctx.register_udf(datafusion::logical_expr::ScalarUDF::new_from_impl(
            crate::sql::windows::ProcTime::default(),
        ));
        let jobs = Arc::new(Jobs::default());
        // `floe.jobs` in the default catalog (a fresh one: neither registration can clash).
        let schema = Arc::new(MemorySchemaProvider::new());
        let _ = schema.register_table("jobs".into(), Arc::new(jobs_table(jobs.clone())));
        let _ = schema.register_table("table_health".into(), Arc::new(table_health(jobs.clone())));
        let default_catalog = default_catalog(&ctx);
        if let Some(catalog) = ctx.catalog(&default_catalog) {
            let _ = catalog.register_schema(JOBS_SCHEMA, schema);
        }
        Self {
            ctx,
            catalog_list,
            catalogs: Arc::default(),
            sources: Arc::default(),
            jobs,
            jobs_table: format!("{default_catalog}.{JOBS_SCHEMA}.jobs"),
        }
    }

    /// A session sharing this one's catalogs, sources, views and jobs, with a copy of its
    /// settings as they are now: what one sets later the other does not see.
    pub fn fork(&self) -> Session {
        let state = SessionStateBuilder::new_from_existing(self.ctx.state()).build();
        Session {
            ctx: SessionContext::new_with_state(state),
            catalog_list: self.catalog_list.clone(),
            catalogs: self.catalogs.clone(),
            sources: self.sources.clone(),
            jobs: self.jobs.clone(),
            jobs_table: self.jobs_table.clone(),
        }
    }

    /// The catalog that unqualified names resolve in (`datafusion.catalog.default_catalog`).
    pub fn default_catalog(&self) -> String {
        default_catalog(&self.ctx)
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
            Statement::ShowJobs => self.show_jobs().await,
            Statement::RoutedInsert(s) => self.routed_insert(*s).await,
            Statement::Call(s) => self.call(s).await,
            Statement::ResumeJob(s) => Err(Error::Unsupported(format!(
                "{s}: a session keeps no job's statements once it stopped; run its INSERT \
                 again with the same 'pipeline.name' (it resumes from its last checkpoint), or \
                 submit jobs to a server (floe serve), which keeps them"
            ))),
            Statement::StopJob(s) => {
                let state = self.jobs.stop(&s.name).await?;
                Ok(Output::Done(format!("job '{}' {state}", s.name)))
            }
        }
    }

    /// The session's continuous jobs.
    pub fn jobs(&self) -> &Arc<Jobs> {
        &self.jobs
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
        if let DFStatement::Statement(s) = &stmt {
            let changed = match s.as_ref() {
                SQLStatement::Delete(d) => self.delete(d).await?,
                SQLStatement::Update(u) => self.update(u).await?,
                SQLStatement::Merge(m) => self.merge(m).await?,
                _ => None,
            };
            if let Some(out) = changed {
                return Ok(out);
            }
        }
        let is_insert =
            matches!(&stmt, DFStatement::Statement(s) if matches!(**s, SQLStatement::Insert(_)));
        let sources = self.sources_read_by(&stmt);
        if is_insert && !sources.is_empty() {
            return self.start_job(stmt).await;
        }
        if let DFStatement::Explain(e) = &stmt
            && let DFStatement::Statement(s) = e.statement.as_ref()
            && matches!(**s, SQLStatement::Insert(_))
            && !sources.is_empty()
        {
            return self.explain_job(e.statement.as_ref().clone()).await;
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

    /// The schema of the rows `stmt` returns, planned without running it, when it is a query
    /// that reads no source or one of floe's statements with fixed columns (`SHOW ...`,
    /// `DESCRIBE`); `None` when only running it tells (other statements, previews of sources)
    /// or it does not plan (running it reports why).
    pub async fn plan_schema(&self, stmt: &Statement) -> Option<SchemaRef> {
        let s = match stmt {
            Statement::DataFusion(s) => s,
            Statement::ShowCatalogs => return Some(string_schema(CATALOG_COLUMNS)),
            Statement::ShowSchemas(_) => return Some(string_schema(SCHEMA_COLUMNS)),
            Statement::ShowTables(_) => return Some(string_schema(TABLE_COLUMNS)),
            Statement::ShowSources => return Some(string_schema(SOURCE_COLUMNS)),
            Statement::DescribeSource(_) => return Some(string_schema(COLUMN_COLUMNS)),
            Statement::ShowJobs => return Some(JOBS_COLUMNS.clone()),
            Statement::Describe(d) => {
                let name = self.table_name(&d.name).ok()?;
                return self
                    .is_iceberg(&name.catalog)
                    .then(|| string_schema(COLUMN_COLUMNS));
            }
            _ => return None,
        };
        let DFStatement::Statement(inner) = s.as_ref() else {
            return None;
        };
        if !matches!(inner.as_ref(), SQLStatement::Query(_)) || !self.sources_read_by(s).is_empty()
        {
            return None;
        }
        let plan = self
            .ctx
            .state()
            .statement_to_plan(s.as_ref().clone())
            .await
            .ok()?;
        Some(Arc::new(plan.schema().as_arrow().clone()))
    }

    /// Run SQL text that floe built (one of its statements printed back) through
    /// DataFusion's own parser: used where a statement targets DataFusion's in-memory catalog.
    async fn run_text(&self, sql: &str) -> Result<Output> {
        let stmt = DFParserBuilder::new(sql).build()?.parse_statement()?;
        self.run_datafusion(stmt).await
    }
}

fn default_catalog(ctx: &SessionContext) -> String {
    ctx.state()
        .config()
        .options()
        .catalog
        .default_catalog
        .clone()
}

/// `SET key = value` with a key under no known prefix sets floe's setting of that name.
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

/// The columns of `SHOW CATALOGS`.
const CATALOG_COLUMNS: &[&str] = &["catalog_name", "type", "options"];
/// The columns of `SHOW SCHEMAS`.
const SCHEMA_COLUMNS: &[&str] = &["catalog_name", "schema_name"];
/// The columns of `SHOW TABLES`.
const TABLE_COLUMNS: &[&str] = &["table_catalog", "table_schema", "table_name"];
/// The columns of `SHOW SOURCES`.
const SOURCE_COLUMNS: &[&str] = &["source_name", "connector", "columns"];
/// The columns of `DESCRIBE` (a lake table or a source).
const COLUMN_COLUMNS: &[&str] = &["column_name", "data_type", "is_nullable"];

/// The schema of a result of string columns.
fn string_schema(names: &[&str]) -> SchemaRef {
    Arc::new(Schema::new(
        names
            .iter()
            .map(|n| Field::new(*n, DataType::Utf8, false))
            .collect::<Vec<_>>(),
    ))
}

/// A result of string columns.
pub(super) fn string_rows(names: &[&str], columns: Vec<Vec<String>>) -> Result<Output> {
    let schema = string_schema(names);
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
pub(super) fn unregister<T>(
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
