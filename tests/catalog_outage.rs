//! A SQL catalog whose database cannot answer (another process holds it locked) is an outage,
//! not an answer: `DROP TABLE IF EXISTS` fails instead of reporting success, and a running
//! job shows `retrying`, then, once the database answers again, ends with every row once.
//!
//! The catalog database is created in SQLite's rollback-journal mode, where a writer's
//! exclusive lock keeps readers out too (floe creates new databases in WAL mode, where
//! readers are never blocked; an existing database keeps its mode).

use std::path::Path;
use std::time::{Duration, Instant};

use sqlx::Connection;
use sqlx::sqlite::SqliteConnection;

mod common;

use common::{all_jobs_finish, every_order_once, lake_session, rows};

/// A session on a catalog database in rollback-journal mode, with table `lake.o.t`.
async fn session(dir: &Path, setup: &str) -> floe::Session {
    // An empty file is an empty SQLite database, in the default (rollback) journal mode.
    std::fs::File::create(dir.join("catalog.db")).unwrap();
    lake_session(
        dir,
        &format!("CREATE SCHEMA lake.o; CREATE TABLE lake.o.t (order_id BIGINT); {setup}"),
    )
    .await
}

/// Another connection holding the catalog database's exclusive lock until dropped.
async fn lock(dir: &Path) -> SqliteConnection {
    let uri = format!("sqlite:{}", dir.join("catalog.db").display());
    let mut conn = SqliteConnection::connect(&uri).await.unwrap();
    sqlx::query("BEGIN EXCLUSIVE")
        .execute(&mut conn)
        .await
        .unwrap();
    conn
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_table_if_exists_on_an_unreachable_catalog_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let session = session(dir.path(), "").await;
    let held = lock(dir.path()).await;
    let err = session
        .sql("DROP TABLE IF EXISTS lake.o.t")
        .await
        .expect_err("a catalog that cannot answer is not a missing table");
    assert!(err.to_string().contains("locked"), "{err}");
    assert_eq!(err.kind(), floe::error::ErrorKind::External, "{err}");
    drop(held);
    // The table is still there, and goes once the catalog answers.
    let tables = rows(&session, "SHOW TABLES IN lake.o").await;
    assert!(tables.contains("| t "), "{tables}");
    session.sql("DROP TABLE IF EXISTS lake.o.t").await.unwrap();
    let tables = rows(&session, "SHOW TABLES IN lake.o").await;
    assert!(!tables.contains("| t "), "{tables}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catalog_outage_under_a_running_job_is_retried_without_loss() {
    const ROWS: u64 = 30_000;
    let dir = tempfile::tempdir().unwrap();
    let session = session(
        dir.path(),
        &format!(
            "CREATE SOURCE gen WITH ('connector' = 'datagen', 'profile' = 'orders',
               'number-of-rows' = '{ROWS}', 'rows-per-second' = '5000');
             SET 'state.dir' = '{}/state'; SET 'pipeline.name' = 'outage';
             SET 'checkpoint.interval' = '200ms';",
            dir.path().display()
        ),
    )
    .await;
    session
        .sql("INSERT INTO lake.o.t SELECT order_id FROM gen")
        .await
        .unwrap();
    let jobs = session.jobs();
    let start = Instant::now();
    while jobs.rows()[0].checkpoint < 1 {
        assert!(start.elapsed() < Duration::from_secs(30), "no checkpoint");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The database is locked for longer than a connection waits for it (5 s).
    let held = lock(dir.path()).await;
    let locked = Instant::now();
    let mut seen = None;
    while locked.elapsed() < Duration::from_secs(8) {
        let row = jobs.rows().remove(0);
        assert_ne!(row.state, "failed", "{row:?}");
        if row.state == "retrying" {
            seen = Some(row);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let row = seen.expect("the job shows retrying while its catalog is locked");
    let error = row.error.unwrap_or_default();
    assert!(error.contains("locked"), "the error says why: {error}");
    drop(held);

    // The job finishes once the catalog answers.
    all_jobs_finish(&session, Duration::from_secs(90)).await;
    every_order_once(&session, "lake.o.t", ROWS).await;
}
