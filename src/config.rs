//! floe's session settings, kept in DataFusion's config system under the prefix `floe`.
//!
//! ```sql
//! SET 'floe.checkpoint.interval' = '10s';
//! SET 'checkpoint.interval' = '10s';      -- Flink style: keys without a prefix are floe's
//! SHOW floe.checkpoint.interval;
//! SHOW ALL;                               -- DataFusion's settings and floe's
//! ```
//!
//! The doc comment on each field is its reference documentation (`SHOW ALL VERBOSE`).

use std::any::Any;
use std::collections::BTreeMap;
use std::time::Duration;

use datafusion::common::config::{ConfigEntry, ConfigExtension, ExtensionOptions};
use datafusion::error::{DataFusionError, Result as DFResult};

use crate::lake::maintenance::policy::{MaintenancePolicy, PREFIX as MAINTENANCE_PREFIX};
use crate::sql::options::{parse_duration, parse_size};

/// Settings of continuous jobs, read when a job starts.
#[derive(Debug, Clone, PartialEq)]
pub struct FloeOptions {
    /// `pipeline.name`: the name of the next continuous job; a job restarted under the same
    /// name resumes from its last checkpoint. Default: derived from the statement.
    pub pipeline_name: Option<String>,
    /// `checkpoint.interval`: how often a continuous job checkpoints and commits.
    pub checkpoint_interval: Duration,
    /// `state.dir`: the folder where continuous jobs keep their checkpoint records.
    pub state_dir: String,
    /// `table.dml-sync`: a continuous INSERT waits until its job ends (bounded sources, or
    /// Ctrl-C) instead of returning at once.
    pub dml_sync: bool,
    /// `maintenance.*`: how the next continuous jobs maintain the tables they write (see
    /// `lake::maintenance::policy`), with their prefix.
    pub maintenance: BTreeMap<String, String>,
    /// `window.allowed-lateness`: how long after its end a window waits for late records
    /// before it is emitted; records later than that are dead letters.
    pub allowed_lateness: Duration,
    /// `source.idle-timeout`: a source without records for this long no longer holds the
    /// job's watermark back (none: a source holds it until it ends).
    pub idle_timeout: Option<Duration>,
    /// `lookup.refresh-interval`: how often a continuous job reads again a table it joins
    /// its stream with (a lookup join).
    pub lookup_refresh: Duration,
    /// `state.memory-budget`: the bytes of aggregate state (open windows', or the groups' of
    /// an aggregate without windows) a continuous job holds in memory; beyond it the state
    /// goes to local disk (`state.dir`).
    pub state_memory: u64,
    /// `state.lake-copy`: a job copies its checkpoint record (and a stateful job its state) at
    /// each checkpoint with the tables it writes (named by the checkpoint's commits), so that
    /// a lost `state.dir` loses nothing.
    pub state_lake_copy: bool,
    /// `parallelism.default`: the cores a continuous job decodes its records and writes its
    /// files on at once (none: every core the process may use). `1` runs the job on one
    /// thread.
    pub parallelism: Option<usize>,
}

impl Default for FloeOptions {
    fn default() -> Self {
        Self {
            pipeline_name: None,
            checkpoint_interval: Duration::from_secs(10),
            state_dir: ".floe".to_string(),
            dml_sync: false,
            maintenance: BTreeMap::new(),
            allowed_lateness: Duration::ZERO,
            idle_timeout: None,
            lookup_refresh: Duration::from_secs(60),
            state_memory: 256 << 20,
            state_lake_copy: true,
            parallelism: None,
        }
    }
}

const PIPELINE_NAME: &str = "pipeline.name";
const CHECKPOINT_INTERVAL: &str = "checkpoint.interval";
const STATE_DIR: &str = "state.dir";
const DML_SYNC: &str = "table.dml-sync";
const ALLOWED_LATENESS: &str = "window.allowed-lateness";
const IDLE_TIMEOUT: &str = "source.idle-timeout";
const LOOKUP_REFRESH: &str = "lookup.refresh-interval";
const STATE_MEMORY: &str = "state.memory-budget";
const STATE_LAKE_COPY: &str = "state.lake-copy";
const PARALLELISM: &str = "parallelism.default";

/// A `true`/`false` setting's value.
fn parse_bool(key: &str, value: &str) -> DFResult<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(DataFusionError::Configuration(format!(
            "floe.{key} must be 'true' or 'false', got '{value}'"
        ))),
    }
}

fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// A size in bytes as settings show it (`64mb`).
pub fn format_size(bytes: u64) -> String {
    match bytes {
        b if b % (1 << 30) == 0 && b > 0 => format!("{}gb", b >> 30),
        b if b % (1 << 20) == 0 && b > 0 => format!("{}mb", b >> 20),
        b if b % (1 << 10) == 0 && b > 0 => format!("{}kb", b >> 10),
        b => format!("{b}"),
    }
}

impl ExtensionOptions for FloeOptions {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn cloned(&self) -> Box<dyn ExtensionOptions> {
        Box::new(self.clone())
    }

    fn set(&mut self, key: &str, value: &str) -> DFResult<()> {
        match key {
            PIPELINE_NAME => {
                let v = value.trim();
                self.pipeline_name = (!v.is_empty()).then(|| v.to_string());
            }
            CHECKPOINT_INTERVAL => {
                let d = parse_duration(value).map_err(|e| {
                    DataFusionError::Configuration(format!("floe.{CHECKPOINT_INTERVAL}: {e}"))
                })?;
                if d < Duration::from_millis(10) {
                    return Err(DataFusionError::Configuration(format!(
                        "floe.{CHECKPOINT_INTERVAL} must be at least 10ms, got '{value}'"
                    )));
                }
                self.checkpoint_interval = d;
            }
            STATE_DIR => {
                if value.trim().is_empty() {
                    return Err(DataFusionError::Configuration(format!(
                        "floe.{STATE_DIR} cannot be empty"
                    )));
                }
                self.state_dir = value.to_string();
            }
            DML_SYNC => self.dml_sync = parse_bool(DML_SYNC, value)?,
            STATE_LAKE_COPY => self.state_lake_copy = parse_bool(STATE_LAKE_COPY, value)?,
            ALLOWED_LATENESS => {
                self.allowed_lateness = parse_duration(value).map_err(|e| {
                    DataFusionError::Configuration(format!("floe.{ALLOWED_LATENESS}: {e}"))
                })?;
            }
            LOOKUP_REFRESH => {
                self.lookup_refresh = parse_duration(value).map_err(|e| {
                    DataFusionError::Configuration(format!("floe.{LOOKUP_REFRESH}: {e}"))
                })?;
            }
            STATE_MEMORY => {
                self.state_memory = parse_size(value).map_err(|e| {
                    DataFusionError::Configuration(format!("floe.{STATE_MEMORY}: {e}"))
                })?;
            }
            IDLE_TIMEOUT => {
                self.idle_timeout = match value.trim() {
                    "" | "0" | "none" => None,
                    v => Some(parse_duration(v).map_err(|e| {
                        DataFusionError::Configuration(format!("floe.{IDLE_TIMEOUT}: {e}"))
                    })?),
                };
            }
            PARALLELISM => {
                self.parallelism = match value.trim() {
                    "" | "default" => None,
                    v => match v.parse::<usize>() {
                        Ok(n) if n > 0 => Some(n),
                        _ => {
                            return Err(DataFusionError::Configuration(format!(
                                "floe.{PARALLELISM} must be a positive number of cores (or \
                                 'default': every core), got '{value}'"
                            )));
                        }
                    },
                };
            }
            other if other.starts_with(MAINTENANCE_PREFIX) => {
                let mut next = self.maintenance.clone();
                next.insert(other.to_string(), value.to_string());
                MaintenancePolicy::from_map(&next)
                    .map_err(|e| DataFusionError::Configuration(format!("floe.{other}: {e}")))?;
                self.maintenance = next;
            }
            other => {
                return Err(DataFusionError::Configuration(format!(
                    "unknown setting 'floe.{other}'; floe's settings are floe.{PIPELINE_NAME}, \
                     floe.{CHECKPOINT_INTERVAL}, floe.{STATE_DIR}, floe.{DML_SYNC}, \
                     floe.{ALLOWED_LATENESS}, floe.{IDLE_TIMEOUT}, floe.{LOOKUP_REFRESH}, \
                     floe.{STATE_MEMORY}, floe.{STATE_LAKE_COPY}, floe.{PARALLELISM} and \
                     floe.{MAINTENANCE_PREFIX}*"
                )));
            }
        }
        Ok(())
    }

    fn entries(&self) -> Vec<ConfigEntry> {
        let entry = |key: &str, value: Option<String>, description: &'static str| ConfigEntry {
            key: format!("floe.{key}"),
            value,
            description,
        };
        vec![
            entry(
                PIPELINE_NAME,
                self.pipeline_name.clone(),
                "Name of the next continuous job; a job restarted under the same name resumes \
                 from its last checkpoint.",
            ),
            entry(
                CHECKPOINT_INTERVAL,
                Some(format_duration(self.checkpoint_interval)),
                "How often a continuous job checkpoints and commits.",
            ),
            entry(
                STATE_DIR,
                Some(self.state_dir.clone()),
                "Folder where continuous jobs keep their checkpoint records.",
            ),
            entry(
                DML_SYNC,
                Some(self.dml_sync.to_string()),
                "Whether a continuous INSERT waits until its job ends.",
            ),
            entry(
                ALLOWED_LATENESS,
                Some(format_duration(self.allowed_lateness)),
                "How long after its end a window waits for late records.",
            ),
            entry(
                LOOKUP_REFRESH,
                Some(format_duration(self.lookup_refresh)),
                "How often a continuous job reads again a table it looks up.",
            ),
            entry(
                STATE_MEMORY,
                Some(format_size(self.state_memory)),
                "Bytes of open windows' state a continuous job holds in memory; beyond them, \
                 on local disk.",
            ),
            entry(
                STATE_LAKE_COPY,
                Some(self.state_lake_copy.to_string()),
                "Whether a job copies its checkpoint record and state with its tables at each \
                 checkpoint, so that a lost state.dir loses nothing.",
            ),
            entry(
                PARALLELISM,
                self.parallelism.map(|n| n.to_string()),
                "Cores a continuous job decodes and writes on at once (unset: every core).",
            ),
            entry(
                IDLE_TIMEOUT,
                self.idle_timeout.map(format_duration),
                "How long a source may send nothing before it no longer holds the watermark \
                 back.",
            ),
        ]
        .into_iter()
        .chain(self.maintenance.iter().map(|(k, v)| {
            entry(
                k,
                Some(v.clone()),
                "How continuous jobs maintain the tables they write.",
            )
        }))
        .collect()
    }
}

impl ConfigExtension for FloeOptions {
    const PREFIX: &'static str = "floe";
}

/// The full name of a setting: keys under no known prefix are floe's, as in Flink SQL
/// (`checkpoint.interval` is `floe.checkpoint.interval`).
pub fn qualify_setting(key: &str) -> String {
    let lower = key.to_ascii_lowercase();
    if lower.starts_with("datafusion.") || lower.starts_with("floe.") {
        key.to_string()
    } else {
        format!("floe.{key}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_show() {
        let mut o = FloeOptions::default();
        o.set(CHECKPOINT_INTERVAL, "500ms").unwrap();
        o.set(PIPELINE_NAME, "orders").unwrap();
        assert_eq!(o.checkpoint_interval, Duration::from_millis(500));
        let shown: Vec<(String, Option<String>)> =
            o.entries().into_iter().map(|e| (e.key, e.value)).collect();
        assert!(shown.contains(&("floe.checkpoint.interval".into(), Some("500ms".into()))));
        assert!(shown.contains(&("floe.pipeline.name".into(), Some("orders".into()))));
        assert!(o.set(CHECKPOINT_INTERVAL, "soon").is_err());
        o.set(PARALLELISM, "3").unwrap();
        assert_eq!(o.parallelism, Some(3));
        for bad in ["0", "-1", "all"] {
            let e = o.set(PARALLELISM, bad).unwrap_err().to_string();
            assert!(e.contains("positive number of cores"), "{e}");
        }
        assert_eq!(o.parallelism, Some(3));
        o.set(PARALLELISM, "default").unwrap();
        assert_eq!(o.parallelism, None);
        assert!(
            o.set("nope", "1")
                .unwrap_err()
                .to_string()
                .contains("floe.nope")
        );
    }

    #[test]
    fn keys_without_a_prefix_are_floes() {
        assert_eq!(
            qualify_setting("checkpoint.interval"),
            "floe.checkpoint.interval"
        );
        assert_eq!(qualify_setting("floe.state.dir"), "floe.state.dir");
        assert_eq!(
            qualify_setting("datafusion.execution.batch_size"),
            "datafusion.execution.batch_size"
        );
    }
}
