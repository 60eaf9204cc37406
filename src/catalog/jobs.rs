//! `floe.jobs`: the session's continuous jobs as a table, read afresh at every scan.
//! `SHOW JOBS` is `SELECT * FROM floe.jobs`, and any query works over it:
//!
//! ```sql
//! SELECT name, error FROM floe.jobs WHERE state = 'failed';
//! ```

use std::any::Any;
use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use datafusion::arrow::array::{Float64Array, RecordBatch, StringArray, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{Session as DataFusionSession, TableProvider};
use datafusion::datasource::TableType;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::Result as DFResult;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;

use crate::error::{Error, Result};
use crate::stream::Jobs;
use crate::stream::registry::JobRow;

/// The schema `floe.jobs` is registered in, in the session's default catalog.
pub const JOBS_SCHEMA: &str = "floe";

/// The columns of `floe.jobs`.
static SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("state", DataType::Utf8, false),
        Field::new("target", DataType::Utf8, false),
        Field::new("sources", DataType::Utf8, false),
        Field::new("records_in", DataType::UInt64, false),
        Field::new("records_out", DataType::UInt64, false),
        Field::new("records_dead_lettered", DataType::UInt64, false),
        Field::new("records_per_second", DataType::Float64, false),
        Field::new("lag", DataType::UInt64, true),
        Field::new("last_checkpoint", DataType::UInt64, false),
        Field::new("last_checkpoint_at", DataType::Utf8, true),
        Field::new("watermark", DataType::Utf8, true),
        Field::new("error", DataType::Utf8, true),
    ]))
});

/// The session's jobs as a table.
pub struct JobsTable {
    jobs: Arc<Jobs>,
}

impl std::fmt::Debug for JobsTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JobsTable")
    }
}

impl JobsTable {
    pub fn new(jobs: Arc<Jobs>) -> Self {
        Self { jobs }
    }
}

/// The jobs' rows as a batch of [`SCHEMA`].
fn batch(rows: &[JobRow]) -> Result<RecordBatch> {
    let strings =
        |f: fn(&JobRow) -> String| Arc::new(StringArray::from_iter_values(rows.iter().map(f)));
    let counts =
        |f: fn(&JobRow) -> u64| Arc::new(UInt64Array::from_iter_values(rows.iter().map(f)));
    let checkpoint_at = |r: &JobRow| {
        (r.checkpoint_time_ms > 0)
            .then(|| chrono::DateTime::from_timestamp_millis(r.checkpoint_time_ms as i64))
            .flatten()
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
    };
    let watermark = |r: &JobRow| {
        r.watermark
            .and_then(chrono::DateTime::from_timestamp_micros)
            .map(|t| t.naive_utc().to_string())
    };
    RecordBatch::try_new(
        SCHEMA.clone(),
        vec![
            strings(|r| r.name.clone()),
            strings(|r| r.state.clone()),
            strings(|r| r.target.clone()),
            strings(|r| r.sources.clone()),
            counts(|r| r.records_in),
            counts(|r| r.records_out),
            counts(|r| r.records_dead),
            Arc::new(Float64Array::from_iter_values(
                rows.iter().map(|r| (r.rate * 10.0).round() / 10.0),
            )),
            Arc::new(UInt64Array::from_iter(rows.iter().map(|r| r.lag))),
            counts(|r| r.checkpoint),
            Arc::new(StringArray::from_iter(rows.iter().map(checkpoint_at))),
            Arc::new(StringArray::from_iter(rows.iter().map(watermark))),
            Arc::new(StringArray::from_iter(rows.iter().map(|r| r.error.clone()))),
        ],
    )
    .map_err(|e| Error::Internal(format!("building floe.jobs: {e}")))
}

#[async_trait]
impl TableProvider for JobsTable {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        SCHEMA.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    async fn scan(
        &self,
        _state: &dyn DataFusionSession,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let batch = batch(&self.jobs.rows())?;
        Ok(MemorySourceConfig::try_new_exec(
            &[vec![batch]],
            self.schema(),
            projection.cloned(),
        )?)
    }
}
