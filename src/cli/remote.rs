//! `floe --connect postgres://...`: the REPL, scripts and `-c` as clients of a floe server
//! (or any PostgreSQL server), over the PostgreSQL protocol.
//!
//! ```text
//! statement text --Query--> server --RowDescription, DataRow*, CommandComplete--> Output
//! Ctrl-C         --CancelRequest (a second connection, the server's key)--> server
//! ```
//! Each statement is sent on its own (the REPL and scripts split them), so an error ends
//! only that statement. Values come back as text and are shown with the types the server
//! gave them (numbers right-aligned, booleans as true/false).

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Buf;
use datafusion::arrow::array::{ArrayRef, BooleanArray, Float64Array, Int64Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use futures::{Sink, SinkExt};
use pgwire::api::Type;
use pgwire::api::client::ClientInfo;
use pgwire::api::client::Config;
use pgwire::api::client::auth::DefaultStartupHandler;
use pgwire::api::client::query::SimpleQueryHandler;
use pgwire::error::{PgWireClientError, PgWireClientResult};
use pgwire::messages::PgWireFrontendMessage;
use pgwire::messages::data::{DataRow, RowDescription};
use pgwire::messages::response::{CommandComplete, EmptyQueryResponse, ReadyForQuery};
use pgwire::messages::simplequery::Query;
use pgwire::messages::startup::SecretKey;
use pgwire::tokio::client::PgWireClient;
use tokio::io::AsyncWriteExt;
use tokio::sync::Mutex;

use crate::error::{Error, Result};
use crate::secret::mask_url;
use crate::session::Output;

/// A connection to a server.
pub struct Remote {
    client: Mutex<PgWireClient>,
    /// Where cancel requests go, and the key that names this connection there.
    address: (String, u16),
    process_id: i32,
    secret: SecretKey,
    /// The URL without its password, for messages.
    shown: String,
}

impl Remote {
    /// Connect to `url` (`postgres://user[:password]@host[:port][/database]`); a password
    /// the URL lacks comes from `PGPASSWORD`, a user from `PGUSER` (else `floe`).
    pub async fn connect(url: &str) -> Result<Remote> {
        let shown = mask_url(url);
        let mut config: Config = url
            .parse()
            .map_err(|e| Error::Option(format!("--connect {shown}: {e}")))?;
        if config.get_password().is_none()
            && let Ok(p) = std::env::var("PGPASSWORD")
        {
            config.password(p);
        }
        if config.get_user().is_none() {
            config.user(std::env::var("PGUSER").unwrap_or_else(|_| "floe".into()));
        }
        let parsed = url::Url::parse(url).ok();
        let tls_required = parsed.as_ref().is_some_and(|u| {
            u.query_pairs()
                .any(|(k, v)| k == "sslmode" && !matches!(&*v, "disable" | "allow" | "prefer"))
        });
        if tls_required {
            return Err(Error::Unsupported(format!(
                "--connect {shown}: floe connects without TLS; use sslmode=disable (or \
                 prefer), or psql for a server that requires TLS"
            )));
        }
        // Where cancel requests go: the URL's host and port.
        let (host, port) = match parsed {
            Some(u) => (
                u.host_str()
                    .filter(|h| !h.is_empty())
                    .unwrap_or("127.0.0.1")
                    .trim_matches(['[', ']'])
                    .to_string(),
                u.port().unwrap_or(5432),
            ),
            None => ("127.0.0.1".to_string(), 5432),
        };
        let config = Arc::new(config);
        let client = PgWireClient::connect(config, DefaultStartupHandler::new(), None)
            .await
            .map_err(|e| failed(&shown, e))?;
        Ok(Remote {
            process_id: client.process_id(),
            secret: client.secret_key().clone(),
            client: Mutex::new(client),
            address: (host, port),
            shown,
        })
    }

    /// The server, as the user gave it (its password masked).
    pub fn address(&self) -> &str {
        &self.shown
    }

    /// Run one statement on the server.
    pub async fn execute(&self, sql: &str) -> Result<Output> {
        let mut client = self.client.lock().await;
        let mut outputs = client
            .simple_query(Collect::default(), sql)
            .await
            .map_err(|e| failed(&self.shown, e))?;
        Ok(outputs.pop().unwrap_or_else(|| Output::Done(String::new())))
    }

    /// Ask the server to cancel the statement running on this connection.
    pub async fn cancel(&self) -> Result<()> {
        let (host, port) = &self.address;
        let mut socket = tokio::net::TcpStream::connect((host.as_str(), *port))
            .await
            .map_err(|e| Error::io(format!("connecting to {host}:{port} to cancel"), e))?;
        let mut message = Vec::with_capacity(16);
        message.extend_from_slice(&16i32.to_be_bytes());
        message.extend_from_slice(&80_877_102i32.to_be_bytes());
        message.extend_from_slice(&self.process_id.to_be_bytes());
        match &self.secret {
            SecretKey::I32(k) => message.extend_from_slice(&k.to_be_bytes()),
            SecretKey::Bytes(b) => message.extend_from_slice(b),
        }
        let length = i32::try_from(message.len()).unwrap_or(16);
        message[..4].copy_from_slice(&length.to_be_bytes());
        socket
            .write_all(&message)
            .await
            .map_err(|e| Error::io("sending a cancel request", e))
    }
}

/// A client error as floe's: the server's own message (its SQLSTATE kept in mind: a
/// cancelled statement is [`Error::Cancelled`]), or what went wrong reaching it.
fn failed(shown: &str, e: PgWireClientError) -> Error {
    match e {
        PgWireClientError::RemoteError(info) if info.code == "57014" => Error::Cancelled,
        PgWireClientError::RemoteError(info) => Error::Plan(info.message),
        PgWireClientError::IoError(io) => Error::io(format!("the server at {shown}"), io),
        other => Error::Source(format!("the server at {shown}: {other}")),
    }
}

/// Collects each statement's output.
#[derive(Default)]
struct Collect {
    fields: Vec<(String, Type)>,
    rows: Vec<Vec<Option<String>>>,
    outputs: Vec<Output>,
}

impl Collect {
    fn rows_output(&mut self) -> Output {
        let fields = std::mem::take(&mut self.fields);
        let rows = std::mem::take(&mut self.rows);
        let schema = Arc::new(Schema::new(
            fields
                .iter()
                .map(|(name, ty)| Field::new(name, arrow_type(ty), true))
                .collect::<Vec<_>>(),
        ));
        let columns: Vec<ArrayRef> = fields
            .iter()
            .enumerate()
            .map(|(i, (_, ty))| column(ty, rows.iter().map(|r| r.get(i).cloned().flatten())))
            .collect();
        match RecordBatch::try_new(schema.clone(), columns) {
            Ok(batch) => Output::Rows(schema, vec![batch]),
            Err(e) => Output::Done(format!("(rows that could not be shown: {e})")),
        }
    }
}

/// How a column of PostgreSQL type `ty` is shown.
fn arrow_type(ty: &Type) -> DataType {
    match *ty {
        Type::INT2 | Type::INT4 | Type::INT8 | Type::OID => DataType::Int64,
        Type::FLOAT4 | Type::FLOAT8 => DataType::Float64,
        Type::BOOL => DataType::Boolean,
        _ => DataType::Utf8,
    }
}

fn column(ty: &Type, values: impl Iterator<Item = Option<String>>) -> ArrayRef {
    match arrow_type(ty) {
        DataType::Int64 => Arc::new(Int64Array::from_iter(
            values.map(|v| v.and_then(|v| v.parse().ok())),
        )),
        DataType::Float64 => Arc::new(Float64Array::from_iter(
            values.map(|v| v.and_then(|v| v.parse().ok())),
        )),
        DataType::Boolean => Arc::new(BooleanArray::from_iter(
            values.map(|v| v.map(|v| v == "t" || v == "true")),
        )),
        _ => Arc::new(StringArray::from_iter(values)),
    }
}

/// The values of a text-format row.
fn texts(mut row: DataRow) -> Vec<Option<String>> {
    let mut out = Vec::with_capacity(usize::try_from(row.field_count).unwrap_or(0));
    for _ in 0..row.field_count {
        if row.data.remaining() < 4 {
            break;
        }
        let len = row.data.get_i32();
        if len < 0 {
            out.push(None);
            continue;
        }
        let len = usize::try_from(len).unwrap_or(0).min(row.data.remaining());
        let bytes = row.data.split_to(len);
        out.push(Some(String::from_utf8_lossy(&bytes).into_owned()));
    }
    out
}

#[async_trait]
impl SimpleQueryHandler for Collect {
    type QueryResponse = Output;

    async fn simple_query<C>(&mut self, client: &mut C, query: &str) -> PgWireClientResult<()>
    where
        C: ClientInfo + Sink<PgWireFrontendMessage> + Unpin + Send,
        PgWireClientError: From<<C as Sink<PgWireFrontendMessage>>::Error>,
    {
        client
            .send(PgWireFrontendMessage::Query(Query::new(query.to_owned())))
            .await?;
        Ok(())
    }

    async fn on_row_description<C>(
        &mut self,
        _client: &mut C,
        message: RowDescription,
    ) -> PgWireClientResult<()>
    where
        C: ClientInfo + Sink<PgWireFrontendMessage> + Unpin + Send,
        PgWireClientError: From<<C as Sink<PgWireFrontendMessage>>::Error>,
    {
        self.fields = message
            .fields
            .into_iter()
            .map(|f| (f.name, Type::from_oid(f.type_id).unwrap_or(Type::TEXT)))
            .collect();
        self.rows.clear();
        Ok(())
    }

    async fn on_data_row<C>(&mut self, _client: &mut C, message: DataRow) -> PgWireClientResult<()>
    where
        C: ClientInfo + Sink<PgWireFrontendMessage> + Unpin + Send,
        PgWireClientError: From<<C as Sink<PgWireFrontendMessage>>::Error>,
    {
        self.rows.push(texts(message));
        Ok(())
    }

    async fn on_command_complete<C>(
        &mut self,
        _client: &mut C,
        message: CommandComplete,
    ) -> PgWireClientResult<()>
    where
        C: ClientInfo + Sink<PgWireFrontendMessage> + Unpin + Send,
        PgWireClientError: From<<C as Sink<PgWireFrontendMessage>>::Error>,
    {
        let output = if self.fields.is_empty() {
            Output::Done(message.tag)
        } else {
            self.rows_output()
        };
        self.outputs.push(output);
        Ok(())
    }

    async fn on_empty_query<C>(
        &mut self,
        _client: &mut C,
        _message: EmptyQueryResponse,
    ) -> PgWireClientResult<()>
    where
        C: ClientInfo + Sink<PgWireFrontendMessage> + Unpin + Send,
        PgWireClientError: From<<C as Sink<PgWireFrontendMessage>>::Error>,
    {
        Ok(())
    }

    async fn on_ready_for_query<C>(
        &mut self,
        _client: &mut C,
        _message: ReadyForQuery,
    ) -> PgWireClientResult<Vec<Output>>
    where
        C: ClientInfo + Sink<PgWireFrontendMessage> + Unpin + Send,
        PgWireClientError: From<<C as Sink<PgWireFrontendMessage>>::Error>,
    {
        Ok(std::mem::take(&mut self.outputs))
    }
}
