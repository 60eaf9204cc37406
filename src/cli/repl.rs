//! The interactive shell: rustyline with persistent history, multi-line statements ended
//! by `;` (checked with floe's own tokenizer), completion of keywords and of catalog,
//! namespace and table names, and backslash commands.

use std::borrow::Cow;
use std::sync::{Arc, Mutex};

use rustyline::completion::{Completer, Pair};
use rustyline::error::ReadlineError;
use rustyline::highlight::Highlighter;
use rustyline::hint::Hinter;
use rustyline::history::FileHistory;
use rustyline::validate::{ValidationContext, ValidationResult, Validator};
use rustyline::{CompletionType, Config, Context, Editor, Helper};

use super::{Backend, PrintOptions, run_statement};
use crate::error::{Error, Result};
use crate::session::{Output, Session};
use crate::sql::parser::mask_secrets;
use crate::sql::{ScriptStatement, is_complete, split_statements};

const HELP: &str = r#"floe: SQL ends with ';' and may span lines.

  \?            this help
  \q            quit (or Ctrl-D)
  \d            list tables               (SHOW TABLES)
  \d NAME       describe a table          (DESCRIBE NAME)
  \dn           list namespaces           (SHOW SCHEMAS)
  \dc           list catalogs             (SHOW CATALOGS)

  Ctrl-C cancels the running statement; at the prompt it clears the line.

Examples:
  CREATE CATALOG lake WITH ('type' = 'iceberg', 'catalog-type' = 'sql',
    'uri' = 'sqlite:lake/catalog.db', 'warehouse' = 'lake/warehouse');
  CREATE SCHEMA lake.db;
  CREATE TABLE lake.db.t (id BIGINT, ts TIMESTAMP) PARTITIONED BY (days(ts));
  INSERT INTO lake.db.t VALUES (1, TIMESTAMP '2024-05-01 10:00:00');
  SELECT * FROM lake.db.t;
  SELECT * FROM lake.db."t$snapshots";
  SELECT * FROM lake.db.t FOR VERSION AS OF <snapshot id>;
"#;

const KEYWORDS: &[&str] = &[
    "SELECT",
    "FROM",
    "WHERE",
    "GROUP BY",
    "ORDER BY",
    "HAVING",
    "LIMIT",
    "JOIN",
    "LEFT JOIN",
    "INNER JOIN",
    "ON",
    "AS",
    "AND",
    "OR",
    "NOT",
    "NULL",
    "IS",
    "IN",
    "BETWEEN",
    "LIKE",
    "DISTINCT",
    "COUNT",
    "SUM",
    "AVG",
    "MIN",
    "MAX",
    "CAST",
    "CASE",
    "WHEN",
    "THEN",
    "ELSE",
    "END",
    "INSERT INTO",
    "VALUES",
    "CREATE",
    "CATALOG",
    "SCHEMA",
    "NAMESPACE",
    "TABLE",
    "DROP",
    "SHOW",
    "CATALOGS",
    "SCHEMAS",
    "TABLES",
    "DESCRIBE",
    "EXPLAIN",
    "WITH",
    "PARTITIONED BY",
    "IF NOT EXISTS",
    "IF EXISTS",
    "FOR VERSION AS OF",
    "FOR TIMESTAMP AS OF",
    "SET",
    "UNION ALL",
    "BIGINT",
    "INT",
    "STRING",
    "DOUBLE",
    "BOOLEAN",
    "TIMESTAMP",
    "DATE",
    "DECIMAL",
];

/// The rustyline helper: validation and completion.
struct FloeHelper {
    names: Arc<Mutex<Vec<String>>>,
}

impl Helper for FloeHelper {}

impl Hinter for FloeHelper {
    type Hint = String;
}

impl Highlighter for FloeHelper {
    fn highlight_prompt<'b, 's: 'b, 'p: 'b>(
        &'s self,
        prompt: &'p str,
        _default: bool,
    ) -> Cow<'b, str> {
        Cow::Borrowed(prompt)
    }
}

impl Validator for FloeHelper {
    fn validate(&self, ctx: &mut ValidationContext<'_>) -> rustyline::Result<ValidationResult> {
        let input = ctx.input().trim();
        if input.is_empty() || input.starts_with('\\') || is_complete(input) {
            Ok(ValidationResult::Valid(None))
        } else {
            Ok(ValidationResult::Incomplete)
        }
    }
}

impl Completer for FloeHelper {
    type Candidate = Pair;

    fn complete(
        &self,
        line: &str,
        pos: usize,
        _ctx: &Context<'_>,
    ) -> rustyline::Result<(usize, Vec<Pair>)> {
        let start = line[..pos]
            .rfind(|c: char| c.is_whitespace() || "(),;".contains(c))
            .map_or(0, |i| i + 1);
        let word = &line[start..pos];
        if word.is_empty() {
            return Ok((pos, Vec::new()));
        }
        let lower = word.to_ascii_lowercase();
        let mut out: Vec<Pair> = Vec::new();
        if let Ok(names) = self.names.lock() {
            for n in names
                .iter()
                .filter(|n| n.to_ascii_lowercase().starts_with(&lower))
            {
                out.push(Pair {
                    display: n.clone(),
                    replacement: n.clone(),
                });
            }
        }
        if !word.contains('.') {
            let upper_typed = word.chars().all(|c| !c.is_ascii_lowercase());
            for k in KEYWORDS
                .iter()
                .filter(|k| k.to_ascii_lowercase().starts_with(&lower))
            {
                let replacement = if upper_typed {
                    k.to_string()
                } else {
                    k.to_ascii_lowercase()
                };
                out.push(Pair {
                    display: k.to_string(),
                    replacement,
                });
            }
        }
        // Sorted, an exact match first, duplicates out.
        out.sort_by(|a, b| {
            (a.display.to_ascii_lowercase() != lower, &a.display)
                .cmp(&(b.display.to_ascii_lowercase() != lower, &b.display))
        });
        out.dedup_by(|a, b| a.display == b.display);
        Ok((start, out))
    }
}

/// Names for completion: catalogs, `catalog.namespace` and `catalog.namespace.table`; on a
/// server, its tables as its `information_schema` lists them.
async fn completion_names(backend: &Backend) -> Vec<String> {
    let Backend::Remote(remote) = backend else {
        return match backend.session() {
            Some(session) => local_names(session).await,
            None => Vec::new(),
        };
    };
    let sql = "SELECT table_catalog, table_schema, table_name FROM information_schema.tables \
               WHERE table_schema NOT IN ('information_schema', 'pg_catalog')";
    let Ok(Output::Rows(_, batches)) = remote.execute(sql).await else {
        return Vec::new();
    };
    let mut names = std::collections::BTreeSet::new();
    for batch in &batches {
        let columns: Vec<Vec<String>> = (0..3)
            .map(|i| {
                let c = batch.column(i);
                let c = c
                    .as_any()
                    .downcast_ref::<datafusion::arrow::array::StringArray>();
                c.map(|c| {
                    c.iter()
                        .map(|v| v.unwrap_or_default().to_string())
                        .collect()
                })
                .unwrap_or_default()
            })
            .collect();
        for ((c, s), t) in columns[0].iter().zip(&columns[1]).zip(&columns[2]) {
            names.insert(c.clone());
            names.insert(format!("{c}.{s}"));
            names.insert(format!("{c}.{s}.{t}"));
        }
    }
    names.into_iter().collect()
}

async fn local_names(session: &Session) -> Vec<String> {
    let mut names = Vec::new();
    for (name, handle) in session.catalogs() {
        names.push(name.clone());
        let Ok(namespaces) = handle.catalog.list_namespaces(None).await else {
            continue;
        };
        for ns in namespaces {
            names.push(format!("{name}.{}", ns.to_url_string()));
            if let Ok(tables) = handle.catalog.list_tables(&ns).await {
                for t in tables {
                    names.push(format!("{name}.{}.{}", ns.to_url_string(), t.name()));
                }
            }
        }
    }
    names
}

/// Translate a backslash command into the statement it stands for.
fn backslash(cmd: &str) -> Result<Option<String>> {
    let mut parts = cmd.trim().trim_end_matches(';').split_whitespace();
    let head = parts.next().unwrap_or_default();
    let arg = parts.next();
    Ok(Some(match (head, arg) {
        ("\\q", _) => return Ok(None),
        ("\\?" | "\\h" | "\\help", _) => {
            print!("{HELP}");
            return Ok(Some(String::new()));
        }
        ("\\d", None) => "SHOW TABLES".to_string(),
        ("\\d", Some(name)) => format!("DESCRIBE {name}"),
        ("\\dn", None) => "SHOW SCHEMAS".to_string(),
        ("\\dn", Some(c)) => format!("SHOW SCHEMAS IN {c}"),
        ("\\dc", _) => "SHOW CATALOGS".to_string(),
        _ => {
            return Err(Error::Syntax(format!(
                "unknown command '{head}'; \\? lists the commands"
            )));
        }
    }))
}

fn history_path() -> Option<std::path::PathBuf> {
    dirs::home_dir().map(|h| h.join(".floe_history"))
}

/// Run the REPL until `\q` or end of input.
pub async fn run(backend: &Backend, print: PrintOptions) -> Result<()> {
    let names = Arc::new(Mutex::new(Vec::new()));
    let config = Config::builder()
        .completion_type(CompletionType::List)
        .auto_add_history(false)
        .build();
    let mut rl: Editor<FloeHelper, FileHistory> = Editor::with_config(config)
        .map_err(|e| Error::Internal(format!("starting the line editor: {e}")))?;
    // After the editor: its SIGINT handler stays first in line, ours chains after it.
    if let Err(e) = crate::interrupt::install(false) {
        eprintln!("Warning: Ctrl-C will not cancel statements: {e}");
    }
    rl.set_helper(Some(FloeHelper {
        names: names.clone(),
    }));
    let history = history_path();
    if let Some(h) = &history {
        let _ = rl.load_history(h);
    }
    println!(
        "floe {} — SQL ends with ';'. \\? for help, \\q to quit.",
        env!("CARGO_PKG_VERSION")
    );
    if let Backend::Remote(remote) = backend {
        println!("connected to {}", remote.address());
    }
    loop {
        match rl.readline("floe> ") {
            Ok(line) => {
                let text = line.trim();
                if text.is_empty() {
                    continue;
                }
                // Kept with secrets masked (option values, URL passwords), as typed otherwise.
                if let Some(kept) = mask_secrets(text).filter(|_| text != "\\q") {
                    let _ = rl.add_history_entry(kept);
                    // Saved at once: a closed terminal loses nothing.
                    if let Some(h) = &history {
                        let _ = rl.append_history(h);
                    }
                }
                let sql = if text.starts_with('\\') {
                    match backslash(text) {
                        Ok(None) => break,
                        Ok(Some(s)) if s.is_empty() => continue,
                        Ok(Some(s)) => s,
                        Err(e) => {
                            eprintln!("Error: {e}");
                            continue;
                        }
                    }
                } else {
                    text.to_string()
                };
                let statements: Vec<ScriptStatement> = match split_statements(&sql) {
                    Ok(s) => s,
                    Err(e) => {
                        eprintln!("Error: {e}");
                        continue;
                    }
                };
                for stmt in &statements {
                    if let Err(e) = run_statement(backend, stmt, print).await {
                        eprintln!("Error: {e}");
                        break;
                    }
                }
                let fresh = completion_names(backend).await;
                if let Ok(mut n) = names.lock() {
                    *n = fresh;
                }
            }
            Err(ReadlineError::Interrupted) => continue,
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(Error::Internal(format!("line editor: {e}"))),
        }
    }
    // A server's jobs run on after its client; this process's stop with it.
    if let Some(session) = backend.session()
        && session.jobs().any_active()
    {
        println!("stopping jobs: taking a final checkpoint...");
        session.jobs().stop_all().await;
    }
    Ok(())
}
