//! PostgreSQL's dialect in clients' own queries, turned into what DataFusion plans: the
//! catalog queries psql, JDBC and DBeaver send, and the session statements drivers send on
//! connect (`SET extra_float_digits = 3`, `SHOW TRANSACTION ISOLATION LEVEL`).
//!
//! ```text
//! pg_catalog.pg_class, pg_type         -> <home>.pg_catalog.pg_class (pg_catalog/)
//! FROM pg_catalog.pg_get_keywords()    -> FROM <home>.pg_catalog.pg_get_keywords (a table)
//! pg_catalog.format_type(...)          -> format_type(...)            (pg_functions.rs)
//! a OPERATOR(pg_catalog.~) b           -> a ~ b
//! x COLLATE pg_catalog.default         -> x
//! 'lake.sales.orders'::regclass        -> its oid;  x::regclass, x::oid -> x (a bigint)
//! x::regtype                           -> format_type(x, NULL);  'int4'::regtype -> 23
//! x::pg_catalog.text, x::name          -> CAST(x AS TEXT)
//! (SELECT e FROM pg_attrdef ...)       -> NULL, EXISTS (...) -> false: subqueries over tables
//!                                         floe never has rows in (DataFusion cannot
//!                                         decorrelate the ones psql sends)
//! ARRAY(SELECT e FROM ...)             -> (SELECT array_agg(e) FROM ...), NULL over no rows
//! SELECT n.oid, n.* FROM pg_namespace n -> SELECT n.* ...: PostgreSQL returns `oid` twice,
//!                                         DataFusion wants names apart
//! '{a,b}'::text[]                      -> make_array('a', 'b')
//! x <> ALL (array)                     -> NOT array_has(array, x)
//! SELECT a.x, <anything> FROM pg_policy -> SELECT NULL AS x, NULL AS "?column?" FROM
//!                                         pg_policy: never evaluated, so never refused
//! (SELECT e FROM ... WHERE <outer>)    -> (SELECT max(e) ...): DataFusion plans correlated
//!                                         scalar subqueries only when they aggregate, and
//!                                         PostgreSQL allows them at most one row anyway
//! current_database(), version(), ...   -> the session's values, as literals
//! SET <PostgreSQL setting>, SHOW ...   -> answered here (floe has no such setting)
//! ```

use std::ops::ControlFlow;

use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{
    BinaryOperator, CastKind, DataType as SqlType, Expr, Function, FunctionArg, FunctionArgExpr,
    FunctionArguments, GroupByExpr, Ident, JoinOperator, ObjectName, ObjectNamePart, Query, Select,
    SelectItem, SelectItemQualifiedWildcardKind, Set, SetExpr, Statement as SQLStatement,
    TableFactor, Value, Visit, Visitor, VisitorMut,
};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser as SqlParser;

use super::pg_catalog::{
    PG_CATALOG, has_column, is_always_empty, is_null_array_column, is_system_table, oid_of,
    type_oid,
};
use crate::session::Output;
use crate::sql::{Statement, visit_sql_mut};

/// The PostgreSQL settings clients read or set, with the values floe answers.
pub const PG_SETTINGS: &[(&str, &str)] = &[
    ("server_version", "16.6"),
    ("server_version_num", "160006"),
    ("server_encoding", "UTF8"),
    ("client_encoding", "UTF8"),
    ("DateStyle", "ISO, MDY"),
    ("IntervalStyle", "postgres"),
    ("TimeZone", "UTC"),
    ("integer_datetimes", "on"),
    ("standard_conforming_strings", "on"),
    ("search_path", "\"$user\", public"),
    ("transaction_isolation", "read committed"),
    ("default_transaction_isolation", "read committed"),
    ("transaction_read_only", "off"),
    ("default_transaction_read_only", "off"),
    ("application_name", ""),
    ("extra_float_digits", "1"),
    ("max_identifier_length", "63"),
    ("is_superuser", "on"),
    ("lc_collate", "C"),
    ("lc_ctype", "C"),
    ("bytea_output", "hex"),
    ("client_min_messages", "notice"),
    ("statement_timeout", "0"),
    ("lock_timeout", "0"),
    ("idle_in_transaction_session_timeout", "0"),
    ("geqo", "on"),
    ("jit", "off"),
];

/// The value of PostgreSQL setting `name` (any case).
fn setting(name: &str) -> Option<&'static str> {
    PG_SETTINGS
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| *v)
}

/// What a statement is rewritten against: the connection's session as PostgreSQL names it.
pub struct Context {
    /// The catalog whose schema `pg_catalog` holds the system tables.
    pub home: String,
    /// The current catalog (PostgreSQL's database) and schema.
    pub database: String,
    pub schema: String,
    /// The user the client logged in as.
    pub user: String,
}

/// The schema `SET search_path TO a, b` names first (`"$user"` skipped): the one unqualified
/// names resolve in, as floe's default schema.
pub fn search_path(stmt: &Statement) -> Option<String> {
    let Statement::DataFusion(s) = stmt else {
        return None;
    };
    let DFStatement::Statement(s) = s.as_ref() else {
        return None;
    };
    let SQLStatement::Set(Set::SingleAssignment {
        variable, values, ..
    }) = s.as_ref()
    else {
        return None;
    };
    if !variable.to_string().eq_ignore_ascii_case("search_path") {
        return None;
    }
    values
        .iter()
        .flat_map(|v| match v {
            Expr::Value(_) => string_literal(v)
                .map(|s| s.split(',').map(|p| p.trim().to_string()).collect())
                .unwrap_or_default(),
            Expr::Identifier(i) => vec![i.value.clone()],
            other => vec![other.to_string()],
        })
        .map(|s| s.trim_matches('"').to_string())
        .find(|s| !s.is_empty() && s != "$user")
}

/// The answer to a session statement a PostgreSQL driver sends and floe has no use for:
/// `SET` of a PostgreSQL setting (accepted, no effect), `SHOW` of one (`search_path` is the
/// current schema), `SET TRANSACTION`. `None`: the statement is floe's to run.
pub fn session_answer(stmt: &Statement, cx: &Context) -> Option<Output> {
    let Statement::DataFusion(s) = stmt else {
        return None;
    };
    let DFStatement::Statement(s) = s.as_ref() else {
        return None;
    };
    match s.as_ref() {
        SQLStatement::Set(Set::SingleAssignment { variable, .. }) => {
            let name = variable.to_string().trim_matches(['\'', '"']).to_string();
            setting(&name).map(|_| Output::Done("SET".into()))
        }
        SQLStatement::Set(
            Set::SetTransaction { .. } | Set::SetTimeZone { .. } | Set::SetNames { .. },
        ) => Some(Output::Done("SET".into())),
        SQLStatement::ShowVariable { variable } => {
            let words: Vec<String> = variable.iter().map(|i| i.value.to_lowercase()).collect();
            let name = words.join(" ");
            let (column, value) = match name.as_str() {
                "transaction isolation level" => ("transaction_isolation", "read committed"),
                "search_path" => ("search_path", cx.schema.as_str()),
                _ => (
                    PG_SETTINGS
                        .iter()
                        .find(|(k, _)| k.eq_ignore_ascii_case(&name))
                        .map(|(k, _)| *k)?,
                    setting(&name)?,
                ),
            };
            crate::session::string_rows(&[column], vec![vec![value.to_string()]]).ok()
        }
        _ => None,
    }
}

/// Rewrite a client's statement into what DataFusion plans (see the module doc).
pub fn rewrite(stmt: &mut Statement, cx: &Context) {
    let Statement::DataFusion(s) = stmt else {
        return;
    };
    visit_sql_mut(s, &mut Rewriter { cx });
}

struct Rewriter<'a> {
    cx: &'a Context,
}

/// The parts of a name, lower-cased unless quoted, as DataFusion resolves them.
fn parts(name: &ObjectName) -> Vec<String> {
    name.0
        .iter()
        .map(|p| match p {
            ObjectNamePart::Identifier(i) if i.quote_style.is_some() => i.value.clone(),
            ObjectNamePart::Identifier(i) => i.value.to_lowercase(),
            other => other.to_string(),
        })
        .collect()
}

fn name_of(parts: &[&str]) -> ObjectName {
    ObjectName::from(
        parts
            .iter()
            .map(|p| Ident::with_quote('"', *p))
            .collect::<Vec<_>>(),
    )
}

/// An expression floe writes itself (literals, calls), parsed.
fn expr(sql: &str) -> Expr {
    SqlParser::new(&GenericDialect {})
        .try_with_sql(sql)
        .and_then(|mut p| p.parse_expr())
        .unwrap_or_else(|_| Expr::value(Value::Null))
}

fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

fn string_literal(e: &Expr) -> Option<&str> {
    match e {
        Expr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) | Value::EscapedStringLiteral(s) => Some(s),
            _ => None,
        },
        _ => None,
    }
}

impl Rewriter<'_> {
    /// The oid of the relation a `regclass` literal names, resolved as DataFusion would.
    fn relation_oid(&self, name: &str) -> i64 {
        let parts: Vec<String> = name
            .split('.')
            .map(|p| {
                if p.starts_with('"') {
                    p.trim_matches('"').to_string()
                } else {
                    p.to_lowercase()
                }
            })
            .collect();
        let cx = self.cx;
        match parts.as_slice() {
            [t] if is_system_table(t) => oid_of(&format!("{PG_CATALOG}.{t}")),
            [s, t] if s == PG_CATALOG => oid_of(&format!("{PG_CATALOG}.{t}")),
            [t] => oid_of(&format!("{}.{}.{t}", cx.database, cx.schema)),
            [s, t] => oid_of(&format!("{}.{s}.{t}", cx.database)),
            _ => oid_of(&parts.join(".")),
        }
    }

    /// The values of the functions that only read the session.
    fn session_value(&self, name: &str, f: &Function) -> Option<Expr> {
        let cx = self.cx;
        Some(match name {
            "current_database" | "current_catalog" => expr(&quoted(&cx.database)),
            "current_schema" => expr(&quoted(&cx.schema)),
            "current_user" | "session_user" | "user" | "current_role" | "getpgusername" => {
                expr(&quoted(&cx.user))
            }
            "version" => expr(&quoted(&format!(
                "PostgreSQL 16.6 (floe {} on Apache DataFusion)",
                env!("CARGO_PKG_VERSION")
            ))),
            "pg_backend_pid" => expr(&std::process::id().to_string()),
            "current_schemas" => expr(&format!(
                "make_array({}, {})",
                quoted(PG_CATALOG),
                quoted(&cx.schema)
            )),
            "current_setting" => {
                let FunctionArguments::List(list) = &f.args else {
                    return None;
                };
                let arg = list.args.first()?.to_string();
                let value = setting(arg.trim_matches('\''));
                expr(&value.map(quoted).unwrap_or_else(|| "NULL".into()))
            }
            _ => return None,
        })
    }

    /// A cast to a PostgreSQL type DataFusion lacks.
    fn cast(&self, inner: &Expr, ty: &SqlType) -> Option<Expr> {
        if let SqlType::Array(_) = ty
            && let Some(text) = string_literal(inner)
            && let Some(items) = text.strip_prefix('{').and_then(|t| t.strip_suffix('}'))
        {
            // PostgreSQL's array text: '{a,b,"c d"}'.
            let values: Vec<String> = items
                .split(',')
                .map(|v| v.trim().trim_matches('"'))
                .filter(|v| !v.is_empty())
                .map(quoted)
                .collect();
            return Some(expr(&format!("make_array({})", values.join(", "))));
        }
        let name = match ty {
            SqlType::Regclass => "regclass".to_string(),
            SqlType::Custom(name, _) => {
                let p = parts(name);
                match p.as_slice() {
                    [s, t] if s == PG_CATALOG => t.clone(),
                    [t] => t.clone(),
                    _ => return None,
                }
            }
            _ => return None,
        };
        let as_type = |t: &str| expr(&format!("CAST(({inner}) AS {t})"));
        Some(match name.as_str() {
            "regclass" => match string_literal(inner) {
                Some(s) => expr(&self.relation_oid(s).to_string()),
                None => as_type("BIGINT"),
            },
            "regtype" => match string_literal(inner) {
                Some(s) => expr(&type_oid(s).unwrap_or(0).to_string()),
                None => expr(&format!("format_type(({inner}), NULL)")),
            },
            "regproc" | "regprocedure" => match string_literal(inner) {
                Some(s) => expr(&quoted(s.rsplit('.').next().unwrap_or(s))),
                None => as_type("TEXT"),
            },
            "regnamespace" => match string_literal(inner) {
                Some(s) if s == PG_CATALOG => expr(&oid_of(PG_CATALOG).to_string()),
                Some(s) => expr(&oid_of(&format!("{}.{s}", self.cx.database)).to_string()),
                None => as_type("BIGINT"),
            },
            "oid" | "regrole" | "xid" | "cid" | "tid" => as_type("BIGINT"),
            "text" | "name" | "char" | "bpchar" | "unknown" => as_type("TEXT"),
            "varchar" => as_type("VARCHAR"),
            "int2" => as_type("SMALLINT"),
            "int4" | "integer" => as_type("INT"),
            "int8" | "bigint" => as_type("BIGINT"),
            "bool" | "boolean" => as_type("BOOLEAN"),
            "float4" => as_type("REAL"),
            "float8" => as_type("DOUBLE"),
            _ => return None,
        })
    }
}

/// Aggregate functions: a scalar subquery selecting one already returns one row.
const AGGREGATES: &[&str] = &[
    "count",
    "sum",
    "min",
    "max",
    "avg",
    "array_agg",
    "string_agg",
    "bool_and",
    "bool_or",
    "every",
];

/// Whether `query` returns no rows because it joins a system table that never has any
/// (one of its FROM items, or inner-joined to one).
fn reads_nothing(query: &Query) -> bool {
    selects_nothing(&query.body)
}

/// Whether a SELECT returns no rows as [`reads_nothing`] says; a set operation, whether
/// both sides do.
fn selects_nothing(body: &SetExpr) -> bool {
    match body {
        SetExpr::Select(select) => select_reads_nothing(select),
        SetExpr::SetOperation { left, right, .. } => {
            selects_nothing(left) && selects_nothing(right)
        }
        SetExpr::Query(q) => reads_nothing(q),
        _ => false,
    }
}

/// Apply `f` to each SELECT of `body` (both sides of a set operation).
fn each_select(body: &mut SetExpr, f: &mut impl FnMut(&mut Select)) {
    match body {
        SetExpr::Select(select) => f(select),
        SetExpr::SetOperation { left, right, .. } => {
            each_select(left, f);
            each_select(right, f);
        }
        _ => {}
    }
}

/// [`selects_nothing`] of one SELECT.
fn select_reads_nothing(select: &Select) -> bool {
    // unnest(c.reloptions): an array floe never fills.
    let null_array = |e: &Expr| match e {
        Expr::CompoundIdentifier(p) => p.last().is_some_and(|i| is_null_array_column(&i.value)),
        Expr::Identifier(i) => is_null_array_column(&i.value),
        _ => false,
    };
    let empty = |factor: &TableFactor| match factor {
        TableFactor::Table {
            name,
            args: Some(args),
            ..
        } => {
            parts(name).last().is_some_and(|n| n == "unnest")
                && args.args.len() == 1
                && matches!(&args.args[0], FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) if null_array(e))
        }
        TableFactor::Table { name, .. } => {
            let p = parts(name);
            p.len() == 3 && p[1] == PG_CATALOG && is_always_empty(&p[2])
        }
        TableFactor::UNNEST { array_exprs, .. } => {
            array_exprs.len() == 1 && null_array(&array_exprs[0])
        }
        _ => false,
    };
    // Aggregates over no rows still return one (count(*) is 0), unless grouped.
    let grouped = match &select.group_by {
        GroupByExpr::Expressions(e, _) => !e.is_empty(),
        GroupByExpr::All(_) => true,
    };
    if !grouped && (select.having.is_some() || aggregates(&select.projection)) {
        return false;
    }
    select.from.iter().any(|t| {
        empty(&t.relation)
            || t.joins.iter().any(|j| {
                empty(&j.relation)
                    && matches!(
                        j.join_operator,
                        JoinOperator::Inner(_) | JoinOperator::Join(_) | JoinOperator::CrossJoin(_)
                    )
            })
    })
}

/// Whether `projection` calls an aggregate function (outside any subquery of its own).
fn aggregates(projection: &[SelectItem]) -> bool {
    struct Finder {
        depth: usize,
    }
    impl Visitor for Finder {
        type Break = ();
        fn pre_visit_query(&mut self, _: &Query) -> ControlFlow<()> {
            self.depth += 1;
            ControlFlow::Continue(())
        }
        fn post_visit_query(&mut self, _: &Query) -> ControlFlow<()> {
            self.depth -= 1;
            ControlFlow::Continue(())
        }
        fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<()> {
            match e {
                Expr::Function(f)
                    if self.depth == 0
                        && parts(&f.name)
                            .last()
                            .is_some_and(|n| AGGREGATES.contains(&n.as_str())) =>
                {
                    ControlFlow::Break(())
                }
                _ => ControlFlow::Continue(()),
            }
        }
    }
    projection
        .iter()
        .any(|item| item.visit(&mut Finder { depth: 0 }).is_break())
}

/// `ARRAY(SELECT e ...)` as `(SELECT array_agg(e) ...)`.
fn array_aggregated(query: &mut Query) {
    if let SetExpr::Select(select) = query.body.as_mut()
        && let [SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. }] =
            select.projection.as_mut_slice()
    {
        *e = expr(&format!("array_agg({e})"));
    }
}

/// A scalar subquery of the system tables selecting one expression without aggregating,
/// its expression in `max(...)` (see the module doc). Subqueries of other tables are left
/// as they are: DataFusion's own rules apply to them.
fn aggregated(query: &mut Query) {
    if query.limit_clause.is_some() {
        return;
    }
    let SetExpr::Select(select) = query.body.as_mut() else {
        return;
    };
    let system = |factor: &TableFactor| matches!(factor, TableFactor::Table { name, .. } if parts(name).get(1).is_some_and(|s| s == PG_CATALOG));
    let only_system = select
        .from
        .iter()
        .all(|t| system(&t.relation) && t.joins.iter().all(|j| system(&j.relation)));
    if select.from.is_empty() || !only_system {
        return;
    }
    let grouped = match &select.group_by {
        GroupByExpr::Expressions(e, _) => !e.is_empty(),
        GroupByExpr::All(_) => true,
    };
    if grouped || select.projection.len() != 1 {
        return;
    }
    let (SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. }) =
        &mut select.projection[0]
    else {
        return;
    };
    if let Expr::Function(f) = e
        && let Some(name) = parts(&f.name).last()
        && AGGREGATES.contains(&name.as_str())
    {
        return;
    }
    *e = expr(&format!("max({e})"));
}

/// `SELECT n.oid, n.* FROM pg_namespace n`: a system table's column named beside its
/// wildcard is taken out (the wildcard has it; DataFusion refuses two columns of one name).
fn unshadowed(select: &mut Select) {
    // What each name in FROM stands for, when it is a system table.
    let mut system = std::collections::HashMap::new();
    for t in &select.from {
        for factor in std::iter::once(&t.relation).chain(t.joins.iter().map(|j| &j.relation)) {
            if let TableFactor::Table { name, alias, .. } = factor {
                let p = parts(name);
                if p.len() == 3 && p[1] == PG_CATALOG {
                    let key = alias
                        .as_ref()
                        .map_or(p[2].clone(), |a| a.name.value.clone());
                    system.insert(key, p[2].clone());
                }
            }
        }
    }
    let wildcards: Vec<String> = select
        .projection
        .iter()
        .filter_map(|item| match item {
            SelectItem::QualifiedWildcard(SelectItemQualifiedWildcardKind::ObjectName(n), _) => {
                parts(n).last().cloned()
            }
            _ => None,
        })
        .collect();
    select.projection.retain(|item| match item {
        SelectItem::UnnamedExpr(Expr::CompoundIdentifier(p)) if p.len() == 2 => {
            let (qualifier, column) = (&p[0].value, &p[1].value);
            !(wildcards.contains(qualifier)
                && system
                    .get(qualifier)
                    .is_some_and(|table| has_column(table, column)))
        }
        _ => true,
    });
}

/// A query over a table that never has rows, its columns and filter made plain: nothing
/// of them is ever evaluated, and what PostgreSQL allows there DataFusion may not plan.
fn emptied(select: &mut Select) {
    if !select_reads_nothing(select) {
        return;
    }
    let mut taken = std::collections::HashSet::new();
    for (i, item) in select.projection.iter_mut().enumerate() {
        let mut alias = match item {
            SelectItem::UnnamedExpr(Expr::Identifier(i)) => i.clone(),
            SelectItem::UnnamedExpr(Expr::CompoundIdentifier(parts)) => match parts.last() {
                Some(i) => i.clone(),
                None => continue,
            },
            SelectItem::UnnamedExpr(_) => Ident::with_quote('"', "?column?"),
            SelectItem::ExprWithAlias { alias, .. } => alias.clone(),
            _ => continue,
        };
        // DataFusion wants the names apart; PostgreSQL does not.
        if !taken.insert(alias.value.clone()) {
            alias = Ident::with_quote('"', format!("{}_{}", alias.value, i + 1));
        }
        *item = SelectItem::ExprWithAlias {
            expr: Expr::value(Value::Null),
            alias,
        };
    }
    select.selection = None;
}

impl VisitorMut for Rewriter<'_> {
    type Break = ();

    fn post_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        each_select(&mut query.body, &mut unshadowed);
        if reads_nothing(query) {
            // No rows to order; the order may name columns `emptied` made NULL.
            query.order_by = None;
        }
        each_select(&mut query.body, &mut emptied);
        ControlFlow::Continue(())
    }

    fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
        if let TableFactor::Table { name, args, .. } = factor
            && args.is_some()
            && parts(name).last().is_some_and(|n| is_system_table(n))
        {
            *name = name_of(&[
                self.cx.home.as_str(),
                PG_CATALOG,
                &parts(name)[parts(name).len() - 1],
            ]);
            *args = None;
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_relation(&mut self, relation: &mut ObjectName) -> ControlFlow<()> {
        let p = parts(relation);
        let home = self.cx.home.as_str();
        match p.as_slice() {
            [s, t] if s == PG_CATALOG && is_system_table(t) => {
                *relation = name_of(&[home, PG_CATALOG, t]);
            }
            // A table function named with its schema (pg_catalog.unnest(...)).
            [s, t] if s == PG_CATALOG => *relation = name_of(&[t]),
            [t] if is_system_table(t) => *relation = name_of(&[home, PG_CATALOG, t]),
            _ => {}
        }
        ControlFlow::Continue(())
    }

    fn post_visit_expr(&mut self, e: &mut Expr) -> ControlFlow<()> {
        let replacement = match e {
            Expr::Function(f) => {
                let p = parts(&f.name);
                let last = p.last().cloned().unwrap_or_default();
                if p.len() == 2 && p[0] == PG_CATALOG {
                    // Built-in functions are DataFusion's or floe's, never schema-qualified.
                    f.name = ObjectName::from(vec![Ident::new(last.clone())]);
                }
                match &mut f.args {
                    FunctionArguments::Subquery(q) if last == "array" => {
                        Some(if reads_nothing(q) {
                            Expr::value(Value::Null)
                        } else {
                            array_aggregated(q);
                            Expr::Subquery(q.clone())
                        })
                    }
                    _ if p.len() <= 2 => self.session_value(&last, f),
                    _ => None,
                }
            }
            Expr::Collate { expr: inner, .. } => Some((**inner).clone()),
            Expr::BinaryOp {
                left,
                op: BinaryOperator::PGCustomBinaryOperator(names),
                right,
            } => {
                let op = match names.last().map(String::as_str) {
                    Some("~") => BinaryOperator::PGRegexMatch,
                    Some("~*") => BinaryOperator::PGRegexIMatch,
                    Some("!~") => BinaryOperator::PGRegexNotMatch,
                    Some("!~*") => BinaryOperator::PGRegexNotIMatch,
                    Some("~~") => BinaryOperator::PGLikeMatch,
                    Some("!~~") => BinaryOperator::PGNotLikeMatch,
                    Some("=") => BinaryOperator::Eq,
                    Some("<>") => BinaryOperator::NotEq,
                    Some("<") => BinaryOperator::Lt,
                    Some(">") => BinaryOperator::Gt,
                    Some("<=") => BinaryOperator::LtEq,
                    Some(">=") => BinaryOperator::GtEq,
                    _ => return ControlFlow::Continue(()),
                };
                Some(Expr::BinaryOp {
                    left: left.clone(),
                    op,
                    right: right.clone(),
                })
            }
            Expr::Cast {
                kind: CastKind::DoubleColon | CastKind::Cast,
                expr: inner,
                data_type,
                ..
            } => self.cast(inner, data_type),
            Expr::AllOp {
                left,
                compare_op: BinaryOperator::NotEq,
                right,
            } if !matches!(**right, Expr::Subquery(_)) => {
                Some(expr(&format!("NOT array_has({right}, {left})")))
            }
            Expr::Subquery(query) if reads_nothing(query) => Some(Expr::value(Value::Null)),
            Expr::Exists { subquery, negated } if reads_nothing(subquery) => {
                Some(Expr::value(Value::Boolean(*negated)))
            }
            Expr::Subquery(query) => {
                aggregated(query);
                None
            }
            _ => None,
        };
        if let Some(r) = replacement {
            *e = r;
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::parse_sql;

    fn rewritten(sql: &str) -> String {
        let mut stmt = parse_sql(sql).expect("parses").remove(0);
        let cx = Context {
            home: "datafusion".into(),
            database: "lake".into(),
            schema: "public".into(),
            user: "floe".into(),
        };
        rewrite(&mut stmt, &cx);
        stmt.to_string()
    }

    #[test]
    fn psql_describe_becomes_plannable() {
        let sql = rewritten(
            "SELECT c.oid, n.nspname, c.relname FROM pg_catalog.pg_class c \
             LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.relname OPERATOR(pg_catalog.~) '^(orders)$' COLLATE pg_catalog.default \
             AND pg_catalog.pg_table_is_visible(c.oid) ORDER BY 2, 3",
        );
        assert!(
            sql.contains(r#""datafusion"."pg_catalog"."pg_class""#),
            "{sql}"
        );
        assert!(sql.contains("c.relname ~ '^(orders)$'"), "{sql}");
        assert!(!sql.contains("COLLATE"), "{sql}");
        assert!(sql.contains("pg_table_is_visible(c.oid)"), "{sql}");
        assert!(!sql.contains("pg_catalog.pg_table_is_visible"), "{sql}");
    }

    #[test]
    fn casts_and_session_functions_become_values() {
        let sql = rewritten(
            "SELECT 'pg_class'::regclass, 'sales.orders'::regclass, x::regtype::pg_catalog.text, \
             current_database(), current_user FROM t",
        );
        assert!(sql.contains("1259"), "{sql}");
        assert!(
            sql.contains(&oid_of("lake.sales.orders").to_string()),
            "{sql}"
        );
        assert!(sql.contains("format_type((x), NULL)"), "{sql}");
        assert!(sql.contains("'lake'"), "{sql}");
        assert!(sql.contains("'floe'"), "{sql}");
    }

    #[test]
    fn scalar_subqueries_aggregate() {
        let sql = rewritten(
            "SELECT (SELECT d.adbin FROM pg_attrdef d WHERE d.adrelid = a.attrelid), \
             (SELECT count(*) FROM pg_attrdef) FROM pg_attribute a",
        );
        assert!(
            sql.starts_with("SELECT NULL, (SELECT count(*) FROM"),
            "{sql}"
        );
        let sql = rewritten(
            "SELECT (SELECT t.typname FROM pg_type t WHERE t.oid = a.atttypid), \
             EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = a.attrelid) FROM pg_attribute a",
        );
        assert!(sql.contains("SELECT max(t.typname) FROM"), "{sql}");
        assert!(sql.contains(", false FROM"), "{sql}");
        // Users' own subqueries are DataFusion's to plan.
        let sql =
            rewritten("SELECT (SELECT o.x FROM lake.s.t o WHERE o.id = a.id) FROM lake.s.u a");
        assert!(!sql.contains("max("), "{sql}");
    }

    #[test]
    fn queries_of_tables_without_rows_select_nulls() {
        let sql = rewritten(
            "SELECT pol.polname, CASE WHEN pol.polroles = '{0}' THEN 1 END AS roles, \
             array(select rolname from pg_roles) FROM pg_catalog.pg_policy pol \
             WHERE pol.polrelid = '1' ORDER BY 1",
        );
        assert!(
            sql.starts_with(r#"SELECT NULL AS polname, NULL AS roles, NULL AS "?column?" FROM"#),
            "{sql}"
        );
        assert!(!sql.contains("WHERE"), "{sql}");
    }

    #[test]
    fn arrays_of_subqueries_aggregate_or_are_null() {
        let sql = rewritten(
            "SELECT ARRAY(SELECT b.rolname FROM pg_roles b WHERE b.oid = r.oid), \
             array_to_string(c.reloptions || array(select 'toast.' || x from \
             pg_catalog.unnest(tc.reloptions) x), ', ') FROM pg_roles r, pg_class c, pg_class tc",
        );
        assert!(sql.contains("(SELECT array_agg(b.rolname) FROM"), "{sql}");
        assert!(sql.contains("c.reloptions || NULL"), "{sql}");
    }

    #[test]
    fn columns_beside_their_wildcard_and_array_texts() {
        let sql = rewritten(
            "SELECT n.oid, n.*, d.description FROM pg_namespace n \
             LEFT JOIN pg_description d ON d.objoid = n.oid WHERE x <> ALL ('{a,abs}'::text[])",
        );
        assert!(sql.starts_with("SELECT n.*, d.description FROM"), "{sql}");
        assert!(
            sql.contains("NOT array_has(make_array('a', 'abs'), x)"),
            "{sql}"
        );
    }

    #[test]
    fn driver_settings_are_answered() {
        let cx = Context {
            home: "datafusion".into(),
            database: "lake".into(),
            schema: "shop".into(),
            user: "floe".into(),
        };
        let parsed = |sql: &str| parse_sql(sql).expect("parses").remove(0);
        let set = parsed("SET extra_float_digits = 3");
        assert!(matches!(session_answer(&set, &cx), Some(Output::Done(t)) if t == "SET"));
        let show = parsed("SHOW TRANSACTION ISOLATION LEVEL");
        assert_eq!(session_answer(&show, &cx).map(|o| o.row_count()), Some(1));
        let floe = parsed("SET 'checkpoint.interval' = '1s'");
        assert!(session_answer(&floe, &cx).is_none());
        for (sql, schema) in [
            ("SET search_path TO shop, public", Some("shop")),
            ("SET search_path = '\"$user\", hr'", Some("hr")),
            ("SET extra_float_digits = 3", None),
        ] {
            assert_eq!(search_path(&parsed(sql)).as_deref(), schema, "{sql}");
        }
    }
}
