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
