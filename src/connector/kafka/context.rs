//! What librdkafka reports outside of messages (a broker that refuses connections, failed
//! authentication), kept so that a stalled source can say why.
//!
//! librdkafka retries these by itself; the reader only quotes the last one when it reports
//! that the source cannot be read.

use std::sync::Mutex;

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::KafkaError;

/// The consumer's context: it remembers librdkafka's last error.
#[derive(Debug, Default)]
pub struct ReaderContext {
    last_error: Mutex<Option<String>>,
}

impl ReaderContext {
    /// The last error librdkafka reported, if any since the last [`ReaderContext::clear`].
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().ok().and_then(|e| e.clone())
    }

    /// Remember `error` as the last one.
    pub fn note(&self, error: String) {
        if let Ok(mut e) = self.last_error.lock() {
            *e = Some(error);
        }
    }

    /// Forget the last error (the source works again).
    pub fn clear(&self) {
        if let Ok(mut e) = self.last_error.lock() {
            *e = None;
        }
    }
}

impl ClientContext for ReaderContext {
    fn log(&self, _level: RDKafkaLogLevel, _fac: &str, _message: &str) {
        // Quiet: what matters reaches `error` too, and the reader reports it.
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.note(if reason.is_empty() {
            error.to_string()
        } else {
            reason.to_string()
        });
    }
}

impl ConsumerContext for ReaderContext {}
