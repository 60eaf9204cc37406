//! Benchmarks of whole processes: the events written to files, a `floe -f` script run to its
//! end (on the cores given), its wall time, peak memory and `SHOW JOBS` row.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// One run of a script.
#[allow(dead_code)]
pub struct Run {
    pub seconds: f64,
    pub peak_mib: f64,
    /// The job's row of `SHOW JOBS` (the script's last statement; one job), by column.
    pub job: HashMap<String, String>,
}

#[allow(dead_code)]
impl Run {
    /// A number column of the job's row.
    pub fn count(&self, column: &str) -> u64 {
        let value = self
            .job
            .get(column)
            .unwrap_or_else(|| panic!("no column {column}"));
        value
            .parse()
            .unwrap_or_else(|_| panic!("{column}: {value}"))
    }
}

/// `events` of [`super::event`] in `files` JSON-lines files under `data`, synced, so that no
/// run shares the disk with their writeback.
#[allow(dead_code)]
pub fn write_events(data: &Path, events: u64, files: u64) {
    std::fs::create_dir_all(data).expect("data dir");
    for f in 0..files {
        let mut file = std::io::BufWriter::new(
            std::fs::File::create(data.join(format!("events-{f}.jsonl"))).expect("file"),
        );
        for i in (f * events / files)..((f + 1) * events / files) {
            writeln!(file, "{}", super::event(i)).expect("write");
        }
    }
    // SAFETY: sync takes no arguments and only flushes the system's dirty data.
    unsafe { libc::sync() };
}

/// `statements` as a script in `lake` (a folder): a sqlite catalog `lake` and job state
/// there, jobs waited for, `SHOW JOBS` at the end. Its path.
#[allow(dead_code)]
pub fn lake_script(lake: &Path, statements: &str) -> std::path::PathBuf {
    let l = lake.display();
    let script = lake.join("job.sql");
    std::fs::write(
        &script,
        format!(
            "CREATE CATALOG lake WITH ('type' = 'iceberg', 'catalog-type' = 'sql',
               'uri' = 'sqlite:{l}/catalog.db', 'warehouse' = '{l}/warehouse');
             SET 'state.dir' = '{l}/state';
             SET 'table.dml-sync' = 'true';
             {statements}
             SHOW JOBS;"
        ),
    )
    .expect("script");
    script
}

/// `floe -f script` with its output as CSV, not started.
#[allow(dead_code)]
pub fn floe_command(script: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_floe"));
    command
        .args(["--format", "csv", "-f"])
        .arg(script)
        // The default: with backtraces on, every error iceberg-rust builds (some eagerly, on
        // paths that succeed) captures one.
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE");
    command
}

/// Make `command` run on the first `cores` CPUs the bench may use (all of them when
/// `None`).
#[allow(dead_code)]
pub fn on_cores(command: &mut Command, cores: Option<usize>) {
    use std::os::unix::process::CommandExt;
    let Some(n) = cores else { return };
    let cpus = allowed_cpus();
    assert!(cpus.len() >= n, "{n} cores asked, {} allowed", cpus.len());
    // SAFETY: between fork and exec the child only fills a CPU set and sets its own
    // affinity (async-signal-safe system calls, no allocation).
    unsafe {
        command.pre_exec(move || {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for &cpu in &cpus[..n] {
                libc::CPU_SET(cpu, &mut set);
            }
            match libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        });
    }
}

/// Pin this process to the first CPU it may use: threads started afterwards share it.
#[allow(dead_code)]
pub fn pin_to_one_core() {
    let cpu = allowed_cpus()[0];
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET and sched_setaffinity only read
    // and write it.
    let done = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set)
    };
    assert_eq!(
        done,
        0,
        "pin to CPU {cpu}: {}",
        std::io::Error::last_os_error()
    );
}

/// A command run to its (successful) end.
#[allow(dead_code)]
pub struct Finished {
    pub seconds: f64,
    pub peak_mib: f64,
    pub stdout: String,
}

/// Run `command` to its end, which must be a success: its wall time, peak memory and output.
#[allow(dead_code)]
pub fn finish(mut command: Command) -> Finished {
    command.stdout(std::process::Stdio::piped());
    let start = Instant::now();
    let name = command.get_program().to_string_lossy().into_owned();
    let child = command
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
    let (out, usage) = wait_with_usage(child, &name);
    Finished {
        seconds: start.elapsed().as_secs_f64(),
        peak_mib: usage.ru_maxrss as f64 / 1024.0,
        stdout: String::from_utf8_lossy(&out).into_owned(),
    }
}

/// Run `floe -f script` to its end, on the first `cores` CPUs the bench may use (all of them
/// when `None`); the script ends with `SHOW JOBS`.
#[allow(dead_code)]
pub fn run_script(script: &Path, cores: Option<usize>) -> Run {
    let mut command = floe_command(script);
    on_cores(&mut command, cores);
    let done = finish(command);
    // The CSV of SHOW JOBS: a header line naming the columns, then the job.
    let mut lines = done.stdout.lines().skip_while(|l| !l.starts_with("name,"));
    let header: Vec<&str> = lines.next().expect("SHOW JOBS output").split(',').collect();
    let row: Vec<&str> = lines.next().expect("the job's row").split(',').collect();
    Run {
        seconds: done.seconds,
        peak_mib: done.peak_mib,
        job: header
            .iter()
            .zip(row)
            .map(|(h, v)| (h.to_string(), v.to_string()))
            .collect(),
    }
}

/// The CPUs this process may run on.
#[allow(dead_code)]
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is an empty set; sched_getaffinity fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is this thread; the size is the set's.
    let got = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    assert_eq!(got, 0, "sched_getaffinity");
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: cpu is below CPU_SETSIZE.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect()
}

/// The child's (`name`) output, once it exited (successfully), and its resource usage (peak RSS).
fn wait_with_usage(mut child: std::process::Child, name: &str) -> (Vec<u8>, libc::rusage) {
    use std::io::Read;
    let mut out = Vec::new();
    if let Some(mut stdout) = child.stdout.take() {
        stdout.read_to_end(&mut out).expect("floe's output");
    }
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid value for wait4 to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 waits for our own child and writes the two values given.
    let pid = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as libc::pid_t, "wait4");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{name} failed (status {status}): {}",
        String::from_utf8_lossy(&out)
    );
    (out, usage)
}
