//! What a continuous job does with an error raised while its query runs on records: a value
//! the query cannot take dead-letters that record alone; memory running out or an I/O error
//! is no fault of the records, so the job retries from its last checkpoint and dead-letters
//! nothing. And a job's plans run with the session's settings (`SET` reaches them).
//!
//! The errors come from scalar functions registered in the session, as a user's UDF would
//! raise them; the job, its source, its table and its dead letters are real.

use std::any::Any;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use datafusion::arrow::array::{AsArray, Int64Array};
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

mod common;

use common::{every_order_once, first_column, lake_session, rows};

const ROWS: u64 = 20_000;

/// What a test function does to the values it is given.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Refuses the value 1000 (an execution error caused by a value).
    Value,
    /// Its 4th to 6th calls fail as if memory ran out.
    Memory,
    /// Its 4th to 6th calls fail with an I/O error.
    Io,
    /// Passes its values through; ignores them and returns the session's batch size.
    BatchSize,
}

#[derive(Debug)]
struct TestFunction {
    name: String,
    fault: Fault,
    signature: Signature,
    calls: Arc<AtomicUsize>,
}

impl PartialEq for TestFunction {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for TestFunction {}

impl Hash for TestFunction {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.name.hash(state)
    }
}

impl ScalarUDFImpl for TestFunction {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> DFResult<DataType> {
        Ok(DataType::Int64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DFResult<ColumnarValue> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        let values = args.args[0].to_array(args.number_rows)?;
        let values = values.as_primitive::<Int64Type>();
        let failing = (3..6).contains(&call);
        match self.fault {
            Fault::Value => {
                if values.iter().any(|v| v == Some(1000)) {
                    return Err(DataFusionError::Execution(
                        "order 1000 is refused".to_string(),
                    ));
                }
            }
            Fault::Memory if failing => {
                return Err(DataFusionError::ResourcesExhausted(
                    "Failed to allocate additional 1024 bytes".to_string(),
                ));
            }
            Fault::Io if failing => {
                return Err(DataFusionError::IoError(std::io::Error::other(
                    "disk went away",
                )));
            }
            Fault::BatchSize => {
                let size = args.config_options.execution.batch_size as i64;
                return Ok(ColumnarValue::Array(Arc::new(Int64Array::from(vec![
                    size;
                    values
                        .len(
                        )
                ]))));
            }
            Fault::Memory | Fault::Io => {}
        }
        Ok(ColumnarValue::Array(Arc::new(values.clone())))
    }
}

fn register(session: &floe::Session, name: &str, fault: Fault) -> Arc<AtomicUsize> {
    let calls = Arc::new(AtomicUsize::new(0));
    session
        .context()
        .register_udf(ScalarUDF::from(TestFunction {
            name: name.to_string(),
            fault,
            signature: Signature::exact(vec![DataType::Int64], Volatility::Volatile),
            calls: calls.clone(),
        }));
    calls
}

/// A session with table `lake.e.t` and a bounded datagen source `gen` of [`ROWS`] orders
/// (ids 1 to ROWS), its jobs checkpointing every 100 ms.
async fn session(dir: &std::path::Path) -> floe::Session {
    lake_session(
        dir,
        &format!(
            "CREATE SCHEMA lake.e; CREATE TABLE lake.e.t (order_id BIGINT);
             CREATE SOURCE gen WITH ('connector' = 'datagen', 'profile' = 'orders',
               'number-of-rows' = '{ROWS}', 'rows-per-second' = '40000');
             SET 'state.dir' = '{}/state'; SET 'checkpoint.interval' = '100ms';",
            dir.display()
        ),
    )
    .await
}

/// Run `insert` to its end, which must be `finished`; every state the job showed on the
/// way, and its last error.
async fn run_job(session: &floe::Session, insert: &str) -> (Vec<String>, Option<String>) {
    session.sql(insert).await.unwrap();
    let jobs = session.jobs();
    let mut states: Vec<String> = Vec::new();
    let mut error = None;
    let start = Instant::now();
    loop {
        let row = jobs.rows().remove(0);
        if states.last() != Some(&row.state) {
            states.push(row.state.clone());
        }
        if row.error.is_some() {
            error = row.error.clone();
        }
        if matches!(row.state.as_str(), "finished" | "failed") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the job did not end: {states:?}, {error:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let failures = jobs.wait_all().await;
    assert!(failures.is_empty(), "{failures:?}");
    assert_eq!(
        states.last().map(String::as_str),
        Some("finished"),
        "{states:?}: {error:?}"
    );
    (states, error)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_the_query_refuses_dead_letters_that_record_only() {
    let dir = tempfile::tempdir().unwrap();
    let session = session(dir.path()).await;
    register(&session, "checked", Fault::Value);
    run_job(
        &session,
        "SET 'pipeline.name' = 'values'; INSERT INTO lake.e.t SELECT checked(order_id) FROM gen",
    )
    .await;
    let text = rows(
        &session,
        "SELECT count(*) AS n, count(DISTINCT order_id) AS ids, sum(order_id) AS s FROM lake.e.t",
    )
    .await;
    let sum = ROWS * (ROWS + 1) / 2 - 1000;
    assert!(
        text.contains(&format!("| {} | {} | {sum} |", ROWS - 1, ROWS - 1)),
        "{text}"
    );
    let letters = first_column(&session, "SELECT error FROM lake.e.dead_letters").await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert!(letters[0].contains("order 1000 is refused"), "{letters:?}");
}

/// A resource or I/O error while a batch runs: the job shows `retrying` with the error,
/// resumes from its last checkpoint, and ends with every row exactly once and no dead letter.
async fn retried_without_dead_letters(fault: Fault, expected: &str) {
    let dir = tempfile::tempdir().unwrap();
    let session = session(dir.path()).await;
    let calls = register(&session, "flaky", fault);
    let (states, error) = run_job(
        &session,
        "SET 'pipeline.name' = 'flaky'; INSERT INTO lake.e.t SELECT flaky(order_id) FROM gen",
    )
    .await;
    assert!(
        states.iter().any(|s| s == "retrying"),
        "the job retried: {states:?}"
    );
    let error = error.unwrap_or_default();
    assert!(error.contains(expected), "the error is shown: {error}");
    assert!(calls.load(Ordering::SeqCst) > 6, "the fault was reached");
    every_order_once(&session, "lake.e.t", ROWS).await;
    let tables = rows(&session, "SHOW TABLES IN lake.e").await;
    assert!(
        !tables.contains("dead_letters"),
        "nothing was dead-lettered: {tables}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_running_out_retries_and_dead_letters_nothing() {
    retried_without_dead_letters(Fault::Memory, "Failed to allocate").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_io_error_retries_and_dead_letters_nothing() {
    retried_without_dead_letters(Fault::Io, "disk went away").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_reaches_the_plans_a_job_runs() {
    let dir = tempfile::tempdir().unwrap();
    let session = session(dir.path()).await;
    register(&session, "batch_size", Fault::BatchSize);
    run_job(
        &session,
        "SET datafusion.execution.batch_size = 1234; SET 'pipeline.name' = 'sized';
         INSERT INTO lake.e.t SELECT batch_size(order_id) FROM gen",
    )
    .await;
    let sizes = first_column(&session, "SELECT DISTINCT order_id FROM lake.e.t").await;
    assert_eq!(sizes, vec!["1234".to_string()]);
}

/// A route value that names no table at all (a struct cannot be text): every row becomes a
/// dead letter with the reason; none is lost and the job goes on to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_whose_route_names_no_table_are_dead_letters() {
    let dir = tempfile::tempdir().unwrap();
    let session = session(dir.path()).await;
    run_job(
        &session,
        "SET 'pipeline.name' = 'structs';
         INSERT INTO lake.r SELECT order_id, region FROM gen ROUTE BY named_struct('r', region)",
    )
    .await;
    let letters = first_column(&session, "SELECT error FROM lake.r.dead_letters").await;
    assert_eq!(letters.len(), ROWS as usize);
    assert!(
        letters
            .iter()
            .all(|e| e.contains("ROUTE BY value is not text")),
        "{:?}",
        &letters[..1]
    );
    let tables = rows(&session, "SHOW TABLES IN lake.r").await;
    assert_eq!(
        tables.matches("| lake ").count(),
        1,
        "only dead_letters: {tables}"
    );
}

/// A route value naming the dead-letter table: its rows are dead letters with the reason,
/// the other rows go to their tables, and the dead-letter table keeps its own columns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_value_cannot_name_the_dead_letter_table() {
    let dir = tempfile::tempdir().unwrap();
    let session = session(dir.path()).await;
    run_job(
        &session,
        "SET 'pipeline.name' = 'reserved';
         INSERT INTO lake.q SELECT order_id FROM gen
         ROUTE BY CASE WHEN order_id % 2 = 0 THEN 'Dead-Letters' ELSE 'odd' END",
    )
    .await;
    let letters = first_column(&session, "SELECT error FROM lake.q.dead_letters").await;
    assert_eq!(letters.len(), ROWS as usize / 2);
    assert!(
        letters[0].contains("names table 'dead_letters', this job's dead-letter table"),
        "{}",
        letters[0]
    );
    let odd = rows(&session, "SELECT count(*) AS n FROM lake.q.odd").await;
    assert!(odd.contains(&format!("| {} |", ROWS / 2)), "{odd}");
}

/// One job name, one running owner: a second session (as a second process would) sharing the
/// state folder cannot run the same job while the first does; it fails naming the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_owner_of_a_job_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let first = session(dir.path()).await;
    first
        .sql(
            "CREATE SOURCE slow WITH ('connector' = 'datagen', 'profile' = 'orders',
               'rows-per-second' = '100');
             SET 'pipeline.name' = 'owned'; INSERT INTO lake.e.t SELECT order_id FROM slow",
        )
        .await
        .unwrap();
    let second = common::lake_session(
        dir.path(),
        &format!(
            "CREATE SOURCE slow WITH ('connector' = 'datagen', 'profile' = 'orders',
               'rows-per-second' = '100');
             SET 'state.dir' = '{}/state'; SET 'pipeline.name' = 'owned';
             SET 'table.dml-sync' = 'true';",
            dir.path().display()
        ),
    )
    .await;
    let err = second
        .sql("INSERT INTO lake.e.t SELECT order_id FROM slow")
        .await
        .expect_err("the name is taken");
    assert!(
        err.to_string().contains("job 'owned' is running already"),
        "{err}"
    );
    assert_eq!(first.jobs().rows()[0].state, "running");
    first.jobs().stop("owned").await.unwrap();
    // Once the first owner is gone, the name is free.
    second
        .sql("SET 'table.dml-sync' = 'false'; INSERT INTO lake.e.t SELECT order_id FROM slow")
        .await
        .unwrap();
    second.jobs().stop("owned").await.unwrap();
}

/// `route.max-tables` bounds the tables a job writes over its life, not only the tables its
/// cache holds: with a cache of one table, values that come one after another still make
/// no more than the bound, and the other rows are dead letters; none is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_max_tables_bounds_tables_created() {
    let dir = tempfile::tempdir().unwrap();
    let session = session(dir.path()).await;
    run_job(
        &session,
        "SET 'pipeline.name' = 'bounded';
         INSERT INTO lake.m SELECT order_id, CAST(order_id / 2500 AS VARCHAR) AS part FROM gen
         ROUTE BY 'p' || part WITH ('route.max-tables' = '2', 'table-cache.max-size' = '1')",
    )
    .await;
    let tables = first_column(&session, "SELECT table_name FROM information_schema.tables WHERE table_catalog = 'lake' AND table_schema = 'm'").await;
    let data: Vec<&String> = tables.iter().filter(|t| *t != "dead_letters").collect();
    assert_eq!(data.len(), 2, "{tables:?}");
    let mut total = 0u64;
    for t in &data {
        let n = first_column(&session, &format!("SELECT count(*) FROM lake.m.{t}")).await;
        total += n[0].parse::<u64>().unwrap();
    }
    let dead = first_column(&session, "SELECT count(*) FROM lake.m.dead_letters").await;
    total += dead[0].parse::<u64>().unwrap();
    assert_eq!(total, ROWS, "every row in a table or a dead letter");
    let reasons = first_column(&session, "SELECT DISTINCT error FROM lake.m.dead_letters").await;
    assert!(
        reasons
            .iter()
            .all(|r| r.contains("route.max-tables (2) reached")),
        "{reasons:?}"
    );
}

/// Run `insert` as job `job` to its end over `dir/in/1.json` holding `text`, read by source
/// `files` with `columns`, after `setup`; the file.
async fn run_over_lines(
    session: &floe::Session,
    dir: &std::path::Path,
    text: &str,
    (setup, columns): (&str, &str),
    (job, insert): (&str, &str),
) -> std::path::PathBuf {
    let input = dir.join("in");
    std::fs::create_dir_all(&input).unwrap();
    let file = input.join("1.json");
    std::fs::write(&file, text).unwrap();
    session
        .sql(&format!(
            "{setup} CREATE SOURCE files ({columns}) WITH ('connector' = 'filesystem', \
             'path' = '{}', 'format' = 'json')",
            input.display()
        ))
        .await
        .unwrap();
    run_job(session, &format!("SET 'pipeline.name' = '{job}'; {insert}")).await;
    file
}

/// Each dead letter of `namespace` as `<partition> <offset> <payload>`.
async fn places(session: &floe::Session, namespace: &str) -> Vec<String> {
    first_column(
        session,
        &format!(
            "SELECT concat(source_partition, ' ', source_offset, ' ', CAST(payload AS STRING)) \
             FROM {namespace}.dead_letters"
        ),
    )
    .await
}

/// A row the query refuses after its record decoded is a dead letter with the record's
/// place and bytes (the file and line), as a record that does not decode is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_refused_after_decoding_keeps_its_records_place_and_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let session = session(dir.path()).await;
    let file = run_over_lines(
        &session,
        dir.path(),
        "{\"order_id\": 1, \"n\": \"5\"}\n\n{\"order_id\": 2, \"n\": \"five\"}\n{\"order_id\": 3, \"n\": \"7\"}\n",
        ("", "order_id BIGINT, n STRING"),
        (
            "placed",
            "INSERT INTO lake.e.t SELECT order_id + CAST(n AS BIGINT) FROM files",
        ),
    )
    .await;
    assert_eq!(
        first_column(&session, "SELECT order_id FROM lake.e.t ORDER BY order_id").await,
        ["6", "10"]
    );
    assert_eq!(
        places(&session, "lake.e").await,
        [format!(
            "{} 3 {{\"order_id\": 2, \"n\": \"five\"}}",
            file.display()
        )]
    );
}

/// A routed table that refuses some rows (a NULL for a NOT NULL column it may not relax)
/// takes the others of the same routing run: only the refused rows are dead letters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routed_table_refusing_some_rows_takes_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let session = session(dir.path()).await;
    session
        .sql("CREATE SCHEMA lake.r; CREATE TABLE lake.r.t (order_id BIGINT, v BIGINT NOT NULL)")
        .await
        .unwrap();
    run_job(
        &session,
        "SET 'pipeline.name' = 'some-refused';
         INSERT INTO lake.r SELECT order_id,
           CASE WHEN order_id % 1000 = 0 THEN NULL ELSE order_id END AS v
         FROM gen ROUTE BY 't' WITH ('schema.evolution' = 'off')",
    )
    .await;
    let refused = ROWS / 1000;
    assert_eq!(
        first_column(&session, "SELECT count(*) FROM lake.r.t").await,
        [(ROWS - refused).to_string()]
    );
    let letters = first_column(&session, "SELECT error FROM lake.r.dead_letters").await;
    assert_eq!(
        letters.len() as u64,
        refused,
        "{:?}",
        &letters[..3.min(letters.len())]
    );
}

/// A row a routed job's table refuses (after the rows are gathered and routed) is a dead
/// letter with its record's file, line and bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_a_routed_table_refuses_keeps_its_records_place_and_bytes() {
    routed_refusals_keep_their_places("routed-placed", "").await;
}

/// So it is when the query's rows are not its input row for row: a WHERE that drops rows
/// before the one refused, and a UNION ALL that reads the source twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_row_keeps_its_place_behind_a_filter_and_a_union() {
    routed_refusals_keep_their_places(
        "routed-filtered",
        "WHERE order_id <> 1 UNION ALL SELECT order_id, v FROM files WHERE order_id = 4",
    )
    .await;
}

/// Run a routed job over four lines, two with a NULL its table refuses, the query
/// `SELECT order_id, v FROM files {rest}`: the refused rows' dead letters name their lines.
async fn routed_refusals_keep_their_places(job: &str, rest: &str) {
    let dir = tempfile::tempdir().unwrap();
    let session = session(dir.path()).await;
    let file = run_over_lines(
        &session,
        dir.path(),
        "{\"order_id\": 1, \"v\": 5}\n{\"order_id\": 2, \"v\": null}\n\
         {\"order_id\": 3, \"v\": 7}\n{\"order_id\": 4, \"v\": null}\n",
        (
            "CREATE SCHEMA lake.rr; CREATE TABLE lake.rr.t (order_id BIGINT, v BIGINT NOT NULL);",
            "order_id BIGINT, v BIGINT",
        ),
        (
            job,
            &format!(
                "INSERT INTO lake.rr SELECT order_id, v FROM files {rest} ROUTE BY 't' \
                 WITH ('schema.evolution' = 'off')"
            ),
        ),
    )
    .await;
    let kept = first_column(&session, "SELECT order_id FROM lake.rr.t ORDER BY order_id").await;
    assert_eq!(
        kept,
        if rest.is_empty() {
            ["1", "3"].as_slice()
        } else {
            ["3"].as_slice()
        }
    );
    let mut expected = vec![
        format!("{} 2 {{\"order_id\": 2, \"v\": null}}", file.display()),
        format!("{} 4 {{\"order_id\": 4, \"v\": null}}", file.display()),
    ];
    if !rest.is_empty() {
        expected.push(expected[1].clone());
    }
    let mut letters = places(&session, "lake.rr").await;
    letters.sort();
    assert_eq!(letters, expected);
}
