//! `floe serve`: a long-running process that owns the jobs, and speaks the PostgreSQL wire
//! protocol to any client (psql, psycopg, JDBC tools).
//!
//! ```text
//! start:   state dir (state.rs) -> init scripts (-f) -> catalogs and sources clients
//!          defined -> every job that was running, from its last checkpoint
//! serve:   a connection = a session forked from the server's (settings of its own; the
//!          catalogs, sources and jobs of all), pg.rs; a job a client submits returns at
//!          once and runs on after it disconnects
//! stop:    SIGINT / SIGTERM: jobs take a final checkpoint and stay to be resumed;
//!          SIGKILL: the next start resumes them from their last checkpoint, exactly once
//! watch:   the dashboard over HTTP (dashboard.rs, http.rs), /metrics beside it
//! ```
//! Without a password it listens on loopback only (anything else refuses to start); with
//! one, clients log in with SCRAM-SHA-256 from anywhere (`auth.rs`), over TLS if configured.

mod auth;
mod dashboard;
mod encode;
pub mod http;
pub mod metrics;
mod pg;
mod pg_catalog;
mod pg_functions;
mod pg_rewrite;
mod state;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use pgwire::api::ConnectionManager;
use tokio::net::TcpListener;

use crate::error::{Error, Result};
use crate::session::{Output, Session};
use crate::sql::parse_sql;
use crate::sql::statement::ResumeJob;
use crate::stream::status::JobState;
use crate::task::AbortOnDrop;
use state::ServerState;

pub use auth::Tls;

/// How `floe serve` runs.
#[derive(Clone)]
pub struct ServeOptions {
    pub listen: SocketAddr,
    pub state_dir: PathBuf,
    /// Scripts run at every start, before the state is restored.
    pub init: Vec<PathBuf>,
    /// The user clients log in as, and its password (none: loopback clients only, no login).
    pub user: String,
    pub password: Option<String>,
    pub tls: Option<Tls>,
    /// Where the dashboard (and `/metrics`) is served.
    pub dashboard: SocketAddr,
}

impl std::fmt::Debug for ServeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeOptions")
            .field("listen", &self.listen)
            .field("state_dir", &self.state_dir)
            .field("init", &self.init)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "****"))
            .field("tls", &self.tls)
            .field("dashboard", &self.dashboard)
            .finish()
    }
}

/// A running server: its session (whose catalogs, sources and jobs every connection
/// shares), its state directory and its connections.
pub struct Server {
    session: Session,
    state: ServerState,
    connections: Arc<ConnectionManager>,
    credentials: Option<Arc<auth::Credentials>>,
    /// The user clients log in as.
    user: String,
    /// The catalog whose schema `pg_catalog` clients' catalog queries read.
    home: String,
}

impl Server {
    fn session(&self) -> &Session {
        &self.session
    }

    fn state(&self) -> &ServerState {
        &self.state
    }

    fn connections(&self) -> Arc<ConnectionManager> {
        self.connections.clone()
    }

    fn credentials(&self) -> Option<Arc<auth::Credentials>> {
        self.credentials.clone()
    }

    fn user(&self) -> &str {
        &self.user
    }

    fn home(&self) -> &str {
        &self.home
    }

    /// Start a job from its statements (the settings, then its INSERT) in a session of its
    /// own; it resumes from its last checkpoint.
    async fn start_script(&self, script: &str) -> Result<Output> {
        let session = self.session.fork();
        let mut statements = parse_sql(script)?;
        let insert = statements
            .pop()
            .ok_or_else(|| Error::Internal("a job's statements hold no INSERT".into()))?;
        for s in statements {
            session.execute(s).await?;
        }
        // The server never waits for a job.
        session.sql("SET 'table.dml-sync' = 'false'").await?;
        session.execute(insert).await
    }

    /// `RESUME JOB` / `RESTART JOB`.
    async fn resume_job(&self, r: &ResumeJob) -> Result<Output> {
        let jobs = self.session.jobs();
        if jobs.is_active(&r.name) {
            if !r.restart {
                return Err(Error::Plan(format!(
                    "job '{}' is running; RESTART JOB '{}' stops it (with a final \
                     checkpoint) and starts it again",
                    r.name, r.name
                )));
            }
            jobs.stop(&r.name).await?;
        }
        let Some(script) = self.state.job_script(&r.name)? else {
            return Err(Error::NotFound(format!(
                "the server never ran a job '{}' (SHOW JOBS lists its jobs)",
                r.name
            )));
        };
        let output = self.start_script(&script).await?;
        self.state.job_resumed(&r.name)?;
        Ok(output)
    }
}

/// Run the server until SIGINT or SIGTERM.
pub async fn serve(options: ServeOptions) -> Result<()> {
    for addr in [options.listen, options.dashboard] {
        if !addr.ip().is_loopback() && options.password.is_none() {
            return Err(Error::Unsupported(format!(
                "listening on {addr} without a password: a server without one listens on \
                 a loopback address only (127.0.0.1 or ::1); give it a password \
                 (--password-file or FLOE_SERVER_PASSWORD) to listen on others"
            )));
        }
    }
    let acceptor = options.tls.as_ref().map(Tls::acceptor).transpose()?;
    let state = ServerState::open(&options.state_dir)?;
    let session = Session::new();
    let checkpoints = state.checkpoints();
    session
        .sql(&format!(
            "SET 'state.dir' = '{}'",
            checkpoints.display().to_string().replace('\'', "''")
        ))
        .await?;
    for file in &options.init {
        run_init(&session, file).await?;
    }
    for definition in state.definitions() {
        if let Err(e) = session.sql(&definition).await
            && !matches!(e, Error::AlreadyExists(_))
        {
            eprintln!("floe serve: could not restore `{definition}`: {e}");
        }
    }
    let home = postgres_catalog(&session, &options.user)?;
    let server = Arc::new(Server {
        session,
        state,
        connections: Arc::new(ConnectionManager::new()),
        credentials: options
            .password
            .as_deref()
            .map(|p| Arc::new(auth::Credentials::new(options.user.clone(), p))),
        user: options.user.clone(),
        home,
    });
    resume_jobs(&server).await;
    let listener = TcpListener::bind(options.listen)
        .await
        .map_err(|source| Error::Io {
            context: format!("listening on {}", options.listen),
            source,
        })?;
    let address = listener.local_addr().map_err(|source| Error::Io {
        context: "reading the listening address".into(),
        source,
    })?;
    eprintln!(
        "floe serve: listening on {address} (psql -h {} -p {})",
        address.ip(),
        address.port()
    );
    let _watch = AbortOnDrop::from(tokio::spawn(forget_finished_jobs(server.clone())));
    let board = Arc::new(dashboard::Dashboard::new(
        server.session.jobs().clone(),
        options
            .password
            .as_deref()
            .map(|p| (options.user.as_str(), p)),
    ));
    let _sampler = AbortOnDrop::from(tokio::spawn(board.clone().run()));
    let http = http::bind(&options.dashboard.to_string(), "the dashboard address").await?;
    eprintln!("floe serve: dashboard on http://{}/", options.dashboard);
    let _dashboard = AbortOnDrop::from(http::serve(
        http,
        Arc::new(move |request: &http::Request| board.answer(request)),
    ));
    let accept = async {
        loop {
            let (socket, _) = match listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("floe serve: accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let handlers = pg::Handlers::new(&server);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let _ = pgwire::tokio::process_socket(socket, acceptor, handlers).await;
            });
        }
    };
    tokio::select! {
        _ = accept => {}
        _ = shutdown_signal() => {}
    }
    eprintln!("floe serve: stopping; every job takes a final checkpoint");
    server.session.jobs().stop_all().await;
    Ok(())
}

/// What PostgreSQL clients read about the server: the schema `pg_catalog` in the session's
/// default catalog (returned: every connection's catalog queries are pointed there) and the
/// functions their catalog queries call. Done before any connection's session is forked.
fn postgres_catalog(session: &Session, user: &str) -> Result<String> {
    let ctx = session.context();
    let home = session.default_catalog();
    let catalog = ctx
        .catalog(&home)
        .ok_or_else(|| Error::Internal(format!("the default catalog '{home}' is missing")))?;
    catalog
        .register_schema(
            pg_catalog::PG_CATALOG,
            Arc::new(pg_catalog::PgCatalogSchema::new(user.to_string())),
        )
        .map_err(|e| Error::Internal(format!("registering pg_catalog: {e}")))?;
    for f in pg_functions::functions(user) {
        ctx.register_udf(f);
    }
    Ok(home)
}

async fn run_init(session: &Session, file: &Path) -> Result<()> {
    let sql = std::fs::read_to_string(file).map_err(|source| Error::Io {
        context: format!("reading {}", file.display()),
        source,
    })?;
    session
        .sql(&sql)
        .await
        .map(|_| ())
        .map_err(|e| Error::Plan(format!("{}: {e}", file.display())))
}

/// Start every job the state directory holds again, each in a session of its own with the
/// settings it was submitted with; it resumes from its last checkpoint.
async fn resume_jobs(server: &Server) {
    let jobs = match server.state.jobs() {
        Ok(j) => j,
        Err(e) => {
            eprintln!("floe serve: {e}");
            return;
        }
    };
    for (path, script) in jobs {
        match server.start_script(&script).await {
            Ok(_) => eprintln!("floe serve: resumed {}", path.display()),
            Err(e) => eprintln!("floe serve: could not resume {}: {e}", path.display()),
        }
    }
}

/// Jobs whose sources are exhausted are done: they are not started again (unless resumed).
async fn forget_finished_jobs(server: Arc<Server>) {
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        for row in server.session.jobs().rows() {
            if row.state == JobState::Finished.to_string()
                && let Err(e) = server.state.job_stopped(&row.name)
            {
                eprintln!("floe serve: {e}");
            }
        }
    }
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return std::future::pending().await;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
