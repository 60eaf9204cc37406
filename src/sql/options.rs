//! `WITH ('key' = 'value', ...)` option bags.
//!
//! A statement's options are read by typed readers that remove what they read
//! ([`Options::take_str`], [`Options::take_bool`], ...). When the statement has read all it
//! understands, [`Options::finish`] fails if anything is left, naming every unknown key and
//! the closest known one, so a typo is never silently ignored.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::error::{Error, Result};

/// An ordered bag of string options taken from a `WITH (...)` clause.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Options {
    entries: BTreeMap<String, String>,
    /// Every key (or `prefix*`) a reader asked for: the vocabulary for suggestions.
    known: Vec<String>,
    /// Keys taken with [`Options::take_required`] that were absent: [`Options::finish`]
    /// reports them, with the unknown keys (often the same key, misspelled).
    missing: Vec<String>,
    /// What the options belong to, for messages (`CREATE CATALOG lake`).
    context: String,
}

impl std::fmt::Debug for Options {
    /// Secret values masked ([`crate::secret`]).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("context", &self.context)
            .field("entries", &crate::secret::Masked(&self.entries))
            .finish_non_exhaustive()
    }
}

impl Options {
    /// A bag from `(key, value)` pairs; a key given twice is an error.
    pub fn try_new(
        context: impl Into<String>,
        pairs: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self> {
        let context = context.into();
        let mut entries = BTreeMap::new();
        for (k, v) in pairs {
            if entries.insert(k.clone(), v).is_some() {
                return Err(Error::Option(format!(
                    "option '{k}' is given twice in {context}"
                )));
            }
        }
        Ok(Self {
            entries,
            known: Vec::new(),
            missing: Vec::new(),
            context,
        })
    }

    /// Whether no option is left.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Remove and return `key`, if present.
    pub fn take_str(&mut self, key: &str) -> Option<String> {
        self.known.push(key.to_string());
        self.entries.remove(key)
    }

    /// Remove and return `key`, failing if it is absent. A key given that is near `key`
    /// (a typo of it) is named in the error: it is unknown, and the reason `key` is missing.
    pub fn require_str(&mut self, key: &str) -> Result<String> {
        if let Some(v) = self.take_str(key) {
            return Ok(v);
        }
        let wanted = [key.to_string()];
        let typos: Vec<String> = self
            .entries
            .keys()
            .filter(|k| closest(k, &wanted).is_some())
            .map(|k| format!("'{k}'"))
            .collect();
        let mut msg = format!("{} needs the option '{key}'", self.context);
        if !typos.is_empty() {
            msg.push_str(&format!(
                "; unknown option{} {} (did you mean '{key}'?)",
                if typos.len() == 1 { "" } else { "s" },
                typos.join(", ")
            ));
        }
        Err(Error::Option(msg))
    }

    /// Remove `key`, which the statement needs. When it is absent, [`Options::finish`] fails
    /// naming it, together with the unknown keys: read every option, then finish, then use
    /// the required ones (they are `Some` once `finish` succeeded).
    pub fn take_required(&mut self, key: &str) -> Option<String> {
        let v = self.take_str(key);
        if v.is_none() {
            self.missing.push(key.to_string());
        }
        v
    }

    /// Remove `key` and check it is one of `choices` (case-insensitive); returns the choice
    /// as spelled in `choices`.
    pub fn take_choice<'c>(&mut self, key: &str, choices: &[&'c str]) -> Result<Option<&'c str>> {
        let Some(v) = self.take_str(key) else {
            return Ok(None);
        };
        match choices.iter().find(|c| c.eq_ignore_ascii_case(v.trim())) {
            Some(c) => Ok(Some(*c)),
            None => Err(unsupported(key, &v, choices)),
        }
    }

    /// Remove `key` and parse it as a whole number above zero.
    pub fn take_positive(&mut self, key: &str) -> Result<Option<u64>> {
        let Some(v) = self.take_str(key) else {
            return Ok(None);
        };
        match v.trim().parse::<u64>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(Error::Option(format!(
                "'{key}' must be a positive number, got '{v}'"
            ))),
        }
    }

    /// Remove `key` and parse it as `true` / `false`.
    pub fn take_bool(&mut self, key: &str) -> Result<Option<bool>> {
        match self.take_str(key) {
            None => Ok(None),
            Some(v) => match v.to_ascii_lowercase().as_str() {
                "true" | "on" | "yes" => Ok(Some(true)),
                "false" | "off" | "no" => Ok(Some(false)),
                _ => Err(Error::Option(format!(
                    "option '{key}' must be 'true' or 'false', got '{v}'"
                ))),
            },
        }
    }

    /// Remove `key` and parse it as a duration (`500ms`, `10s`, `2m`, `1h`; bare numbers are
    /// seconds).
    pub fn take_duration(&mut self, key: &str) -> Result<Option<Duration>> {
        self.take_parsed(key, parse_duration)
    }

    /// Remove `key` and parse it as a memory size in bytes (`64mb`, `512 KiB`, `1g`; units
    /// are powers of 1,024, as Flink's; bare numbers are bytes).
    pub fn take_size(&mut self, key: &str) -> Result<Option<u64>> {
        self.take_parsed(key, parse_size)
    }

    /// [`Self::take_size`] for a size that must be more than 0 bytes, as a `usize`.
    pub fn take_positive_size(&mut self, key: &str) -> Result<Option<usize>> {
        match self.take_size(key)? {
            None => Ok(None),
            Some(0) => Err(Error::Option(format!("'{key}' must be more than 0 bytes"))),
            Some(n) => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
        }
    }

    /// Remove `key` and parse it with `parse`, whose error is reported with the key.
    fn take_parsed<T>(
        &mut self,
        key: &str,
        parse: impl FnOnce(&str) -> std::result::Result<T, String>,
    ) -> Result<Option<T>> {
        self.take_str(key)
            .map(|v| parse(&v).map_err(|e| Error::Option(format!("option '{key}': {e}"))))
            .transpose()
    }

    /// Remove every key that starts with `prefix`, returned without the prefix.
    pub fn take_prefixed(&mut self, prefix: &str) -> BTreeMap<String, String> {
        self.known.push(format!("{prefix}*"));
        let keys: Vec<String> = self
            .entries
            .keys()
            .filter(|k| k.starts_with(prefix))
            .cloned()
            .collect();
        keys.into_iter()
            .filter_map(|k| {
                let v = self.entries.remove(&k)?;
                Some((k[prefix.len()..].to_string(), v))
            })
            .collect()
    }

    /// Remove and return everything left, for options passed through verbatim.
    pub fn take_all(&mut self) -> BTreeMap<String, String> {
        std::mem::take(&mut self.entries)
    }

    /// Fail if any option was not read, naming each and suggesting the closest known key,
    /// or if a required one is missing (both are named when both happen).
    pub fn finish(self) -> Result<()> {
        let missing = match self.missing.as_slice() {
            [] => None,
            keys => Some(format!(
                "{} needs the option{} {}",
                self.context,
                if keys.len() == 1 { "" } else { "s" },
                one_of(&keys.iter().map(String::as_str).collect::<Vec<_>>())
                    .replace(" or ", " and ")
            )),
        };
        if self.entries.is_empty() {
            return match missing {
                None => Ok(()),
                Some(m) => Err(Error::Option(m)),
            };
        }
        let mut parts = Vec::new();
        for key in self.entries.keys() {
            match closest(key, &self.known) {
                Some(near) => parts.push(format!("'{key}' (did you mean '{near}'?)")),
                None => parts.push(format!("'{key}'")),
            }
        }
        let mut known: Vec<&str> = self.known.iter().map(String::as_str).collect();
        known.sort_unstable();
        known.dedup();
        let unknown = format!(
            "unknown option{} in {}: {}; known options: {}",
            if parts.len() == 1 { "" } else { "s" },
            self.context,
            parts.join(", "),
            known.join(", ")
        );
        Err(Error::Option(match missing {
            None => unknown,
            Some(m) => format!("{unknown}. And {m}"),
        }))
    }
}

impl fmt::Display for Options {
    /// Prints the bag as a SQL `WITH (...)` clause body: `'a' = 'b', 'c' = 'd'`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (k, v) in &self.entries {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{} = {}", quote(k), quote(v))?;
        }
        Ok(())
    }
}

/// The error for option `key` given a `value` outside `choices`: the one wording of it, for
/// readers whose choices carry more than a name (a mode with its own options).
pub fn unsupported(key: &str, value: &str, choices: &[&str]) -> Error {
    Error::Option(format!(
        "'{key}' = '{value}' is not supported; use {}",
        one_of(choices)
    ))
}

/// `'a', 'b' or 'c'`: the choices an option takes, for messages.
pub fn one_of(choices: &[&str]) -> String {
    let quoted: Vec<String> = choices.iter().map(|c| format!("'{c}'")).collect();
    match quoted.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

/// A SQL string literal for `s`.
pub fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Parse `500ms`, `10s`, `2m`, `1h` or a bare number of seconds.
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    let t = s.trim().to_ascii_lowercase();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a duration (try '500ms', '10s', '2m' or '1h')"))?;
    let secs = match unit.trim() {
        "ms" | "millis" | "milliseconds" => n / 1000.0,
        "" | "s" | "sec" | "secs" | "second" | "seconds" => n,
        "m" | "min" | "mins" | "minute" | "minutes" => n * 60.0,
        "h" | "hour" | "hours" => n * 3600.0,
        other => return Err(format!("unknown unit '{other}' in duration '{s}'")),
    };
    Ok(Duration::from_secs_f64(secs))
}

/// A memory size in bytes: a whole number and a unit (`b`, `k`/`kb`/`kib`, `m`/`mb`/`mib`,
/// `g`/`gb`/`gib`, case-insensitive; none is bytes).
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size (try '64mb' or '512kb')"))?;
    let shift = match unit.trim() {
        "" | "b" | "bytes" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        other => return Err(format!("unknown unit '{other}' in size '{s}'")),
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("size '{s}' is too large"))
}

/// The known key nearest to `key` by edit distance, when near enough to be a typo.
fn closest<'a>(key: &str, known: &'a [String]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (levenshtein(key, k.trim_end_matches('*')), k))
        .filter(|(d, k)| *d <= (k.len().max(key.len()) / 3).max(2))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k.as_str())
}

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bag(pairs: &[(&str, &str)]) -> Options {
        Options::try_new(
            "CREATE CATALOG c",
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        )
        .unwrap()
    }

    #[test]
    fn unknown_key_is_named_with_a_suggestion() {
        let mut o = bag(&[("type", "iceberg"), ("warehous", "w")]);
        assert_eq!(o.take_str("type").as_deref(), Some("iceberg"));
        assert_eq!(o.take_str("warehouse"), None);
        let err = o.finish().unwrap_err().to_string();
        assert!(
            err.contains("'warehous' (did you mean 'warehouse'?)"),
            "{err}"
        );
    }

    #[test]
    fn a_misspelled_required_key_is_named_with_the_missing_one() {
        let mut o = bag(&[("type", "iceberg"), ("warehose", "w")]);
        let err = o.require_str("warehouse").unwrap_err().to_string();
        assert!(err.contains("needs the option 'warehouse'"), "{err}");
        assert!(
            err.contains("unknown option 'warehose' (did you mean 'warehouse'?)"),
            "{err}"
        );
        // A key far from the missing one is not blamed for it.
        let mut o = bag(&[("type", "iceberg")]);
        let err = o.require_str("warehouse").unwrap_err().to_string();
        assert!(!err.contains("unknown"), "{err}");
    }

    #[test]
    fn unknown_keys_are_reported_with_the_missing_ones() {
        let mut o = bag(&[("type", "iceberg"), ("warehose", "w"), ("colour", "red")]);
        assert_eq!(o.take_required("type").as_deref(), Some("iceberg"));
        assert_eq!(o.take_required("uri"), None);
        assert_eq!(o.take_required("warehouse"), None);
        let err = o.finish().unwrap_err().to_string();
        assert!(
            err.contains("'warehose' (did you mean 'warehouse'?)"),
            "{err}"
        );
        assert!(err.contains("'colour'"), "{err}");
        assert!(
            err.contains("needs the options 'uri' and 'warehouse'"),
            "{err}"
        );
        let mut o = bag(&[("type", "iceberg")]);
        o.take_required("type");
        o.take_required("uri");
        let err = o.finish().unwrap_err().to_string();
        assert_eq!(err, "CREATE CATALOG c needs the option 'uri'");
    }

    #[test]
    fn choices_and_positive_numbers_say_what_is_allowed() {
        let mut o = bag(&[("mode", "ON"), ("bad", "maybe"), ("n", "3"), ("z", "0")]);
        assert_eq!(o.take_choice("mode", &["on", "off"]).unwrap(), Some("on"));
        let err = o.take_choice("bad", &["a", "b", "c"]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "'bad' = 'maybe' is not supported; use 'a', 'b' or 'c'"
        );
        assert_eq!(o.take_choice("absent", &["x"]).unwrap(), None);
        assert_eq!(o.take_positive("n").unwrap(), Some(3));
        let err = o.take_positive("z").unwrap_err();
        assert_eq!(err.to_string(), "'z' must be a positive number, got '0'");
        assert_eq!(one_of(&["only"]), "'only'");
    }

    #[test]
    fn sizes_parse_in_powers_of_1024() {
        assert_eq!(parse_size("64mb"), Ok(64 << 20));
        assert_eq!(parse_size("512 KiB"), Ok(512 << 10));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("100"), Ok(100));
        assert!(
            parse_size("64 parsecs")
                .unwrap_err()
                .contains("unknown unit")
        );
        assert!(parse_size("mb").unwrap_err().contains("not a size"));
        assert!(
            parse_size("99999999999g")
                .unwrap_err()
                .contains("too large")
        );
    }

    #[test]
    fn duplicate_key_is_an_error() {
        let err = Options::try_new("X", [("a".into(), "1".into()), ("a".into(), "2".into())])
            .unwrap_err();
        assert!(err.to_string().contains("'a' is given twice"));
    }

    #[test]
    fn prefixed_keys_are_taken_together() {
        let mut o = bag(&[("s3.endpoint", "e"), ("s3.region", "r"), ("type", "t")]);
        let s3 = o.take_prefixed("s3.");
        assert_eq!(s3.len(), 2);
        assert_eq!(s3["region"], "r");
        o.take_str("type");
        o.finish().unwrap();
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("3 weeks").is_err());
    }

    #[test]
    fn bools_parse() {
        let mut o = bag(&[("a", "TRUE"), ("b", "maybe")]);
        assert_eq!(o.take_bool("a").unwrap(), Some(true));
        assert!(o.take_bool("b").is_err());
    }
}
