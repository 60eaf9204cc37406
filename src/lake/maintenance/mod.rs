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
use std::sync::atomic::{AtomicBool, Ordering};
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
}

impl Pace {
    /// Work at most `cpu` (above 0, at most 1) of one core.
    pub fn new(cpu: f64) -> Self {
        Self {
            cpu,
            hurry: Arc::default(),
        }
    }

    /// From now on, work without resting (this pace and its clones).
    pub fn hurry(&self) {
        self.hurry.store(true, Ordering::Relaxed);
    }

    /// Rest after `worked` so that work is at most the share of the time; at once when
    /// hurried, even in the middle of a rest.
    pub async fn rest(&self, worked: Duration) {
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
