//! `CALL catalog.system.<procedure>(...)`: table maintenance with the names and arguments
//! Spark's and Trino's users know, each returning a row of what it did.
//!
//! | procedure | arguments |
//! |---|---|
//! | `rewrite_data_files` | `table`, `target_file_size_bytes`, `min_input_files`, `where` |
//! | `expire_snapshots` | `table`, `older_than` (default 5 days ago), `retain_last` (1) |
//! | `rewrite_manifests` | `table` |
//! | `remove_orphan_files` | `table`, `older_than` (default 3 days ago), `dry_run` (false) |
//!
//! Arguments go by name (`table => 'ns.t'`) or in this order; values are SQL expressions
//! evaluated once (`TIMESTAMP '2026-11-30 00:00:00'`, `now() - INTERVAL '1' HOUR`). The work
//! itself is `lake::maintenance`'s.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::sql::sqlparser::ast::Expr;
use datafusion::sql::sqlparser::dialect::GenericDialect;
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::{NamespaceIdent, TableIdent};

use super::{Output, Session};
use crate::checkpoint::StateStore;
use crate::error::{Error, Result};
use crate::lake::maintenance::Maintained;
use crate::lake::maintenance::compact::{CompactOptions, rewrite_data_files};
use crate::lake::maintenance::expire::{ExpireOptions, expire_snapshots};
use crate::lake::maintenance::manifests::rewrite_manifests;
use crate::lake::maintenance::orphans::{OrphanOptions, remove_orphan_files};
use crate::sql::parser::name_parts;
use crate::sql::statement::Call;

/// The procedures and their parameters, in positional order.
const PROCEDURES: &[(&str, &[&str])] = &[
    (
        "rewrite_data_files",
        &[
            "table",
            "target_file_size_bytes",
            "min_input_files",
            "where",
        ],
    ),
    ("expire_snapshots", &["table", "older_than", "retain_last"]),
    ("rewrite_manifests", &["table"]),
    ("remove_orphan_files", &["table", "older_than", "dry_run"]),
];

/// Files younger than this are never orphans unless `older_than` says otherwise (Spark's
/// default): longer than any checkpoint or commit takes.
const DEFAULT_ORPHAN_AGE_MS: i64 = 3 * 24 * 3600 * 1000;

/// Snapshots younger than this are kept unless `older_than` says otherwise (Spark's
/// default).
const DEFAULT_RETENTION_MS: i64 = 5 * 24 * 3600 * 1000;

/// A `CALL`'s arguments by parameter name, as values.
struct Args {
    procedure: &'static str,
    values: BTreeMap<&'static str, ScalarValue>,
}

impl Args {
    fn string(&self, name: &str) -> Result<Option<String>> {
        match self.values.get(name) {
            None | Some(ScalarValue::Null) => Ok(None),
            Some(ScalarValue::Utf8(v) | ScalarValue::LargeUtf8(v) | ScalarValue::Utf8View(v)) => {
                Ok(v.clone())
            }
            Some(other) => Err(self.wrong(name, "a string", other)),
        }
    }

    fn required_string(&self, name: &str) -> Result<String> {
        self.string(name)?.ok_or_else(|| {
            Error::Plan(format!(
                "{} needs the argument '{name}' ({name} => '...')",
                self.procedure
            ))
        })
    }

    fn boolean(&self, name: &str) -> Result<Option<bool>> {
        match self.values.get(name) {
            None => Ok(None),
            Some(ScalarValue::Boolean(v)) => Ok(*v),
            Some(other) => Err(self.wrong(name, "true or false", other)),
        }
    }

    fn positive(&self, name: &str) -> Result<Option<u64>> {
        let Some(v) = self.values.get(name) else {
            return Ok(None);
        };
        match v.cast_to(&DataType::Int64).ok() {
            Some(ScalarValue::Int64(Some(n))) if n > 0 => Ok(Some(n as u64)),
            _ => Err(self.wrong(name, "a positive integer", v)),
        }
    }

    /// A timestamp argument as milliseconds since the epoch (a number is taken as such).
    fn time_ms(&self, name: &str) -> Result<Option<i64>> {
        let Some(v) = self.values.get(name) else {
            return Ok(None);
        };
        let ms = match v {
            ScalarValue::Int64(Some(n)) => Some(*n),
            _ => match v.cast_to(&DataType::Timestamp(TimeUnit::Millisecond, None)) {
                Ok(ScalarValue::TimestampMillisecond(Some(ms), _)) => Some(ms),
                _ => None,
            },
        };
        ms.map(Some)
            .ok_or_else(|| self.wrong(name, "a timestamp", v))
    }

    /// The `older_than` argument in ms since the epoch; by default, `default_age_ms` ago.
    fn older_than(&self, default_age_ms: i64) -> Result<i64> {
        Ok(self
            .time_ms("older_than")?
            .unwrap_or(chrono::Utc::now().timestamp_millis() - default_age_ms))
    }

    fn wrong(&self, name: &str, what: &str, value: &ScalarValue) -> Error {
        Error::Plan(format!(
            "{}: argument '{name}' must be {what}, not {value} ({})",
            self.procedure,
            value.data_type()
        ))
    }
}

impl Session {
    /// Run a `CALL`.
    pub(super) async fn call(&self, call: Call) -> Result<Output> {
        let parts = name_parts(&call.procedure)?;
        let (catalog, procedure) = match parts.as_slice() {
            [c, s, p] if s.eq_ignore_ascii_case("system") => (c.clone(), p.to_ascii_lowercase()),
            [s, p] if s.eq_ignore_ascii_case("system") => {
                (self.defaults().0, p.to_ascii_lowercase())
            }
            _ => {
                return Err(Error::Plan(format!(
                    "CALL {}: a procedure is named catalog.system.procedure",
                    call.procedure
                )));
            }
        };
        let Some(&(name, params)) = PROCEDURES.iter().find(|(n, _)| *n == procedure) else {
            return Err(Error::Plan(format!(
                "there is no procedure '{procedure}' (there are {})",
                PROCEDURES
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        };
        let args = self.bind(name, params, &call).await?;
        let table = self.maintained(&catalog, &args.required_string("table")?)?;
        match name {
            "rewrite_data_files" => {
                let filter = match args.string("where")? {
                    Some(w) => Some(self.filter(&table, &w).await?),
                    None => None,
                };
                let options = CompactOptions {
                    target_file_size: args.positive("target_file_size_bytes")?,
                    min_input_files: args.positive("min_input_files")?.unwrap_or(5) as usize,
                    filter,
                    ..CompactOptions::default()
                };
                let done = rewrite_data_files(&table, &options).await?;
                counts(&[
                    ("rewritten_data_files_count", done.rewritten_files),
                    ("added_data_files_count", done.added_files),
                    ("rewritten_bytes_count", done.rewritten_bytes),
                    ("added_bytes_count", done.added_bytes),
                    ("rewritten_partitions_count", done.groups),
                ])
            }
            "expire_snapshots" => {
                let options = ExpireOptions {
                    older_than_ms: args.older_than(DEFAULT_RETENTION_MS)?,
                    retain_last: args.positive("retain_last")?.unwrap_or(1) as usize,
                };
                let done = expire_snapshots(&table, &options).await?;
                counts(&[
                    ("expired_snapshots_count", done.snapshots),
                    ("deleted_data_files_count", done.data_files),
                    (
                        "deleted_position_delete_files_count",
                        done.position_delete_files,
                    ),
                    (
                        "deleted_equality_delete_files_count",
                        done.equality_delete_files,
                    ),
                    ("deleted_manifest_files_count", done.manifests),
                    ("deleted_manifest_lists_count", done.manifest_lists),
                ])
            }
            "rewrite_manifests" => {
                let done = rewrite_manifests(&table).await?;
                let rewritten = if done.snapshot_id.is_some() {
                    done.manifests_before
                } else {
                    0
                };
                let added = if done.snapshot_id.is_some() {
                    done.manifests_after
                } else {
                    0
                };
                counts(&[
                    ("rewritten_manifests_count", rewritten),
                    ("added_manifests_count", added),
                ])
            }
            "remove_orphan_files" => {
                let options = OrphanOptions {
                    older_than_ms: args.older_than(DEFAULT_ORPHAN_AGE_MS)?,
                    dry_run: args.boolean("dry_run")?.unwrap_or(false),
                };
                let keep = self.in_flight_files(&catalog, &table)?;
                let orphans = remove_orphan_files(&table, &options, &keep).await?;
                let schema = Arc::new(Schema::new(vec![Field::new(
                    "orphan_file_location",
                    DataType::Utf8,
                    false,
                )]));
                let batch = RecordBatch::try_new(
                    schema.clone(),
                    vec![Arc::new(StringArray::from(orphans)) as ArrayRef],
                )
                .map_err(|e| Error::Internal(format!("a procedure's result: {e}")))?;
                Ok(Output::Rows(schema, vec![batch]))
            }
            other => Err(Error::Internal(format!("procedure {other} has no body"))),
        }
    }

    /// `call`'s arguments matched to `params`, by name or place, and evaluated.
    async fn bind(
        &self,
        procedure: &'static str,
        params: &'static [&'static str],
        call: &Call,
    ) -> Result<Args> {
        let mut exprs: BTreeMap<&'static str, &Expr> = BTreeMap::new();
        for (i, arg) in call.args.iter().enumerate() {
            let param = match &arg.name {
                Some(n) => params.iter().find(|p| *p == n).ok_or_else(|| {
                    Error::Plan(format!(
                        "{procedure} has no argument '{n}' (it takes {})",
                        params.join(", ")
                    ))
                })?,
                None => params.get(i).ok_or_else(|| {
                    Error::Plan(format!(
                        "{procedure} takes at most {} arguments ({})",
                        params.len(),
                        params.join(", ")
                    ))
                })?,
            };
            if exprs.insert(param, &arg.value).is_some() {
                return Err(Error::Plan(format!(
                    "{procedure}: argument '{param}' is given twice"
                )));
            }
        }
        let mut values = BTreeMap::new();
        for (param, expr) in exprs {
            let df = self.ctx.sql(&format!("SELECT {expr}")).await.map_err(|e| {
                Error::Plan(format!("{procedure}: argument '{param}' ({expr}): {e}"))
            })?;
            let batches = df.collect().await?;
            let value = batches
                .first()
                .filter(|b| b.num_rows() == 1)
                .map(|b| ScalarValue::try_from_array(b.column(0), 0))
                .transpose()?
                .ok_or_else(|| {
                    Error::Plan(format!("{procedure}: argument '{param}' has no value"))
                })?;
            values.insert(param, value);
        }
        Ok(Args { procedure, values })
    }

    /// The table `name` (`ns.t`, or `catalog.ns.t` naming `catalog`) of catalog `catalog`,
    /// with floe's commit path to it.
    fn maintained(&self, catalog: &str, name: &str) -> Result<Maintained> {
        let parsed = datafusion::sql::sqlparser::parser::Parser::new(&GenericDialect)
            .try_with_sql(name)
            .and_then(|mut p| p.parse_object_name(false))
            .map_err(|e| Error::Plan(format!("table '{name}': {e}")))?;
        let parts = name_parts(&parsed)?;
        let (ns, table) = match parts.as_slice() {
            [t] => (self.defaults().1, t.clone()),
            [n, t] => (n.clone(), t.clone()),
            [c, n, t] if c == catalog => (n.clone(), t.clone()),
            _ => {
                return Err(Error::Plan(format!(
                    "table '{name}' is not a table of catalog {catalog}: write namespace.table"
                )));
            }
        };
        let iceberg = self.iceberg(catalog)?;
        let committer = self.committer(catalog).ok_or_else(|| {
            Error::Unsupported(format!(
                "maintenance procedures on catalog {catalog}: they commit through floe's own \
                 path, which sql, rest and glue catalogs have"
            ))
        })?;
        Ok(Maintained {
            catalog: iceberg,
            committer,
            ident: TableIdent::new(NamespaceIdent::new(ns), table),
        })
    }

    /// The files the checkpoint records under this session's `state.dir` will commit to
    /// `table` (a job killed mid-checkpoint commits them when it starts again).
    fn in_flight_files(&self, catalog: &str, table: &Maintained) -> Result<HashSet<String>> {
        let dir = self.options().state_dir;
        let namespace = table.ident.namespace().clone().inner();
        let mut keep = HashSet::new();
        for record in StateStore::new(&dir).records()? {
            for pending in &record.tables {
                if pending.catalog == catalog
                    && pending.namespace == namespace
                    && pending.table == table.ident.name()
                {
                    keep.extend(pending.file_paths());
                }
            }
        }
        Ok(keep)
    }

    /// `where` (SQL over the table's columns) as a filter on files' partitions and metrics.
    async fn filter(&self, table: &Maintained, sql: &str) -> Result<iceberg::expr::Predicate> {
        let loaded = table.load().await?;
        let arrow = schema_to_arrow_schema(loaded.metadata().current_schema())?;
        let schema = DFSchema::try_from(arrow)?;
        let expr = self
            .ctx
            .parse_sql_expr(sql, &schema)
            .map_err(|e| Error::Plan(format!("rewrite_data_files: where '{sql}': {e}")))?;
        iceberg_datafusion::physical_plan::convert_filters_to_predicate(&[expr]).ok_or_else(|| {
            Error::Plan(format!(
                "rewrite_data_files: where '{sql}' cannot be decided from file metadata \
                 (use comparisons of columns with values, AND, OR, IN, IS NULL)"
            ))
        })
    }
}

/// One row of counts, a BIGINT column each.
fn counts(columns: &[(&str, u64)]) -> Result<Output> {
    let schema = Arc::new(Schema::new(
        columns
            .iter()
            .map(|(n, _)| Field::new(*n, DataType::Int64, false))
            .collect::<Vec<_>>(),
    ));
    let arrays: Vec<ArrayRef> = columns
        .iter()
        .map(|(_, v)| Arc::new(Int64Array::from(vec![*v as i64])) as ArrayRef)
        .collect();
    let batch = RecordBatch::try_new(schema.clone(), arrays)
        .map_err(|e| Error::Internal(format!("a procedure's result: {e}")))?;
    Ok(Output::Rows(schema, vec![batch]))
}
