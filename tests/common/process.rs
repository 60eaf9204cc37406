//! Helpers for the tests that run the floe binary: scripts to their end, and killed with
//! SIGKILL at random moments.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A loopback address with a port nothing listens on (for floe to serve on).
pub fn free_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("127.0.0.1:{}", listener.local_addr().unwrap().port())
}

/// The floe binary under test.
pub fn floe() -> Command {
    Command::new(env!("CARGO_BIN_EXE_floe"))
}

/// Run floe with `args` in `dir`; its output, after checking it succeeded.
pub fn floe_ok(dir: &Path, args: &[&str]) -> String {
    let out = floe().current_dir(dir).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The CSV output of `sql` in `dir`, after `setup` (a `CREATE CATALOG`).
pub fn query_csv(dir: &Path, setup: &str, sql: &str) -> String {
    floe_ok(dir, &["-q", "--format", "csv", "-c", setup, "-c", sql])
}

/// Run `script` (saved as `dir/job.sql`) in `dir` to its end, which must succeed.
pub fn run_script_to_end(dir: &Path, script: &str) {
    std::fs::write(dir.join("job.sql"), script).unwrap();
    floe_ok(dir, &["-q", "-f", "job.sql"]);
}

/// Start `script` (saved as `dir/job.sql`) in `dir`, left running (a job over a watched
/// folder does not end): the caller kills it.
#[allow(dead_code)]
pub fn start_script(dir: &Path, script: &str) -> std::process::Child {
    std::fs::write(dir.join("job.sql"), script).unwrap();
    floe()
        .current_dir(dir)
        .args(["-q", "-f", "job.sql"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// A small xorshift generator seeded from the clock; the seed is printed to reproduce.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below
    }
}

/// Run `script` in `dir`, killing it with SIGKILL at random moments five times, then to
/// the end; fails unless it was killed at least three times (else the job ended too soon for
/// the run to prove anything).
pub fn kill_and_restart(dir: &Path, script: &str, max_ms: u64) {
    kill_then_restart(dir, script, max_ms, |_| {});
}

/// As [`kill_and_restart`], with the jobs' state folder (`dir/.floe`) deleted after each kill:
/// an ephemeral disk, where only the lake survives.
#[allow(dead_code)]
pub fn kill_losing_state_and_restart(dir: &Path, script: &str, max_ms: u64) {
    kill_then_restart(dir, script, max_ms, |dir| {
        let _ = std::fs::remove_dir_all(dir.join(".floe"));
    });
}

fn kill_then_restart(dir: &Path, script: &str, max_ms: u64, after_kill: impl Fn(&Path)) {
    std::fs::write(dir.join("job.sql"), script).unwrap();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("kill schedule seed: {seed}");
    let mut rng = Rng(seed);
    let mut kills = 0;
    for _ in 0..5 {
        let mut child = floe()
            .current_dir(dir)
            .args(["-q", "-f", "job.sql"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let at = Duration::from_millis(150 + rng.next(max_ms));
        let start = Instant::now();
        while start.elapsed() < at {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap(); // SIGKILL
            kills += 1;
        }
        child.wait().unwrap();
        after_kill(dir);
    }
    eprintln!("killed {kills} times");
    assert!(
        kills >= 3,
        "the job ended too soon to be killed: only {kills} kills"
    );
    run_script_to_end(dir, script);
}

/// Run `script` in `dir` until `FLOE_FAILPOINT=failpoint` kills it (failing if it does
/// not), then again to its end.
pub fn crash_then_finish(dir: &Path, script: &str, failpoint: &str) {
    use std::os::unix::process::ExitStatusExt;
    std::fs::write(dir.join("job.sql"), script).unwrap();
    let crashed = floe()
        .current_dir(dir)
        .env("FLOE_FAILPOINT", failpoint)
        .args(["-q", "-f", "job.sql"])
        .output()
        .unwrap();
    assert_eq!(
        crashed.status.signal(),
        Some(9),
        "{failpoint}: the process was not killed there: {:?} {}",
        crashed.status,
        String::from_utf8_lossy(&crashed.stderr)
    );
    run_script_to_end(dir, script);
}

/// The golden protocol's other two runs of `script(interval)`: with a checkpoint every 50 ms,
/// and with one every 100 ms, SIGKILLed at random moments at most `max_ms` apart and restarted
/// (see [`kill_and_restart`]). Each must leave what `read` reads of its folder equal to
/// `expected` (the straight run's); both folders are returned for further checks.
#[allow(dead_code)]
pub fn assert_same_with_checkpoints_and_kills(
    script: impl Fn(&str) -> String,
    max_ms: u64,
    read: impl Fn(&Path) -> String,
    expected: &str,
) -> (tempfile::TempDir, tempfile::TempDir) {
    let frequent = tempfile::tempdir().unwrap();
    run_script_to_end(frequent.path(), &script("50ms"));
    assert_eq!(read(frequent.path()), expected, "frequent checkpoints");
    let killed = tempfile::tempdir().unwrap();
    kill_and_restart(killed.path(), &script("100ms"), max_ms);
    assert_eq!(read(killed.path()), expected, "killed and restarted");
    (frequent, killed)
}

/// How many files named `prefix...` job `job`'s state folder under `dir` holds.
#[allow(dead_code)]
pub fn state_files(dir: &Path, job: &str, prefix: &str) -> usize {
    std::fs::read_dir(dir.join(".floe").join(job))
        .unwrap()
        .flatten()
        .filter(|f| f.file_name().to_string_lossy().starts_with(prefix))
        .count()
}

/// The golden protocol's runs of `script(interval)` with `state.memory-budget` at `budget`,
/// so that the state goes to disk: with a checkpoint every 100 ms (spill files must show up
/// while it runs), and killed and restarted as [`kill_and_restart`]. Each must leave what `read`
/// reads equal to `expected`; both folders are returned for further checks.
#[allow(dead_code)]
pub fn assert_same_spilled(
    script: impl Fn(&str) -> String,
    budget: &str,
    max_ms: u64,
    read: impl Fn(&Path) -> String,
    expected: &str,
) -> (tempfile::TempDir, tempfile::TempDir) {
    let spilling = |interval: &str| {
        format!(
            "SET 'state.memory-budget' = '{budget}'; {}",
            script(interval)
        )
    };
    let spilled = tempfile::tempdir().unwrap();
    let seen = spill_files_seen_while(spilled.path(), || {
        run_script_to_end(spilled.path(), &spilling("100ms"))
    });
    assert!(seen, "the state went to disk");
    assert_eq!(read(spilled.path()), expected, "state spilled to disk");
    let killed = tempfile::tempdir().unwrap();
    kill_and_restart(killed.path(), &spilling("100ms"), max_ms);
    assert_eq!(
        read(killed.path()),
        expected,
        "spilled, killed and restarted"
    );
    (spilled, killed)
}

#[allow(dead_code)]
/// Whether a job's spilled state showed up in the state folders under `dir` while `run` ran.
fn spill_files_seen_while(dir: &Path, run: impl FnOnce()) -> bool {
    use std::sync::atomic::{AtomicBool, Ordering};
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            let spilled = || {
                std::fs::read_dir(dir.join(".floe"))
                    .into_iter()
                    .flatten()
                    .flatten()
                    .any(|job| {
                        std::fs::read_dir(job.path())
                            .into_iter()
                            .flatten()
                            .flatten()
                            .any(|f| f.file_name().to_string_lossy().contains("-spill-"))
                    })
            };
            while !done.load(Ordering::Relaxed) {
                if spilled() {
                    return true;
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            false
        });
        run();
        done.store(true, Ordering::Relaxed);
        watcher.join().unwrap()
    })
}
