//! One question to a node agent: `GET /v1/routes` over a fresh connection (its source
//! address is the one the agent answers about), bounded in time and in what is read.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The most of an answer read.
const MAX_ANSWER: u64 = 64 << 10;

/// One route the agent's rules still send here through.
#[derive(Clone, Debug, serde::Deserialize)]
pub(super) struct Route {
    pub(super) service: String,
    /// Other endpoints the Service still picks among (0: this Pod is its last).
    #[serde(default)]
    pub(super) others: u64,
}

/// The agent's answer, as far as the drain reads it.
#[derive(Clone, Debug, serde::Deserialize)]
pub(super) struct Answer {
    #[serde(default)]
    pub(super) node: Option<String>,
    /// `null`: the agent could not read its rules.
    #[serde(default)]
    pub(super) routed: Option<bool>,
    #[serde(default)]
    pub(super) routes: Vec<Route>,
    #[serde(default)]
    pub(super) rules_changed_unix_ms: Option<u64>,
    #[serde(default)]
    pub(super) error: Option<String>,
}

/// Asks the agent at `addr` (`host:port`), by `timeout`.
pub(super) async fn ask(addr: &str, timeout: Duration) -> Result<Answer, String> {
    tokio::time::timeout(timeout, ask_now(addr))
        .await
        .map_err(|_| format!("no answer within {} ms", timeout.as_millis()))?
}

async fn ask_now(addr: &str) -> Result<Answer, String> {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let request = format!("GET /v1/routes HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut raw = Vec::new();
    (&mut stream)
        .take(MAX_ANSWER + 1)
        .read_to_end(&mut raw)
        .await
        .map_err(|e| format!("read: {e}"))?;
    if raw.len() as u64 > MAX_ANSWER {
        return Err(format!("an answer of more than {MAX_ANSWER} bytes"));
    }
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| "not an HTTP answer".to_owned())?;
    let status = head.split(' ').nth(1).unwrap_or("");
    if status != "200" {
        let line = head.lines().next().unwrap_or("");
        return Err(format!("answered {line:?}: {}", body.trim()));
    }
    serde_json::from_str(body).map_err(|e| format!("not an agent's answer: {e}"))
}
