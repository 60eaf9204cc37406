//! A Kafka source's positions in a checkpoint: `"<topic>:<partition>"` -> the next offset
//! to read, as decimal text (the form every connector's offsets take).

use std::collections::BTreeMap;

use crate::connector::Offsets;
use crate::error::{Error, Result};

/// A partition of a topic.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicPartition {
    pub topic: String,
    pub partition: i32,
}

impl TopicPartition {
    pub fn new(topic: impl Into<String>, partition: i32) -> Self {
        Self {
            topic: topic.into(),
            partition,
        }
    }

    /// Parse the offsets key `"<topic>:<partition>"` (topic names cannot hold ':').
    pub fn parse(key: &str) -> Option<Self> {
        let (topic, partition) = key.rsplit_once(':')?;
        let partition = partition.parse().ok().filter(|p: &i32| *p >= 0)?;
        (!topic.is_empty()).then(|| Self::new(topic, partition))
    }
}

impl std::fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.topic, self.partition)
    }
}

/// Parse checkpointed offsets: `"<topic>:<partition>"` -> next offset.
pub fn parse_offsets(offsets: &Offsets) -> Result<BTreeMap<TopicPartition, i64>> {
    offsets
        .iter()
        .map(|(k, v)| {
            let tp = TopicPartition::parse(k).ok_or_else(|| {
                Error::Internal(format!(
                    "checkpointed Kafka position '{k}' is not '<topic>:<partition>'"
                ))
            })?;
            let offset = v.parse::<i64>().ok().filter(|o| *o >= 0).ok_or_else(|| {
                Error::Internal(format!("checkpointed offset '{v}' of {k} is not an offset"))
            })?;
            Ok((tp, offset))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_round_trip() {
        let tp = TopicPartition::new("orders.v1-x", 12);
        assert_eq!(tp.to_string(), "orders.v1-x:12");
        assert_eq!(TopicPartition::parse(&tp.to_string()), Some(tp.clone()));
        let offsets: Offsets = [
            (tp.to_string(), "42".to_string()),
            ("b:0".to_string(), "0".to_string()),
        ]
        .into();
        let parsed = parse_offsets(&offsets).unwrap();
        assert_eq!(parsed[&tp], 42);
        assert_eq!(parsed[&TopicPartition::new("b", 0)], 0);
        for bad in ["nocolon", ":1", "t:-1", "t:x"] {
            assert_eq!(TopicPartition::parse(bad), None, "{bad}");
        }
        let bad: Offsets = [("t:0".to_string(), "-5".to_string())].into();
        assert!(parse_offsets(&bad).is_err());
    }
}
