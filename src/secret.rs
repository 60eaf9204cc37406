//! Which option keys hold secrets: their values are shown as `****` wherever floe echoes
//! options (SHOW CATALOGS, error messages). One rule, by the words secret-bearing keys
//! use: `password`, `secret`, `token`, `credential`, `jaas` (a SASL JAAS config carries its
//! password), `private`, and `key` or `pem` as the last of several words (`private.key`,
//! `ssl.key.pem`; not `s3.access-key-id` or `ssl.key.location`).

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
}

/// `value` as it may be shown for option `key`.
pub fn shown<'a>(key: &str, value: &'a str) -> &'a str {
    if is_secret(key) { MASK } else { value }
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
}
