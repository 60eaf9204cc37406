//! Helpers shared by the integration tests that drive a `Session` directly.

#![allow(dead_code)] // each test binary uses its own subset

pub mod process;

use datafusion::arrow::util::pretty::pretty_format_batches;
use floe::{Output, Session};

/// `CREATE CATALOG lake` on a sqlite catalog and a warehouse under `dir`.
pub fn lake_ddl(dir: &std::path::Path) -> String {
    format!(
        "CREATE CATALOG lake WITH ('type' = 'iceberg', 'catalog-type' = 'sql', \
         'uri' = 'sqlite:{0}/catalog.db', 'warehouse' = '{0}/warehouse')",
        dir.display()
    )
}

/// A session with the lake catalog of `dir`, after running `setup`.
pub async fn lake_session(dir: &std::path::Path, setup: &str) -> Session {
    let session = Session::new();
    session
        .sql(&lake_ddl(dir))
        .await
        .unwrap_or_else(|e| panic!("catalog: {e}"));
    if !setup.is_empty() {
        session
            .sql(setup)
            .await
            .unwrap_or_else(|e| panic!("{setup}: {e}"));
    }
    session
}

/// The rows of the last statement of `sql`, as a pretty table.
pub async fn rows(session: &Session, sql: &str) -> String {
    match session
        .sql(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .pop()
    {
        Some(Output::Rows(_, b)) => pretty_format_batches(&b).unwrap().to_string(),
        other => panic!("{sql}: no rows: {other:?}"),
    }
}

/// The first column of the last statement of `sql`, each value as text (NULL as "").
pub async fn first_column(session: &Session, sql: &str) -> Vec<String> {
    use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
    let Some(Output::Rows(_, batches)) = session
        .sql(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .pop()
    else {
        panic!("{sql}: no rows");
    };
    let mut out = Vec::new();
    for b in &batches {
        let f = ArrayFormatter::try_new(b.column(0).as_ref(), &FormatOptions::default()).unwrap();
        out.extend((0..b.num_rows()).map(|i| f.value(i).to_string()));
    }
    out
}

/// Wait at most `within` for every job of `session` to end; each must have finished.
pub async fn all_jobs_finish(session: &Session, within: std::time::Duration) {
    let jobs = session.jobs();
    let failures = tokio::time::timeout(within, jobs.wait_all())
        .await
        .unwrap_or_else(|_| panic!("the jobs did not end within {within:?}: {:?}", jobs.rows()));
    assert!(failures.is_empty(), "{failures:?}");
    for job in jobs.rows() {
        assert_eq!(job.state, "finished", "{job:?}");
    }
}

/// `table`'s `order_id`s are `rows` rows, each once: no order lost, none duplicated.
pub async fn every_order_once(session: &Session, table: &str, rows: u64) {
    let text = self::rows(
        session,
        &format!("SELECT count(*) AS n, count(DISTINCT order_id) AS ids FROM {table}"),
    )
    .await;
    assert!(
        text.contains(&format!("| {rows} | {rows} |")),
        "{table}: {text}"
    );
}
