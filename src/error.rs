//! The one error type of floe.
//!
//! Every error knows whose it is (see [`ErrorKind`]): the user's (bad SQL, a bad option, a
//! missing table), the records' (a value the query or the table cannot take), an external
//! system's (catalog, storage, memory), or floe's own (a bug). Messages quote the offending
//! name or value and, where there is one, say how to fix it.
//!
//! [`Error::Record`] is the one road to the dead-letter table: a continuous job sends the
//! records that raised it there and goes on. Errors of DataFusion's execution and Arrow's
//! casts become it only where floe runs a query on records ([`Error::from_execution`]);
//! resource, I/O and outage errors never do, so a full memory pool or a lost catalog makes a
//! job retry, never dead-letter good records.
//! Conversion to and from [`DataFusionError`] happens only at the boundary with DataFusion.

use datafusion::error::DataFusionError;
use datafusion::sql::sqlparser::parser::ParserError;

/// `Result` with floe's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Whose fault an error is, which decides what the caller does with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Bad SQL, a bad option, a name that does not exist: fix the input.
    User,
    /// Records that cannot be taken as they are: a continuous job dead-letters them.
    Record,
    /// A catalog, store or server failed or refused, or a resource (memory) ran out: a
    /// continuous job retries from its last checkpoint.
    External,
    /// A bug in floe.
    Internal,
}

/// Why records cannot be taken: what a dead letter says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    /// What is wrong, in words that name the problem.
    pub reason: String,
    /// The column (or nested field path) whose value is wrong, when one is.
    pub column: Option<String>,
    /// The offending value as text, when known.
    pub value: Option<String>,
}

impl Reject {
    /// A rejection with its reason only.
    pub fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            column: None,
            value: None,
        }
    }

    /// The same rejection, about `column`.
    pub fn in_column(mut self, column: impl Into<String>) -> Self {
        self.column = Some(column.into());
        self
    }

    /// The same rejection, with the value that caused it.
    pub fn with_value(mut self, value: impl Into<String>) -> Self {
        self.value = Some(value.into());
        self
    }
}

impl std::fmt::Display for Reject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)?;
        if let Some(v) = &self.value {
            write!(f, " (value {v})")?;
        }
        Ok(())
    }
}

/// Everything that can go wrong in floe.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The SQL text does not parse.
    #[error("SQL syntax error: {0}")]
    Syntax(String),
    /// The statement parses but cannot be planned or run as written.
    #[error("{0}")]
    Plan(String),
    /// A `WITH (...)` option is unknown, missing or has a bad value.
    #[error("{0}")]
    Option(String),
    /// A catalog, namespace or table that the statement names does not exist.
    #[error("{0}")]
    NotFound(String),
    /// Something the statement creates exists already.
    #[error("{0}")]
    AlreadyExists(String),
    /// A feature floe does not have (yet); the message names it.
    #[error("not supported: {0}")]
    Unsupported(String),
    /// The statement was cancelled by the user.
    #[error("cancelled")]
    Cancelled,
    /// Another writer's commit removed what this commit read (a rewrite's input files):
    /// the same work cannot be committed, so it is given up, not retried.
    #[error("{0}")]
    Conflict(String),
    /// Reading or writing a local file failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// A system a source reads from (a Kafka broker) failed, or refused for longer than the
    /// source waits; the message names the server and what it was asked for.
    #[error("{0}")]
    Source(String),
    /// Records that cannot be taken (see [`Reject`]): they go to the dead-letter table.
    #[error("{0}")]
    Record(Reject),
    /// A catalog's own store (the SQL catalog's database, a REST server) failed or refused,
    /// outside iceberg-rust: `retryable` when waiting and asking again may succeed (a pool
    /// timeout, a locked database, a dropped connection).
    #[error("{context}: {source}")]
    Catalog {
        context: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
        retryable: bool,
    },
    /// The job must start again from its last checkpoint: what it was writing changed under
    /// it (a table dropped and created again). Retried, as external failures are.
    #[error("{0}; the job starts again from its last checkpoint")]
    Restart(String),
    /// The Iceberg library or a catalog behind it failed.
    #[error("Iceberg: {0}")]
    Iceberg(#[from] iceberg::Error),
    /// DataFusion failed while planning or executing.
    #[error("{0}")]
    DataFusion(Box<DataFusionError>),
    /// A bug in floe.
    #[error("internal error (a bug in floe, please report it): {0}")]
    Internal(String),
}

impl Error {
    /// Whose fault this error is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Syntax(_)
            | Error::Plan(_)
            | Error::Option(_)
            | Error::NotFound(_)
            | Error::AlreadyExists(_)
            | Error::Unsupported(_)
            | Error::Conflict(_)
            | Error::Cancelled => ErrorKind::User,
            Error::Record(_) => ErrorKind::Record,
            Error::Io { .. } | Error::Source(_) | Error::Catalog { .. } | Error::Restart(_) => {
                ErrorKind::External
            }
            Error::Iceberg(e) => match e.kind() {
                iceberg::ErrorKind::DataInvalid
                | iceberg::ErrorKind::FeatureUnsupported
                | iceberg::ErrorKind::NamespaceAlreadyExists
                | iceberg::ErrorKind::TableAlreadyExists
                | iceberg::ErrorKind::NamespaceNotFound
                | iceberg::ErrorKind::TableNotFound => ErrorKind::User,
                _ => ErrorKind::External,
            },
            Error::DataFusion(e) => match e.find_root() {
                DataFusionError::Internal(_) => ErrorKind::Internal,
                DataFusionError::IoError(_)
                | DataFusionError::ObjectStore(_)
                | DataFusionError::ResourcesExhausted(_) => ErrorKind::External,
                _ => ErrorKind::User,
            },
            Error::Internal(_) => ErrorKind::Internal,
        }
    }

    /// Whether asking again later may succeed: an external failure, unless it is a catalog
    /// database error that says it will not (a missing catalog table, a violated
    /// constraint), which a retry would only repeat.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Catalog { retryable, .. } => *retryable,
            _ => self.kind() == ErrorKind::External,
        }
    }

    /// Whether the records that raised this error are at fault (they go to the dead-letter
    /// table), rather than the system or the statement.
    pub fn is_record(&self) -> bool {
        self.kind() == ErrorKind::Record
    }

    /// An error DataFusion raised while running a query on records, as floe sees it: errors
    /// caused by the records' values (a failed cast or parse, a division by zero, an
    /// overflow, a function refusing its argument) and by their shape (a plan or schema
    /// error for the columns they carry) are [`Error::Record`]; resources running out, I/O,
    /// object stores and DataFusion's internal errors keep their own kind.
    pub fn from_execution(e: DataFusionError) -> Self {
        use datafusion::arrow::error::ArrowError;
        let by_value = match e.find_root() {
            DataFusionError::ArrowError(a, _) => matches!(
                a.as_ref(),
                ArrowError::CastError(_)
                    | ArrowError::ParseError(_)
                    | ArrowError::ComputeError(_)
                    | ArrowError::DivideByZero
                    | ArrowError::ArithmeticOverflow(_)
                    | ArrowError::InvalidArgumentError(_)
                    | ArrowError::SchemaError(_)
                    | ArrowError::NotYetImplemented(_)
            ),
            DataFusionError::Execution(_)
            | DataFusionError::Plan(_)
            | DataFusionError::SchemaError(_, _)
            | DataFusionError::NotImplemented(_) => true,
            _ => false,
        };
        match Error::from(e) {
            Error::DataFusion(e) if by_value => Error::Record(Reject::new(e.to_string())),
            other => other,
        }
    }

    /// A failure of a SQL catalog's database (sqlx), retryable when it is an outage: the pool
    /// timed out or closed, the connection or its I/O failed, the database is locked or busy
    /// (SQLite), or the server is shutting down, out of resources or reports a serialization
    /// failure (PostgreSQL's SQLSTATE classes 08, 53, 57P and 40001/40P01).
    pub fn catalog_database(context: impl Into<String>, e: sqlx::Error) -> Self {
        let retryable = match &e {
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_)
            | sqlx::Error::WorkerCrashed => true,
            sqlx::Error::Database(db) => {
                let code = db.code().map(|c| c.to_string()).unwrap_or_default();
                let message = db.message().to_ascii_lowercase();
                // SQLite: SQLITE_BUSY (5), SQLITE_LOCKED (6) and their extended codes.
                code.starts_with("08")
                    || code.starts_with("53")
                    || code.starts_with("57P")
                    || code == "40001"
                    || code == "40P01"
                    || matches!(code.parse::<i32>().map(|c| c & 0xff), Ok(5 | 6))
                    || message.contains("database is locked")
                    || message.contains("database table is locked")
            }
            _ => false,
        };
        Error::Catalog {
            context: context.into(),
            source: Box::new(e),
            retryable,
        }
    }

    /// An I/O error with what floe was doing when it happened.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

impl From<DataFusionError> for Error {
    fn from(e: DataFusionError) -> Self {
        // Unwrap errors that floe itself raised inside DataFusion callbacks.
        match e {
            DataFusionError::External(inner) => match inner.downcast::<Error>() {
                Ok(ours) => *ours,
                Err(other) => Error::DataFusion(Box::new(DataFusionError::External(other))),
            },
            DataFusionError::Context(ctx, inner) => match Error::from(*inner) {
                Error::DataFusion(inner) => {
                    Error::DataFusion(Box::new(DataFusionError::Context(ctx, inner)))
                }
                ours => ours,
            },
            DataFusionError::SQL(e, _) => Error::Syntax(e.to_string()),
            other => Error::DataFusion(Box::new(other)),
        }
    }
}

impl From<ParserError> for Error {
    fn from(e: ParserError) -> Self {
        let msg = match e {
            ParserError::ParserError(m) | ParserError::TokenizerError(m) => m,
            ParserError::RecursionLimitExceeded => "statement nested too deeply".to_string(),
        };
        Error::Syntax(msg)
    }
}

impl From<Error> for DataFusionError {
    fn from(e: Error) -> Self {
        match e {
            Error::DataFusion(inner) => *inner,
            other => DataFusionError::External(Box::new(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::error::ArrowError;

    #[test]
    fn values_are_the_records_fault_resources_and_io_are_not() {
        let record = |e: DataFusionError| Error::from_execution(e).kind();
        let cast = DataFusionError::ArrowError(
            Box::new(ArrowError::CastError("'x' is not a number".into())),
            None,
        );
        assert_eq!(record(cast), ErrorKind::Record);
        assert_eq!(
            record(DataFusionError::Execution("bad date".into())),
            ErrorKind::Record
        );
        let wrapped = DataFusionError::Context(
            "projection".into(),
            Box::new(DataFusionError::Execution("division by zero".into())),
        );
        assert_eq!(record(wrapped), ErrorKind::Record);
        assert_eq!(
            record(DataFusionError::ResourcesExhausted("memory".into())),
            ErrorKind::External
        );
        let io = DataFusionError::Context(
            "reading".into(),
            Box::new(DataFusionError::IoError(std::io::Error::other("gone"))),
        );
        assert_eq!(record(io), ErrorKind::External);
        assert_eq!(
            record(DataFusionError::Internal("bug".into())),
            ErrorKind::Internal
        );
        // floe's own errors raised inside DataFusion keep their kind.
        let ours = DataFusionError::External(Box::new(Error::Source("broker down".into())));
        assert_eq!(record(ours), ErrorKind::External);
        let arrow_io = DataFusionError::ArrowError(
            Box::new(ArrowError::IoError(
                "disk".into(),
                std::io::Error::other("gone"),
            )),
            None,
        );
        assert!(!Error::from_execution(arrow_io).is_record());
    }

    #[test]
    fn a_catalog_database_outage_is_external_and_retryable() {
        for (e, retryable) in [
            (sqlx::Error::PoolTimedOut, true),
            (sqlx::Error::Io(std::io::Error::other("reset")), true),
            (sqlx::Error::RowNotFound, false),
        ] {
            let err = Error::catalog_database("committing t", e);
            assert_eq!(err.kind(), ErrorKind::External);
            assert_eq!(err.is_retryable(), retryable, "{err}");
            assert!(matches!(err, Error::Catalog { retryable: r, .. } if r == retryable));
            assert!(err.to_string().starts_with("committing t: "), "{err}");
        }
    }

    #[test]
    fn a_reject_names_its_value() {
        let r = Reject::new("column 'n' is int in the table")
            .in_column("n")
            .with_value("ten");
        assert_eq!(r.column.as_deref(), Some("n"));
        assert_eq!(
            Error::Record(r).to_string(),
            "column 'n' is int in the table (value ten)"
        );
    }
}
