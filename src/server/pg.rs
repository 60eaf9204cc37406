//! The PostgreSQL wire protocol (pgwire) in front of floe sessions: one connection, one
//! session forked from the server's (its own settings; the catalogs, sources and jobs of
//! all).
//!
//! ```text
//! simple query   "s1; s2; ..." -> each statement run in turn; an error ends the query with
//!                an ErrorResponse (SQLSTATE from floe's error) and the connection goes on
//! extended       Parse (one statement, $n placeholders) -> Bind (values as tokens, never as
//!                SQL text) -> Describe: a query's columns from its plan; any other statement
//!                runs here, its result kept for the Execute that follows -> Execute
//! cancel         a CancelRequest drops the running statement's future (DataFusion stops)
//! ```

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, OnceLock};

use async_trait::async_trait;
use datafusion::error::DataFusionError;
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::Statement as SQLStatement;
use futures::{Sink, stream};
use pgwire::api::auth::noop::NoopStartupHandler;
use pgwire::api::cancel::DefaultCancelHandler;
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{
    DescribePortalResponse, DescribeStatementResponse, FieldInfo, QueryResponse, Response, Tag,
};
use pgwire::api::stmt::{QueryParser, StoredStatement};
use pgwire::api::store::PortalStore;
use pgwire::api::{ClientInfo, ClientPortalStore, ConnectionManager, PgWireServerHandlers, Type};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::PgWireBackendMessage;

use super::Server;
use super::auth::Startup;
use super::encode;
use super::pg_rewrite::{self, Context};
use super::state::{Kind, created_view, dropped_views};
use crate::error::{Error, ErrorKind};
use crate::session::{Output, Session};
use crate::sql::{Literal, ScriptStatement, Statement, split_statements};

/// One client connection.
pub struct Connection {
    server: Arc<Server>,
    session: Session,
    /// The SET statements run on this connection, in order: a job it submits is started
    /// again with them.
    settings: Mutex<Vec<String>>,
    /// Results of statements run when their portal was described, for its Execute.
    described: Mutex<HashMap<String, Output>>,
    parser: Arc<Parser>,
    cancel: Arc<DefaultCancelHandler>,
    /// The user the client logged in as, once its first statement came.
    login: OnceLock<String>,
}

impl Connection {
    pub fn new(server: Arc<Server>, manager: Arc<ConnectionManager>) -> Self {
        let session = server.session().fork();
        Self {
            server,
            session,
            settings: Mutex::default(),
            described: Mutex::default(),
            parser: Arc::new(Parser),
            cancel: Arc::new(DefaultCancelHandler::new(manager)),
            login: OnceLock::new(),
        }
    }

    /// Before the connection's first statement: the database the client asked for
    /// (`psql -d lake`), when it names a catalog, becomes the current catalog, as
    /// PostgreSQL's database is; the SET is kept with the connection's settings, so that a
    /// job it submits resumes with the same names.
    async fn begin<C: ClientInfo>(&self, client: &C) {
        let (user, database) = {
            let metadata = client.metadata();
            (
                metadata.get("user").cloned(),
                metadata.get("database").cloned(),
            )
        };
        let user = user.unwrap_or_else(|| self.server.user().to_string());
        if self.login.set(user).is_err() {
            return;
        }
        let Some(database) = database else {
            return;
        };
        if self.session.context().catalog(&database).is_none() {
            return;
        }
        let set = format!(
            "SET datafusion.catalog.default_catalog = '{}'",
            database.replace('\'', "''")
        );
        if self.session.sql(&set).await.is_ok()
            && let Ok(mut settings) = self.settings.lock()
        {
            settings.push(set);
        }
    }

    /// The names a client's PostgreSQL dialect is rewritten against.
    fn context(&self) -> Context {
        let options = self
            .session
            .context()
            .state()
            .config()
            .options()
            .catalog
            .clone();
        Context {
            home: self.server.home().to_string(),
            database: options.default_catalog,
            schema: options.default_schema,
            user: self
                .login
                .get()
                .cloned()
                .unwrap_or_else(|| self.server.user().to_string()),
        }
    }

    /// A client's statement, parsed and rewritten into what floe runs.
    fn parse(&self, stmt: &ScriptStatement) -> Result<Statement, Error> {
        let mut parsed = stmt.parse()?;
        pg_rewrite::rewrite(&mut parsed, &self.context());
        Ok(parsed)
    }

    /// Run one statement, and keep what the server must remember of it.
    async fn run(&self, parsed: Statement) -> Result<Output, Error> {
        if let Statement::ResumeJob(r) = &parsed {
            // Boxed: the future of a job's start nested in a statement's is too deep a type.
            return Box::pin(self.server.resume_job(r)).await;
        }
        if let Some(schema) = pg_rewrite::search_path(&parsed) {
            // PostgreSQL's search path: its first schema is where unqualified names resolve.
            let set = format!(
                "SET datafusion.catalog.default_schema = '{}'",
                schema.replace('\'', "''")
            );
            self.session.sql(&set).await?;
            if let Ok(mut settings) = self.settings.lock() {
                settings.push(set);
            }
            return Ok(Output::Done("SET".into()));
        }
        if let Some(output) = pg_rewrite::session_answer(&parsed, &self.context()) {
            return Ok(output);
        }
        let output = self.session.execute(parsed.clone()).await?;
        self.remember(&parsed, &output)?;
        Ok(output)
    }

    /// Answer one statement, its rows in `format`.
    async fn answer(&self, stmt: &ScriptStatement, format: &Format) -> Result<Response, Error> {
        let parsed = self.parse(stmt)?;
        if let Some(r) = transaction(&parsed) {
            return Ok(r);
        }
        let output = self.run(parsed).await?;
        response(output, format).map_err(|e| Error::Internal(e.to_string()))
    }

    fn remember(&self, stmt: &Statement, output: &Output) -> Result<(), Error> {
        let state = self.server.state();
        if let Some(view) = created_view(stmt) {
            return state.define(Kind::View, &view, stmt.to_string());
        }
        for view in dropped_views(stmt) {
            state.undefine(Kind::View, &view)?;
        }
        match stmt {
            Statement::CreateCatalog(c) => state.define(Kind::Catalog, &c.name, stmt.to_string()),
            Statement::CreateSource(s) => state.define(Kind::Source, &s.name, stmt.to_string()),
            Statement::DropCatalog(c) => state.undefine(Kind::Catalog, &c.name),
            Statement::DropSource(s) => state.undefine(Kind::Source, &s.name),
            Statement::StopJob(s) => state.job_stopped(&s.name),
            Statement::DataFusion(s) if matches!(s.as_ref(), DFStatement::Statement(q) if matches!(**q, SQLStatement::Set(_))) =>
            {
                if let Ok(mut settings) = self.settings.lock() {
                    settings.push(stmt.to_string());
                }
                Ok(())
            }
            _ => match output {
                Output::Started { job } => {
                    let settings = self.settings.lock().map(|s| s.clone()).unwrap_or_default();
                    state.job_started(job, &settings, stmt.to_string())
                }
                _ => Ok(()),
            },
        }
    }
}

/// floe's error as a PostgreSQL error, with the SQLSTATE of its kind.
pub fn error_info(e: &Error) -> ErrorInfo {
    ErrorInfo::new("ERROR".to_string(), sqlstate(e).to_string(), e.to_string())
}

fn sqlstate(e: &Error) -> &'static str {
    match e {
        Error::Syntax(_) => "42601",
        Error::Plan(_) => "42000",
        Error::Option(_) => "22023",
        Error::NotFound(_) => "42704",
        Error::AlreadyExists(_) => "42710",
        Error::Unsupported(_) => "0A000",
        Error::Cancelled => "57014",
        Error::Conflict(_) => "40001",
        Error::Record(_) => "22000",
        Error::DataFusion(d) => match d.as_ref() {
            DataFusionError::SQL(..) => "42601",
            DataFusionError::Plan(_) | DataFusionError::SchemaError(..) => "42000",
            DataFusionError::NotImplemented(_) => "0A000",
            DataFusionError::ResourcesExhausted(_) => "53200",
            _ => kind_state(e),
        },
        _ => kind_state(e),
    }
}

fn kind_state(e: &Error) -> &'static str {
    match e.kind() {
        ErrorKind::User => "42000",
        ErrorKind::Record => "22000",
        ErrorKind::External => "58000",
        ErrorKind::Internal => "XX000",
    }
}

fn user_error(e: &Error) -> PgWireError {
    PgWireError::UserError(Box::new(error_info(e)))
}

/// The answer to a transaction statement. floe has no transactions: every statement commits
/// on its own, as in autocommit mode; clients that open a block (psycopg, JDBC) get the
/// answers they expect, and a ROLLBACK undoes nothing.
fn transaction(stmt: &Statement) -> Option<Response> {
    let Statement::DataFusion(s) = stmt else {
        return None;
    };
    let DFStatement::Statement(q) = s.as_ref() else {
        return None;
    };
    match q.as_ref() {
        SQLStatement::StartTransaction { .. } => {
            Some(Response::TransactionStart(Tag::new("BEGIN")))
        }
        SQLStatement::Commit { .. } => Some(Response::TransactionEnd(Tag::new("COMMIT"))),
        SQLStatement::Rollback { .. } => Some(Response::TransactionEnd(Tag::new("ROLLBACK"))),
        _ => None,
    }
}

/// A statement's output as a response, its columns in `format`.
fn response(output: Output, format: &Format) -> PgWireResult<Response> {
    match output {
        Output::Rows(schema, batches) => {
            let fields = Arc::new(encode::fields(&schema, format));
            let rows = encode::rows(&fields, &batches)?;
            Ok(Response::Query(QueryResponse::new(
                fields,
                stream::iter(rows.into_iter().map(Ok)),
            )))
        }
        other => Ok(Response::Execution(Tag::new(&other.to_string()))),
    }
}

#[async_trait]
impl SimpleQueryHandler for Connection {
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        self.begin(client).await;
        let statements = match split_statements(query) {
            Ok(s) => s,
            Err(e) => return Ok(vec![Response::Error(Box::new(error_info(&e)))]),
        };
        let mut out = Vec::with_capacity(statements.len());
        for stmt in &statements {
            match self.answer(stmt, &Format::UnifiedText).await {
                Ok(r) => out.push(r),
                Err(e) => {
                    // As PostgreSQL: the statements after a failing one do not run.
                    out.push(Response::Error(Box::new(error_info(&e))));
                    break;
                }
            }
        }
        Ok(out)
    }
}

/// A statement as the extended protocol keeps it: parsed once, bound per portal.
#[derive(Debug, Clone)]
pub struct Prepared {
    statement: ScriptStatement,
    parameters: usize,
}

impl Prepared {
    /// The statement with `portal`'s parameters bound.
    fn bound(&self, portal: &Portal<Prepared>) -> Result<ScriptStatement, Error> {
        let types = &portal.statement.parameter_types;
        let values = (0..portal.parameter_len())
            .map(|i| literal(portal, i, types.get(i).cloned().flatten()))
            .collect::<Result<Vec<_>, Error>>()?;
        self.statement.bind(&values)
    }
}

/// Parameter `i` of `portal`, of type `ty` (`None`: the client gave none).
fn literal(portal: &Portal<Prepared>, i: usize, ty: Option<Type>) -> Result<Literal, Error> {
    let Some(bytes) = portal.parameters.get(i).cloned().flatten() else {
        return Ok(Literal::Null);
    };
    let ty = ty.unwrap_or(Type::UNKNOWN);
    let wrong = |what: &str| Error::Plan(format!("parameter ${} ({}): {what}", i + 1, ty.name()));
    if portal.parameter_format.is_binary(i) {
        let fixed = |n: usize| {
            (bytes.len() == n)
                .then_some(())
                .ok_or_else(|| wrong(&format!("a binary value of {} bytes", bytes.len())))
        };
        return Ok(match ty {
            Type::BOOL => {
                fixed(1)?;
                Literal::Bool(bytes[0] != 0)
            }
            Type::INT2 => {
                fixed(2)?;
                Literal::Number(i16::from_be_bytes([bytes[0], bytes[1]]).to_string())
            }
            Type::INT4 => {
                fixed(4)?;
                Literal::Number(
                    i32::from_be_bytes(bytes[..4].try_into().unwrap_or_default()).to_string(),
                )
            }
            Type::INT8 => {
                fixed(8)?;
                Literal::Number(
                    i64::from_be_bytes(bytes[..8].try_into().unwrap_or_default()).to_string(),
                )
            }
            Type::FLOAT4 => {
                fixed(4)?;
                Literal::Number(
                    f32::from_be_bytes(bytes[..4].try_into().unwrap_or_default()).to_string(),
                )
            }
            Type::FLOAT8 => {
                fixed(8)?;
                Literal::Number(
                    f64::from_be_bytes(bytes[..8].try_into().unwrap_or_default()).to_string(),
                )
            }
            Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
                Literal::String(String::from_utf8(bytes.to_vec()).map_err(|_| wrong("not UTF-8"))?)
            }
            _ => {
                return Err(wrong(
                    "floe takes this type's values in the text format only",
                ));
            }
        });
    }
    let text = String::from_utf8(bytes.to_vec()).map_err(|_| wrong("not UTF-8"))?;
    Ok(match ty {
        Type::BOOL => match text.as_str() {
            "t" | "true" | "TRUE" | "1" | "on" | "yes" => Literal::Bool(true),
            "f" | "false" | "FALSE" | "0" | "off" | "no" => Literal::Bool(false),
            _ => return Err(wrong(&format!("'{text}' is not a boolean"))),
        },
        Type::INT2
        | Type::INT4
        | Type::INT8
        | Type::FLOAT4
        | Type::FLOAT8
        | Type::NUMERIC
        | Type::OID => Literal::Number(text),
        _ => Literal::String(text),
    })
}

/// Parses the statements of the extended protocol.
#[derive(Debug)]
pub struct Parser;

#[async_trait]
impl QueryParser for Parser {
    type Statement = Prepared;

    async fn parse_sql<C>(
        &self,
        _client: &C,
        sql: &str,
        _types: &[Option<Type>],
    ) -> PgWireResult<Option<Prepared>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        let mut statements = split_statements(sql).map_err(|e| user_error(&e))?;
        if statements.len() > 1 {
            return Err(user_error(&Error::Plan(
                "a prepared statement is one statement; this one holds several".into(),
            )));
        }
        Ok(statements.pop().map(|statement| Prepared {
            parameters: statement.parameters(),
            statement,
        }))
    }

    fn get_parameter_types(&self, stmt: &Prepared) -> PgWireResult<Vec<Type>> {
        Ok(vec![Type::TEXT; stmt.parameters])
    }

    fn get_result_schema(
        &self,
        _stmt: &Prepared,
        _column_format: Option<&Format>,
    ) -> PgWireResult<Vec<FieldInfo>> {
        // Described by `Connection` (it needs the session); never asked here.
        Ok(Vec::new())
    }
}

#[async_trait]
impl ExtendedQueryHandler for Connection {
    type Statement = Prepared;
    type QueryParser = Parser;

    fn query_parser(&self) -> Arc<Parser> {
        self.parser.clone()
    }

    async fn do_describe_statement<C>(
        &self,
        client: &mut C,
        target: &StoredStatement<Prepared>,
    ) -> PgWireResult<DescribeStatementResponse>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Prepared>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        self.begin(client).await;
        let prepared = &target.statement;
        let types: Vec<Type> = (0..prepared.parameters)
            .map(|i| {
                target
                    .parameter_types
                    .get(i)
                    .cloned()
                    .flatten()
                    .unwrap_or(Type::TEXT)
            })
            .collect();
        // The columns of a query, planned with every parameter NULL.
        let nulls = vec![Literal::Null; prepared.parameters];
        let schema = match prepared.statement.bind(&nulls).and_then(|s| self.parse(&s)) {
            Ok(stmt) => self.session.plan_schema(&stmt).await,
            Err(_) => None,
        };
        let fields = schema
            .map(|s| encode::fields(&s, &Format::UnifiedText))
            .unwrap_or_default();
        Ok(DescribeStatementResponse::new(types, fields))
    }

    async fn do_describe_portal<C>(
        &self,
        client: &mut C,
        portal: &Portal<Prepared>,
    ) -> PgWireResult<DescribePortalResponse>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Prepared>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        self.begin(client).await;
        let stmt = portal
            .statement
            .statement
            .bound(portal)
            .map_err(|e| user_error(&e))?;
        let parsed = self.parse(&stmt).map_err(|e| user_error(&e))?;
        if transaction(&parsed).is_some() {
            return Ok(DescribePortalResponse::new(Vec::new()));
        }
        if let Some(schema) = self.session.plan_schema(&parsed).await {
            let fields = encode::fields(&schema, &portal.result_column_format);
            return Ok(DescribePortalResponse::new(fields));
        }
        // Only running it tells what it returns: run it now, for the Execute that follows.
        let output = self.run(parsed).await.map_err(|e| user_error(&e))?;
        let fields = match &output {
            Output::Rows(schema, _) => encode::fields(schema, &portal.result_column_format),
            _ => Vec::new(),
        };
        if let Ok(mut described) = self.described.lock() {
            described.insert(portal.name.clone(), output);
        }
        // No fields: NoData.
        Ok(DescribePortalResponse::new(fields))
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<Prepared>,
        _max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Prepared>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        self.begin(client).await;
        let ran = self
            .described
            .lock()
            .ok()
            .and_then(|mut d| d.remove(&portal.name));
        match ran {
            Some(output) => response(output, &portal.result_column_format),
            None => {
                let stmt = portal
                    .statement
                    .statement
                    .bound(portal)
                    .map_err(|e| user_error(&e))?;
                self.answer(&stmt, &portal.result_column_format)
                    .await
                    .map_err(|e| user_error(&e))
            }
        }
    }
}

#[async_trait]
impl NoopStartupHandler for Connection {
    fn connection_manager(&self) -> Option<Arc<ConnectionManager>> {
        Some(self.server.connections())
    }
}

/// The handlers of one connection.
pub struct Handlers {
    connection: Arc<Connection>,
    startup: Arc<Startup<Connection>>,
}

impl Handlers {
    /// A new connection's: it starts with SCRAM when the server has a password.
    pub fn new(server: &Arc<Server>) -> Self {
        let connection = Arc::new(Connection::new(server.clone(), server.connections()));
        let startup = match server.credentials() {
            Some(c) => Startup::password(c, server.connections()),
            None => Startup::Open(connection.clone()),
        };
        Self {
            connection,
            startup: Arc::new(startup),
        }
    }
}

impl PgWireServerHandlers for Handlers {
    fn simple_query_handler(&self) -> Arc<impl SimpleQueryHandler> {
        self.connection.clone()
    }

    fn extended_query_handler(&self) -> Arc<impl ExtendedQueryHandler> {
        self.connection.clone()
    }

    fn startup_handler(&self) -> Arc<impl pgwire::api::auth::StartupHandler> {
        self.startup.clone()
    }

    fn cancel_handler(&self) -> Arc<impl pgwire::api::cancel::CancelHandler> {
        self.connection.cancel.clone()
    }
}
