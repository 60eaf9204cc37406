//! Planning a continuous query's SQL for the schema its records have now.
//!
//! A source with inferred columns has no fixed schema: each record shape is its own Arrow
//! schema. The query's SQL is planned again for each new shape, with DataFusion's own planner, over a view of the session's catalogs in
//! which each source reads as a [`super::slot::SlotTable`] of that shape. Names the query reads that a
//! shape lacks read as NULL: planning adds them as NULL-typed columns.

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::catalog::{CatalogProvider, CatalogProviderList, SchemaProvider, TableProvider};
use datafusion::common::SchemaError;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::session_state::SessionState;
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder};
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{
    Expr as SqlExpr, ExprWithAlias, Query, Statement as SqlStatement,
};

use super::source_table::SourceTable;
use crate::error::{Error, Result};
use crate::sink::route::ROUTE_COLUMN;

/// The SQL of a continuous query and the session it was written in.
#[derive(Debug, Clone)]
pub struct QueryPlanner {
    state: SessionState,
    statement: DFStatement,
    /// A routed job's `ROUTE BY` expression, over the statement's output columns: planned
    /// as one more column, [`ROUTE_COLUMN`].
    route: Option<SqlExpr>,
}

/// A plan of the query and the sources it reads.
pub struct Planned {
    pub plan: LogicalPlan,
    pub sources: BTreeSet<String>,
}

impl QueryPlanner {
    pub fn new(state: SessionState, statement: DFStatement) -> Self {
        Self {
            state,
            statement,
            route: None,
        }
    }

    /// A planner of `query`'s rows with the route of each, `route`, as the column
    /// [`ROUTE_COLUMN`].
    pub fn routed(state: SessionState, query: Box<Query>, route: SqlExpr) -> Self {
        Self {
            state,
            statement: DFStatement::Statement(Box::new(SqlStatement::Query(query))),
            route: Some(route),
        }
    }

    /// The statement planned.
    pub fn statement(&self) -> &DFStatement {
        &self.statement
    }

    /// The session the statement was written in.
    pub fn state(&self) -> &SessionState {
        &self.state
    }

    /// Plan the statement with source `s` reading as `tables[s]`.
    pub async fn plan(&self, tables: BTreeMap<String, Arc<dyn TableProvider>>) -> Result<Planned> {
        let used = Arc::new(Mutex::new(BTreeSet::new()));
        let overlay = Arc::new(Overlay {
            tables: Arc::new(tables),
            used: used.clone(),
        });
        let catalogs = Arc::new(OverlayCatalogs {
            inner: self.state.catalog_list().clone(),
            overlay,
        });
        let state = SessionStateBuilder::new_from_existing(self.state.clone())
            .with_catalog_list(catalogs)
            .build();
        let mut plan = state.statement_to_plan(self.statement.clone()).await?;
        if let Some(route) = &self.route {
            let route = state.create_logical_expr_from_sql_expr(
                ExprWithAlias {
                    expr: route.clone(),
                    alias: None,
                },
                plan.schema(),
            )?;
            let mut columns: Vec<Expr> = plan
                .schema()
                .columns()
                .into_iter()
                .map(Expr::Column)
                .collect();
            columns.push(route.alias(ROUTE_COLUMN));
            plan = LogicalPlanBuilder::from(plan).project(columns)?.build()?;
        }
        let sources = used.lock().map(|u| u.clone()).unwrap_or_default();
        Ok(Planned { plan, sources })
    }
}

/// The column a planning error says does not exist, if that is the error.
pub fn missing_column(e: &Error) -> Option<String> {
    let Error::DataFusion(e) = e else {
        return None;
    };
    match e.find_root() {
        DataFusionError::SchemaError(e, _) => match e.as_ref() {
            SchemaError::FieldNotFound { field, .. } => Some(field.name.clone()),
            _ => None,
        },
        _ => None,
    }
}

/// The replacement tables, and which of them planning used.
#[derive(Debug)]
struct Overlay {
    tables: Arc<BTreeMap<String, Arc<dyn TableProvider>>>,
    used: Arc<Mutex<BTreeSet<String>>>,
}

impl Overlay {
    /// `table`, or its replacement when it is a source being replaced.
    fn resolve(&self, table: Arc<dyn TableProvider>) -> Arc<dyn TableProvider> {
        let Some(source) = table.as_any().downcast_ref::<SourceTable>() else {
            return table;
        };
        let name = &source.source().name;
        match self.tables.get(name) {
            Some(t) => {
                if let Ok(mut used) = self.used.lock() {
                    used.insert(name.clone());
                }
                t.clone()
            }
            None => table,
        }
    }
}

#[derive(Debug)]
struct OverlayCatalogs {
    inner: Arc<dyn CatalogProviderList>,
    overlay: Arc<Overlay>,
}

impl CatalogProviderList for OverlayCatalogs {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn register_catalog(
        &self,
        name: String,
        catalog: Arc<dyn CatalogProvider>,
    ) -> Option<Arc<dyn CatalogProvider>> {
        self.inner.register_catalog(name, catalog)
    }

    fn catalog_names(&self) -> Vec<String> {
        self.inner.catalog_names()
    }

    fn catalog(&self, name: &str) -> Option<Arc<dyn CatalogProvider>> {
        let inner = self.inner.catalog(name)?;
        Some(Arc::new(OverlayCatalog {
            inner,
            overlay: self.overlay.clone(),
        }))
    }
}

#[derive(Debug)]
struct OverlayCatalog {
    inner: Arc<dyn CatalogProvider>,
    overlay: Arc<Overlay>,
}

impl CatalogProvider for OverlayCatalog {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema_names(&self) -> Vec<String> {
        self.inner.schema_names()
    }

    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        let inner = self.inner.schema(name)?;
        Some(Arc::new(OverlaySchema {
            inner,
            overlay: self.overlay.clone(),
        }))
    }
}

#[derive(Debug)]
struct OverlaySchema {
    inner: Arc<dyn SchemaProvider>,
    overlay: Arc<Overlay>,
}

#[async_trait]
impl SchemaProvider for OverlaySchema {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn table_names(&self) -> Vec<String> {
        self.inner.table_names()
    }

    async fn table(&self, name: &str) -> DFResult<Option<Arc<dyn TableProvider>>> {
        Ok(self
            .inner
            .table(name)
            .await?
            .map(|t| self.overlay.resolve(t)))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.inner.table_exist(name)
    }
}
