//! Where each key's live row is, in a table with a primary key: a cache of the table, never
//! its truth.
//!
//! ```text
//! index of table (by uuid) ── reflects snapshot S ──┬─ S is the table's current one: use it
//!                                                   └─ else: rebuilt from the table (its key
//!                                                      columns, deletes applied), then used
//! after a commit from S to S': the keys deleted and the new rows' places applied, S' kept
//! ```
//!
//! An index is only ever used for the snapshot it reflects, so a commit by another writer,
//! a compaction, a crash or a restart costs a rebuild, never a wrong delete. Keys are kept
//! exactly (integers as they are, others in Arrow's row encoding of the key columns), in
//! memory, within a budget ([`MEMORY_PROPERTY`]); an index over it holds nothing and the
//! keys are looked up in the table's key columns at each commit.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use iceberg::table::Table;

use super::upsert::{Keys, live_keys};
use crate::error::{Error, Result};

/// A key: an integer key column's value, or Arrow's row encoding of the key columns.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Key {
    Int(i64),
    Row(Box<[u8]>),
}

/// The table property bounding a table's index in memory (`'256mb'` when unset): an index
/// that would be larger is not kept, and each commit finds its keys' rows by reading the
/// table's key columns instead (slower, in bounded memory).
pub const MEMORY_PROPERTY: &str = "floe.key-index.memory";

/// The memory an index takes when the table does not say.
pub const DEFAULT_MEMORY: u64 = 256 << 20;

/// The live rows of one table by key, as of one snapshot.
#[derive(Debug, Default)]
pub struct KeyIndex {
    /// The snapshot it reflects; `None` before it is built.
    snapshot: Option<Option<i64>>,
    /// About how much memory it holds, and the most it may.
    bytes: u64,
    budget: u64,
    /// It would take more than its budget: it holds nothing, and keys are looked up in the
    /// table itself.
    over: bool,
    files: Vec<String>,
    file_ids: HashMap<String, u32>,
    rows: HashMap<Key, (u32, u64)>,
    /// Rows of keys the table holds more than once (another writer appended them): all are
    /// replaced with the key.
    more: HashMap<Key, Vec<(u32, u64)>>,
}

/// The indexes of this process, by table uuid.
static INDEXES: LazyLock<Mutex<HashMap<String, Arc<tokio::sync::Mutex<KeyIndex>>>>> =
    LazyLock::new(Mutex::default);

/// The index of `table` (empty until first used).
pub fn of(table: &Table) -> Arc<tokio::sync::Mutex<KeyIndex>> {
    let uuid = table.metadata().uuid().to_string();
    let mut all = INDEXES.lock().unwrap_or_else(|e| e.into_inner());
    all.entry(uuid).or_default().clone()
}

impl KeyIndex {
    /// Make it reflect `table`'s current snapshot, rebuilding it from the table if it
    /// reflects another (`keys` are the key columns, read with `converter`).
    pub async fn reflect(
        &mut self,
        table: &Table,
        keys: &[String],
        converter: &mut Keys,
    ) -> Result<()> {
        let current = table.metadata().current_snapshot_id();
        if self.snapshot == Some(current) {
            return Ok(());
        }
        *self = KeyIndex {
            budget: budget(table)?,
            ..KeyIndex::default()
        };
        if current.is_some() {
            live_keys(table, keys, converter, |k, file, pos| {
                let f = self.file_id(file);
                self.insert(k, f, pos as u64);
                !self.over
            })
            .await?;
        }
        self.snapshot = Some(current);
        Ok(())
    }

    /// Whether it would take more memory than its budget: it holds nothing then, and the
    /// caller looks keys up in the table.
    pub fn is_over_budget(&self) -> bool {
        self.over
    }

    /// Give up holding rows: the budget is spent.
    fn overflow(&mut self) {
        let (snapshot, budget) = (self.snapshot, self.budget);
        *self = KeyIndex {
            snapshot,
            budget,
            over: true,
            ..KeyIndex::default()
        };
    }

    fn file_id(&mut self, path: &str) -> u32 {
        if let Some(id) = self.file_ids.get(path) {
            return *id;
        }
        let id = self.files.len() as u32;
        self.files.push(path.to_string());
        self.file_ids.insert(path.to_string(), id);
        id
    }

    fn insert(&mut self, key: Key, file: u32, pos: u64) {
        if self.over {
            return;
        }
        // A map entry (key, place and the map's share), and a row key's bytes.
        self.bytes += 56
            + match &key {
                Key::Int(_) => 0,
                Key::Row(r) => r.len() as u64,
            };
        if self.bytes > self.budget {
            self.overflow();
            return;
        }
        if let Some(first) = self.rows.get(&key).copied() {
            self.more
                .entry(key)
                .or_insert_with(|| vec![first])
                .push((file, pos));
        } else {
            self.rows.insert(key, (file, pos));
        }
    }

    /// The live rows of `key`: their data files and positions.
    pub fn find(&self, key: &Key) -> Vec<(&str, u64)> {
        let place = |(f, p): (u32, u64)| (self.files[f as usize].as_str(), p);
        if let Some(all) = self.more.get(key) {
            return all.iter().copied().map(place).collect();
        }
        self.rows.get(key).copied().map(place).into_iter().collect()
    }

    /// The keys it holds.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// After `update` committed as snapshot `snapshot`: its keys' rows are where it put them.
    /// An index that no longer reflects the snapshot the update was found on is left alone
    /// (the next use rebuilds it).
    pub fn committed(&mut self, update: Update, snapshot: Option<i64>) {
        if self.snapshot != Some(update.base) {
            return;
        }
        if self.over {
            self.snapshot = Some(snapshot);
            return;
        }
        for k in update
            .deleted
            .iter()
            .chain(update.rows.iter().map(|(k, _, _)| k))
        {
            self.rows.remove(k);
            self.more.remove(k);
        }
        let ids: Vec<u32> = update.files.iter().map(|p| self.file_id(p)).collect();
        for (k, f, pos) in update.rows {
            self.insert(k, ids[f as usize], pos);
        }
        self.snapshot = Some(snapshot);
    }
}

/// The memory `table`'s index may take ([`MEMORY_PROPERTY`]).
fn budget(table: &Table) -> Result<u64> {
    match table.metadata().properties().get(MEMORY_PROPERTY) {
        None => Ok(DEFAULT_MEMORY),
        Some(v) => crate::sql::options::parse_size(v).map_err(|e| {
            Error::Option(format!(
                "table {}: property '{MEMORY_PROPERTY}' = '{v}': {e}",
                table.identifier()
            ))
        }),
    }
}

/// What a commit changes in an index: the keys it deletes, and the keys of its new rows
/// with where they are (which replace the keys' rows).
#[derive(Debug, Default)]
pub struct Update {
    /// The snapshot the rows replaced were found in.
    pub base: Option<i64>,
    pub deleted: Vec<Key>,
    /// The new rows' data files.
    pub files: Vec<String>,
    /// Each new row's key, data file (an index into `files`) and position.
    pub rows: Vec<(Key, u32, u64)>,
}

impl Update {
    /// Every key it changes.
    pub fn keys(&self) -> impl Iterator<Item = &Key> {
        self.deleted
            .iter()
            .chain(self.rows.iter().map(|(k, _, _)| k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> Key {
        Key::Row(s.as_bytes().into())
    }

    #[test]
    fn commits_move_keys_and_an_index_of_another_snapshot_is_left_alone() {
        let mut index = KeyIndex {
            snapshot: Some(Some(1)),
            budget: DEFAULT_MEMORY,
            ..KeyIndex::default()
        };
        let f = index.file_id("a.parquet");
        index.insert(key("k1"), f, 0);
        index.insert(key("k2"), f, 1);
        // A key another writer appended twice: both rows are its.
        index.insert(key("k2"), f, 5);
        assert_eq!(
            index.find(&key("k2")),
            vec![("a.parquet", 1), ("a.parquet", 5)]
        );
        let update = Update {
            base: Some(1),
            deleted: vec![key("k1")],
            files: vec!["b.parquet".into()],
            rows: vec![(key("k2"), 0, 0)],
        };
        index.committed(update, Some(2));
        assert_eq!(index.find(&key("k1")), vec![]);
        assert_eq!(index.find(&key("k2")), vec![("b.parquet", 0)]);
        assert_eq!(index.len(), 1);
        // Found on snapshot 1, but the index reflects 2 now: not applied.
        let stale = Update {
            base: Some(1),
            deleted: vec![key("k2")],
            ..Update::default()
        };
        index.committed(stale, Some(3));
        assert_eq!(index.find(&key("k2")), vec![("b.parquet", 0)]);
        assert_eq!(index.find(&Key::Int(7)), vec![]);
        assert_eq!(index.snapshot, Some(Some(2)));
    }
}
