//! The `WITH (...)` options of a routed INSERT, and the table name a route value becomes.

use std::collections::BTreeMap;

use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser as SqlParser;

use crate::error::{Error, Result};
use crate::schema::partition::partition_field;
use crate::sink::table_sink::Candidate;
use crate::sql::Options;

/// By default (`route.buffer-size`): beyond this many bytes of routed batches whose rows
/// tables gather (as slices of them), every table's gathering becomes a row group of its
/// table's open files, in the background; the next time waits for that. So rows gathered
/// and rows being written take at most twice this. (Rows are gathered in Arrow rather than in row groups under way: a
/// row group being written costs about a MiB per table in encoders and compression contexts
/// however few rows it holds.)
pub const BUFFER_SIZE: usize = 128 << 20;

/// The options of a routed INSERT.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteOptions {
    pub candidates: Vec<Candidate>,
    pub evolve: bool,
    pub table_properties: BTreeMap<String, String>,
    pub dead_letter_table: String,
    /// Tables the job writes at most, over its life (not only at once).
    pub max_tables: usize,
    /// Data files open at once on object stores (one per table and partition written since
    /// the last checkpoint); beyond it the least recently written tables' files are closed.
    /// Local files hold no descriptor between row groups and do not count.
    pub max_open_files: usize,
    /// Routed rows gathered for the tables' next row groups, in bytes (default 128 MiB, `BUFFER_SIZE`).
    pub buffer_size: usize,
    /// Match top-level columns to tables' ignoring ASCII case.
    pub case_insensitive: bool,
    /// `'json.infer.integers' = 'int'`: inferred integers are ints until a value needs a long.
    pub int_integers: bool,
    /// Tables whose metadata (and sink) the job keeps between checkpoints.
    pub cache_max_size: usize,
    /// How old an idle table's metadata may be before it is loaded again.
    pub cache_refresh: std::time::Duration,
    /// Columns (nested fields included) a table may grow to; records that would give it
    /// more are dead letters (a stream that invents field names cannot grow it forever).
    pub max_columns: usize,
    /// The `maintenance.*` options (with their prefix), read by the job.
    pub maintenance: BTreeMap<String, String>,
}

impl RouteOptions {
    /// Read the `WITH (...)` options of a routed INSERT; unknown keys are errors.
    pub fn try_new(mut options: Options) -> Result<Self> {
        let candidates = match options.take_str("partition.candidates") {
            Some(list) => parse_candidates(&list)?,
            None => Vec::new(),
        };
        let evolve = options.take_choice("schema.evolution", &["on", "off"])? != Some("off");
        let case_insensitive = options
            .take_bool("schema.case-insensitive")?
            .unwrap_or(false);
        let int_integers =
            options.take_choice("json.infer.integers", &["long", "int"])? == Some("int");
        let table_properties = options.take_prefixed("table.properties.");
        let maintenance = options
            .take_prefixed(crate::lake::maintenance::policy::PREFIX)
            .into_iter()
            .map(|(k, v)| {
                (
                    format!("{}{k}", crate::lake::maintenance::policy::PREFIX),
                    v,
                )
            })
            .collect();
        let dead_letter_table = options
            .take_str("dead-letter.table")
            .unwrap_or_else(|| crate::sink::dead_letter::DEAD_LETTER_TABLE.to_string());
        let max_tables = positive(&mut options, "route.max-tables", 10_000)?;
        let max_open_files = positive(&mut options, "route.max-open-files", 1_000)?;
        let buffer_size = options
            .take_positive_size("route.buffer-size")?
            .unwrap_or(BUFFER_SIZE);
        let cache_max_size = positive(&mut options, "table-cache.max-size", 1_000)?;
        let max_columns = positive(&mut options, "schema.max-columns", 1_000)?;
        let cache_refresh = options
            .take_duration("table-cache.refresh-interval")?
            .unwrap_or(std::time::Duration::from_secs(60));
        options.finish()?;
        Ok(Self {
            candidates,
            evolve,
            table_properties,
            dead_letter_table,
            max_tables,
            max_open_files,
            buffer_size,
            case_insensitive,
            int_integers,
            cache_max_size,
            cache_refresh,
            max_columns,
            maintenance,
        })
    }
}

/// The positive number option `key`, or `default`.
fn positive(options: &mut Options, key: &str, default: usize) -> Result<usize> {
    Ok(options
        .take_positive(key)?
        .map_or(default, |n| usize::try_from(n).unwrap_or(usize::MAX)))
}

/// `'days(event_time), region, bucket(16, id)'` as candidates.
fn parse_candidates(list: &str) -> Result<Vec<Candidate>> {
    let exprs = SqlParser::new(&GenericDialect {})
        .try_with_sql(list)
        .and_then(|mut p| p.parse_comma_separated(|p| p.parse_expr()))
        .map_err(|e| Error::Option(format!("'partition.candidates' = '{list}': {e}")))?;
    exprs
        .iter()
        .map(|e| {
            let (column, transform, suffix) = partition_field(e)?;
            let name = match suffix {
                None => column.clone(),
                Some(s) => format!("{column}_{s}"),
            };
            Ok(Candidate {
                column,
                transform,
                name,
            })
        })
        .collect()
}

/// The table name for a route value: lower-cased; ASCII characters outside `[a-z0-9_]` as
/// `_` (`page-view` is `page_view`); letters and digits of other scripts kept, lower-cased
/// (`東京` and `大阪` are two tables, `Ärzte` is `ärzte`); any other character as `_x` and its
/// code point in hex (`a😀` is `a_x1f600`). `None` for an empty value, and for one whose
/// name would be longer than [`MAX_TABLE_NAME_BYTES`] (the table's folder could not be made).
pub fn table_name(route: &str) -> Option<String> {
    if route.len() > MAX_TABLE_NAME_BYTES {
        return None;
    }
    let mut name = String::with_capacity(route.len());
    for c in route.chars() {
        if c.is_ascii() {
            let c = c.to_ascii_lowercase();
            name.push(if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            });
        } else if c.is_alphanumeric() {
            name.extend(c.to_lowercase());
        } else {
            name.push_str(&format!("_x{:x}", u32::from(c)));
        }
    }
    (!name.is_empty() && name.len() <= MAX_TABLE_NAME_BYTES).then_some(name)
}

/// The longest table name a route makes, in bytes (a file name may have 255).
pub const MAX_TABLE_NAME_BYTES: usize = 200;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_values_become_table_names() {
        assert_eq!(table_name("Order").as_deref(), Some("order"));
        assert_eq!(table_name("page-view").as_deref(), Some("page_view"));
        assert_eq!(table_name("a.b c/é").as_deref(), Some("a_b_c_é"));
        assert_eq!(table_name(""), None);
        // Other scripts stay apart (they were all `_`, one table for every city).
        assert_eq!(table_name("東京").as_deref(), Some("東京"));
        assert_ne!(table_name("東京"), table_name("大阪"));
        assert_eq!(table_name("Ärzte").as_deref(), Some("ärzte"));
        assert_eq!(table_name("a😀").as_deref(), Some("a_x1f600"));
        assert_ne!(table_name("a😀"), table_name("a😃"));
        assert_eq!(table_name(&"a".repeat(200)).map(|n| n.len()), Some(200));
        assert_eq!(
            table_name(&"a".repeat(201)),
            None,
            "longer than a file name"
        );
        assert_eq!(table_name(&"😀".repeat(30)), None, "its escaped name is");
    }

    #[test]
    fn candidates_parse() {
        let c = parse_candidates("days(event_time), region, bucket(16, id)").unwrap();
        let names: Vec<&str> = c.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, vec!["event_time_day", "region", "id_bucket"]);
        assert!(parse_candidates("weeks(x)").is_err());
    }
}
