//! Where a job resumes: from its checkpoint record, or from what its tables carry.
//!
//! ```text
//! record (state.dir)          tables ([`Mark`]: floe.checkpoint, floe.offsets)
//!   checkpoint r, offsets       destination: its latest mark d (the offsets to resume from)
//!   for this destination?       every table the job writes: the highest checkpoint f
//!
//! offsets:    the later of r (when it is this destination's) and d
//! checkpoint: max(r, d, f) -- the next one is higher than any a table has seen
//! ```
//!
//! A job's identity does not depend on its state folder surviving: a lost record (an
//! ephemeral disk, a changed `state.dir`) resumes from the tables; a destination table dropped
//! and re-created starts afresh (reading its sources from the start), while the count goes on
//! above the checkpoints every other table (the dead letters) has, so none skips a commit.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use iceberg::io::FileIO;
use iceberg::table::Table;
use iceberg::{Catalog, NamespaceIdent, TableIdent};

use super::commit::Mark;
use super::state::CheckpointRecord;
use crate::connector::Offsets;
use crate::error::{Error, Result};

/// Where a job starts.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Resume {
    /// The last checkpoint id used; the next checkpoint is one more.
    pub checkpoint: u64,
    /// The offsets to seek the sources to (none: read them from the start).
    pub sources: Option<BTreeMap<String, Offsets>>,
    /// When that checkpoint was taken (ms since the epoch), if known.
    pub time_ms: i64,
}

/// What the tables of a job say about it.
#[derive(Debug, Clone, Default)]
pub struct TableMarks {
    /// The latest mark among the tables whose offsets the job resumes from.
    pub destination: Option<Mark>,
    /// The highest checkpoint of the job in any table it writes.
    pub highest: u64,
    /// The latest checkpoint whose record a mark names a copy of (in any table the job
    /// writes), and the copy's URI (see [`super::lake_copy`]).
    pub copy: Option<(u64, String)>,
    /// How to read the copy: the file IO of the table whose mark names it.
    pub io: Option<FileIO>,
}

impl TableMarks {
    /// Take `mark` of a table the job writes; `destination` when the job resumes from it.
    pub fn add(&mut self, mark: Option<Mark>, destination: bool) {
        let Some(mark) = mark else { return };
        self.highest = self.highest.max(mark.checkpoint);
        if destination
            && self
                .destination
                .as_ref()
                .is_none_or(|d| mark.checkpoint > d.checkpoint)
        {
            self.destination = Some(mark);
        }
    }

    /// Take the mark of `job` in `table`, which the job writes; `destination` when the job
    /// resumes from it.
    pub fn add_table(&mut self, table: &Table, job: &str, destination: bool) {
        let mark = Mark::read(table, job);
        if let Some(m) = &mark
            && let Some(uri) = m.record_copy()
            && self.copy.as_ref().is_none_or(|(c, _)| m.checkpoint > *c)
        {
            self.copy = Some((m.checkpoint, uri.to_string()));
            self.io = Some(table.file_io().clone());
        }
        self.add(mark, destination);
    }
}

/// Where job `job` resumes, from its last record (`None` when it has none) and its tables'
/// marks. `identity` names the destination; a record of another one (a dropped table of the
/// same name) gives no offsets.
pub fn resume(
    job: &str,
    record: Option<&CheckpointRecord>,
    identity: &str,
    marks: &TableMarks,
) -> Result<Resume> {
    let own = record.filter(|r| r.table_uuid.as_deref() == Some(identity));
    let from_record = own.map(|r| Resume {
        checkpoint: r.checkpoint,
        sources: Some(r.sources.clone()),
        time_ms: r.time_ms,
    });
    let later_in_tables = marks
        .destination
        .as_ref()
        .filter(|d| own.is_none_or(|r| d.checkpoint > r.checkpoint));
    let mut start = match (later_in_tables, from_record) {
        (Some(mark), _) => {
            let Some(sources) = mark.offsets.clone() else {
                return Err(Error::Plan(format!(
                    "job '{job}' has no checkpoint record for checkpoint {}, which its tables \
                     carry without the source offsets (an older floe wrote it): resuming would \
                     read its sources again from the start and duplicate rows. Restore the \
                     job's state folder, or give the job another 'pipeline.name'",
                    mark.checkpoint
                )));
            };
            Resume {
                checkpoint: mark.checkpoint,
                sources: Some(sources),
                time_ms: mark.time_ms,
            }
        }
        (None, Some(r)) => r,
        (None, None) => Resume::default(),
    };
    start.checkpoint = start
        .checkpoint
        .max(marks.highest)
        .max(record.map_or(0, |r| r.checkpoint));
    Ok(start)
}

/// Tables loaded at once by [`marks_in`].
const PARALLEL_LOADS: usize = 8;

/// The marks of `job` in every table of `namespace` (a routed job's tables), all of them
/// destination tables. A missing namespace has none.
pub async fn marks_in(
    catalog: &Arc<dyn Catalog>,
    namespace: &NamespaceIdent,
    job: &str,
) -> Result<TableMarks> {
    let mut marks = TableMarks::default();
    each_table(catalog, namespace, |table| {
        marks.add_table(table, job, true)
    })
    .await?;
    Ok(marks)
}

/// The tables of `namespace` that carry a mark of `job` (the tables a routed job committed
/// to, in this run or any before).
pub async fn marked_in(
    catalog: &Arc<dyn Catalog>,
    namespace: &NamespaceIdent,
    job: &str,
) -> Result<Vec<TableIdent>> {
    let mut marked = Vec::new();
    each_table(catalog, namespace, |table| {
        if Mark::read(table, job).is_some() {
            marked.push(table.identifier().clone());
        }
    })
    .await?;
    Ok(marked)
}

/// Call `f` with every table of `namespace` (none when it is missing), loaded
/// [`PARALLEL_LOADS`] at once and dropped after (a routed namespace may hold thousands).
async fn each_table(
    catalog: &Arc<dyn Catalog>,
    namespace: &NamespaceIdent,
    mut f: impl FnMut(&Table),
) -> Result<()> {
    let tables = match catalog.list_tables(namespace).await {
        Ok(t) => t,
        Err(e) if e.kind() == iceberg::ErrorKind::NamespaceNotFound => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    let mut loads = futures::stream::iter(tables)
        .map(|ident| async move { load_if_there(catalog, &ident).await })
        .buffer_unordered(PARALLEL_LOADS);
    while let Some(table) = loads.next().await {
        if let Some(table) = table? {
            f(&table);
        }
    }
    Ok(())
}

/// Table `ident`, unless it (or its namespace) does not exist.
pub async fn load_if_there(
    catalog: &Arc<dyn Catalog>,
    ident: &TableIdent,
) -> Result<Option<Table>> {
    match catalog.load_table(ident).await {
        Ok(table) => Ok(Some(table)),
        Err(e)
            if matches!(
                e.kind(),
                iceberg::ErrorKind::TableNotFound | iceberg::ErrorKind::NamespaceNotFound
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets(n: u64) -> BTreeMap<String, Offsets> {
        BTreeMap::from([("s".into(), Offsets::from([("0".into(), n.to_string())]))])
    }

    fn record(checkpoint: u64, uuid: &str) -> CheckpointRecord {
        CheckpointRecord {
            job: "j".into(),
            checkpoint,
            time_ms: 7,
            sources: offsets(checkpoint * 10),
            tables: vec![],
            table_uuid: Some(uuid.into()),
            dead_letters: None,
            state: None,
            copied_to: None,
        }
    }

    fn mark(checkpoint: u64, with_offsets: bool) -> Mark {
        Mark {
            job: "j".into(),
            checkpoint,
            offsets: with_offsets.then(|| offsets(checkpoint * 10)),
            time_ms: 9,
            copy: None,
        }
    }

    #[test]
    fn a_record_is_where_a_job_resumes() {
        let mut marks = TableMarks::default();
        marks.add(Some(mark(3, true)), true);
        let start = resume("j", Some(&record(3, "u")), "u", &marks).unwrap();
        assert_eq!((start.checkpoint, start.sources), (3, Some(offsets(30))));
        assert_eq!(start.time_ms, 7);
    }

    #[test]
    fn without_a_record_the_tables_say_where() {
        let mut marks = TableMarks::default();
        marks.add(Some(mark(5, true)), true);
        marks.add(Some(mark(2, true)), true);
        marks.add(None, true);
        let start = resume("j", None, "u", &marks).unwrap();
        assert_eq!((start.checkpoint, start.sources), (5, Some(offsets(50))));
        // A record older than the tables (a state folder restored from a backup).
        let start = resume("j", Some(&record(4, "u")), "u", &marks).unwrap();
        assert_eq!((start.checkpoint, start.sources), (5, Some(offsets(50))));
    }

    #[test]
    fn a_recreated_destination_starts_afresh_and_counts_on() {
        let mut marks = TableMarks::default();
        // The dead-letter table has checkpoint 8; the new destination has none.
        marks.add(Some(mark(8, true)), false);
        let start = resume("j", Some(&record(6, "old")), "new", &marks).unwrap();
        assert_eq!((start.checkpoint, start.sources), (8, None));
        let start = resume("j", Some(&record(9, "old")), "new", &TableMarks::default()).unwrap();
        assert_eq!((start.checkpoint, start.sources), (9, None));
    }

    #[test]
    fn tables_without_offsets_and_no_record_refuse_to_guess() {
        let mut marks = TableMarks::default();
        marks.add(Some(mark(4, false)), true);
        let err = resume("j", None, "u", &marks).unwrap_err().to_string();
        assert!(
            err.contains("checkpoint 4") && err.contains("duplicate"),
            "{err}"
        );
    }
}
