//! The `floe` command: a REPL, a script runner and a one-statement runner.
//!
//! ```text
//! floe                      REPL (history, multi-line, completion, \? for help)
//! floe -f FILE [-f FILE]    run scripts; stop at the first failing statement
//! floe -c SQL  [-c SQL]     run statements
//! ```

pub mod print;
pub mod remote;
pub mod repl;

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use clap::Parser as ClapParser;

use crate::error::{Error, Result};
use crate::session::{Output, Session};
use crate::sql::{ScriptStatement, split_statements};
use crate::task::AbortOnDrop;
pub use print::{Format, PrintOptions};

/// floe: streaming SQL for the lakehouse, on Apache DataFusion and Apache Iceberg.
#[derive(Debug, ClapParser)]
#[command(name = "floe", version, about)]
pub struct Args {
    /// Run the SQL script FILE (repeatable; run in order, after any -c).
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Run the SQL statements COMMAND (repeatable; run in order).
    #[arg(short = 'c', long = "command", value_name = "COMMAND")]
    pub commands: Vec<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Rows the table format shows at most; 0 for all.
    #[arg(long, default_value_t = 40)]
    pub maxrows: usize,
    /// Print results only: no row counts, timings or statement tags.
    #[arg(short, long)]
    pub quiet: bool,
    /// In scripts, report a failing statement and go on with the next.
    #[arg(long)]
    pub continue_on_error: bool,
    /// Serve job metrics in the Prometheus text format on ADDR (e.g. 127.0.0.1:9249).
    #[arg(long, value_name = "ADDR", conflicts_with = "connect")]
    pub metrics: Option<String>,
    /// Run the statements on the floe server at URL (postgres://user@host:port/catalog)
    /// instead of in this process; a password comes from the URL or PGPASSWORD.
    #[arg(long, value_name = "URL")]
    pub connect: Option<String>,
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// What floe runs instead of a REPL or scripts.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Run a server that owns the jobs and speaks the PostgreSQL protocol (psql, psycopg, JDBC).
    Serve {
        /// The address to listen on (loopback only, for now).
        #[arg(long, default_value = "127.0.0.1:5433", value_name = "ADDR")]
        listen: std::net::SocketAddr,
        /// Where the server keeps its catalogs, sources, jobs and checkpoints.
        #[arg(long, default_value = ".floe-server", value_name = "DIR")]
        state_dir: PathBuf,
        /// Run the SQL script FILE at every start (repeatable), before the state is restored.
        #[arg(short = 'f', long = "file", value_name = "FILE")]
        init: Vec<PathBuf>,
        /// The user clients log in as (with the password).
        #[arg(long, default_value = "floe", value_name = "NAME")]
        user: String,
        /// Clients log in with the password in FILE (SCRAM-SHA-256); FLOE_SERVER_PASSWORD
        /// gives it too. Without one, only loopback addresses are served.
        #[arg(long, value_name = "FILE")]
        password_file: Option<PathBuf>,
        /// TLS: the server's certificate (PEM), with --tls-key.
        #[arg(long, value_name = "FILE", requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        /// TLS: the certificate's private key (PEM), with --tls-cert.
        #[arg(long, value_name = "FILE", requires = "tls_cert")]
        tls_key: Option<PathBuf>,
        /// Serve the dashboard (and /metrics, Prometheus) over HTTP on ADDR.
        #[arg(long, default_value = "127.0.0.1:5480", value_name = "ADDR")]
        dashboard: std::net::SocketAddr,
    },
}

impl Args {
    fn print_options(&self) -> PrintOptions {
        PrintOptions {
            format: self.format,
            max_rows: (self.maxrows > 0).then_some(self.maxrows),
            quiet: self.quiet,
        }
    }
}

/// Run the command line; the result is the process exit code.
pub async fn main(args: Args) -> i32 {
    if let Some(Command::Serve {
        listen,
        state_dir,
        init,
        user,
        password_file,
        tls_cert,
        tls_key,
        dashboard,
    }) = &args.command
    {
        let password = match password_file {
            Some(file) => match std::fs::read_to_string(file) {
                Ok(p) => Some(p.trim_end_matches(['\n', '\r']).to_string()),
                Err(e) => {
                    eprintln!("Error: cannot read {}: {e}", file.display());
                    return 2;
                }
            },
            None => std::env::var("FLOE_SERVER_PASSWORD").ok(),
        };
        if password.as_deref() == Some("") {
            eprintln!("Error: the server's password is empty");
            return 2;
        }
        let tls = match (tls_cert, tls_key) {
            (Some(cert), Some(key)) => Some(crate::server::Tls {
                cert: cert.clone(),
                key: key.clone(),
            }),
            _ => None,
        };
        let options = crate::server::ServeOptions {
            listen: *listen,
            state_dir: state_dir.clone(),
            init: init.clone(),
            user: user.clone(),
            password,
            tls,
            dashboard: *dashboard,
        };
        return match crate::server::serve(options).await {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("Error: {e}");
                2
            }
        };
    }
    let print = args.print_options();
    let repl = args.commands.is_empty() && args.files.is_empty();
    if let Some(url) = &args.connect {
        let backend = match remote::Remote::connect(url).await {
            Ok(r) => Backend::Remote(Box::new(r)),
            Err(e) => {
                eprintln!("Error: {e}");
                return 2;
            }
        };
        return run_backend(&backend, &args, print, repl).await;
    }
    let session = Arc::new(Session::new());
    let _metrics = match &args.metrics {
        Some(addr) => match crate::server::metrics::serve(addr, session.clone()).await {
            Ok(task) => Some(AbortOnDrop::from(task)),
            Err(e) => {
                eprintln!("Error: {e}");
                return 2;
            }
        },
        None => None,
    };
    let backend = Backend::Local(session);
    run_backend(&backend, &args, print, repl).await
}

/// Where statements run: this process's session, or a server (`--connect`).
pub enum Backend {
    Local(Arc<Session>),
    Remote(Box<remote::Remote>),
}

impl Backend {
    /// The local session, if statements run here.
    pub fn session(&self) -> Option<&Session> {
        match self {
            Backend::Local(s) => Some(s),
            Backend::Remote(_) => None,
        }
    }

    /// Run one statement; Ctrl-C cancels it (on a server, with a cancel request).
    pub async fn execute(&self, stmt: &ScriptStatement) -> Result<Output> {
        match self {
            Backend::Local(session) => {
                let parsed = stmt.parse()?;
                tokio::select! {
                    r = session.execute(parsed) => r,
                    _ = crate::interrupt::interrupted() => Err(Error::Cancelled),
                }
            }
            Backend::Remote(remote) => {
                let text = stmt.text();
                let run = remote.execute(&text);
                tokio::pin!(run);
                tokio::select! {
                    r = &mut run => r,
                    _ = crate::interrupt::interrupted() => {
                        // The server answers the statement with an error once cancelled.
                        remote.cancel().await?;
                        run.await
                    }
                }
            }
        }
    }
}

/// The REPL, or the -c commands and -f scripts (then the jobs they started), on `backend`.
async fn run_backend(backend: &Backend, args: &Args, print: PrintOptions, repl: bool) -> i32 {
    // The REPL installs its handler after the line editor, which sets its own.
    if !repl && let Err(e) = crate::interrupt::install(true) {
        eprintln!("Warning: Ctrl-C will not cancel statements: {e}");
    }
    if repl {
        return match repl::run(backend, print).await {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("Error: {e}");
                1
            }
        };
    }
    let failed = run_all(backend, args, print).await;
    // A server's jobs run on there; this process's are waited for.
    let jobs_failed = match backend.session() {
        Some(session) => wait_for_jobs(session).await,
        None => false,
    };
    i32::from(failed || jobs_failed)
}

/// Run the -c commands, then the -f files. Returns whether any statement failed.
async fn run_all(session: &Backend, args: &Args, print: PrintOptions) -> bool {
    let mut failed = false;
    for (i, sql) in args.commands.iter().enumerate() {
        let source = format!("-c #{}", i + 1);
        if !run_script(session, &source, sql, print, args.continue_on_error).await {
            failed = true;
            if !args.continue_on_error {
                return true;
            }
        }
    }
    for file in &args.files {
        let source = file.display().to_string();
        let sql = match std::fs::read_to_string(file) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("Error: cannot read {source}: {e}");
                return true;
            }
        };
        if !run_script(session, &source, &sql, print, args.continue_on_error).await {
            failed = true;
            if !args.continue_on_error {
                return true;
            }
        }
    }
    failed
}

/// Let running jobs finish (bounded sources) or, on SIGINT / SIGTERM, stop them with a final
/// checkpoint. Returns whether any job failed.
pub async fn wait_for_jobs(session: &Session) -> bool {
    let jobs = session.jobs();
    if !jobs.any_active() {
        return report_failures(jobs.wait_all().await);
    }
    let progress = async {
        if !std::io::stderr().is_terminal() {
            return std::future::pending::<()>().await;
        }
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            eprint!("\r\x1b[2K{}", progress_line(&jobs.rows()));
        }
    };
    tokio::select! {
        failures = jobs.wait_all() => {
            if std::io::stderr().is_terminal() {
                eprint!("\r\x1b[2K");
            }
            return report_failures(failures);
        }
        _ = crate::interrupt::interrupted() => {}
        _ = progress => {}
    }
    eprintln!("stopping jobs: taking a final checkpoint...");
    jobs.stop_all().await;
    report_failures(jobs.wait_all().await)
}

/// One line about the running jobs: rate, rows, last checkpoint.
fn progress_line(rows: &[crate::stream::registry::JobRow]) -> String {
    rows.iter()
        .filter(|r| matches!(r.state.as_str(), "running" | "starting" | "retrying"))
        .map(|r| {
            let mut s = format!(
                "{}: {} in, {} out, {:.0}/s, checkpoint {}",
                r.name, r.records_in, r.records_out, r.rate, r.checkpoint
            );
            if r.records_dead > 0 {
                s.push_str(&format!(", {} dead-lettered", r.records_dead));
            }
            if r.state == "retrying" {
                s.push_str(" (retrying)");
            }
            s
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

fn report_failures(failures: Vec<(String, String)>) -> bool {
    for (name, error) in &failures {
        eprintln!("Error: job '{name}' failed: {error}");
    }
    !failures.is_empty()
}

/// Run a script statement by statement. Returns false if any statement failed; stops at
/// the first failure unless `keep_going`.
pub async fn run_script(
    session: &Backend,
    source: &str,
    sql: &str,
    print: PrintOptions,
    keep_going: bool,
) -> bool {
    let statements = match split_statements(sql) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("Error in {source}: {e}");
            return false;
        }
    };
    let mut ok = true;
    for stmt in statements {
        if let Err(e) = run_statement(session, &stmt, print).await {
            eprintln!("Error in {source} at line {}: {e}", stmt.line);
            ok = false;
            if !keep_going {
                return false;
            }
        }
    }
    ok
}

/// Run one statement and print its output; Ctrl-C cancels the statement.
pub async fn run_statement(
    backend: &Backend,
    stmt: &ScriptStatement,
    print: PrintOptions,
) -> Result<()> {
    let start = Instant::now();
    let output = backend.execute(stmt).await?;
    let mut out = std::io::stdout().lock();
    print.print(&mut out, &output, start.elapsed())?;
    out.flush().map_err(|e| Error::io("writing output", e))
}
