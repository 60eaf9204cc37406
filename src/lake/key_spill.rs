//! A key index's rows on local disk, once they outgrow its memory budget: a B-tree (redb) in
//! a file of its own under the user's cache folder, its page cache bounded, removed with the
//! index. Like the index, it is a cache: written without syncing, never read after a restart
//! (an index is rebuilt from the table), and files left by a process that died are removed
//! by the next one that spills.
//!
//! ```text
//! key (Int: 0x00 + i64 big-endian, Row: 0x01 + row bytes) -> (data file id, position)
//! inserts are buffered; writes go in transactions of SPILL_BATCH keys
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use redb::{Database, Durability, ReadableDatabase, TableDefinition};

use super::key_index::Key;
use crate::error::{Error, Result};

const ROWS: TableDefinition<&[u8], (u32, u64)> = TableDefinition::new("rows");

/// Keys written (or removed) per transaction: a transaction holds the pages it changes in
/// memory until it commits, so a checkpoint of many keys is applied in several.
const SPILL_BATCH: usize = 1 << 14;

/// The rows of an index, by key, in a file.
pub struct Spill {
    db: Database,
    path: PathBuf,
    pending: Vec<(Key, (u32, u64))>,
    len: u64,
    /// Write transactions so far (see [`Self::write`]).
    writes: u64,
}

/// Every this many write transactions one is durable: redb reuses the pages earlier
/// transactions freed only after a durable one, and the file would grow with every commit.
const DURABLE_EVERY: u64 = 16;

impl std::fmt::Debug for Spill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spill")
            .field("path", &self.path)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// Where spilled indexes go: `<cache dir>/floe/key-index`.
fn folder() -> PathBuf {
    dirs::cache_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join("floe")
        .join("key-index")
}

fn encode(key: &Key, out: &mut Vec<u8>) {
    out.clear();
    match key {
        Key::Int(i) => {
            out.push(0);
            out.extend_from_slice(&i.to_be_bytes());
        }
        Key::Row(r) => {
            out.push(1);
            out.extend_from_slice(r);
        }
    }
}

fn failed(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Io {
        context: format!("the key index spilled to disk: {what}"),
        source: std::io::Error::other(e.to_string()),
    }
}

impl Spill {
    /// A new, empty spill file for table `uuid`, with a page cache of `cache` bytes.
    pub fn create(uuid: &str, cache: usize) -> Result<Self> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let dir = folder();
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        remove_orphans(&dir);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("{uuid}-{}-{n}.redb", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let db = redb::Builder::new()
            .set_cache_size(cache)
            .create(&path)
            .map_err(|e| failed(&format!("creating {}", path.display()), e))?;
        Ok(Self {
            db,
            path,
            pending: Vec::new(),
            len: 0,
            writes: 0,
        })
    }

    /// Its file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Keys held (a key held twice counts once; buffered ones are counted as new).
    pub fn len(&self) -> u64 {
        self.len + self.pending.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Add a row of `key` (written with the next batch).
    pub fn insert(
        &mut self,
        key: Key,
        place: (u32, u64),
        more: &mut HashMap<Key, Vec<(u32, u64)>>,
    ) -> Result<()> {
        self.pending.push((key, place));
        if self.pending.len() >= SPILL_BATCH {
            self.flush(more)?;
        }
        Ok(())
    }

    /// Write the buffered rows; a key found already there has several rows: all of them go
    /// to `more` (the caller's, in memory: another writer's duplicates are few).
    pub fn flush(&mut self, more: &mut HashMap<Key, Vec<(u32, u64)>>) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let mut pending = std::mem::take(&mut self.pending).into_iter().peekable();
        while pending.peek().is_some() {
            let chunk = pending.by_ref().take(SPILL_BATCH);
            let added = self.write(|table| {
                let mut buf = Vec::new();
                let mut added = 0;
                for (key, place) in chunk {
                    encode(&key, &mut buf);
                    let before = table.insert(buf.as_slice(), place)?.map(|v| v.value());
                    match before {
                        Some(first) => more.entry(key).or_insert_with(|| vec![first]).push(place),
                        None => added += 1,
                    }
                }
                Ok(added)
            })?;
            self.len += added;
        }
        Ok(())
    }

    /// The row of each of `keys` (`None`: not held).
    pub fn get<'k>(
        &mut self,
        keys: impl Iterator<Item = &'k Key>,
        more: &mut HashMap<Key, Vec<(u32, u64)>>,
    ) -> Result<Vec<Option<(u32, u64)>>> {
        self.flush(more)?;
        let txn = self.db.begin_read().map_err(|e| failed("reading", e))?;
        let table = match txn.open_table(ROWS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(keys.map(|_| None).collect()),
            Err(e) => return Err(failed("reading", e)),
        };
        let mut buf = Vec::new();
        keys.map(|k| {
            encode(k, &mut buf);
            table
                .get(buf.as_slice())
                .map(|v| v.map(|v| v.value()))
                .map_err(|e| failed("reading", e))
        })
        .collect()
    }

    /// Remove `keys`, then add `rows`, in one transaction.
    pub fn replace<'k>(
        &mut self,
        keys: impl Iterator<Item = &'k Key>,
        rows: Vec<(Key, (u32, u64))>,
        more: &mut HashMap<Key, Vec<(u32, u64)>>,
    ) -> Result<()> {
        self.flush(more)?;
        let mut keys = keys.peekable();
        while keys.peek().is_some() {
            let chunk = keys.by_ref().take(SPILL_BATCH);
            let removed = self.write(|table| {
                let mut buf = Vec::new();
                let mut removed = 0;
                for k in chunk {
                    encode(k, &mut buf);
                    if table.remove(buf.as_slice())?.is_some() {
                        removed += 1;
                    }
                }
                Ok(removed)
            })?;
            self.len -= removed;
        }
        self.pending = rows;
        self.flush(more)
    }

    fn write<T>(
        &mut self,
        f: impl FnOnce(
            &mut redb::Table<&[u8], (u32, u64)>,
        ) -> std::result::Result<T, redb::StorageError>,
    ) -> Result<T> {
        let mut txn = self.db.begin_write().map_err(|e| failed("writing", e))?;
        // A cache: nothing is read back after a crash; syncing only to reuse pages.
        self.writes += 1;
        if !self.writes.is_multiple_of(DURABLE_EVERY) {
            txn.set_durability(Durability::None)
                .map_err(|e| failed("writing", e))?;
        }
        let out = {
            let mut table = txn.open_table(ROWS).map_err(|e| failed("writing", e))?;
            f(&mut table).map_err(|e| failed("writing", e))?
        };
        txn.commit().map_err(|e| failed("writing", e))?;
        Ok(out)
    }
}

impl Drop for Spill {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Remove the spill files of processes that are gone (`<uuid>-<pid>-<n>.redb`; only where
/// `/proc` says which processes run).
fn remove_orphans(dir: &Path) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".redb") else {
            continue;
        };
        let mut parts = stem.rsplit('-');
        let (_, Some(pid)) = (parts.next(), parts.next()) else {
            continue;
        };
        let alive = Path::new("/proc").join(pid).exists();
        if !alive && pid.bytes().all(|b| b.is_ascii_digit()) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}
