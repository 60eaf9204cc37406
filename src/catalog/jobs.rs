//! `floe.jobs`: the session's continuous jobs as a table, read afresh at every scan; and
//! `floe.table_health`: the tables they write, with their files and maintenance.
//! `SHOW JOBS` is `SELECT * FROM floe.jobs`, and any query works over it:
//!
//! ```sql
//! SELECT name, error FROM floe.jobs WHERE state = 'failed';
//! ```

use std::any::Any;
use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use datafusion::arrow::array::{BooleanArray, Float64Array, RecordBatch, StringArray, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{Session as DataFusionSession, TableProvider};
use datafusion::datasource::TableType;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::Result as DFResult;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;

use crate::error::{Error, Result};
use crate::stream::registry::JobRow;
use crate::stream::{Jobs, TableHealth};

/// The schema `floe.jobs` is registered in, in the session's default catalog.
pub const JOBS_SCHEMA: &str = "floe";

/// The columns of `floe.jobs` (and of `SHOW JOBS`).
pub static JOBS_COLUMNS: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("state", DataType::Utf8, false),
        Field::new("target", DataType::Utf8, false),
        Field::new("sources", DataType::Utf8, false),
        Field::new("records_in", DataType::UInt64, false),
        Field::new("records_out", DataType::UInt64, false),
        Field::new("records_dead_lettered", DataType::UInt64, false),
        Field::new("records_late", DataType::UInt64, false),
        Field::new("records_per_second", DataType::Float64, false),
        Field::new("lag", DataType::UInt64, true),
        Field::new("last_checkpoint", DataType::UInt64, false),
        Field::new("last_checkpoint_at", DataType::Utf8, true),
        Field::new("watermark", DataType::Utf8, true),
        Field::new("error", DataType::Utf8, true),
        Field::new("data_files", DataType::UInt64, true),
        Field::new("mean_file_size", DataType::UInt64, true),
        Field::new("last_maintenance", DataType::Utf8, true),
    ]))
});

/// A table of the session's state, built afresh at every scan by `rows`.
pub struct SessionView {
    name: &'static str,
    schema: SchemaRef,
    rows: Box<dyn Fn() -> Result<RecordBatch> + Send + Sync>,
}

impl std::fmt::Debug for SessionView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SessionView({})", self.name)
    }
}

/// `floe.jobs`: the session's jobs.
pub fn jobs_table(jobs: Arc<Jobs>) -> SessionView {
    SessionView {
        name: "jobs",
        schema: JOBS_COLUMNS.clone(),
        rows: Box::new(move || batch(&jobs.rows())),
    }
}

/// `floe.table_health`: each table the session's jobs write, with its data files, their
/// mean size, its snapshots and its last maintenance run (see `stream::maintain`).
///
/// ```sql
/// SELECT table_name, data_files, mean_file_size FROM floe.table_health WHERE needs_attention;
/// ```
pub fn table_health(jobs: Arc<Jobs>) -> SessionView {
    SessionView {
        name: "table_health",
        schema: HEALTH_SCHEMA.clone(),
        rows: Box::new(move || health_batch(&jobs.table_health())),
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
        JOBS_COLUMNS.clone(),
        vec![
            strings(|r| r.name.clone()),
            strings(|r| r.state.clone()),
            strings(|r| r.target.clone()),
            strings(|r| r.sources.clone()),
            counts(|r| r.records_in),
            counts(|r| r.records_out),
            counts(|r| r.records_dead),
            counts(|r| r.records_late),
            Arc::new(Float64Array::from_iter_values(
                rows.iter().map(|r| (r.rate * 10.0).round() / 10.0),
            )),
            Arc::new(UInt64Array::from_iter(rows.iter().map(|r| r.lag))),
            counts(|r| r.checkpoint),
            Arc::new(StringArray::from_iter(rows.iter().map(checkpoint_at))),
            Arc::new(StringArray::from_iter(rows.iter().map(watermark))),
            Arc::new(StringArray::from_iter(rows.iter().map(|r| r.error.clone()))),
            Arc::new(UInt64Array::from_iter(rows.iter().map(|r| r.data_files))),
            Arc::new(UInt64Array::from_iter(
                rows.iter().map(|r| r.mean_file_size),
            )),
            Arc::new(StringArray::from_iter(
                rows.iter().map(|r| r.last_maintenance.clone()),
            )),
        ],
    )
    .map_err(|e| Error::Internal(format!("building floe.jobs: {e}")))
}

#[async_trait]
impl TableProvider for SessionView {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        self.schema.clone()
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
        let batch = (self.rows)()?;
        Ok(MemorySourceConfig::try_new_exec(
            &[vec![batch]],
            self.schema(),
            projection.cloned(),
        )?)
    }
}

/// The columns of `floe.table_health`.
static HEALTH_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("job", DataType::Utf8, false),
        Field::new("table_name", DataType::Utf8, false),
        Field::new("data_files", DataType::UInt64, false),
        Field::new("mean_file_size", DataType::UInt64, true),
        Field::new("snapshots", DataType::UInt64, false),
        Field::new("last_maintenance_at", DataType::Utf8, true),
        Field::new("last_maintenance", DataType::Utf8, true),
        Field::new("error", DataType::Utf8, true),
        Field::new("needs_attention", DataType::Boolean, false),
    ]))
});

/// A table needs attention with more than this many data files whose mean is under
/// [`SMALL_MEAN`] bytes (files that small make planning and reading slow), or with more
/// than [`MANY_SNAPSHOTS`] snapshots, or when its last maintenance failed.
const SMALL_FILES: u64 = 100;
const SMALL_MEAN: u64 = 16 << 20;
const MANY_SNAPSHOTS: u64 = 1_000;

fn health_batch(rows: &[(String, String, TableHealth)]) -> Result<RecordBatch> {
    let at = |h: &TableHealth| {
        h.maintained_at_ms
            .and_then(chrono::DateTime::from_timestamp_millis)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
    };
    let attention = |h: &TableHealth| {
        h.error.is_some()
            || h.snapshots > MANY_SNAPSHOTS
            || (h.data_files > SMALL_FILES && h.mean_file_size().is_some_and(|m| m < SMALL_MEAN))
    };
    RecordBatch::try_new(
        HEALTH_SCHEMA.clone(),
        vec![
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r.0.clone()),
            )),
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r.1.clone()),
            )),
            Arc::new(UInt64Array::from_iter_values(
                rows.iter().map(|r| r.2.data_files),
            )),
            Arc::new(UInt64Array::from_iter(
                rows.iter().map(|r| r.2.mean_file_size()),
            )),
            Arc::new(UInt64Array::from_iter_values(
                rows.iter().map(|r| r.2.snapshots),
            )),
            Arc::new(StringArray::from_iter(rows.iter().map(|r| at(&r.2)))),
            Arc::new(StringArray::from_iter(
                rows.iter().map(|r| r.2.maintenance.clone()),
            )),
            Arc::new(StringArray::from_iter(
                rows.iter().map(|r| r.2.error.clone()),
            )),
            Arc::new(BooleanArray::from_iter(
                rows.iter().map(|r| Some(attention(&r.2))),
            )),
        ],
    )
    .map_err(|e| Error::Internal(format!("building floe.table_health: {e}")))
}
