//! The admin router: `/livez`, `/readyz`, `/drain`, `/status` (and `/metrics` with the
//! `prometheus` feature).
//!
//! # Invariants
//!
//! * Nothing changes state before every check of a request passed: route, method, body size,
//!   token, query. Only a `/drain` request that passed all of them calls
//!   [`Drain::start`](crate::Drain::start).
//! * No handler can fail: every outcome is a response, and every refusal is a 4xx whose
//!   one-line body says what to change. Client input quoted in a message is shortened and
//!   stripped of control characters.
//! * Handlers hold no lock across an `.await`; `/drain` waits on the phase channel only.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use http::header::{self, HeaderMap, HeaderValue};
use http::request::Parts;
use http::{Method, StatusCode};
use http_body::Body as _;
use http_body_util::{BodyExt, LengthLimitError, Limited};

use super::query::{shorten, Params};
use crate::{parse_duration, ConfigError, Drain, Phase, Trigger};

/// The environment variable the admin router reads its bearer token from by default.
///
/// Unset, empty or blank means no token. Surrounding whitespace is trimmed (a Secret created
/// from a file often ends with a newline).
pub const ADMIN_TOKEN_ENV: &str = "LAMEDUCK_ADMIN_TOKEN";

/// Bodies are not used by any admin route; this only bounds what a confused client can make
/// the server read.
const DEFAULT_BODY_LIMIT: usize = 1024;

/// Longest `timeout=` value looked at; anything longer is refused before parsing.
const MAX_TIMEOUT_LEN: usize = 32;

const PROBE_METHODS: &[Method] = &[Method::GET, Method::HEAD];
const DRAIN_METHODS: &[Method] = &[Method::GET, Method::POST];

/// What `/drain` waits for before answering (its `wait` parameter).
///
/// # Examples
///
/// ```
/// use lameduck::admin::Wait;
///
/// assert_eq!("propagated".parse::<Wait>().unwrap(), Wait::Propagated);
/// assert_eq!(Wait::default(), Wait::Drained);
/// assert!("soon".parse::<Wait>().is_err());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Wait {
    /// Answer at once, with `202 Accepted`.
    None,
    /// Answer once the drain stopped accepting (phase
    /// [`StoppedAccepting`](crate::Phase::StoppedAccepting)): load balancers had their window.
    Propagated,
    /// Answer once the drain is over (phase [`Done`](crate::Phase::Done)): in-flight work
    /// finished or was cut, closers ran. The default, and what a `preStop` hook wants: kubelet
    /// sends SIGTERM only after the hook returns.
    #[default]
    Drained,
}

impl Wait {
    /// The value as it appears in the query string (`none`, `propagated`, `drained`).
    pub fn as_str(self) -> &'static str {
        match self {
            Wait::None => "none",
            Wait::Propagated => "propagated",
            Wait::Drained => "drained",
        }
    }

    /// The phase that satisfies the wait, if any.
    fn phase(self) -> Option<Phase> {
        match self {
            Wait::None => None,
            Wait::Propagated => Some(Phase::StoppedAccepting),
            Wait::Drained => Some(Phase::Done),
        }
    }
}

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Wait {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(Wait::None),
            "propagated" => Ok(Wait::Propagated),
            "drained" => Ok(Wait::Drained),
            other => Err(ConfigError::parse(format!(
                "`{}` is not a wait condition: expected none, propagated or drained",
                shorten(other)
            ))),
        }
    }
}

#[derive(Clone)]
enum TokenSetting {
    FromEnv,
    Given(String),
    Off,
}

/// Builds the admin router: [`Drain::admin`](crate::Drain::admin) → settings →
/// [`router`](Self::router).
///
/// # Examples
///
/// ```
/// # fn demo() -> Result<(), lameduck::ConfigError> {
/// let drain = lameduck::Drain::builder().build()?;
/// let admin: axum::Router = drain.admin().token("s3cr3t-t0ken").router();
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "a builder does nothing until `router` is called"]
pub struct AdminBuilder {
    drain: Drain,
    token: TokenSetting,
    body_limit: usize,
    header_read_timeout: Duration,
    max_connections: usize,
    #[cfg(feature = "prometheus")]
    prometheus: Option<metrics_exporter_prometheus::PrometheusHandle>,
}

impl fmt::Debug for AdminBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The token is a secret: show where it comes from, never its value.
        let token = match self.token {
            TokenSetting::FromEnv => "from env",
            TokenSetting::Given(_) => "given (redacted)",
            TokenSetting::Off => "off",
        };
        let mut d = f.debug_struct("AdminBuilder");
        d.field("token", &token)
            .field("body_limit", &self.body_limit)
            .field("header_read_timeout", &self.header_read_timeout)
            .field("max_connections", &self.max_connections);
        #[cfg(feature = "prometheus")]
        d.field("prometheus", &self.prometheus.is_some());
        d.finish_non_exhaustive()
    }
}

impl AdminBuilder {
    pub(crate) fn new(drain: Drain) -> Self {
        Self {
            drain,
            token: TokenSetting::FromEnv,
            body_limit: DEFAULT_BODY_LIMIT,
            header_read_timeout: super::DEFAULT_ADMIN_HEADER_READ_TIMEOUT,
            max_connections: super::DEFAULT_ADMIN_MAX_CONNECTIONS,
            #[cfg(feature = "prometheus")]
            prometheus: None,
        }
    }

    /// Requires `Authorization: Bearer <token>` on `/drain`. Overrides `LAMEDUCK_ADMIN_TOKEN`.
    ///
    /// Surrounding whitespace is trimmed. A token that is empty, or holds a control character
    /// (it could never be sent in a header), makes `/drain` refuse every request with `401`
    /// and a message saying so — a broken token fails closed, not open.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = TokenSetting::Given(token.into());
        self
    }

    /// No token: `/drain` is open to anyone who reaches the admin port, whatever
    /// `LAMEDUCK_ADMIN_TOKEN` says. Fine when the admin port is only reachable from the Pod
    /// itself or a NetworkPolicy guards it.
    pub fn without_token(mut self) -> Self {
        self.token = TokenSetting::Off;
        self
    }

    /// The largest request body read, in bytes (default 1 KiB); larger ones get `413`. Bodies
    /// are ignored: parameters go in the query string.
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// Serves `GET /metrics`: samples the drain's metrics
    /// ([`Drain::record_metrics`](crate::Drain::record_metrics)) and renders everything the
    /// recorder behind `handle` holds, in Prometheus text format. Give it the handle of the
    /// recorder you installed (see [`prometheus_builder`](crate::metrics::prometheus_builder)).
    /// Without a handle there is no `/metrics` route.
    ///
    /// Like `/status`, the route is open (no token): it changes nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let handle = lameduck::metrics::prometheus_builder().install_recorder()?;
    /// let drain = lameduck::Drain::builder().build()?;
    /// let admin: axum::Router = drain.admin().prometheus(handle).router();
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "prometheus")]
    #[cfg_attr(docsrs, doc(cfg(feature = "prometheus")))]
    pub fn prometheus(mut self, handle: metrics_exporter_prometheus::PrometheusHandle) -> Self {
        self.prometheus = Some(handle);
        self
    }

    /// How long [`serve`](Self::serve) lets an HTTP/1 client take to send a complete request
    /// head (default 5 s: probes send theirs at once). It also closes keep-alive connections
    /// idle that long. Has no effect on [`router`](Self::router) served elsewhere.
    pub fn header_read_timeout(mut self, timeout: Duration) -> Self {
        self.header_read_timeout = timeout;
        self
    }

    /// The most connections [`serve`](Self::serve) keeps open (default 64; at least 1). At the
    /// cap a new connection evicts the oldest one with no request in progress; it is refused
    /// only when every open connection is busy. Has no effect on [`router`](Self::router)
    /// served elsewhere.
    pub fn max_connections(mut self, max: usize) -> Self {
        self.max_connections = max.max(1);
        self
    }

    /// Serves the admin router on `listener` until the process is about to exit, hardened for
    /// hostile networks — use it instead of `axum::serve` for the admin port:
    ///
    /// * an HTTP/1 header-read timeout ([`header_read_timeout`](Self::header_read_timeout),
    ///   5 s) and a connection cap ([`max_connections`](Self::max_connections), 64) whose
    ///   eviction of the oldest idle connection keeps probes answering under a slowloris;
    /// * every `/drain?wait=…` caller gets its answer, fully written, before
    ///   [`Drain::run`](crate::Drain::run) returns (bounded by the hard deadline). With
    ///   `axum::serve`, `run` waits until the answers are handed to the server, but the server
    ///   may still be writing them when the process exits.
    ///
    /// The future resolves (`Ok`) when `run` is about to return; accept errors are logged and
    /// retried with a short back-off, never returned. HTTP/1.1 and HTTP/2 (h2c) are served.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let drain = lameduck::Drain::builder().build()?;
    /// let admin = tokio::net::TcpListener::bind("0.0.0.0:9901").await?;
    /// tokio::spawn(drain.admin().serve(admin));
    /// // ... serve the app ...
    /// let report = drain.run().await; // returns once every admin answer is written
    /// std::process::exit(report.exit_code);
    /// # }
    /// ```
    pub fn serve(self, listener: tokio::net::TcpListener) -> super::AdminServe {
        let drain = self.drain.clone();
        let header_read_timeout = self.header_read_timeout;
        let max_connections = self.max_connections;
        super::AdminServe::new(
            listener,
            self.router(),
            drain,
            header_read_timeout,
            max_connections,
        )
    }

    /// Builds the router. The token setting is resolved now (the environment is read once).
    pub fn router(self) -> Router {
        let token = match self.token {
            TokenSetting::Off => Token::Open,
            TokenSetting::Given(t) => Token::from_setting(&t, "the token given to the builder"),
            TokenSetting::FromEnv => match std::env::var(ADMIN_TOKEN_ENV) {
                Ok(t) if t.trim().is_empty() => Token::Open,
                Ok(t) => Token::from_setting(&t, ADMIN_TOKEN_ENV),
                Err(std::env::VarError::NotPresent) => Token::Open,
                Err(std::env::VarError::NotUnicode(_)) => {
                    Token::Invalid(format!("{ADMIN_TOKEN_ENV} is not valid UTF-8"))
                }
            },
        };
        match &token {
            Token::Open => tracing::info!("lameduck: admin /drain needs no token"),
            Token::Required(_) => tracing::info!("lameduck: admin /drain requires a bearer token"),
            Token::Invalid(why) => {
                tracing::error!(
                    reason = %why,
                    "lameduck: admin token unusable; /drain refuses every request"
                )
            }
        }
        let state = Arc::new(AdminState {
            drain: self.drain,
            token,
            body_limit: self.body_limit,
            #[cfg(feature = "prometheus")]
            prometheus: self.prometheus,
        });
        let routes = Router::new()
            .route("/livez", any(livez))
            .route("/readyz", any(readyz))
            .route("/drain", any(drain))
            .route("/status", any(status));
        #[cfg(feature = "prometheus")]
        let routes = match state.prometheus {
            Some(_) => routes.route("/metrics", any(prometheus_metrics)),
            None => routes,
        };
        routes.fallback(not_found).with_state(state)
    }
}

enum Token {
    Open,
    Required(Box<[u8]>),
    /// Set but unusable: `/drain` is refused (fail closed) with this reason.
    Invalid(String),
}

impl Token {
    fn from_setting(raw: &str, source: &str) -> Token {
        let t = raw.trim();
        if t.is_empty() {
            Token::Invalid(format!("{source} is empty"))
        } else if t.chars().any(char::is_control) {
            Token::Invalid(format!("{source} holds a control character"))
        } else {
            Token::Required(t.as_bytes().into())
        }
    }
}

struct AdminState {
    drain: Drain,
    token: Token,
    body_limit: usize,
    #[cfg(feature = "prometheus")]
    prometheus: Option<metrics_exporter_prometheus::PrometheusHandle>,
}

type Outcome = Result<Response, Refusal>;

/// A request refused before anything changed: a 4xx with a one-line message.
#[derive(Debug)]
enum Refusal {
    NotAllowed {
        message: String,
        allow: &'static str,
    },
    TooLarge(String),
    Unauthorized(String),
    BadRequest(String),
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Refusal::NotAllowed { message, allow } => {
                let mut res = text(StatusCode::METHOD_NOT_ALLOWED, message);
                res.headers_mut()
                    .insert(header::ALLOW, HeaderValue::from_static(allow));
                res
            }
            Refusal::TooLarge(message) => text(StatusCode::PAYLOAD_TOO_LARGE, message),
            Refusal::Unauthorized(message) => {
                let mut res = text(StatusCode::UNAUTHORIZED, message);
                res.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"lameduck-admin\""),
                );
                res
            }
            Refusal::BadRequest(message) => text(StatusCode::BAD_REQUEST, message),
        }
    }
}

impl AdminState {
    /// Method and body checks shared by every route; returns the request head.
    async fn admit(
        &self,
        req: Request,
        route: &str,
        allowed: &[Method],
        allow: &'static str,
    ) -> Result<Parts, Refusal> {
        let (parts, body) = req.into_parts();
        if !allowed.contains(&parts.method) {
            return Err(Refusal::NotAllowed {
                message: format!(
                    "method {} is not allowed on {route}: use {allow}",
                    shorten(parts.method.as_str())
                ),
                allow,
            });
        }
        self.read_body(body).await?;
        Ok(parts)
    }

    /// Reads and drops the body, refusing it past the limit; a declared length over the limit
    /// is refused without reading.
    async fn read_body(&self, body: Body) -> Result<(), Refusal> {
        let too_large = || {
            Refusal::TooLarge(format!(
                "request body over the admin limit of {} bytes: \
                 admin routes take no body, parameters go in the query string",
                self.body_limit
            ))
        };
        if body.size_hint().lower() > self.body_limit as u64 {
            return Err(too_large());
        }
        match Limited::new(body, self.body_limit).collect().await {
            Ok(_) => Ok(()),
            Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large()),
            Err(_) => Err(bad_request("could not read the request body")),
        }
    }

    fn authorize(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        let expected = match &self.token {
            Token::Open => return Ok(()),
            Token::Invalid(why) => {
                return Err(unauthorized(format!(
                    "the admin token is unusable ({why}): fix {ADMIN_TOKEN_ENV} or the builder's \
                     token; /drain is refused until then"
                )))
            }
            Token::Required(t) => t,
        };
        let mut values = headers.get_all(header::AUTHORIZATION).iter();
        let value = match (values.next(), values.next()) {
            (Some(v), None) => v,
            (None, _) => {
                return Err(unauthorized(
                    "missing bearer token: send `Authorization: Bearer <token>` \
                     (the value of LAMEDUCK_ADMIN_TOKEN)",
                ))
            }
            (Some(_), Some(_)) => {
                return Err(unauthorized(
                    "more than one Authorization header: send exactly one",
                ))
            }
        };
        match bearer(value.as_bytes()) {
            Some(given) if constant_time_eq(given, expected) => Ok(()),
            Some(_) => Err(unauthorized("wrong bearer token")),
            None => Err(unauthorized(
                "the Authorization header is not `Bearer <token>`",
            )),
        }
    }
}

/// The token of a `Bearer <token>` credential (scheme case-insensitive, per RFC 9110).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let space = value.iter().position(|b| *b == b' ')?;
    let (scheme, rest) = value.split_at(space);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// Compares without an early exit, so the time taken does not tell how much of a guess was
/// right. (The length is not secret enough to hide.)
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn livez(State(s): State<Arc<AdminState>>, req: Request) -> Outcome {
    let parts = s.admit(req, "/livez", PROBE_METHODS, "GET, HEAD").await?;
    let params = Params::parse(parts.uri.query(), "/livez", &["verbose"]).map_err(bad_request)?;
    // Always alive while the process runs: a failing liveness probe during a drain would make
    // kubelet restart the container and lose the work being drained.
    if params.flag("verbose").map_err(bad_request)? {
        Ok(text(StatusCode::OK, "[+]ping ok\nlivez check passed\n"))
    } else {
        Ok(text(StatusCode::OK, "ok"))
    }
}

async fn readyz(State(s): State<Arc<AdminState>>, req: Request) -> Outcome {
    let parts = s.admit(req, "/readyz", PROBE_METHODS, "GET, HEAD").await?;
    let params = Params::parse(parts.uri.query(), "/readyz", &["verbose"]).map_err(bad_request)?;
    let verbose = params.flag("verbose").map_err(bad_request)?;
    let caller = crate::readiness::Caller::from_user_agent(
        parts
            .headers
            .get(header::USER_AGENT)
            .map(HeaderValue::as_bytes),
    );
    let r = s.drain.readiness_for(caller);
    let code = if r.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    if verbose {
        let mut body = r.checks.join("\n");
        body.push('\n');
        if r.ready {
            body.push_str("readyz check passed\n");
        } else {
            body.push_str("readyz check failed: ");
            body.push_str(&r.reason);
            body.push('\n');
        }
        Ok(text(code, body))
    } else {
        Ok(text(code, r.reason))
    }
}

async fn status(State(s): State<Arc<AdminState>>, req: Request) -> Outcome {
    let parts = s.admit(req, "/status", PROBE_METHODS, "GET, HEAD").await?;
    Params::parse(parts.uri.query(), "/status", &[]).map_err(bad_request)?;
    Ok(status_json(StatusCode::OK, &s.drain))
}

async fn drain(State(s): State<Arc<AdminState>>, req: Request) -> Outcome {
    let parts = s.admit(req, "/drain", DRAIN_METHODS, "GET, POST").await?;
    s.authorize(&parts.headers)?;
    let params =
        Params::parse(parts.uri.query(), "/drain", &["wait", "timeout"]).map_err(bad_request)?;
    let wait = match params.get("wait") {
        None => Wait::default(),
        Some(v) => v
            .parse::<Wait>()
            .map_err(|e| bad_request(format!("invalid value for query parameter `wait`: {e}")))?,
    };
    let timeout = match params.get("timeout") {
        None => None,
        Some(v) if v.len() > MAX_TIMEOUT_LEN => {
            return Err(bad_request(format!(
                "invalid value for query parameter `timeout`: `{}` is too long for a duration",
                shorten(v)
            )))
        }
        Some(v) => Some(parse_duration(v).map_err(|e| {
            bad_request(format!("invalid value for query parameter `timeout`: {e}"))
        })?),
    };

    // Every check passed: only now may the state change.
    let started = s.drain.start(Trigger::PreStop);
    tracing::info!(
        wait = wait.as_str(),
        timeout_ms = timeout.map(|t| t.as_millis() as u64),
        started,
        "lameduck: /drain called"
    );
    let Some(target) = wait.phase() else {
        return Ok(status_json(StatusCode::ACCEPTED, &s.drain));
    };
    // An answer is owed from now on: `Drain::run` does not return before the response body
    // holding this token is handed to the server (or the caller went away).
    let owed = s.drain.exit_holds().token();
    let reached = s.drain.reached(target);
    // The drain is driven by its own task: giving up the wait (or the client going away)
    // never stops it.
    let on_time = match timeout.and_then(deadline_after) {
        Some(at) => tokio::time::timeout_at(at, reached).await.is_ok(),
        None => {
            reached.await;
            true
        }
    };
    let code = if on_time {
        StatusCode::OK
    } else {
        StatusCode::GATEWAY_TIMEOUT
    };
    Ok(status_json(code, &s.drain).map(|body| {
        Body::new(super::serve::Held {
            inner: body,
            _hold: owed,
        })
    }))
}

#[cfg(feature = "prometheus")]
async fn prometheus_metrics(State(s): State<Arc<AdminState>>, req: Request) -> Outcome {
    let parts = s.admit(req, "/metrics", PROBE_METHODS, "GET, HEAD").await?;
    Params::parse(parts.uri.query(), "/metrics", &[]).map_err(bad_request)?;
    let Some(handle) = &s.prometheus else {
        // Unreachable: the route is only added with a handle.
        return Ok(text(
            StatusCode::NOT_FOUND,
            "no admin route /metrics: no Prometheus handle was given to the admin builder",
        ));
    };
    // Sample now: between lifecycle events the gauges hold their last sample, and a scrape
    // should see this instant.
    s.drain.record_metrics();
    // Without the exporter's own listener nobody else runs its upkeep.
    handle.run_upkeep();
    let mut res = text(StatusCode::OK, handle.render());
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    Ok(res)
}

/// `None` when the timeout is so long it overflows the clock: that is no timeout at all.
fn deadline_after(d: Duration) -> Option<tokio::time::Instant> {
    tokio::time::Instant::now().checked_add(d)
}

async fn not_found(req: Request) -> Response {
    text(
        StatusCode::NOT_FOUND,
        format!(
            "no admin route {}: the routes are /livez, /readyz, /drain and /status",
            shorten(req.uri().path())
        ),
    )
}

fn text(code: StatusCode, body: impl Into<String>) -> Response {
    let mut res = Response::new(Body::from(body.into()));
    *res.status_mut() = code;
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    // Probe and drain answers describe this instant; nothing in between may replay them.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

fn status_json(code: StatusCode, drain: &Drain) -> Response {
    let mut body = serde_json::to_string(&drain.status())
        .expect("Status has only string keys and plain values, so it always serializes");
    body.push('\n');
    let mut res = text(code, body);
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

fn bad_request(msg: impl Into<String>) -> Refusal {
    // Messages quote decoded client input, which may hold line breaks: keep the answer one line.
    let msg: String = msg
        .into()
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    Refusal::BadRequest(msg)
}

fn unauthorized(msg: impl Into<String>) -> Refusal {
    Refusal::Unauthorized(msg.into())
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_parsing() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer   abc "), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bearer"), None);
        assert_eq!(bearer(b"Bearer "), None);
    }

    #[test]
    fn constant_time_eq_compares() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }

    #[test]
    fn token_settings_fail_closed() {
        assert!(matches!(Token::from_setting(" t\n", "x"), Token::Required(t) if &*t == b"t"));
        assert!(matches!(Token::from_setting("  ", "x"), Token::Invalid(_)));
        assert!(matches!(
            Token::from_setting("a\u{7}b", "x"),
            Token::Invalid(_)
        ));
    }

    #[test]
    fn wait_round_trips() {
        for w in [Wait::None, Wait::Propagated, Wait::Drained] {
            assert_eq!(w.as_str().parse::<Wait>().unwrap(), w);
        }
        let err = "Drained".parse::<Wait>().unwrap_err();
        assert!(err.is_parse());
    }
}
