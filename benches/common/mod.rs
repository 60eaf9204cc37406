//! What the benchmarks share: one runtime thread, and a session on a lake in a folder.

use floe::Session;

/// A runtime with one worker: benchmarks measure one core.
pub fn one_core() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A session with a sqlite catalog `lake`, job state and checkpoints (10 s or
/// `FLOE_BENCH_INTERVAL`, the INSERT waiting
/// for its job) under `dir`, after running `setup`.
pub async fn lake_session(dir: &std::path::Path, setup: &str) -> Session {
    let d = dir.display();
    let interval = std::env::var("FLOE_BENCH_INTERVAL").unwrap_or_else(|_| "10s".into());
    let session = Session::new();
    session
        .sql(&format!(
            "CREATE CATALOG lake WITH ('type' = 'iceberg', 'catalog-type' = 'sql',
               'uri' = 'sqlite:{d}/catalog.db', 'warehouse' = '{d}/warehouse');
             SET 'state.dir' = '{d}/state'; SET 'checkpoint.interval' = '{interval}';
             SET 'table.dml-sync' = 'true';
             {setup}"
        ))
        .await
        .expect("setup");
    session
}
