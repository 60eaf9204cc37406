//! Statements that change rows of lake tables: `DELETE`, `UPDATE` and `MERGE INTO`.
//!
//! Each becomes one query over the table's positioned rows (`catalog::positioned`: its
//! columns plus the data file and position of each row), planned and run by DataFusion, so
//! conditions, joins and subqueries are plain SQL:
//!
//! ```text
//! DELETE FROM t WHERE p           SELECT t.__floe_file, t.__floe_pos FROM <rows> AS t WHERE p
//! UPDATE t SET a = e WHERE p      SELECT t.__floe_file, t.__floe_pos, true, e AS a, t.b, ...
//!                                   FROM <rows> AS t WHERE p
//! MERGE INTO t USING s ON c ...   SELECT CASE <clause> ... END ... FROM s LEFT JOIN <rows> AS t ON c
//! ```
//!
//! The positions selected become position delete files (one per data file); the rows to
//! insert (updated rows, MERGE's inserts) new data files; both commit as one snapshot
//! (`lake::commit::row_delta`). Another commit that changed rows meanwhile (a compaction,
//! another statement) makes the statement run again on the newer table.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, UInt64Array};
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::sql::parser::DFParserBuilder;
use datafusion::sql::sqlparser::ast::{
    Assignment, AssignmentTarget, Delete, Expr as SqlExpr, FromTable, Ident, Merge, MergeAction,
    MergeClauseKind, MergeInsertKind, ObjectName, TableAlias, TableFactor, TableWithJoins, Update,
    UpdateTableFromKind,
};
use iceberg::TableIdent;
use iceberg::spec::{DataFile, FormatVersion};
use iceberg::table::Table;

use super::{Output, Session};
use crate::catalog::positioned::PositionedTable;
use crate::error::{Error, Result};
use crate::lake::TableWriter;
use crate::lake::commit::row_delta::{RowDelta, prepare_row_delta};
use crate::lake::deletes;
use crate::lake::maintenance::Maintained;
use crate::lake::read::{FILE_COLUMN, POS_COLUMN};
use crate::schema::conform;

/// How many times a statement runs again after other commits changed the rows it read.
const ATTEMPTS: usize = 5;

/// The column saying whether a row's values are inserted.
const INSERT_COLUMN: &str = "__floe_insert";

/// Which statement: what its query selects and how its rows are read.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// Positions only; a row found twice (through `USING`) is deleted once.
    Delete,
    /// Positions, the insert flag and the table's columns; a row found twice is an error.
    Update,
    Merge,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Delete => "DELETE",
            Kind::Update => "UPDATE",
            Kind::Merge => "MERGE",
        }
    }
}

/// The lake table a statement changes, and the name its rows go by in the query.
struct Changed {
    name: ObjectName,
    alias: Ident,
}

impl Changed {
    fn of(factor: &TableFactor) -> Option<Self> {
        let TableFactor::Table { name, alias, .. } = factor else {
            return None;
        };
        let alias = match alias {
            Some(TableAlias { name, .. }) => name.clone(),
            None => Ident::with_quote('"', name.0.last()?.to_string().trim_matches('"')),
        };
        Some(Self {
            name: name.clone(),
            alias,
        })
    }
}

impl Session {
    /// `DELETE FROM t [USING ...] [WHERE ...]` on a lake table; `None` for other tables.
    pub(super) async fn delete(&self, d: &Delete) -> Result<Option<Output>> {
        let (FromTable::WithFromKeyword(from) | FromTable::WithoutKeyword(from)) = &d.from;
        let [TableWithJoins { relation, joins }] = from.as_slice() else {
            return Ok(None);
        };
        let Some(changed) = Changed::of(relation) else {
            return Ok(None);
        };
        if !self.is_lake_table(&changed.name) {
            return Ok(None);
        }
        if !joins.is_empty() || !d.tables.is_empty() || d.limit.is_some() || !d.order_by.is_empty()
        {
            return Err(Error::Unsupported(
                "DELETE with joins, several tables, ORDER BY or LIMIT: write DELETE FROM t \
                 [USING other] WHERE ..."
                    .into(),
            ));
        }
        if d.returning.is_some() {
            return Err(Error::Unsupported("DELETE ... RETURNING".into()));
        }
        let a = &changed.alias;
        let using = d
            .using
            .iter()
            .flatten()
            .map(|t| format!(", {t}"))
            .collect::<String>();
        let selection = where_clause(d.selection.as_ref());
        let query = move |rows: &str| {
            format!(
                "SELECT {a}.{FILE_COLUMN}, {a}.{POS_COLUMN} FROM {rows} AS {a}{using}{selection}"
            )
        };
        self.change(&changed, Kind::Delete, query).await.map(Some)
    }

    /// `UPDATE t SET c = e, ... [FROM ...] [WHERE ...]` on a lake table; `None` for others.
    pub(super) async fn update(&self, u: &Update) -> Result<Option<Output>> {
        let Some(changed) = Changed::of(&u.table.relation) else {
            return Ok(None);
        };
        if !self.is_lake_table(&changed.name) {
            return Ok(None);
        }
        if !u.table.joins.is_empty() || u.limit.is_some() || u.returning.is_some() {
            return Err(Error::Unsupported(
                "UPDATE with joins, LIMIT or RETURNING: write UPDATE t SET ... [FROM other] \
                 WHERE ..."
                    .into(),
            ));
        }
        let columns = self.column_names(&changed).await?;
        let values = assigned(&columns, &u.assignments, &changed)?;
        let a = &changed.alias;
        let from = match &u.from {
            Some(UpdateTableFromKind::BeforeSet(t) | UpdateTableFromKind::AfterSet(t)) => {
                t.iter().map(|t| format!(", {t}")).collect::<String>()
            }
            None => String::new(),
        };
        let selection = where_clause(u.selection.as_ref());
        let query = move |rows: &str| {
            format!(
                "SELECT {a}.{FILE_COLUMN}, {a}.{POS_COLUMN}, true AS {INSERT_COLUMN}, {values} \
                 FROM {rows} AS {a}{from}{selection}"
            )
        };
        self.change(&changed, Kind::Update, query).await.map(Some)
    }

    /// `MERGE INTO t USING s ON c WHEN [NOT] MATCHED [AND p] THEN ...` on a lake table;
    /// `None` for other tables.
    pub(super) async fn merge(&self, m: &Merge) -> Result<Option<Output>> {
        let Some(changed) = Changed::of(&m.table) else {
            return Ok(None);
        };
        if !self.is_lake_table(&changed.name) {
            return Ok(None);
        }
        if m.output.is_some() {
            return Err(Error::Unsupported("MERGE ... OUTPUT".into()));
        }
        let columns = self.column_names(&changed).await?;
        let a = &changed.alias;
        // Per clause, in order: when it applies, and the values it inserts (None: DELETE).
        let mut matched: Vec<(String, Option<Vec<String>>)> = Vec::new();
        let mut unmatched: Vec<(String, Vec<String>)> = Vec::new();
        for clause in &m.clauses {
            let when = clause
                .predicate
                .as_ref()
                .map(|p| format!("({p})"))
                .unwrap_or_else(|| "true".into());
            match (&clause.clause_kind, &clause.action) {
                (MergeClauseKind::Matched, MergeAction::Update(u)) => {
                    if u.update_predicate.is_some() || u.delete_predicate.is_some() {
                        return Err(Error::Unsupported(
                            "MERGE ... UPDATE SET ... WHERE / DELETE WHERE (Oracle's form): \
                             write WHEN MATCHED AND <condition> THEN UPDATE / DELETE"
                                .into(),
                        ));
                    }
                    let values = assigned_values(&columns, &u.assignments, &changed)?;
                    matched.push((when, Some(values)));
                }
                (MergeClauseKind::Matched, MergeAction::Delete { .. }) => {
                    matched.push((when, None));
                }
                (
                    MergeClauseKind::NotMatched | MergeClauseKind::NotMatchedByTarget,
                    MergeAction::Insert(i),
                ) => {
                    let MergeInsertKind::Values(v) = &i.kind else {
                        return Err(Error::Unsupported(
                            "MERGE ... INSERT ROW: write INSERT (columns) VALUES (...)".into(),
                        ));
                    };
                    let [row] = v.rows.as_slice() else {
                        return Err(Error::Plan(
                            "MERGE ... INSERT takes one row of VALUES".into(),
                        ));
                    };
                    let targets: Vec<String> = if i.columns.is_empty() {
                        columns.clone()
                    } else {
                        i.columns
                            .iter()
                            .map(|c| column_of(c, &columns, &changed))
                            .collect::<Result<_>>()?
                    };
                    if targets.len() != row.len() {
                        return Err(Error::Plan(format!(
                            "MERGE ... INSERT names {} columns and gives {} values",
                            targets.len(),
                            row.len()
                        )));
                    }
                    let values = columns
                        .iter()
                        .map(|c| match targets.iter().position(|t| t == c) {
                            Some(k) => format!("({})", row[k]),
                            None => "NULL".to_string(),
                        })
                        .collect();
                    unmatched.push((when, values));
                }
                (kind, action) => {
                    return Err(Error::Unsupported(format!(
                        "MERGE clause WHEN {kind} THEN {action}: floe runs WHEN MATCHED THEN \
                         UPDATE / DELETE and WHEN NOT MATCHED THEN INSERT"
                    )));
                }
            }
        }
        // A source row matches a target row when the target's position is not NULL.
        let is_matched = format!("{a}.{POS_COLUMN} IS NOT NULL");
        let mut action = String::from("CASE");
        for (k, (when, _)) in matched.iter().enumerate() {
            action.push_str(&format!(" WHEN {is_matched} AND {when} THEN {k}"));
        }
        for (k, (when, _)) in unmatched.iter().enumerate() {
            action.push_str(&format!(
                " WHEN NOT ({is_matched}) AND {when} THEN {}",
                matched.len() + k
            ));
        }
        action.push_str(" END");
        let deletes_row: Vec<usize> = (0..matched.len()).collect();
        let inserts_row: Vec<usize> = matched
            .iter()
            .enumerate()
            .filter(|(_, (_, v))| v.is_some())
            .map(|(k, _)| k)
            .chain(matched.len()..matched.len() + unmatched.len())
            .collect();
        let among = |ks: &[usize]| {
            if ks.is_empty() {
                "false".to_string()
            } else {
                format!(
                    "({action}) IN ({})",
                    ks.iter()
                        .map(|k| k.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        };
        let mut select = vec![
            format!(
                "CASE WHEN {} THEN {a}.{FILE_COLUMN} END AS {FILE_COLUMN}",
                among(&deletes_row)
            ),
            format!(
                "CASE WHEN {} THEN {a}.{POS_COLUMN} END AS {POS_COLUMN}",
                among(&deletes_row)
            ),
            format!(
                "COALESCE({}, false) AS {INSERT_COLUMN}",
                among(&inserts_row)
            ),
        ];
        for (i, c) in columns.iter().enumerate() {
            let mut value = format!("CASE {action}");
            for (k, (_, values)) in matched.iter().enumerate() {
                if let Some(values) = values {
                    value.push_str(&format!(" WHEN {k} THEN {}", values[i]));
                }
            }
            for (k, (_, values)) in unmatched.iter().enumerate() {
                value.push_str(&format!(" WHEN {} THEN {}", matched.len() + k, values[i]));
            }
            value.push_str(&format!(" END AS {}", quoted(c)));
            select.push(value);
        }
        let select = select.join(", ");
        let source = &m.source;
        let on = &m.on;
        // Each clause's condition is evaluated once per row of the join, in each CASE that
        // needs the clause (DataFusion shares the common subexpressions).
        let query = move |rows: &str| {
            format!("SELECT {select} FROM {source} LEFT JOIN {rows} AS {a} ON {on}")
        };
        self.change(&changed, Kind::Merge, query).await.map(Some)
    }

    /// Whether `name` is a table of one of the session's Iceberg catalogs.
    fn is_lake_table(&self, name: &ObjectName) -> bool {
        self.table_name(name)
            .map(|n| self.is_iceberg(&n.catalog))
            .unwrap_or(false)
    }

    /// The column names of the changed table, in order.
    async fn column_names(&self, changed: &Changed) -> Result<Vec<String>> {
        let table = self.changed_table(changed).await?.load().await?;
        Ok(table
            .metadata()
            .current_schema()
            .as_struct()
            .fields()
            .iter()
            .map(|f| f.name.clone())
            .collect())
    }

    async fn changed_table(&self, changed: &Changed) -> Result<Maintained> {
        let name = self.table_name(&changed.name)?;
        let catalog = self.iceberg(&name.catalog)?;
        let committer = self.committer(&name.catalog).ok_or_else(|| {
            Error::Unsupported(format!(
                "changing rows of tables of catalog {}: floe writes position deletes through \
                 its own commit path, which sql, rest and glue catalogs have",
                name.catalog
            ))
        })?;
        Ok(Maintained {
            catalog,
            committer,
            ident: TableIdent::new(name.namespace, name.table),
        })
    }

    /// Run the statement whose query `query` builds (given the name of the positioned rows)
    /// until it commits on the table as it is, or fails for another reason than a conflict.
    async fn change(
        &self,
        changed: &Changed,
        kind: Kind,
        query: impl Fn(&str) -> String,
    ) -> Result<Output> {
        let target = self.changed_table(changed).await?;
        let mut last = None;
        for _ in 0..ATTEMPTS {
            let table = target.load().await?;
            match table.metadata().format_version() {
                FormatVersion::V1 => {
                    return Err(Error::Unsupported(format!(
                        "{} on format-version 1 table {}: row-level deletes need format \
                         version 2",
                        kind.name(),
                        target.ident
                    )));
                }
                FormatVersion::V2 | FormatVersion::V3 => {}
            }
            match self.change_once(&target, &table, kind, &query).await {
                Err(Error::Conflict(why)) => last = Some(why),
                other => return other,
            }
        }
        Err(Error::Conflict(format!(
            "{} on table {}: other commits kept changing its rows ({ATTEMPTS} attempts); \
             nothing was committed{}",
            kind.name(),
            target.ident,
            last.map(|w| format!(" (last: {w})")).unwrap_or_default()
        )))
    }

    async fn change_once(
        &self,
        target: &Maintained,
        table: &Table,
        kind: Kind,
        query: &impl Fn(&str) -> String,
    ) -> Result<Output> {
        let rows = Arc::new(PositionedTable::try_new(table.clone())?);
        let name = format!("__floe_rows_{}", uuid::Uuid::new_v4().simple());
        let registered = Registered::new(self, &name, rows.clone())?;
        let sql = query(&format!("datafusion.public.{name}"));
        let batches = self.run_rows(&sql).await;
        drop(registered);
        let batches = batches?;
        // The positions to delete, by data file; the rows to insert.
        let mut positions: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        let mut inserts = Vec::new();
        let mut changed_rows = 0u64;
        for batch in &batches {
            let file = batch.column(0).as_string::<i32>();
            let pos = batch.column(1).as_primitive::<Int64Type>();
            for i in 0..batch.num_rows() {
                if file.is_valid(i) && pos.is_valid(i) {
                    positions
                        .entry(file.value(i).to_string())
                        .or_default()
                        .push(pos.value(i));
                }
            }
            if kind != Kind::Delete {
                let flag = batch.column(2).as_boolean();
                let keep = BooleanArray::from_iter(
                    (0..batch.num_rows()).map(|i| Some(flag.is_valid(i) && flag.value(i))),
                );
                changed_rows += (0..batch.num_rows())
                    .filter(|&i| keep.value(i) || (file.is_valid(i) && pos.is_valid(i)))
                    .count() as u64;
                let picked = filter_record_batch(batch, &keep)
                    .map_err(|e| Error::Internal(format!("{}: {e}", kind.name())))?;
                if picked.num_rows() > 0 {
                    let values = picked
                        .project(&(3..picked.num_columns()).collect::<Vec<_>>())
                        .map_err(|e| Error::Internal(format!("{}: {e}", kind.name())))?;
                    inserts.push(conform(table.metadata().current_schema(), &values)?);
                }
            }
        }
        let mut deleted = 0u64;
        for (file, ps) in positions.iter_mut() {
            ps.sort_unstable();
            let n = ps.len();
            ps.dedup();
            if ps.len() != n && kind != Kind::Delete {
                return Err(Error::Plan(format!(
                    "{}: a row of {} ({file}) matched more than one source row; each target \
                     row may be changed once",
                    kind.name(),
                    target.ident
                )));
            }
            deleted += ps.len() as u64;
        }
        if positions.is_empty() && inserts.is_empty() {
            return count(0);
        }
        let io = table.file_io();
        let mut written: Vec<DataFile> = Vec::new();
        let result = async {
            let mut delta = RowDelta {
                read_snapshot: table.metadata().current_snapshot_id(),
                ..RowDelta::default()
            };
            let mut changes = Vec::with_capacity(positions.len());
            for (file, ps) in &positions {
                let t = rows.target(file).ok_or_else(|| {
                    Error::Internal(format!("{}: data file {file} was not scanned", kind.name()))
                })?;
                changes.push((t, ps.clone()));
            }
            delta.deletes = deletes::write_all(table, &changes).await?;
            written.extend(delta.deletes.iter().map(|(d, _)| d.clone()));
            if !inserts.is_empty() {
                let mut writer = TableWriter::try_new(table)?;
                for b in inserts {
                    writer.write(b).await?;
                }
                let added = writer.close().await?;
                written.extend(added.iter().cloned());
                delta.added = added;
            }
            delta
                .summary
                .insert("floe.operation".into(), kind.name().to_lowercase());
            target
                .commit(|base| {
                    let delta = &delta;
                    async move { Ok(Some((prepare_row_delta(&base, delta).await?, ()))) }
                })
                .await
        }
        .await;
        if let Err(e) = result {
            for f in &written {
                let _ = io.delete(f.file_path()).await;
            }
            return Err(e);
        }
        // An updated row is deleted and inserted: it counts once.
        count(if kind == Kind::Delete {
            deleted
        } else {
            changed_rows
        })
    }

    /// The rows of a query floe built.
    async fn run_rows(&self, sql: &str) -> Result<Vec<RecordBatch>> {
        let stmt = DFParserBuilder::new(sql).build()?.parse_statement()?;
        let plan = self.ctx.state().statement_to_plan(stmt).await?;
        let df = self.ctx.execute_logical_plan(plan).await?;
        Ok(df.collect().await?)
    }
}

/// A table registered in DataFusion's in-memory catalog for one statement, taken out again
/// when dropped.
struct Registered<'a> {
    session: &'a Session,
    name: String,
}

impl<'a> Registered<'a> {
    fn new(
        session: &'a Session,
        name: &str,
        table: Arc<dyn datafusion::datasource::TableProvider>,
    ) -> Result<Self> {
        let schema = session
            .ctx
            .catalog("datafusion")
            .and_then(|c| c.schema("public"))
            .ok_or_else(|| {
                Error::Internal("DataFusion's in-memory catalog datafusion.public is gone".into())
            })?;
        schema.register_table(name.to_string(), table)?;
        Ok(Self {
            session,
            name: name.to_string(),
        })
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        if let Some(schema) = self
            .session
            .ctx
            .catalog("datafusion")
            .and_then(|c| c.schema("public"))
        {
            let _ = schema.deregister_table(&self.name);
        }
    }
}

fn where_clause(selection: Option<&SqlExpr>) -> String {
    selection.map(|s| format!(" WHERE {s}")).unwrap_or_default()
}

fn quoted(name: &str) -> String {
    Ident::with_quote('"', name).to_string()
}

/// The table column an assignment or insert names (`c` or `alias.c`).
fn column_of(target: &ObjectName, columns: &[String], changed: &Changed) -> Result<String> {
    let name = target
        .0
        .last()
        .and_then(|p| p.as_ident())
        .map(|i| i.value.clone())
        .unwrap_or_default();
    if columns.contains(&name) {
        return Ok(name);
    }
    Err(Error::Plan(format!(
        "column '{target}' is not a column of table {} (its columns: {})",
        changed.name,
        columns.join(", ")
    )))
}

/// Each column's value after `assignments`: the expression assigned, or the column as it is.
fn assigned_values(
    columns: &[String],
    assignments: &[Assignment],
    changed: &Changed,
) -> Result<Vec<String>> {
    let mut values: Vec<Option<String>> = vec![None; columns.len()];
    for a in assignments {
        let AssignmentTarget::ColumnName(target) = &a.target else {
            return Err(Error::Unsupported(format!(
                "assignment '{a}': assign one column at a time"
            )));
        };
        let c = column_of(target, columns, changed)?;
        let i = columns.iter().position(|x| *x == c).unwrap_or(0);
        if values[i].replace(format!("({})", a.value)).is_some() {
            return Err(Error::Plan(format!("column '{c}' is assigned twice")));
        }
    }
    Ok(columns
        .iter()
        .zip(values)
        .map(|(c, v)| v.unwrap_or_else(|| format!("{}.{}", changed.alias, quoted(c))))
        .collect())
}

/// [`assigned_values`] as a select list, each value named after its column.
fn assigned(columns: &[String], assignments: &[Assignment], changed: &Changed) -> Result<String> {
    let values = assigned_values(columns, assignments, changed)?;
    Ok(columns
        .iter()
        .zip(values)
        .map(|(c, v)| format!("{v} AS {}", quoted(c)))
        .collect::<Vec<_>>()
        .join(", "))
}

/// The result of a statement changing rows: how many it changed.
fn count(n: u64) -> Result<Output> {
    let schema = Arc::new(Schema::new(vec![Field::new(
        "count",
        DataType::UInt64,
        false,
    )]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![Arc::new(UInt64Array::from(vec![n])) as ArrayRef],
    )
    .map_err(|e| Error::Internal(format!("a row count: {e}")))?;
    Ok(Output::Rows(schema, vec![batch]))
}
