//! Background tasks that belong to something: a task is held by an [`AbortOnDrop`], so that
//! dropping its owner (a job, the REPL's metrics server, a routed sink's write-outs) stops it;
//! no `tokio::spawn` handle is dropped detached. [`joined`] turns a task's end into floe's
//! result.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::task::{JoinError, JoinHandle};

use crate::error::{Error, Result};

/// A task handle that aborts the task when dropped. Awaiting it awaits the task.
#[derive(Debug)]
pub struct AbortOnDrop<T>(JoinHandle<T>);

impl<T: Send + 'static> AbortOnDrop<T> {
    /// Run `future` on the runtime, owned by the handle returned.
    pub fn spawn(future: impl Future<Output = T> + Send + 'static) -> Self {
        Self(tokio::spawn(future))
    }

    /// Run blocking `f` on the runtime's blocking pool. (Dropping the handle cannot stop
    /// code that is already running there; it only forgets the result.)
    pub fn spawn_blocking(f: impl FnOnce() -> T + Send + 'static) -> Self {
        Self(tokio::task::spawn_blocking(f))
    }

    /// Whether the task has ended.
    pub fn is_finished(&self) -> bool {
        self.0.is_finished()
    }
}

impl<T> From<JoinHandle<T>> for AbortOnDrop<T> {
    fn from(handle: JoinHandle<T>) -> Self {
        Self(handle)
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<T> Future for AbortOnDrop<T> {
    type Output = std::result::Result<T, JoinError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx)
    }
}

/// What task `what` returned; its panic (or cancellation) is an internal error naming it.
pub async fn joined<T>(
    task: impl Future<Output = std::result::Result<Result<T>, JoinError>>,
    what: &str,
) -> Result<T> {
    task.await
        .map_err(|e| Error::Internal(format!("{what}: {e}")))?
}

/// The cores this process may run on (its CPU affinity and quota allowing), at least one.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The threads [`share_out`] hands work to: as many as the cores, kept for the process, and
/// not the decoders' (`format`): a helper queued behind a poll's pieces would come after its
/// caller had done the work alone.
fn helper_threads() -> &'static rayon::ThreadPool {
    static POOL: std::sync::OnceLock<rayon::ThreadPool> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(cores())
            .thread_name(|i| format!("floe-help-{i}"))
            .build()
            // Only the OS refusing threads makes this fail: nothing can run then.
            .unwrap_or_else(|e| panic!("cannot start floe's helper threads: {e}"))
    })
}

/// `work` done on every item, on the calling thread and on up to `helpers` of
/// `helper_threads` at once, each taking the next item left; the results in the items' order.
///
/// The caller never waits for a helper to start: a helper that comes late (its thread not
/// given a core yet, say) finds nothing left, and the caller waits only for items a helper has
/// taken. So the caller may be a runtime's worker, which a scope would stall until every
/// helper had run. A panic in `work` is the caller's, wherever it ran.
pub fn share_out<T, R>(
    items: Vec<T>,
    helpers: usize,
    work: impl Fn(T) -> R + Send + Sync + 'static,
) -> Vec<R>
where
    T: Send + 'static,
    R: Send + 'static,
{
    use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
    use std::sync::{Arc, Condvar, Mutex, PoisonError};

    type Outcome<R> = std::thread::Result<R>;
    struct Shared<T, R, W> {
        items: Vec<Mutex<Option<T>>>,
        done: Vec<Mutex<Option<Outcome<R>>>>,
        /// The next item to take, and the items taken but not done.
        next: Mutex<(usize, usize)>,
        all_done: Condvar,
        work: W,
    }
    impl<T, R, W: Fn(T) -> R> Shared<T, R, W> {
        fn take_items(&self) {
            loop {
                let i = {
                    let mut next = self.next.lock().unwrap_or_else(PoisonError::into_inner);
                    if next.0 >= self.items.len() {
                        return;
                    }
                    next.0 += 1;
                    next.1 += 1;
                    next.0 - 1
                };
                let item = self.items[i]
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take();
                if let Some(item) = item {
                    let outcome = catch_unwind(AssertUnwindSafe(|| (self.work)(item)));
                    *self.done[i].lock().unwrap_or_else(PoisonError::into_inner) = Some(outcome);
                }
                let mut next = self.next.lock().unwrap_or_else(PoisonError::into_inner);
                next.1 -= 1;
                if next.1 == 0 {
                    self.all_done.notify_all();
                }
            }
        }
    }

    let helpers = helpers.min(items.len().saturating_sub(1));
    let shared = Arc::new(Shared {
        done: items.iter().map(|_| Mutex::new(None)).collect(),
        items: items.into_iter().map(|t| Mutex::new(Some(t))).collect(),
        next: Mutex::new((0, 0)),
        all_done: Condvar::new(),
        work,
    });
    for _ in 0..helpers {
        let shared = shared.clone();
        helper_threads().spawn(move || shared.take_items());
    }
    shared.take_items();
    let mut next = shared.next.lock().unwrap_or_else(PoisonError::into_inner);
    while next.1 > 0 {
        next = shared
            .all_done
            .wait(next)
            .unwrap_or_else(PoisonError::into_inner);
    }
    drop(next);
    shared
        .done
        .iter()
        .map(|d| {
            match d.lock().unwrap_or_else(PoisonError::into_inner).take() {
                Some(Ok(r)) => r,
                Some(Err(panic)) => resume_unwind(panic),
                // Every item is taken before the caller's loop ends, and done before the
                // count of those under way is back to zero.
                None => unreachable!("an item shared out was not done"),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_out_work_comes_back_in_order_wherever_it_ran() {
        let threads: Vec<(usize, String)> = share_out((0..200).collect(), 3, |i: usize| {
            std::thread::sleep(std::time::Duration::from_micros(200));
            (
                i * 2,
                std::thread::current()
                    .name()
                    .unwrap_or("caller")
                    .to_string(),
            )
        });
        let values: Vec<usize> = threads.iter().map(|(v, _)| *v).collect();
        assert_eq!(values, (0..200).map(|i| i * 2).collect::<Vec<_>>());
        // With one core the pool has one thread; more than one thread worked either way
        // unless the machine gave the helpers no time at all in 200 sleeps.
        let names: std::collections::HashSet<&str> =
            threads.iter().map(|(_, n)| n.as_str()).collect();
        assert!(names.len() > 1, "only {names:?} did the work");
    }

    #[test]
    fn a_panic_in_shared_out_work_is_the_callers() {
        let caught = std::panic::catch_unwind(|| {
            share_out((0..8).collect(), 2, |i: usize| {
                assert!(i != 5, "item five");
                i
            })
        });
        let panic = caught.expect_err("the panic reached the caller");
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()));
        assert_eq!(message.as_deref(), Some("item five"));
    }
}
