//! A job whose checkpoint cannot be written shows `retrying` with the error, and once the
//! fault is gone resumes from its last checkpoint and ends with every row exactly once.

use std::time::{Duration, Instant};

mod common;

use common::{all_jobs_finish, every_order_once, lake_session};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_state_store_is_retried_without_loss() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let session = lake_session(
        dir.path(),
        &format!(
            "CREATE SCHEMA lake.r; CREATE TABLE lake.r.t (order_id BIGINT);
             CREATE SOURCE gen WITH ('connector' = 'datagen', 'profile' = 'orders',
               'number-of-rows' = '30000', 'rows-per-second' = '20000');
             SET 'state.dir' = '{d}/state'; SET 'pipeline.name' = 'flaky';
             SET 'checkpoint.interval' = '100ms';"
        ),
    )
    .await;
    // The job's state folder is taken by a file: every checkpoint fails until it goes.
    std::fs::create_dir_all(dir.path().join("state")).unwrap();
    let blocker = dir.path().join("state/flaky");
    std::fs::write(&blocker, "not a folder").unwrap();

    session
        .sql("INSERT INTO lake.r.t SELECT order_id FROM gen")
        .await
        .unwrap();
    let jobs = session.jobs();
    let start = Instant::now();
    let row = loop {
        let row = jobs.rows().remove(0);
        if row.state == "retrying" || start.elapsed() > Duration::from_secs(20) {
            break row;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(row.state, "retrying", "{row:?}");
    let error = row.error.unwrap_or_default();
    assert!(
        error.contains("flaky"),
        "the error names the state file: {error}"
    );

    std::fs::remove_file(&blocker).unwrap();
    // The job finishes once the fault is gone, with every row once.
    all_jobs_finish(&session, Duration::from_secs(60)).await;
    every_order_once(&session, "lake.r.t", 30_000).await;
}
