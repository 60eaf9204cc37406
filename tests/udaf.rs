//! An aggregate function a user registers on floe's session (a DataFusion UDAF, through the
//! library's `Session::context`) runs in a continuous windowed aggregate as DataFusion's own
//! do: what its accumulator's `state()` gives is what the open windows hold, saved with a
//! checkpoint and merged back (`merge_batch`) when the job resumes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Float64Type, UInt64Type};
use datafusion::error::Result as DFResult;
use datafusion::logical_expr::{Accumulator, AggregateUDF, Volatility, create_udaf};
use datafusion::scalar::ScalarValue;
use floe::{Output, Session};

/// The geometric mean: its state is the sum of the logarithms and how many there were.
#[derive(Debug, Default)]
struct GeoMean {
    logs: f64,
    n: u64,
}

impl Accumulator for GeoMean {
    fn update_batch(&mut self, values: &[ArrayRef]) -> DFResult<()> {
        let values = values[0].as_primitive::<Float64Type>();
        for v in values.iter().flatten() {
            self.logs += v.ln();
            self.n += 1;
        }
        Ok(())
    }

    fn evaluate(&mut self) -> DFResult<ScalarValue> {
        Ok(ScalarValue::Float64(
            (self.n > 0).then(|| (self.logs / self.n as f64).exp()),
        ))
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self)
    }

    fn state(&mut self) -> DFResult<Vec<ScalarValue>> {
        Ok(vec![
            ScalarValue::Float64(Some(self.logs)),
            ScalarValue::UInt64(Some(self.n)),
        ])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> DFResult<()> {
        let logs = states[0].as_primitive::<Float64Type>();
        let n = states[1].as_primitive::<UInt64Type>();
        for i in 0..logs.len() {
            if !logs.is_null(i) {
                self.logs += logs.value(i);
                self.n += n.value(i);
            }
        }
        Ok(())
    }
}

fn geo_mean() -> AggregateUDF {
    create_udaf(
        "geo_mean",
        vec![DataType::Float64],
        Arc::new(DataType::Float64),
        Volatility::Immutable,
        Arc::new(|_| Ok(Box::new(GeoMean::default()))),
        Arc::new(vec![DataType::Float64, DataType::UInt64]),
    )
}

async fn rows(session: &Session, sql: &str) -> Vec<RecordBatch> {
    match session.sql(sql).await.expect(sql).pop() {
        Some(Output::Rows(_, batches)) => batches,
        _ => panic!("no rows from {sql}"),
    }
}

/// `(window, region, count, geometric mean)` rows of `batches`.
fn windows(batches: &[RecordBatch]) -> Vec<(String, String, i64, f64)> {
    let mut out = Vec::new();
    for b in batches {
        let text = |c: usize, i: usize| {
            datafusion::arrow::util::display::array_value_to_string(b.column(c), i).unwrap()
        };
        let n = datafusion::arrow::compute::cast(b.column(2), &DataType::Int64).unwrap();
        let g = b.column(3).as_any().downcast_ref::<Float64Array>().unwrap();
        for i in 0..b.num_rows() {
            out.push((
                text(0, i),
                text(1, i),
                n.as_primitive::<datafusion::arrow::datatypes::Int64Type>()
                    .value(i),
                g.value(i),
            ));
        }
    }
    out
}

const QUERY: &str = "SELECT window_start, region, count(*) AS n, geo_mean(price) AS g
    FROM TUMBLE(gen, order_time, INTERVAL '1' MINUTE) GROUP BY window_start, window_end, region";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registered_aggregate_keeps_its_state_when_the_job_stops_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let session = Session::new();
    session.context().register_udaf(geo_mean());
    session
        .sql(&format!(
            "CREATE CATALOG lake WITH ('type' = 'iceberg', 'catalog-type' = 'sql',
               'uri' = 'sqlite:{d}/catalog.db', 'warehouse' = '{d}/warehouse');
             SET 'state.dir' = '{d}/state';
             CREATE SCHEMA lake.shop;
             CREATE TABLE lake.shop.geo (window_start TIMESTAMP, region STRING, n BIGINT,
               g DOUBLE);
             CREATE SOURCE gen (WATERMARK FOR order_time AS order_time - INTERVAL '1' SECOND)
               WITH ('connector' = 'datagen', 'profile' = 'orders', 'number-of-rows' = '60000',
               'rows-per-second' = '20000', 'seed' = '11');
             SET 'checkpoint.interval' = '100ms';
             SET 'pipeline.name' = 'geo';"
        ))
        .await
        .unwrap();
    let insert = format!("INSERT INTO lake.shop.geo {QUERY}");
    // Started, then stopped part-way with windows open.
    session.sql(&insert).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    session.sql("STOP JOB 'geo'").await.unwrap();
    let start = Instant::now();
    loop {
        let state = rows(
            &session,
            "SELECT state, records_in FROM floe.jobs WHERE name = 'geo'",
        )
        .await;
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&state)
            .unwrap()
            .to_string();
        if !text.contains("running") {
            assert!(!text.contains("| 60000"), "stopped part-way: {text}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the job did not stop: {text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let saved: Vec<String> = std::fs::read_dir(dir.path().join("state/geo"))
        .unwrap()
        .flatten()
        .map(|f| f.file_name().to_string_lossy().to_string())
        .collect();
    assert!(
        saved.iter().any(|f| f.starts_with("window-")),
        "open windows saved with the checkpoint: {saved:?}"
    );
    // Resumed to the end: the windows as a batch query computes them.
    session.sql("SET 'table.dml-sync' = 'true'").await.unwrap();
    session.sql(&insert).await.unwrap();
    let streamed = windows(&rows(&session, "SELECT * FROM lake.shop.geo ORDER BY 1, 2").await);
    let batch = windows(&rows(&session, &format!("SELECT * FROM ({QUERY}) ORDER BY 1, 2")).await);
    assert!(
        batch.len() > 20,
        "several windows and regions: {}",
        batch.len()
    );
    assert_eq!(streamed.len(), batch.len(), "each window once");
    for (s, b) in streamed.iter().zip(&batch) {
        assert_eq!((&s.0, &s.1, s.2), (&b.0, &b.1, b.2));
        assert!(
            (s.3 - b.3).abs() <= 1e-9 * b.3.abs(),
            "geometric mean of {:?}: {} streamed, {} in batch",
            (&b.0, &b.1),
            s.3,
            b.3
        );
    }
}
