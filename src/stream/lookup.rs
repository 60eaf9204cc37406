//! Lookup joins: a continuous query joining its stream with a table that is not a source (a
//! lake table: a dimension) reads the table as of processing time.
//!
//! ```text
//! planning:  each table read on the other side of a join from the stream
//!              -> a lookup table of the same name and schema (SlotTable::lookup)
//! each run:  a lookup older than lookup.refresh-interval reads its table again, whole,
//!              through the table's own provider (floe's lake provider: its current snapshot)
//!            the batch's plan joins the stream's rows with what the lookups hold
//! ```
//!
//! So a dimension another job or a user updates is seen within the interval, as with Flink's
//! lookup joins and their cache TTL. The table is held in memory whole.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use datafusion::common::TableReference;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::{provider_as_source, source_as_provider};
use datafusion::execution::session_state::SessionState;
use datafusion::logical_expr::{JoinType, LogicalPlan, TableScan};
use datafusion::physical_plan::collect;

use super::slot::{BatchSlot, SlotTable};
use crate::error::{Error, Result};

/// The tables a continuous query looks up, by name, and how often they are read again.
pub struct Lookups {
    tables: Mutex<BTreeMap<String, Arc<Lookup>>>,
    interval: Duration,
}

/// One looked-up table: its name, and what was last read of it.
struct Lookup {
    name: TableReference,
    slot: Arc<BatchSlot>,
    read_at: Mutex<Option<Instant>>,
}

impl Lookups {
    pub fn new(interval: Duration) -> Self {
        Self {
            tables: Mutex::default(),
            interval,
        }
    }

    /// `plan` with every table read on the far side of a join from the stream (the side
    /// that reads no source) read through its lookup.
    pub fn wrap(&self, plan: LogicalPlan) -> Result<LogicalPlan> {
        let out = plan.transform_up(|node| {
            let LogicalPlan::Join(mut join) = node else {
                return Ok(Transformed::no(node));
            };
            let (left, right) = (reads_source(&join.left), reads_source(&join.right));
            if left && !right {
                join.right = Arc::new(self.wrap_tables(join.right.as_ref().clone())?);
            } else if right && !left {
                join.left = Arc::new(self.wrap_tables(join.left.as_ref().clone())?);
            }
            Ok(Transformed::yes(LogicalPlan::Join(join)))
        })?;
        Ok(out.data)
    }

    /// `plan` (reading no source) with each table it scans read through its lookup.
    fn wrap_tables(&self, plan: LogicalPlan) -> datafusion::error::Result<LogicalPlan> {
        Ok(plan
            .transform_up(|node| {
                let LogicalPlan::TableScan(scan) = node else {
                    return Ok(Transformed::no(node));
                };
                let inner = source_as_provider(&scan.source)?;
                if inner.as_any().downcast_ref::<SlotTable>().is_some() {
                    return Ok(Transformed::no(LogicalPlan::TableScan(scan)));
                }
                let slot = self.lookup(&scan.table_name);
                let table = SlotTable::lookup(inner.schema(), slot, scan.table_name.to_string());
                Ok(Transformed::yes(LogicalPlan::TableScan(TableScan {
                    source: provider_as_source(Arc::new(table)),
                    ..scan
                })))
            })?
            .data)
    }

    fn lookup(&self, name: &TableReference) -> Arc<BatchSlot> {
        let Ok(mut tables) = self.tables.lock() else {
            return Arc::default();
        };
        tables
            .entry(name.to_string())
            .or_insert_with(|| {
                Arc::new(Lookup {
                    name: name.clone(),
                    slot: Arc::default(),
                    read_at: Mutex::default(),
                })
            })
            .slot
            .clone()
    }

    /// Read again every table last read longer than the interval ago (or never).
    pub async fn refresh(&self, state: &SessionState) -> Result<()> {
        let stale: Vec<(String, Arc<Lookup>)> = match self.tables.lock() {
            Ok(t) => t
                .iter()
                .filter(|(_, l)| {
                    l.read_at
                        .lock()
                        .map(|at| at.is_none_or(|at| at.elapsed() >= self.interval))
                        .unwrap_or(true)
                })
                .map(|(n, l)| (n.clone(), l.clone()))
                .collect(),
            Err(_) => Vec::new(),
        };
        for (name, lookup) in stale {
            // The table as it is now: its provider is looked up again (a lake table's holds
            // the snapshot it was loaded at).
            let defaults = &state.config_options().catalog;
            let table = lookup
                .name
                .clone()
                .resolve(&defaults.default_catalog, &defaults.default_schema);
            let provider = state
                .catalog_list()
                .catalog(&table.catalog)
                .and_then(|c| c.schema(&table.schema));
            let provider = match provider {
                Some(schema) => schema.table(&table.table).await?,
                None => None,
            }
            .ok_or_else(|| Error::Plan(format!("lookup table {name} no longer exists")))?;
            let plan = provider.scan(state, None, &[], None).await?;
            let batches = collect(plan, state.task_ctx()).await.map_err(|e| {
                match Error::from_execution(e) {
                    e if e.is_retryable() => e,
                    e => Error::Plan(format!("reading lookup table {name}: {e}")),
                }
            })?;
            lookup.slot.set_all(batches);
            if let Ok(mut at) = lookup.read_at.lock() {
                *at = Some(Instant::now());
            }
        }
        Ok(())
    }

    /// The tables looked up, by name.
    pub fn names(&self) -> Vec<String> {
        self.tables
            .lock()
            .map(|t| t.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// How often a table is read again.
    pub fn interval(&self) -> Duration {
        self.interval
    }
}

/// Whether `plan` reads a source's batches.
pub fn reads_source(plan: &LogicalPlan) -> bool {
    let mut found = false;
    let _ = plan.apply(|node| {
        if let LogicalPlan::TableScan(scan) = node
            && source_as_provider(&scan.source).is_ok_and(|p| {
                p.as_any()
                    .downcast_ref::<SlotTable>()
                    .is_some_and(|t| !t.is_lookup())
            })
        {
            found = true;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

/// Why a join cannot run per batch, if it cannot: an outer join between streams (its rows
/// would need taking back), or a join keeping the rows of the looked-up side that match
/// nothing (those would need the whole stream).
pub fn unsupported_join(join: &datafusion::logical_expr::Join) -> Option<String> {
    let (left, right) = (reads_source(&join.left), reads_source(&join.right));
    if left && right {
        return (join.join_type != JoinType::Inner).then(|| {
            format!(
                "a {} join between two streams would have to take back rows it emitted \
                 (retractions); join streams with an inner join, or join a stream with a lake \
                 table",
                join.join_type
            )
        });
    }
    let stream_kept = match join.join_type {
        JoinType::Inner => true,
        JoinType::Left | JoinType::LeftSemi | JoinType::LeftAnti | JoinType::LeftMark => {
            left || !right
        }
        JoinType::Right | JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark => {
            right || !left
        }
        JoinType::Full => !left && !right,
    };
    (!stream_kept).then(|| {
        format!(
            "a {} join keeps the looked-up table's unmatched rows, which needs the whole \
             stream; join the source on the preserved side (LEFT JOIN with the source first, \
             or an inner join)",
            join.join_type
        )
    })
}
