//! The agent's HTTP server: one narrow question, answered about the caller only, and every
//! request treated as hostile — a bounded head read in bounded time, no body, a bounded number
//! of connections, a bounded time to write the answer, one request per connection.
//!
//! `GET /v1/routes`: does this node still send new connections to me (the address the
//! connection came from), and through which Services? One JSON object ([`Answer`](crate::state::Answer)).
//! `GET /healthz`: `ok` while the last read of the rules succeeded, 503 with the error
//! otherwise. Anything else: 404, 405 or 400, and the connection closes.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::state::State;

/// The largest request head read (request line and headers).
pub const MAX_HEAD: usize = 4096;
/// How long a client has to send its request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the answer may take to be written.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// Connections served at once by default; more are accepted and closed at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;

/// Serves `listener` until the process ends: each connection one request, bounded.
pub async fn serve(listener: TcpListener, state: Arc<State>, max_connections: usize) {
    let slots = Arc::new(Semaphore::new(max_connections.max(1)));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors, or a connection reset before it was accepted: back off
                // a moment rather than spin.
                eprintln!("lameduck-agent: accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            // At the bound: closed at once, so a flood cannot hold the agent.
            drop(stream);
            continue;
        };
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let _permit = permit;
            let _ = one(stream, peer, &state).await;
        });
    }
}

/// One connection: its head, one answer, close.
async fn one(mut stream: TcpStream, peer: SocketAddr, state: &State) -> std::io::Result<()> {
    let _ = stream.set_nodelay(true);
    let head = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut stream)).await {
        Ok(Ok(Some(head))) => head,
        // Too slow, too long, or gone: nothing to answer.
        _ => return Ok(()),
    };
    let (status, body, kind) = respond(&head, peer.ip(), state);
    let text = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {kind}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(text.as_bytes())).await;
    Ok(())
}

/// Reads up to the end of the head (`\r\n\r\n`), at most [`MAX_HEAD`] bytes; `None` when it is
/// longer or the peer went away first.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<Vec<u8>>> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            buf.truncate(end);
            return Ok(Some(buf));
        }
        if buf.len() > MAX_HEAD {
            return Ok(None);
        }
    }
}

/// The status line, body and content type for a request head from `caller`.
fn respond(head: &[u8], caller: IpAddr, state: &State) -> (&'static str, String, &'static str) {
    let line = head.split(|&b| b == b'\r').next().unwrap_or(&[]);
    let line = String::from_utf8_lossy(line);
    let mut words = line.split(' ');
    let (method, target, version) = (words.next(), words.next(), words.next());
    let text = "text/plain; charset=utf-8";
    if !matches!(version, Some("HTTP/1.1" | "HTTP/1.0")) || words.next().is_some() {
        return ("400 Bad Request", "bad request line\n".to_owned(), text);
    }
    let path = target.unwrap_or("").split('?').next().unwrap_or("");
    match (method, path) {
        (Some("GET"), "/v1/routes") => {
            let answer = state.answer(caller);
            let body = serde_json::to_string(&answer).unwrap_or_else(|_| "{}".to_owned());
            ("200 OK", body + "\n", "application/json")
        }
        (Some("GET"), "/healthz") => match state.error() {
            None => ("200 OK", "ok\n".to_owned(), text),
            Some(e) => ("503 Service Unavailable", format!("{e}\n"), text),
        },
        (Some(_), "/v1/routes" | "/healthz") => {
            ("405 Method Not Allowed", "GET only\n".to_owned(), text)
        }
        _ => (
            "404 Not Found",
            "GET /v1/routes or /healthz\n".to_owned(),
            text,
        ),
    }
}
