//! How a running job maintains the tables it writes: its `maintenance.*` options.
//!
//! ```sql
//! SET 'maintenance.compaction' = 'on';                 -- or in a routed INSERT's WITH (...)
//! SET 'maintenance.target-file-size' = '128mb';        -- files are packed to about this
//! SET 'maintenance.min-input-files' = '5';             -- a partition's small files, at least
//! SET 'maintenance.small-file-age' = '1h';             -- ...or two, one of them this old
//! SET 'maintenance.snapshot-retention' = '1h';         -- expire snapshots older than this...
//! SET 'maintenance.min-snapshots' = '10';              -- ...beyond the newest 10
//! SET 'maintenance.manifest-rewrite' = 'on';           -- merge manifests beyond max-manifests
//! SET 'maintenance.max-manifests' = '50';
//! SET 'maintenance.interval' = '1m';                   -- how often tables are looked at
//! SET 'maintenance.cpu' = '0.25';                      -- share of one core, at most
//! SET 'maintenance.memory' = '256mb';                  -- memory a run holds, at most
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::sql::Options;

/// The prefix of every maintenance option.
pub const PREFIX: &str = "maintenance.";

/// What a job's maintenance does, and within which budget.
#[derive(Debug, Clone, PartialEq)]
pub struct MaintenancePolicy {
    pub compaction: bool,
    pub target_file_size: u64,
    pub min_input_files: usize,
    /// A partition's small files (two or more) are compacted once one is this old, however
    /// few.
    pub small_file_age: Duration,
    /// Snapshots older than this expire (none do when `None`).
    pub snapshot_retention: Option<Duration>,
    pub min_snapshots: usize,
    pub manifest_rewrite: bool,
    pub max_manifests: usize,
    pub interval: Duration,
    /// The share of one core maintenance works, at most: after each piece of work it rests
    /// so long that work is at most this fraction of the time.
    pub cpu: f64,
    pub memory: usize,
}

impl Default for MaintenancePolicy {
    fn default() -> Self {
        Self {
            compaction: false,
            target_file_size: 128 << 20,
            min_input_files: 5,
            small_file_age: Duration::from_secs(3600),
            snapshot_retention: None,
            min_snapshots: 10,
            manifest_rewrite: false,
            max_manifests: 50,
            interval: Duration::from_secs(60),
            cpu: 0.25,
            memory: 256 << 20,
        }
    }
}

impl MaintenancePolicy {
    /// The policy `options` (keys with their `maintenance.` prefix) give; `None` when they
    /// turn nothing on. Unknown `maintenance.*` keys are errors.
    pub fn from_map(options: &BTreeMap<String, String>) -> Result<Option<Self>> {
        let mut o = Options::try_new(
            "the maintenance options",
            options
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<Vec<_>>(),
        )?;
        let defaults = Self::default();
        let on = |o: &mut Options, key: &str| -> Result<Option<bool>> {
            Ok(o.take_choice(&format!("{PREFIX}{key}"), &["on", "off"])?
                .map(|c| c == "on"))
        };
        let count = |o: &mut Options, key: &str, default: usize| -> Result<usize> {
            Ok(o.take_positive(&format!("{PREFIX}{key}"))?
                .map_or(default, |n| usize::try_from(n).unwrap_or(usize::MAX)))
        };
        let compaction = on(&mut o, "compaction")?.unwrap_or(false);
        let policy = Self {
            compaction,
            target_file_size: o
                .take_positive_size(&format!("{PREFIX}target-file-size"))?
                .map_or(defaults.target_file_size, |n| n as u64),
            min_input_files: count(&mut o, "min-input-files", defaults.min_input_files)?,
            small_file_age: o
                .take_duration(&format!("{PREFIX}small-file-age"))?
                .unwrap_or(defaults.small_file_age),
            snapshot_retention: o.take_duration(&format!("{PREFIX}snapshot-retention"))?,
            min_snapshots: count(&mut o, "min-snapshots", defaults.min_snapshots)?,
            manifest_rewrite: on(&mut o, "manifest-rewrite")?.unwrap_or(compaction),
            max_manifests: count(&mut o, "max-manifests", defaults.max_manifests)?,
            interval: o
                .take_duration(&format!("{PREFIX}interval"))?
                .unwrap_or(defaults.interval),
            cpu: match o.take_str(&format!("{PREFIX}cpu")) {
                None => defaults.cpu,
                Some(v) => match v.trim().parse::<f64>() {
                    Ok(f) if f > 0.0 && f <= 1.0 => f,
                    _ => {
                        return Err(Error::Option(format!(
                            "'{PREFIX}cpu' is a share of one core, above 0 and at most 1, \
                             got '{v}'"
                        )));
                    }
                },
            },
            memory: o
                .take_positive_size(&format!("{PREFIX}memory"))?
                .unwrap_or(defaults.memory),
        };
        o.finish()?;
        let any =
            policy.compaction || policy.snapshot_retention.is_some() || policy.manifest_rewrite;
        Ok(any.then_some(policy))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(pairs: &[(&str, &str)]) -> Result<Option<MaintenancePolicy>> {
        MaintenancePolicy::from_map(
            &pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn options_turn_maintenance_on_and_bad_ones_are_named() {
        assert_eq!(policy(&[]).unwrap(), None);
        let p = policy(&[
            ("maintenance.compaction", "on"),
            ("maintenance.target-file-size", "64mb"),
            ("maintenance.snapshot-retention", "1h"),
            ("maintenance.cpu", "0.5"),
        ])
        .unwrap()
        .unwrap();
        assert!(p.compaction && p.manifest_rewrite);
        assert_eq!(p.target_file_size, 64 << 20);
        assert_eq!(p.snapshot_retention, Some(Duration::from_secs(3600)));
        assert_eq!(p.cpu, 0.5);
        let e = policy(&[("maintenance.compactoin", "on")]).unwrap_err();
        assert!(e.to_string().contains("maintenance.compactoin"), "{e}");
        let e = policy(&[("maintenance.cpu", "2")]).unwrap_err();
        assert!(e.to_string().contains("share of one core"), "{e}");
    }
}
