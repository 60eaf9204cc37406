//! A schema change and a partition-spec change committed together with the snapshot that
//! first uses them (floe's own commit path; iceberg-rust has no action for it).

use std::sync::Arc;

use datafusion::arrow::array::{Int64Array, RecordBatch, StringArray};
mod common;

use common::{lake_session, rows};
use floe::lake::TableWriter;
use floe::lake::commit::{Committer, EvolvingAppend, SqlCommitter, prepare, staged};
use iceberg::spec::{NestedField, PrimitiveType, Schema, Transform, Type, UnboundPartitionSpec};
use iceberg::{NamespaceIdent, TableIdent};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_spec_and_data_land_in_one_commit() {
    let dir = tempfile::tempdir().unwrap();
    let session = lake_session(
        dir.path(),
        "CREATE SCHEMA lake.e; CREATE TABLE lake.e.t (id BIGINT NOT NULL, region STRING);
             INSERT INTO lake.e.t VALUES (1, 'eu'), (2, 'us');",
    )
    .await;
    let handle = session.catalogs()["lake"].clone();
    let ident = TableIdent::new(NamespaceIdent::new("e".into()), "t".into());
    let base = handle.catalog.load_table(&ident).await.unwrap();

    // The new schema keeps every field id and adds `note` after the last one.
    let current = base.metadata().current_schema();
    let mut fields: Vec<_> = current.as_struct().fields().to_vec();
    let note_id = base.metadata().last_column_id() + 1;
    fields.push(Arc::new(NestedField::optional(
        note_id,
        "note",
        Type::Primitive(PrimitiveType::String),
    )));
    let schema = Schema::builder().with_fields(fields).build().unwrap();
    let region_id = current.field_by_name("region").unwrap().id;
    let spec = UnboundPartitionSpec::builder()
        .add_partition_field(region_id, "region", Transform::Identity)
        .unwrap()
        .build();

    let stage = staged(&base, Some(schema.clone()), Some(spec.clone())).unwrap();
    let mut writer = TableWriter::try_new(&stage).unwrap();
    let arrow = Arc::new(
        iceberg::arrow::schema_to_arrow_schema(stage.metadata().current_schema()).unwrap(),
    );
    writer
        .write(
            RecordBatch::try_new(
                arrow,
                vec![
                    Arc::new(Int64Array::from(vec![3, 4])),
                    Arc::new(StringArray::from(vec!["eu", "ap"])),
                    Arc::new(StringArray::from(vec![Some("hello"), None])),
                ],
            )
            .unwrap(),
        )
        .await
        .unwrap();
    let files = writer.close().await.unwrap();
    assert_eq!(files.len(), 2, "one file per region");

    let uri = handle.display_options["uri"].clone();
    let committer = Committer::Sql(SqlCommitter::connect(&uri, "lake").await.unwrap());
    let spec_id = stage.metadata().default_partition_spec_id();
    let append = |files| EvolvingAppend {
        schema: Some(schema.clone()),
        spec: Some(spec.clone()),
        files: vec![(spec_id, files)],
        summary: [("floe.job".to_string(), "test".to_string())].into(),
        properties: Default::default(),
    };
    let prepared = prepare(&base, append(files.clone())).await.unwrap();
    let committed = committer.commit(&base, prepared).await.unwrap();
    assert_eq!(
        committed
            .metadata()
            .current_schema()
            .field_by_name("note")
            .unwrap()
            .id,
        note_id
    );

    // A second commit on the old base conflicts instead of overwriting.
    let again = prepare(&base, append(files)).await.unwrap();
    let err = committer.commit(&base, again).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("changed while floe was committing"),
        "{err}"
    );

    // Old rows read the new column as NULL; old files keep their spec.
    let got = rows(
        &session,
        "SELECT id, region, note FROM lake.e.t ORDER BY id",
    )
    .await;
    assert_eq!(
        got,
        "+----+--------+-------+\n\
         | id | region | note  |\n\
         +----+--------+-------+\n\
         | 1  | eu     |       |\n\
         | 2  | us     |       |\n\
         | 3  | eu     | hello |\n\
         | 4  | ap     |       |\n\
         +----+--------+-------+"
    );
    let specs = rows(
        &session,
        "SELECT spec_id, count(*) AS files, sum(record_count) AS n FROM lake.e.\"t$files\" \
         GROUP BY spec_id ORDER BY spec_id",
    )
    .await;
    assert!(specs.contains("| 0       | 1     | 2 |"), "{specs}");
    assert!(specs.contains("| 1       | 2     | 2 |"), "{specs}");
    let snaps = rows(
        &session,
        "SELECT summary['total-records'] AS total, summary['floe.job'] AS job \
         FROM lake.e.\"t$snapshots\" ORDER BY committed_at",
    )
    .await;
    assert!(snaps.contains("| 4     | test |"), "{snaps}");
    // Partition pruning uses the new spec for the new files.
    let eu = rows(
        &session,
        "SELECT count(*) AS n FROM lake.e.t WHERE region = 'eu'",
    )
    .await;
    assert!(eu.contains("| 2 |"), "{eu}");
}

/// Run each of `statements` on its own (each a commit).
async fn one_by_one(session: &floe::Session, statements: impl Iterator<Item = String>) {
    for sql in statements {
        session
            .sql(&sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

/// The manifests of the table named `table`, by content (0 data, 1 deletes).
async fn manifests(session: &floe::Session, table: &str) -> (usize, usize) {
    let content = common::first_column(
        session,
        &format!("SELECT content FROM lake.e.\"{table}$manifests\""),
    )
    .await;
    let data = content.iter().filter(|c| *c == "0").count();
    (data, content.len() - data)
}

/// A table that commits often keeps few manifests: a commit that finds 100 small ones of a
/// kind (the table's `commit.manifest.min-count-to-merge`) lists their files in one
/// (Iceberg's merge append), for appends and for deletes, and the rows read are the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_manifests_merge_as_commits_accumulate() {
    let dir = tempfile::tempdir().unwrap();
    let session = lake_session(
        dir.path(),
        "CREATE SCHEMA lake.e; CREATE TABLE lake.e.t (id BIGINT NOT NULL, v STRING)
         WITH ('commit.manifest.min-count-to-merge' = '100');",
    )
    .await;
    let insert = |i| format!("INSERT INTO lake.e.t VALUES ({i}, 'v{i}')");
    one_by_one(&session, (0..100).map(insert)).await;
    // One manifest per commit, up to the hundredth...
    assert_eq!(manifests(&session, "t").await, (100, 0));
    one_by_one(&session, (100..130).map(insert)).await;
    // ...which the next commit merged into one (beside its own), and 29 commits since.
    assert_eq!(manifests(&session, "t").await, (31, 0));
    let totals = "SELECT count(*) AS n, sum(id) AS s, count(DISTINCT v) AS d FROM lake.e.t";
    assert!(
        rows(&session, totals)
            .await
            .contains("| 130 | 8385 | 130 |")
    );
    // The merged manifest lists the first hundred files as existing ones.
    let listed = rows(
        &session,
        "SELECT sum(added_data_files_count) AS a, sum(existing_data_files_count) AS e \
         FROM lake.e.\"t$manifests\"",
    )
    .await;
    assert!(listed.contains("| 30 | 100 |"), "{listed}");
    // Deletes: a delete manifest per DELETE, up to the hundredth, merged by the next; four
    // since.
    let delete = |i| format!("DELETE FROM lake.e.t WHERE id = {i}");
    one_by_one(&session, (0..105).map(delete)).await;
    assert_eq!(manifests(&session, "t").await, (31, 6));
    assert!(rows(&session, totals).await.contains("| 25 | 2925 | 25 |"));
    // A table's properties say when: here at two; never when turned off.
    for (table, enabled, left) in [("two", "true", 2), ("never", "false", 5)] {
        let create = format!(
            "CREATE TABLE lake.e.{table} (id BIGINT) WITH (
               'commit.manifest.min-count-to-merge' = '2',
               'commit.manifest-merge.enabled' = '{enabled}')"
        );
        one_by_one(&session, std::iter::once(create)).await;
        let insert = |i| format!("INSERT INTO lake.e.{table} VALUES ({i})");
        one_by_one(&session, (0..5).map(insert)).await;
        assert_eq!(manifests(&session, table).await, (left, 0), "{table}");
    }
}
