//! Ad-hoc scans of lake tables: files pruned by what the query knows only as it runs (a hash
//! join's build-side keys), shown by `EXPLAIN ANALYZE`, the rows unchanged.

mod common;

use common::{lake_session, rows};

/// `lake.s.t` with 20 files: ids 0..1000, file `i` holding ids `50 i .. 50 i + 49`; queries
/// in `partitions` partitions. (With one, a hash join's probe side starts once its filter is
/// set; with several, a partition may start while another sets it, and open its first files
/// unpruned.)
async fn twenty_files(dir: &std::path::Path, partitions: usize) -> floe::Session {
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
        .sql(&format!(
            "SET datafusion.execution.target_partitions = {partitions}"
        ))
        .await
        .unwrap();
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
    let session = twenty_files(dir.path(), 1).await;
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

/// A filter prunes files, and DataFusion applies it to the rows: the reader filters rows
/// itself only in files that can hold more than one row group of the table's size, where
/// skipping row groups can pay (`write.parquet.row-group-size-bytes`; 128 MiB by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reader_filters_rows_only_in_files_larger_than_a_row_group() {
    let dir = tempfile::tempdir().unwrap();
    let session = twenty_files(dir.path(), 2).await;
    // The same rows in a table whose row groups are at most 1,000 bytes: its files are
    // larger.
    session
        .sql(
            "CREATE TABLE lake.s.small_groups (id BIGINT NOT NULL, grp STRING NOT NULL, \
               v INT NOT NULL) WITH ('write.parquet.row-group-size-bytes' = '1000');
             INSERT INTO lake.s.small_groups SELECT * FROM lake.s.t;",
        )
        .await
        .unwrap();
    let mut results = Vec::new();
    for (table, row_filtered) in [("t", 0), ("small_groups", 1)] {
        let query = format!(
            "SELECT grp, count(*) AS n, sum(v) AS v FROM lake.s.{table} \
             WHERE grp <> 'g1' AND id < 990 GROUP BY grp ORDER BY grp"
        );
        let plan = rows(&session, &format!("EXPLAIN ANALYZE {query}")).await;
        let filtered: usize = metric(&plan, "files_row_filtered").iter().sum();
        let read: usize = metric(&plan, "files_read").iter().sum();
        assert!(read > 0, "{plan}");
        assert_eq!(filtered, row_filtered * read, "{table}: {plan}");
        results.push(rows(&session, &query).await);
    }
    assert_eq!(results[0], results[1]);
    // Files 0-18 keep values 0-49 of groups g0 (17 each, summing 408) and g2 (16, 392);
    // file 19 values 0-39 (14 summing 273; 13 summing 260).
    assert_eq!(
        results[0],
        "+-----+-----+------+\n\
         | grp | n   | v    |\n\
         +-----+-----+------+\n\
         | g0  | 337 | 8025 |\n\
         | g2  | 317 | 7708 |\n\
         +-----+-----+------+"
    );
}

/// The self-join of `lake.s.t` with each group's first id (all in the first file).
const FIRST_OF_EACH_GROUP: &str = "SELECT t.grp, t.id, t.v FROM lake.s.t t \
     JOIN (SELECT grp, min(id) AS first FROM lake.s.t GROUP BY grp) f \
       ON t.id = f.first ORDER BY t.grp";

const FIRST_OF_EACH_GROUP_ROWS: &str = "+-----+----+---+\n\
     | grp | id | v |\n\
     +-----+----+---+\n\
     | g0  | 0  | 0 |\n\
     | g1  | 1  | 1 |\n\
     | g2  | 2  | 2 |\n\
     +-----+----+---+";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_joined_with_its_own_aggregate_reads_only_the_files_the_keys_reach() {
    let dir = tempfile::tempdir().unwrap();
    let session = twenty_files(dir.path(), 1).await;
    let plan = rows(&session, &format!("EXPLAIN ANALYZE {FIRST_OF_EACH_GROUP}")).await;
    let mut read = metric(&plan, "files_read");
    read.sort();
    assert_eq!(read, [1, 20], "{plan}");
    assert_eq!(
        rows(&session, FIRST_OF_EACH_GROUP).await,
        FIRST_OF_EACH_GROUP_ROWS
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_in_several_partitions_prunes_each_file_by_the_filter_as_it_stands() {
    let dir = tempfile::tempdir().unwrap();
    let session = twenty_files(dir.path(), 4).await;
    let plan = rows(&session, &format!("EXPLAIN ANALYZE {FIRST_OF_EACH_GROUP}")).await;
    // The aggregate's scan reads all 20; the probe side's four partitions each decide file
    // by file, so every file is read or pruned, and the rows are the same.
    let read = metric(&plan, "files_read");
    let pruned = metric(&plan, "files_pruned_at_run");
    let accounted: Vec<usize> = read.iter().zip(&pruned).map(|(r, p)| r + p).collect();
    assert_eq!(accounted, [20, 20], "{plan}");
    assert!(read.contains(&20) && pruned.contains(&0), "{plan}");
    assert_eq!(
        rows(&session, FIRST_OF_EACH_GROUP).await,
        FIRST_OF_EACH_GROUP_ROWS
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_top_n_prunes_the_files_its_threshold_rules_out() {
    let dir = tempfile::tempdir().unwrap();
    let session = twenty_files(dir.path(), 1).await;
    // Whichever file is read first, its values rule out every file on one side of it: those
    // above it for the lowest ids, those below for the highest.
    let mut pruned = 0;
    for (order, expected) in [("ASC", ["0", "1", "2"]), ("DESC", ["999", "998", "997"])] {
        let top = format!("SELECT id FROM lake.s.t ORDER BY id {order} LIMIT 3");
        let plan = rows(&session, &format!("EXPLAIN ANALYZE {top}")).await;
        assert!(plan.contains("dynamic_filters=["), "{plan}");
        let [read] = metric(&plan, "files_read")[..] else {
            panic!("{plan}")
        };
        let [skipped] = metric(&plan, "files_pruned_at_run")[..] else {
            panic!("{plan}")
        };
        assert_eq!(read + skipped, 20, "{plan}");
        pruned += skipped;
        let got = rows(&session, &top).await;
        let ids: Vec<&str> = got
            .lines()
            .skip(3)
            .filter_map(|l| l.split('|').nth(1))
            .map(str::trim)
            .collect();
        assert_eq!(ids, expected, "{got}");
    }
    assert!(pruned >= 10, "the two top-Ns pruned {pruned} of 40 files");
}
