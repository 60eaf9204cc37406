//! Who may connect. Without a password the server answers loopback clients only (it listens
//! on a loopback address); with one (`--password-file`, or `FLOE_SERVER_PASSWORD`) every
//! client proves it with SCRAM-SHA-256, as PostgreSQL's default, and the server may listen
//! on any address. With `--tls-cert` and `--tls-key` clients can encrypt the connection
//! (psql's `sslmode=require`). SCRAM is offered without channel binding: pgwire 0.42 offers
//! `SCRAM-SHA-256-PLUS` on plain connections too once a certificate is configured, which
//! libpq refuses, so a server with TLS could not take unencrypted clients.

use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use futures::Sink;
use pgwire::api::auth::sasl::SASLAuthStartupHandler;
use pgwire::api::auth::sasl::scram::{ScramAuth, gen_salted_password};
use pgwire::api::auth::{
    AuthSource, DefaultServerParameterProvider, LoginInfo, Password, StartupHandler,
};
use pgwire::api::{ClientInfo, ConnectionManager};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use pgwire::tokio::tokio_rustls::TlsAcceptor;
use pgwire::tokio::tokio_rustls::rustls::{self, ServerConfig};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::{Error, Result};

/// PBKDF2 iterations of the stored SCRAM verifier (PostgreSQL's default).
const ITERATIONS: usize = 4096;

/// The one user the server knows and its SCRAM verifier.
pub struct Credentials {
    user: String,
    salt: Vec<u8>,
    salted: Vec<u8>,
}

impl Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl Credentials {
    pub fn new(user: String, password: &str) -> Self {
        let salt: Vec<u8> = uuid::Uuid::new_v4().as_bytes().to_vec();
        let salted = gen_salted_password(password, &salt, ITERATIONS);
        Self { user, salt, salted }
    }
}

#[async_trait]
impl AuthSource for Credentials {
    async fn get_password(&self, login: &LoginInfo) -> PgWireResult<Password> {
        if login.user() != Some(self.user.as_str()) {
            // As PostgreSQL: an unknown user fails as a wrong password does.
            return Err(PgWireError::UserError(Box::new(ErrorInfo::new(
                "FATAL".into(),
                "28P01".into(),
                format!(
                    "password authentication failed for user \"{}\"",
                    login.user().unwrap_or_default()
                ),
            ))));
        }
        Ok(Password::new(Some(self.salt.clone()), self.salted.clone()))
    }
}

/// A certificate and its key (PEM files).
#[derive(Debug, Clone)]
pub struct Tls {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Tls {
    /// The acceptor of TLS connections.
    pub fn acceptor(&self) -> Result<TlsAcceptor> {
        let read = |p: &Path| {
            std::fs::read(p).map_err(|source| Error::Io {
                context: format!("reading {}", p.display()),
                source,
            })
        };
        let pem = read(&self.cert)?;
        let bad = |p: &Path, e: String| Error::Option(format!("TLS file {}: {e}", p.display()));
        let certs = CertificateDer::pem_slice_iter(&pem)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| bad(&self.cert, e.to_string()))?;
        if certs.is_empty() {
            return Err(bad(&self.cert, "no certificate in it".into()));
        }
        let key = PrivateKeyDer::from_pem_slice(&read(&self.key)?)
            .map_err(|e| bad(&self.key, e.to_string()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(&self.cert, e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| bad(&self.key, e.to_string()))?;
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

/// How one connection starts: as it is (no password) or with SCRAM.
pub enum Startup<H> {
    Open(Arc<H>),
    Password(SASLAuthStartupHandler<DefaultServerParameterProvider>),
}

impl<H> Startup<H> {
    /// SCRAM against `credentials`.
    pub fn password(credentials: Arc<Credentials>, manager: Arc<ConnectionManager>) -> Self {
        let mut scram = ScramAuth::new(credentials);
        scram.set_iterations(ITERATIONS);
        Startup::Password(
            SASLAuthStartupHandler::new(Arc::new(DefaultServerParameterProvider::default()))
                .with_scram(scram)
                .with_connection_manager(manager),
        )
    }
}

#[async_trait]
impl<H: StartupHandler> StartupHandler for Startup<H> {
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        match self {
            Startup::Open(h) => h.on_startup(client, message).await,
            Startup::Password(h) => h.on_startup(client, message).await,
        }
    }
}
