//! What to send, where, how fast and for how long — and the checks that refuse nonsense.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

mod error;
mod validate;

pub use error::ConfigError;

/// The most requests one run may plan; every record is kept in memory until the end.
pub const MAX_PLANNED_REQUESTS: f64 = 5_000_000.0;
/// The highest rate for one kind of request, per second.
pub const MAX_RATE: f64 = 100_000.0;
/// The longest `duration`, `drain_wait`, slow or stream time the probe accepts.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);

/// A kind of request the probe sends.
///
/// JSON form: `"short"`, `"slow"`, `"stream"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// `GET /`: answered at once.
    Short,
    /// `GET /slow?ms=N`: the server answers after N ms, so it is in flight when a drain starts.
    Slow,
    /// `GET /stream?ms=N`: a chunked body streaming for N ms; read to its end to count as a success.
    Stream,
}

impl Kind {
    /// All kinds, in table order.
    pub const ALL: [Kind; 3] = [Kind::Short, Kind::Slow, Kind::Stream];

    /// The kind's name as it appears in JSON and in the table.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Short => "short",
            Kind::Slow => "slow",
            Kind::Stream => "stream",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How requests pick their connection.
///
/// JSON and flag form: `keepalive`, `fresh`, `mixed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConnectionMode {
    /// Reuse idle keep-alive connections (HTTP/1.1) or one shared connection (HTTP/2), like a
    /// pooling client or proxy; open a new one only when none is usable.
    #[serde(rename = "keepalive")]
    KeepAlive,
    /// One new connection per request, closed after it, like a one-shot client.
    Fresh,
    /// Alternate: even requests keep-alive, odd requests fresh. Records say which one each used.
    Mixed,
}

impl ConnectionMode {
    /// The flag value (`keepalive`, `fresh`, `mixed`).
    pub fn as_str(self) -> &'static str {
        match self {
            ConnectionMode::KeepAlive => "keepalive",
            ConnectionMode::Fresh => "fresh",
            ConnectionMode::Mixed => "mixed",
        }
    }
}

impl fmt::Display for ConnectionMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ConnectionMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "keepalive" | "keep-alive" => Ok(ConnectionMode::KeepAlive),
            "fresh" => Ok(ConnectionMode::Fresh),
            "mixed" => Ok(ConnectionMode::Mixed),
            _ => Err(format!("expected keepalive, fresh or mixed, got {s:?}")),
        }
    }
}

/// The HTTP version spoken to the target.
///
/// JSON form: `"1.1"`, `"2"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum HttpVersion {
    /// HTTP/1.1.
    #[serde(rename = "1.1")]
    Http1,
    /// HTTP/2 over cleartext with prior knowledge (h2c, no upgrade dance).
    #[serde(rename = "2")]
    Http2,
}

impl fmt::Display for HttpVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HttpVersion::Http1 => "HTTP/1.1",
            HttpVersion::Http2 => "HTTP/2",
        })
    }
}

impl FromStr for HttpVersion {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "1" | "1.1" | "http1" | "http/1.1" => Ok(HttpVersion::Http1),
            "2" | "h2c" | "http2" | "http/2" => Ok(HttpVersion::Http2),
            _ => Err(format!("expected 1 or 2, got {s:?}")),
        }
    }
}

/// Everything a probe run needs.
///
/// Start from [`ProbeConfig::new`] (the defaults of the command line) and change fields;
/// [`Probe::new`](crate::Probe::new) validates the whole and says which setting to change.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lameduck_probe::{ConnectionMode, HttpVersion, ProbeConfig};
///
/// let mut config = ProbeConfig::new("127.0.0.1:8080");
/// config.short_rate = 50.0;
/// config.slow_rate = 5.0;
/// config.slow = Duration::from_millis(1500);
/// config.connections = ConnectionMode::Mixed;
/// config.http = HttpVersion::Http2;
/// config.duration = Duration::from_secs(60);
/// config.label = "ingress".into();
/// assert!(config.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ProbeConfig {
    /// Where to connect: `host:port`, `http://host:port` or `[v6]:port`. A name is resolved on
    /// every new connection, like a client of a Service would.
    pub target: String,
    /// The `Host` header (`:authority` on HTTP/2); `None` sends the target's `host:port`.
    pub host: Option<String>,
    /// HTTP/1.1 or HTTP/2 (h2c, prior knowledge). Default HTTP/1.1.
    pub http: HttpVersion,
    /// Keep-alive, fresh or mixed connections. Default keep-alive.
    pub connections: ConnectionMode,
    /// The traffic-path label, sent as `x-traffic-path` and written into every record, so runs
    /// through different paths (ingress, Service, Pod IP) can be told apart. Default `default`.
    pub label: String,
    /// Short requests per second; `0` sends none. Default 20.
    pub short_rate: f64,
    /// Slow requests per second; `0` sends none. Default 2.
    pub slow_rate: f64,
    /// How long the server takes to answer a slow request (the `ms` parameter). Default 2 s.
    pub slow: Duration,
    /// Streaming requests per second; `0` (the default) sends none.
    pub stream_rate: f64,
    /// How long a stream lasts (the `ms` parameter). Default 3 s.
    pub stream: Duration,
    /// Path of short requests. Default `/`.
    pub short_path: String,
    /// Path of slow requests; `{ms}` is replaced by the slow time in milliseconds.
    /// Default `/slow?ms={ms}`.
    pub slow_path: String,
    /// Path of streaming requests; `{ms}` is replaced by the stream time in milliseconds.
    /// Default `/stream?ms={ms}`.
    pub stream_path: String,
    /// How long to send. Default 30 s.
    pub duration: Duration,
    /// After sending stops, how long to wait for requests still running; those still running
    /// then are counted `unfinished`. Default 10 s.
    pub drain_wait: Duration,
    /// Limit for one TCP connect (and, for HTTP/2, its handshake). Default 3 s.
    pub connect_timeout: Duration,
    /// Requests in flight at most; a request due while the cap is reached is not sent and is
    /// counted in [`Summary::not_sent`](crate::Summary::not_sent). Default 256.
    pub max_in_flight: usize,
    /// Idle HTTP/1.1 keep-alive connections kept for reuse at most. Default 32.
    pub max_idle: usize,
    /// Start even when the first connection attempt fails (the target may still be coming up);
    /// otherwise [`Probe::run`](crate::Probe::run) fails fast. Default `false`.
    pub allow_unreachable_start: bool,
    /// Print a progress line to stderr every second. Default `false` (the binary turns it on).
    pub progress: bool,
    /// What sits between the probe and the service, in the user's words (`kube-proxy iptables
    /// 1.31`, `haproxy 3.0 round-robin`): carried in the summary and every record so each
    /// timeline says what it measured. Up to 120 printable characters. Default `None`.
    pub proxy_label: Option<String>,
    /// Retry a failed request once, on a new connection, as a client retrying idempotent
    /// GETs would. The record keeps the first attempt's failure (`outcome: failed`) and holds
    /// the retry in [`Record::retry`](crate::Record::retry); the summary counts "failed, then
    /// succeeded on retry" apart, so a retried request never passes for a plain success.
    /// Default `false`: every failure a client without retries would see is counted.
    pub retry_idempotent: bool,
    /// Send only in the first `on` of every `on + off`, counted from the start of the run:
    /// a client that works, then pauses (a poller, a batch job; with a short `on`, periodic
    /// bursts). Each kind keeps its rate while on and sends nothing while off. Default `None`:
    /// steady.
    pub on_off: Option<OnOff>,
    /// The local address every connection is opened from (port chosen by the system): one
    /// client among many on a host with several addresses, as the server sees a Pod of its
    /// own. Default `None`: the system picks.
    pub bind: Option<std::net::IpAddr>,
}

/// Work for `on`, pause for `off`, again and again: [`ProbeConfig::on_off`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OnOff {
    /// How long each sending phase lasts (more than zero).
    pub on: Duration,
    /// How long each pause lasts.
    pub off: Duration,
}

impl OnOff {
    /// Whether `elapsed` since the start of the run falls in a sending phase.
    pub fn sending(&self, elapsed: Duration) -> bool {
        let period = (self.on + self.off).as_nanos();
        period == 0 || elapsed.as_nanos() % period < self.on.as_nanos()
    }
}

impl ProbeConfig {
    /// The command line's defaults against `target`.
    pub fn new(target: impl Into<String>) -> Self {
        ProbeConfig {
            target: target.into(),
            host: None,
            http: HttpVersion::Http1,
            connections: ConnectionMode::KeepAlive,
            label: "default".to_owned(),
            short_rate: 20.0,
            slow_rate: 2.0,
            slow: Duration::from_secs(2),
            stream_rate: 0.0,
            stream: Duration::from_secs(3),
            short_path: "/".to_owned(),
            slow_path: "/slow?ms={ms}".to_owned(),
            stream_path: "/stream?ms={ms}".to_owned(),
            duration: Duration::from_secs(30),
            drain_wait: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(3),
            max_in_flight: 256,
            max_idle: 32,
            allow_unreachable_start: false,
            progress: false,
            proxy_label: None,
            retry_idempotent: false,
            on_off: None,
            bind: None,
        }
    }

    /// The rate configured for `kind`.
    pub fn rate(&self, kind: Kind) -> f64 {
        match kind {
            Kind::Short => self.short_rate,
            Kind::Slow => self.slow_rate,
            Kind::Stream => self.stream_rate,
        }
    }

    /// The path (with query) sent for `kind`, `{ms}` filled in.
    pub fn path(&self, kind: Kind) -> String {
        match kind {
            Kind::Short => self.short_path.clone(),
            Kind::Slow => fill_ms(&self.slow_path, self.slow),
            Kind::Stream => fill_ms(&self.stream_path, self.stream),
        }
    }

    /// Checks every setting; the error names the one to change.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.parse().map(|_| ())
    }

    /// Validates and resolves the parts the runner needs.
    pub(crate) fn parse(&self) -> Result<Parsed, ConfigError> {
        validate::parse(self)
    }
}

/// The validated, resolved parts of a [`ProbeConfig`].
#[derive(Debug, Clone)]
pub(crate) struct Parsed {
    /// `host:port` for `TcpStream::connect` (resolved on every connect).
    pub(crate) connect_to: String,
    /// The `Host` / `:authority` value.
    pub(crate) host: String,
    /// Request paths, indexed like [`Kind::ALL`].
    pub(crate) paths: [String; 3],
}

fn fill_ms(template: &str, d: Duration) -> String {
    template.replace("{ms}", &d.as_millis().to_string())
}
