//! Keeping a routed job's memory and open files bounded: gathered rows become row groups,
//! files close, all on the write runtime (`lake::runtime`) while the job reads on.

use std::collections::HashMap;

use super::RoutedSink;
use crate::error::Result;
use crate::lake::runtime;
use crate::sink::table_sink::{Unwritten, Written};
use crate::task::{AbortOnDrop, joined};

/// What writing gave back, per table.
pub(super) type WrittenTables = Vec<(String, Written)>;

/// Tables' gathered rows being written (and files closed) in the background.
pub(super) struct Closing {
    pub(super) tables: std::collections::HashSet<String>,
    pub(super) task: AbortOnDrop<Result<WrittenTables>>,
}

/// Write `unwritten` (per table) on the write runtime, a table a task: its workers take
/// the next table when done.
pub(super) async fn write_unwritten(unwritten: Vec<(String, Unwritten)>) -> Result<WrittenTables> {
    let writes: Vec<_> = unwritten
        .into_iter()
        .map(|(name, u)| runtime::spawn(async move { Ok((name, u.write().await?)) }))
        .collect();
    let mut written = Vec::with_capacity(writes.len());
    for w in writes {
        written.push(joined(w, "writing a table's files").await?);
    }
    Ok(written)
}

/// A table's gathered rows become a row group of its file at this size (in Arrow), or at a
/// quarter of `route.buffer-size` if less.
const ROW_GROUP_BYTES: usize = 32 << 20;

impl RoutedSink {
    /// Forget the routed batches no table gathers rows of any more.
    pub(super) fn release(&mut self) {
        let oldest = self.holds.values().min().copied().unwrap_or(u64::MAX);
        while let Some(&(seq, bytes)) = self.routed.front() {
            if seq >= oldest {
                break;
            }
            self.routed.pop_front();
            self.routed_bytes -= bytes;
        }
    }

    /// Keep the job's memory bounded: a table's gathering of [`ROW_GROUP_BYTES`] becomes a
    /// row group of its open files; beyond `route.buffer-size` of routed batches gathered,
    /// every table's gathering does; beyond `route.max-open-files` (files on object stores:
    /// local files hold no descriptor between row groups), the least recently written
    /// tables' files are closed, down to seven eighths of the cap, and so are the files an
    /// object store holds most bytes of beyond `route.buffer-size`. All on the
    /// blocking pool while the job goes on (the next time waits for it).
    pub(super) async fn bound(&mut self) -> Result<()> {
        self.release();
        if self.closing.as_ref().is_some_and(|c| c.task.is_finished()) {
            self.finish_closing().await?;
        }
        // Per table: whether to close its files.
        let mut victims: HashMap<String, bool> = HashMap::new();
        let mut open: Vec<(u64, usize, &String)> = self
            .tables
            .iter()
            .map(|(n, t)| {
                (
                    self.last_write.get(n).copied().unwrap_or(0),
                    t.open_files(),
                    n,
                )
            })
            .filter(|(_, files, _)| *files > 0)
            .collect();
        let cap = self.options.max_open_files;
        let mut files: usize = open.iter().map(|(_, f, _)| f).sum();
        if files > cap {
            open.sort_unstable();
            let keep = (cap - cap / 8).max(1);
            for (_, f, name) in open {
                if files <= keep {
                    break;
                }
                files -= f;
                victims.insert(name.clone(), true);
            }
        }
        let buffer = self.options.buffer_size;
        if self.routed_bytes > buffer {
            for name in self.holds.keys() {
                victims.entry(name.clone()).or_insert(false);
            }
        } else {
            for (name, t) in &self.tables {
                if t.buffered_bytes() >= ROW_GROUP_BYTES.min(buffer / 4) {
                    victims.entry(name.clone()).or_insert(false);
                }
            }
        }
        if victims.is_empty() {
            return Ok(());
        }
        // (The writers are all back: their files' bytes count.)
        self.finish_closing().await?;
        self.close_holding(&mut victims);
        let mut unwritten = Vec::new();
        for (name, close) in victims {
            self.holds.remove(&name);
            let Some(sink) = self.tables.get_mut(&name) else {
                continue;
            };
            if let Some(u) = sink.take_unwritten(close)? {
                unwritten.push((name, u));
            }
        }
        self.release();
        self.closing = Some(Closing {
            tables: unwritten.iter().map(|(n, _)| n.clone()).collect(),
            task: AbortOnDrop::spawn(write_unwritten(unwritten)),
        });
        Ok(())
    }

    /// Object stores hold what is written to a file in memory until a part's worth: beyond
    /// `route.buffer-size` held, the files holding most are to be closed (uploaded), down to
    /// half.
    fn close_holding(&self, victims: &mut HashMap<String, bool>) {
        let buffer = self.options.buffer_size;
        let mut held: Vec<(usize, &String)> = self
            .tables
            .iter()
            .map(|(n, t)| (t.held_bytes(), n))
            .filter(|(b, _)| *b > 0)
            .collect();
        let mut holding: usize = held.iter().map(|(b, _)| b).sum();
        if holding <= buffer {
            return;
        }
        held.sort_unstable_by(|a, b| b.cmp(a));
        for (b, name) in held {
            if holding <= buffer / 2 {
                break;
            }
            holding -= b;
            victims.insert(name.clone(), true);
        }
    }

    /// Wait for the gatherings being written out, and give each table its files.
    pub(super) async fn finish_closing(&mut self) -> Result<()> {
        let Some(closing) = self.closing.take() else {
            return Ok(());
        };
        let written = joined(closing.task, "writing out gathered rows").await?;
        self.give_back(written).await
    }

    /// What writing gave back, to each table's sink.
    pub(super) async fn give_back(&mut self, written: WrittenTables) -> Result<()> {
        for (name, w) in written {
            if let Some(sink) = self.tables.get_mut(&name) {
                sink.give_back(w).await?;
            }
        }
        Ok(())
    }
}
