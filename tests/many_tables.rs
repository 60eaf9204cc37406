//! Routing to 1,000 tables in one job, with fewer open files and cached tables than tables:
//! every row lands once, in its own table, and every table is a real Iceberg table.

mod common;

use common::{first_column, lake_session};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_routes_to_a_thousand_tables() {
    const ROWS: u64 = 20_000;
    const TABLES: u64 = 1_000;
    let dir = tempfile::tempdir().unwrap();
    let session = lake_session(
        dir.path(),
        &format!(
            "SET 'state.dir' = '{}/state'; SET 'table.dml-sync' = 'true';
             SET 'checkpoint.interval' = '5s'; SET 'pipeline.name' = 'thousand';
             CREATE SOURCE orders WITH ('connector' = 'datagen', 'profile' = 'orders',
               'number-of-rows' = '{ROWS}', 'seed' = '3');",
            dir.path().display()
        ),
    )
    .await;
    session
        .sql(&format!(
            "INSERT INTO lake.many SELECT order_id, region FROM orders
             ROUTE BY 't' || CAST(order_id % {TABLES} AS VARCHAR)
             WITH ('route.max-open-tables' = '50', 'table-cache.max-size' = '200')"
        ))
        .await
        .unwrap();
    let job = &session.jobs().rows()[0];
    assert_eq!(job.records_out, ROWS, "{job:?}");
    assert_eq!(job.records_dead, 0, "{job:?}");
    assert_eq!(
        first_column(
            &session,
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'many'"
        )
        .await,
        vec![TABLES.to_string()]
    );
    // A sample of tables, each with exactly its own rows.
    for t in [0, 1, 499, 998, 999] {
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
