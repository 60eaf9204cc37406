//! The input of a continuous query: a table whose rows are "the batch being processed".
//!
//! A continuous query is planned once, with each source replaced by a [`SlotTable`]. To run
//! the query on a batch, the batch is put in its source's [`BatchSlot`] and the cached
//! physical plan is executed again; the [`SlotExec`] leaf hands out whatever the slot holds.
//!
//! A [`SlotTable::numbered`] table has one more column, [`INPUT_ROW`], each row's place in
//! the batch: carried through a row-wise plan, it says which record each output row came from.

use std::any::Any;
use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
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

    /// Put `batches` in the slot for the next execution.
    pub fn set_all(&self, batches: Vec<RecordBatch>) {
        if let Ok(mut b) = self.batches.lock() {
            *b = batches;
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

/// The name of a numbered slot table's last column: each row's place in its batch.
pub const INPUT_ROW: &str = "__floe_input_row";

/// A source as seen by the planner of a continuous query.
#[derive(Debug)]
pub struct SlotTable {
    schema: SchemaRef,
    slot: Arc<BatchSlot>,
    /// Whether the last column of `schema` is [`INPUT_ROW`], added to each batch.
    numbered: bool,
    /// For a looked-up table (`stream::lookup`), not a source: its name.
    lookup: Option<String>,
}

impl SlotTable {
    pub fn new(schema: SchemaRef, slot: Arc<BatchSlot>) -> Self {
        Self {
            schema,
            slot,
            numbered: false,
            lookup: None,
        }
    }

    /// Table `name`, looked up: its rows as last read are in `slot`.
    pub fn lookup(schema: SchemaRef, slot: Arc<BatchSlot>, name: String) -> Self {
        Self {
            schema,
            slot,
            numbered: false,
            lookup: Some(name),
        }
    }

    /// The slot its rows are in.
    pub fn slot(&self) -> &Arc<BatchSlot> {
        &self.slot
    }

    /// Whether this is a looked-up table rather than a source.
    pub fn is_lookup(&self) -> bool {
        self.lookup.is_some()
    }

    /// This table with an [`INPUT_ROW`] column after its own.
    pub fn numbered(&self) -> Self {
        let mut fields: Vec<_> = self.schema.fields().iter().cloned().collect();
        fields.push(Arc::new(Field::new(INPUT_ROW, DataType::UInt32, false)));
        Self {
            schema: Arc::new(Schema::new_with_metadata(
                fields,
                self.schema.metadata().clone(),
            )),
            slot: self.slot.clone(),
            numbered: true,
            lookup: self.lookup.clone(),
        }
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
        Ok(Arc::new(SlotExec {
            slot: self.slot.clone(),
            numbered: self.numbered.then(|| self.schema.clone()),
            lookup: self.lookup.clone(),
            projection: projection.cloned(),
            properties: properties(&schema),
            schema,
        }))
    }
}

fn properties(schema: &SchemaRef) -> Arc<PlanProperties> {
    Arc::new(PlanProperties::new(
        EquivalenceProperties::new(schema.clone()),
        Partitioning::UnknownPartitioning(1),
        EmissionType::Incremental,
        Boundedness::Bounded,
    ))
}

/// Reads the batches in a slot, projected.
#[derive(Debug)]
pub struct SlotExec {
    slot: Arc<BatchSlot>,
    /// The table's schema when its batches get an [`INPUT_ROW`] column.
    numbered: Option<SchemaRef>,
    /// The looked-up table it reads, if it reads one.
    lookup: Option<String>,
    projection: Option<Vec<usize>>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
}

impl SlotExec {
    /// A leaf reading the batches of `slot`, of `schema`, as they are.
    pub fn over(schema: SchemaRef, slot: Arc<BatchSlot>) -> Arc<dyn ExecutionPlan> {
        Arc::new(SlotExec {
            slot,
            numbered: None,
            lookup: None,
            projection: None,
            properties: properties(&schema),
            schema,
        })
    }
}

impl DisplayAs for SlotExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.lookup {
            Some(table) => write!(
                f,
                "LookupExec: table={table}, projection={:?}",
                self.projection
            ),
            None => write!(f, "SourceBatchExec: projection={:?}", self.projection),
        }
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
            .map(|b| match &self.numbered {
                Some(schema) => with_row_numbers(schema, b),
                None => Ok(b),
            })
            .map(|b| match &self.projection {
                Some(p) => b?.project(p).map_err(DataFusionError::from),
                None => b,
            })
            .collect::<DFResult<Vec<_>>>()?;
        Ok(Box::pin(MemoryStream::try_new(
            batches,
            self.schema.clone(),
            None,
        )?))
    }
}

/// `batch` with its rows' places (an [`INPUT_ROW`] column) after its columns, as `schema`.
fn with_row_numbers(schema: &SchemaRef, batch: RecordBatch) -> DFResult<RecordBatch> {
    let rows = u32::try_from(batch.num_rows())
        .map_err(|_| DataFusionError::Internal("a batch of over 2^32 rows".to_string()))?;
    let mut columns = batch.columns().to_vec();
    columns.push(Arc::new(UInt32Array::from_iter_values(0..rows)) as ArrayRef);
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}
