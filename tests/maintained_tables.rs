//! A bounded job's last maintenance run covers every table the job wrote, not only those its
//! checkpoint record names: a routed job run again after earlier runs wrote other tables
//! leaves those maintained too.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{all_jobs_finish, first_column, lake_session};

/// Run the routed job `r` once over the files of `dir/data` (as far as earlier runs have not
/// read them), with `settings` before it, to its end.
async fn run(dir: &Path, settings: &str) {
    let session = lake_session(
        dir,
        &format!(
            "CREATE SOURCE ev WITH ('connector' = 'filesystem', 'path' = '{}/data',
               'format' = 'json');
             SET 'state.dir' = '{}/state'; SET 'pipeline.name' = 'r';
             SET 'table.dml-sync' = 'true'; {settings}",
            dir.display(),
            dir.display()
        ),
    )
    .await;
    session
        .sql("INSERT INTO lake.routed SELECT * FROM ev ROUTE BY t")
        .await
        .unwrap();
    all_jobs_finish(&session, Duration::from_secs(120)).await;
}

/// A file of `dir/data` named `name`, one record for each of `tables`.
fn events(dir: &Path, name: &str, tables: &[&str]) {
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let lines: String = tables
        .iter()
        .enumerate()
        .map(|(i, t)| format!("{{\"t\": \"{t}\", \"file\": \"{name}\", \"n\": {i}}}\n"))
        .collect();
    std::fs::write(data.join(format!("{name}.json")), lines).unwrap();
}

async fn data_files(dir: &Path, table: &str) -> u64 {
    let session = lake_session(dir, "").await;
    let sql = format!("SELECT count(*) FROM lake.routed.\"{table}$files\"");
    first_column(&session, &sql).await[0].parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routed_jobs_last_run_maintains_the_tables_earlier_runs_wrote() {
    let dir = tempfile::tempdir().unwrap();
    // Three runs write a file each to tables a and b; a fourth writes to c alone, so the
    // job's checkpoint record names c only.
    for k in 0..3 {
        events(dir.path(), &format!("ab{k}"), &["a", "b"]);
        run(dir.path(), "").await;
    }
    events(dir.path(), "c", &["c"]);
    run(dir.path(), "").await;
    for table in ["a", "b"] {
        assert_eq!(data_files(dir.path(), table).await, 3, "{table} before");
    }

    // A run with compaction on and nothing new to read: its last maintenance run looks at
    // every table that carries the job's mark.
    run(
        dir.path(),
        "SET 'maintenance.compaction' = 'on'; SET 'maintenance.min-input-files' = '2';",
    )
    .await;
    for table in ["a", "b"] {
        assert_eq!(data_files(dir.path(), table).await, 1, "{table} compacted");
    }
    let session = lake_session(dir.path(), "").await;
    let rows = first_column(
        &session,
        "SELECT count(*) FROM lake.routed.a UNION ALL SELECT count(*) FROM lake.routed.b",
    )
    .await;
    assert_eq!(
        rows,
        vec!["3", "3"],
        "no row lost or doubled by the compaction"
    );
}
