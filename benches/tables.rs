//! New tables from files, whole process: the same JSON events routed to one table, to 1,000
//! tables and to 10,000, none of which exists before, each run a `floe -f` process of its own
//! on a lake of its own, timed from start to exit with its peak memory.
//!
//! ```text
//! cargo bench --bench tables                              # 1,500,000 events; 1, 1,000, 10,000
//! FLOE_BENCH_EVENTS=300000 FLOE_BENCH_TABLES=1,1000 cargo bench --bench tables
//! ```
//!
//! Targets (issue 15): 1,000 new tables in at most twice the one-table time with a peak
//! under 1 GiB; 10,000 at a third of the one-table rate or better, under 1.5 GiB. The events
//! are the ingest benchmark's (11 fields, ~285 bytes), in 8 files, their columns inferred per
//! record as a routed job's are; the route is `user_id` modulo the table count. Everything a
//! run does counts: starting, reading and routing, creating the tables and their folders, every
//! checkpoint's files and commits (the default interval, 10 s), and stopping.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

mod common;
use common::env;

/// One run: wall seconds, peak resident memory (MiB), and the job's row of `SHOW JOBS`.
struct Run {
    seconds: f64,
    peak_mib: f64,
    records_out: u64,
    dead_lettered: u64,
}

/// Route the events under `data` to `tables` new tables of a lake under `dir`.
fn run(dir: &Path, data: &Path, tables: u64) -> Run {
    let lake = dir.join(format!("lake-{tables}"));
    std::fs::create_dir_all(&lake).expect("lake dir");
    let script = lake.join("job.sql");
    let (l, d) = (lake.display(), data.display());
    std::fs::write(
        &script,
        format!(
            "CREATE CATALOG lake WITH ('type' = 'iceberg', 'catalog-type' = 'sql',
               'uri' = 'sqlite:{l}/catalog.db', 'warehouse' = '{l}/warehouse');
             SET 'state.dir' = '{l}/state';
             SET 'table.dml-sync' = 'true';
             CREATE SOURCE events WITH ('connector' = 'filesystem', 'path' = '{d}',
               'format' = 'json');
             INSERT INTO lake.routed SELECT * FROM events
             ROUTE BY 'u_' || CAST(user_id % {tables} AS VARCHAR);
             SHOW JOBS;"
        ),
    )
    .expect("script");
    let start = Instant::now();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_floe"))
        .args(["--format", "csv", "-f"])
        .arg(&script)
        // The default: with backtraces on, every error iceberg-rust builds (some eagerly, on
        // paths that succeed) captures one.
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start floe");
    let (out, usage) = child.wait_with_output_and_usage();
    let seconds = start.elapsed().as_secs_f64();
    let text = String::from_utf8_lossy(&out);
    // The CSV of SHOW JOBS: a header line naming the columns, then the job.
    let mut lines = text.lines().skip_while(|l| !l.starts_with("name,"));
    let header: Vec<&str> = lines.next().expect("SHOW JOBS output").split(',').collect();
    let row: Vec<&str> = lines.next().expect("the job's row").split(',').collect();
    let column = |name: &str| -> u64 {
        let at = header.iter().position(|h| *h == name).expect(name);
        row[at]
            .parse()
            .unwrap_or_else(|_| panic!("{name}: {}", row[at]))
    };
    Run {
        seconds,
        peak_mib: usage.ru_maxrss as f64 / 1024.0,
        records_out: column("records_out"),
        dead_lettered: column("records_dead_lettered"),
    }
}

/// Waiting for a child and reading its resource usage (peak RSS) in one call.
trait WaitWithUsage {
    fn wait_with_output_and_usage(self) -> (Vec<u8>, libc::rusage);
}

impl WaitWithUsage for std::process::Child {
    fn wait_with_output_and_usage(mut self) -> (Vec<u8>, libc::rusage) {
        use std::io::Read;
        let mut out = Vec::new();
        if let Some(mut stdout) = self.stdout.take() {
            stdout.read_to_end(&mut out).expect("floe's output");
        }
        let mut status = 0;
        // SAFETY: a zeroed rusage is a valid value for wait4 to fill.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: wait4 waits for our own child and writes the two values given.
        let pid = unsafe { libc::wait4(self.id() as libc::pid_t, &mut status, 0, &mut usage) };
        assert_eq!(pid, self.id() as libc::pid_t, "wait4");
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "floe failed (status {status}): {}",
            String::from_utf8_lossy(&out)
        );
        (out, usage)
    }
}

fn main() {
    let events: u64 = env("FLOE_BENCH_EVENTS").unwrap_or(1_500_000);
    let counts: Vec<u64> = std::env::var("FLOE_BENCH_TABLES")
        .unwrap_or_else(|_| "1,1000,10000".into())
        .split(',')
        .map(|n| n.trim().parse().expect("FLOE_BENCH_TABLES: table counts"))
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("data dir");
    const FILES: u64 = 8;
    for f in 0..FILES {
        let mut file = std::io::BufWriter::new(
            std::fs::File::create(data.join(format!("events-{f}.jsonl"))).expect("file"),
        );
        for i in (f * events / FILES)..((f + 1) * events / FILES) {
            writeln!(file, "{}", common::event(i)).expect("write");
        }
    }
    // The events written out first, so that no run shares the disk with their writeback.
    // SAFETY: sync takes no arguments and only flushes the system's dirty data.
    unsafe { libc::sync() };
    println!("tables: {events} JSON events in {FILES} files routed to new tables, whole process");
    let mut one: Option<f64> = None;
    for tables in counts {
        let r = run(dir.path(), &data, tables);
        assert_eq!(
            r.records_out + r.dead_lettered,
            events,
            "every event accounted for"
        );
        assert_eq!(r.dead_lettered, 0, "no dead letters");
        let made = std::fs::read_dir(dir.path().join(format!("lake-{tables}/warehouse/routed")))
            .map_or(0, |d| {
                d.filter(|e| e.as_ref().is_ok_and(|e| e.path().is_dir()))
                    .count()
            });
        assert_eq!(made as u64, tables, "tables created");
        let rate = events as f64 / r.seconds;
        let against = match (tables, one) {
            (1, _) => {
                one = Some(r.seconds);
                String::new()
            }
            (_, Some(base)) => format!(
                "   {:.2}x the 1-table time, {:.0}% of its rate",
                r.seconds / base,
                100.0 * base / r.seconds
            ),
            _ => String::new(),
        };
        println!(
            "  to {tables:>6} tables: {:>7.2} s {rate:>10.0} events/s   peak RSS {:>5.0} MiB{against}",
            r.seconds, r.peak_mib
        );
    }
    println!(
        "  targets: 1,000 tables within 2x the 1-table time, peak < 1 GiB; 10,000 at >= 33% of \
         its rate, peak < 1.5 GiB"
    );
}
