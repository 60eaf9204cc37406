//! A continuous query: the `SELECT` of a continuous `INSERT`, planned once and run on each
//! batch a source delivers.
//!
//! A query runs row by row (projections, filters, scalar functions, `CAST`, `CASE`, `UNION
//! ALL` of sources, joins with lake tables ([`super::lookup`]) and between streams
//! ([`super::stream_join`])), or aggregates (over windows, `FROM TUMBLE(...)` with `GROUP BY
//! window_start, window_end, ...`, or updating each group's row, see [`super::aggregate`]),
//! or keeps the top N rows of each partition (`ROW_NUMBER()`, [`super::top_n`]): then the rows
//! below the aggregate run per batch and the aggregate keeps its state across them. What else
//! needs the whole stream (`ORDER BY`, `LIMIT`, outer joins between streams) is rejected when
//! the job is submitted.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{RecordBatch, RecordBatchOptions, UInt32Array, new_null_array};
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Schema, SchemaRef};
use datafusion::catalog::TableProvider;
use datafusion::common::Column;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::provider_as_source;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::TaskContext;
use datafusion::execution::session_state::SessionState;
use datafusion::logical_expr::{Expr, LogicalPlan, Projection, TableScan};
use datafusion::physical_plan::execution_plan::reset_plan_states;
use datafusion::physical_plan::{ExecutionPlan, collect, displayable};

use super::aggregate::{StreamAggregate, prune_below_aggregates, stateful_node};
use super::branches::merge_aggregates;
use super::lookup::{Lookups, unsupported_join};
use super::planner::{Planned, QueryPlanner, missing_column};
use super::slot::{BatchSlot, INPUT_ROW, SlotTable};
use super::source_table::SourceTable;
use super::stream_join::{JoinBuffers, JoinKeys, TimeBound};
use crate::connector::SourceRef;
use crate::error::{Error, ErrorKind, Reject, Result};

/// A planned continuous query.
pub struct ContinuousQuery {
    /// The sources it reads, by name, with the slot each feeds.
    sources: BTreeMap<String, (SourceRef, Arc<BatchSlot>)>,
    planner: QueryPlanner,
    /// Names the query reads that inferred records may lack: they read as NULL.
    nulls: Mutex<BTreeSet<String>>,
    /// Physical plans by the source a batch comes from and the batch's schema, and the
    /// columns (nested fields included) of those schemas, which their size follows.
    plans: Mutex<PlanCache>,
    /// The user's session as plans run in it (see [`executor`]).
    executor: SessionState,
    task: Arc<TaskContext>,
    /// The query's aggregate, when it has one: the plans above run on its rows.
    aggregate: Option<StreamAggregate>,
    /// The tables it joins its stream with, read as of processing time.
    lookups: Lookups,
    /// Whether it joins streams: a batch of one source joins the rows the others delivered
    /// before it (see [`super::stream_join`]).
    joins_streams: bool,
    /// The time bound of its join between streams, when its condition sets one.
    time_bound: Option<TimeBound>,
    /// The keys of its join between streams, when it joins two on equal keys.
    join_keys: Option<Arc<JoinKeys>>,
}

/// Plans by source and batch schema, and the columns of those schemas in all.
#[derive(Default)]
struct PlanCache {
    plans: HashMap<(String, SchemaRef), Arc<Plan>>,
    columns: usize,
}

/// The plan for batches of one schema from one source.
struct Plan {
    exec: std::result::Result<Arc<dyn ExecutionPlan>, String>,
    /// Whether the plan's last column is each output row's input row ([`numbered`]).
    numbered: bool,
    /// The source's schema as planned: the batch's, with NULL columns for names it lacks.
    input: SchemaRef,
    /// Whether it joins (and so keeps state from one run to the next, to be reset).
    joins: bool,
}

/// At most this many plans are kept, for schemas of at most [`MAX_PLANNED_COLUMNS`] columns
/// in all (a plan's size follows its columns'); beyond either the cache starts afresh.
const MAX_PLANS: usize = 1024;
const MAX_PLANNED_COLUMNS: usize = 1 << 18;

/// The columns of `fields`, nested fields included.
fn columns_in(fields: &datafusion::arrow::datatypes::Fields) -> usize {
    use datafusion::arrow::datatypes::DataType;
    fields
        .iter()
        .map(|f| {
            1 + match f.data_type() {
                DataType::Struct(inner) => columns_in(inner),
                DataType::List(e) | DataType::LargeList(e) | DataType::FixedSizeList(e, _) => {
                    columns_in(&vec![e.clone()].into())
                }
                DataType::Map(e, _) => columns_in(&vec![e.clone()].into()),
                _ => 0,
            }
        })
        .sum()
}

/// The sources a logical plan reads, by name.
pub fn sources_of(plan: &LogicalPlan) -> BTreeMap<String, SourceRef> {
    let mut out = BTreeMap::new();
    let _ = plan.apply(|node| {
        if let LogicalPlan::TableScan(scan) = node
            && let Some(source) = source_table(scan)
        {
            out.insert(source.name.clone(), source);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    out
}

/// The source a table scan reads, if it reads one.
fn source_table(scan: &TableScan) -> Option<SourceRef> {
    let provider = datafusion::datasource::source_as_provider(&scan.source).ok()?;
    let table = provider.as_any().downcast_ref::<SourceTable>()?;
    Some(table.source().clone())
}

/// Whether a table scan reads a source's batches.
fn reads_slot(scan: &TableScan) -> bool {
    datafusion::datasource::source_as_provider(&scan.source)
        .is_ok_and(|p| p.as_any().downcast_ref::<SlotTable>().is_some())
}

/// Fail unless every node of `plan` can run on one batch at a time.
fn check_row_wise(plan: &LogicalPlan) -> Result<()> {
    let mut bad: Option<String> = None;
    let _ = plan.apply(|node| {
        let ok = match node {
            LogicalPlan::Projection(_)
            | LogicalPlan::Filter(_)
            | LogicalPlan::SubqueryAlias(_)
            | LogicalPlan::Union(_)
            | LogicalPlan::Unnest(_) => true,
            LogicalPlan::Join(join) => {
                if let Some(why) = unsupported_join(join) {
                    bad = Some(why);
                    return Ok(TreeNodeRecursion::Stop);
                }
                true
            }
            LogicalPlan::TableScan(scan) => {
                if !reads_slot(scan) {
                    bad = Some(format!(
                        "it reads table {}, which is not a source; a continuous INSERT reads \
                         sources (CREATE SOURCE), and tables only to join with them",
                        scan.table_name
                    ));
                    return Ok(TreeNodeRecursion::Stop);
                }
                true
            }
            _ => false,
        };
        if !ok {
            let what = node.display().to_string();
            let op = what.split(':').next().unwrap_or(&what).trim().to_string();
            bad = Some(format!(
                "'{op}' needs the whole stream; a continuous INSERT runs row by row \
                 (projections, filters, functions, CAST, CASE, UNION ALL, joins) with one \
                 aggregate (GROUP BY, over windows: FROM TUMBLE(source, time_column, size) ... \
                 GROUP BY window_start, window_end, ...) or one top-N (ROW_NUMBER() OVER \
                 (PARTITION BY ... ORDER BY ...) AS rn ... WHERE rn <= N) at most, last"
            ));
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    match bad {
        Some(why) => Err(Error::Plan(format!(
            "this INSERT cannot run continuously: {why}"
        ))),
        None => Ok(()),
    }
}

impl ContinuousQuery {
    /// Plan the statement `planner` holds (a continuous `INSERT`, or the `SELECT` of a routed
    /// one) over `sources`, the session's sources; returns the query and the logical plan of
    /// the statement for the sources' declared schemas.
    pub async fn try_new(
        planner: QueryPlanner,
        sources: &BTreeMap<String, SourceRef>,
    ) -> Result<(Self, LogicalPlan)> {
        let executor = executor(planner.state());
        let refresh = floe_options(&executor).lookup_refresh;
        let mut query = Self {
            sources: sources
                .iter()
                .map(|(n, d)| (n.clone(), (d.clone(), Arc::new(BatchSlot::default()))))
                .collect(),
            planner,
            nulls: Mutex::default(),
            plans: Mutex::default(),
            task: executor.task_ctx(),
            executor,
            aggregate: None,
            lookups: Lookups::new(refresh),
            joins_streams: false,
            time_bound: None,
            join_keys: None,
        };
        let schemas = query
            .sources
            .iter()
            .map(|(n, (d, _))| (n.clone(), d.schema.clone()))
            .collect();
        let (planned, _) = query.plan_logical(&schemas).await?;
        crate::sql::windows::check_sessions(&planned.plan)?;
        check_row_wise(per_batch(&planned.plan))?;
        query.joins_streams = check_stream_joins(per_batch(&planned.plan), &query.sources)?;
        if query.joins_streams {
            query.time_bound = time_bound_of(per_batch(&planned.plan), &query.sources);
            query.join_keys =
                join_keys_of(per_batch(&planned.plan), &query.sources, &query.executor);
        }
        query.sources.retain(|n, _| planned.sources.contains(n));
        if query.sources.is_empty() {
            return Err(Error::Plan(
                "a continuous INSERT must read a source (CREATE SOURCE)".to_string(),
            ));
        }
        // Plan the declared schemas now: a plan that fails fails the submission.
        for (name, (def, _)) in &query.sources {
            if let Err(why) = &query.plan_for(name, &def.schema).await?.exec {
                return Err(Error::Plan(format!(
                    "this INSERT cannot run continuously: {why}"
                )));
            }
        }
        let rows = rows_of(&planned.plan);
        if stateful_node(rows).is_some() {
            query.aggregate = Some(query.aggregate_of(rows).await?);
        }
        Ok((query, planned.plan))
    }

    /// The aggregate of `rows` (the statement's rows), over the rows of the
    /// per-batch plan for the sources' declared schemas.
    async fn aggregate_of(&self, rows: &LogicalPlan) -> Result<StreamAggregate> {
        let (name, (def, _)) = self
            .sources
            .iter()
            .next()
            .ok_or_else(|| Error::Internal("a windowed query without sources".into()))?;
        let plan = self.plan_for(name, &def.schema).await?;
        let exec = plan.exec.clone().map_err(Error::Plan)?;
        let mut input = exec.schema();
        if plan.numbered {
            let last = input.fields().len() - 1;
            input = Arc::new(
                input
                    .project(&(0..last).collect::<Vec<_>>())
                    .map_err(|e| Error::Internal(format!("the windowed rows: {e}")))?,
            );
        }
        let options = floe_options(&self.executor);
        let aggregate = StreamAggregate::try_new(
            rows,
            input,
            &self.executor,
            i64::try_from(options.allowed_lateness.as_micros()).unwrap_or(i64::MAX),
            usize::try_from(options.state_memory).unwrap_or(usize::MAX),
        )
        .await?;
        for def in self.sources.values().map(|(d, _)| d) {
            if aggregate.is_windowed() && !aggregate.is_processing_time() && def.watermark.is_none()
            {
                return Err(Error::Plan(format!(
                    "this INSERT cannot run continuously: its windows close when event time \
                     passes them, and source {} declares no event time: declare it with \
                     WATERMARK FOR column AS column - INTERVAL '5' SECOND",
                    def.name
                )));
            }
        }
        Ok(aggregate)
    }

    /// The streaming plan, for `EXPLAIN`: where rows are emitted, the state kept, the plan
    /// each batch runs through, and the sources with their watermarks.
    pub async fn explain(&self) -> Result<String> {
        let mut out = String::new();
        let indent = match &self.aggregate {
            Some(w) => {
                out.push_str(&w.explain());
                "    "
            }
            None => {
                out.push_str("Emit: each batch's rows, as it is read\n");
                "  "
            }
        };
        for (name, (def, _)) in &self.sources {
            let plan = self.plan_for(name, &def.schema).await?;
            let exec = plan.exec.clone().map_err(Error::Plan)?;
            out.push_str(&format!("{indent}PerBatch: source={name}\n"));
            for line in displayable(exec.as_ref()).indent(true).to_string().lines() {
                out.push_str(&format!("{indent}  {line}\n"));
            }
        }
        match (&self.time_bound, self.joins_streams) {
            (Some(b), _) => {
                let show = |v: Option<i64>| v.map_or("open".to_string(), |us| format!("{us}us"));
                out.push_str(&format!(
                    "JoinState: interval join, {}.{} - {}.{} between {} and {}: each source's \
                     rows kept (and saved with each checkpoint) until the other source's \
                     watermark has passed their reach; records behind their own source's \
                     watermark: dead letters ('late')\n",
                    b.left.0,
                    b.left.1,
                    b.right.0,
                    b.right.1,
                    show(b.lower),
                    show(b.upper)
                ));
            }
            (None, true) => out.push_str(match &self.join_keys {
                Some(_) => {
                    "JoinState: every row of each joined source, kept for the life of the job \
                     (beyond state.memory-budget on local disk) and saved with each checkpoint; \
                     a batch joins the other source's kept rows of its key hashes\n"
                }
                None => {
                    "JoinState: every row of each joined source, kept for the life of the job \
                     and saved with each checkpoint; a batch joins the other sources' kept rows\n"
                }
            }),
            (None, false) => {}
        }
        for name in self.lookups.names() {
            out.push_str(&format!(
                "Lookup: {name}, read whole every {:?} (lookup.refresh-interval)\n",
                self.lookups.interval()
            ));
        }
        for def in self.sources.values().map(|(d, _)| d) {
            let watermark = match &def.watermark {
                Some(w) => format!("watermark={} (event time {})", w.expr, w.column),
                None => "no watermark".to_string(),
            };
            out.push_str(&format!(
                "Source: {}, connector={}, {watermark}\n",
                def.name,
                def.connector_name()
            ));
        }
        Ok(out)
    }

    /// The time bound of the query's join between streams, if its condition sets one.
    pub fn time_bound(&self) -> Option<&TimeBound> {
        self.time_bound.as_ref()
    }

    /// Whether the query joins streams (and [`Self::run`] needs the rows each delivered).
    pub fn joins_streams(&self) -> bool {
        self.joins_streams
    }

    /// The keys of its join between streams, when it joins two on equal keys.
    pub fn join_keys(&self) -> Option<Arc<JoinKeys>> {
        self.join_keys.clone()
    }

    /// The bytes of state (`state.memory-budget`) a stateful step holds in memory.
    pub fn state_budget(&self) -> usize {
        usize::try_from(floe_options(&self.executor).state_memory).unwrap_or(usize::MAX)
    }

    /// Whether the job copies its state beside its tables at each checkpoint
    /// (`state.lake-copy`).
    pub fn state_lake_copy(&self) -> bool {
        floe_options(&self.executor).state_lake_copy
    }

    /// The query's aggregate, when it has one: [`Self::run`] gives its input rows.
    pub fn aggregate(&self) -> Option<&StreamAggregate> {
        self.aggregate.as_ref()
    }

    /// The logical plan for sources read as `schemas`, with NULL columns for the names the
    /// query reads that an inferred source lacks; returns the planned input schemas too.
    async fn plan_logical(
        &self,
        schemas: &BTreeMap<String, SchemaRef>,
    ) -> Result<(Planned, BTreeMap<String, SchemaRef>)> {
        let inferred = self.sources.values().any(|(d, _)| d.is_inferred());
        loop {
            let nulls = self.nulls.lock().map(|n| n.clone()).unwrap_or_default();
            let mut inputs = BTreeMap::new();
            let mut tables = BTreeMap::new();
            for (name, (def, slot)) in &self.sources {
                let mut schema = schemas.get(name).unwrap_or(&def.schema).clone();
                if def.is_inferred() {
                    schema = with_null_columns(&schema, &nulls);
                }
                let table: Arc<dyn TableProvider> =
                    Arc::new(SlotTable::new(schema.clone(), slot.clone()));
                tables.insert(name.clone(), table);
                inputs.insert(name.clone(), schema);
            }
            match self.planner.plan(tables).await {
                Ok(mut planned) => {
                    planned.plan = self.lookups.wrap(planned.plan)?;
                    planned.plan = merge_aggregates(planned.plan)?;
                    planned.plan = prune_below_aggregates(planned.plan)?;
                    return Ok((planned, inputs));
                }
                Err(e) => match missing_column(&e) {
                    Some(name) if inferred && !nulls.contains(&name) => {
                        if let Ok(mut n) = self.nulls.lock() {
                            n.insert(name);
                        }
                    }
                    _ => return Err(e),
                },
            }
        }
    }

    /// The plan for batches of `schema` from `source`, planned on first use.
    async fn plan_for(&self, source: &str, schema: &SchemaRef) -> Result<Arc<Plan>> {
        let key = (source.to_string(), schema.clone());
        if let Some(p) = self
            .plans
            .lock()
            .ok()
            .and_then(|c| c.plans.get(&key).cloned())
        {
            return Ok(p);
        }
        let mut schemas: BTreeMap<String, SchemaRef> = self
            .sources
            .iter()
            .map(|(n, (d, _))| (n.clone(), d.schema.clone()))
            .collect();
        schemas.insert(source.to_string(), schema.clone());
        // A schema the query cannot be planned for is remembered as such: its records are
        // dead-lettered one batch at a time without planning again for each.
        let plan = Arc::new(match self.plan_logical(&schemas).await {
            Ok((planned, inputs)) => {
                let rows = per_batch(&planned.plan);
                // A plan whose rows cannot be numbered (a column of the same name) runs
                // as written: its rows' records are then unknown.
                // Joining streams, only the batch's own rows are numbered: the other
                // sources' are kept rows.
                let only = self
                    .joins_streams
                    .then(|| self.sources.get(source).map(|(_, slot)| slot.clone()))
                    .flatten();
                let (rows, numbered) = match numbered(rows.clone(), only.as_ref()) {
                    Ok(plan) => (plan, true),
                    Err(_) => (rows.clone(), false),
                };
                let exec = match check_row_wise(&rows) {
                    Ok(()) => self
                        .executor
                        .create_physical_plan(&rows)
                        .await
                        .map_err(|e| Error::from(e).to_string()),
                    Err(e) => Err(e.to_string()),
                };
                Plan {
                    joins: exec.as_ref().is_ok_and(|e| has_join(e.as_ref())),
                    exec,
                    numbered,
                    input: inputs[source].clone(),
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::User | ErrorKind::Record) => Plan {
                exec: Err(e.to_string()),
                numbered: false,
                input: schema.clone(),
                joins: false,
            },
            Err(e) => return Err(e),
        });
        if let Ok(mut cache) = self.plans.lock() {
            let these = columns_in(schema.fields());
            if cache.plans.len() >= MAX_PLANS || cache.columns + these > MAX_PLANNED_COLUMNS {
                cache.plans.clear();
                cache.columns = 0;
            }
            cache.columns += these;
            cache.plans.insert(key, plan.clone());
        }
        Ok(plan)
    }

    /// The session the query's plans run in.
    pub fn state(&self) -> &SessionState {
        &self.executor
    }

    /// The sources the query reads, by name.
    pub fn sources(&self) -> impl Iterator<Item = &SourceRef> {
        self.sources.values().map(|(d, _)| d)
    }

    /// Run the query on `batch` from source `source`: its rows (for a windowed query, the
    /// rows its aggregate takes), as one batch, and which row of `batch` each came from when
    /// known. A batch of a schema the query cannot be
    /// planned for fails with why (its records are dead-lettered).
    pub async fn run(
        &self,
        source: &str,
        batch: RecordBatch,
        kept: Option<&JoinBuffers>,
    ) -> Result<Output> {
        let (_, slot) = self
            .sources
            .get(source)
            .ok_or_else(|| Error::Internal(format!("query has no source '{source}'")))?;
        let plan = self.plan_for(source, &batch.schema()).await?;
        self.lookups.refresh(&self.executor).await?;
        let exec = plan.exec.clone().map_err(|why| {
            Error::Record(Reject::new(format!(
                "the query cannot run on these records: {why}"
            )))
        })?;
        // A join keeps what it built from one run for the next: each run starts it afresh.
        let exec = if plan.joins {
            reset_plan_states(exec)?
        } else {
            exec
        };
        let batch = if plan.input.fields().len() > batch.num_columns() {
            add_null_columns(&plan.input, batch)?
        } else {
            batch
        };
        let others = || self.sources.iter().filter(|(name, _)| *name != source);
        if let (true, Some(kept)) = (self.joins_streams, kept) {
            // The other source's kept rows that may join the batch's (of its key hashes).
            let probe = kept.probe(source, &batch)?;
            for (name, (_, other)) in others() {
                other.set_all(kept.candidates(name, probe.as_ref())?);
            }
        }
        slot.set(batch);
        let schema = exec.schema();
        let out = collect(exec, self.task.clone()).await;
        slot.clear();
        if self.joins_streams {
            for (_, (_, other)) in others() {
                other.clear();
            }
        }
        let out = out.map_err(Error::from_execution)?;
        let joined = concat_batches(&schema, &out)
            .map_err(|e| Error::Internal(format!("joining query output: {e}")))?;
        if !plan.numbered {
            return Ok(Output {
                rows: joined,
                inputs: None,
            });
        }
        let last = joined.num_columns() - 1;
        let inputs = joined
            .column(last)
            .as_any()
            .downcast_ref::<UInt32Array>()
            .cloned()
            .ok_or_else(|| Error::Internal("the input-row column is not UInt32".to_string()))?;
        Ok(Output {
            rows: joined
                .project(&(0..last).collect::<Vec<_>>())
                .map_err(|e| Error::Internal(format!("dropping the input-row column: {e}")))?,
            inputs: Some(inputs),
        })
    }
}

/// What a query made of one batch.
pub struct Output {
    pub rows: RecordBatch,
    /// For each of `rows`, the row of the input batch it came from, when known.
    pub inputs: Option<UInt32Array>,
}

/// `plan` (row-wise, see [`check_row_wise`]) with one more column after each node's own,
/// [`INPUT_ROW`]: the row of the source batch each row comes from. Every source is read
/// numbered and every projection passes the column on.
fn numbered(plan: LogicalPlan, only: Option<&Arc<BatchSlot>>) -> Result<LogicalPlan> {
    let out = plan.transform_up(|node| {
        let node = match node {
            LogicalPlan::TableScan(scan) => {
                let Some(table) = datafusion::datasource::source_as_provider(&scan.source)
                    .ok()
                    .and_then(|p| {
                        p.as_any()
                            .downcast_ref::<SlotTable>()
                            .filter(|t| !t.is_lookup())
                            .filter(|t| only.is_none_or(|s| Arc::ptr_eq(s, t.slot())))
                            .map(SlotTable::numbered)
                    })
                else {
                    return Ok(Transformed::no(LogicalPlan::TableScan(scan)));
                };
                let width = table.schema().fields().len() - 1;
                let projection = scan.projection.map(|mut p| {
                    p.push(width);
                    p
                });
                LogicalPlan::TableScan(TableScan::try_new(
                    scan.table_name,
                    provider_as_source(Arc::new(table)),
                    projection,
                    scan.filters,
                    scan.fetch,
                )?)
            }
            LogicalPlan::Projection(Projection {
                mut expr, input, ..
            }) => {
                let schema = input.schema();
                let Some(i) = schema.fields().iter().position(|f| f.name() == INPUT_ROW) else {
                    return Err(datafusion::error::DataFusionError::Plan(
                        "the query's rows could not be numbered".into(),
                    ));
                };
                let (qualifier, field) = schema.qualified_field(i);
                expr.push(Expr::Column(Column::from((qualifier, field))));
                LogicalPlan::Projection(Projection::try_new(expr, input)?)
            }
            other => other.recompute_schema()?,
        };
        Ok(Transformed::yes(node))
    })?;
    let plan = out.data;
    let schema = plan.schema();
    let last = schema.fields().last().map(|f| f.name().as_str());
    if last != Some(INPUT_ROW) {
        return Err(Error::Internal(
            "the query's rows could not be numbered".to_string(),
        ));
    }
    Ok(plan)
}

/// Where continuous plans are planned and run: the user's session `state` (its settings,
/// `SET` included, its memory pool and functions), with one partition, as the plan is
/// re-executed per batch, which row-wise operators allow.
pub fn executor(state: &SessionState) -> SessionState {
    let mut config = state
        .config()
        .clone()
        .with_target_partitions(1)
        .with_coalesce_batches(false)
        // The catalogs are the session's own, shared: a new default one would replace its.
        .with_create_default_catalog_and_schema(false);
    // A filter one run's join derives from its build side must not narrow the next run's.
    let optimizer = &mut config.options_mut().optimizer;
    optimizer.enable_dynamic_filter_pushdown = false;
    optimizer.enable_join_dynamic_filter_pushdown = false;
    optimizer.enable_topk_dynamic_filter_pushdown = false;
    optimizer.enable_aggregate_dynamic_filter_pushdown = false;
    // Sessions are merged in the aggregate's state, not by the batch rule.
    let rules = state
        .analyzer()
        .rules
        .iter()
        .filter(|r| r.name() != crate::sql::windows::SessionWindows::NAME)
        .cloned()
        .collect();
    SessionStateBuilder::new_from_existing(state.clone())
        .with_config(config)
        .with_analyzer_rules(rules)
        .build()
}

/// Whether `plan` (the per-batch part of a query) joins streams: an inner join with sources
/// on both sides. Fails when such a query reads a source twice, reads one with inferred
/// columns, or takes the union of sources (each batch's rows would join the other branches'
/// kept rows).
fn check_stream_joins(
    plan: &LogicalPlan,
    sources: &BTreeMap<String, (SourceRef, Arc<BatchSlot>)>,
) -> Result<bool> {
    use super::lookup::reads_source;
    let mut joins = false;
    let mut unions = false;
    let _ = plan.apply(|node| {
        match node {
            LogicalPlan::Join(j) if reads_source(&j.left) && reads_source(&j.right) => joins = true,
            LogicalPlan::Union(u) if u.inputs.iter().filter(|i| reads_source(i)).count() > 1 => {
                unions = true
            }
            _ => {}
        }
        Ok(TreeNodeRecursion::Continue)
    });
    if !joins {
        return Ok(false);
    }
    let fail = |why: String| {
        Err(Error::Plan(format!(
            "this INSERT cannot run continuously: it joins streams, and {why}"
        )))
    };
    if unions {
        return fail("takes the union of sources too; join the sources, then union".into());
    }
    let mut scans: BTreeMap<String, usize> = BTreeMap::new();
    let _ = plan.apply(|node| {
        if let LogicalPlan::TableScan(scan) = node
            && let Ok(p) = datafusion::datasource::source_as_provider(&scan.source)
            && let Some(t) = p.as_any().downcast_ref::<SlotTable>()
            && let Some((name, _)) = sources.iter().find(|(_, (_, s))| Arc::ptr_eq(s, t.slot()))
        {
            *scans.entry(name.clone()).or_default() += 1;
        }
        Ok(TreeNodeRecursion::Continue)
    });
    if let Some((name, _)) = scans.iter().find(|(_, n)| **n > 1) {
        return fail(format!(
            "reads source {name} twice; a stream joins another stream, not itself"
        ));
    }
    if let Some((name, _)) = sources.iter().find(|(_, (d, _))| d.is_inferred()) {
        return fail(format!(
            "source {name} infers its columns; joined streams declare theirs"
        ));
    }
    Ok(true)
}

/// The time bound of the join between streams in `plan`, when its condition sets one.
fn time_bound_of(
    plan: &LogicalPlan,
    sources: &BTreeMap<String, (SourceRef, Arc<BatchSlot>)>,
) -> Option<TimeBound> {
    use super::lookup::reads_source;
    let source_of =
        |side: &LogicalPlan| side_source(side, sources).map(|(name, schema, _)| (name, schema));
    let mut bound = None;
    let _ = plan.apply(|node| {
        if let LogicalPlan::Join(j) = node
            && reads_source(&j.left)
            && reads_source(&j.right)
        {
            bound = TimeBound::of(j, source_of);
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    bound
}

/// The one source `side` (of a join between streams) reads: its name, schema, and the name
/// its scan gives its columns.
fn side_source(
    side: &LogicalPlan,
    sources: &BTreeMap<String, (SourceRef, Arc<BatchSlot>)>,
) -> Option<(String, SchemaRef, datafusion::common::TableReference)> {
    let mut found = Vec::new();
    let _ = side.apply(|node| {
        if let LogicalPlan::TableScan(scan) = node
            && let Ok(p) = datafusion::datasource::source_as_provider(&scan.source)
            && let Some(t) = p.as_any().downcast_ref::<SlotTable>()
            && let Some((name, (def, _))) =
                sources.iter().find(|(_, (_, s))| Arc::ptr_eq(s, t.slot()))
        {
            found.push((name.clone(), def.schema.clone(), scan.table_name.clone()));
        }
        Ok(TreeNodeRecursion::Continue)
    });
    (found.len() == 1).then(|| found.remove(0))
}

/// The keys of the join between two streams in `plan` (the per-batch part of a query), when
/// it joins them on equal keys that are expressions of each source's own columns: each side's
/// key expressions over its source's rows, of the types the join compares them as.
fn join_keys_of(
    plan: &LogicalPlan,
    sources: &BTreeMap<String, (SourceRef, Arc<BatchSlot>)>,
    state: &SessionState,
) -> Option<Arc<JoinKeys>> {
    use super::lookup::reads_source;
    use datafusion::logical_expr::ExprSchemable;
    // Types coerced, as the join compares its keys.
    let plan = state
        .analyzer()
        .execute_and_check(plan.clone(), state.config_options(), |_, _| {})
        .ok()?;
    let mut joins = Vec::new();
    let _ = plan.apply(|node| {
        if let LogicalPlan::Join(j) = node
            && reads_source(&j.left)
            && reads_source(&j.right)
        {
            joins.push(j.clone());
        }
        Ok(TreeNodeRecursion::Continue)
    });
    let [join] = joins.as_slice() else {
        return None;
    };
    let left = side_source(&join.left, sources)?;
    let right = side_source(&join.right, sources)?;
    if left.0 == right.0 {
        return None;
    }
    // The equal keys: the join's own, and the equalities of its condition between a side's
    // expression and the other's (SQL's ON is planned as a condition).
    let within = |side: &LogicalPlan, e: &Expr| {
        let refs = e.column_refs();
        !refs.is_empty() && refs.iter().all(|c| side.schema().has_column(c))
    };
    let mut pairs = join.on.clone();
    if let Some(filter) = &join.filter {
        for e in datafusion::logical_expr::utils::split_conjunction(filter) {
            if let Expr::BinaryExpr(b) = e
                && b.op == datafusion::logical_expr::Operator::Eq
            {
                let (l, r) = (b.left.as_ref(), b.right.as_ref());
                if within(&join.left, l) && within(&join.right, r) {
                    pairs.push((l.clone(), r.clone()));
                } else if within(&join.left, r) && within(&join.right, l) {
                    pairs.push((r.clone(), l.clone()));
                }
            }
        }
    }
    if pairs.is_empty() {
        return None;
    }
    let mut by_source: BTreeMap<String, Vec<_>> = BTreeMap::new();
    let mut types = Vec::new();
    for (l, r) in &pairs {
        let t = l.get_type(join.left.schema()).ok()?;
        if r.get_type(join.right.schema()).ok()? != t {
            return None;
        }
        types.push(t);
        for (side, e, (name, schema, scan)) in [(&join.left, l, &left), (&join.right, r, &right)] {
            let e = crate::sql::windows::origin(side, e.clone());
            // Only the source's own columns, as its scan names them.
            if e.column_refs().iter().any(|c| {
                c.relation.as_ref() != Some(scan) || schema.field_with_name(&c.name).is_err()
            }) {
                return None;
            }
            let e = e
                .transform(|e| match e {
                    Expr::Column(c) => Ok(Transformed::yes(Expr::Column(Column::new_unqualified(
                        c.name,
                    )))),
                    e => Ok(Transformed::no(e)),
                })
                .ok()?
                .data;
            let df = datafusion::common::DFSchema::try_from(schema.as_ref().clone()).ok()?;
            let physical =
                datafusion::physical_expr::create_physical_expr(&e, &df, state.execution_props())
                    .ok()?;
            by_source.entry(name.clone()).or_default().push(physical);
        }
    }
    Some(Arc::new(JoinKeys::new(by_source, types)))
}

/// Whether `plan` has a join in it.
fn has_join(plan: &dyn ExecutionPlan) -> bool {
    plan.name().contains("Join") || plan.children().iter().any(|c| has_join(c.as_ref()))
}

/// floe's settings in `state`.
fn floe_options(state: &SessionState) -> crate::config::FloeOptions {
    state
        .config()
        .options()
        .extensions
        .get::<crate::config::FloeOptions>()
        .cloned()
        .unwrap_or_default()
}

/// The rows a statement's plan produces: an INSERT's input, or the query itself.
fn rows_of(plan: &LogicalPlan) -> &LogicalPlan {
    match plan {
        LogicalPlan::Dml(dml) => &dml.input,
        other => other,
    }
}

/// The part of a statement's plan that runs on each batch: its rows, or for a stateful
/// query the rows its aggregate or top-N takes.
fn per_batch(plan: &LogicalPlan) -> &LogicalPlan {
    let rows = rows_of(plan);
    match stateful_node(rows).and_then(|node| node.inputs().into_iter().next()) {
        Some(input) => input,
        None => rows,
    }
}

/// `schema` with a NULL-typed column for each of `names` it lacks.
fn with_null_columns(schema: &SchemaRef, names: &BTreeSet<String>) -> SchemaRef {
    let missing: Vec<Field> = names
        .iter()
        .filter(|n| schema.field_with_name(n).is_err())
        .map(|n| Field::new(n, DataType::Null, true))
        .collect();
    if missing.is_empty() {
        return schema.clone();
    }
    let mut fields: Vec<FieldRef> = schema.fields().iter().cloned().collect();
    fields.extend(missing.into_iter().map(Arc::new));
    Arc::new(Schema::new(fields))
}

/// `batch` with NULL columns appended up to `schema` (which extends the batch's).
fn add_null_columns(schema: &SchemaRef, batch: RecordBatch) -> Result<RecordBatch> {
    let n = batch.num_rows();
    let mut columns = batch.columns().to_vec();
    for f in &schema.fields()[columns.len()..] {
        columns.push(new_null_array(f.data_type(), n));
    }
    let options = RecordBatchOptions::new().with_row_count(Some(n));
    RecordBatch::try_new_with_options(schema.clone(), columns, &options)
        .map_err(|e| Error::Internal(format!("filling absent columns: {e}")))
}
