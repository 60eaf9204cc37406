//! A source as a table of the session, so that `SELECT ... FROM src LIMIT n` previews its
//! records without starting a job, and so that the planner can find the sources an
//! `INSERT` reads.

use std::any::Any;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::Session;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::Result as DFResult;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;

use crate::connector::{Poll, SourceDef, SourceRef};
use crate::error::{Error, Result};

/// Records an ad-hoc preview reads at most from an unbounded source without a `LIMIT`.
const PREVIEW_CAP: usize = 10_000;

/// A declared source, seen as a table.
#[derive(Debug)]
pub struct SourceTable {
    source: SourceRef,
}

impl SourceTable {
    pub fn new(source: SourceRef) -> Self {
        Self { source }
    }

    /// The source's definition.
    pub fn source(&self) -> &SourceRef {
        &self.source
    }
}

#[async_trait]
impl TableProvider for SourceTable {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        self.source.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    /// Read from the start of the source: everything of a bounded source, or up to the
    /// query's `LIMIT` (at most 10,000 records) of an unbounded one.
    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let batches = preview(&self.source, limit).await?;
        let exec = MemorySourceConfig::try_new_exec(
            &[batches],
            self.source.schema.clone(),
            projection.cloned(),
        )?;
        Ok(exec)
    }
}

/// The records a preview shows: from the start of the source, everything of a bounded source,
/// or up to `limit` (at most 10,000 records) of an unbounded one.
pub async fn preview(source: &SourceDef, limit: Option<usize>) -> Result<Vec<RecordBatch>> {
    let mut reader = source.reader()?;
    let cap = match (limit, reader.is_bounded()) {
        (Some(l), _) => l,
        (None, true) => usize::MAX,
        (None, false) => PREVIEW_CAP,
    };
    let mut batches = Vec::new();
    let mut rows = 0;
    let mut idle = 0;
    while rows < cap {
        match reader.poll((cap - rows).min(8192)).await? {
            Poll::Records { batches: b, .. } => {
                for b in b {
                    let keep = b.num_rows().min(cap - rows);
                    rows += keep;
                    batches.push(b.slice(0, keep));
                }
                idle = 0;
            }
            Poll::Finished => break,
            // An unbounded source with nothing more to give now: show what there is, or
            // why there is nothing.
            Poll::Idle if idle > 20 => {
                if rows == 0
                    && let Some(why) = reader.stalled()
                {
                    return Err(Error::Source(why));
                }
                break;
            }
            Poll::Idle => {
                idle += 1;
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    }
    Ok(batches)
}
