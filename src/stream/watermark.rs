//! Watermarks: how far event time has progressed in a source.
//!
//! A source declared with `WATERMARK FOR ts AS ts - INTERVAL '5' SECOND` has, at any moment,
//! the watermark "the largest value of the expression over the records read so far". A job's
//! watermark is the smallest of its sources' (as in Flink); `SHOW JOBS` shows it. Row-wise
//! jobs do not wait on it (it tells how current the data in the lake is); windowed jobs emit
//! a window when it passes the window's end, and take a record as late when it had passed
//! the record's window before the record came (record by record, so that how records are
//! batched does not change which are late).

use std::sync::Arc;

use datafusion::arrow::array::{Array, RecordBatch, TimestampMicrosecondArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, TimeUnit};
use datafusion::error::DataFusionError;
use datafusion::execution::TaskContext;
use datafusion::execution::session_state::SessionState;
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::ExprWithAlias;

use super::slot::{BatchSlot, SlotTable};
use crate::connector::SourceDef;
use crate::error::{Error, Result};

/// Follows one source's watermark as batches go by.
pub struct WatermarkTracker {
    slot: Arc<BatchSlot>,
    plan: Arc<dyn ExecutionPlan>,
    task: Arc<TaskContext>,
    /// Microseconds since the epoch, once a record was seen.
    current: Option<i64>,
}

impl WatermarkTracker {
    /// A tracker for `source`, or `None` when it declares no watermark. Fails when the
    /// declaration does not fit the source's columns.
    pub async fn try_new(source: &SourceDef, state: &SessionState) -> Result<Option<Self>> {
        let Some(def) = &source.watermark else {
            return Ok(None);
        };
        let column = source.schema.field_with_name(&def.column).map_err(|_| {
            Error::Plan(format!(
                "WATERMARK FOR {}: source {} has no column '{}'",
                def.column, source.name, def.column
            ))
        })?;
        if !matches!(column.data_type(), DataType::Timestamp(_, _)) {
            return Err(Error::Plan(format!(
                "WATERMARK FOR {}: the column must be a TIMESTAMP, it is {}",
                def.column,
                column.data_type()
            )));
        }
        let slot = Arc::new(BatchSlot::default());
        let state = super::query::executor(state);
        let ctx = SessionContext::new_with_state(state.clone());
        let df = ctx.read_table(Arc::new(SlotTable::new(
            source.schema.clone(),
            slot.clone(),
        )))?;
        let invalid = |e: DataFusionError| {
            Error::Plan(format!(
                "WATERMARK FOR {} AS {}: {}",
                def.column,
                def.expr,
                Error::from(e)
            ))
        };
        let expr = state
            .create_logical_expr_from_sql_expr(
                ExprWithAlias {
                    expr: def.expr.clone(),
                    alias: None,
                },
                df.schema(),
            )
            .map_err(invalid)?;
        let df = df.select(vec![expr.alias("watermark")]).map_err(invalid)?;
        let ty = df.schema().field(0).data_type().clone();
        if !matches!(ty, DataType::Timestamp(_, _)) {
            return Err(Error::Plan(format!(
                "WATERMARK FOR {} AS {}: the expression must be a TIMESTAMP, it is {ty}",
                def.column, def.expr
            )));
        }
        let plan = df.create_physical_plan().await?;
        Ok(Some(Self {
            slot,
            plan,
            task: ctx.task_ctx(),
            current: None,
        }))
    }

    /// Advance the watermark past `batch`'s records; returns, for each record, the
    /// watermark before it (`i64::MIN` when there was none yet).
    pub async fn advance(&mut self, batch: &RecordBatch) -> Result<Vec<i64>> {
        if batch.num_rows() == 0 {
            return Ok(Vec::new());
        }
        self.slot.set(batch.clone());
        let out = collect(self.plan.clone(), self.task.clone()).await;
        self.slot.clear();
        let mut before = Vec::with_capacity(batch.num_rows());
        for b in out? {
            // The instants as they are (a zone changes how they show, not their values).
            let zone = match b.column(0).data_type() {
                DataType::Timestamp(_, zone) => zone.clone(),
                _ => None,
            };
            let micros = cast(
                b.column(0),
                &DataType::Timestamp(TimeUnit::Microsecond, zone),
            )
            .map_err(|e| Error::Internal(format!("watermark cast: {e}")))?;
            let a = micros
                .as_any()
                .downcast_ref::<TimestampMicrosecondArray>()
                .ok_or_else(|| Error::Internal("watermark cast".into()))?;
            for i in 0..a.len() {
                before.push(self.current.unwrap_or(i64::MIN));
                if a.is_valid(i) {
                    let v = a.value(i);
                    self.current = Some(self.current.map_or(v, |c| c.max(v)));
                }
            }
        }
        Ok(before)
    }

    /// Start from watermark `micros` (a checkpoint's).
    pub fn restore(&mut self, micros: i64) {
        self.current = Some(self.current.map_or(micros, |c| c.max(micros)));
    }

    /// The watermark in microseconds since the epoch, once a record was seen.
    pub fn current(&self) -> Option<i64> {
        self.current
    }
}
