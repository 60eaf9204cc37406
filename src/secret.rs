//! Which option keys hold secrets: their values are shown as `****` wherever floe echoes
//! options (SHOW CATALOGS, error messages). One rule, by the words secret-bearing keys
//! use: `password`, `secret`, `token`, `credential`, `jaas` (a SASL JAAS config carries its
//! password), `private`, `user-info` (`user:password`), and `key` or `pem` as the last of
//! several words (`private.key`, `ssl.key.pem`; not `s3.access-key-id` or
//! `ssl.key.location`). A URL's password
//! (`user:password@`, `?password=`) is masked too ([`mask_url`]); statements as the REPL
//! keeps them in its history are masked by `sql::parser::mask_secrets`.

/// What a secret value is shown as.
pub const MASK: &str = "****";

/// Whether option `key` holds a secret.
pub fn is_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    let words: Vec<&str> = key
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    words.iter().any(|w| {
        matches!(
            *w,
            "password"
                | "passwd"
                | "secret"
                | "token"
                | "credential"
                | "credentials"
                | "jaas"
                | "private"
        )
    }) || (words.len() > 1 && matches!(words.last(), Some(&"key" | &"pem")))
        || words.windows(2).any(|w| w == ["user", "info"])
        || words.contains(&"userinfo")
}

/// `value` as it may be shown for option `key`.
pub fn shown<'a>(key: &str, value: &'a str) -> &'a str {
    if is_secret(key) { MASK } else { value }
}

/// A URI with its password, if any, replaced by `****`.
/// A password in the query (`?password=...`, as PostgreSQL takes it) is masked too.
pub fn mask_url(uri: &str) -> String {
    let Ok(mut u) = url::Url::parse(uri) else {
        return uri.to_string();
    };
    let secret = |k: &str| k.eq_ignore_ascii_case("password") || k.eq_ignore_ascii_case("pass");
    let in_query = u.query_pairs().any(|(k, _)| secret(&k));
    if u.password().is_none() && !in_query {
        return uri.to_string();
    }
    if u.password().is_some() {
        let _ = u.set_password(Some(MASK));
    }
    if in_query {
        let pairs: Vec<(String, String)> = u
            .query_pairs()
            .map(|(k, v)| {
                let v = if secret(&k) {
                    MASK.to_string()
                } else {
                    v.into_owned()
                };
                (k.into_owned(), v)
            })
            .collect();
        u.query_pairs_mut().clear().extend_pairs(pairs);
    }
    u.to_string()
}

/// Options (`key`, `value` pairs) as `Debug` shows them: secret values masked, URL
/// passwords masked, everything else as it is.
pub struct Masked<'a, I>(pub &'a I);

impl<'a, I> std::fmt::Debug for Masked<'a, I>
where
    &'a I: IntoIterator<Item = (&'a String, &'a String)>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.0.into_iter().map(|(k, v)| {
                let shown = match is_secret(k) {
                    true => MASK.to_string(),
                    false => mask_url(v),
                };
                (k, shown)
            }))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_keys_are_known_by_their_words() {
        for key in [
            "credential",
            "token",
            "s3.secret-access-key",
            "s3.session-token",
            "sasl.password",
            "sasl.jaas.config",
            "ssl.key.password",
            "ssl.key.pem",
            "sasl.oauthbearer.client.secret",
            "avro-confluent.basic-auth.password",
            "avro-confluent.basic-auth.user-info",
        ] {
            assert!(is_secret(key), "{key}");
        }
        for key in [
            "uri",
            "warehouse",
            "s3.region",
            "s3.access-key-id",
            "ssl.key.location",
            "bootstrap.servers",
            "key",
            "topic",
        ] {
            assert!(!is_secret(key), "{key}");
        }
        assert_eq!(shown("sasl.password", "hunter2"), MASK);
        assert_eq!(shown("s3.region", "eu-west-1"), "eu-west-1");
    }
    #[test]
    fn passwords_in_uris_are_masked() {
        assert_eq!(
            mask_url("postgres://floe:secret@127.0.0.1:5432/db"),
            "postgres://floe:****@127.0.0.1:5432/db"
        );
        assert_eq!(mask_url("sqlite:///x.db"), "sqlite:///x.db");
        assert_eq!(
            mask_url("postgres://127.0.0.1/db?user=floe&password=secret&sslmode=disable"),
            "postgres://127.0.0.1/db?user=floe&password=****&sslmode=disable"
        );
    }

    #[test]
    fn debug_of_options_masks_secrets() {
        let options = std::collections::BTreeMap::from([
            ("sasl.password".to_string(), "hunter2".to_string()),
            ("uri".to_string(), "postgres://u:pw9@h/db".to_string()),
            ("topic".to_string(), "t".to_string()),
        ]);
        let shown = format!("{:?}", Masked(&options));
        assert!(
            !shown.contains("hunter2") && !shown.contains("pw9"),
            "{shown}"
        );
        assert!(shown.contains("\"topic\": \"t\""), "{shown}");
    }
}
