//! Job metrics in the Prometheus text format: the dashboard's `/metrics`, and `floe
//! --metrics ADDR` for scripts.
//!
//! ```text
//! floe_job_records_in_total{job="..."}            records read from the sources
//! floe_job_records_out_total{job="..."}           rows written to the target
//! floe_job_records_dead_lettered_total{job="..."} records sent to the dead-letter table
//! floe_job_records_late_total{job="..."}       of those, late for their window or join
//! floe_job_last_checkpoint{job="..."}             the last checkpoint id
//! floe_job_last_checkpoint_timestamp_seconds{job="..."}
//! floe_job_checkpoint_duration_seconds{job="..."} how long the last checkpoint took
//! floe_job_commit_duration_seconds{job="..."}     the table commits within it
//! floe_job_up{job="...",state="..."}              1 while running, 0 otherwise
//! ```

use std::sync::Arc;

use tokio::task::JoinHandle;

use super::http::{self, Reply};
use crate::error::Result;
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
        "floe_job_records_late_total",
        "counter",
        "Records later than their window or join allowed, sent to the dead-letter table.",
        &|r| r.records_late.to_string(),
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

/// Serve the metrics of `session`'s jobs on `addr` (every path) until the returned task is
/// aborted.
pub async fn serve(addr: &str, session: Arc<Session>) -> Result<JoinHandle<()>> {
    let listener = http::bind(addr, "the metrics address").await?;
    Ok(http::serve(
        listener,
        Arc::new(move |_request: &http::Request| {
            Reply::ok("text/plain; version=0.0.4", render(&session.jobs().rows()))
        }),
    ))
}
