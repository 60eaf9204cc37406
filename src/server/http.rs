//! A small HTTP/1.1 server for the dashboard and the metrics: GET requests, one answer per
//! connection. Each connection is served on its own task within `CLIENT_TIMEOUT`, at most
//! `CONNECTIONS` at once, so a client that connects and sends nothing delays no other.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::error::{Error, Result};

/// Connections served at once; more wait to be accepted.
const CONNECTIONS: usize = 32;
/// How long a client may take to send its request and read the answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest request head read.
const MAX_REQUEST: usize = 16 * 1024;

/// What a client asked for.
#[derive(Debug, Default)]
pub struct Request {
    /// The path, without the query string.
    pub path: String,
    /// The `Authorization` header's value, if any.
    pub authorization: Option<String>,
}

/// An answer.
#[derive(Debug)]
pub struct Reply {
    pub status: &'static str,
    pub content_type: &'static str,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
}

impl Reply {
    pub fn ok(content_type: &'static str, body: String) -> Self {
        Self {
            status: "200 OK",
            content_type,
            headers: Vec::new(),
            body,
        }
    }

    pub fn not_found() -> Self {
        Self {
            status: "404 Not Found",
            content_type: "text/plain",
            headers: Vec::new(),
            body: "not found\n".into(),
        }
    }
}

/// What answers a request.
pub type Handler = Arc<dyn Fn(&Request) -> Reply + Send + Sync>;

/// Bind `addr` (`what` it is, for the error).
pub async fn bind(addr: &str, what: &str) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| Error::io(format!("binding {what} {addr}"), e))
}

/// Serve `listener` with `handler` until the returned task is aborted.
pub fn serve(listener: TcpListener, handler: Handler) -> JoinHandle<()> {
    let slots = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS));
    tokio::spawn(async move {
        let mut clients = tokio::task::JoinSet::new();
        loop {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let Ok((conn, _)) = listener.accept().await else {
                return;
            };
            let handler = handler.clone();
            clients.spawn(async move {
                let _ = tokio::time::timeout(CLIENT_TIMEOUT, answer(conn, handler)).await;
                drop(slot);
            });
            // Reap the finished ones, so the set holds only clients being served.
            while clients.try_join_next().is_some() {}
        }
    })
}

/// The request in `head` (its request line and headers).
fn parse(head: &str) -> Request {
    let mut lines = head.lines();
    let target = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("/");
    let path = target.split('?').next().unwrap_or("/").to_string();
    let authorization = lines.take_while(|l| !l.is_empty()).find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("authorization")
            .then(|| value.trim().to_string())
    });
    Request {
        path,
        authorization,
    }
}

/// Read one request, answer it, close the connection.
async fn answer(mut conn: tokio::net::TcpStream, handler: Handler) {
    let mut head = Vec::new();
    let mut buf = [0u8; 2048];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST {
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let request = parse(&String::from_utf8_lossy(&head));
    let reply = handler(&request);
    let mut out = format!(
        "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\n\
         Connection: close\r\n",
        reply.status,
        reply.content_type,
        reply.body.len()
    );
    for (k, v) in &reply.headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    out.push_str(&reply.body);
    let _ = conn.write_all(out.as_bytes()).await;
    let _ = conn.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_head_gives_its_path_and_authorization() {
        let r = parse(
            "GET /api/state?x=1 HTTP/1.1\r\nHost: a\r\nauthorization: Basic Zm9lOnB3\r\n\r\n",
        );
        assert_eq!(r.path, "/api/state");
        assert_eq!(r.authorization.as_deref(), Some("Basic Zm9lOnB3"));
        assert_eq!(parse("").path, "/");
    }
}
