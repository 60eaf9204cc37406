//! Which shards of a stream to read, in which order, and how far each got.
//!
//! A Kinesis stream is a tree of shards: resharding closes a shard and opens children
//! (two for a split, one for a merge of two adjacent parents). A key's records are in
//! the parent until it closed, then in a child. So a child is read only once every parent
//! it has is *drained* (read to its end), and per-key order holds across any reshard.
//!
//! The tracker is pure bookkeeping, without I/O, so that ordering and offsets are tested
//! without a server. Its offsets are one entry per shard:
//!
//! ```text
//! shardId-000000000001 = 4959033827149025660855969253...   read up to and including this
//!                                                          sequence number: resume AFTER it
//! shardId-000000000002 = trim-horizon                      nothing read yet: from the start
//! shardId-000000000003 = at-timestamp:1714521600000        nothing read yet: from records
//!                                                          that arrived at or after this time
//! shardId-000000000000 = drained                           closed and read to its end
//! @stop-at             = 1714521600000                     (bounded sources) read no record
//!                                                          that arrived after this time
//! ```
//!
//! A drained shard that the stream no longer lists (its records expired) is forgotten, so
//! the offsets do not grow without end.

use std::collections::{BTreeMap, BTreeSet};

use crate::connector::Offsets;
use crate::error::{Error, Result};

/// The offsets key of a bounded source's stop time (not a shard id: those start `shardId-`).
pub const STOP_AT_KEY: &str = "@stop-at";
const DRAINED: &str = "drained";
const TRIM_HORIZON: &str = "trim-horizon";
const AT_TIMESTAMP: &str = "at-timestamp:";

/// Where a shard is read from next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Position {
    /// Nothing read yet: from the shard's oldest record.
    TrimHorizon,
    /// Nothing read yet: from records that arrived at or after this time (epoch ms).
    AtTimestamp(i64),
    /// After this sequence number, the last record consumed.
    After(String),
    /// A closed shard read to its end: never read again.
    Drained,
}

impl Position {
    /// The position as an offsets value.
    pub fn to_offset(&self) -> String {
        match self {
            Position::TrimHorizon => TRIM_HORIZON.to_string(),
            Position::AtTimestamp(ms) => format!("{AT_TIMESTAMP}{ms}"),
            Position::After(seq) => seq.clone(),
            Position::Drained => DRAINED.to_string(),
        }
    }

    /// Parse an offsets value; `None` when it is none of the forms above.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            TRIM_HORIZON => Some(Position::TrimHorizon),
            DRAINED => Some(Position::Drained),
            _ => {
                if let Some(ms) = value.strip_prefix(AT_TIMESTAMP) {
                    return ms.parse().ok().map(Position::AtTimestamp);
                }
                let digits = !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit());
                digits.then(|| Position::After(value.to_string()))
            }
        }
    }
}

/// A shard as the stream lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedShard {
    pub id: String,
    /// The parent and, for a merge, the adjacent parent.
    pub parents: Vec<String>,
    /// Whether the shard is closed (has an ending sequence number).
    pub closed: bool,
}

#[derive(Debug, Clone)]
struct Tracked {
    parents: Vec<String>,
    closed: bool,
    position: Position,
    /// A bounded source read every record of this shard up to its stop time.
    at_bound: bool,
    /// In the last listing of the stream.
    listed: bool,
}

/// The shards of one stream and how far each has been read.
#[derive(Debug, Clone, Default)]
pub struct ShardTracker {
    shards: BTreeMap<String, Tracked>,
    /// Whether the stream was listed before (in this run or, restored, in an earlier one):
    /// shards that appear after the first listing are new, and read from their start.
    listed_before: bool,
    stop_at: Option<i64>,
}

impl ShardTracker {
    /// A tracker that has seen nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Continue from `offsets` (as [`ShardTracker::offsets`] made them).
    pub fn restore(offsets: &Offsets) -> Result<Self> {
        let mut tracker = Self::new();
        for (key, value) in offsets {
            if key == STOP_AT_KEY {
                let ms = value.parse().map_err(|_| bad_offset(key, value))?;
                tracker.stop_at = Some(ms);
                continue;
            }
            let position = Position::parse(value).ok_or_else(|| bad_offset(key, value))?;
            tracker.shards.insert(
                key.clone(),
                Tracked {
                    parents: Vec::new(),
                    closed: false,
                    position,
                    at_bound: false,
                    listed: false,
                },
            );
        }
        tracker.listed_before = !offsets.is_empty();
        Ok(tracker)
    }

    /// Whether the stream was listed yet.
    pub fn listed_before(&self) -> bool {
        self.listed_before
    }

    /// The stop time of a bounded source (epoch ms), once set.
    pub fn stop_at(&self) -> Option<i64> {
        self.stop_at
    }

    /// Set the stop time of a bounded source, unless a restored one is kept.
    pub fn set_stop_at_once(&mut self, ms: i64) {
        self.stop_at.get_or_insert(ms);
    }

    /// Take in a listing of the stream. Shards seen for the first time start at `initial`
    /// on the first listing ever, and from their start (trim horizon) after it, since they
    /// were created after the job started. Drained shards the stream no longer lists are
    /// forgotten; other unlisted shards are kept (their position must not be lost).
    pub fn merge_listing(&mut self, listing: &[ListedShard], initial: &Position) {
        let start = if self.listed_before {
            Position::TrimHorizon
        } else {
            initial.clone()
        };
        let listed: BTreeSet<&str> = listing.iter().map(|s| s.id.as_str()).collect();
        self.shards
            .retain(|id, s| listed.contains(id.as_str()) || s.position != Position::Drained);
        for s in self.shards.values_mut() {
            s.listed = false;
        }
        for shard in listing {
            let tracked = self.shards.entry(shard.id.clone()).or_insert(Tracked {
                parents: Vec::new(),
                closed: false,
                position: start.clone(),
                at_bound: false,
                listed: true,
            });
            tracked.parents = shard.parents.clone();
            tracked.closed = shard.closed;
            tracked.listed = true;
        }
        self.listed_before = true;
    }

    /// Whether a parent no longer holds back its children: drained, or unknown (expired
    /// from the stream, or never listed).
    fn parent_done(&self, id: &str) -> bool {
        self.shards
            .get(id)
            .is_none_or(|s| s.position == Position::Drained)
    }

    /// The shards to read now, in id order: not drained, not at their bound, and with
    /// every parent drained.
    pub fn readable(&self) -> Vec<String> {
        self.shards
            .iter()
            .filter(|(_, s)| s.position != Position::Drained && !s.at_bound)
            .filter(|(_, s)| s.parents.iter().all(|p| self.parent_done(p)))
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Whether a bounded source has read everything up to its stop time: every shard is
    /// drained, at its bound, or below a shard at its bound (its records all came later).
    pub fn finished(&self) -> bool {
        self.listed_before && self.shards.keys().all(|id| self.done_or_below_bound(id))
    }

    fn done_or_below_bound(&self, id: &str) -> bool {
        // Walk the ancestry; a listing with a cycle cannot hold us forever.
        let mut todo = vec![id.to_string()];
        let mut seen = BTreeSet::new();
        let mut first = true;
        while let Some(id) = todo.pop() {
            if !seen.insert(id.clone()) {
                continue;
            }
            let Some(s) = self.shards.get(&id) else {
                continue;
            };
            if s.at_bound {
                return true;
            }
            if first && s.position == Position::Drained {
                return true;
            }
            first = false;
            todo.extend(s.parents.iter().cloned());
        }
        false
    }

    /// Where `shard` is read from next.
    pub fn position(&self, shard: &str) -> Option<&Position> {
        self.shards.get(shard).map(|s| &s.position)
    }

    /// Whether the last listing showed `shard` closed.
    pub fn is_closed(&self, shard: &str) -> bool {
        self.shards.get(shard).is_some_and(|s| s.closed)
    }

    /// Whether the last listing of the stream showed `shard`.
    pub fn is_listed(&self, shard: &str) -> bool {
        self.shards.get(shard).is_some_and(|s| s.listed)
    }

    /// Records up to and including `sequence` were returned.
    pub fn consumed(&mut self, shard: &str, sequence: &str) {
        if let Some(s) = self.shards.get_mut(shard) {
            s.position = Position::After(sequence.to_string());
        }
    }

    /// The shard is closed and was read to its end (or is gone from the stream).
    pub fn drained(&mut self, shard: &str) {
        if let Some(s) = self.shards.get_mut(shard) {
            s.position = Position::Drained;
        }
    }

    /// A bounded source has read every record of `shard` up to its stop time.
    pub fn reached_bound(&mut self, shard: &str) {
        if let Some(s) = self.shards.get_mut(shard) {
            s.at_bound = true;
        }
    }

    /// The offsets: every shard's position, and the stop time of a bounded source.
    pub fn offsets(&self) -> Offsets {
        let mut out: Offsets = self
            .shards
            .iter()
            .map(|(id, s)| (id.clone(), s.position.to_offset()))
            .collect();
        if let Some(ms) = self.stop_at {
            out.insert(STOP_AT_KEY.to_string(), ms.to_string());
        }
        out
    }
}

fn bad_offset(key: &str, value: &str) -> Error {
    Error::Internal(format!(
        "Kinesis offset '{value}' of {key} is none of: a sequence number, '{TRIM_HORIZON}', \
         '{AT_TIMESTAMP}<ms>', '{DRAINED}'"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(id: &str, parents: &[&str], closed: bool) -> ListedShard {
        ListedShard {
            id: id.to_string(),
            parents: parents.iter().map(|p| p.to_string()).collect(),
            closed,
        }
    }

    /// 0 split into 1 and 2; 1 and 2 merged into 3.
    fn split_then_merge() -> Vec<ListedShard> {
        vec![
            shard("s0", &[], true),
            shard("s1", &["s0"], true),
            shard("s2", &["s0"], true),
            shard("s3", &["s1", "s2"], false),
        ]
    }

    #[test]
    fn parents_are_read_before_children() {
        let mut t = ShardTracker::new();
        t.merge_listing(&split_then_merge(), &Position::TrimHorizon);
        assert_eq!(t.readable(), vec!["s0"]);
        t.consumed("s0", "100");
        assert_eq!(t.readable(), vec!["s0"], "s0 is not drained yet");
        t.drained("s0");
        assert_eq!(t.readable(), vec!["s1", "s2"]);
        t.drained("s1");
        assert_eq!(t.readable(), vec!["s2"], "a merge waits for both parents");
        t.drained("s2");
        assert_eq!(t.readable(), vec!["s3"]);
    }

    #[test]
    fn offsets_round_trip_and_keep_the_order() {
        let mut t = ShardTracker::new();
        t.merge_listing(&split_then_merge(), &Position::AtTimestamp(5));
        t.drained("s0");
        t.consumed(
            "s1",
            "49590338271490256608559692538361571095921575989136588898",
        );
        t.set_stop_at_once(77);
        let offsets = t.offsets();
        assert_eq!(offsets["s2"], "at-timestamp:5");
        assert_eq!(offsets["s0"], "drained");
        assert_eq!(offsets[STOP_AT_KEY], "77");

        let mut again = ShardTracker::restore(&offsets).unwrap();
        assert_eq!(again.offsets(), offsets);
        assert_eq!(again.stop_at(), Some(77));
        again.set_stop_at_once(99);
        assert_eq!(again.stop_at(), Some(77), "a restored stop time is kept");
        // Relations come from the next listing; a restored tracker starts new shards at
        // the trim horizon, not at the startup position.
        again.merge_listing(
            &[split_then_merge(), vec![shard("s4", &["s3"], false)]].concat(),
            &Position::AtTimestamp(1),
        );
        assert_eq!(again.readable(), vec!["s1", "s2"]);
        assert_eq!(
            again.position("s1"),
            Some(&Position::After(
                "49590338271490256608559692538361571095921575989136588898".into()
            ))
        );
        assert_eq!(again.position("s4"), Some(&Position::TrimHorizon));
    }

    #[test]
    fn bad_offsets_are_refused() {
        for value in ["", "12a", "at-timestamp:x", "latest"] {
            let offsets = Offsets::from([("s0".to_string(), value.to_string())]);
            assert!(ShardTracker::restore(&offsets).is_err(), "{value:?}");
        }
    }

    #[test]
    fn shards_found_later_are_read_from_their_start() {
        let mut t = ShardTracker::new();
        t.merge_listing(&[shard("s0", &[], false)], &Position::AtTimestamp(9));
        assert_eq!(t.position("s0"), Some(&Position::AtTimestamp(9)));
        t.merge_listing(
            &[
                shard("s0", &[], true),
                shard("s1", &["s0"], false),
                shard("s2", &["s0"], false),
            ],
            &Position::AtTimestamp(9),
        );
        assert!(t.is_closed("s0"));
        assert_eq!(t.position("s1"), Some(&Position::TrimHorizon));
        assert_eq!(t.readable(), vec!["s0"]);
    }

    #[test]
    fn drained_shards_that_expired_are_forgotten_others_kept() {
        let mut t = ShardTracker::new();
        t.merge_listing(&split_then_merge(), &Position::TrimHorizon);
        t.drained("s0");
        t.consumed("s1", "5");
        // s0 and s1 expired from the stream.
        t.merge_listing(&split_then_merge()[2..], &Position::TrimHorizon);
        let offsets = t.offsets();
        assert!(!offsets.contains_key("s0"), "{offsets:?}");
        assert_eq!(offsets["s1"], "5", "an undrained position is never dropped");
        assert!(!t.is_listed("s1") && t.is_listed("s2"));
        // s3 waits for s1, which is still known and not drained.
        t.drained("s2");
        assert_eq!(t.readable(), vec!["s1"]);
    }

    #[test]
    fn a_bounded_source_finishes_when_every_shard_is_at_its_bound() {
        let mut t = ShardTracker::new();
        assert!(!t.finished(), "nothing listed yet");
        t.merge_listing(&split_then_merge(), &Position::TrimHorizon);
        assert!(!t.finished());
        t.drained("s0");
        t.reached_bound("s1");
        assert!(!t.finished(), "s2 is still to read");
        assert_eq!(t.readable(), vec!["s2"]);
        t.drained("s2");
        // s3 is below s1, which was at its bound: s3's records all came after it.
        assert!(t.finished());
        assert!(t.readable().is_empty());
    }

    #[test]
    fn a_cycle_in_a_listing_does_not_hang() {
        let mut t = ShardTracker::new();
        t.merge_listing(
            &[shard("a", &["b"], false), shard("b", &["a"], false)],
            &Position::TrimHorizon,
        );
        assert!(t.readable().is_empty());
        assert!(!t.finished());
    }
}
