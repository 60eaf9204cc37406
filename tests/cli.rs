//! The `floe` binary, run as a user runs it: scripts, exit codes, output formats, errors.

mod common;

use std::path::Path;
use std::process::{Command, Output};

fn floe(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_floe"))
        .current_dir(dir)
        .args(args)
        .output()
        .expect("the floe binary runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

const CATALOG: &str = "CREATE CATALOG lake WITH ('type' = 'iceberg', 'catalog-type' = 'sql', \
                       'uri' = 'sqlite:lake/catalog.db', 'warehouse' = 'lake/warehouse');";

#[test]
fn a_script_stops_at_the_first_failing_statement_and_names_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("s.sql");
    std::fs::write(
        &script,
        "SELECT 1 AS one;\n\n-- the next statement fails\nSELECT *\n  FROM nowhere;\nSELECT 3 AS three;\n",
    )
    .unwrap();
    let out = floe(dir.path(), &["-q", "--format", "csv", "-f", "s.sql"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stdout), "one\n1\n");
    let err = text(&out.stderr);
    assert!(err.contains("Error in s.sql at line 4:"), "{err}");
    assert!(err.contains("nowhere"), "{err}");

    let out = floe(
        dir.path(),
        &[
            "-q",
            "--format",
            "csv",
            "--continue-on-error",
            "-f",
            "s.sql",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stdout), "one\n1\nthree\n3\n");
}

#[test]
fn a_missing_script_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = floe(dir.path(), &["-f", "nope.sql"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("cannot read nope.sql"));
}

#[test]
fn output_formats() {
    let dir = tempfile::tempdir().unwrap();
    let sql =
        "SELECT 1 AS a, 'x' AS b, CAST(NULL AS INT) AS c UNION ALL SELECT 2, 'y', 3 ORDER BY a";
    let run = |format: &str| {
        let out = floe(dir.path(), &["-q", "--format", format, "-c", sql]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    assert_eq!(run("csv"), "a,b,c\n1,x,\n2,y,3\n");
    assert_eq!(
        run("json"),
        "[{\"a\":1,\"b\":\"x\",\"c\":null},{\"a\":2,\"b\":\"y\",\"c\":3}]\n"
    );
    assert_eq!(
        run("ndjson"),
        "{\"a\":1,\"b\":\"x\",\"c\":null}\n{\"a\":2,\"b\":\"y\",\"c\":3}\n"
    );
    let table = run("table");
    assert!(table.contains("| a | b | c |"), "{table}");
    assert!(
        !table.contains("row(s) fetched"),
        "quiet mode prints no footer"
    );

    let out = floe(dir.path(), &["-c", sql]);
    let loud = text(&out.stdout);
    assert!(loud.contains("2 row(s) fetched."), "{loud}");
    assert!(loud.contains("Elapsed"), "{loud}");

    let out = floe(dir.path(), &["--maxrows", "1", "-c", sql]);
    let cut = text(&out.stdout);
    assert!(
        cut.contains("2 row(s) fetched. (First 1 displayed."),
        "{cut}"
    );
    assert!(!cut.contains("| 2 |"), "{cut}");

    let out = floe(
        dir.path(),
        &["-q", "--format", "json", "-c", "SELECT 1 AS a WHERE false"],
    );
    assert_eq!(text(&out.stdout), "[]\n");
}

/// Run `floe -q --format csv -c <lake catalog> -c SQL ...` in `dir`.
fn lake_csv(dir: &Path, sql: &[&str]) -> Output {
    let mut args = vec!["-q", "--format", "csv", "-c", CATALOG];
    for s in sql {
        args.extend(["-c", s]);
    }
    floe(dir, &args)
}

/// The stdout lines of a successful run, without the CSV header.
fn csv_rows(out: &Output) -> Vec<String> {
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .skip(1)
        .map(str::to_string)
        .collect()
}

#[test]
fn commands_run_in_one_session_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let out = lake_csv(
        dir.path(),
        &[
            "CREATE SCHEMA lake.db; CREATE TABLE lake.db.t (id BIGINT, ts TIMESTAMP) PARTITIONED BY (days(ts));",
            "INSERT INTO lake.db.t VALUES (1, TIMESTAMP '2024-05-01 10:00:00');",
            "SELECT id FROM lake.db.t;",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "count\n1\nid\n1\n");
    // The catalog lives on in its files: a new process sees the table.
    let out = lake_csv(dir.path(), &["SELECT count(*) AS n FROM lake.db.t"]);
    assert_eq!(csv_rows(&out), vec!["1"]);
    // Relative paths were stored as absolute file:// URIs.
    let out = lake_csv(dir.path(), &["SELECT file_path FROM lake.db.\"t$files\""]);
    let path = csv_rows(&out).join("\n");
    assert!(path.starts_with("file:///"), "{path}");
    assert!(
        path.contains("/lake/warehouse/db/t/data/ts_day=2024-05-01/"),
        "{path}"
    );
}

#[test]
fn time_travel_by_snapshot_id_and_by_timestamp() {
    let dir = tempfile::tempdir().unwrap();
    csv_rows(&lake_csv(
        dir.path(),
        &[
            "CREATE SCHEMA lake.db; CREATE TABLE lake.db.t (id BIGINT);",
            "INSERT INTO lake.db.t VALUES (1); INSERT INTO lake.db.t VALUES (2), (3);",
        ],
    ));
    let ids = csv_rows(&lake_csv(
        dir.path(),
        &["SELECT snapshot_id FROM lake.db.\"t$snapshots\" ORDER BY committed_at"],
    ));
    assert_eq!(ids.len(), 2);
    let count_at = |clause: &str| {
        csv_rows(&lake_csv(
            dir.path(),
            &[&format!("SELECT count(*) FROM lake.db.t {clause}")],
        ))
    };
    assert_eq!(
        count_at(&format!("FOR VERSION AS OF {}", ids[0])),
        vec!["1"]
    );
    assert_eq!(count_at(&format!("VERSION AS OF {}", ids[1])), vec!["3"]);
    assert_eq!(count_at(""), vec!["3"]);

    let times = csv_rows(&lake_csv(
        dir.path(),
        &[
            "SELECT CAST(made_current_at AS VARCHAR) AS t FROM lake.db.\"t$history\" ORDER BY made_current_at",
        ],
    ));
    // As of the first commit's own time: the first snapshot.
    let first = times[0].replace('Z', "").replace('T', " ");
    assert_eq!(
        count_at(&format!("FOR TIMESTAMP AS OF '{first}'")),
        vec!["1"]
    );
}

#[test]
fn describe_and_show_catalogs() {
    let dir = tempfile::tempdir().unwrap();
    let out = lake_csv(
        dir.path(),
        &[
            "CREATE SCHEMA lake.db; CREATE TABLE lake.db.t (id BIGINT NOT NULL, ts TIMESTAMP, s STRING) PARTITIONED BY (hours(ts), bucket(4, id)); INSERT INTO lake.db.t VALUES (1, NULL, 'a');",
            "DESCRIBE lake.db.t",
            "SHOW CATALOGS",
        ],
    );
    let s = csv_rows(&out).join("\n");
    for line in [
        "id,long,NO",
        "ts,timestamp,YES",
        "s,string,YES",
        "Part 0,hours(ts),ts_hour",
        "Part 1,\"bucket(4, id)\",id_bucket",
        "Format version,2,",
        "Snapshots,1,",
        "datafusion,datafusion (in-memory),",
    ] {
        assert!(
            s.lines().any(|l| l == line),
            "missing line {line:?} in:\n{s}"
        );
    }
    assert!(s.contains("Current snapshot,"), "{s}");
    assert!(s.contains("lake,iceberg (sql),"), "{s}");
}

#[test]
fn catalog_secrets_are_masked() {
    let dir = tempfile::tempdir().unwrap();
    let out = floe(
        dir.path(),
        &[
            "-q",
            "--format",
            "csv",
            "-c",
            "CREATE CATALOG m WITH ('type' = 'iceberg', 'catalog-type' = 'memory', 'warehouse' = 'wh', 's3.secret-access-key' = 'hunter2', 's3.region' = 'eu-west-1')",
            "-c",
            "SHOW CATALOGS",
        ],
    );
    let s = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(s.contains("s3.secret-access-key=****"), "{s}");
    assert!(s.contains("s3.region=eu-west-1"), "{s}");
    assert!(!s.contains("hunter2"), "{s}");
}

#[test]
fn metrics_are_served_while_jobs_run() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let addr = common::process::free_address();
    let script = format!(
        "{CATALOG}
         CREATE SCHEMA lake.m; CREATE TABLE lake.m.t (order_id BIGINT);
         CREATE SOURCE gen WITH ('connector' = 'datagen', 'profile' = 'orders',
           'number-of-rows' = '40000', 'rows-per-second' = '10000');
         SET 'pipeline.name' = 'metered'; SET 'checkpoint.interval' = '200ms';
         INSERT INTO lake.m.t SELECT order_id FROM gen;"
    );
    std::fs::write(dir.path().join("job.sql"), script).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_floe"))
        .current_dir(dir.path())
        .args(["-q", "--metrics", &addr, "-f", "job.sql"])
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    let mut page = String::new();
    // A client that connects and sends nothing must not hold up the others.
    let mut silent = None;
    while start.elapsed() < std::time::Duration::from_secs(20) {
        std::thread::sleep(std::time::Duration::from_millis(300));
        let Ok(mut conn) = std::net::TcpStream::connect(&addr) else {
            continue;
        };
        if silent.is_none() {
            silent = Some(std::net::TcpStream::connect(&addr).unwrap());
            continue;
        }
        conn.set_read_timeout(Some(std::time::Duration::from_secs(3)))
            .unwrap();
        conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        page.clear();
        conn.read_to_string(&mut page)
            .expect("the metrics endpoint answers while another client is silent");
        if page.contains("floe_job_last_checkpoint{job=\"metered\"} 2") {
            break;
        }
    }
    let status = child.wait().unwrap();
    assert!(status.success());
    assert!(page.starts_with("HTTP/1.1 200 OK"), "{page}");
    assert!(
        page.contains("# TYPE floe_job_records_in_total counter"),
        "{page}"
    );
    assert!(
        page.contains("floe_job_records_in_total{job=\"metered\"}"),
        "{page}"
    );
    assert!(
        page.contains("floe_job_up{job=\"metered\",state=\"running\"} 1"),
        "{page}"
    );
}

/// A REST catalog server that accepts connections and never answers: a call to it fails
/// after `rest.request-timeout` with an error that says so, instead of waiting forever.
#[test]
fn a_rest_catalog_that_never_answers_times_out() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming() {
            held.push(conn);
        }
    });
    let mut child = Command::new(env!("CARGO_BIN_EXE_floe"))
        .args([
            "-q",
            "-c",
            &format!(
                "CREATE CATALOG r WITH ('type' = 'iceberg', 'catalog-type' = 'rest', \
                 'uri' = 'http://127.0.0.1:{port}', 'rest.request-timeout' = '1s')"
            ),
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > std::time::Duration::from_secs(30) {
            child.kill().unwrap();
            panic!("floe still waits for the REST catalog after 30 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("no answer in time"), "{err}");
}
