//! Failpoints: crash the process at a named step, for the tests that prove a crash at any
//! step loses nothing and duplicates nothing.
//!
//! ```text
//! FLOE_FAILPOINT=<step>        SIGKILL the process the first time it reaches <step>
//! FLOE_FAILPOINT=<step>:<n>    ... the n-th time
//! FLOE_PAUSE=<step>:<ms>       wait <ms> milliseconds each time it reaches <step>, saying so
//!                              on stderr (for tests that race another writer against it)
//! ```
//!
//! The steps are the constants below. The variable is read once; unset (always, outside
//! those tests), a failpoint is one check of that.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// After a checkpoint record is written, before any of its tables is committed.
pub const AFTER_RECORD: &str = "after-record";
/// After one table of a checkpoint is committed, with others still to go.
pub const BETWEEN_COMMITS: &str = "between-commits";
/// After every table of a checkpoint is committed, before the next record.
pub const AFTER_COMMITS: &str = "after-commits";
/// Halfway through writing a table metadata file (the file is left torn).
pub const IN_METADATA_WRITE: &str = "in-metadata-write";

/// Before a maintenance action (compaction, expiry, manifest rewrite) commits.
pub const MAINTENANCE_COMMIT: &str = "maintenance-commit";

const STEPS: [&str; 5] = [
    AFTER_RECORD,
    BETWEEN_COMMITS,
    AFTER_COMMITS,
    IN_METADATA_WRITE,
    MAINTENANCE_COMMIT,
];

/// The armed step and on which visit it fires.
struct Armed {
    step: &'static str,
    at: u64,
    visits: AtomicU64,
}

fn armed() -> Option<&'static Armed> {
    static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            let value = std::env::var("FLOE_FAILPOINT").ok()?;
            let (name, at) = match value.split_once(':') {
                Some((name, n)) => (name, n.trim().parse().ok()?),
                None => (value.as_str(), 1),
            };
            let step = STEPS.into_iter().find(|s| *s == name.trim());
            if step.is_none() {
                eprintln!(
                    "floe: FLOE_FAILPOINT names no step ('{name}'; the steps are {})",
                    STEPS.join(", ")
                );
            }
            Some(Armed {
                step: step?,
                at,
                visits: AtomicU64::new(0),
            })
        })
        .as_ref()
}

/// Whether this visit of `step` is the one the failpoint fires on (each call is a visit).
pub fn fires(step: &str) -> bool {
    armed().is_some_and(|a| a.step == step && a.visits.fetch_add(1, Ordering::Relaxed) + 1 == a.at)
}

/// Kill this process as a crash would: no destructor, no flush, no exit handler.
pub fn crash() -> ! {
    // SAFETY: signals this process; SIGKILL cannot be caught, so this does not return.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    std::process::abort()
}

/// Crash here if the failpoint names `step` and this is its visit.
pub fn reach(step: &str) {
    if fires(step) {
        crash();
    }
}

/// Wait here if `FLOE_PAUSE` names `step` (see the module doc).
pub async fn pause(step: &str) {
    static PAUSE: OnceLock<Option<(String, u64)>> = OnceLock::new();
    let armed = PAUSE.get_or_init(|| {
        let value = std::env::var("FLOE_PAUSE").ok()?;
        let (name, ms) = value.split_once(':')?;
        Some((name.trim().to_string(), ms.trim().parse().ok()?))
    });
    if let Some((name, ms)) = armed
        && name == step
    {
        eprintln!("floe: paused at {step} for {ms} ms");
        tokio::time::sleep(std::time::Duration::from_millis(*ms)).await;
    }
}
