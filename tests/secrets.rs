//! No secret leaks: catalogs, sources and a job configured with a secret in every option that
//! takes one, driven into the error paths floe has (unreachable servers, bad settings, a job
//! that retries); no output, metric, state file, warehouse file or history entry holds any
//! of them.

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Every secret the statements below carry; none may be seen anywhere.
const SECRETS: [&str; 16] = [
    "PgPass1",
    "PgPass2",
    "RestCred3",
    "RestTok4",
    "HeaderKey5",
    "S3Secret6",
    "S3Token7",
    "SaslPass8",
    "JaasPass9",
    "RegPass10",
    "RegInfo11",
    "AwsSecret12",
    "AwsToken13",
    "BadPass14",
    "GlueSecret15",
    "GlueToken16",
];

fn statements(dir: &Path) -> Vec<String> {
    let lake = format!(
        "CREATE CATALOG lake WITH ('type' = 'iceberg', 'catalog-type' = 'sql', \
         'uri' = 'sqlite:{0}/catalog.db', 'warehouse' = '{0}/wh', \
         's3.secret-access-key' = 'S3Secret6', 's3.session-token' = 'S3Token7');",
        dir.display()
    );
    [
        "CREATE CATALOG pg WITH ('type' = 'iceberg', 'catalog-type' = 'sql', \
         'uri' = 'postgres://floe:PgPass1@127.0.0.1:1/db', 'warehouse' = 'wh');",
        "CREATE CATALOG pgq WITH ('type' = 'iceberg', 'catalog-type' = 'sql', \
         'uri' = 'postgres://127.0.0.1:1/db?user=floe&password=PgPass2', 'warehouse' = 'wh');",
        "CREATE CATALOG r WITH ('type' = 'iceberg', 'catalog-type' = 'rest', \
         'uri' = 'http://127.0.0.1:1', 'credential' = 'id:RestCred3', 'token' = 'RestTok4', \
         'header.X-Api-Key' = 'HeaderKey5', 'rest.request-timeout' = '2s');",
        "CREATE CATALOG g WITH ('type' = 'iceberg', 'catalog-type' = 'glue', \
         'warehouse' = 's3://b/w', 'glue.region' = 'us-east-1', 'glue.endpoint' = 'http://127.0.0.1:1', \
         'glue.access-key-id' = 'AKID', 'glue.secret-access-key' = 'GlueSecret15', \
         'glue.session-token' = 'GlueToken16');",
        &lake,
        "SHOW CATALOGS;",
        "CREATE SOURCE k WITH ('connector' = 'kafka', 'topic' = 't', \
         'properties.bootstrap.servers' = '127.0.0.1:1', \
         'properties.security.protocol' = 'SASL_PLAINTEXT', \
         'properties.sasl.mechanism' = 'PLAIN', 'properties.sasl.username' = 'u', \
         'properties.sasl.password' = 'SaslPass8', \
         'format' = 'avro-confluent', 'avro-confluent.url' = 'http://u:RegPass10@127.0.0.1:1/', \
         'avro-confluent.basic-auth.user-info' = 'u:RegInfo11');",
        "CREATE SOURCE jaas WITH ('connector' = 'kafka', 'topic' = 't', \
         'properties.bootstrap.servers' = '127.0.0.1:1', \
         'properties.sasl.jaas.config' = 'PlainLoginModule required password=\"JaasPass9\";', \
         'format' = 'json');",
        "CREATE SOURCE kin WITH ('connector' = 'kinesis', 'stream' = 's', \
         'aws.region' = 'us-east-1', 'aws.endpoint' = 'http://127.0.0.1:1', \
         'aws.access-key-id' = 'AKID', 'aws.secret-access-key' = 'AwsSecret12', \
         'aws.session-token' = 'AwsToken13', 'format' = 'json');",
        "CREATE SOURCE bad WITH ('connector' = 'kafka', 'topic' = 't', \
         'properties.bootstrap.servers' = '127.0.0.1:1', 'properties.sasl.password' = 'BadPass14', \
         'properties.no.such.setting' = 'x', 'format' = 'json');",
        "SHOW SOURCES;",
        "DESCRIBE SOURCE k;",
        "DESCRIBE SOURCE kin;",
        "CREATE SCHEMA lake.ns;",
        "SET 'checkpoint.interval' = '200ms';",
        "SET 'pipeline.name' = 'leaky';",
        "INSERT INTO lake.ns SELECT * FROM k ROUTE BY 'x';",
        "SET 'pipeline.name' = 'leaky-kinesis';",
        "INSERT INTO lake.ns SELECT * FROM kin ROUTE BY 'y';",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Every file under `dir`, as bytes, with its path.
fn files(dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files(&path, out);
        } else if let Ok(bytes) = std::fs::read(&path) {
            out.push((path.display().to_string(), bytes));
        }
    }
}

fn metrics(addr: &str) -> String {
    let Ok(mut conn) = std::net::TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = conn.set_read_timeout(Some(Duration::from_secs(3)));
    let _ = conn.write_all(b"GET /metrics HTTP/1.1\r\n\r\n");
    let mut page = String::new();
    let _ = conn.read_to_string(&mut page);
    page
}

#[test]
fn no_secret_is_shown_logged_or_kept() {
    let dir = tempfile::tempdir().unwrap();
    let addr = common::process::free_address();
    // The REPL, on a pipe: statements typed, kept in the history of this HOME.
    let mut child = Command::new(env!("CARGO_BIN_EXE_floe"))
        .current_dir(dir.path())
        .env("HOME", dir.path())
        .args(["--metrics", &addr])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for s in statements(dir.path()) {
        writeln!(stdin, "{s}").unwrap();
    }
    // The jobs retry against servers that are not there; their errors show meanwhile.
    let start = Instant::now();
    let mut pages = String::new();
    while start.elapsed() < Duration::from_secs(6) {
        std::thread::sleep(Duration::from_millis(500));
        pages.push_str(&metrics(&addr));
    }
    for s in [
        "SHOW JOBS;",
        "SELECT name, state, error FROM floe.jobs;",
        "STOP JOB 'leaky';",
        "STOP JOB 'leaky-kinesis';",
        "\\q",
    ] {
        writeln!(stdin, "{s}").unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    // The paths were taken: the statements ran, and the jobs showed their errors.
    assert!(
        stdout.contains("****"),
        "secrets are shown masked: {stdout}"
    );
    assert!(stdout.contains("leaky"), "{stdout}");
    assert!(pages.contains("floe_job_up{job=\"leaky\""), "{pages}");
    assert!(
        stderr.contains("Error") || stdout.contains("Error"),
        "{stdout}\n{stderr}"
    );
    let mut kept = Vec::new();
    files(dir.path(), &mut kept);
    assert!(
        kept.iter().any(|(p, _)| p.ends_with(".floe_history")),
        "the history was written"
    );
    for secret in SECRETS {
        assert!(
            !stdout.contains(secret),
            "{secret} in the output:\n{stdout}"
        );
        assert!(
            !stderr.contains(secret),
            "{secret} in the errors:\n{stderr}"
        );
        assert!(!pages.contains(secret), "{secret} in the metrics");
        for (path, bytes) in &kept {
            let found = bytes.windows(secret.len()).any(|w| w == secret.as_bytes());
            assert!(!found, "{secret} in {path}");
        }
    }
}
