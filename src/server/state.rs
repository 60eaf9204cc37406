//! What a server keeps in its state directory to start again as it was: the catalogs and
//! sources clients defined, and the jobs they submitted.
//!
//! ```text
//! DIR/definitions.sql   CREATE CATALOG / CREATE SOURCE / CREATE VIEW statements, in the
//!                       order they were made (a DROP takes its statement out); replayed on
//!                       start, in the server's session (a view's names resolve as there)
//! DIR/jobs/<job>.sql    a job that is to run: the SET statements of the session that
//!                       submitted it, then its INSERT; resumed on start (from its last
//!                       checkpoint)
//! DIR/stopped/<job>.sql a job stopped by STOP JOB or done (its sources exhausted): not
//!                       started again, until RESUME JOB moves it back
//! DIR/checkpoints/      the jobs' checkpoint records (the `state.dir` setting)
//! ```
//! The statements hold what defines a catalog or source, secrets too: the folder is the
//! server user's alone (mode 0700, files 0600). Every file is replaced atomically.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{ObjectName, ObjectType, Statement as SQLStatement};

use crate::error::{Error, Result};

/// What a definition defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Catalog,
    Source,
    View,
}

/// The name of the view `stmt` creates, as the server keeps it.
pub fn created_view(stmt: &crate::sql::Statement) -> Option<String> {
    match sql_statement(stmt)? {
        SQLStatement::CreateView(v) => Some(view_key(&v.name)),
        _ => None,
    }
}

/// The names of the views `stmt` drops.
pub fn dropped_views(stmt: &crate::sql::Statement) -> Vec<String> {
    match sql_statement(stmt) {
        Some(SQLStatement::Drop {
            object_type: ObjectType::View,
            names,
            ..
        }) => names.iter().map(view_key).collect(),
        _ => Vec::new(),
    }
}

fn sql_statement(stmt: &crate::sql::Statement) -> Option<&SQLStatement> {
    match stmt {
        crate::sql::Statement::DataFusion(s) => match s.as_ref() {
            DFStatement::Statement(s) => Some(s),
            _ => None,
        },
        _ => None,
    }
}

/// A view's name as written, lower-cased (unquoted names are, as DataFusion resolves them).
fn view_key(name: &ObjectName) -> String {
    name.to_string().to_lowercase()
}

/// The server's state directory.
#[derive(Debug)]
pub struct ServerState {
    dir: PathBuf,
    /// (kind, name, statement), in the order they were made.
    definitions: Mutex<Vec<(Kind, String, String)>>,
}

fn io(context: String) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Io { context, source }
}

/// Write `text` to `path` as a whole: a file beside it, synced, renamed over it.
fn replace(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let what = || format!("writing {}", path.display());
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(&tmp).map_err(io(what()))?;
    file.write_all(text.as_bytes()).map_err(io(what()))?;
    file.sync_all().map_err(io(what()))?;
    std::fs::rename(&tmp, path).map_err(io(what()))
}

/// The file name of job `name`'s statements: its name with anything but letters, digits,
/// `-`, `_` and `.` spelled as `%XX`, so any job name makes one file of its own.
fn job_file(name: &str) -> String {
    let mut out = String::new();
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || (b == b'.' && !out.is_empty()) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    format!("{out}.sql")
}

/// Statements one per line group, each ended by `;` on a line of its own (the format of the
/// files here; statements print on one line).
fn script(statements: &[String]) -> String {
    statements.iter().map(|s| format!("{s}\n;\n")).collect()
}

impl ServerState {
    /// Open (create) the state directory `dir`.
    pub fn open(dir: &Path) -> Result<Self> {
        for d in [
            dir.to_path_buf(),
            dir.join("jobs"),
            dir.join("stopped"),
            dir.join("checkpoints"),
        ] {
            std::fs::create_dir_all(&d).map_err(io(format!("creating {}", d.display())))?;
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(io(format!("restricting {}", dir.display())))?;
        }
        let path = dir.join("definitions.sql");
        let mut definitions = Vec::new();
        if path.exists() {
            let text = std::fs::read_to_string(&path)
                .map_err(io(format!("reading {}", path.display())))?;
            for stmt in crate::sql::parse_sql(&text)? {
                let text = stmt.to_string();
                if let Some(view) = created_view(&stmt) {
                    definitions.push((Kind::View, view, text));
                    continue;
                }
                match stmt {
                    crate::sql::Statement::CreateCatalog(c) => {
                        definitions.push((Kind::Catalog, c.name, text))
                    }
                    crate::sql::Statement::CreateSource(s) => {
                        definitions.push((Kind::Source, s.name, text))
                    }
                    _ => {
                        return Err(Error::Plan(format!(
                            "{} holds a statement that defines no catalog, source or \
                             view: {text}",
                            path.display()
                        )));
                    }
                }
            }
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            definitions: Mutex::new(definitions),
        })
    }

    /// Where the jobs keep their checkpoint records.
    pub fn checkpoints(&self) -> PathBuf {
        self.dir.join("checkpoints")
    }

    /// The definitions, in the order they were made.
    pub fn definitions(&self) -> Vec<String> {
        self.lock().iter().map(|(_, _, s)| s.clone()).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(Kind, String, String)>> {
        self.definitions.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn save(&self, definitions: &[(Kind, String, String)]) -> Result<()> {
        let statements: Vec<String> = definitions.iter().map(|(_, _, s)| s.clone()).collect();
        replace(&self.dir.join("definitions.sql"), &script(&statements))
    }

    /// A catalog, source or view was created (`statement`); it replaces one of the same
    /// name (and goes last: it may use what was defined since).
    pub fn define(&self, kind: Kind, name: &str, statement: String) -> Result<()> {
        let mut d = self.lock();
        d.retain(|(k, n, _)| !(*k == kind && n == name));
        d.push((kind, name.to_string(), statement));
        self.save(&d)
    }

    /// A catalog, source or view was dropped.
    pub fn undefine(&self, kind: Kind, name: &str) -> Result<()> {
        let mut d = self.lock();
        let before = d.len();
        d.retain(|(k, n, _)| !(*k == kind && n == name));
        if d.len() == before {
            return Ok(());
        }
        self.save(&d)
    }

    /// Job `name` started: `settings` (SET statements) then `insert` start it again.
    pub fn job_started(&self, name: &str, settings: &[String], insert: String) -> Result<()> {
        let mut statements = settings.to_vec();
        statements.push(insert);
        replace(
            &self.dir.join("jobs").join(job_file(name)),
            &script(&statements),
        )
    }

    /// Job `name` is not to run again (stopped by a client, or done) unless resumed.
    pub fn job_stopped(&self, name: &str) -> Result<()> {
        self.move_job(name, "jobs", "stopped")
    }

    /// Job `name` runs again.
    pub fn job_resumed(&self, name: &str) -> Result<()> {
        self.move_job(name, "stopped", "jobs")
    }

    fn move_job(&self, name: &str, from: &str, to: &str) -> Result<()> {
        let file = job_file(name);
        let (from, to) = (
            self.dir.join(from).join(&file),
            self.dir.join(to).join(&file),
        );
        match std::fs::rename(&from, &to) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io(format!("moving {} to {}", from.display(), to.display()))(e)),
        }
    }

    /// The statements that start job `name`, running or stopped; `None` if the server
    /// never ran it.
    pub fn job_script(&self, name: &str) -> Result<Option<String>> {
        let file = job_file(name);
        for folder in ["jobs", "stopped"] {
            let path = self.dir.join(folder).join(&file);
            match std::fs::read_to_string(&path) {
                Ok(text) => return Ok(Some(text)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(format!("reading {}", path.display()))(e)),
            }
        }
        Ok(None)
    }

    /// The jobs to run, each as its file and its statements.
    pub fn jobs(&self) -> Result<Vec<(PathBuf, String)>> {
        let dir = self.dir.join("jobs");
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(io(format!("listing {}", dir.display())))? {
            let path = entry
                .map_err(io(format!("listing {}", dir.display())))?
                .path();
            if path.extension().is_some_and(|e| e == "sql") {
                let text = std::fs::read_to_string(&path)
                    .map_err(io(format!("reading {}", path.display())))?;
                out.push((path, text));
            }
        }
        out.sort();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definitions_and_jobs_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let state = ServerState::open(dir.path()).unwrap();
        let catalog = "CREATE CATALOG lake WITH ('type' = 'iceberg', 'catalog-type' = 'memory')";
        let source = "CREATE SOURCE s WITH ('connector' = 'datagen')";
        state.define(Kind::Catalog, "lake", catalog.into()).unwrap();
        state.define(Kind::Source, "s", source.into()).unwrap();
        state
            .define(Kind::Source, "t", source.replace(" s ", " t "))
            .unwrap();
        state.undefine(Kind::Source, "t").unwrap();
        state
            .job_started(
                "a/b c",
                &["SET 'checkpoint.interval' = '1s'".into()],
                "INSERT".into(),
            )
            .unwrap();
        state.job_started("gone", &[], "INSERT 2".into()).unwrap();
        state.job_stopped("gone").unwrap();

        let again = ServerState::open(dir.path()).unwrap();
        let defined = again.definitions();
        assert_eq!(defined.len(), 2, "{defined:?}");
        assert!(defined[0].starts_with("CREATE CATALOG lake"), "{defined:?}");
        assert!(defined[1].starts_with("CREATE SOURCE s"), "{defined:?}");
        let jobs = again.jobs().unwrap();
        assert_eq!(jobs.len(), 1);
        assert!(jobs[0].0.ends_with("a%2Fb%20c.sql"), "{:?}", jobs[0].0);
        assert_eq!(
            jobs[0].1,
            "SET 'checkpoint.interval' = '1s'\n;\nINSERT\n;\n"
        );
        // A stopped job is kept aside, to be resumed.
        assert_eq!(
            again.job_script("gone").unwrap().as_deref(),
            Some("INSERT 2\n;\n")
        );
        again.job_resumed("gone").unwrap();
        assert_eq!(again.jobs().unwrap().len(), 2);
        assert_eq!(again.job_script("never").unwrap(), None);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join("definitions.sql"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }
}
