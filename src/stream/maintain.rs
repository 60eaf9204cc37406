//! Maintenance inside a running job: the tables it commits to, compacted, their manifests
//! merged and their snapshots expired, beside ingestion (`maintenance.*` options,
//! `lake::maintenance::policy`).
//!
//! ```text
//! each checkpoint's commits settled -> the tables' figures (files, bytes, snapshots)
//!   -> every maintenance.interval, if no run is under way: a run over the tables that
//!      gained files (or whose snapshots may expire), on the maintenance runtime (one
//!      worker, resting to its cpu share), each action committed on the table as it is;
//!      compaction tiered (files merge with files of about their size, so a partition's
//!      bytes are rewritten a few times on the way to the target size, not at every run)
//! a run's end -> what it did per table -> floe.table_health, SHOW JOBS
//! ```
//!
//! The job never waits for a run: its checkpoints go on, and a maintenance commit that loses
//! to one of the job's prepares again on the newer table. A job whose bounded sources end
//! waits for its run and makes a last one (`Maintainer::finish`); a job stopped or failed
//! drops the run under way, and what that wrote and did not commit is an orphan
//! (`remove_orphan_files`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use iceberg::table::Table;
use iceberg::{Catalog, NamespaceIdent, TableIdent};

use super::status::{JobStatus, TableHealth, table_name};
use crate::checkpoint::resume::marked_in;
use crate::error::Result;
use crate::lake::Committer;
use crate::lake::maintenance::compact::{CompactOptions, rewrite_data_files};
use crate::lake::maintenance::expire::{ExpireOptions, expire_snapshots};
use crate::lake::maintenance::manifests::rewrite_manifests;
use crate::lake::maintenance::policy::MaintenancePolicy;
use crate::lake::maintenance::{Maintained, Pace};
use crate::lake::runtime;
use crate::task::AbortOnDrop;

/// A table a run maintained, and its figures after.
type Ran = (TableIdent, TableHealth);

/// A job's maintenance of the tables it writes.
pub(super) struct Maintainer {
    policy: MaintenancePolicy,
    catalog: Arc<dyn Catalog>,
    committer: Arc<Committer>,
    status: Arc<JobStatus>,
    /// Per table: its data files when a run last left it.
    looked: BTreeMap<TableIdent, u64>,
    /// The tables committed to, with their data files now.
    files: BTreeMap<TableIdent, u64>,
    next: Instant,
    run: Option<AbortOnDrop<Vec<Ran>>>,
    pace: Pace,
    /// Whether the next run is the last (not tiered: see `CompactOptions::tiered`).
    last: bool,
    /// A routed job's namespace and name: its last run also looks at the tables there that
    /// carry the job's mark (written in runs before the one its record names).
    routed: Option<(NamespaceIdent, String)>,
}

impl Maintainer {
    pub(super) fn new(
        policy: MaintenancePolicy,
        catalog: Arc<dyn Catalog>,
        committer: Arc<Committer>,
        status: Arc<JobStatus>,
    ) -> Self {
        let next = Instant::now() + policy.interval;
        let cpu = policy.cpu;
        Self {
            policy,
            catalog,
            committer,
            status,
            looked: BTreeMap::new(),
            files: BTreeMap::new(),
            next,
            run: None,
            pace: Pace::new(cpu),
            last: false,
            routed: None,
        }
    }

    /// The job routes into `namespace` as `job`: see [`Self::finish`].
    pub(super) fn routed_into(&mut self, namespace: NamespaceIdent, job: &str) {
        self.routed = Some((namespace, job.to_string()));
    }

    /// `tables` were written before this run (named by the checkpoint record it resumed
    /// from): runs that look at every table (the last, and those expiring snapshots) look
    /// at them too, though this run may commit nothing more to them.
    pub(super) fn written_before(&mut self, tables: impl IntoIterator<Item = TableIdent>) {
        for ident in tables {
            self.files.entry(ident).or_insert(0);
        }
    }

    /// A checkpoint's commits are done: note the tables' files, take a finished run's
    /// report, and start a run when one is due.
    pub(super) async fn committed(&mut self, tables: &HashMap<TableIdent, Table>) -> Result<()> {
        for (ident, table) in tables {
            self.files
                .insert(ident.clone(), TableHealth::of(table).data_files);
        }
        if self.run.as_ref().is_some_and(AbortOnDrop::is_finished)
            && let Some(run) = self.run.take()
        {
            use futures::FutureExt;
            let report = crate::task::joined(run.map(|r| r.map(Ok)), "maintenance run").await?;
            self.report(report);
        }
        if self.run.is_none() && Instant::now() >= self.next {
            self.next = Instant::now() + self.policy.interval;
            self.start();
        }
        Ok(())
    }

    /// The job's sources are exhausted and its last checkpoint committed: wait for the run
    /// under way, then run once more over every table the job wrote (a routed job's: every
    /// table of its namespace that carries its mark, whichever run wrote it), so a bounded
    /// job leaves its tables maintained; both without resting (nothing else runs now).
    pub(super) async fn finish(&mut self) -> Result<()> {
        use futures::FutureExt;
        // Nothing else runs now: no need to rest; and the last run packs every partition's
        // small files, whatever their sizes.
        self.pace.hurry();
        self.last = true;
        if let Some(run) = self.run.take() {
            let report = crate::task::joined(run.map(|r| r.map(Ok)), "maintenance run").await?;
            self.report(report);
        }
        if let Some((namespace, job)) = &self.routed {
            let marked = marked_in(&self.catalog, namespace, job).await?;
            self.written_before(marked);
        }
        self.start();
        if let Some(run) = self.run.take() {
            let report = crate::task::joined(run.map(|r| r.map(Ok)), "maintenance run").await?;
            self.report(report);
        }
        Ok(())
    }

    /// Start a run over the tables worth a look.
    fn start(&mut self) {
        // The last run looks at every table: tiered runs may have left files of unlike
        // sizes in a partition, which only it packs together.
        let every = self.last || self.policy.snapshot_retention.is_some();
        let mut due: Vec<TableIdent> = self
            .files
            .iter()
            .filter(|(ident, files)| {
                let before = self.looked.get(*ident).copied().unwrap_or(0);
                every || **files >= before + self.policy.min_input_files as u64
            })
            .map(|(ident, _)| ident.clone())
            .collect();
        // The tables that gained the most files since they were last looked at first.
        due.sort_by_key(|ident| {
            let before = self.looked.get(ident).copied().unwrap_or(0);
            std::cmp::Reverse(self.files[ident].saturating_sub(before))
        });
        if due.is_empty() {
            return;
        }
        for ident in &due {
            self.looked.insert(ident.clone(), self.files[ident]);
        }
        let policy = self.policy.clone();
        let pace = self.pace.clone();
        let status = self.status.clone();
        let tiered = !self.last;
        let catalog = self.catalog.clone();
        let committer = self.committer.clone();
        self.run = Some(runtime::spawn_maintenance(async move {
            let mut out = Vec::new();
            pace.begin();
            for ident in due {
                let table = Maintained {
                    catalog: catalog.clone(),
                    committer: committer.clone(),
                    ident,
                };
                let done = maintain(&table, &policy, &pace, tiered).await;
                let mut after = TableHealth::default();
                if let Ok(t) = table.load().await {
                    after.observe(&t);
                }
                // Shown as each table is done, not at the run's end.
                record(&status, &table.ident, done, &after);
                out.push((table.ident, after));
                pace.rest().await;
            }
            out
        }));
    }

    /// Take what a run left: the tables' files after it.
    fn report(&mut self, ran: Vec<Ran>) {
        let health = self.status.tables_now();
        for (ident, after) in ran {
            self.looked.insert(ident.clone(), after.data_files);
            // The job may have committed since the run looked at the table last.
            let now = health
                .get(&table_name(&ident))
                .map_or(after.data_files, |h| h.data_files);
            self.files.insert(ident, now);
        }
    }
}

/// Show what maintenance did to `ident` (or why it failed) in `floe.table_health`.
fn record(status: &JobStatus, ident: &TableIdent, done: Result<String>, after: &TableHealth) {
    let Ok(mut health) = status.tables.lock() else {
        return;
    };
    let h = health.entry(table_name(ident)).or_default();
    h.newer(after);
    h.maintained_at_ms = Some(chrono::Utc::now().timestamp_millis());
    match done {
        Ok(what) => {
            h.maintenance = Some(what);
            h.error = None;
        }
        Err(e) => h.error = Some(e.to_string()),
    }
}

/// One table's maintenance by `policy`: what it did, in words.
async fn maintain(
    table: &Maintained,
    policy: &MaintenancePolicy,
    pace: &Pace,
    tiered: bool,
) -> Result<String> {
    let mut did = Vec::new();
    if policy.compaction {
        let options = CompactOptions {
            target_file_size: Some(policy.target_file_size),
            min_input_files: policy.min_input_files,
            small_file_age: Some(policy.small_file_age),
            filter: None,
            memory: Some(policy.memory),
            pace: Some(pace.clone()),
            tiered,
        };
        let c = rewrite_data_files(table, &options).await?;
        if c.rewritten_files > 0 {
            did.push(format!(
                "compacted {} files into {}",
                c.rewritten_files, c.added_files
            ));
        }
    }
    if policy.manifest_rewrite {
        let loaded = table.load().await?;
        let manifests = match loaded.metadata().current_snapshot() {
            Some(s) => loaded.manifest_list_reader(s).load().await?.entries().len(),
            None => 0,
        };
        if manifests > policy.max_manifests {
            let r = rewrite_manifests(table).await?;
            did.push(format!(
                "merged {} manifests into {}",
                r.manifests_before, r.manifests_after
            ));
        }
    }
    if let Some(retention) = policy.snapshot_retention {
        let retention = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        let e = expire_snapshots(
            table,
            &ExpireOptions {
                older_than_ms: chrono::Utc::now()
                    .timestamp_millis()
                    .saturating_sub(retention),
                retain_last: policy.min_snapshots,
            },
        )
        .await?;
        if e.snapshots > 0 {
            did.push(format!(
                "expired {} snapshots ({} data files deleted)",
                e.snapshots, e.data_files
            ));
        }
    }
    Ok(if did.is_empty() {
        "nothing to do".to_string()
    } else {
        did.join("; ")
    })
}
