//! The one error type of floe.
//!
//! Every error knows whose it is (see [`ErrorKind`]): the user's (bad SQL, a bad option, a
//! missing table), an external system's (catalog, storage), or floe's own (a bug). Messages
//! quote the offending name or value and, where there is one, say how to fix it.
//! Conversion to and from [`DataFusionError`] happens only at the boundary with DataFusion.

use datafusion::error::DataFusionError;
use datafusion::sql::sqlparser::parser::ParserError;

/// `Result` with floe's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What task `what` returned; its panic (or cancellation) is an internal error naming it.
pub async fn joined<T>(task: tokio::task::JoinHandle<Result<T>>, what: &str) -> Result<T> {
    task.await
        .map_err(|e| Error::Internal(format!("{what}: {e}")))?
}

/// Whose fault an error is, which decides what the caller does with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Bad SQL, a bad option, a name that does not exist: fix the input.
    User,
    /// A catalog, store or server failed or refused.
    External,
    /// A bug in floe.
    Internal,
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
            | Error::Cancelled => ErrorKind::User,
            Error::Io { .. } | Error::Source(_) => ErrorKind::External,
            Error::Iceberg(e) => match e.kind() {
                iceberg::ErrorKind::DataInvalid
                | iceberg::ErrorKind::FeatureUnsupported
                | iceberg::ErrorKind::NamespaceAlreadyExists
                | iceberg::ErrorKind::TableAlreadyExists
                | iceberg::ErrorKind::NamespaceNotFound
                | iceberg::ErrorKind::TableNotFound => ErrorKind::User,
                _ => ErrorKind::External,
            },
            Error::DataFusion(e) => match e.as_ref() {
                DataFusionError::Internal(_) => ErrorKind::Internal,
                DataFusionError::IoError(_) | DataFusionError::ObjectStore(_) => {
                    ErrorKind::External
                }
                _ => ErrorKind::User,
            },
            Error::Internal(_) => ErrorKind::Internal,
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
