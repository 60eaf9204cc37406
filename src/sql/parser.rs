//! floe's SQL parser: DataFusion's [`DFParser`] plus floe's own statements.
//!
//! The parser looks at the first words of each statement; floe's statements (catalogs,
//! namespaces, Iceberg `CREATE TABLE`, `SHOW`, `DESCRIBE`) are parsed here with the
//! sqlparser primitives, everything else is handed to DataFusion unchanged.
//!
//! Time travel is accepted in both the Trino and the Spark spelling and rewritten into a
//! table name suffix that the catalog provider resolves (see [`crate::catalog`]):
//!
//! ```text
//! t FOR VERSION AS OF 123        t VERSION AS OF 123        -> t$version=123
//! t FOR TIMESTAMP AS OF '<ts>'   t TIMESTAMP AS OF '<ts>'   -> t$timestamp=<epoch millis>
//! t FOR SYSTEM_TIME AS OF '<ts>'
//! ```

use std::ops::ControlFlow;

use chrono::{DateTime, NaiveDate, NaiveDateTime};
use datafusion::sql::parser::{DFParser, DFParserBuilder, Statement as DFStatement};
use datafusion::sql::sqlparser::ast::{
    ColumnDef, ColumnOption, ColumnOptionDef, Expr as SqlExpr, Ident, ObjectName, ObjectNamePart,
    TableConstraint, TableFactor, VisitMut, VisitorMut,
};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::tokenizer::{Location, Token, TokenWithSpan, Tokenizer};

use super::statement::*;
use crate::error::{Error, Result};

static DIALECT: GenericDialect = GenericDialect {};

/// One statement of a script: its tokens and the line it starts on.
#[derive(Debug, Clone)]
pub struct ScriptStatement {
    /// 1-based line of the statement's first token.
    pub line: u64,
    tokens: Vec<TokenWithSpan>,
}

impl ScriptStatement {
    /// Parse this statement.
    pub fn parse(&self) -> Result<Statement> {
        parse_tokens(self.tokens.clone())
    }

    /// The statement's text as written (comments and spacing kept, no final `;`), for a
    /// server that parses it itself.
    pub fn text(&self) -> String {
        self.tokens.iter().map(|t| t.token.to_string()).collect()
    }

    /// How many parameters the statement takes: the highest `$n` placeholder in it.
    pub fn parameters(&self) -> usize {
        self.tokens
            .iter()
            .filter_map(|t| match &t.token {
                Token::Placeholder(p) => p.strip_prefix('$')?.parse::<usize>().ok(),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }

    /// This statement with each placeholder `$n` replaced by `values[n - 1]`, as a token of
    /// its own (a value can never become SQL). A placeholder without a value is an error.
    pub fn bind(&self, values: &[Literal]) -> Result<ScriptStatement> {
        let mut tokens = Vec::with_capacity(self.tokens.len());
        for t in &self.tokens {
            let Token::Placeholder(p) = &t.token else {
                tokens.push(t.clone());
                continue;
            };
            let n = p.strip_prefix('$').and_then(|n| n.parse::<usize>().ok());
            let Some(value) = n.and_then(|n| values.get(n.wrapping_sub(1))) else {
                return Err(Error::Plan(format!(
                    "placeholder {p} has no value: the statement was given {} parameter(s)",
                    values.len()
                )));
            };
            let at = |token: Token| TokenWithSpan::new(token, t.span);
            match value {
                Literal::Null => tokens.push(at(Token::make_keyword("NULL"))),
                Literal::Bool(b) => {
                    tokens.push(at(Token::make_keyword(if *b { "TRUE" } else { "FALSE" })))
                }
                Literal::Number(n) => {
                    let digits = n.strip_prefix('-');
                    let body = digits.unwrap_or(n);
                    let numeric = !body.is_empty()
                        && body.parse::<f64>().is_ok()
                        && body
                            .chars()
                            .all(|c| c.is_ascii_digit() || ".eE+-".contains(c));
                    if !numeric {
                        return Err(Error::Plan(format!("parameter {p}: '{n}' is not a number")));
                    }
                    tokens.push(at(Token::LParen));
                    if digits.is_some() {
                        tokens.push(at(Token::Minus));
                    }
                    tokens.push(at(Token::Number(body.to_string(), false)));
                    tokens.push(at(Token::RParen));
                }
                Literal::String(s) => tokens.push(at(Token::SingleQuotedString(s.clone()))),
            }
        }
        Ok(ScriptStatement {
            line: self.line,
            tokens,
        })
    }
}

/// A parameter's value, bound into a statement ([`ScriptStatement::bind`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Literal {
    Null,
    Bool(bool),
    /// A number as text (checked to be one when bound).
    Number(String),
    String(String),
}

/// Split a script into statements at top-level `;`, without parsing them, so that a
/// script can run statement by statement and report the line of the one that fails.
pub fn split_statements(sql: &str) -> Result<Vec<ScriptStatement>> {
    let tokens = tokenize(sql)?;
    let mut out = Vec::new();
    let mut current: Vec<TokenWithSpan> = Vec::new();
    let mut flush = |current: &mut Vec<TokenWithSpan>| {
        let first = current.iter().find(|t| !is_blank(&t.token));
        if let Some(first) = first {
            out.push(ScriptStatement {
                line: first.span.start.line,
                tokens: std::mem::take(current),
            });
        } else {
            current.clear();
        }
    };
    for t in tokens {
        if t.token == Token::SemiColon {
            flush(&mut current);
        } else {
            current.push(t);
        }
    }
    flush(&mut current);
    Ok(out)
}

/// Parse every statement in `sql`.
pub fn parse_sql(sql: &str) -> Result<Vec<Statement>> {
    split_statements(sql)?.iter().map(|s| s.parse()).collect()
}

/// Whether `sql` is a complete input for the REPL: it ends with `;` outside any string or
/// comment. A tokenizer error (an unterminated string, say) means more input is coming.
pub fn is_complete(sql: &str) -> bool {
    match Tokenizer::new(&DIALECT, sql).tokenize() {
        Ok(tokens) => tokens
            .iter()
            .rev()
            .find(|t| !is_blank(t))
            .is_some_and(|t| *t == Token::SemiColon),
        Err(_) => false,
    }
}

/// `sql` with the value of every secret option (`'sasl.password' = '...'`, see
/// [`crate::secret`]) and the password in every URL string replaced by `****`: statements as
/// they may be kept (the REPL's history). `None` when `sql` does not tokenize and names a
/// secret key: such text is not kept at all.
pub fn mask_secrets(sql: &str) -> Option<String> {
    let Ok(mut tokens) = Tokenizer::new(&DIALECT, sql).tokenize() else {
        let lower = sql.to_ascii_lowercase();
        let words = lower.split(|c: char| !c.is_ascii_alphanumeric() && c != '.' && c != '-');
        return (!words.clone().any(crate::secret::is_secret) && !lower.contains('@'))
            .then(|| sql.to_string());
    };
    let mut changed = false;
    let mut key: Option<String> = None;
    for i in 0..tokens.len() {
        let Token::SingleQuotedString(text) = &tokens[i] else {
            if !is_blank(&tokens[i]) && tokens[i] != Token::Eq {
                key = None;
            }
            continue;
        };
        // A string after `'key' =` is that option's value.
        let value_of = key.take();
        let masked = match &value_of {
            Some(k) if crate::secret::is_secret(k) => crate::secret::MASK.to_string(),
            _ => crate::secret::mask_url(text),
        };
        let next_is_eq = tokens[i + 1..]
            .iter()
            .find(|t| !is_blank(t))
            .is_some_and(|t| *t == Token::Eq);
        if value_of.is_none() && next_is_eq {
            key = Some(text.clone());
        }
        if masked != *text {
            tokens[i] = Token::SingleQuotedString(masked);
            changed = true;
        }
    }
    if !changed {
        return Some(sql.to_string());
    }
    // Strings written back quoted as typed (the tokenizer's own text does not double quotes).
    let text = |t: &Token| match t {
        Token::SingleQuotedString(s) => format!("'{}'", s.replace('\'', "''")),
        other => other.to_string(),
    };
    Some(tokens.iter().map(text).collect())
}

fn tokenize(sql: &str) -> Result<Vec<TokenWithSpan>> {
    Tokenizer::new(&DIALECT, sql)
        .tokenize_with_location()
        .map_err(|e| Error::Syntax(e.to_string()))
}

fn is_blank(t: &Token) -> bool {
    matches!(t, Token::Whitespace(_) | Token::EOF)
}

/// Where a top-level `ROUTE BY` starts in an `INSERT`, if it has one.
fn route_by_at(tokens: &[TokenWithSpan]) -> Option<usize> {
    let solid: Vec<usize> = (0..tokens.len())
        .filter(|&i| !is_blank(&tokens[i].token))
        .collect();
    let word = |i: usize| match &tokens[i].token {
        Token::Word(w) if w.quote_style.is_none() => Some(w.value.to_ascii_uppercase()),
        _ => None,
    };
    if word(*solid.first()?).as_deref() != Some("INSERT") {
        return None;
    }
    let mut depth = 0i32;
    for (k, &i) in solid.iter().enumerate() {
        match tokens[i].token {
            Token::LParen => depth += 1,
            Token::RParen => depth -= 1,
            _ => {}
        }
        if depth == 0
            && word(i).as_deref() == Some("ROUTE")
            && solid.get(k + 1).and_then(|&j| word(j)).as_deref() == Some("BY")
        {
            return Some(i);
        }
    }
    None
}

/// `INSERT INTO ns SELECT ... ROUTE BY expr [WITH (...)]`.
fn parse_routed_insert(tokens: Vec<TokenWithSpan>, at: usize) -> Result<Statement> {
    let (insert, rest) = tokens.split_at(at);
    let Statement::DataFusion(df) = parse_tokens(insert.to_vec())? else {
        return Err(Error::Syntax(
            "ROUTE BY follows INSERT INTO ... SELECT ...".into(),
        ));
    };
    let (namespace, query) = match *df {
        DFStatement::Statement(s) => match *s {
            datafusion::sql::sqlparser::ast::Statement::Insert(insert) => {
                let datafusion::sql::sqlparser::ast::TableObject::TableName(name) = insert.table
                else {
                    return Err(Error::Syntax(
                        "ROUTE BY needs INSERT INTO catalog.namespace".into(),
                    ));
                };
                if !insert.columns.is_empty() {
                    return Err(Error::Syntax(
                        "a routed INSERT takes no column list: the rows' columns name the \
                         tables' columns"
                            .into(),
                    ));
                }
                let query = insert.source.ok_or_else(|| {
                    Error::Syntax("ROUTE BY needs INSERT INTO ... SELECT ...".into())
                })?;
                (name, query)
            }
            _ => {
                return Err(Error::Syntax(
                    "ROUTE BY follows INSERT INTO ... SELECT ...".into(),
                ));
            }
        },
        _ => {
            return Err(Error::Syntax(
                "ROUTE BY follows INSERT INTO ... SELECT ...".into(),
            ));
        }
    };
    let df = DFParserBuilder::new(rest.to_vec())
        .with_dialect(&DIALECT)
        .build()?;
    let mut parser = Parser { df };
    parser.skip(2);
    let route = parser.df.parser.parse_expr()?;
    let options = parser.parse_with_options()?;
    let _ = parser.df.parser.consume_token(&Token::SemiColon);
    let next = parser.df.parser.peek_token();
    if next.token != Token::EOF {
        return Err(Error::Syntax(format!(
            "unexpected '{}' after ROUTE BY {route}: expected WITH (...) or the end of the \
             statement",
            next.token
        )));
    }
    Ok(Statement::RoutedInsert(Box::new(RoutedInsert {
        namespace,
        query,
        route,
        options,
    })))
}

fn parse_tokens(tokens: Vec<TokenWithSpan>) -> Result<Statement> {
    if let Some(at) = route_by_at(&tokens) {
        return parse_routed_insert(tokens, at);
    }
    let (tokens, marks) = extract_time_travel(tokens)?;
    let df = DFParserBuilder::new(tokens)
        .with_dialect(&DIALECT)
        .build()?;
    let mut parser = Parser { df };
    let mut stmt = parser.parse_statement()?;
    let _ = parser.df.parser.consume_token(&Token::SemiColon);
    let next = parser.df.parser.peek_token();
    if next.token != Token::EOF {
        return Err(Error::Syntax(format!(
            "unexpected '{}' at line {}, column {}: expected the end of the statement \
             (is a ';' missing?)",
            next.token, next.span.start.line, next.span.start.column
        )));
    }
    if !marks.is_empty() {
        apply_time_travel(&mut stmt, marks)?;
    }
    visit_queries_mut(&mut stmt, &mut super::windows::WindowRewriter);
    Ok(stmt)
}

/// floe's statement parser: a [`DFParser`] with floe's statements in front.
pub struct Parser<'a> {
    df: DFParser<'a>,
}

impl Parser<'_> {
    fn word(&self, n: usize) -> Option<String> {
        match self.df.parser.peek_nth_token(n).token {
            Token::Word(w) if w.quote_style.is_none() => Some(w.value.to_ascii_uppercase()),
            _ => None,
        }
    }

    fn words_are(&self, words: &[&str]) -> bool {
        words
            .iter()
            .enumerate()
            .all(|(i, w)| self.word(i).as_deref() == Some(*w))
    }

    fn skip(&mut self, n: usize) {
        for _ in 0..n {
            self.df.parser.next_token();
        }
    }

    fn is_schema_word(&self, n: usize) -> bool {
        matches!(
            self.word(n).as_deref(),
            Some("SCHEMA" | "NAMESPACE" | "DATABASE")
        )
    }

    /// `CALL` has been read: `procedure(arg, name => arg, ...)`.
    fn parse_call(&mut self) -> Result<Statement> {
        let procedure = self.df.parser.parse_object_name(false)?;
        self.df.parser.expect_token(&Token::LParen)?;
        let mut args = Vec::new();
        if !self.df.parser.consume_token(&Token::RParen) {
            loop {
                let name = match (
                    self.df.parser.peek_nth_token(0).token,
                    self.df.parser.peek_nth_token(1).token,
                ) {
                    (Token::Word(w), Token::RArrow) => {
                        self.skip(2);
                        Some(w.value.to_ascii_lowercase())
                    }
                    _ => None,
                };
                let value = self.df.parser.parse_expr()?;
                args.push(CallArg { name, value });
                if self.df.parser.consume_token(&Token::RParen) {
                    break;
                }
                self.df.parser.expect_token(&Token::Comma)?;
            }
        }
        Ok(Statement::Call(Call { procedure, args }))
    }

    /// Parse one statement.
    pub fn parse_statement(&mut self) -> Result<Statement> {
        if self.words_are(&["CREATE", "CATALOG"]) {
            self.skip(2);
            return self.parse_create_catalog();
        }
        if self.words_are(&["DROP", "CATALOG"]) {
            self.skip(2);
            let if_exists = self.parse_if_exists();
            let name = self.df.parser.parse_identifier()?.value;
            return Ok(Statement::DropCatalog(DropCatalog { name, if_exists }));
        }
        if self.words_are(&["SHOW", "CATALOGS"]) {
            self.skip(2);
            return Ok(Statement::ShowCatalogs);
        }
        if self.word(0).as_deref() == Some("CREATE") && self.is_schema_word(1) {
            self.skip(2);
            let if_not_exists = self.parse_if_not_exists();
            let name = self.df.parser.parse_object_name(false)?;
            let options = self.parse_with_options()?;
            return Ok(Statement::CreateSchema(CreateSchema {
                name,
                if_not_exists,
                options,
            }));
        }
        if self.word(0).as_deref() == Some("DROP") && self.is_schema_word(1) {
            self.skip(2);
            let if_exists = self.parse_if_exists();
            let name = self.df.parser.parse_object_name(false)?;
            return Ok(Statement::DropSchema(DropSchema { name, if_exists }));
        }
        if self.word(0).as_deref() == Some("SHOW")
            && matches!(
                self.word(1).as_deref(),
                Some("SCHEMAS" | "NAMESPACES" | "DATABASES")
            )
        {
            self.skip(2);
            let catalog = if self.parse_in_or_from() {
                Some(self.df.parser.parse_identifier()?.value)
            } else {
                None
            };
            return Ok(Statement::ShowSchemas(ShowSchemas { catalog }));
        }
        if self.words_are(&["SHOW", "TABLES"]) {
            self.skip(2);
            let namespace = if self.parse_in_or_from() {
                Some(self.df.parser.parse_object_name(false)?)
            } else {
                None
            };
            return Ok(Statement::ShowTables(ShowTables { namespace }));
        }
        if self.words_are(&["CREATE", "SOURCE"]) {
            self.skip(2);
            return self.parse_create_source();
        }
        if self.words_are(&["DROP", "SOURCE"]) {
            self.skip(2);
            let if_exists = self.parse_if_exists();
            let name = self.df.parser.parse_identifier()?.value;
            return Ok(Statement::DropSource(DropSource { name, if_exists }));
        }
        if self.words_are(&["SHOW", "SOURCES"]) {
            self.skip(2);
            return Ok(Statement::ShowSources);
        }
        if self.words_are(&["SHOW", "JOBS"]) {
            self.skip(2);
            return Ok(Statement::ShowJobs);
        }
        for verb in ["STOP", "RESUME", "RESTART"] {
            if !self.words_are(&[verb, "JOB"]) {
                continue;
            }
            self.skip(2);
            let t = self.df.parser.next_token();
            let name = match t.token {
                Token::SingleQuotedString(s) => s,
                Token::Word(w) => w.value,
                other => {
                    return Err(Error::Syntax(format!(
                        "{verb} JOB needs a job name in quotes, found '{other}'"
                    )));
                }
            };
            return Ok(match verb {
                "STOP" => Statement::StopJob(StopJob { name }),
                _ => Statement::ResumeJob(ResumeJob {
                    name,
                    restart: verb == "RESTART",
                }),
            });
        }
        if self.word(0).as_deref() == Some("CALL") {
            self.skip(1);
            return self.parse_call();
        }
        if matches!(self.word(0).as_deref(), Some("DESCRIBE" | "DESC"))
            && self.word(1).as_deref() == Some("SOURCE")
        {
            self.skip(2);
            let name = self.df.parser.parse_identifier()?.value;
            return Ok(Statement::DescribeSource(DescribeSource { name }));
        }
        if matches!(self.word(0).as_deref(), Some("DESCRIBE" | "DESC")) {
            self.skip(1);
            if self.word(0).as_deref() == Some("TABLE") {
                self.skip(1);
            }
            let name = self.df.parser.parse_object_name(false)?;
            return Ok(Statement::Describe(Describe { name }));
        }
        if self.words_are(&["CREATE", "TABLE"]) {
            self.skip(2);
            return self.parse_create_table();
        }
        if self.words_are(&["DROP", "TABLE"]) {
            self.skip(2);
            let if_exists = self.parse_if_exists();
            let name = self.df.parser.parse_object_name(false)?;
            return Ok(Statement::DropTable(DropTable { name, if_exists }));
        }
        let stmt = self.df.parse_statement()?;
        Ok(Statement::DataFusion(Box::new(stmt)))
    }

    fn parse_if_exists(&mut self) -> bool {
        self.df
            .parser
            .parse_keywords(&[Keyword::IF, Keyword::EXISTS])
    }

    fn parse_if_not_exists(&mut self) -> bool {
        self.df
            .parser
            .parse_keywords(&[Keyword::IF, Keyword::NOT, Keyword::EXISTS])
    }

    fn parse_in_or_from(&mut self) -> bool {
        self.df.parser.parse_keyword(Keyword::IN) || self.df.parser.parse_keyword(Keyword::FROM)
    }

    fn parse_create_catalog(&mut self) -> Result<Statement> {
        let if_not_exists = self.parse_if_not_exists();
        let name = self.df.parser.parse_identifier()?.value;
        let options = self.parse_with_options()?;
        if options.is_empty() {
            return Err(Error::Syntax(format!(
                "CREATE CATALOG {name} needs WITH ('type' = 'iceberg', 'catalog-type' = ..., ...)"
            )));
        }
        Ok(Statement::CreateCatalog(CreateCatalog {
            name,
            if_not_exists,
            options,
        }))
    }

    fn parse_create_source(&mut self) -> Result<Statement> {
        let if_not_exists = self.parse_if_not_exists();
        let name = self.df.parser.parse_identifier()?.value;
        let mut columns = Vec::new();
        let mut constraints = Vec::new();
        let mut watermark = None;
        if self.df.parser.consume_token(&Token::LParen) {
            loop {
                if matches!(self.word(0).as_deref(), Some("PRIMARY" | "CONSTRAINT")) {
                    constraints.extend(self.df.parser.parse_optional_table_constraint()?);
                } else if self.word(0).as_deref() == Some("WATERMARK") {
                    if watermark.is_some() {
                        return Err(Error::Syntax(format!(
                            "source {name} has two WATERMARK clauses"
                        )));
                    }
                    self.skip(1);
                    self.df.parser.expect_keyword(Keyword::FOR)?;
                    let column = self.df.parser.parse_identifier()?;
                    self.df.parser.expect_keyword(Keyword::AS)?;
                    let expr = self.df.parser.parse_expr()?;
                    watermark = Some(Watermark { column, expr });
                } else {
                    columns.push(self.df.parser.parse_column_def()?);
                }
                if !self.df.parser.consume_token(&Token::Comma) {
                    self.df.parser.expect_token(&Token::RParen)?;
                    break;
                }
            }
        }
        let options = self.parse_with_options()?;
        if options.is_empty() {
            return Err(Error::Syntax(format!(
                "CREATE SOURCE {name} needs WITH ('connector' = ..., ...)"
            )));
        }
        let (columns, primary_key) = primary_key_of(&name, columns, constraints)?;
        Ok(Statement::CreateSource(Box::new(CreateSource {
            name,
            if_not_exists,
            columns,
            primary_key,
            watermark,
            options,
        })))
    }

    fn parse_create_table(&mut self) -> Result<Statement> {
        let if_not_exists = self.parse_if_not_exists();
        let name = self.df.parser.parse_object_name(false)?;
        let (columns, primary_key) = if self.df.parser.peek_token().token == Token::LParen
            && !self.starts_query_in_parens()
        {
            let (columns, constraints) = self.df.parser.parse_columns()?;
            primary_key_of(&name, columns, constraints)?
        } else {
            (Vec::new(), Vec::new())
        };
        let mut partitioned_by = Vec::new();
        if self
            .df
            .parser
            .parse_keywords(&[Keyword::PARTITIONED, Keyword::BY])
        {
            self.df.parser.expect_token(&Token::LParen)?;
            partitioned_by = self.df.parser.parse_comma_separated(|p| p.parse_expr())?;
            self.df.parser.expect_token(&Token::RParen)?;
        }
        let options = self.parse_with_options()?;
        let query = if self.df.parser.parse_keyword(Keyword::AS) {
            Some(self.df.parser.parse_query()?)
        } else {
            None
        };
        if columns.is_empty() && query.is_none() {
            return Err(Error::Syntax(format!(
                "CREATE TABLE {name} needs a column list or AS SELECT ..."
            )));
        }
        Ok(Statement::CreateTable(Box::new(CreateTable {
            name,
            if_not_exists,
            columns,
            primary_key,
            partitioned_by,
            options,
            query,
        })))
    }

    /// `CREATE TABLE t (SELECT ...)` is not a column list.
    fn starts_query_in_parens(&self) -> bool {
        matches!(
            self.df.parser.peek_nth_token(1).token,
            Token::Word(ref w) if matches!(w.keyword, Keyword::SELECT | Keyword::WITH | Keyword::VALUES)
        )
    }

    /// `WITH ('k' = 'v', ...)`, or nothing.
    fn parse_with_options(&mut self) -> Result<OptionList> {
        let p = &mut self.df.parser;
        let with = matches!(p.peek_token().token, Token::Word(ref w) if w.keyword == Keyword::WITH);
        if !with || p.peek_nth_token(1).token != Token::LParen {
            return Ok(OptionList::default());
        }
        p.next_token();
        p.expect_token(&Token::LParen)?;
        let mut options = Vec::new();
        loop {
            if p.consume_token(&Token::RParen) {
                break;
            }
            let key = option_value(p.next_token(), "an option key such as 'type'")?;
            p.expect_token(&Token::Eq)?;
            let value = option_value(p.next_token(), "an option value in quotes")?;
            options.push((key, value));
            if !p.consume_token(&Token::Comma) {
                p.expect_token(&Token::RParen)?;
                break;
            }
        }
        Ok(OptionList(options))
    }
}

/// The columns of `CREATE TABLE name (...)` (or `CREATE SOURCE`) without their `PRIMARY
/// KEY` options (their columns made NOT NULL), and the key they or the table constraint
/// declare. Other constraints are refused: Iceberg tables have none.
fn primary_key_of(
    name: &dyn std::fmt::Display,
    mut columns: Vec<ColumnDef>,
    constraints: Vec<TableConstraint>,
) -> Result<(Vec<ColumnDef>, Vec<Ident>)> {
    let mut key: Option<Vec<Ident>> = None;
    let mut declare = |columns: Vec<Ident>, enforced: Option<bool>| {
        if enforced == Some(true) {
            return Err(Error::Unsupported(format!(
                "PRIMARY KEY ... ENFORCED on table {name}: floe keeps one row per key when it \
                 applies changes, but does not check ad-hoc INSERTs; declare it NOT ENFORCED"
            )));
        }
        if key.replace(columns).is_some() {
            return Err(Error::Syntax(format!(
                "table {name} declares two primary keys"
            )));
        }
        Ok(())
    };
    for c in &mut columns {
        let mut in_key = false;
        let mut enforced = None;
        c.options.retain(|o| match &o.option {
            ColumnOption::PrimaryKey(pk) => {
                in_key = true;
                enforced = pk.characteristics.and_then(|ch| ch.enforced);
                false
            }
            _ => true,
        });
        if in_key {
            declare(vec![c.name.clone()], enforced)?;
        }
    }
    for c in constraints {
        match c {
            TableConstraint::PrimaryKey(pk) => {
                let columns = pk
                    .columns
                    .iter()
                    .map(|ic| match &ic.column.expr {
                        SqlExpr::Identifier(id) => Ok(id.clone()),
                        other => Err(Error::Syntax(format!(
                            "primary key of table {name}: expected a column name, found '{other}'"
                        ))),
                    })
                    .collect::<Result<Vec<_>>>()?;
                declare(columns, pk.characteristics.and_then(|ch| ch.enforced))?;
            }
            other => {
                return Err(Error::Unsupported(format!(
                    "table constraint '{other}': Iceberg tables have no constraints besides \
                     NOT NULL on a column and a primary key (their identifier fields)"
                )));
            }
        }
    }
    let key = key.unwrap_or_default();
    for k in &key {
        let Some(c) = columns.iter_mut().find(|c| c.name.value == k.value) else {
            return Err(Error::Plan(format!(
                "primary key column '{k}' is not a column of table {name}"
            )));
        };
        c.options
            .retain(|o| !matches!(o.option, ColumnOption::Null));
        if !c
            .options
            .iter()
            .any(|o| matches!(o.option, ColumnOption::NotNull))
        {
            c.options.push(ColumnOptionDef {
                name: None,
                option: ColumnOption::NotNull,
            });
        }
    }
    Ok((columns, key))
}

/// An option key or value: a string literal; numbers and `true`/`false` are accepted too.
fn option_value(t: TokenWithSpan, what: &str) -> Result<String> {
    match t.token {
        Token::SingleQuotedString(s) | Token::DoubleQuotedString(s) => Ok(s),
        Token::Number(n, _) => Ok(n),
        Token::Word(w) if matches!(w.keyword, Keyword::TRUE | Keyword::FALSE) => {
            Ok(w.value.to_ascii_lowercase())
        }
        other => Err(Error::Syntax(format!(
            "expected {what}, found '{other}' at line {}, column {}",
            t.span.start.line, t.span.start.column
        ))),
    }
}

/// Which snapshot a time-travel clause selects.
#[derive(Debug, Clone, PartialEq)]
enum AsOf {
    Version(i64),
    TimestampMillis(i64),
}

/// A time-travel clause removed from the tokens, and the end of the table name before it.
#[derive(Debug)]
struct TimeTravelMark {
    table_end: Location,
    as_of: AsOf,
}

/// Remove `[FOR] {VERSION | TIMESTAMP | SYSTEM_TIME | SYSTEM_VERSION} AS OF <value>`
/// clauses that follow a name, returning the remaining tokens and what was removed.
fn extract_time_travel(
    tokens: Vec<TokenWithSpan>,
) -> Result<(Vec<TokenWithSpan>, Vec<TimeTravelMark>)> {
    let solid: Vec<usize> = (0..tokens.len())
        .filter(|&i| !is_blank(&tokens[i].token))
        .collect();
    let upper = |i: usize| -> Option<String> {
        match &tokens[*solid.get(i)?].token {
            Token::Word(w) if w.quote_style.is_none() => Some(w.value.to_ascii_uppercase()),
            _ => None,
        }
    };
    let mut drop = vec![false; tokens.len()];
    let mut marks = Vec::new();
    let mut i = 1;
    while i < solid.len() {
        let mut j = i;
        if upper(j).as_deref() == Some("FOR") {
            j += 1;
        }
        let kind = upper(j);
        let is_clause = matches!(
            kind.as_deref(),
            Some("VERSION" | "TIMESTAMP" | "SYSTEM_TIME" | "SYSTEM_VERSION")
        ) && upper(j + 1).as_deref() == Some("AS")
            && upper(j + 2).as_deref() == Some("OF")
            && matches!(tokens[solid[i - 1]].token, Token::Word(_));
        if !is_clause {
            i += 1;
            continue;
        }
        let mut v = j + 3;
        // Trino writes `FOR TIMESTAMP AS OF TIMESTAMP '...'`.
        if upper(v).as_deref() == Some("TIMESTAMP") {
            v += 1;
        }
        let Some(&value_at) = solid.get(v) else {
            return Err(Error::Syntax(format!(
                "{} AS OF needs a value",
                kind.unwrap_or_default()
            )));
        };
        let value = &tokens[value_at];
        let as_of = match (&value.token, kind.as_deref()) {
            (Token::Number(n, _), Some("VERSION" | "SYSTEM_VERSION")) => {
                AsOf::Version(n.parse().map_err(|_| {
                    Error::Syntax(format!("VERSION AS OF needs a snapshot id, got {n}"))
                })?)
            }
            (Token::SingleQuotedString(s), Some("TIMESTAMP" | "SYSTEM_TIME")) => {
                AsOf::TimestampMillis(parse_timestamp_millis(s)?)
            }
            (Token::Number(n, _), Some("TIMESTAMP" | "SYSTEM_TIME")) => {
                AsOf::TimestampMillis(n.parse().map_err(|_| {
                    Error::Syntax(format!("TIMESTAMP AS OF needs a timestamp, got {n}"))
                })?)
            }
            (other, _) => {
                return Err(Error::Syntax(format!(
                    "{} AS OF needs {}, found '{other}'",
                    kind.as_deref().unwrap_or_default(),
                    if matches!(kind.as_deref(), Some("VERSION" | "SYSTEM_VERSION")) {
                        "a snapshot id (a number)"
                    } else {
                        "a timestamp in quotes, such as '2024-05-01 12:00:00'"
                    }
                )));
            }
        };
        marks.push(TimeTravelMark {
            table_end: tokens[solid[i - 1]].span.end,
            as_of,
        });
        drop[solid[i]..=value_at].fill(true);
        i = v + 1;
    }
    let kept = tokens
        .into_iter()
        .zip(drop)
        .filter_map(|(t, d)| (!d).then_some(t))
        .collect();
    Ok((kept, marks))
}

/// `'2024-05-01'`, `'2024-05-01 12:00:00[.fff]'`, or RFC 3339 with an offset; without an
/// offset the time is UTC.
fn parse_timestamp_millis(s: &str) -> Result<i64> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.timestamp_millis());
    }
    for fmt in [
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%d %H:%M",
    ] {
        if let Ok(t) = NaiveDateTime::parse_from_str(s, fmt) {
            return Ok(t.and_utc().timestamp_millis());
        }
    }
    if let Ok(d) = NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        return Ok(d
            .and_hms_opt(0, 0, 0)
            .unwrap_or_default()
            .and_utc()
            .timestamp_millis());
    }
    Err(Error::Syntax(format!(
        "'{s}' is not a timestamp: write it as '2024-05-01 12:00:00' (UTC) or \
         '2024-05-01T12:00:00+02:00'"
    )))
}

struct TimeTravelRewriter {
    marks: Vec<TimeTravelMark>,
}

impl VisitorMut for TimeTravelRewriter {
    type Break = ();

    fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
        if let TableFactor::Table { name, .. } = factor
            && let Some(ObjectNamePart::Identifier(last)) = name.0.last_mut()
            && let Some(pos) = self.marks.iter().position(|m| m.table_end == last.span.end)
        {
            let mark = self.marks.remove(pos);
            // Quote the new name so that it prints back as SQL that parses; an unquoted
            // name is lower-cased first, as DataFusion would have.
            if last.quote_style.is_none() {
                last.value = last.value.to_lowercase();
                last.quote_style = Some('"');
            }
            last.value = with_time_travel_suffix(&last.value, &mark.as_of);
        }
        ControlFlow::Continue(())
    }
}

fn with_time_travel_suffix(table: &str, as_of: &AsOf) -> String {
    match as_of {
        AsOf::Version(id) => format!("{table}$version={id}"),
        AsOf::TimestampMillis(ms) => format!("{table}$timestamp={ms}"),
    }
}

/// Let `visitor` rewrite the SQL of a DataFusion statement (the explained one of an
/// `EXPLAIN`).
pub fn visit_sql_mut<V: VisitorMut>(stmt: &mut DFStatement, visitor: &mut V) {
    match stmt {
        DFStatement::Statement(s) => {
            let _ = s.visit(visitor);
        }
        DFStatement::Explain(e) => {
            if let DFStatement::Statement(s) = e.statement.as_mut() {
                let _ = s.visit(visitor);
            }
        }
        _ => {}
    }
}

/// Let `visitor` rewrite the SQL of a statement's queries.
fn visit_queries_mut<V: VisitorMut>(stmt: &mut Statement, visitor: &mut V) {
    match stmt {
        Statement::DataFusion(df) => visit_sql_mut(df, visitor),
        Statement::CreateTable(ct) => {
            if let Some(q) = ct.query.as_mut() {
                let _ = q.visit(visitor);
            }
        }
        _ => {}
    }
}

fn apply_time_travel(stmt: &mut Statement, marks: Vec<TimeTravelMark>) -> Result<()> {
    let mut rewriter = TimeTravelRewriter { marks };
    visit_queries_mut(stmt, &mut rewriter);
    if rewriter.marks.is_empty() {
        Ok(())
    } else {
        Err(Error::Syntax(
            "FOR VERSION AS OF / FOR TIMESTAMP AS OF must follow a table name in FROM".to_string(),
        ))
    }
}

/// The parts of an object name as plain strings (no quotes).
pub fn name_parts(name: &ObjectName) -> Result<Vec<String>> {
    name.0
        .iter()
        .map(|p| match p {
            ObjectNamePart::Identifier(i) => Ok(i.value.clone()),
            other => Err(Error::Syntax(format!("'{other}' is not a plain name"))),
        })
        .collect()
}

#[cfg(test)]
mod tests {

    fn bound(sql: &str, values: &[Literal]) -> Result<Statement> {
        let stmts = split_statements(sql).unwrap();
        stmts[0].bind(values)?.parse()
    }

    #[test]
    fn parameters_are_bound_as_values_never_as_sql() {
        let stmts = split_statements("SELECT * FROM t WHERE a = $2 AND b = $1").unwrap();
        assert_eq!(stmts[0].parameters(), 2);
        let got = bound(
            "SELECT * FROM t WHERE a = $1 AND b = $2 AND c = $3 AND d = $4",
            &[
                Literal::String("x' OR '1'='1".into()),
                Literal::Number("-5".into()),
                Literal::Null,
                Literal::Bool(true),
            ],
        )
        .unwrap();
        assert_eq!(
            got.to_string(),
            "SELECT * FROM t WHERE a = 'x'' OR ''1''=''1' AND b = (-5) AND c = NULL AND d = true"
        );
        assert!(
            bound("SELECT $1", &[Literal::Number("1; DROP TABLE t".into())])
                .unwrap_err()
                .to_string()
                .contains("is not a number")
        );
        assert!(
            bound("SELECT $2", &[Literal::Null])
                .unwrap_err()
                .to_string()
                .contains("placeholder $2 has no value")
        );
    }

    #[test]
    fn debug_of_a_statement_shows_no_secret() {
        let parsed = super::parse_sql(
            "CREATE CATALOG c WITH ('type' = 'iceberg', 'token' = 'pw5', \
             'uri' = 'postgres://u:pw6@h/db')",
        )
        .unwrap();
        let shown = format!("{parsed:?}");
        assert!(!shown.contains("pw5") && !shown.contains("pw6"), "{shown}");
        assert!(shown.contains("iceberg"), "{shown}");
    }

    #[test]
    fn statements_kept_have_no_secrets() {
        let sql = "CREATE CATALOG c WITH ('type' = 'iceberg',\n  'uri' = 'postgres://floe:pw1@h/db', \
                   's3.secret-access-key'='abc''d', 'sasl.jaas.config' = 'x password=\"p2\"')";
        let kept = super::mask_secrets(sql).unwrap();
        for secret in ["pw1", "abc", "p2"] {
            assert!(!kept.contains(secret), "{kept}");
        }
        assert!(
            kept.contains("'uri' = 'postgres://floe:****@h/db'")
                && kept.contains("'s3.secret-access-key'='****'")
                && kept.contains("'type' = 'iceberg',\n"),
            "{kept}"
        );
        // Other strings of a masked statement keep their quotes.
        let quoted = super::mask_secrets("WITH ('token' = 'x', 'note' = 'it''s')").unwrap();
        assert_eq!(quoted, "WITH ('token' = '****', 'note' = 'it''s')");
        // Nothing secret: kept as typed.
        let plain = "SET 'pipeline.name' = 'a';  -- note\nSELECT 'password'";
        assert_eq!(super::mask_secrets(plain).as_deref(), Some(plain));
        // Does not tokenize, and names a secret key: not kept.
        assert_eq!(super::mask_secrets("WITH ('sasl.password' = 'abc"), None);
        assert_eq!(
            super::mask_secrets("SELECT 'abc").as_deref(),
            Some("SELECT 'abc")
        );
    }

    use super::*;

    /// Parse, print, parse again: both parses must agree, as sqlparser's `verified_stmt`.
    fn round_trip(sql: &str) -> Statement {
        let first = parse_sql(sql).unwrap();
        assert_eq!(first.len(), 1, "{sql}");
        let printed = first[0].to_string();
        let second = parse_sql(&printed).unwrap_or_else(|e| panic!("{printed}: {e}"));
        assert_eq!(first, second, "printed as: {printed}");
        first.into_iter().next().unwrap()
    }

    #[test]
    fn floe_statements_round_trip() {
        for sql in [
            "CREATE CATALOG lake WITH ('type' = 'iceberg', 'catalog-type' = 'sql')",
            "CREATE CATALOG IF NOT EXISTS lake WITH ('type' = 'iceberg')",
            "DROP CATALOG IF EXISTS lake",
            "SHOW CATALOGS",
            "CREATE SCHEMA IF NOT EXISTS lake.ns",
            "CREATE NAMESPACE lake.ns WITH ('owner' = 'me')",
            "DROP SCHEMA lake.ns",
            "SHOW SCHEMAS IN lake",
            "SHOW NAMESPACES",
            "SHOW TABLES FROM lake.ns",
            "DESCRIBE lake.ns.t",
            "CREATE TABLE lake.ns.t (id BIGINT NOT NULL, ts TIMESTAMP, s VARCHAR) \
             PARTITIONED BY (days(ts), bucket(16, id), truncate(4, s), s) \
             WITH ('format-version' = '2')",
            "CREATE TABLE IF NOT EXISTS lake.ns.t2 AS SELECT 1 AS a",
            "DROP TABLE IF EXISTS lake.ns.t",
            "SELECT * FROM lake.ns.t WHERE id > 3",
            "INSERT INTO lake.ns.t VALUES (1, NULL, 'x')",
            "CREATE SOURCE IF NOT EXISTS s (id BIGINT, name STRING) WITH ('connector' = 'datagen')",
            "CREATE SOURCE o WITH ('connector' = 'datagen', 'profile' = 'orders')",
            "CREATE SOURCE c (user_id BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '5' SECOND) \
             WITH ('connector' = 'datagen')",
            "DROP SOURCE IF EXISTS s",
            "SHOW SOURCES",
            "DESCRIBE SOURCE s",
            "SHOW JOBS",
            "STOP JOB 'orders-to-lake'",
            "RESUME JOB 'orders-to-lake'",
            "RESTART JOB 'orders-to-lake'",
            "CALL lake.system.rewrite_data_files(table => 'ns.t', min_input_files => 2)",
            "CALL system.expire_snapshots('ns.t', TIMESTAMP '2026-01-01 00:00:00')",
            "CALL lake.system.rewrite_manifests()",
            "INSERT INTO lake.analytics SELECT * FROM events ROUTE BY event_type",
            "INSERT INTO lake.a SELECT *, CAST(ts AS DATE) AS d FROM e WHERE x > 1 \
             ROUTE BY lower(kind) WITH ('partition.candidates' = 'd, region')",
        ] {
            round_trip(sql);
        }
    }

    #[test]
    fn create_table_parts() {
        let Statement::CreateTable(ct) = round_trip(
            "create table if not exists a.b.c (x int) partitioned by (hours(x)) with ('k'='v')",
        ) else {
            panic!("not a CREATE TABLE")
        };
        assert!(ct.if_not_exists);
        assert_eq!(ct.columns.len(), 1);
        assert_eq!(ct.partitioned_by.len(), 1);
        assert_eq!(ct.options.0, vec![("k".to_string(), "v".to_string())]);
    }

    #[test]
    fn scripts_split_with_lines() {
        let s = split_statements("SELECT 1;\n\n-- c\nSELECT ';';\n  SELECT 3").unwrap();
        assert_eq!(s.iter().map(|s| s.line).collect::<Vec<_>>(), vec![1, 4, 5]);
        assert!(split_statements(";;  ;").unwrap().is_empty());
    }

    #[test]
    fn completeness() {
        assert!(is_complete("SELECT 1;"));
        assert!(is_complete("SELECT 1; -- done"));
        assert!(!is_complete("SELECT 1"));
        assert!(!is_complete("SELECT ';"));
        assert!(!is_complete(""));
    }

    #[test]
    fn time_travel_is_rewritten_in_both_spellings() {
        for (sql, suffix) in [
            ("SELECT * FROM c.n.t FOR VERSION AS OF 42", "t$version=42"),
            ("SELECT * FROM c.n.t VERSION AS OF 42 AS x", "t$version=42"),
            (
                "SELECT * FROM c.n.t FOR TIMESTAMP AS OF '1970-01-01 00:00:01'",
                "t$timestamp=1000",
            ),
            (
                "SELECT * FROM c.n.t FOR TIMESTAMP AS OF TIMESTAMP '1970-01-01T00:00:02Z'",
                "t$timestamp=2000",
            ),
        ] {
            let stmt = &parse_sql(sql).unwrap()[0];
            assert!(stmt.to_string().contains(suffix), "{sql} -> {stmt}");
        }
    }

    #[test]
    fn bad_time_travel_is_explained() {
        let err = parse_sql("SELECT * FROM t FOR VERSION AS OF 'x'").unwrap_err();
        assert!(err.to_string().contains("snapshot id"), "{err}");
        let err = parse_sql("SELECT * FROM t FOR TIMESTAMP AS OF 'yesterday'").unwrap_err();
        assert!(err.to_string().contains("is not a timestamp"), "{err}");
    }

    #[test]
    fn trailing_garbage_is_an_error() {
        let err = parse_sql("SHOW CATALOGS please").unwrap_err();
        assert!(err.to_string().contains("unexpected"), "{err}");
    }

    #[test]
    fn create_catalog_needs_options() {
        assert!(parse_sql("CREATE CATALOG lake").is_err());
    }
}
