//! AWS client configuration shared by the Kinesis source and the Glue schema registry: the
//! region, endpoint and credentials a source's options give, the rest from the usual AWS chain
//! (environment, profile, ...), with the SDK's retries cut to two attempts and its calls
//! bounded by timeouts, so that a dead server fails a call instead of hanging it.

use std::fmt;
use std::time::Duration;

use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_kinesis::config::Credentials;

use crate::error::{Error, Result};
use crate::sql::Options;

/// Static AWS credentials given as options (otherwise the usual AWS chain is used).
#[derive(Clone, PartialEq, Eq)]
pub struct StaticCredentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl StaticCredentials {
    /// `{prefix}access-key-id`, `{prefix}secret-access-key` and `{prefix}session-token` from
    /// `options`: none of them means the AWS credential chain.
    pub fn from_options(options: &mut Options, prefix: &str) -> Result<Option<Self>> {
        let key = options.take_str(&format!("{prefix}access-key-id"));
        let secret = options.take_str(&format!("{prefix}secret-access-key"));
        let token = options.take_str(&format!("{prefix}session-token"));
        match (key, secret) {
            (Some(access_key_id), Some(secret_access_key)) => Ok(Some(Self {
                access_key_id,
                secret_access_key,
                session_token: token,
            })),
            (None, None) if token.is_none() => Ok(None),
            _ => Err(Error::Option(format!(
                "give '{prefix}access-key-id' and '{prefix}secret-access-key' together (and \
                 '{prefix}session-token' only with them), or none of them to use the AWS \
                 credential chain (environment, profile, ...)"
            ))),
        }
    }
}

impl fmt::Debug for StaticCredentials {
    /// Never prints the secret or the token.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StaticCredentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"****")
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "****"),
            )
            .finish()
    }
}

/// The SDK configuration for `region`, `endpoint` and `credentials` where given.
pub async fn sdk_config(
    region: Option<&str>,
    endpoint: Option<&str>,
    credentials: Option<&StaticCredentials>,
) -> SdkConfig {
    let timeouts = aws_config::timeout::TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(3))
        .operation_attempt_timeout(Duration::from_secs(10))
        .operation_timeout(Duration::from_secs(25))
        .build();
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .retry_config(aws_config::retry::RetryConfig::standard().with_max_attempts(2))
        .timeout_config(timeouts);
    if let Some(region) = region {
        loader = loader.region(Region::new(region.to_string()));
    }
    if let Some(endpoint) = endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    if let Some(c) = credentials {
        loader = loader.credentials_provider(Credentials::new(
            c.access_key_id.clone(),
            c.secret_access_key.clone(),
            c.session_token.clone(),
            None,
            "floe-source-options",
        ));
    }
    loader.load().await
}

/// `Code: message` for an error the service sent, else the chain of causes.
pub fn describe<E>(e: &aws_sdk_kinesis::error::SdkError<E>) -> String
where
    E: aws_sdk_kinesis::error::ProvideErrorMetadata + std::error::Error + 'static,
{
    use aws_sdk_kinesis::error::ProvideErrorMetadata;
    if let Some(code) = e.code() {
        return format!("{code}: {}", e.message().unwrap_or("(no message)"));
    }
    let mut out = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}
