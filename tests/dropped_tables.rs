//! A table dropped (or dropped and created again) under a running job loses none of the
//! job's rows: a routed table (and the dead-letter table) is created again with the rows in
//! flight; a job's single target table created again starts the job afresh into it; a
//! routed table another writer creates before the job's first commit takes the rows.

mod common;

use common::{first_column, lake_session};
use std::path::Path;
use std::time::{Duration, Instant};

/// JSON lines of orders `ids`, each routed to `route`.
fn write_orders(dir: &Path, file: &str, route: &str, ids: std::ops::RangeInclusive<u64>) {
    let lines: String = ids
        .map(|id| format!("{{\"id\": {id}, \"route\": \"{route}\"}}\n"))
        .collect();
    let tmp = dir.join(format!(".{file}"));
    std::fs::write(&tmp, lines).unwrap();
    std::fs::rename(tmp, dir.join(file)).unwrap();
}

/// Wait (at most 60 s) until `sql`'s first value is `want`.
async fn wait_for(session: &floe::Session, sql: &str, want: &str) {
    let start = Instant::now();
    loop {
        let got = match session.sql(sql).await {
            Ok(_) => first_column(session, sql).await.join(","),
            Err(e) => e.to_string(),
        };
        if got == want {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{sql}: {got}, not {want}; jobs: {:?}",
            session.jobs().rows()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Start `insert`; orders 1 to 50 committed to `table`, then 51 to 80 read but not yet
/// committed (the checkpoint interval is 2 s).
async fn fifty_committed_thirty_in_flight(
    session: &floe::Session,
    input: &Path,
    insert: &str,
    table: &str,
) {
    write_orders(input, "1.json", "x", 1..=50);
    session.sql(insert).await.unwrap();
    wait_for(session, &format!("SELECT count(*) FROM {table}"), "50").await;
    write_orders(input, "2.json", "x", 51..=80);
    wait_for(session, "SELECT records_in FROM floe.jobs", "80").await;
}

async fn session(dir: &Path) -> floe::Session {
    std::fs::create_dir_all(dir.join("in")).unwrap();
    lake_session(
        dir,
        &format!(
            "CREATE SOURCE src (id BIGINT, route STRING) WITH ('connector' = 'filesystem',
               'path' = '{0}/in', 'format' = 'json', 'source.monitor-interval' = '10ms');
             SET 'state.dir' = '{0}/state'; SET 'checkpoint.interval' = '2s';",
            dir.display()
        ),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routed_table_dropped_under_the_job_comes_back_with_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    let session = session(dir.path()).await;
    let insert = "INSERT INTO lake.r SELECT id, route FROM src ROUTE BY route";
    fifty_committed_thirty_in_flight(&session, &input, insert, "lake.r.x").await;
    session.sql("DROP TABLE lake.r.x").await.unwrap();
    wait_for(&session, "SELECT count(*) FROM lake.r.x", "30").await;
    // And the job goes on writing to the table it created again.
    write_orders(&input, "3.json", "x", 81..=100);
    wait_for(&session, "SELECT count(*) FROM lake.r.x", "50").await;
    wait_for(
        &session,
        "SELECT min(id) || '-' || max(id) || '/' || count(DISTINCT id) FROM lake.r.x",
        "51-100/50",
    )
    .await;
    let state = first_column(&session, "SELECT state FROM floe.jobs").await;
    assert_eq!(state, ["running"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_table_created_again_under_the_job_starts_it_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    let session = session(dir.path()).await;
    session
        .sql("CREATE SCHEMA lake.e; CREATE TABLE lake.e.t (id BIGINT)")
        .await
        .unwrap();
    let insert = "INSERT INTO lake.e.t SELECT id FROM src";
    fifty_committed_thirty_in_flight(&session, &input, insert, "lake.e.t").await;
    session
        .sql("DROP TABLE lake.e.t; CREATE TABLE lake.e.t (id BIGINT)")
        .await
        .unwrap();
    // The job notices at its next checkpoint, starts again, and reads its source afresh.
    wait_for(
        &session,
        "SELECT count(*) || '/' || count(DISTINCT id) FROM lake.e.t",
        "80/80",
    )
    .await;
    write_orders(&input, "3.json", "x", 81..=100);
    wait_for(
        &session,
        "SELECT count(*) || '/' || count(DISTINCT id) FROM lake.e.t",
        "100/100",
    )
    .await;
}

/// A routed table on a SQL catalog is created by its first commit: a table of its name that
/// another writer creates first (with a column of its own) takes the job's rows, merged by
/// column name, none lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_another_writer_creates_before_the_first_commit_takes_the_rows() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    let session = session(dir.path()).await;
    write_orders(&input, "1.json", "x", 1..=30);
    session
        .sql(
            "SET 'checkpoint.interval' = '5s';
             INSERT INTO lake.r SELECT id, route FROM src ROUTE BY route",
        )
        .await
        .unwrap();
    wait_for(&session, "SELECT records_in FROM floe.jobs", "30").await;
    // Read, not committed: the job's table is not in the catalog yet.
    let unmade = session.sql("SELECT count(*) FROM lake.r.x").await;
    assert!(unmade.is_err(), "lake.r.x exists before its first commit");
    session
        .sql("CREATE TABLE lake.r.x (note STRING, id BIGINT)")
        .await
        .unwrap();
    wait_for(
        &session,
        "SELECT count(*) || '/' || count(DISTINCT id) || '/' || count(route) || '/' || \
         count(note) FROM lake.r.x",
        "30/30/30/0",
    )
    .await;
    let state = first_column(&session, "SELECT state FROM floe.jobs").await;
    assert_eq!(state, ["running"]);
}
