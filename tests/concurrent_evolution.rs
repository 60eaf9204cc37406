//! Two writers evolving one table at once: both succeed, no column is lost, and rows keep
//! their values (the second commit merges schemas by name and rewrites its files when the
//! field ids it used were taken).

mod common;

use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use floe::checkpoint::commit_once;
use floe::sink::table_sink::{Candidate, TableSink};
use iceberg::spec::{Transform, UnboundPartitionSpec};
use iceberg::{NamespaceIdent, TableIdent};

use common::{first_column, lake_session, rows};

fn batch(columns: &[(&str, Vec<&str>)], ids: Vec<i64>) -> RecordBatch {
    let mut fields = vec![Field::new("id", DataType::Int64, true)];
    let mut arrays: Vec<Arc<dyn datafusion::arrow::array::Array>> =
        vec![Arc::new(Int64Array::from(ids))];
    for (name, values) in columns {
        fields.push(Field::new(*name, DataType::Utf8, true));
        arrays.push(Arc::new(StringArray::from(values.clone())));
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).unwrap()
}

/// A session on a lake (in a folder of its own) whose table `c.t` (`id BIGINT`) has one row.
struct Lake {
    _dir: tempfile::TempDir,
    session: floe::Session,
    handle: floe::lake::CatalogHandle,
    base: iceberg::table::Table,
}

impl Lake {
    async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let session = lake_session(
            dir.path(),
            "CREATE SCHEMA lake.c; CREATE TABLE lake.c.t (id BIGINT);
             INSERT INTO lake.c.t VALUES (0);",
        )
        .await;
        let handle = session.catalogs()["lake"].clone();
        let ident = TableIdent::new(NamespaceIdent::new("c".into()), "t".into());
        let base = handle.catalog.load_table(&ident).await.unwrap();
        Self {
            _dir: dir,
            session,
            handle,
            base,
        }
    }

    /// A writer of `c.t` as the lake began, evolving its schema.
    fn sink(&self) -> TableSink {
        TableSink::new(
            "lake",
            &self.handle.catalog,
            self.base.clone(),
            true,
            Vec::new(),
        )
    }

    /// Commit `pending` as `job`'s checkpoint `checkpoint`.
    async fn commit(
        &self,
        pending: &floe::checkpoint::PendingCommit,
        job: &str,
        checkpoint: u64,
    ) -> Option<iceberg::table::Table> {
        let committer = self.handle.committer.as_deref();
        let mark = floe::checkpoint::Mark::new(job, checkpoint);
        commit_once(&self.handle.catalog, committer, pending, &mark, None, None)
            .await
            .unwrap()
    }

    /// Commit `pending` as checkpoint 1 of `job` twice (a retry, a recovery), from `known`
    /// when given, its left-out rows to `dead`: each attempt must succeed.
    async fn commit_twice(
        &self,
        pending: &floe::checkpoint::PendingCommit,
        job: &str,
        dead: Option<&floe::checkpoint::DeadLetterTarget>,
        known: Option<&iceberg::table::Table>,
    ) {
        let mark = floe::checkpoint::Mark::new(job, 1);
        let committer = self.handle.committer.as_deref();
        for attempt in 0..2 {
            commit_once(&self.handle.catalog, committer, pending, &mark, dead, known)
                .await
                .unwrap_or_else(|e| panic!("attempt {attempt}: {e}"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_commit_merges_the_schemas_and_rewrites_its_files() {
    let lake = Lake::new().await;

    // Both writers start from the same table; each adds its own column (the same field id).
    let (mut a, mut b) = (lake.sink(), lake.sink());
    let wrote = a
        .write(batch(&[("from_a", vec!["a1", "a2"])], vec![1, 2]))
        .await
        .unwrap();
    assert_eq!(wrote, 2);
    let wrote = b
        .write(batch(
            &[("shared", vec!["s3"]), ("from_b", vec!["b3"])],
            vec![3],
        ))
        .await
        .unwrap();
    assert_eq!(wrote, 1);
    let pending_a = a.close().await.unwrap().unwrap();
    let pending_b = b.close().await.unwrap().unwrap();

    assert!(lake.commit(&pending_a, "a", 1).await.is_some());
    // B's schema was derived from the old one: merged, its file rewritten with new ids.
    assert!(lake.commit(&pending_b, "b", 1).await.is_some());
    // Idempotent: B's checkpoint is in the table now.
    assert!(lake.commit(&pending_b, "b", 1).await.is_none());

    assert_eq!(
        rows(&lake.session, "SELECT * FROM lake.c.t ORDER BY id").await,
        "\
+----+--------+--------+--------+
| id | from_a | shared | from_b |
+----+--------+--------+--------+
| 0  |        |        |        |
| 1  | a1     |        |        |
| 2  | a2     |        |        |
| 3  |        | s3     | b3     |
+----+--------+--------+--------+"
    );
    // The rewritten file replaced B's original, which no snapshot references.
    let files = rows(
        &lake.session,
        "SELECT count(*) AS n FROM lake.c.\"t$files\"",
    )
    .await;
    assert!(files.contains("| 3 |"), "{files}");
}

/// A job writes on while its checkpoint commits; another writer's change was merged into
/// that commit, so the rows written meanwhile (for the schema the job expected) are
/// written again for the committed one, and commit with the next checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_written_during_a_merged_commit_are_rewritten_for_it() {
    let lake = Lake::new().await;
    let (mut a, mut b) = (lake.sink(), lake.sink());
    a.write(batch(&[("from_a", vec!["a1"])], vec![1]))
        .await
        .unwrap();
    b.write(batch(&[("from_b", vec!["b2"])], vec![2]))
        .await
        .unwrap();
    let pending_a = a.close().await.unwrap().unwrap();
    let pending_b = b.close().await.unwrap().unwrap();
    // B's next checkpoint begins before its commit is done: `from_b` has A's field id.
    b.write(batch(&[("from_b", vec!["b3"])], vec![3]))
        .await
        .unwrap();
    assert!(lake.commit(&pending_a, "a", 1).await.is_some());
    let committed = lake.commit(&pending_b, "b", 1).await.unwrap();
    b.after_commit(Some(&committed)).await.unwrap();
    b.write(batch(&[("from_b", vec!["b4"])], vec![4]))
        .await
        .unwrap();
    let pending = b.close().await.unwrap().unwrap();
    assert!(lake.commit(&pending, "b", 2).await.is_some());
    assert_eq!(
        rows(&lake.session, "SELECT * FROM lake.c.t ORDER BY id").await,
        "\
+----+--------+--------+
| id | from_a | from_b |
+----+--------+--------+
| 0  |        |        |
| 1  | a1     |        |
| 2  |        | b2     |
| 3  |        | b3     |
| 4  |        | b4     |
+----+--------+--------+"
    );
}

/// JSON lines for job `tag`: rows for tables `common` and `<tag>_only`, a new field every
/// 2,500 rows (`<tag>_1`, `<tag>_2`, ...), so both jobs keep evolving `common`.
fn records(tag: &str, n: usize) -> String {
    let mut out = String::new();
    for i in 0..n {
        let table = if i % 4 == 0 {
            format!("{tag}_only")
        } else {
            "common".into()
        };
        let mut fields = format!(r#""t": "{table}", "job": "{tag}", "seq": {i}"#);
        for k in 1..=i / 2500 {
            fields.push_str(&format!(r#", "{tag}_{k}": "{tag}{k}""#));
        }
        out.push_str(&format!("{{{fields}}}\n"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_jobs_route_into_overlapping_tables_at_once() {
    const N: usize = 20_000;
    let dir = tempfile::tempdir().unwrap();
    for tag in ["x", "y"] {
        let d = dir.path().join(tag);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("events.json"), records(tag, N)).unwrap();
    }
    let session = run_two_jobs(dir.path(), "job", "shared").await;
    let m = N * 3 / 4;
    assert_eq!(
        first_column(
            &session,
            "SELECT concat(job, ' ', count(*), ' ', count(DISTINCT seq)) FROM lake.shared.common \
             GROUP BY job ORDER BY job"
        )
        .await,
        vec![format!("x {m} {m}"), format!("y {m} {m}")]
    );
    // Every field of both jobs is a column of `common`, and each row kept its values.
    let last = (N - 1) / 2500;
    for tag in ["x", "y"] {
        for k in 1..=last {
            let got = first_column(
                &session,
                &format!(
                    "SELECT count(*) FROM lake.shared.common \
                     WHERE \"{tag}_{k}\" = '{tag}{k}' AND job = '{tag}'"
                ),
            )
            .await;
            let want = (k * 2500..N).filter(|i| i % 4 != 0).count();
            assert_eq!(got, vec![want.to_string()], "{tag}_{k}");
        }
    }
    assert_eq!(
        first_column(&session, "SELECT count(*) FROM lake.shared.x_only").await,
        vec![(N / 4).to_string()]
    );
}

/// The mark that a checkpoint is committed survives snapshot expiry: it is a table
/// property as well as the snapshot's summary, so a recovery that commits the checkpoint
/// again after its snapshot was expired commits nothing (no duplicate rows).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_stays_committed_when_its_snapshot_is_expired() {
    use floe::checkpoint::commit::committed_checkpoint;
    use floe::lake::Committer;
    let lake = Lake::new().await;
    let mut a = lake.sink();
    a.write(batch(&[], vec![1])).await.unwrap();
    let pending = a.close().await.unwrap().unwrap();
    assert!(lake.commit(&pending, "a", 1).await.is_some());
    // Another writer appends, then every snapshot but the newest is expired.
    lake.session
        .sql("INSERT INTO lake.c.t VALUES (2)")
        .await
        .unwrap();
    let ident = lake.base.identifier().clone();
    let table = lake.handle.catalog.load_table(&ident).await.unwrap();
    let md = table.metadata();
    let current = md.current_snapshot_id().unwrap();
    let old: Vec<i64> = md
        .snapshots()
        .map(|s| s.snapshot_id())
        .filter(|id| *id != current)
        .collect();
    let expired = md
        .clone()
        .into_builder(table.metadata_location().map(str::to_string))
        .remove_snapshots(&old)
        .build()
        .unwrap()
        .metadata;
    let Some(Committer::Sql(sql)) = lake.handle.committer.as_deref() else {
        panic!("a SQL catalog has floe's SQL committer");
    };
    let expired = sql.commit(&table, expired).await.unwrap();
    assert!(
        expired
            .metadata()
            .snapshots()
            .all(|s| !s.summary().additional_properties.contains_key("floe.job")),
        "no snapshot carries the job's summary any more"
    );
    assert_eq!(committed_checkpoint(&expired, "a"), Some(1));
    assert!(lake.commit(&pending, "a", 1).await.is_none());
    assert_eq!(
        rows(&lake.session, "SELECT id FROM lake.c.t ORDER BY id").await,
        "\
+----+
| id |
+----+
| 0  |
| 1  |
| 2  |
+----+"
    );
}

/// iceberg-rust's append (format v1 tables, the memory catalog) commits onto the table as it
/// loads it, not as the caller saw it: a commit asked with a stale table must still find the
/// checkpoint there and skip it, not append the files twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_asked_of_a_stale_v1_table_is_not_committed_twice() {
    let lake = Lake::new().await;
    lake.session
        .sql("CREATE TABLE lake.c.v1 (id BIGINT) WITH ('format-version' = '1')")
        .await
        .unwrap();
    let ident = TableIdent::new(NamespaceIdent::new("c".into()), "v1".into());
    let stale = lake.handle.catalog.load_table(&ident).await.unwrap();
    let mut sink = TableSink::new(
        "lake",
        &lake.handle.catalog,
        stale.clone(),
        false,
        Vec::new(),
    );
    sink.write(batch(&[], vec![1, 2])).await.unwrap();
    let pending = sink.close().await.unwrap().unwrap();
    lake.commit_twice(&pending, "v1", None, Some(&stale)).await;
    assert_eq!(
        first_column(&lake.session, "SELECT count(*) FROM lake.c.v1").await,
        ["2"]
    );
}

/// Jobs `<prefix>-x` and `<prefix>-y` routing the JSON files under `dir/x` and `dir/y` by
/// `t` into namespace `lake.<namespace>` at once, run to their end; each must finish.
async fn run_two_jobs(dir: &std::path::Path, prefix: &str, namespace: &str) -> floe::Session {
    let session = lake_session(
        dir,
        &format!(
            "SET 'state.dir' = '{0}/state'; SET 'checkpoint.interval' = '20ms';
             CREATE SOURCE x WITH ('connector' = 'filesystem', 'path' = '{0}/x', 'format' = 'json');
             CREATE SOURCE y WITH ('connector' = 'filesystem', 'path' = '{0}/y', 'format' = 'json');",
            dir.display()
        ),
    )
    .await;
    for tag in ["x", "y"] {
        session
            .sql(&format!(
                "SET 'pipeline.name' = '{prefix}-{tag}';
                 INSERT INTO lake.{namespace} SELECT * FROM {tag} ROUTE BY t"
            ))
            .await
            .unwrap();
    }
    for tag in ["x", "y"] {
        let name = format!("{prefix}-{tag}");
        let wait = session.jobs().wait(&name);
        let (state, error) = tokio::time::timeout(Duration::from_secs(300), wait)
            .await
            .expect("jobs finish");
        assert_eq!(error, None, "{name} ended {state}");
    }
    session
}

/// One column of `name` with `values`, after `id`.
fn batch_of(
    ids: Vec<i64>,
    name: &str,
    values: Arc<dyn datafusion::arrow::array::Array>,
) -> RecordBatch {
    let fields = vec![
        Field::new("id", DataType::Int64, true),
        Field::new(name, values.data_type().clone(), true),
    ];
    RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        vec![Arc::new(Int64Array::from(ids)), values],
    )
    .unwrap()
}

/// Another writer gives the table a partition spec of its own without changing its schema
/// while this writer adds a column and partitions by it: both staged their spec as spec 1.
/// The files this writer wrote are committed with the id its spec has on the table now, and
/// keep their partition values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_another_writer_added_meanwhile_is_not_taken_for_ours() {
    let lake = Lake::new().await;
    let by_region = vec![Candidate {
        column: "region".into(),
        transform: Transform::Identity,
        name: "region".into(),
    }];
    let catalog = &lake.handle.catalog;
    let mut ours = TableSink::new("lake", catalog, lake.base.clone(), true, by_region);
    ours.write(batch(&[("region", vec!["eu", "us"])], vec![2, 3]))
        .await
        .unwrap();
    let pending = ours.close().await.unwrap().unwrap();
    assert!(pending.schema.is_some() && pending.spec.is_some());

    // The other writer: a row, and the table partitioned by bucket(4, id), schema unchanged
    // (as an engine's `ALTER TABLE ... ADD PARTITION FIELD` with an append).
    let mut theirs = lake.sink();
    theirs.write(batch(&[], vec![1])).await.unwrap();
    let mut change = theirs.close().await.unwrap().unwrap();
    assert!(change.schema.is_none() && change.spec.is_none());
    let bucket = UnboundPartitionSpec::builder()
        .add_partition_field(1, "id_bucket", Transform::Bucket(4))
        .unwrap()
        .build();
    change.spec = Some(serde_json::to_string(&bucket).unwrap());
    assert!(lake.commit(&change, "theirs", 1).await.is_some());

    lake.commit_twice(&pending, "ours", None, None).await;
    assert_eq!(
        rows(
            &lake.session,
            "SELECT spec_id, partition, record_count FROM lake.c.\"t$files\" ORDER BY spec_id, partition"
        )
        .await,
        "\
+---------+-----------------+--------------+
| spec_id | partition       | record_count |
+---------+-----------------+--------------+
| 0       | {}              | 1            |
| 0       | {}              | 1            |
| 2       | {\"region\":\"eu\"} | 1            |
| 2       | {\"region\":\"us\"} | 1            |
+---------+-----------------+--------------+"
    );
    assert_eq!(
        rows(&lake.session, "SELECT * FROM lake.c.t ORDER BY id").await,
        "\
+----+--------+
| id | region |
+----+--------+
| 0  |        |
| 1  |        |
| 2  | eu     |
| 3  | us     |
+----+--------+"
    );
}

/// Two writers add the same column with types that do not merge: the second keeps the
/// first's type, writes its rows whose values fit it, and dead-letters the others, once
/// however often the commit is tried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_column_typed_otherwise_by_another_writer_dead_letters_what_does_not_fit() {
    two_writers_type_one_column(
        Int64Array::from(vec![7]),
        StringArray::from(vec![Some("x"), None, Some("y")]),
        "7",
        &["column 's' became long by another writer while this job made it string"],
    )
    .await;
}

/// A number is not converted into another writer's text column either: the rule a new row
/// meets (a number into a text column is a dead letter), whichever writer committed first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_number_is_not_converted_into_another_writers_text_column() {
    two_writers_type_one_column(
        StringArray::from(vec!["x"]),
        Int64Array::from(vec![Some(7), None, Some(9)]),
        "x",
        &[
            "column 's' is string in the table; a long value does not fit",
            "column 's' became string by another writer while this job made it long",
        ],
    )
    .await;
}

/// Writer `a` adds column `s` with `first` (row 1, shown as `kept`) and commits; writer `b`,
/// from the same base, adds it with `second` (rows 2 and 4 valued, 3 NULL) and commits after,
/// twice: the table has rows 0, 1 and 3; rows 2 and 4 are `b`'s dead letters, once each,
/// their reasons containing each of `reasons`.
async fn two_writers_type_one_column(
    first: impl datafusion::arrow::array::Array + 'static,
    second: impl datafusion::arrow::array::Array + 'static,
    kept: &str,
    reasons: &[&str],
) {
    let lake = Lake::new().await;
    let (mut a, mut b) = (lake.sink(), lake.sink());
    a.write(batch_of(vec![1], "s", Arc::new(first)))
        .await
        .unwrap();
    b.write(batch_of(vec![2, 3, 4], "s", Arc::new(second)))
        .await
        .unwrap();
    let (pa, pb) = (
        a.close().await.unwrap().unwrap(),
        b.close().await.unwrap().unwrap(),
    );
    assert!(lake.commit(&pa, "a", 1).await.is_some());
    let dead = floe::checkpoint::DeadLetterTarget {
        namespace: vec!["c".into()],
        table: "dead_letters".into(),
        target: "lake.c.t".into(),
    };
    lake.commit_twice(&pb, "b", Some(&dead), None).await;
    assert_eq!(
        rows(&lake.session, "SELECT id, s FROM lake.c.t ORDER BY id").await,
        format!(
            "\
+----+---+
| id | s |
+----+---+
| 0  |   |
| 1  | {kept} |
| 3  |   |
+----+---+"
        )
    );
    let letters = first_column(
        &lake.session,
        "SELECT job || ': ' || error FROM lake.c.dead_letters ORDER BY payload",
    )
    .await;
    assert_eq!(letters.len(), 2, "{letters:?}");
    for letter in &letters {
        assert!(
            letter.starts_with("b: table c.t: ") && reasons.iter().all(|r| letter.contains(r)),
            "{letter}"
        );
    }
}

/// Two jobs route into one table at once and add the same field with types that do not
/// merge (a number in one, text in the other): neither fails, every record is a row or a
/// dead letter, and each column keeps one job's type and values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_jobs_typing_one_new_field_differently_both_finish_and_lose_nothing() {
    const N: usize = 5_000;
    let dir = tempfile::tempdir().unwrap();
    for (tag, value) in [("x", "1"), ("y", "\"one\"")] {
        let d = dir.path().join(tag);
        std::fs::create_dir_all(&d).unwrap();
        let lines: String = (0..N)
            .map(|i| {
                format!(
                    "{{\"t\": \"both\", \"job\": \"{tag}\", \"seq\": {i}, \"f{}\": {value}}}\n",
                    i / 500
                )
            })
            .collect();
        std::fs::write(d.join("events.json"), lines).unwrap();
    }
    let session = run_two_jobs(dir.path(), "typed", "typed").await;
    let rows: u64 = first_column(&session, "SELECT count(*) FROM lake.typed.both").await[0]
        .parse()
        .unwrap();
    let dead: u64 = match session
        .sql("SELECT count(*) FROM lake.typed.dead_letters")
        .await
    {
        Ok(_) => first_column(&session, "SELECT count(*) FROM lake.typed.dead_letters").await[0]
            .parse()
            .unwrap(),
        Err(_) => 0,
    };
    assert_eq!(
        rows + dead,
        2 * N as u64,
        "{rows} rows, {dead} dead letters"
    );
    // The two types met in every column: the type committed first is kept (which job's
    // commits first is a race), and the other job's values are dead letters, text into a
    // number column as a number into a text column (as for a new row: nothing converted).
    assert_eq!(dead, N as u64, "{rows} rows, {dead} dead letters");
    for k in 0..N / 500 {
        let sql = format!("SELECT count(DISTINCT job) FROM lake.typed.both WHERE f{k} IS NOT NULL");
        let jobs = first_column(&session, &sql).await;
        assert_eq!(jobs, vec!["1"], "f{k} holds the values of one job only");
    }
    let distinct = first_column(
        &session,
        "SELECT count(*) FROM (SELECT DISTINCT job, seq FROM lake.typed.both)",
    )
    .await;
    assert_eq!(distinct, vec![rows.to_string()], "no row twice");
}
