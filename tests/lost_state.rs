//! A job's identity does not depend on its state folder: a job whose checkpoint record is
//! lost resumes from what its tables carry, and a destination table dropped and re-created
//! starts afresh without the other tables (the dead letters) skipping a commit.

mod common;

use common::process::{kill_losing_state_and_restart, query_csv};
use common::{all_jobs_finish, every_order_once, first_column, lake_session};
use std::path::Path;
use std::time::Duration;

/// A session on the lake of `dir` with the datagen source `gen` of `rows` orders (ids 1 to
/// `rows`), jobs named `job` keeping their state in `dir/<state>`.
async fn session(dir: &Path, rows: u64, state: &str, job: &str) -> floe::Session {
    lake_session(
        dir,
        &format!(
            "CREATE SCHEMA IF NOT EXISTS lake.e;
             CREATE TABLE IF NOT EXISTS lake.e.t (order_id BIGINT, v INT);
             CREATE SOURCE gen WITH ('connector' = 'datagen', 'profile' = 'orders',
               'number-of-rows' = '{rows}', 'rows-per-second' = '50000', 'seed' = '3');
             SET 'state.dir' = '{}/{state}'; SET 'checkpoint.interval' = '100ms';
             SET 'pipeline.name' = '{job}';",
            dir.display()
        ),
    )
    .await
}

/// Every 1000th order cannot be cast: a dead letter.
const INSERT: &str = "INSERT INTO lake.e.t SELECT order_id, \
    CAST(CASE WHEN order_id % 1000 = 0 THEN 'x' ELSE '1' END AS INT) FROM gen";

async fn run(session: &floe::Session, insert: &str) {
    session.sql(insert).await.unwrap();
    all_jobs_finish(session, Duration::from_secs(120)).await;
}

async fn count(session: &floe::Session, sql: &str) -> u64 {
    first_column(session, sql).await[0].parse().unwrap()
}

/// Orders `1..=rows` without every 1000th, each once; those `rows / 1000`, each one dead
/// letter of job `job`.
async fn every_order_once_or_dead(session: &floe::Session, rows: u64, job: &str) {
    let written = rows - rows / 1000;
    let text = common::rows(
        session,
        "SELECT count(*) AS n, count(DISTINCT order_id) AS ids FROM lake.e.t",
    )
    .await;
    assert!(
        text.contains(&format!("| {written} | {written} |")),
        "{text}"
    );
    let dead = count(
        session,
        &format!("SELECT count(*) FROM lake.e.dead_letters WHERE job = '{job}'"),
    )
    .await;
    assert_eq!(dead, rows / 1000, "dead letters of {job}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_state_is_lost_resumes_from_its_tables() {
    let dir = tempfile::tempdir().unwrap();
    let first = session(dir.path(), 20_000, "state", "lost").await;
    run(&first, INSERT).await;
    every_order_once_or_dead(&first, 20_000, "lost").await;
    let before = count(&first, "SELECT last_checkpoint FROM floe.jobs").await;
    drop(first);

    // The same job on another machine: its state folder is gone, its source went on.
    let second = session(dir.path(), 40_000, "elsewhere", "lost").await;
    run(&second, INSERT).await;
    every_order_once_or_dead(&second, 40_000, "lost").await;
    let after = count(&second, "SELECT last_checkpoint FROM floe.jobs").await;
    assert!(
        after > before,
        "checkpoints count on: {before} then {after}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_table_starts_afresh_and_the_dead_letters_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let first = session(dir.path(), 20_000, "state", "again").await;
    run(&first, INSERT).await;
    drop(first);

    let second = session(dir.path(), 20_000, "state", "again").await;
    second
        .sql("DROP TABLE lake.e.t; CREATE TABLE lake.e.t (order_id BIGINT, v INT)")
        .await
        .unwrap();
    run(&second, INSERT).await;
    let text = common::rows(
        &second,
        "SELECT count(*) AS n, count(DISTINCT order_id) AS ids FROM lake.e.t",
    )
    .await;
    assert!(
        text.contains("| 19980 | 19980 |"),
        "the new table has every order once: {text}"
    );
    let dead = count(&second, "SELECT count(*) FROM lake.e.dead_letters").await;
    assert_eq!(dead, 40, "both runs' dead letters, none skipped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routed_job_whose_state_is_lost_resumes_from_its_tables() {
    let dir = tempfile::tempdir().unwrap();
    let routed = "INSERT INTO lake.r SELECT order_id, region FROM gen ROUTE BY region";
    let first = session(dir.path(), 20_000, "state", "routed").await;
    run(&first, routed).await;
    drop(first);

    let second = session(dir.path(), 40_000, "elsewhere", "routed").await;
    run(&second, routed).await;
    let tables = first_column(
        &second,
        "SELECT table_name FROM information_schema.tables \
         WHERE table_catalog = 'lake' AND table_schema = 'r'",
    )
    .await;
    assert!(tables.len() > 1, "{tables:?}");
    let union = tables
        .iter()
        .map(|t| format!("SELECT order_id FROM lake.r.\"{t}\""))
        .collect::<Vec<_>>()
        .join(" UNION ALL ");
    every_order_once(&second, &format!("({union}) AS routed"), 40_000).await;
}

/// A routed job killed five times, its state folder deleted after each kill: the checkpoint a
/// kill interrupted between two tables' commits is finished from the copy of its record beside
/// the tables (only that record named the tables not reached yet), so every order is in its
/// region's table once, and every dead letter once.
#[test]
fn a_routed_job_losing_its_state_folder_at_every_kill_loses_and_repeats_nothing() {
    const CATALOG: &str = "CREATE CATALOG lake WITH ('type' = 'iceberg', 'catalog-type' = \
                           'sql', 'uri' = 'sqlite:lake/catalog.db', 'warehouse' = 'lake/warehouse')";
    let script = format!(
        "{CATALOG};
         CREATE SOURCE gen WITH ('connector' = 'datagen', 'profile' = 'orders',
           'number-of-rows' = '200000', 'rows-per-second' = '50000', 'seed' = '3');
         SET 'checkpoint.interval' = '100ms'; SET 'pipeline.name' = 'by-region';
         INSERT INTO lake.regions SELECT order_id, region,
           CAST(CASE WHEN order_id % 1000 = 0 THEN 'x' ELSE '1' END AS INT) AS v
         FROM gen ROUTE BY region;"
    );
    let dir = tempfile::tempdir().unwrap();
    kill_losing_state_and_restart(dir.path(), &script, 900);
    let regions = ["ap", "eu", "sa", "us"].map(|r| {
        format!(
            "SELECT '{r}' AS region, count(*) AS n, count(DISTINCT order_id) AS ids
             FROM lake.regions.{r}"
        )
    });
    let out = query_csv(
        dir.path(),
        CATALOG,
        &format!(
            "SELECT sum(n), sum(ids), (SELECT count(*) FROM lake.regions.dead_letters),
                    (SELECT count(DISTINCT payload) FROM lake.regions.dead_letters)
             FROM ({})",
            regions.join(" UNION ALL ")
        ),
    );
    assert_eq!(out.lines().nth(1), Some("199800,199800,200,200"), "{out}");
}
