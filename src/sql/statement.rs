//! floe's own statements, beside DataFusion's.
//!
//! Each struct documents its grammar and prints back as SQL that parses to the same
//! statement (guarded by the round-trip tests in `parser.rs`).

use std::fmt;

use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{ColumnDef, Expr, Ident, ObjectName, Query};

use super::options::quote;

/// One parsed statement.
#[derive(Debug, Clone, PartialEq)]
pub enum Statement {
    /// A statement DataFusion plans itself (queries, `INSERT`, `EXPLAIN`, `SET`, ...).
    DataFusion(Box<DFStatement>),
    CreateCatalog(CreateCatalog),
    DropCatalog(DropCatalog),
    ShowCatalogs,
    CreateSchema(CreateSchema),
    DropSchema(DropSchema),
    ShowSchemas(ShowSchemas),
    CreateTable(Box<CreateTable>),
    DropTable(DropTable),
    ShowTables(ShowTables),
    Describe(Describe),
    CreateSource(Box<CreateSource>),
    DropSource(DropSource),
    ShowSources,
    DescribeSource(DescribeSource),
    ShowJobs,
    StopJob(StopJob),
    ResumeJob(ResumeJob),
    RoutedInsert(Box<RoutedInsert>),
    Call(Call),
}

/// ```text
/// INSERT INTO catalog.namespace SELECT ... FROM source ...
///     ROUTE BY expression [WITH ('partition.candidates' = '...', 'schema.evolution' = 'on', ...)]
/// ```
/// A continuous job sending each row to the table `expression` names in the namespace.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutedInsert {
    pub namespace: ObjectName,
    pub query: Box<Query>,
    pub route: Expr,
    pub options: OptionList,
}

impl fmt::Display for RoutedInsert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "INSERT INTO {} {} ROUTE BY {}",
            self.namespace, self.query, self.route
        )?;
        fmt_with(f, &self.options)
    }
}

/// A `WITH (...)` clause as written: ordered `(key, value)` pairs.
#[derive(Clone, Default, PartialEq)]
pub struct OptionList(pub Vec<(String, String)>);

impl std::ops::Deref for OptionList {
    type Target = Vec<(String, String)>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl IntoIterator for OptionList {
    type Item = (String, String);
    type IntoIter = std::vec::IntoIter<(String, String)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl fmt::Debug for OptionList {
    /// Secret values masked ([`crate::secret`]): statements are shown in logs and tests.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let map: std::collections::BTreeMap<String, String> = self.0.iter().cloned().collect();
        crate::secret::Masked(&map).fmt(f)
    }
}

fn fmt_with(f: &mut fmt::Formatter<'_>, options: &OptionList) -> fmt::Result {
    if options.is_empty() {
        return Ok(());
    }
    f.write_str(" WITH (")?;
    for (i, (k, v)) in options.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        write!(f, "{} = {}", quote(k), quote(v))?;
    }
    f.write_str(")")
}

/// ` (col type, ..., extra)`, or nothing when there are no columns.
fn fmt_columns(
    f: &mut fmt::Formatter<'_>,
    columns: &[ColumnDef],
    extra: Option<&dyn fmt::Display>,
) -> fmt::Result {
    if columns.is_empty() {
        return Ok(());
    }
    f.write_str(" (")?;
    for (i, c) in columns.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        write!(f, "{c}")?;
    }
    if let Some(e) = extra {
        write!(f, ", {e}")?;
    }
    f.write_str(")")
}

/// `PRIMARY KEY (a, b) NOT ENFORCED`.
struct PrimaryKey<'a>(&'a [Ident]);

impl fmt::Display for PrimaryKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PRIMARY KEY (")?;
        for (i, c) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{c}")?;
        }
        f.write_str(") NOT ENFORCED")
    }
}

fn if_not_exists(b: bool) -> &'static str {
    if b { "IF NOT EXISTS " } else { "" }
}

fn if_exists(b: bool) -> &'static str {
    if b { "IF EXISTS " } else { "" }
}

/// ```text
/// CREATE CATALOG [IF NOT EXISTS] name WITH ('type' = 'iceberg', 'catalog-type' = ..., ...)
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct CreateCatalog {
    pub name: String,
    pub if_not_exists: bool,
    pub options: OptionList,
}

impl fmt::Display for CreateCatalog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CREATE CATALOG {}{}",
            if_not_exists(self.if_not_exists),
            self.name
        )?;
        fmt_with(f, &self.options)
    }
}

/// ```text
/// DROP CATALOG [IF EXISTS] name
/// ```
/// Unregisters the catalog from the session; its tables are untouched.
#[derive(Debug, Clone, PartialEq)]
pub struct DropCatalog {
    pub name: String,
    pub if_exists: bool,
}

impl fmt::Display for DropCatalog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DROP CATALOG {}{}", if_exists(self.if_exists), self.name)
    }
}

/// ```text
/// CREATE { SCHEMA | NAMESPACE | DATABASE } [IF NOT EXISTS] catalog.namespace [WITH (props)]
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct CreateSchema {
    pub name: ObjectName,
    pub if_not_exists: bool,
    pub options: OptionList,
}

impl fmt::Display for CreateSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CREATE SCHEMA {}{}",
            if_not_exists(self.if_not_exists),
            self.name
        )?;
        fmt_with(f, &self.options)
    }
}

/// ```text
/// DROP { SCHEMA | NAMESPACE | DATABASE } [IF EXISTS] catalog.namespace
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct DropSchema {
    pub name: ObjectName,
    pub if_exists: bool,
}

impl fmt::Display for DropSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DROP SCHEMA {}{}", if_exists(self.if_exists), self.name)
    }
}

/// ```text
/// SHOW { SCHEMAS | NAMESPACES | DATABASES } [{ IN | FROM } catalog]
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ShowSchemas {
    pub catalog: Option<String>,
}

impl fmt::Display for ShowSchemas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SHOW SCHEMAS")?;
        if let Some(c) = &self.catalog {
            write!(f, " IN {c}")?;
        }
        Ok(())
    }
}

/// ```text
/// CREATE TABLE [IF NOT EXISTS] name
///     [( column type [NOT NULL] [PRIMARY KEY [NOT ENFORCED]], ...
///        [, PRIMARY KEY (column, ...) [NOT ENFORCED]] )]
///     [PARTITIONED BY ( col | years(col) | months(col) | days(col) | hours(col)
///                       | bucket(N, col) | truncate(N, col), ... )]
///     [WITH ('format-version' = '2', 'key' = 'value', ...)]
///     [AS query]
/// ```
/// Columns, or a query, or both (then the query's rows are cast to the columns). The
/// primary key becomes the table's Iceberg identifier fields (its columns NOT NULL).
#[derive(Debug, Clone, PartialEq)]
pub struct CreateTable {
    pub name: ObjectName,
    pub if_not_exists: bool,
    pub columns: Vec<ColumnDef>,
    /// The primary key's columns, from a column's `PRIMARY KEY` or the table constraint.
    pub primary_key: Vec<Ident>,
    pub partitioned_by: Vec<Expr>,
    pub options: OptionList,
    pub query: Option<Box<Query>>,
}

impl fmt::Display for CreateTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CREATE TABLE {}{}",
            if_not_exists(self.if_not_exists),
            self.name
        )?;
        let key = PrimaryKey(&self.primary_key);
        let key = (!self.primary_key.is_empty()).then_some(&key as &dyn fmt::Display);
        fmt_columns(f, &self.columns, key)?;
        if !self.partitioned_by.is_empty() {
            f.write_str(" PARTITIONED BY (")?;
            for (i, e) in self.partitioned_by.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{e}")?;
            }
            f.write_str(")")?;
        }
        fmt_with(f, &self.options)?;
        if let Some(q) = &self.query {
            write!(f, " AS {q}")?;
        }
        Ok(())
    }
}

/// ```text
/// DROP TABLE [IF EXISTS] name
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct DropTable {
    pub name: ObjectName,
    pub if_exists: bool,
}

impl fmt::Display for DropTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DROP TABLE {}{}", if_exists(self.if_exists), self.name)
    }
}

/// ```text
/// SHOW TABLES [{ IN | FROM } [catalog.]namespace]
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ShowTables {
    pub namespace: Option<ObjectName>,
}

impl fmt::Display for ShowTables {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SHOW TABLES")?;
        if let Some(n) = &self.namespace {
            write!(f, " IN {n}")?;
        }
        Ok(())
    }
}

/// ```text
/// { DESCRIBE | DESC } [TABLE] name
/// ```
/// Columns with types and nullability; for an Iceberg table also the partition spec,
/// the current snapshot and the location.
#[derive(Debug, Clone, PartialEq)]
pub struct Describe {
    pub name: ObjectName,
}

impl fmt::Display for Describe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DESCRIBE {}", self.name)
    }
}

/// ```text
/// CREATE SOURCE [IF NOT EXISTS] name
///     [( column type, ... [, WATERMARK FOR column AS expression] )]
///     WITH ('connector' = 'datagen' | 'filesystem', ...)
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct CreateSource {
    pub name: String,
    pub if_not_exists: bool,
    pub columns: Vec<ColumnDef>,
    /// The key of the source's records (`PRIMARY KEY (...) NOT ENFORCED`): what an upsert
    /// source's tombstones delete.
    pub primary_key: Vec<Ident>,
    pub watermark: Option<Watermark>,
    pub options: OptionList,
}

/// `WATERMARK FOR column AS expression`: event time is `column`; the watermark is the
/// largest value of `expression` seen so far (`ts - INTERVAL '5' SECOND` allows 5 s of
/// disorder).
#[derive(Debug, Clone, PartialEq)]
pub struct Watermark {
    pub column: Ident,
    pub expr: Expr,
}

impl fmt::Display for Watermark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WATERMARK FOR {} AS {}", self.column, self.expr)
    }
}

impl fmt::Display for CreateSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CREATE SOURCE {}{}",
            if_not_exists(self.if_not_exists),
            self.name
        )?;
        let key = (!self.primary_key.is_empty()).then(|| PrimaryKey(&self.primary_key).to_string());
        let watermark = self.watermark.as_ref().map(|w| w.to_string());
        let extra = key
            .into_iter()
            .chain(watermark)
            .collect::<Vec<_>>()
            .join(", ");
        let extra = (!extra.is_empty()).then_some(&extra as &dyn fmt::Display);
        fmt_columns(f, &self.columns, extra)?;
        fmt_with(f, &self.options)
    }
}

/// ```text
/// DROP SOURCE [IF EXISTS] name
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct DropSource {
    pub name: String,
    pub if_exists: bool,
}

impl fmt::Display for DropSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DROP SOURCE {}{}", if_exists(self.if_exists), self.name)
    }
}

/// ```text
/// { DESCRIBE | DESC } SOURCE name
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct DescribeSource {
    pub name: String,
}

impl fmt::Display for DescribeSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DESCRIBE SOURCE {}", self.name)
    }
}

/// ```text
/// STOP JOB 'name'
/// ```
/// The job takes a final checkpoint, then stops.
#[derive(Debug, Clone, PartialEq)]
pub struct StopJob {
    pub name: String,
}

impl fmt::Display for StopJob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "STOP JOB {}", quote(&self.name))
    }
}

/// ```text
/// RESUME JOB 'name'     -- a stopped, finished or failed job, from its last checkpoint
/// RESTART JOB 'name'    -- the same, stopping it first (with a final checkpoint) if it runs
/// ```
/// The job starts again with the statement and settings it was first started with (a
/// server keeps them).
#[derive(Debug, Clone, PartialEq)]
pub struct ResumeJob {
    pub name: String,
    /// `RESTART`: a running job is stopped first.
    pub restart: bool,
}

impl fmt::Display for ResumeJob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verb = if self.restart { "RESTART" } else { "RESUME" };
        write!(f, "{verb} JOB {}", quote(&self.name))
    }
}

/// ```text
/// CALL [catalog.]system.procedure(name => value, ...)      -- or values by position
/// ```
/// A table maintenance procedure, named and called as in Spark and Trino.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub procedure: ObjectName,
    pub args: Vec<CallArg>,
}

/// One argument of a `CALL`: `name => value`, or a value in its place.
#[derive(Debug, Clone, PartialEq)]
pub struct CallArg {
    pub name: Option<String>,
    pub value: Expr,
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CALL {}(", self.procedure)?;
        for (i, a) in self.args.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            if let Some(name) = &a.name {
                write!(f, "{name} => ")?;
            }
            write!(f, "{}", a.value)?;
        }
        f.write_str(")")
    }
}

impl fmt::Display for Statement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Statement::DataFusion(s) => write!(f, "{s}"),
            Statement::CreateCatalog(s) => write!(f, "{s}"),
            Statement::DropCatalog(s) => write!(f, "{s}"),
            Statement::ShowCatalogs => f.write_str("SHOW CATALOGS"),
            Statement::CreateSchema(s) => write!(f, "{s}"),
            Statement::DropSchema(s) => write!(f, "{s}"),
            Statement::ShowSchemas(s) => write!(f, "{s}"),
            Statement::CreateTable(s) => write!(f, "{s}"),
            Statement::DropTable(s) => write!(f, "{s}"),
            Statement::ShowTables(s) => write!(f, "{s}"),
            Statement::Describe(s) => write!(f, "{s}"),
            Statement::CreateSource(s) => write!(f, "{s}"),
            Statement::DropSource(s) => write!(f, "{s}"),
            Statement::ShowSources => f.write_str("SHOW SOURCES"),
            Statement::DescribeSource(s) => write!(f, "{s}"),
            Statement::ShowJobs => f.write_str("SHOW JOBS"),
            Statement::StopJob(s) => write!(f, "{s}"),
            Statement::ResumeJob(s) => write!(f, "{s}"),
            Statement::Call(s) => write!(f, "{s}"),
            Statement::RoutedInsert(s) => write!(f, "{s}"),
        }
    }
}
