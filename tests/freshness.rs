//! A session sees what other writers commit (new tables, new snapshots, new columns) at its
//! next statement, without re-registering anything. The other writer here is a second
//! session and a plain iceberg-rust client on the same sqlite catalog: separate connections,
//! as another process would have.

use std::sync::Arc;

use datafusion::arrow::array::{Int64Array, RecordBatch, StringArray};
use floe::lake::{TableWriter, commit};
mod common;

use common::{lake_session, rows};
use iceberg::spec::{PrimitiveType, Type};
use iceberg::transaction::{AddColumn, ApplyTransactionAction, Transaction};
use iceberg::{NamespaceIdent, TableIdent};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_writers_are_visible_at_the_next_statement() {
    let dir = tempfile::tempdir().unwrap();
    let reader = lake_session(dir.path(), "").await;
    let writer = lake_session(dir.path(), "").await;
    writer
        .sql("CREATE SCHEMA lake.db; CREATE TABLE lake.db.t (id BIGINT)")
        .await
        .unwrap();

    // The reader sees the table created by the writer, then each new snapshot.
    assert!(
        rows(&reader, "SELECT count(*) AS n FROM lake.db.t")
            .await
            .contains("| 0 |")
    );
    writer
        .sql("INSERT INTO lake.db.t VALUES (1), (2)")
        .await
        .unwrap();
    assert!(
        rows(&reader, "SELECT count(*) AS n FROM lake.db.t")
            .await
            .contains("| 2 |")
    );

    // A table created after the reader first looked.
    writer
        .sql("CREATE TABLE lake.db.u (x STRING); INSERT INTO lake.db.u VALUES ('new')")
        .await
        .unwrap();
    assert!(
        rows(&reader, "SELECT x FROM lake.db.u")
            .await
            .contains("| new |")
    );
    assert!(
        rows(&reader, "SHOW TABLES IN lake.db")
            .await
            .contains("| u ")
    );

    // A column added by a plain Iceberg client, committed with a snapshot that uses it.
    let catalog = writer.catalogs()["lake"].catalog.clone();
    let ident = TableIdent::new(NamespaceIdent::new("db".into()), "t".into());
    let table = catalog.load_table(&ident).await.unwrap();
    let tx = Transaction::new(&table);
    let tx = tx
        .update_schema()
        .add_column(AddColumn::optional(
            "note",
            Type::Primitive(PrimitiveType::String),
        ))
        .apply(tx)
        .unwrap();
    let table = tx.commit(catalog.as_ref()).await.unwrap();
    let mut w = TableWriter::try_new(&table).unwrap();
    let schema = Arc::new(
        iceberg::arrow::schema_to_arrow_schema(table.metadata().current_schema()).unwrap(),
    );
    w.write(
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![3])),
                Arc::new(StringArray::from(vec!["hello"])),
            ],
        )
        .unwrap(),
    )
    .await
    .unwrap();
    let files = w.close().await.unwrap();
    commit::append(
        &catalog,
        &table,
        files,
        Default::default(),
        Default::default(),
    )
    .await
    .unwrap();

    let rows = rows(&reader, "SELECT id, note FROM lake.db.t ORDER BY id").await;
    let expected = "\
+----+-------+
| id | note  |
+----+-------+
| 1  |       |
| 2  |       |
| 3  | hello |
+----+-------+";
    assert_eq!(rows, expected);
}
