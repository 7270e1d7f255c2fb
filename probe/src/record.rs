//! One line of the probe's output: what happened to one request.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::config::{ConnectionMode, Kind};

/// How a request ended.
///
/// JSON form: `"ok"`, `"failed"`, `"unfinished"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// A 2xx response whose body was read to its end.
    Ok,
    /// Connect error, reset, closed connection, non-2xx status or body error: see
    /// [`Record::failure`] and [`Record::error`].
    Failed,
    /// Still running when the probe stopped waiting (`drain_wait` over, or aborted).
    Unfinished,
}

impl Outcome {
    /// The outcome's name as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Failed => "failed",
            Outcome::Unfinished => "unfinished",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a failed request failed.
///
/// JSON form: `"connect"`, `"request"`, `"status"`, `"body"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Failure {
    /// No connection: refused, timed out, name not resolved, HTTP/2 handshake failed.
    Connect,
    /// The connection broke before a response arrived (reset, closed, protocol error).
    Request,
    /// The response status was not 2xx.
    Status,
    /// The response started but its body broke off.
    Body,
}

impl Failure {
    /// The failure's name as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Failure::Connect => "connect",
            Failure::Request => "request",
            Failure::Status => "status",
            Failure::Body => "body",
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything the probe knows about one request; one JSON line in `--out`.
///
/// Offsets are milliseconds since the probe started ([`Summary::started_unix_ms`] turns them
/// into wall-clock time, to line them up with a server's drain report).
///
/// [`Summary::started_unix_ms`]: crate::Summary::started_unix_ms
///
/// ```json
/// {"id":"5f3a9c01-000042","kind":"slow","label":"ingress","mode":"keepalive","start_ms":1203.5,
///  "end_ms":3208.1,"status":200,"outcome":"ok","reused":true,"conn":3,"instance":"web-7d9-abc",
///  "phase":"draining","bytes":2,"latency_us":2004600,"window":"during",
///  "start_unix_ms":1764556801203.5}
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The unique request id, sent as `x-request-id`.
    pub id: String,
    /// Short, slow or stream.
    pub kind: Kind,
    /// The traffic-path label, sent as `x-traffic-path`.
    pub label: String,
    /// The connection mode this request used: `keepalive` or `fresh` (never `mixed`).
    pub mode: ConnectionMode,
    /// When the request started, in ms since the probe started.
    pub start_ms: f64,
    /// When it ended (ok or failed), in ms since the probe started; `None` when unfinished.
    pub end_ms: Option<f64>,
    /// The response status, when response headers arrived.
    pub status: Option<u16>,
    /// Ok, failed or unfinished.
    pub outcome: Outcome,
    /// Where it failed, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// The error, for failed and unfinished requests (`status 503 Service Unavailable`,
    /// `connect: Connection refused (os error 111)`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `true` when the request went on a connection that had already carried a request.
    pub reused: bool,
    /// The probe's id of the connection it went on (ids count from 1 in opening order);
    /// `None` when no connection could be had.
    pub conn: Option<u64>,
    /// The `x-instance` response header: which instance served it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// The `x-lameduck-phase` response header: the serving instance's drain phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Response body bytes read.
    pub bytes: u64,
    /// How many times the request was moved to another connection because the one it was
    /// given could not take it *before anything was sent*: an HTTP/1.1 connection found closed
    /// while handing the request over, or an HTTP/2 connection that had announced GOAWAY or
    /// refused the stream unprocessed. The server never saw those attempts, so this is not a
    /// retry; the probe never re-sends a request the server may have seen.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rerouted: u32,
    /// Microseconds from start to end, when the request ended (ok or failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_us: Option<u64>,
    /// Where the request falls relative to the drain the probe saw (before, during, after);
    /// set when the run ends, see [`Window`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<Window>,
    /// Wall-clock start, in ms since the Unix epoch (the run's start plus `start_ms`), to line
    /// the record up with drain reports and external events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_unix_ms: Option<f64>,
    /// The run's [`ProbeConfig::proxy_label`](crate::ProbeConfig::proxy_label): what sat
    /// between the probe and the service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_label: Option<String>,
    /// The second attempt, when the first failed and
    /// [`ProbeConfig::retry_idempotent`](crate::ProbeConfig::retry_idempotent) was on. The
    /// record's own fields stay those of the first attempt: a request that failed and then
    /// succeeded on retry keeps `outcome: failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<Retry>,
    /// `true` when the response said `Connection: close` (HTTP/1.1): the server told this
    /// keep-alive client to move off the connection.
    #[serde(default, skip_serializing_if = "is_false")]
    pub connection_close: bool,
}

/// The retry of a failed request: sent once, on a new connection, with the id
/// `<first id>-retry`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Retry {
    /// Its request id (`x-request-id`): the first attempt's id with `-retry` appended.
    pub id: String,
    /// When it started, in ms since the probe started.
    pub start_ms: f64,
    /// When it ended, in ms since the probe started; `None` when unfinished.
    pub end_ms: Option<f64>,
    /// Microseconds from its start to its end, when it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_us: Option<u64>,
    /// The response status, when response headers arrived.
    pub status: Option<u16>,
    /// How the retry ended.
    pub outcome: Outcome,
    /// Where it failed, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// Its error, when it failed or was left unfinished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The probe's id of the (new) connection it went on.
    pub conn: Option<u64>,
    /// The `x-instance` response header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// The `x-lameduck-phase` response header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Record {
    /// `true` when a drain-phase header was present and said anything but `serving`: the
    /// instance was already draining when it answered.
    pub fn served_by_draining(&self) -> bool {
        self.phase
            .as_deref()
            .is_some_and(|p| !p.eq_ignore_ascii_case("serving"))
    }

    /// Milliseconds from start to end, when the request ended.
    pub fn elapsed_ms(&self) -> Option<f64> {
        self.end_ms.map(|end| end - self.start_ms)
    }
}

/// Where a request falls relative to the drain the probe saw.
///
/// **during**: answered with a drain-phase header other than `serving`, or, for a request
/// with no such answer (failed, unfinished, answered by another instance), started between
/// the first draining answer's start and the last draining answer's end; **before**: started
/// before the first draining answer's start; **after**: started after the last draining
/// answer's end. With no draining answer in the run every request is **before**.
/// [`Summary::latency`](crate::Summary::latency) holds the percentiles of `ok` requests per
/// kind and window.
///
/// JSON form: `"before"`, `"during"`, `"after"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Window {
    /// Started before the first answer from a draining instance.
    Before,
    /// Answered by a draining instance, or started while answers said draining.
    During,
    /// Started after the last answer from a draining instance ended.
    After,
}

impl Window {
    /// All windows, in time order.
    pub const ALL: [Window; 3] = [Window::Before, Window::During, Window::After];

    /// The window's name as it appears in JSON and in the table.
    pub fn as_str(self) -> &'static str {
        match self {
            Window::Before => "before",
            Window::During => "during",
            Window::After => "after",
        }
    }
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
