//! What the benchmarks share: one runtime thread, a session on a lake in a folder, settings
//! from the environment, peak memory, a running job's sustained rate, and whole `floe`
//! processes ([`process`]).

use std::time::{Duration, Instant};

use floe::Session;

pub mod process;

/// A runtime with one worker: benchmarks measure one core.
#[allow(dead_code)]
pub fn one_core() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A session with a sqlite catalog `lake`, job state and checkpoints (10 s or
/// `FLOE_BENCH_INTERVAL`, the INSERT waiting for its job) under `dir`, its jobs on one
/// thread (`parallelism.default` 1: these benchmarks measure one core), after running
/// `setup`.
#[allow(dead_code)]
pub async fn lake_session(dir: &std::path::Path, setup: &str) -> Session {
    let d = dir.display();
    let interval = std::env::var("FLOE_BENCH_INTERVAL").unwrap_or_else(|_| "10s".into());
    let session = Session::new();
    session
        .sql(&format!(
            "CREATE CATALOG lake WITH ('type' = 'iceberg', 'catalog-type' = 'sql',
               'uri' = 'sqlite:{d}/catalog.db', 'warehouse' = '{d}/warehouse');
             SET 'state.dir' = '{d}/state'; SET 'checkpoint.interval' = '{interval}';
             SET 'table.dml-sync' = 'true'; SET 'parallelism.default' = '1';
             {setup}"
        ))
        .await
        .expect("setup");
    session
}

/// Setting `key` from the environment, if set.
#[allow(dead_code)]
pub fn env<T: std::str::FromStr>(key: &str) -> Option<T> {
    std::env::var(key).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{key}: not a valid value: {v}"))
    })
}

/// Peak resident memory of this process so far, in MiB (Linux).
#[allow(dead_code)]
pub fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// Start counting [`peak_rss_mib`] afresh from the memory resident now (Linux: writing 5 to
/// `/proc/self/clear_refs` resets the high-water mark), so a later reading is one phase's.
#[allow(dead_code)]
pub fn reset_peak_rss() {
    // The allocator returns freed memory after 100 ms (src/process.rs): let what an earlier
    // phase freed go first, or the mark starts at its peak.
    std::thread::sleep(std::time::Duration::from_secs(2));
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Start `insert` (a continuous INSERT of job `job`) and measure its sustained rate: rows
/// written per second from the end of its first checkpoint to the end of `checkpoints`
/// more; the job is stopped after.
#[allow(dead_code)]
pub async fn sustained_rate(session: &Session, job: &str, insert: &str, checkpoints: u64) -> f64 {
    let row = |session: &Session| {
        session
            .jobs()
            .rows()
            .into_iter()
            .find(|r| r.name == job)
            .expect("the job")
    };
    session
        .sql("SET 'table.dml-sync' = 'false'")
        .await
        .expect("set");
    session.sql(insert).await.expect("job");
    let until = |n: u64| async move {
        loop {
            let j = row(session);
            assert!(j.error.is_none(), "{j:?}");
            if j.checkpoint >= n {
                return (Instant::now(), j.records_out);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let (t0, r0) = until(1).await;
    let (t1, r1) = until(1 + checkpoints).await;
    session
        .sql(&format!("STOP JOB '{job}'"))
        .await
        .expect("stop");
    (r1 - r0) as f64 / (t1 - t0).as_secs_f64()
}

/// The rows of `sql`, as one line of text.
#[allow(dead_code)]
pub async fn text(session: &floe::Session, sql: &str) -> String {
    match session.sql(sql).await.expect("query").pop() {
        Some(floe::Output::Rows(_, batches)) => {
            datafusion::arrow::util::pretty::pretty_format_batches(&batches)
                .map(|t| t.to_string())
                .unwrap_or_default()
                .lines()
                .filter(|l| l.starts_with("| "))
                .collect::<Vec<_>>()
                .join(" ")
        }
        _ => String::new(),
    }
}

#[allow(dead_code)]
const KINDS: [&str; 4] = ["order", "page_view", "interaction", "signup"];
#[allow(dead_code)]
const REGIONS: [&str; 4] = ["eu-west", "us-east", "ap-south", "sa-east"];

/// [`event`]'s columns, in SQL.
#[allow(dead_code)]
pub const EVENT_COLUMNS: &str = "event_id BIGINT, event_type STRING, event_time TIMESTAMP, \
                                 user_id BIGINT, session_id STRING, region STRING, \
                                 amount DOUBLE, url STRING, device STRING, ok BOOLEAN, \
                                 tags STRING";

/// Event `i`'s values: the same for every format the benchmarks write it in.
#[allow(dead_code)]
pub struct Event {
    pub id: u64,
    pub kind: &'static str,
    /// Seconds into 2024-05-01 (UTC).
    pub second_of_day: u64,
    pub user_id: u64,
    pub session: u64,
    pub region: &'static str,
    /// The amount in cents.
    pub cents: u64,
    pub item: u64,
    pub device: &'static str,
    pub ok: bool,
    pub tag: u64,
}

#[allow(dead_code)]
impl Event {
    pub fn new(i: u64) -> Self {
        Self {
            id: i,
            kind: KINDS[(i % 4) as usize],
            second_of_day: ((i / 3600) % 24) * 3600 + ((i / 60) % 60) * 60 + i % 60,
            user_id: i * 7919 % 100_000,
            session: i * 2_654_435_761 % (1 << 40),
            region: REGIONS[(i / 7 % 4) as usize],
            cents: (i % 500) * 100 + i % 100,
            item: i % 10_000,
            device: if i.is_multiple_of(3) {
                "mobile"
            } else {
                "desktop"
            },
            ok: !i.is_multiple_of(5),
            tag: i % 97,
        }
    }

    pub fn session_id(&self) -> String {
        format!("s-{:012x}", self.session)
    }

    pub fn url(&self) -> String {
        format!(
            "https://shop.example.com/products/item/{}?ref=home",
            self.item
        )
    }

    pub fn tags(&self) -> String {
        format!("promo,spring,newsletter,{}", self.tag)
    }

    /// The event as one ~285-byte, 11-field JSON object.
    pub fn json(&self) -> String {
        let t = self.second_of_day;
        format!(
            "{{\"event_id\":{},\"event_type\":\"{}\",\"event_time\":\"2024-05-01T{:02}:{:02}:{:02}\",\
             \"user_id\":{},\"session_id\":\"{}\",\"region\":\"{}\",\"amount\":{}.{:02},\
             \"url\":\"{}\",\"device\":\"{}\",\"ok\":{},\"tags\":\"{}\"}}",
            self.id,
            self.kind,
            t / 3600,
            t / 60 % 60,
            t % 60,
            self.user_id,
            self.session_id(),
            self.region,
            self.cents / 100,
            self.cents % 100,
            self.url(),
            self.device,
            self.ok,
            self.tags()
        )
    }
}

/// One ~285-byte, 11-field JSON event (`event_id`, `event_type`, `event_time`, `user_id`,
/// ...): the ingest and table benchmarks' record.
#[allow(dead_code)]
pub fn event(i: u64) -> String {
    Event::new(i).json()
}
