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
//! memory within a budget ([`MEMORY_PROPERTY`]); beyond it the rows move to a file on local
//! disk ([`super::key_spill`]) whose page cache takes half the budget. Should the disk fail
//! it, the index holds nothing and the keys are looked up in the table's key columns at each
//! commit.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use iceberg::table::Table;

use super::key_spill::Spill;
use super::upsert::{Keys, live_keys};
use crate::error::{Error, Result};

/// A key: an integer key column's value, or Arrow's row encoding of the key columns.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Key {
    Int(i64),
    Row(Box<[u8]>),
}

/// The table property bounding a table's index in memory (`'256mb'` when unset): an index
/// that would be larger keeps its rows on local disk, with half the budget as its cache.
pub const MEMORY_PROPERTY: &str = "floe.key-index.memory";

/// The memory an index takes when the table does not say.
pub const DEFAULT_MEMORY: u64 = 256 << 20;

/// The live rows of one table by key, as of one snapshot.
#[derive(Debug, Default)]
pub struct KeyIndex {
    /// The snapshot it reflects; `None` before it is built.
    snapshot: Option<Option<i64>>,
    /// The table's uuid (names its spill file).
    uuid: String,
    /// About how much memory it holds, and the most it may.
    bytes: u64,
    budget: u64,
    /// Its rows could not be kept (the disk failed them): it holds nothing, and keys are
    /// looked up in the table itself.
    over: bool,
    files: Vec<String>,
    file_ids: HashMap<String, u32>,
    /// The rows, in memory until they outgrow the budget, then on disk.
    rows: HashMap<Key, (u32, u64)>,
    spill: Option<Spill>,
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
            uuid: table.metadata().uuid().to_string(),
            budget: budget(table)?,
            ..KeyIndex::default()
        };
        if current.is_some() {
            let mut failed = false;
            live_keys(table, keys, converter, |k, file, pos| {
                let f = self.file_id(file);
                failed = self.insert(k, f, pos as u64).is_err();
                !failed && !self.over
            })
            .await?;
            if let (Some(spill), false) = (&mut self.spill, failed) {
                failed = spill.flush(&mut self.more).is_err();
            }
            if failed {
                self.give_up();
            }
        }
        self.snapshot = Some(current);
        Ok(())
    }

    /// Whether it holds no rows (its disk failed them): the caller looks keys up in the
    /// table.
    pub fn is_over_budget(&self) -> bool {
        self.over
    }

    /// Whether its rows are on disk.
    pub fn is_spilled(&self) -> bool {
        self.spill.is_some()
    }

    /// Give up holding rows: the disk failed them.
    fn give_up(&mut self) {
        let (snapshot, budget, uuid) = (self.snapshot, self.budget, std::mem::take(&mut self.uuid));
        *self = KeyIndex {
            snapshot,
            budget,
            uuid,
            over: true,
            ..KeyIndex::default()
        };
    }

    /// Move the rows to disk: the budget is spent.
    fn spill(&mut self) -> Result<()> {
        let cache = usize::try_from(self.budget / 2).unwrap_or(usize::MAX);
        let mut spill = Spill::create(&self.uuid, cache)?;
        for (k, place) in std::mem::take(&mut self.rows) {
            spill.insert(k, place, &mut self.more)?;
        }
        self.spill = Some(spill);
        Ok(())
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

    fn insert(&mut self, key: Key, file: u32, pos: u64) -> Result<()> {
        if self.over {
            return Ok(());
        }
        if let Some(spill) = &mut self.spill {
            return spill.insert(key, (file, pos), &mut self.more);
        }
        // A map entry (key, place and the map's share), and a row key's bytes.
        self.bytes += 56
            + match &key {
                Key::Int(_) => 0,
                Key::Row(r) => r.len() as u64,
            };
        if let Some(first) = self.rows.get(&key).copied() {
            self.more
                .entry(key)
                .or_insert_with(|| vec![first])
                .push((file, pos));
        } else {
            self.rows.insert(key, (file, pos));
        }
        if self.bytes > self.budget {
            self.spill()?;
        }
        Ok(())
    }

    /// The live rows of each of `keys`: their data files (as ids, see [`Self::file`]) and
    /// positions.
    pub fn find_all(&mut self, keys: &[&Key]) -> Result<Vec<Vec<(u32, u64)>>> {
        let found: Vec<Option<(u32, u64)>> = match &mut self.spill {
            Some(spill) => spill.get(keys.iter().copied(), &mut self.more)?,
            None => keys.iter().map(|k| self.rows.get(*k).copied()).collect(),
        };
        Ok(keys
            .iter()
            .zip(found)
            .map(|(k, one)| match self.more.get(*k) {
                Some(all) => all.clone(),
                None => one.into_iter().collect(),
            })
            .collect())
    }

    /// The path of data file `id`.
    pub fn file(&self, id: u32) -> &str {
        &self.files[id as usize]
    }

    /// The keys it holds.
    pub fn len(&self) -> usize {
        match &self.spill {
            Some(s) => s.len() as usize,
            None => self.rows.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
        for k in update.keys() {
            self.rows.remove(k);
            self.more.remove(k);
        }
        let ids: Vec<u32> = update.files.iter().map(|p| self.file_id(p)).collect();
        let placed = if let Some(spill) = &mut self.spill {
            let rows = update
                .rows
                .iter()
                .map(|(k, f, pos)| (k.clone(), (ids[*f as usize], *pos)))
                .collect();
            spill.replace(update.keys(), rows, &mut self.more)
        } else {
            update
                .rows
                .into_iter()
                .try_for_each(|(k, f, pos)| self.insert(k, ids[f as usize], pos))
        };
        // Rows it could not place: rebuilt at the next use.
        self.snapshot = placed.is_ok().then_some(snapshot);
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
    /// Where the rows replaced were found: `memory`, `disk` (the index) or `table` (the key
    /// columns read); a commit's summary says it (`floe.key-index`).
    pub found_in: &'static str,
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
        index.insert(key("k1"), f, 0).unwrap();
        index.insert(key("k2"), f, 1).unwrap();
        // A key another writer appended twice: both rows are its.
        index.insert(key("k2"), f, 5).unwrap();
        assert_eq!(
            find(&mut index, &key("k2")),
            vec!["a.parquet:1", "a.parquet:5"]
        );
        let update = Update {
            base: Some(1),
            deleted: vec![key("k1")],
            files: vec!["b.parquet".into()],
            rows: vec![(key("k2"), 0, 0)],
            ..Update::default()
        };
        index.committed(update, Some(2));
        assert_eq!(find(&mut index, &key("k1")), Vec::<String>::new());
        assert_eq!(find(&mut index, &key("k2")), vec!["b.parquet:0"]);
        assert_eq!(index.len(), 1);
        // Found on snapshot 1, but the index reflects 2 now: not applied.
        let stale = Update {
            base: Some(1),
            deleted: vec![key("k2")],
            ..Update::default()
        };
        index.committed(stale, Some(3));
        assert_eq!(find(&mut index, &key("k2")), vec!["b.parquet:0"]);
        assert_eq!(find(&mut index, &Key::Int(7)), Vec::<String>::new());
        assert_eq!(index.snapshot, Some(Some(2)));
    }

    /// `key`'s rows as `file:position`.
    fn find(index: &mut KeyIndex, k: &Key) -> Vec<String> {
        let found = index.find_all(&[k]).unwrap().pop().unwrap();
        found
            .into_iter()
            .map(|(f, p)| format!("{}:{p}", index.file(f)))
            .collect()
    }

    #[test]
    fn an_index_beyond_its_budget_keeps_its_rows_on_disk() {
        let mut index = KeyIndex {
            snapshot: Some(Some(1)),
            uuid: "test-spill".into(),
            budget: 56 * 1000,
            ..KeyIndex::default()
        };
        let f = index.file_id("a.parquet");
        for i in 0..100_000 {
            index.insert(Key::Int(i), f, i as u64).unwrap();
        }
        index.insert(Key::Int(7), f, 70).unwrap();
        assert!(index.is_spilled() && !index.is_over_budget());
        assert!(index.rows.is_empty(), "nothing in memory but duplicates");
        assert_eq!(find(&mut index, &Key::Int(99_999)), vec!["a.parquet:99999"]);
        assert_eq!(index.len(), 100_000, "a key held twice counts once");
        assert_eq!(
            find(&mut index, &Key::Int(7)),
            vec!["a.parquet:7", "a.parquet:70"]
        );
        let update = Update {
            base: Some(1),
            deleted: vec![Key::Int(1), Key::Int(123_456)],
            found_in: "disk",
            files: vec!["b.parquet".into()],
            rows: vec![
                (Key::Int(2), 0, 0),
                (Key::Int(7), 0, 1),
                (Key::Int(200_000), 0, 2),
            ],
        };
        index.committed(update, Some(2));
        assert_eq!(index.snapshot, Some(Some(2)));
        assert_eq!(find(&mut index, &Key::Int(1)), Vec::<String>::new());
        assert_eq!(find(&mut index, &Key::Int(2)), vec!["b.parquet:0"]);
        assert_eq!(find(&mut index, &Key::Int(7)), vec!["b.parquet:1"]);
        assert_eq!(find(&mut index, &Key::Int(200_000)), vec!["b.parquet:2"]);
        assert_eq!(index.len(), 100_000);
        let path = index.spill.as_ref().unwrap().path().to_path_buf();
        assert!(path.exists());
        drop(index);
        assert!(!path.exists(), "the spill file goes with its index");
    }
}
