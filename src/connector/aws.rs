//! AWS client configuration shared by the Kinesis source and the Glue schema registry: the
//! region, endpoint and credentials a source's options give, the rest from the usual AWS chain
//! (environment, profile, ...), with the SDK's retries cut to two attempts and its calls
//! bounded by timeouts, so that a dead server fails a call instead of hanging it.

use std::fmt;
use std::time::Duration;

use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_kinesis::config::Credentials;

/// Static AWS credentials given as options (otherwise the usual AWS chain is used).
#[derive(Clone, PartialEq, Eq)]
pub struct StaticCredentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
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
