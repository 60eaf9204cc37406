//! Sorting the rows compaction rewrites by the table's sort order, with DataFusion's
//! external sort: beyond [`SORT_MEMORY`] it spills to local disk, so a bin of any size sorts
//! in bounded memory.
//!
//! A sort field on a column through a transform that keeps order (identity, truncate,
//! year/month/day/hour) sorts by the column itself: rows in the column's order are in the
//! transform's order too. A field through `bucket` (or `void`) orders nothing the column
//! could stand for, so the sort uses the fields before it only.

use std::fmt;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::SortOptions;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::execution::TaskContext;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::expressions::col;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use iceberg::spec::{NullOrder, SortDirection, SortOrder, Transform};

use crate::error::{Error, Result};

/// Memory a sort holds before it spills, unless told otherwise.
pub const SORT_MEMORY: usize = 256 << 20;

/// The columns (by name) and directions `order` sorts by, as far as the columns of
/// `schema` can stand for its fields (see the module doc).
fn sort_columns(order: &SortOrder, schema: &iceberg::spec::Schema) -> Vec<(String, SortOptions)> {
    let mut out = Vec::new();
    for field in &order.fields {
        let keeps_order = matches!(
            field.transform,
            Transform::Identity
                | Transform::Truncate(_)
                | Transform::Year
                | Transform::Month
                | Transform::Day
                | Transform::Hour
        );
        // Top-level columns only: a nested field is not a column of the batch.
        let top = schema
            .as_struct()
            .fields()
            .iter()
            .find(|f| f.id == field.source_id);
        let (true, Some(column)) = (keeps_order, top) else {
            break;
        };
        out.push((
            column.name.clone(),
            SortOptions {
                descending: field.direction == SortDirection::Descending,
                nulls_first: field.null_order == NullOrder::First,
            },
        ));
    }
    out
}

/// `rows` (of the table's current schema, `arrow`) in `order`, holding at most `memory`
/// bytes before spilling; as they come when the order sorts nothing.
pub fn sorted(
    rows: BoxStream<'static, Result<RecordBatch>>,
    arrow: SchemaRef,
    order: &SortOrder,
    schema: &iceberg::spec::Schema,
    memory: usize,
) -> Result<BoxStream<'static, Result<RecordBatch>>> {
    let columns = sort_columns(order, schema);
    if columns.is_empty() {
        return Ok(rows);
    }
    let exprs = columns
        .iter()
        .map(|(name, options)| {
            Ok(PhysicalSortExpr {
                expr: col(name, &arrow)?,
                options: *options,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let Some(ordering) = LexOrdering::new(exprs) else {
        return Ok(rows);
    };
    // Labelled with the table's Arrow schema, whatever field metadata the reader gave.
    let labelled = {
        let arrow = arrow.clone();
        rows.and_then(move |b| {
            let arrow = arrow.clone();
            async move {
                b.with_schema(arrow)
                    .map_err(|e| Error::Internal(format!("rows to sort: {e}")))
            }
        })
        .boxed()
    };
    let input = StreamingTableExec::try_new(
        arrow.clone(),
        vec![Arc::new(Once::new(arrow, labelled))],
        None,
        [],
        false,
        None,
    )?;
    let sort = SortExec::new(ordering, Arc::new(input));
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_limit(memory, 1.0)
        .build_arc()?;
    let ctx = Arc::new(TaskContext::default().with_runtime(runtime));
    let stream = sort.execute(0, ctx)?;
    Ok(stream.map_err(Error::from_execution).boxed())
}

/// A stream of batches handed to DataFusion once.
struct Once {
    schema: SchemaRef,
    rows: Mutex<Option<BoxStream<'static, Result<RecordBatch>>>>,
}

impl Once {
    fn new(schema: SchemaRef, rows: BoxStream<'static, Result<RecordBatch>>) -> Self {
        Self {
            schema,
            rows: Mutex::new(Some(rows)),
        }
    }
}

impl fmt::Debug for Once {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("compaction input")
    }
}

impl PartitionStream for Once {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> datafusion::execution::SendableRecordBatchStream {
        let rows = self.rows.lock().ok().and_then(|mut r| r.take());
        let stream = match rows {
            Some(rows) => rows
                .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))
                .boxed(),
            None => futures::stream::empty().boxed(),
        };
        Box::pin(RecordBatchStreamAdapter::new(self.schema.clone(), stream))
    }
}
