//! Sources: `CREATE SOURCE`, `DROP SOURCE`, `SHOW SOURCES`, `DESCRIBE SOURCE`, and
//! planning over previews of sources whose columns are inferred.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::catalog::TableProvider;
use datafusion::datasource::MemTable;
use datafusion::execution::session_state::SessionState;
use datafusion::sql::parser::Statement as DFStatement;

use super::columns::arrow_schema_from_columns;
use super::{COLUMN_COLUMNS, Output, SOURCE_COLUMNS, Session, string_rows, unregister};
use crate::connector::WatermarkDef;
use crate::connector::{SourceDef, SourceRef};
use crate::error::{Error, Result};
use crate::schema::infer::{conform_preview, merge_schemas};
use crate::sql::Options;
use crate::sql::statement::*;
use crate::stream::source_table::preview;
use crate::stream::watermark::WatermarkTracker;
use crate::stream::{QueryPlanner, SourceTable};
use datafusion::logical_expr::LogicalPlan;

impl Session {
    pub(super) async fn create_source(&self, s: CreateSource) -> Result<Output> {
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
        let key: Vec<String> = s.primary_key.iter().map(|k| k.value.clone()).collect();
        let mut def = SourceDef::try_new(&s.name, declared, &key, options)?;
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

    pub(super) fn drop_source(&self, s: DropSource) -> Result<Output> {
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

    pub(super) fn show_sources(&self) -> Result<Output> {
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
        string_rows(SOURCE_COLUMNS, vec![names, connectors, columns])
    }

    pub(super) fn describe_source(&self, s: DescribeSource) -> Result<Output> {
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
        string_rows(COLUMN_COLUMNS, vec![a, b, c])
    }

    /// The declared sources, by name.
    pub(super) fn sources(&self) -> BTreeMap<String, SourceRef> {
        self.sources.read().map(|m| m.clone()).unwrap_or_default()
    }

    /// The declared sources `stmt` names.
    pub(super) fn sources_read_by(&self, stmt: &DFStatement) -> Vec<SourceRef> {
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
    pub(super) async fn plan_over_previews(
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
}
