//! The runtime that writes and commits: Parquet encoding, closing files, building and
//! sending commits, and the sources' polls a job reads ahead (`connector::prefetch`), apart
//! from the runtime that runs jobs' queries, plans statements and answers the user. This is
//! DataFusion's advice for CPU-bound work beside I/O (a runtime of its own, so that heavy
//! work never stalls the tasks that wait on the network), and it replaces blocking threads
//! that each drove one future with `block_on`.
//!
//! Its workers are meant to be busy: the local file system calls made on them run right
//! there (see [`super::storage`]) rather than on yet more threads, and there are two per
//! core, so that a worker waiting on a disk sync leaves the core to another.
//!
//! Table maintenance inside jobs has a runtime of its own, of one worker ([`spawn_maintenance`]).

use std::future::Future;
use std::sync::OnceLock;

use tokio::runtime::{Builder, Handle, Runtime};

use crate::task::AbortOnDrop;

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

/// The write-and-commit runtime, started on first use; it lives as long as the process.
fn handle() -> &'static Handle {
    RUNTIME
        .get_or_init(|| {
            let cores = crate::task::cores();
            Builder::new_multi_thread()
                .worker_threads(2 * cores)
                .thread_name("floe-write")
                .on_thread_start(super::storage::run_io_inline)
                .enable_all()
                .build()
                // Only the OS refusing threads makes this fail: nothing can run then.
                .unwrap_or_else(|e| panic!("cannot start floe's write runtime: {e}"))
        })
        .handle()
}

/// Run `future` on the write-and-commit runtime, owned by the handle returned.
pub fn spawn<T: Send + 'static>(
    future: impl Future<Output = T> + Send + 'static,
) -> AbortOnDrop<T> {
    AbortOnDrop::from(handle().spawn(future))
}

static MAINTENANCE: OnceLock<Runtime> = OnceLock::new();

/// Run `future` on the maintenance runtime (one worker thread: table maintenance inside jobs
/// never takes more than one core, and rests within that to its budget), owned by the handle
/// returned.
pub fn spawn_maintenance<T: Send + 'static>(
    future: impl Future<Output = T> + Send + 'static,
) -> AbortOnDrop<T> {
    let runtime = MAINTENANCE.get_or_init(|| {
        Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(2)
            .thread_name("floe-maintain")
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("cannot start floe's maintenance runtime: {e}"))
    });
    AbortOnDrop::from(runtime.handle().spawn(future))
}
