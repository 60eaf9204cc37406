//! The input of a continuous query: a table whose rows are "the batch being processed".
//!
//! A continuous query is planned once, with each source replaced by a [`SlotTable`]. To run
//! the query on a batch, the batch is put in its source's [`BatchSlot`] and the cached
//! physical plan is executed again; the [`SlotExec`] leaf hands out whatever the slot holds.

use std::any::Any;
use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::Session;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::memory::MemoryStream;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};

/// The batches a source contributes to the current run of a query.
#[derive(Debug, Default)]
pub struct BatchSlot {
    batches: Mutex<Vec<RecordBatch>>,
}

impl BatchSlot {
    /// Put `batch` in the slot for the next execution.
    pub fn set(&self, batch: RecordBatch) {
        if let Ok(mut b) = self.batches.lock() {
            *b = vec![batch];
        }
    }

    /// Empty the slot.
    pub fn clear(&self) {
        if let Ok(mut b) = self.batches.lock() {
            b.clear();
        }
    }

    fn get(&self) -> Vec<RecordBatch> {
        self.batches.lock().map(|b| b.clone()).unwrap_or_default()
    }
}

/// A source as seen by the planner of a continuous query.
#[derive(Debug)]
pub struct SlotTable {
    schema: SchemaRef,
    slot: Arc<BatchSlot>,
}

impl SlotTable {
    pub fn new(schema: SchemaRef, slot: Arc<BatchSlot>) -> Self {
        Self { schema, slot }
    }
}

#[async_trait]
impl TableProvider for SlotTable {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let schema = match projection {
            Some(p) => Arc::new(self.schema.project(p)?),
            None => self.schema.clone(),
        };
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Ok(Arc::new(SlotExec {
            slot: self.slot.clone(),
            projection: projection.cloned(),
            schema,
            properties,
        }))
    }
}

/// Reads the batches in a slot, projected.
#[derive(Debug)]
pub struct SlotExec {
    slot: Arc<BatchSlot>,
    projection: Option<Vec<usize>>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
}

impl DisplayAs for SlotExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SourceBatchExec: projection={:?}", self.projection)
    }
}

impl ExecutionPlan for SlotExec {
    fn name(&self) -> &str {
        "SourceBatchExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            Ok(self)
        } else {
            Err(DataFusionError::Internal(
                "SourceBatchExec has no children".to_string(),
            ))
        }
    }

    fn execute(
        &self,
        _partition: usize,
        _context: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        let batches = self
            .slot
            .get()
            .into_iter()
            .map(|b| match &self.projection {
                Some(p) => b.project(p).map_err(DataFusionError::from),
                None => Ok(b),
            })
            .collect::<DFResult<Vec<_>>>()?;
        Ok(Box::pin(MemoryStream::try_new(
            batches,
            self.schema.clone(),
            None,
        )?))
    }
}
