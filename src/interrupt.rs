//! Ctrl-C and SIGTERM as events that statements and jobs wait for.
//!
//! Signals are caught on a plain OS thread, not by the async runtime: a statement that keeps
//! every runtime worker busy (a large join, say) still sees Ctrl-C at once. Without
//! [`install`] (floe used as a library), waiting falls back to tokio's Ctrl-C handling.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use tokio::sync::Notify;

use crate::error::{Error, Result};

struct Hub {
    notify: Notify,
    waiters: AtomicUsize,
    /// Whether a signal nobody waits for ends the process (scripts) or is ignored (REPL).
    exit_when_unwatched: AtomicBool,
}

static HUB: OnceLock<Arc<Hub>> = OnceLock::new();

/// Catch SIGINT and SIGTERM from now on. With `exit_when_unwatched`, a signal that arrives
/// while nothing waits for it ends the process (exit code 128 + signal), as an uncaught
/// signal would; otherwise it is ignored (the REPL's prompt).
pub fn install(exit_when_unwatched: bool) -> Result<()> {
    if let Some(hub) = HUB.get() {
        hub.exit_when_unwatched
            .store(exit_when_unwatched, Ordering::SeqCst);
        return Ok(());
    }
    let hub = Arc::new(Hub {
        notify: Notify::new(),
        waiters: AtomicUsize::new(0),
        exit_when_unwatched: AtomicBool::new(exit_when_unwatched),
    });
    let mut signals = Signals::new([SIGINT, SIGTERM])
        .map_err(|e| Error::io("installing the signal handler", e))?;
    let thread_hub = hub.clone();
    std::thread::Builder::new()
        .name("floe-signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                if thread_hub.waiters.load(Ordering::SeqCst) == 0
                    && thread_hub.exit_when_unwatched.load(Ordering::SeqCst)
                {
                    std::process::exit(128 + signal);
                }
                thread_hub.notify.notify_waiters();
            }
        })
        .map_err(|e| Error::io("starting the signal thread", e))?;
    let _ = HUB.set(hub);
    Ok(())
}

/// Counts a waiter for as long as it lives.
struct Waiting<'a>(&'a Hub);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiters.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Resolves at the next Ctrl-C or SIGTERM.
///
/// # Cancel safety
/// Cancel safe: dropping it only stops waiting.
pub async fn interrupted() {
    match HUB.get() {
        Some(hub) => {
            let notified = hub.notify.notified();
            hub.waiters.fetch_add(1, Ordering::SeqCst);
            let _waiting = Waiting(hub);
            notified.await;
        }
        None => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
