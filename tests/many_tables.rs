//! Routing to 1,000 tables in one job, with a lower cap on open files and fewer cached tables
//! than tables: every row lands once, in its own table, one file per checkpoint, and every
//! table is a real Iceberg table.

mod common;

use common::{first_column, lake_session};
use floe::Session;

/// A session on a lake in `dir` (checkpoints every `interval`) once the job `insert` has
/// routed `rows` generated orders, every one written.
async fn routed_job(dir: &std::path::Path, interval: &str, rows: u64, insert: &str) -> Session {
    let session = lake_session(
        dir,
        &format!(
            "SET 'state.dir' = '{}/state'; SET 'table.dml-sync' = 'true';
             SET 'checkpoint.interval' = '{interval}'; SET 'pipeline.name' = 'routed';
             CREATE SOURCE orders WITH ('connector' = 'datagen', 'profile' = 'orders',
               'number-of-rows' = '{rows}', 'seed' = '3');",
            dir.display()
        ),
    )
    .await;
    session.sql(insert).await.unwrap();
    let job = &session.jobs().rows()[0];
    assert_eq!(job.records_out, rows, "{job:?}");
    session
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_routes_to_a_thousand_tables() {
    const ROWS: u64 = 300_000;
    const TABLES: u64 = 1_000;
    let dir = tempfile::tempdir().unwrap();
    let session = routed_job(
        dir.path(),
        "5s",
        ROWS,
        &format!(
            "INSERT INTO lake.many SELECT order_id, region FROM orders
             ROUTE BY 't' || CAST(order_id % {TABLES} AS VARCHAR)
             WITH ('route.max-open-files' = '50', 'table-cache.max-size' = '200',
                   'route.buffer-size' = '64kb')"
        ),
    )
    .await;
    let job = &session.jobs().rows()[0];
    assert_eq!(job.records_dead, 0, "{job:?}");
    assert_eq!(
        first_column(
            &session,
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'many'"
        )
        .await,
        vec![TABLES.to_string()]
    );
    // A sample of tables, each with exactly its own rows, and one data file per checkpoint
    // that wrote to it: with a small buffer every table's rows become row groups several
    // times a checkpoint, and local files hold no descriptor between row groups, so a cap on
    // open files (50 here, for 1,000 tables) closes none of them.
    for t in [0, 1, 499, 998, 999] {
        let count = |what: &str| {
            let sql = format!("SELECT count(*) FROM lake.many.\"t{t}${what}\"");
            let session = &session;
            async move { first_column(session, &sql).await }
        };
        let (files, snapshots) = (count("files").await, count("snapshots").await);
        assert_eq!(files, snapshots, "table t{t}: files, snapshots");
        assert_eq!(
            first_column(
                &session,
                &format!(
                    "SELECT concat(count(*), ' ', min(order_id % {TABLES}), ' ', \
                     max(order_id % {TABLES})) FROM lake.many.t{t}"
                )
            )
            .await,
            vec![format!("{} {t} {t}", ROWS / TABLES)]
        );
    }
}

/// However little memory a routed job gives the rows it gathers, a table gets one data file per
/// checkpoint: the gathered rows become row groups of the table's open file, not files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_buffer_writes_row_groups_not_files() {
    // More rows than a routed job gathers before routing them (262,144).
    const ROWS: u64 = 600_000;
    const TABLES: u64 = 4;
    let dir = tempfile::tempdir().unwrap();
    let session = routed_job(
        dir.path(),
        "1h",
        ROWS,
        &format!(
            "INSERT INTO lake.few SELECT * FROM orders
             ROUTE BY 't' || CAST(order_id % {TABLES} AS VARCHAR)
             WITH ('route.buffer-size' = '64kb')"
        ),
    )
    .await;
    for t in 0..TABLES {
        let files = first_column(
            &session,
            &format!("SELECT file_path FROM lake.few.\"t{t}$files\""),
        )
        .await;
        assert_eq!(files.len(), 1, "table t{t}: {files:?}");
        let path = files[0].trim_start_matches("file://");
        let reader = datafusion::parquet::file::serialized_reader::SerializedFileReader::new(
            std::fs::File::open(path).unwrap(),
        )
        .unwrap();
        let meta = datafusion::parquet::file::reader::FileReader::metadata(&reader);
        assert!(
            meta.num_row_groups() > 1,
            "table t{t}: {} row group(s)",
            meta.num_row_groups()
        );
        assert_eq!(meta.file_metadata().num_rows() as u64, ROWS / TABLES);
        assert_eq!(
            first_column(
                &session,
                &format!(
                    "SELECT concat(count(*), ' ', count(DISTINCT order_id)) FROM lake.few.t{t}"
                )
            )
            .await,
            vec![format!("{0} {0}", ROWS / TABLES)]
        );
    }
    let err = session
        .sql(
            "INSERT INTO lake.few SELECT * FROM orders ROUTE BY 'x'
             WITH ('route.buffer-size' = '64 parsecs')",
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("'route.buffer-size'"), "{err}");
}
