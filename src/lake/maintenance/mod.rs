//! Keeping tables healthy, as Spark's and Trino's procedures do: compaction
//! ([`compact`]), snapshot expiry ([`expire`]), manifest rewrite ([`manifests`]) and
//! orphan-file removal ([`orphans`]).
//!
//! Each works on the table as it is when it commits: it prepares its snapshot (or its
//! metadata change) on a fresh load, commits through floe's [`Committer`], and when another
//! writer committed first it prepares again on the newer table, so a running job's appends
//! are kept. Work the newer table makes wrong (a file a rewrite read is gone) is given up as
//! [`Error::Conflict`], with nothing committed.

pub mod compact;
pub mod expire;
pub mod manifests;
pub mod orphans;
pub mod policy;
pub mod sort;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use iceberg::table::Table;
use iceberg::{Catalog, TableIdent};

use super::Committer;
use super::commit::Prepared;
use crate::error::{Error, Result};
use crate::failpoint;

/// How fast maintenance works: at most a share of one core, resting after each piece of
/// work, until hurried (nothing else is running then: a job whose sources ended).
#[derive(Debug, Clone)]
pub struct Pace {
    cpu: f64,
    hurry: Arc<AtomicBool>,
    /// The worker's CPU clock (ns) when it last rested, `u64::MAX` before it first works.
    rested: Arc<AtomicU64>,
}

impl Pace {
    /// Work at most `cpu` (above 0, at most 1) of one core.
    pub fn new(cpu: f64) -> Self {
        Self {
            cpu,
            hurry: Arc::default(),
            rested: Arc::new(AtomicU64::new(u64::MAX)),
        }
    }

    /// From now on, work without resting (this pace and its clones).
    pub fn hurry(&self) {
        self.hurry.store(true, Ordering::Relaxed);
    }

    /// Note that work begins here (on the thread that does it): the first rest counts from
    /// this point.
    pub fn begin(&self) {
        let now = clock().as_nanos() as u64;
        let _ = self
            .rested
            .compare_exchange(u64::MAX, now, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Rest for the work done since the last rest (or [`Pace::begin`]) so that work is at
    /// most the share of the time; at once when hurried, even in the middle of a rest.
    pub async fn rest(&self) {
        let now = clock();
        let last = self.rested.load(Ordering::Relaxed);
        let worked = if last == u64::MAX {
            Duration::ZERO
        } else {
            now.saturating_sub(Duration::from_nanos(last))
        };
        self.pause(worked).await;
        self.rested
            .store(clock().as_nanos() as u64, Ordering::Relaxed);
    }

    async fn pause(&self, worked: Duration) {
        if self.cpu <= 0.0 || self.cpu >= 1.0 {
            return;
        }
        let until = Instant::now() + worked.mul_f64((1.0 - self.cpu) / self.cpu);
        while !self.hurry.load(Ordering::Relaxed) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            tokio::time::sleep(left.min(Duration::from_millis(100))).await;
        }
    }
}

/// The CPU time this thread has used. Maintenance measures its work by it (on its runtime's
/// one worker), not by the wall clock, which would count waits on the catalog, the store and
/// lost commits as work.
fn clock() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given, which lives here.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } == 0;
    if !ok {
        return Duration::ZERO;
    }
    Duration::new(
        t.tv_sec.max(0) as u64,
        t.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

/// How many times a maintenance commit is prepared again after another writer won.
const ATTEMPTS: usize = 10;

/// What a maintenance action needs: the table's catalog and floe's commit path to it.
#[derive(Clone)]
pub struct Maintained {
    pub catalog: Arc<dyn Catalog>,
    pub committer: Arc<Committer>,
    pub ident: TableIdent,
}

impl Maintained {
    pub async fn load(&self) -> Result<Table> {
        let ident = &self.ident;
        match self.catalog.load_table(ident).await {
            Ok(table) => Ok(table),
            Err(e)
                if matches!(
                    e.kind(),
                    iceberg::ErrorKind::TableNotFound | iceberg::ErrorKind::NamespaceNotFound
                ) =>
            {
                Err(Error::NotFound(format!(
                    "table {}.{} does not exist",
                    ident.namespace().to_url_string(),
                    ident.name()
                )))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Commit what `prepare` builds on the table as it is, preparing again on a fresh load
    /// each time another commit wins. `prepare` returns `None` when there is nothing to do.
    pub async fn commit<T, F, Fut>(&self, mut prepare: F) -> Result<Option<(Table, T)>>
    where
        F: FnMut(Table) -> Fut,
        Fut: Future<Output = Result<Option<(Prepared, T)>>>,
    {
        let mut last = None;
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                // A pause that grows, with jitter, so a writer committing on a fixed
                // interval does not win every time.
                let ms =
                    (25u64 << attempt.min(5)) + u64::from(uuid::Uuid::new_v4().as_u128() as u8);
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            }
            let base = self.load().await?;
            let Some((prepared, out)) = prepare(base.clone()).await? else {
                return Ok(None);
            };
            failpoint::pause(failpoint::MAINTENANCE_COMMIT).await;
            failpoint::reach(failpoint::MAINTENANCE_COMMIT);
            match self.committer.commit(&base, prepared).await {
                Ok(table) => return Ok(Some((table, out))),
                Err(e) if e.is_retryable() => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(Error::Conflict(format!(
            "table {}: other commits kept winning ({ATTEMPTS} attempts); nothing was \
             committed{}",
            self.ident,
            last.map(|e| format!(" (last: {e})")).unwrap_or_default()
        )))
    }
}
