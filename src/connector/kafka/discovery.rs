//! Which partitions a Kafka source reads and where each starts.
//!
//! These are blocking librdkafka calls (metadata, list offsets, committed offsets), so the
//! reader runs [`discover`] on tokio's blocking pool and keeps polling meanwhile. What to
//! do with a listing (which partitions are new) is the pure [`new_partitions`], tested
//! without a broker.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use super::context::ReaderContext;
use super::{KafkaOptions, StartupMode, TopicPartition, Topics};

/// Where a partition starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Its oldest record. Not a number: a partition that no record was read from yet is
    /// left out of the offsets, and a resumed job reads such a partition from its oldest
    /// record again, which is the same place.
    Earliest,
    /// This offset.
    At(i64),
}

/// What one discovery asks.
#[derive(Debug, Clone)]
pub struct Request {
    /// Partitions the reader has already.
    pub known: BTreeSet<TopicPartition>,
    /// Positions from a checkpoint.
    pub resume: BTreeMap<TopicPartition, i64>,
    /// Where partitions that are neither known nor resumed start.
    pub mode: StartupMode,
}

/// What one discovery found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Discovered {
    /// Partitions the reader did not have, with where each starts.
    pub new: Vec<(TopicPartition, Start)>,
    /// Named topics the broker does not have (or the pattern, when nothing matches it).
    pub missing: Vec<String>,
}

/// The partitions of a listing that are not `known`, with where each starts: a resumed
/// partition at its checkpointed offset, the others by `mode` (resolved later).
pub fn new_partitions(
    listed: &[TopicPartition],
    request: &Request,
) -> (Vec<(TopicPartition, Start)>, Vec<TopicPartition>) {
    let mut resumed = Vec::new();
    let mut to_resolve = Vec::new();
    for tp in listed.iter().filter(|tp| !request.known.contains(tp)) {
        match request.resume.get(tp) {
            Some(&offset) => resumed.push((tp.clone(), Start::At(offset))),
            None => to_resolve.push(tp.clone()),
        }
    }
    (resumed, to_resolve)
}

/// List the partitions of the source's topics and decide where the new ones start.
/// An `Err` means the broker could not be asked (the reader retries).
pub fn discover(
    consumer: &BaseConsumer<ReaderContext>,
    options: &KafkaOptions,
    request: &Request,
    timeout: Duration,
) -> Result<Discovered, String> {
    let (listed, missing) = list(consumer, &options.topics, timeout)?;
    let (mut new, to_resolve) = new_partitions(&listed, request);
    new.extend(resolve(
        consumer,
        options,
        request.mode,
        to_resolve,
        timeout,
    )?);
    new.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Discovered { new, missing })
}

/// The partitions of the topics, and the topics that do not exist.
fn list(
    consumer: &BaseConsumer<ReaderContext>,
    topics: &Topics,
    timeout: Duration,
) -> Result<(Vec<TopicPartition>, Vec<String>), String> {
    let mut listed = Vec::new();
    let mut missing = Vec::new();
    match topics {
        Topics::List(names) => {
            for name in names {
                let md = consumer
                    .fetch_metadata(Some(name), timeout)
                    .map_err(|e| format!("cannot list the partitions of topic '{name}': {e}"))?;
                let topic = md.topics().iter().find(|t| t.name() == name);
                match topic {
                    Some(t) if t.error().is_none() && !t.partitions().is_empty() => listed.extend(
                        t.partitions()
                            .iter()
                            .map(|p| TopicPartition::new(name.clone(), p.id())),
                    ),
                    _ => missing.push(format!("topic '{name}'")),
                }
            }
        }
        Topics::Pattern(_) => {
            let md = consumer
                .fetch_metadata(None, timeout)
                .map_err(|e| format!("cannot list the topics: {e}"))?;
            for t in md.topics() {
                if t.error().is_none() && topics.matches(t.name()) {
                    listed.extend(
                        t.partitions()
                            .iter()
                            .map(|p| TopicPartition::new(t.name(), p.id())),
                    );
                }
            }
            if listed.is_empty() {
                missing.push(format!("a topic matching {topics}"));
            }
        }
    }
    listed.sort();
    Ok((listed, missing))
}

/// Resolve `mode` to a start for each partition. Latest and timestamp positions come from
/// the broker's list-offsets answers (see the README for a broker that gets them wrong).
fn resolve(
    consumer: &BaseConsumer<ReaderContext>,
    options: &KafkaOptions,
    mode: StartupMode,
    partitions: Vec<TopicPartition>,
    timeout: Duration,
) -> Result<Vec<(TopicPartition, Start)>, String> {
    if partitions.is_empty() {
        return Ok(Vec::new());
    }
    let latest = |tp: &TopicPartition| -> Result<Start, String> {
        consumer
            .fetch_watermarks(&tp.topic, tp.partition, timeout)
            .map(|(_, high)| Start::At(high))
            .map_err(|e| format!("cannot read the end offset of {tp}: {e}"))
    };
    let mut out = Vec::with_capacity(partitions.len());
    match mode {
        StartupMode::Earliest => out.extend(partitions.into_iter().map(|tp| (tp, Start::Earliest))),
        StartupMode::Latest => {
            for tp in partitions {
                let start = latest(&tp)?;
                out.push((tp, start));
            }
        }
        StartupMode::Timestamp(millis) => {
            let mut tpl = TopicPartitionList::new();
            for tp in &partitions {
                tpl.add_partition_offset(&tp.topic, tp.partition, Offset::Offset(millis))
                    .map_err(|e| format!("offsets for time {millis}: {e}"))?;
            }
            let found = consumer
                .offsets_for_times(tpl, timeout)
                .map_err(|e| format!("cannot look up the offsets at time {millis}: {e}"))?;
            for tp in partitions {
                let start = match found
                    .find_partition(&tp.topic, tp.partition)
                    .map(|e| e.offset())
                {
                    Some(Offset::Offset(o)) => Start::At(o),
                    // No record at or after the time: start at the end.
                    _ => latest(&tp)?,
                };
                out.push((tp, start));
            }
        }
        StartupMode::GroupOffsets => {
            let mut tpl = TopicPartitionList::new();
            for tp in &partitions {
                tpl.add_partition(&tp.topic, tp.partition);
            }
            let committed = consumer
                .committed_offsets(tpl, timeout)
                .map_err(|e| format!("cannot read the group's committed offsets: {e}"))?;
            for tp in partitions {
                let start = match committed
                    .find_partition(&tp.topic, tp.partition)
                    .map(|e| e.offset())
                {
                    Some(Offset::Offset(o)) if o >= 0 => Start::At(o),
                    _ if options.reset_to_earliest() => Start::Earliest,
                    _ => latest(&tp)?,
                };
                out.push((tp, start));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(t: &str, p: i32) -> TopicPartition {
        TopicPartition::new(t, p)
    }

    #[test]
    fn only_unknown_partitions_are_new_and_resumed_ones_keep_their_offset() {
        let request = Request {
            known: [tp("a", 0), tp("a", 1)].into(),
            resume: [(tp("a", 2), 17), (tp("gone", 0), 5)].into(),
            mode: StartupMode::Latest,
        };
        // A partition added to topic a, and a new topic b.
        let listed = [tp("a", 0), tp("a", 1), tp("a", 2), tp("a", 3), tp("b", 0)];
        let (resumed, to_resolve) = new_partitions(&listed, &request);
        assert_eq!(resumed, vec![(tp("a", 2), Start::At(17))]);
        assert_eq!(to_resolve, vec![tp("a", 3), tp("b", 0)]);
        let (resumed, to_resolve) = new_partitions(&listed[..2], &request);
        assert!(resumed.is_empty() && to_resolve.is_empty());
    }
}
