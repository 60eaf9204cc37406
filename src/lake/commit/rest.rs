//! Committing to an Iceberg REST catalog with the updates iceberg-rust cannot send itself:
//! `POST /v1/{prefix}/namespaces/{ns}/tables/{table}` with requirements that make the server
//! refuse (409, a retryable conflict) when the table moved on.
//!
//! iceberg-catalog-rest 0.10 keeps its HTTP client and token private, so this committer has
//! its own: the same `token`, OAuth2 `credential` (renewed on 401) and `header.*` properties.

use std::collections::HashMap;

use iceberg::TableUpdate;
use iceberg::spec::MAIN_BRANCH;
use iceberg::table::Table;

use crate::error::{Error, Result};

/// Commits to an Iceberg REST catalog, refused if the table moved on since `base`.
#[derive(Debug)]
pub struct RestCommitter {
    client: reqwest::Client,
    uri: String,
    prefix: Option<String>,
    /// A fixed token, or one obtained from the OAuth2 client credentials (and renewed).
    auth: RestAuth,
}

enum RestAuth {
    None,
    Token(String),
    Credential {
        token_uri: String,
        id: String,
        secret: String,
        scope: String,
        token: tokio::sync::Mutex<Option<String>>,
    },
}

/// Debug output never shows a token or a secret.
impl std::fmt::Debug for RestAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RestAuth::None => f.write_str("None"),
            RestAuth::Token(_) => f.write_str("Token(****)"),
            RestAuth::Credential {
                token_uri,
                id,
                scope,
                ..
            } => f
                .debug_struct("Credential")
                .field("token_uri", token_uri)
                .field("id", id)
                .field("secret", &crate::secret::MASK)
                .field("scope", scope)
                .finish_non_exhaustive(),
        }
    }
}

impl RestCommitter {
    /// A committer for the REST catalog at `uri` with the catalog's properties.
    pub async fn connect(
        props: &HashMap<String, String>,
        timeouts: crate::lake::RestTimeouts,
    ) -> Result<Self> {
        let uri = props
            .get("uri")
            .ok_or_else(|| Error::Internal("REST catalog without a uri".into()))?
            .trim_end_matches('/')
            .to_string();
        let client = timeouts
            .client()
            .default_headers(rest_headers(props)?)
            .build()
            .map_err(|e| rest_error("building an HTTP client", e))?;
        let auth = if let Some(token) = props.get("token") {
            RestAuth::Token(token.clone())
        } else if let Some(credential) = props.get("credential") {
            let (id, secret) = credential
                .split_once(':')
                .unwrap_or(("", credential.as_str()));
            RestAuth::Credential {
                token_uri: props
                    .get("oauth2-server-uri")
                    .cloned()
                    .unwrap_or_else(|| format!("{uri}/v1/oauth/tokens")),
                id: id.to_string(),
                secret: secret.to_string(),
                scope: props
                    .get("scope")
                    .cloned()
                    .unwrap_or_else(|| "catalog".to_string()),
                token: tokio::sync::Mutex::new(None),
            }
        } else {
            RestAuth::None
        };
        let mut committer = Self {
            client,
            uri,
            prefix: props.get("prefix").cloned(),
            auth,
        };
        if committer.prefix.is_none() {
            committer.prefix = committer.config_prefix(props.get("warehouse")).await?;
        }
        Ok(committer)
    }

    async fn token(&self, renew: bool) -> Result<Option<String>> {
        match &self.auth {
            RestAuth::None => Ok(None),
            RestAuth::Token(t) => Ok(Some(t.clone())),
            RestAuth::Credential {
                token_uri,
                id,
                secret,
                scope,
                token,
            } => {
                let mut cached = token.lock().await;
                if !renew && let Some(t) = cached.as_ref() {
                    return Ok(Some(t.clone()));
                }
                let resp = self
                    .client
                    .post(token_uri)
                    .form(&[
                        ("grant_type", "client_credentials"),
                        ("client_id", id),
                        ("client_secret", secret),
                        ("scope", scope),
                    ])
                    .send()
                    .await
                    .map_err(|e| rest_error("getting an OAuth2 token", e))?;
                let status = resp.status();
                let body: serde_json::Value = resp
                    .json()
                    .await
                    .map_err(|e| rest_error("reading the OAuth2 token", e))?;
                let t = body
                    .get("access_token")
                    .and_then(|v| v.as_str())
                    .ok_or_else(|| {
                        Error::Option(format!(
                            "the REST catalog refused the credential ({status}): {body}"
                        ))
                    })?
                    .to_string();
                *cached = Some(t.clone());
                Ok(Some(t))
            }
        }
    }

    async fn config_prefix(&self, warehouse: Option<&String>) -> Result<Option<String>> {
        let mut req = self.client.get(format!("{}/v1/config", self.uri));
        if let Some(w) = warehouse {
            req = req.query(&[("warehouse", w)]);
        }
        if let Some(t) = self.token(false).await? {
            req = req.bearer_auth(t);
        }
        let body: serde_json::Value = req
            .send()
            .await
            .map_err(|e| rest_error("reading the REST catalog's config", e))?
            .json()
            .await
            .map_err(|e| rest_error("reading the REST catalog's config", e))?;
        Ok(["overrides", "defaults"]
            .iter()
            .find_map(|k| body.get(k)?.get("prefix")?.as_str().map(str::to_string)))
    }

    /// Send `updates` to the table of `base`, requiring it to be as `base` has it.
    pub async fn commit(&self, base: &Table, updates: Vec<TableUpdate>) -> Result<Table> {
        use iceberg::TableRequirement as R;
        let md = base.metadata();
        let ident = base.identifier();
        let requirements = vec![
            R::UuidMatch { uuid: md.uuid() },
            R::RefSnapshotIdMatch {
                r#ref: MAIN_BRANCH.to_string(),
                snapshot_id: md.current_snapshot_id(),
            },
            R::CurrentSchemaIdMatch {
                current_schema_id: md.current_schema_id(),
            },
            R::LastAssignedFieldIdMatch {
                last_assigned_field_id: md.last_column_id(),
            },
            R::DefaultSpecIdMatch {
                default_spec_id: md.default_partition_spec_id(),
            },
            R::LastAssignedPartitionIdMatch {
                last_assigned_partition_id: md.last_partition_id(),
            },
        ];
        let request = iceberg_catalog_rest::CommitTableRequest {
            identifier: Some(ident.clone()),
            requirements,
            updates,
        };
        let url = format!(
            "{}/v1/{}namespaces/{}/tables/{}",
            self.uri,
            self.prefix
                .as_ref()
                .map(|p| format!("{p}/"))
                .unwrap_or_default(),
            ident.namespace().to_url_string(),
            ident.name()
        );
        let mut renewed = false;
        loop {
            let mut req = self.client.post(&url).json(&request);
            if let Some(t) = self.token(renewed).await? {
                req = req.bearer_auth(t);
            }
            let resp = req
                .send()
                .await
                .map_err(|e| rest_error(&format!("committing {ident}"), e))?;
            let status = resp.status();
            if status == reqwest::StatusCode::UNAUTHORIZED && !renewed {
                // Tokens expire; get a new one once.
                renewed = true;
                continue;
            }
            if status == reqwest::StatusCode::CONFLICT {
                return Err(iceberg::Error::new(
                    iceberg::ErrorKind::CatalogCommitConflicts,
                    format!("table {ident} changed while floe was committing to it"),
                )
                .with_retryable(true)
                .into());
            }
            if !status.is_success() {
                let text = resp.text().await.unwrap_or_default();
                return Err(Error::Iceberg(iceberg::Error::new(
                    iceberg::ErrorKind::Unexpected,
                    format!("the REST catalog refused the commit to {ident} ({status}): {text}"),
                )));
            }
            let body: iceberg_catalog_rest::CommitTableResponse = resp
                .json()
                .await
                .map_err(|e| rest_error(&format!("reading the commit of {ident}"), e))?;
            return super::table_like(base, body.metadata, Some(&body.metadata_location));
        }
    }
}

/// A failed HTTP exchange with the REST catalog: external, so jobs retry; retryable when
/// the server could not be reached or did not answer in time.
fn rest_error(what: &str, e: reqwest::Error) -> Error {
    let retryable = e.is_connect() || e.is_timeout() || e.is_request() || e.is_body();
    let why = if e.is_timeout() {
        " (no answer in time: 'rest.connect-timeout', 'rest.request-timeout')"
    } else if e.is_connect() {
        " (cannot connect)"
    } else {
        ""
    };
    Error::Catalog {
        context: format!("REST catalog: {what}{why}"),
        source: Box::new(e),
        retryable,
    }
}

/// The `header.<name>` catalog properties as HTTP headers, sent with every request (as
/// iceberg-catalog-rest does with the same properties).
fn rest_headers(props: &HashMap<String, String>) -> Result<reqwest::header::HeaderMap> {
    use reqwest::header::{HeaderName, HeaderValue};
    let mut headers = reqwest::header::HeaderMap::new();
    for (key, value) in props {
        let Some(name) = key.strip_prefix("header.") else {
            continue;
        };
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|e| Error::Option(format!("'{key}' does not name an HTTP header: {e}")))?;
        let value = HeaderValue::from_str(value)
            .map_err(|e| Error::Option(format!("'{key}' is not a valid header value: {e}")))?;
        headers.insert(name, value);
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_hides_tokens_and_secrets() {
        let auth = RestAuth::Credential {
            token_uri: "http://127.0.0.1:8181/v1/oauth/tokens".into(),
            id: "admin".into(),
            secret: "hunter2".into(),
            scope: "catalog".into(),
            token: tokio::sync::Mutex::new(Some("tok-123".into())),
        };
        let shown = format!("{auth:?} {:?}", RestAuth::Token("tok-456".into()));
        for secret in ["hunter2", "tok-123", "tok-456"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(shown.contains("admin"), "{shown}");
    }
}
