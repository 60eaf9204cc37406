//! JSON sources with no declared columns: the schema is inferred per record, records of each
//! shape run through the query planned for that shape, and routed tables are created and
//! evolved from what the records carry.

mod common;

use std::path::Path;

use common::{first_column, lake_session, rows};

/// Lines of drifting, partly bad JSON records.
const RECORDS: &str = r#"{"kind": "click", "id": 1, "pos": {"x": 1}, "tags": [{"k": "a"}], "n": 5}
{"kind": "click", "id": 2, "pos": {"x": 2, "y": 3}, "tags": [{"k": "b", "w": 1.5}], "n": 70000000000}
{"kind": "click", "id": "three"}
{"kind": "click", "id": 4.5}
{"kind": null, "id": 5}
{"id": 6}
not json
{"kind": "view", "id": 7, "extra": null, "empty": [], "region": "eu"}
{"kind": "click", "id": 8, "region": "us", "score": 3}
"#;

fn setup(dir: &Path) -> String {
    let data = dir.join("in");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("a.json"), RECORDS).unwrap();
    format!(
        "SET 'state.dir' = '{0}/state'; SET 'table.dml-sync' = 'true';
         CREATE SOURCE src WITH ('connector' = 'filesystem', 'path' = '{0}/in', 'format' = 'json');",
        dir.display()
    )
}

fn columns_sql(table: &str) -> String {
    format!(
        "SELECT column_name, data_type FROM information_schema.columns \
         WHERE table_catalog = 'lake' AND table_schema = 'r' AND table_name = '{table}' \
         ORDER BY ordinal_position"
    )
}

/// The dead letter's error for the line of `RECORDS` that is not JSON.
fn not_json(dir: &Path) -> String {
    format!(
        "{}/in/a.json line 7: cannot decode the record: not valid JSON: expected ident at line 1 \
         column 2",
        dir.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routed_tables_take_the_inferred_types_and_evolve() {
    let dir = tempfile::tempdir().unwrap();
    let session = lake_session(dir.path(), &setup(dir.path())).await;
    session
        .sql(
            "INSERT INTO lake.r SELECT * FROM src ROUTE BY kind
             WITH ('json.infer.integers' = 'int', 'partition.candidates' = 'region')",
        )
        .await
        .unwrap();

    assert_eq!(
        rows(&session, "SHOW TABLES IN lake.r").await,
        "\
+---------------+--------------+--------------+
| table_catalog | table_schema | table_name   |
+---------------+--------------+--------------+
| lake          | r            | click        |
| lake          | r            | dead_letters |
| lake          | r            | view         |
+---------------+--------------+--------------+"
    );
    // Integers are ints while they fit ('json.infer.integers' = 'int'): `n` widened to long
    // when 70000000000 arrived. Nested fields and list elements grew as records added them;
    // `region` and `score` arrived last. Null, [] and absent fields made no column.
    let describe = rows(&session, "DESCRIBE lake.r.click").await;
    let columns: Vec<&str> = describe.lines().skip(3).take(7).collect();
    assert_eq!(
        columns.join("\n"),
        "\
| kind             | string                                   | YES                           |
| id               | int                                      | YES                           |
| pos              | struct<x: int, y: int>                   | YES                           |
| tags             | list<struct<k: string, w: double>>       | YES                           |
| n                | long                                     | YES                           |
| region           | string                                   | YES                           |
| score            | int                                      | YES                           |"
    );
    assert_eq!(
        rows(&session, &columns_sql("view")).await,
        "\
+-------------+-----------+
| column_name | data_type |
+-------------+-----------+
| kind        | Utf8      |
| id          | Int32     |
| region      | Utf8      |
+-------------+-----------+"
    );
    // Older files predate `pos.y` and `tags[].w`: they read as NULL (floe reads such tables
    // file by file, as iceberg-rust 0.10 cannot, apache/iceberg-rust#2617).
    assert_eq!(
        rows(
            &session,
            "SELECT id, pos['y'] AS y, tags[1]['w'] AS w, n, region FROM lake.r.click \
             WHERE id < 100 ORDER BY id"
        )
        .await,
        "\
+----+---+-----+-------------+--------+
| id | y | w   | n           | region |
+----+---+-----+-------------+--------+
| 1  |   |     | 5           |        |
| 2  | 3 | 1.5 | 70000000000 |        |
| 8  |   |     |             | us     |
+----+---+-----+-------------+--------+"
    );
    // The partition candidate applied when `region` appeared; earlier files (one per schema)
    // keep spec 0.
    assert_eq!(
        rows(
            &session,
            "SELECT spec_id, count(*) AS files FROM lake.r.\"click$files\" GROUP BY 1 ORDER BY 1"
        )
        .await,
        "\
+---------+-------+
| spec_id | files |
+---------+-------+
| 0       | 2     |
| 1       | 1     |
+---------+-------+"
    );
    // Every record that could not land is a dead letter with its reason.
    assert_eq!(
        first_column(
            &session,
            "SELECT error FROM lake.r.dead_letters ORDER BY error"
        )
        .await,
        vec![
            not_json(dir.path()),
            "table click: column 'id' is int in the table; a double value does not fit it \
             without loss"
                .to_string(),
            "table click: column 'id' is int in the table; a string value does not fit it \
             without loss"
                .to_string(),
            "the ROUTE BY value is NULL, empty, or makes a table name longer than 200 bytes"
                .to_string(),
            "the ROUTE BY value is NULL, empty, or makes a table name longer than 200 bytes"
                .to_string(),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_read_absent_fields_as_null_and_previews_show_every_shape() {
    let dir = tempfile::tempdir().unwrap();
    let session = lake_session(dir.path(), &setup(dir.path())).await;
    // A preview merges the shapes it saw into one table: the ids that are not integers read
    // as text there.
    assert_eq!(
        rows(
            &session,
            "SELECT count(*) AS records, count(region) AS with_region, \
             arrow_typeof(id) AS id_type FROM src GROUP BY 3"
        )
        .await,
        "\
+---------+-------------+---------+
| records | with_region | id_type |
+---------+-------------+---------+
| 8       | 2           | Utf8    |
+---------+-------------+---------+"
    );
    // A fixed table: the query's columns are cast to the table's as SQL casts them (4.5 -> 4);
    // `score` is absent from most records and reads NULL; an id that is not a number and a
    // line that is not JSON are dead letters.
    session
        .sql(
            "CREATE SCHEMA lake.f; CREATE TABLE lake.f.t (id BIGINT, kind STRING, score INT);
             INSERT INTO lake.f.t SELECT id, kind, score FROM src WHERE id <> 6",
        )
        .await
        .unwrap();
    assert_eq!(
        rows(&session, "SELECT * FROM lake.f.t ORDER BY id").await,
        "\
+----+-------+-------+
| id | kind  | score |
+----+-------+-------+
| 1  | click |       |
| 2  | click |       |
| 4  | click |       |
| 5  |       |       |
| 7  | view  |       |
| 8  | click | 3     |
+----+-------+-------+"
    );
    assert_eq!(
        first_column(
            &session,
            "SELECT error FROM lake.f.dead_letters ORDER BY error"
        )
        .await,
        vec![
            not_json(dir.path()),
            "Arrow error: Cast error: Cannot cast string 'three' to value of Int64 type"
                .to_string(),
        ]
    );
}
