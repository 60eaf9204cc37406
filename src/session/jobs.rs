//! Continuous jobs: `INSERT INTO ... SELECT ... FROM source` (with or without `ROUTE BY`)
//! planned and launched, and `SHOW JOBS`.

use std::sync::Arc;

use datafusion::sql::parser::Statement as DFStatement;

use super::{Output, Session};
use crate::catalog::table::LakeTable;
use crate::checkpoint::StateStore;
use crate::error::{Error, Result};
use crate::lake::maintenance::policy::MaintenancePolicy;
use crate::sink::route::RouteOptions;
use crate::sql::Options;
use crate::sql::statement::*;
use crate::stream::job::Destination;
use crate::stream::{ContinuousQuery, Job, JobStatus, QueryPlanner, Target};
use datafusion::arrow::array::{RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::source_as_provider;
use datafusion::logical_expr::LogicalPlan;

impl Session {
    /// `SHOW JOBS`: `SELECT * FROM floe.jobs`.
    pub(super) async fn show_jobs(&self) -> Result<Output> {
        self.run_text(&format!("SELECT * FROM {}", self.jobs_table))
            .await
    }

    /// `EXPLAIN` of a continuous `INSERT`: its streaming plan (see
    /// [`ContinuousQuery::explain`]), planned without starting it.
    pub(super) async fn explain_job(&self, stmt: DFStatement) -> Result<Output> {
        let planner = QueryPlanner::new(self.ctx.state(), stmt);
        let (query, _) = ContinuousQuery::try_new(planner, &self.sources()).await?;
        let plan = query.explain().await?;
        let schema = Arc::new(Schema::new(vec![
            Field::new("plan_type", DataType::Utf8, false),
            Field::new("plan", DataType::Utf8, false),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from(vec!["continuous_plan"])),
                Arc::new(StringArray::from(vec![plan])),
            ],
        )
        .map_err(|e| Error::Internal(format!("the plan: {e}")))?;
        Ok(Output::Rows(schema, vec![batch]))
    }

    /// Start the continuous job for `stmt`, an `INSERT INTO target SELECT ...` that reads
    /// sources.
    pub(super) async fn start_job(&self, stmt: DFStatement) -> Result<Output> {
        let changes: Vec<String> = self
            .sources_read_by(&stmt)
            .iter()
            .filter(|s| s.is_change_stream())
            .map(|s| s.name.clone())
            .collect();
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
        let committer = self.committer(&catalog_name);
        let md = lake.table().metadata();
        let keyed = md.current_schema().identifier_field_ids().next().is_some();
        if !changes.is_empty() && (query.aggregate().is_some() || query.joins_streams()) {
            return Err(Error::Plan(format!(
                "source {} is a change stream (its records update and delete rows), and {} \
                 appended records only: read an append-only source",
                changes.join(", "),
                if query.aggregate().is_some() {
                    "aggregates take"
                } else {
                    "joins between streams take"
                }
            )));
        }
        if let Some(a) = query.aggregate().filter(|a| !a.is_windowed())
            && !keyed
        {
            return Err(Error::Plan(format!(
                "{} without windows updates its rows at every checkpoint, and table {ident} has \
                 no primary key to replace the rows by: create it with {} as its PRIMARY KEY \
                 (...) NOT ENFORCED, or {}",
                a.kind(),
                a.updating_key(),
                a.windowed_alternative()
            )));
        }
        if !changes.is_empty() && !keyed {
            return Err(Error::Plan(format!(
                "source {} is a change stream (its records update and delete rows by key), \
                 and table {ident} has no primary key to apply them by: create it with \
                 PRIMARY KEY (...) NOT ENFORCED",
                changes.join(", ")
            )));
        }
        if keyed {
            // A keyed table keeps one row per key: its commits delete rows (position deletes).
            if committer.is_none() {
                return Err(Error::Unsupported(format!(
                    "a continuous INSERT into table {ident}, which has a primary key, in \
                     catalog {catalog_name}: it deletes the rows it replaces through floe's own \
                     commit path, which sql, rest and glue catalogs have"
                )));
            }
            if md.format_version() == iceberg::spec::FormatVersion::V1 {
                return Err(Error::Unsupported(format!(
                    "a continuous INSERT into table {ident}, which has a primary key: floe \
                     replaces rows by key with row-level deletes, which need format version 2 \
                     or 3"
                )));
            }
        }
        let target = Target {
            catalog_name: catalog_name.clone(),
            catalog: lake.catalog().clone(),
            committer,
            destination: Destination::Table(ident),
        };
        self.launch_job(target, query).await
    }

    /// `INSERT INTO ns SELECT ... ROUTE BY expr`: a continuous job routing each row to a
    /// table of `ns`.
    pub(super) async fn routed_insert(&self, s: RoutedInsert) -> Result<Output> {
        let (catalog_name, namespace) = self.namespace_name(&s.namespace)?;
        let catalog = self.iceberg(&catalog_name)?;
        let options = Options::try_new(
            format!("INSERT INTO {} ... ROUTE BY", s.namespace),
            s.options,
        )?;
        let options = RouteOptions::try_new(options)?;
        let planner = QueryPlanner::routed(self.ctx.state(), s.query, s.route);
        let read = self.sources_read_by(planner.statement());
        if let Some(c) = read.iter().find(|s| s.is_change_stream())
            && self.committer(&catalog_name).is_none()
        {
            return Err(Error::Unsupported(format!(
                "ROUTE BY over change stream {} into catalog {catalog_name}: its tables keep \
                 one row per key, deleting the rows they replace through floe's own commit \
                 path, which sql, rest and glue catalogs have",
                c.name
            )));
        }
        if read.is_empty() {
            // A name the SELECT reads that does not exist says so first.
            let state = self.ctx.state();
            state.statement_to_plan(planner.statement().clone()).await?;
            return Err(Error::Plan(
                "ROUTE BY runs as a continuous job: its SELECT must read a source (CREATE \
                 SOURCE); to copy a table, INSERT INTO each target table"
                    .to_string(),
            ));
        }
        let (query, _) = ContinuousQuery::try_new(planner, &self.sources()).await?;
        if let Some(a) = query.aggregate().filter(|a| !a.is_windowed()) {
            return Err(Error::Plan(format!(
                "ROUTE BY with {} without windows: its rows are updated by key, which a routed \
                 table does not have; INSERT INTO one table with {} as its PRIMARY KEY",
                a.kind(),
                a.updating_key()
            )));
        }
        let target = Target {
            catalog_name: catalog_name.clone(),
            catalog,
            committer: self.committer(&catalog_name),
            destination: Destination::Routed { namespace, options },
        };
        self.launch_job(target, query).await
    }

    /// How a job writing `target` maintains its tables: the session's `maintenance.*`
    /// settings, with a routed INSERT's own `maintenance.*` options over them.
    fn maintenance(
        &self,
        options: &crate::config::FloeOptions,
        target: &Target,
    ) -> Result<Option<MaintenancePolicy>> {
        let mut map = options.maintenance.clone();
        if let Destination::Routed { options, .. } = &target.destination {
            map.extend(options.maintenance.clone());
        }
        let policy = MaintenancePolicy::from_map(&map)?;
        if policy.is_some() && target.committer.is_none() {
            return Err(Error::Unsupported(format!(
                "maintenance in a job writing catalog {}: it commits through floe's own path, \
                 which sql, rest and glue catalogs have",
                target.catalog_name
            )));
        }
        Ok(policy)
    }

    /// Start a continuous job writing `query`'s rows to `target`; with `table.dml-sync`,
    /// wait for it to end.
    pub(super) async fn launch_job(
        &self,
        target: Target,
        query: ContinuousQuery,
    ) -> Result<Output> {
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
        let maintenance = self.maintenance(&options, &target)?;
        self.jobs.start(Job {
            name: name.clone(),
            target,
            query,
            interval: options.checkpoint_interval,
            store: StateStore::new(&options.state_dir),
            status,
            maintenance,
            idle_timeout: options.idle_timeout,
            parallelism: options.parallelism.unwrap_or_else(crate::task::cores),
        })?;
        if !options.dml_sync {
            return Ok(Output::Started { job: name });
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
}
