//! Hostile records through a routed job that is killed and restarted: every record class that
//! once stopped a job or lost rows, mixed with good records. Afterwards the rows in the
//! tables plus the dead letters are the records read, exactly, and the job ended well.

mod common;

use common::process::{kill_and_restart, query_csv};
use std::path::Path;

/// Files of good records, and the good records in each.
const FILES: u64 = 12;
const PER_FILE: u64 = 20_000;

const CATALOG: &str = "CREATE CATALOG lake WITH ('type' = 'iceberg', 'catalog-type' = 'sql', \
                       'uri' = 'sqlite:lake/catalog.db', 'warehouse' = 'lake/warehouse')";

/// The input files under `dir/in`; the number of records (non-blank lines) they hold.
fn write_input(dir: &Path) -> u64 {
    let input = dir.join("in");
    std::fs::create_dir_all(&input).unwrap();
    let mut records = 0;
    let long = "p".repeat(300);
    for file in 0..FILES {
        let mut text: Vec<u8> = Vec::new();
        let mut line = |l: &[u8]| {
            text.extend_from_slice(l);
            text.push(b'\n');
            records += 1;
        };
        for i in 0..PER_FILE {
            let id = file * 100_000 + i;
            let route = ["a", "b", "東京", "大阪"][(i % 4) as usize];
            let p = if i % 97 == 0 { long.as_str() } else { "short" };
            line(format!(r#"{{"t": "{route}", "id": {id}, "v": {i}, "p": "{p}"}}"#).as_bytes());
            if i % 500 != 7 {
                continue;
            }
            // One of every class, every 500 records.
            line(br#"{"t": "a", "id": 1, "v": "#); // truncated
            line(b"not json at all");
            line(b"[1, 2, 3]"); // not an object
            line(format!(r#"{{"t": "a", "big": "{}"}}"#, "x".repeat(5000)).as_bytes());
            line(br#"{"t": {"nested": 1}, "id": 2}"#); // a struct route value
            line(br#"{"t": "dead_letters", "id": 3}"#); // the dead-letter table
            line(format!(r#"{{"t": "{}", "id": 4}}"#, "r".repeat(300)).as_bytes());
            line(br#"{"t": "", "id": 5}"#);
            line(br#"{"t": null, "id": 6}"#);
            line(br#"{"id": 7}"#); // no route at all
            line(br#"{"t": "ab", "a.b": 1, "a": {"b": 2}}"#); // no schema for a new table
            line(b"{\"t\": \"a\", \"id\": \"\xff\xfe\"}"); // not UTF-8
            line(br#"{"t": "a", "id": 8, "v": "not a number"}"#); // v is a long
            line(&[b'['; 3000]); // deeper than the parser goes
            // A field name never seen before: the table 'wide' reaches its column cap.
            line(format!(r#"{{"t": "wide", "f{file}_{i}": 1}}"#).as_bytes());
        }
        std::fs::write(input.join(format!("{file}.json")), text).unwrap();
    }
    records
}

fn script() -> String {
    format!(
        "{CATALOG};
         CREATE SOURCE src WITH ('connector' = 'filesystem', 'path' = 'in', 'format' = 'json',
           'record.max-size' = '4kb');
         SET 'pipeline.name' = 'hostile';
         SET 'checkpoint.interval' = '100ms';
         INSERT INTO lake.h SELECT * FROM src ROUTE BY t
         WITH ('partition.candidates' = 'p', 'schema.max-columns' = '40');"
    )
}

fn count(dir: &Path, sql: &str) -> u64 {
    let out = query_csv(dir, CATALOG, sql);
    out.lines()
        .nth(1)
        .unwrap_or_default()
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{sql}: {out}"))
}

#[test]
fn hostile_records_with_kills_lose_nothing_and_stop_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let records = write_input(dir.path());
    kill_and_restart(dir.path(), &script(), 700);

    let tables = query_csv(
        dir.path(),
        CATALOG,
        "SELECT table_name FROM information_schema.tables \
         WHERE table_catalog = 'lake' AND table_schema = 'h'",
    );
    let tables: Vec<&str> = tables.lines().skip(1).collect();
    for t in ["a", "b", "東京", "大阪", "wide", "dead_letters"] {
        assert!(tables.contains(&t), "table {t}: {tables:?}");
    }
    let mut rows = 0;
    for t in tables.iter().filter(|t| **t != "dead_letters") {
        rows += count(dir.path(), &format!("SELECT count(*) FROM lake.h.\"{t}\""));
    }
    let dead = count(dir.path(), "SELECT count(*) FROM lake.h.dead_letters");
    assert_eq!(rows + dead, records, "{rows} rows + {dead} dead letters");
    // The good records, each once.
    let good = count(
        dir.path(),
        "SELECT count(DISTINCT id) FROM (SELECT id FROM lake.h.a UNION ALL \
         SELECT id FROM lake.h.b UNION ALL SELECT id FROM lake.h.\"東京\" UNION ALL \
         SELECT id FROM lake.h.\"大阪\") WHERE id >= 100",
    );
    assert_eq!(
        good,
        FILES * PER_FILE - 100,
        "every good record once (ids under 100 aside)"
    );
    // Each class reached the dead letters with its reason.
    for reason in [
        "not valid JSON",
        "must be an object",
        "larger than 'record.max-size'",
        "recursion limit",
        "ROUTE BY value is not text",
        "this job's dead-letter table",
        "longer than 200 bytes",
        "make no table schema",
        "does not fit",
        "'schema.max-columns' (40)",
    ] {
        let n = count(
            dir.path(),
            &format!(
                "SELECT count(*) FROM lake.h.dead_letters WHERE strpos(error, '{}') > 0",
                reason.replace('\'', "''")
            ),
        );
        assert!(n > 0, "no dead letter says {reason:?}");
    }
    let wide = count(dir.path(), "SELECT count(*) FROM lake.h.wide");
    assert!(
        wide > 0 && wide < FILES * PER_FILE / 500,
        "the column cap dead-letters the rest: {wide}"
    );
}
