//! `--metrics ADDR`: job metrics in the Prometheus text format, served over HTTP.
//!
//! ```text
//! floe_job_records_in_total{job="..."}            records read from the sources
//! floe_job_records_out_total{job="..."}           rows written to the target
//! floe_job_records_dead_lettered_total{job="..."} records sent to the dead-letter table
//! floe_job_last_checkpoint{job="..."}             the last checkpoint id
//! floe_job_last_checkpoint_timestamp_seconds{job="..."}
//! floe_job_checkpoint_duration_seconds{job="..."} how long the last checkpoint took
//! floe_job_commit_duration_seconds{job="..."}     the table commits within it
//! floe_job_up{job="...",state="..."}              1 while running, 0 otherwise
//! ```

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::error::{Error, Result};
use crate::session::Session;
use crate::stream::registry::JobRow;

/// The metrics page for `rows`.
pub fn render(rows: &[JobRow]) -> String {
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, value: &dyn Fn(&JobRow) -> String| {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for r in rows {
            out.push_str(&format!(
                "{name}{{job=\"{}\"}} {}\n",
                escape(&r.name),
                value(r)
            ));
        }
    };
    family(
        "floe_job_records_in_total",
        "counter",
        "Records read from the sources.",
        &|r| r.records_in.to_string(),
    );
    family(
        "floe_job_records_out_total",
        "counter",
        "Rows written to the target.",
        &|r| r.records_out.to_string(),
    );
    family(
        "floe_job_records_dead_lettered_total",
        "counter",
        "Records sent to the dead-letter table.",
        &|r| r.records_dead.to_string(),
    );
    family(
        "floe_job_last_checkpoint",
        "gauge",
        "The last checkpoint id.",
        &|r| r.checkpoint.to_string(),
    );
    family(
        "floe_job_last_checkpoint_timestamp_seconds",
        "gauge",
        "When the last checkpoint was recorded.",
        &|r| format!("{:.3}", r.checkpoint_time_ms as f64 / 1000.0),
    );
    family(
        "floe_job_checkpoint_duration_seconds",
        "gauge",
        "How long the last checkpoint took.",
        &|r| format!("{:.3}", r.checkpoint_duration_ms as f64 / 1000.0),
    );
    family(
        "floe_job_commit_duration_seconds",
        "gauge",
        "How long the table commits of the last checkpoint took.",
        &|r| format!("{:.3}", r.commit_duration_ms as f64 / 1000.0),
    );
    out.push_str("# HELP floe_job_up 1 while the job runs.\n# TYPE floe_job_up gauge\n");
    for r in rows {
        let up = u8::from(matches!(r.state.as_str(), "running" | "starting"));
        out.push_str(&format!(
            "floe_job_up{{job=\"{}\",state=\"{}\"}} {up}\n",
            escape(&r.name),
            r.state
        ));
    }
    out
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Connections served at once; more wait to be accepted.
const CONNECTIONS: usize = 32;
/// How long a client may take to send its request and read the answer.
const CLIENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Serve the metrics of `session`'s jobs on `addr` until the returned task is aborted. Each
/// connection is served on its own task, within `CLIENT_TIMEOUT`, at most `CONNECTIONS`
/// at once: a client that connects and sends nothing delays no other.
pub async fn serve(addr: &str, session: Arc<Session>) -> Result<JoinHandle<()>> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| Error::io(format!("binding the metrics address {addr}"), e))?;
    let slots = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS));
    Ok(tokio::spawn(async move {
        let mut clients = tokio::task::JoinSet::new();
        loop {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let Ok((conn, _)) = listener.accept().await else {
                return;
            };
            let body = render(&session.jobs().rows());
            clients.spawn(async move {
                let _ = tokio::time::timeout(CLIENT_TIMEOUT, answer(conn, body)).await;
                drop(slot);
            });
            // Reap the finished ones, so the set holds only clients being served.
            while clients.try_join_next().is_some() {}
        }
    }))
}

/// Answer one request (not interpreted) with `body`, and close the connection.
async fn answer(mut conn: tokio::net::TcpStream, body: String) {
    let mut buf = [0u8; 1024];
    let _ = conn.read(&mut buf).await;
    let response = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = conn.write_all(response.as_bytes()).await;
    let _ = conn.shutdown().await;
}
