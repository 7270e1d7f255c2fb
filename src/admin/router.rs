//! The admin router: `/livez`, `/readyz`, `/drain`, `/status` (and `/metrics` with the
//! `prometheus` feature).
//!
//! # Invariants
//!
//! * Nothing changes state before every check of a request passed: route, method, body size,
//!   the body's arrival in time (`/drain`), token, query. Only a `/drain` request that passed
//!   all of them calls [`Drain::start`](crate::Drain::start).
//! * No handler can fail: every outcome is a response, and every refusal is a 4xx whose
//!   one-line body says what to change. Client input quoted in a message is shortened and
//!   stripped of control characters.
//! * Handlers hold no lock across an `.await`; `/drain` waits on the phase channel only.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::any;
use axum::Router;

#[cfg(feature = "prometheus")]
use super::handlers::prometheus_metrics;
use super::handlers::{
    drain, livez, not_found, readyz, status, AdminState, Token, ADMIN_TOKEN_ENV,
};
use crate::drain::{AdminSeam, Drain};
use crate::vocab::error::ConfigError;

/// Bodies are not used by any admin route; this only bounds what a confused client can make
/// the server read.
const DEFAULT_BODY_LIMIT: usize = 1024;

#[derive(Clone)]
enum TokenSetting {
    FromEnv,
    /// Checked against the token rule when given.
    Given(String),
    Off,
}

/// Builds the admin router: [`AdminBuilder::new`](crate::AdminBuilder::new) → settings →
/// [`router`](Self::router).
///
/// # Examples
///
/// ```
/// # fn demo() -> Result<(), lameduck::ConfigError> {
/// let drain = lameduck::Drain::builder().build()?;
/// let admin: axum::Router = lameduck::AdminBuilder::new(&drain).token("s3cr3t-t0ken")?.router();
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
    /// A builder for `drain`'s admin router, to set the token or the body limit.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn demo() -> Result<(), lameduck::ConfigError> {
    /// let drain = lameduck::Drain::builder().build()?;
    /// let admin: axum::Router = lameduck::AdminBuilder::new(&drain)
    ///     .token("s3cr3t-t0ken")?
    ///     .body_limit(256)
    ///     .router();
    /// # Ok(()) }
    /// ```
    pub fn new(drain: &Drain) -> Self {
        Self {
            drain: drain.clone(),
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
    /// Surrounding whitespace is trimmed; what is left must be 1 to 4096 characters of
    /// visible ASCII (`!` to `~`): no spaces, tabs, line breaks or non-ASCII characters. That
    /// is what kubelet's `httpGet` headers, `curl` and the bundled
    /// [`prestop`](crate::admin::prestop) client send verbatim, so the router and the hook
    /// always agree.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] ([`is_parse`](ConfigError::is_parse)) naming what is wrong and where
    /// (`the admin token holds a space at character 7`), never the token itself; nothing is
    /// changed. For no token, call [`without_token`](Self::without_token).
    pub fn token(mut self, token: impl Into<String>) -> Result<Self, ConfigError> {
        let given = token.into();
        let token = crate::vocab::token::check(&given).map_err(|problem| {
            ConfigError::parse(format!(
                "the admin token {problem}: {}; for no token, call without_token()",
                crate::vocab::token::RULE
            ))
        })?;
        self.token = TokenSetting::Given(token.to_owned());
        Ok(self)
    }

    /// No token: `/drain` is open to anyone who reaches the admin port, whatever
    /// `LAMEDUCK_ADMIN_TOKEN` says. Fine when the admin port is only reachable from the Pod
    /// itself or a NetworkPolicy guards it.
    pub fn without_token(mut self) -> Self {
        self.token = TokenSetting::Off;
        self
    }

    /// The largest request body accepted, in bytes (default 1 KiB); larger ones get `413`.
    /// Bodies are ignored: parameters go in the query string. Probes and `/status` never read
    /// theirs (a declared length over the limit still gets `413`); `/drain` reads its body
    /// before acting, bounded by this size and by the
    /// [`header_read_timeout`](Self::header_read_timeout).
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// Serves `GET /metrics`: samples the drain's metrics
    /// ([`Metrics::record`](crate::Metrics::record)) and renders everything the
    /// recorder behind `handle` holds, in Prometheus text format. Give it the handle of the
    /// recorder you installed (see [`prometheus_builder`](crate::drain_metrics::prometheus_builder)).
    /// Without a handle there is no `/metrics` route.
    ///
    /// Like `/status`, the route is open (no token): it changes nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let handle = lameduck::drain_metrics::prometheus_builder().install_recorder()?;
    /// let drain = lameduck::Drain::builder().build()?;
    /// let admin: axum::Router = lameduck::AdminBuilder::new(&drain).prometheus(handle).router();
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "prometheus")]
    pub fn prometheus(mut self, handle: metrics_exporter_prometheus::PrometheusHandle) -> Self {
        self.prometheus = Some(handle);
        self
    }

    /// How long [`serve`](Self::serve) lets an HTTP/1 client take to send a complete request
    /// head (default 5 s: probes send theirs at once). It also closes keep-alive connections
    /// idle that long.
    ///
    /// The same bound applies to the body of a `/drain` request, wherever the router is served:
    /// a body that has not arrived in full by then is refused with `408` and nothing starts.
    /// Probes and `/status` never read a body, so a body that never comes cannot delay them.
    pub fn header_read_timeout(mut self, timeout: Duration) -> Self {
        self.header_read_timeout = timeout;
        self
    }

    /// The most connections [`serve`](Self::serve) keeps open (default 64; at least 1). At the
    /// cap a new connection evicts one that owes no answer: an idle keep-alive connection
    /// first, then one whose request head (or `/drain` body) is still arriving, oldest first,
    /// never one whose client's bytes have not been read yet. It is refused only when every
    /// open connection is busy. All but an eighth of them (at least one kept) may hold a
    /// `/drain?wait=…` caller waiting for the drain: a caller beyond that share still starts
    /// the drain, and is answered `503` with `Retry-After` at once, so that waiters never hold
    /// the slots kubelet's probes need. Has no effect on [`router`](Self::router) served
    /// elsewhere.
    pub fn max_connections(mut self, max: usize) -> Self {
        self.max_connections = max.max(1);
        self
    }

    /// Serves the admin router on `listener` until the process is about to exit, hardened for
    /// hostile networks — use it instead of `axum::serve` for the admin port:
    ///
    /// * an HTTP/1 header-read timeout ([`header_read_timeout`](Self::header_read_timeout),
    ///   5 s) and a connection cap ([`max_connections`](Self::max_connections), 64) whose
    ///   eviction of connections that owe no answer keeps probes answering under a slowloris,
    ///   bodies that never come, and connection floods;
    /// * every `/drain?wait=…` caller gets its answer, fully written, before
    ///   [`Drain::run`](crate::Drain::run) returns (bounded by the hard deadline). With
    ///   `axum::serve`, `run` waits until the answers are handed to the server, but the server
    ///   may still be writing them when the process exits. Connections that owe nothing (idle,
    ///   or a head or a body still arriving) close when `run` is about to return, and never
    ///   hold it.
    ///
    /// The future resolves (`Ok`) when `run` is about to return; accept errors are logged and
    /// retried with a short back-off, never returned. HTTP/1.1 and HTTP/2 (h2c) are served.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// #[tokio::main]
    /// async fn main() -> Result<lameduck::DrainReport, Box<dyn std::error::Error>> {
    ///     let drain = lameduck::Drain::builder().build()?;
    ///     let admin = tokio::net::TcpListener::bind("0.0.0.0:9901").await?;
    ///     tokio::spawn(lameduck::AdminBuilder::new(&drain).serve(admin));
    ///     // ... serve the app ...
    ///     Ok(drain.run().await) // once every admin answer is written; exits with its code
    /// }
    /// ```
    pub fn serve(self, listener: tokio::net::TcpListener) -> super::AdminServe {
        let seam = AdminSeam::new(&self.drain);
        let header_read_timeout = self.header_read_timeout;
        let max_connections = self.max_connections;
        super::AdminServe::new(
            listener,
            self.router(),
            seam,
            header_read_timeout,
            max_connections,
        )
    }

    /// Builds the router. The token setting is resolved now (the environment is read once).
    ///
    /// [`Drain::builder`](crate::Drain::builder)'s `build` refused an unusable
    /// `LAMEDUCK_ADMIN_TOKEN`; should the variable have changed since to a value no request
    /// could carry, `/drain` refuses every request (fail closed), said as an error event and,
    /// without a tracing subscriber, on stderr.
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
            Token::Invalid(why) => say_unusable(why),
        }
        let state = Arc::new(AdminState {
            seam: AdminSeam::new(&self.drain),
            drain: self.drain,
            token,
            body_limit: self.body_limit,
            body_read_timeout: self.header_read_timeout,
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

/// Says that the admin token is unusable: an error event and, where no subscriber would show
/// it, a stderr line (bounded: a stalled stderr must not hold the caller).
fn say_unusable(why: &str) {
    tracing::error!(
        reason = %why,
        "lameduck: admin token unusable; /drain refuses every request"
    );
    if !tracing::dispatcher::has_been_set() {
        let line = format!(
            "lameduck: the admin token is unusable ({why}): /drain refuses every request; {}\n",
            crate::vocab::token::RULE
        );
        let _ = crate::report::stderr_bounded(line, crate::report::STDERR_WAIT);
    }
}
