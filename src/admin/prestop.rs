//! The `preStop` exec helper: `GET /drain` against the local admin port, for images without
//! `curl`.
//!
//! One request on hyper's HTTP/1.1 client connection (`Connection: close`), its body read up
//! to a fixed size. It talks to this crate's own admin router on the loopback interface, so it
//! needs no TLS, redirects, proxies or pooling.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use http::header::{ACCEPT, AUTHORIZATION, CONNECTION, HOST, USER_AGENT};
use http::{HeaderValue, Request};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::handlers::ADMIN_TOKEN_ENV;
use super::query::Wait;
use crate::lifecycle::Status;

/// Bound on the connect step when no timeout is given: the admin port is local, so a connect
/// that takes longer than this is not going to succeed.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Time allowed past the server-side `timeout` for its `504` to arrive before the client gives
/// up on its own.
const ANSWER_SLACK: Duration = Duration::from_secs(5);

/// The status JSON is small; anything much larger is not an answer from the admin router.
const MAX_RESPONSE: usize = 1 << 20;

/// What [`prestop`] asks for.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lameduck::admin::{PrestopOptions, Wait};
///
/// let options = PrestopOptions {
///     token: Some("s3cr3t-t0ken".into()),
///     wait: Wait::Drained,
///     timeout: Some(Duration::from_secs(25)),
/// };
/// # let _ = options;
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct PrestopOptions {
    /// Sent as `Authorization: Bearer <token>`. Surrounding whitespace is trimmed; the rest
    /// must be what the admin router accepts, 1 to 4096 characters of visible ASCII (`!` to
    /// `~`), or [`prestop`] fails at once, saying what is wrong.
    pub token: Option<String>,
    /// What the drain must reach before `/drain` answers. Default [`Wait::Drained`].
    pub wait: Wait,
    /// Bounds the wait on the server (`timeout=`), which answers `504` when it passes; the
    /// client gives up on its own a few seconds later. `None`: wait as long as it takes —
    /// kubelet bounds a `preStop` hook by the grace period anyway.
    pub timeout: Option<Duration>,
}

impl fmt::Debug for PrestopOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrestopOptions")
            .field("token", &self.token.as_ref().map(|_| "(redacted)"))
            .field("wait", &self.wait)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl PrestopOptions {
    /// The defaults, with the token read from env `LAMEDUCK_ADMIN_TOKEN` (unset or blank: no
    /// token) — the same variable the admin router reads, so one Secret serves both sides. A
    /// value that is not UTF-8 is kept (lossily) so that [`prestop`] says what is wrong with
    /// it, rather than sending no token.
    pub fn from_env() -> Self {
        let token = std::env::var_os(ADMIN_TOKEN_ENV)
            .map(|t| t.to_string_lossy().trim().to_owned())
            .filter(|t| !t.is_empty());
        Self {
            token,
            ..Self::default()
        }
    }
}

/// Why [`prestop`] failed. Its `Display` says what to check.
pub struct PrestopError {
    kind: ErrorKind,
    addr: SocketAddr,
}

enum ErrorKind {
    Connect(std::io::Error),
    Io(std::io::Error),
    Timeout(Duration),
    Status { code: u16, body: String },
    InvalidResponse(String),
    InvalidOptions(String),
    Runtime(String),
}

impl PrestopError {
    fn new(kind: ErrorKind, addr: SocketAddr) -> Self {
        Self { kind, addr }
    }

    /// `true` if the admin port could not be reached (refused, unreachable, connect timeout).
    pub fn is_connect(&self) -> bool {
        matches!(self.kind, ErrorKind::Connect(_))
    }

    /// `true` if no complete answer arrived in time (the client-side bound: the server-side
    /// `timeout` plus a few seconds). A `504` from the server is [`is_status`](Self::is_status).
    pub fn is_timeout(&self) -> bool {
        matches!(self.kind, ErrorKind::Timeout(_))
    }

    /// `true` if the admin router answered with a non-2xx status (see [`status`](Self::status)).
    pub fn is_status(&self) -> bool {
        matches!(self.kind, ErrorKind::Status { .. })
    }

    /// The HTTP status of a non-2xx answer: `401` (token), `504` (the server-side `timeout`
    /// passed; the drain goes on), `400`/`404`/`405` (a client/server mismatch).
    pub fn status(&self) -> Option<u16> {
        match self.kind {
            ErrorKind::Status { code, .. } => Some(code),
            _ => None,
        }
    }

    /// `true` if the answer was not HTTP/1.1 the helper understands, or too large.
    pub fn is_invalid_response(&self) -> bool {
        matches!(self.kind, ErrorKind::InvalidResponse(_))
    }
}

impl fmt::Debug for PrestopError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrestopError")
            .field("addr", &self.addr)
            .field("message", &self.to_string())
            .finish()
    }
}

impl fmt::Display for PrestopError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let addr = self.addr;
        match &self.kind {
            ErrorKind::Connect(e) => write!(
                f,
                "cannot connect to the admin listener at {addr}: {e}; \
                 is the app running with its admin port there?"
            ),
            ErrorKind::Io(e) => {
                write!(
                    f,
                    "lost the connection to the admin listener at {addr}: {e}"
                )
            }
            ErrorKind::Timeout(d) => write!(
                f,
                "no answer from the admin listener at {addr} within {}ms",
                d.as_millis()
            ),
            ErrorKind::Status { code: 504, body } => write!(
                f,
                "the drain did not reach the wait condition before the timeout \
                 (504 from {addr}); it goes on: {}",
                first_line(body)
            ),
            ErrorKind::Status { code: 401, body } => write!(
                f,
                "the admin listener at {addr} refused the token (401): {}; \
                 set {ADMIN_TOKEN_ENV} to the app's token",
                first_line(body)
            ),
            ErrorKind::Status { code, body } => write!(
                f,
                "the admin listener at {addr} answered {code}: {}",
                first_line(body)
            ),
            ErrorKind::InvalidResponse(why) => {
                write!(
                    f,
                    "malformed answer from the admin listener at {addr}: {why}"
                )
            }
            ErrorKind::InvalidOptions(why) => write!(f, "invalid prestop options: {why}"),
            ErrorKind::Runtime(why) => write!(f, "cannot run the prestop client: {why}"),
        }
    }
}

impl std::error::Error for PrestopError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            ErrorKind::Connect(e) | ErrorKind::Io(e) => Some(e),
            _ => None,
        }
    }
}

fn first_line(body: &str) -> &str {
    let line = body.lines().next().unwrap_or("").trim();
    if line.is_empty() {
        "(empty body)"
    } else {
        line
    }
}

/// Asks the admin router at `addr` to drain (`GET /drain`) and waits for its answer.
///
/// An unspecified address (`0.0.0.0:9901`, `[::]:9901`) is taken to mean the loopback address
/// on that port, so the app can pass the same value it binds its admin listener to.
///
/// Returns the status the router answered with when it answered 2xx (`202` for
/// [`Wait::None`], `200` once the wait condition holds). Exit 0 on `Ok` and 1 on `Err` from a
/// `preStop` exec command; kubelet records a failed hook as an event on the Pod and goes on
/// with SIGTERM either way.
///
/// # Errors
///
/// A [`PrestopError`] when the port cannot be reached, the answer is not 2xx (`401` for a
/// missing or wrong token, `504` when `timeout` passed), no answer arrives in time, or the
/// answer is malformed.
///
/// # Cancel safety
///
/// Dropping the future closes the connection; a drain it started goes on.
///
/// # Examples
///
/// ```no_run
/// use lameduck::admin::{prestop, PrestopOptions};
///
/// # async fn demo() {
/// let admin = "127.0.0.1:9901".parse().unwrap();
/// let code = match prestop(admin, PrestopOptions::from_env()).await {
///     Ok(_) => 0,
///     Err(e) => {
///         eprintln!("prestop: {e}");
///         1
///     }
/// };
/// std::process::exit(code);
/// # }
/// ```
pub async fn prestop(addr: SocketAddr, options: PrestopOptions) -> Result<Status, PrestopError> {
    let addr = local(addr);
    let err = |kind| PrestopError::new(kind, addr);
    let request =
        build_request(addr, &options).map_err(|why| err(ErrorKind::InvalidOptions(why)))?;

    let connect_bound = options
        .timeout
        .map_or(CONNECT_TIMEOUT, |t| t.min(CONNECT_TIMEOUT));
    let stream = match tokio::time::timeout(connect_bound, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(err(ErrorKind::Connect(e))),
        Err(_) => {
            return Err(err(ErrorKind::Connect(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("connect timed out after {}ms", connect_bound.as_millis()),
            ))))
        }
    };

    let exchange = async {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| err(classify(e)))?;
        // The connection task ends when the server closes (we asked for `Connection: close`).
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| err(classify(e)))?;
        let code = response.status().as_u16();
        let body = Limited::new(response.into_body(), MAX_RESPONSE)
            .collect()
            .await
            .map_err(|e| match e.downcast::<hyper::Error>() {
                Ok(e) => err(classify(*e)),
                Err(_) => err(ErrorKind::InvalidResponse(format!(
                    "the answer is larger than {MAX_RESPONSE} bytes"
                ))),
            })?
            .to_bytes();
        let body = String::from_utf8(body.to_vec())
            .map_err(|_| err(ErrorKind::InvalidResponse("the body is not UTF-8".into())))?;
        Ok::<_, PrestopError>((code, body))
    };
    let (code, body) = match options.timeout {
        Some(t) => {
            let bound = t.saturating_add(ANSWER_SLACK);
            match tokio::time::timeout(bound, exchange).await {
                Ok(r) => r?,
                Err(_) => return Err(err(ErrorKind::Timeout(bound))),
            }
        }
        None => exchange.await?,
    };
    if !(200..300).contains(&code) {
        return Err(err(ErrorKind::Status { code, body }));
    }
    serde_json::from_str::<Status>(&body).map_err(|e| {
        err(ErrorKind::InvalidResponse(format!(
            "the {code} answer is not the status JSON: {e}"
        )))
    })
}

/// A malformed answer is the server's fault; anything else is the connection's.
fn classify(e: hyper::Error) -> ErrorKind {
    if e.is_parse() || e.is_parse_status() {
        ErrorKind::InvalidResponse(format!("not an HTTP/1.1 answer: {e}"))
    } else {
        ErrorKind::Io(std::io::Error::other(e))
    }
}

/// [`prestop`] for a synchronous `main`, before any runtime exists: runs it on a small
/// current-thread runtime of its own.
///
/// # Errors
///
/// As [`prestop`]; also when called from inside a Tokio runtime (use `prestop(..).await`
/// there) or when the runtime cannot be built.
pub fn prestop_blocking(addr: SocketAddr, options: PrestopOptions) -> Result<Status, PrestopError> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(PrestopError::new(
            ErrorKind::Runtime(
                "prestop_blocking was called inside a Tokio runtime; use `prestop(..).await`"
                    .into(),
            ),
            local(addr),
        ));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| PrestopError::new(ErrorKind::Runtime(e.to_string()), local(addr)))?;
    rt.block_on(prestop(addr, options))
}

fn local(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), addr.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), addr.port())
        }
        _ => addr,
    }
}

fn build_request(
    addr: SocketAddr,
    options: &PrestopOptions,
) -> Result<Request<Empty<Bytes>>, String> {
    let mut target = format!("/drain?wait={}", options.wait.as_str());
    if let Some(t) = options.timeout {
        target.push_str(&format!("&timeout={}ms", t.as_millis()));
    }
    let mut req = Request::get(target)
        .header(HOST, addr.to_string())
        .header(USER_AGENT, "lameduck-prestop")
        .header(ACCEPT, "application/json")
        .header(CONNECTION, "close");
    if let Some(token) = &options.token {
        // The admin router's own rule: what it accepts, this sends. (A line break would end
        // the header early and let the token forge others.)
        let token = crate::vocab::token::check(token)
            .map_err(|problem| format!("the token {problem}: {}", crate::vocab::token::RULE))?;
        let value = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| format!("the token cannot be sent: {}", crate::vocab::token::RULE))?;
        req = req.header(AUTHORIZATION, value);
    }
    req.body(Empty::new())
        .map_err(|_| "the request cannot be built from these options".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_carries_wait_timeout_and_token() {
        let addr: SocketAddr = "127.0.0.1:9901".parse().unwrap();
        let opts = PrestopOptions {
            token: Some(" t0k \n".into()),
            wait: Wait::Propagated,
            timeout: Some(Duration::from_millis(1500)),
        };
        let req = build_request(addr, &opts).unwrap();
        assert_eq!(
            req.uri().to_string(),
            "/drain?wait=propagated&timeout=1500ms"
        );
        assert_eq!(req.headers()[AUTHORIZATION], "Bearer t0k");
        assert_eq!(req.headers()[CONNECTION], "close");
        let bad = PrestopOptions {
            token: Some("a\r\nX-Evil: 1".into()),
            ..PrestopOptions::default()
        };
        assert!(build_request(addr, &bad).is_err());
    }

    #[test]
    fn unspecified_means_loopback() {
        assert_eq!(
            local("0.0.0.0:9901".parse().unwrap()),
            "127.0.0.1:9901".parse().unwrap()
        );
        assert_eq!(
            local("[::]:9901".parse().unwrap()),
            "[::1]:9901".parse().unwrap()
        );
        assert_eq!(
            local("10.0.0.1:1".parse().unwrap()),
            "10.0.0.1:1".parse().unwrap()
        );
    }
}
