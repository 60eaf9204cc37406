//! Debezium change streams applied to tables with a primary key: inserts, updates and
//! deletes of thousands of keys, generated here with the state they must leave (computed by
//! this test, not by floe), run straight through, with frequent checkpoints, killed with
//! SIGKILL at random moments, and crashed at each checkpoint step.

mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use common::process::{Rng, crash_then_finish, kill_and_restart, query_csv, run_script_to_end};

const CATALOG: &str = "CREATE CATALOG lake WITH ('type' = 'iceberg', 'catalog-type' = 'sql', \
                       'uri' = 'sqlite:lake/catalog.db', 'warehouse' = 'lake/warehouse')";

const EVENTS: usize = 150_000;
const KEYS: u64 = 4_000;

/// The events (Debezium JSON, one per line: snapshot reads, creates, updates, deletes,
/// tombstones, some wrapped with their schema) and the rows they leave, by key.
fn events() -> (String, BTreeMap<u64, String>) {
    let mut rng = Rng(0x5eed_cafe);
    let mut state: BTreeMap<u64, String> = BTreeMap::new();
    let mut out = String::new();
    for i in 0..EVENTS {
        let id = rng.next(KEYS);
        let name = format!("n{i}");
        let line = match state.get(&id) {
            None => {
                let op = if i < 1_000 { "r" } else { "c" };
                state.insert(id, name.clone());
                format!(
                    r#"{{"before":null,"after":{{"id":{id},"name":"{name}"}},"op":"{op}","ts_ms":{i}}}"#
                )
            }
            Some(old) if rng.next(4) == 0 => {
                let line = format!(
                    r#"{{"before":{{"id":{id},"name":"{old}"}},"after":null,"op":"d","ts_ms":{i}}}"#
                );
                state.remove(&id);
                // Debezium's tombstone after the delete: no change.
                format!("{line}\n")
            }
            Some(_) => {
                state.insert(id, name.clone());
                let event = format!(
                    r#"{{"before":{{"id":{id}}},"after":{{"id":{id},"name":"{name}"}},"op":"u","ts_ms":{i}}}"#
                );
                if i % 7 == 0 {
                    format!(r#"{{"schema":{{"type":"struct"}},"payload":{event}}}"#)
                } else {
                    event
                }
            }
        };
        writeln!(out, "{line}").unwrap();
    }
    (out, state)
}

fn script(interval: &str) -> String {
    script_with(interval, "")
}

/// [`script`] with the table created `WITH (...)` `options`.
fn script_with(interval: &str, options: &str) -> String {
    format!(
        "{CATALOG};
         CREATE SCHEMA IF NOT EXISTS lake.shop;
         CREATE TABLE IF NOT EXISTS lake.shop.customers (id BIGINT, name STRING,
           PRIMARY KEY (id) NOT ENFORCED) PARTITIONED BY (bucket(4, id)){options};
         CREATE SOURCE changes (id BIGINT, name STRING) WITH ('connector' = 'filesystem',
           'path' = 'changes.jsonl', 'format' = 'debezium-json');
         SET 'pipeline.name' = 'cdc';
         SET 'checkpoint.interval' = '{interval}';
         INSERT INTO lake.shop.customers SELECT * FROM changes;"
    )
}

/// A folder holding the events; the rows they must leave, as floe prints them in CSV.
fn prepared(dir: &Path) -> String {
    let (events, state) = events();
    std::fs::write(dir.join("changes.jsonl"), events).unwrap();
    let mut csv = String::from("id,name\n");
    for (id, name) in state {
        writeln!(csv, "{id},{name}").unwrap();
    }
    csv
}

fn table(dir: &Path) -> String {
    query_csv(
        dir,
        CATALOG,
        "SELECT id, name FROM lake.shop.customers ORDER BY id",
    )
}

/// The table created as format version 3: its deletes are deletion vectors.
const V3: &str = " WITH ('format-version' = '3')";

#[test]
fn a_change_stream_leaves_the_final_state_of_every_key() {
    for (interval, options) in [("1h", ""), ("50ms", ""), ("50ms", V3)] {
        let dir = tempfile::tempdir().unwrap();
        let expected = prepared(dir.path());
        run_script_to_end(dir.path(), &script_with(interval, options));
        assert!(
            table(dir.path()) == expected,
            "checkpoint.interval {interval}{options}: the table is not the final state of the keys"
        );
    }
}

#[test]
fn a_v3_change_stream_deletes_with_one_deletion_vector_per_data_file() {
    let dir = tempfile::tempdir().unwrap();
    let expected = prepared(dir.path());
    run_script_to_end(dir.path(), &script_with("50ms", V3));
    assert!(table(dir.path()) == expected);
    let deletes = query_csv(
        dir.path(),
        CATALOG,
        "SELECT file_format, count(*) AS n, count(DISTINCT referenced_data_file) AS files \
         FROM lake.shop.\"customers$files\" WHERE content = 1 GROUP BY file_format",
    );
    let mut lines = deletes.lines().skip(1);
    let row = lines.next().expect("the job wrote deletes");
    let cells: Vec<&str> = row.split(',').collect();
    assert_eq!(cells[0], "PUFFIN", "{deletes}");
    assert_eq!(
        cells[1], cells[2],
        "a data file with two deletion vectors: {deletes}"
    );
    assert!(lines.next().is_none(), "{deletes}");
}

#[test]
fn a_key_index_over_its_memory_budget_keeps_its_rows_on_disk() {
    // 1 KiB holds no index of 4,000 keys in memory: its rows go to disk, and every commit
    // finds the rows it replaces there.
    let dir = tempfile::tempdir().unwrap();
    let expected = prepared(dir.path());
    let options = " WITH ('floe.key-index.memory' = '1kb')";
    run_script_to_end(dir.path(), &script_with("50ms", options));
    assert!(
        table(dir.path()) == expected,
        "with the index on disk: the table is not the final state of the keys"
    );
    let found = query_csv(
        dir.path(),
        CATALOG,
        "SELECT DISTINCT summary['floe.key-index'] AS found \
         FROM lake.shop.\"customers$snapshots\" WHERE summary['floe.key-index'] IS NOT NULL",
    );
    assert_eq!(
        found, "found\ndisk\n",
        "every commit found its keys on disk"
    );
    // The budget is read: a bad one is an error that names it.
    let bad = tempfile::tempdir().unwrap();
    prepared(bad.path());
    std::fs::write(
        bad.path().join("job.sql"),
        script_with("50ms", " WITH ('floe.key-index.memory' = 'lots')"),
    )
    .unwrap();
    let out = common::process::floe()
        .current_dir(bad.path())
        .args(["-q", "-f", "job.sql"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("property 'floe.key-index.memory' = 'lots'"),
        "{err}"
    );
}

#[test]
fn a_change_stream_killed_and_restarted_leaves_the_final_state() {
    for options in ["", V3] {
        let dir = tempfile::tempdir().unwrap();
        let expected = prepared(dir.path());
        kill_and_restart(dir.path(), &script_with("100ms", options), 700);
        assert!(
            table(dir.path()) == expected,
            "killed and restarted{options}: the table is not the final state of the keys"
        );
    }
}

#[test]
fn a_change_stream_crashed_at_each_checkpoint_step_leaves_the_final_state() {
    for options in ["", V3] {
        for failpoint in ["after-record:3", "after-commits:3", "in-metadata-write:4"] {
            let dir = tempfile::tempdir().unwrap();
            let expected = prepared(dir.path());
            crash_then_finish(dir.path(), &script_with("100ms", options), failpoint);
            assert!(
                table(dir.path()) == expected,
                "crashed at {failpoint}{options}: the table is not the final state of the keys"
            );
        }
    }
}

#[test]
fn deletes_of_keys_the_table_does_not_hold_change_nothing_and_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("changes.jsonl"),
        concat!(
            r#"{"before":null,"after":{"id":1,"name":"a"},"op":"c"}"#,
            "\n",
            r#"{"before":{"id":2,"name":"b"},"after":null,"op":"d"}"#,
            "\n",
            r#"{"before":{"id":3},"after":null,"op":"d"}"#,
            "\n",
        ),
    )
    .unwrap();
    run_script_to_end(dir.path(), &script("1h"));
    assert_eq!(table(dir.path()), "id,name\n1,a\n");
    let counted = query_csv(
        dir.path(),
        CATALOG,
        "SELECT summary['floe.deletes-of-unknown-keys'] AS unknown \
         FROM lake.shop.\"customers$snapshots\"",
    );
    assert_eq!(counted, "unknown\n2\n");
}
