//! The server's dashboard, over HTTP (`floe serve --dashboard ADDR`): the jobs live, with
//! plots, from a page that needs no build step (`dashboard.html`: HTML, CSS and a script
//! drawing SVG).
//!
//! ```text
//! GET /            the page; it asks for /api/state every second
//! GET /api/state   JSON: each job's row of SHOW JOBS, its history (records, rate and lag
//!                  per second, the last 10 minutes), its checkpoints (when, how long, the
//!                  commits' share), and each table it writes (data files, mean file size)
//! GET /metrics     the Prometheus text (as `floe --metrics`)
//! ```
//! With a password, every request must carry it (HTTP Basic, the server's user).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use super::http::{Reply, Request};
use crate::stream::registry::{JobRow, Jobs};

/// Samples kept per job: one a second, 10 minutes.
const SAMPLES: usize = 600;
/// Checkpoints kept per job.
const CHECKPOINTS: usize = 200;

#[derive(Debug, Clone)]
struct Sample {
    at_ms: i64,
    records_in: u64,
    records_out: u64,
    records_dead: u64,
    rate: f64,
    lag: Option<u64>,
}

#[derive(Debug, Clone)]
struct Checkpoint {
    id: u64,
    at_ms: u64,
    duration_ms: u64,
    commit_ms: u64,
}

#[derive(Debug, Default)]
struct History {
    samples: VecDeque<Sample>,
    checkpoints: VecDeque<Checkpoint>,
}

/// The jobs' history, sampled by [`Dashboard::sample`].
pub struct Dashboard {
    jobs: Arc<Jobs>,
    history: Mutex<BTreeMap<String, History>>,
    /// `Basic base64(user:password)`, when requests must carry it.
    authorization: Option<String>,
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

impl Dashboard {
    pub fn new(jobs: Arc<Jobs>, login: Option<(&str, &str)>) -> Self {
        use base64::Engine;
        let authorization = login.map(|(user, password)| {
            let token =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            format!("Basic {token}")
        });
        Self {
            jobs,
            history: Mutex::default(),
            authorization,
        }
    }

    /// Take a sample of every job now.
    pub fn sample(&self) {
        let rows = self.jobs.rows();
        let at_ms = now_ms();
        let Ok(mut history) = self.history.lock() else {
            return;
        };
        for r in &rows {
            let h = history.entry(r.name.clone()).or_default();
            h.samples.push_back(Sample {
                at_ms,
                records_in: r.records_in,
                records_out: r.records_out,
                records_dead: r.records_dead,
                rate: r.rate,
                lag: r.lag,
            });
            while h.samples.len() > SAMPLES {
                h.samples.pop_front();
            }
            if r.checkpoint > 0 && h.checkpoints.back().is_none_or(|c| c.id != r.checkpoint) {
                h.checkpoints.push_back(Checkpoint {
                    id: r.checkpoint,
                    at_ms: r.checkpoint_time_ms,
                    duration_ms: r.checkpoint_duration_ms,
                    commit_ms: r.commit_duration_ms,
                });
                while h.checkpoints.len() > CHECKPOINTS {
                    h.checkpoints.pop_front();
                }
            }
        }
        // Jobs no longer listed go.
        history.retain(|name, _| rows.iter().any(|r| &r.name == name));
    }

    /// Sample every second, for ever.
    pub async fn run(self: Arc<Self>) {
        loop {
            self.sample();
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// The state the page shows.
    pub fn state(&self) -> Value {
        let rows = self.jobs.rows();
        let history = self.history.lock();
        let tables = self.jobs.table_health();
        let jobs: Vec<Value> = rows
            .iter()
            .map(|r| {
                let h = history.as_ref().ok().and_then(|h| h.get(&r.name));
                job_json(r, h, &tables)
            })
            .collect();
        json!({ "now_ms": now_ms(), "jobs": jobs })
    }

    /// Answer one request.
    pub fn answer(&self, request: &Request) -> Reply {
        if let Some(want) = &self.authorization
            && request.authorization.as_deref() != Some(want.as_str())
        {
            return Reply {
                status: "401 Unauthorized",
                content_type: "text/plain",
                headers: vec![("WWW-Authenticate", "Basic realm=\"floe\"".into())],
                body: "this server takes its password\n".into(),
            };
        }
        match request.path.as_str() {
            "/" | "/index.html" => Reply::ok(
                "text/html; charset=utf-8",
                include_str!("dashboard.html").to_string(),
            ),
            "/api/state" => Reply::ok("application/json", self.state().to_string()),
            "/metrics" => Reply::ok(
                "text/plain; version=0.0.4",
                super::metrics::render(&self.jobs.rows()),
            ),
            _ => Reply::not_found(),
        }
    }
}

fn job_json(
    r: &JobRow,
    h: Option<&History>,
    tables: &[(String, String, crate::stream::status::TableHealth)],
) -> Value {
    let samples: Vec<Value> = h
        .map(|h| {
            h.samples
                .iter()
                .map(|s| {
                    json!({"at_ms": s.at_ms, "records_in": s.records_in,
                           "records_out": s.records_out, "records_dead": s.records_dead,
                           "rate": s.rate, "lag": s.lag})
                })
                .collect()
        })
        .unwrap_or_default();
    let checkpoints: Vec<Value> = h
        .map(|h| {
            h.checkpoints
                .iter()
                .map(|c| {
                    json!({"id": c.id, "at_ms": c.at_ms, "duration_ms": c.duration_ms,
                           "commit_ms": c.commit_ms})
                })
                .collect()
        })
        .unwrap_or_default();
    let tables: Vec<Value> = tables
        .iter()
        .filter(|(job, _, _)| job == &r.name)
        .map(|(_, table, t)| {
            json!({"table": table, "data_files": t.data_files, "data_bytes": t.data_bytes,
                   "mean_file_size": t.mean_file_size(), "snapshots": t.snapshots,
                   "maintenance": t.maintenance, "error": t.error})
        })
        .collect();
    json!({
        "name": r.name, "state": r.state, "target": r.target, "sources": r.sources,
        "records_in": r.records_in, "records_out": r.records_out,
        "records_dead": r.records_dead, "rate": r.rate, "lag": r.lag,
        "checkpoint": r.checkpoint, "error": r.error,
        "history": samples, "checkpoints": checkpoints, "tables": tables,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_guards_every_path() {
        let d = Dashboard::new(Arc::new(Jobs::default()), Some(("floe", "pw")));
        let ask = |auth: Option<&str>| {
            d.answer(&Request {
                path: "/api/state".into(),
                authorization: auth.map(String::from),
            })
            .status
        };
        assert_eq!(ask(None), "401 Unauthorized");
        assert_eq!(ask(Some("Basic Zm9lOnB3")), "401 Unauthorized");
        // base64("floe:pw")
        assert_eq!(ask(Some("Basic ZmxvZTpwdw==")), "200 OK");
        let open = Dashboard::new(Arc::new(Jobs::default()), None);
        let state = open.answer(&Request {
            path: "/api/state".into(),
            authorization: None,
        });
        assert_eq!(state.status, "200 OK");
        assert!(state.body.contains("\"jobs\":[]"), "{}", state.body);
    }
}
