//! Ad-hoc scans of lake tables: files pruned by what the query knows only as it runs (a hash
//! join's build-side keys), shown by `EXPLAIN ANALYZE`, the rows unchanged.

mod common;

use common::{lake_session, rows};

/// `lake.s.t` with 20 files: ids 0..1000, file `i` holding ids `50 i .. 50 i + 49`.
async fn twenty_files(dir: &std::path::Path) -> floe::Session {
    let session = lake_session(
        dir,
        "CREATE SCHEMA lake.s;
         CREATE TABLE lake.s.t (id BIGINT NOT NULL, grp STRING NOT NULL, v INT NOT NULL);",
    )
    .await;
    for i in 0..20 {
        session
            .sql(&format!(
                "INSERT INTO lake.s.t SELECT value + {}, 'g' || CAST(value % 3 AS STRING), \
                 CAST(value AS INT) FROM generate_series(0, 49)",
                i * 50
            ))
            .await
            .unwrap_or_else(|e| panic!("insert {i}: {e}"));
    }
    session
}

/// The figure after `name=` in each LakeScan line of an `EXPLAIN ANALYZE`'s plan.
fn metric(plan: &str, name: &str) -> Vec<usize> {
    let figures: Vec<usize> = plan
        .lines()
        .filter(|l| l.contains("LakeScan"))
        .map(|line| {
            let after = line
                .split(&format!("{name}="))
                .nth(1)
                .unwrap_or_else(|| panic!("no {name} in {line}"));
            let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
            digits
                .parse()
                .unwrap_or_else(|e| panic!("{name} in {line}: {e}"))
        })
        .collect();
    assert!(!figures.is_empty(), "no LakeScan in\n{plan}");
    figures
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hash_joins_keys_prune_the_files_its_probe_side_reads() {
    let dir = tempfile::tempdir().unwrap();
    let session = twenty_files(dir.path()).await;
    // Three keys, all in the third file (ids 100..149): the join's bounds leave one file.
    let join = "SELECT t.id, t.grp, t.v FROM lake.s.t t \
                JOIN (VALUES (101), (120), (149)) AS k(id) ON t.id = k.id ORDER BY t.id";
    let plan = rows(&session, &format!("EXPLAIN ANALYZE {join}")).await;
    assert!(plan.contains("dynamic_filters=["), "{plan}");
    assert_eq!(metric(&plan, "files_read"), [1], "{plan}");
    assert_eq!(metric(&plan, "files_pruned_at_run"), [19], "{plan}");
    assert_eq!(
        rows(&session, join).await,
        "+-----+-----+----+\n\
         | id  | grp | v  |\n\
         +-----+-----+----+\n\
         | 101 | g1  | 1  |\n\
         | 120 | g2  | 20 |\n\
         | 149 | g1  | 49 |\n\
         +-----+-----+----+"
    );

    // Keys spread over the table prune nothing and lose nothing; keys beyond it read nothing.
    let spread = "SELECT count(*) AS n, sum(t.v) AS v FROM lake.s.t t \
                  JOIN (VALUES (0), (999)) AS k(id) ON t.id = k.id";
    let plan = rows(&session, &format!("EXPLAIN ANALYZE {spread}")).await;
    assert_eq!(metric(&plan, "files_read"), [20], "{plan}");
    assert!(rows(&session, spread).await.contains("| 2 | 49 |"));
    let none = "SELECT count(*) AS n FROM lake.s.t t \
                JOIN (VALUES (5000), (6000)) AS k(id) ON t.id = k.id";
    let plan = rows(&session, &format!("EXPLAIN ANALYZE {none}")).await;
    assert_eq!(metric(&plan, "files_read"), [0], "{plan}");
    assert!(rows(&session, none).await.contains("| 0 |"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_joined_with_its_own_aggregate_reads_only_the_files_the_keys_reach() {
    let dir = tempfile::tempdir().unwrap();
    let session = twenty_files(dir.path()).await;
    // The first id of each group lies in the first file: the probe side reads just that one.
    let first = "SELECT t.grp, t.id, t.v FROM lake.s.t t \
                 JOIN (SELECT grp, min(id) AS first FROM lake.s.t GROUP BY grp) f \
                   ON t.id = f.first ORDER BY t.grp";
    let plan = rows(&session, &format!("EXPLAIN ANALYZE {first}")).await;
    let mut read = metric(&plan, "files_read");
    read.sort();
    assert_eq!(read, [1, 20], "{plan}");
    assert_eq!(
        rows(&session, first).await,
        "+-----+----+---+\n\
         | grp | id | v |\n\
         +-----+----+---+\n\
         | g0  | 0  | 0 |\n\
         | g1  | 1  | 1 |\n\
         | g2  | 2  | 2 |\n\
         +-----+----+---+"
    );
}
