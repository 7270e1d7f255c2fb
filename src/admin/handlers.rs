//! The admin routes' handlers: admission (route, method, body, token, query), then the answer.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::header::{self, HeaderMap, HeaderValue};
use http::request::Parts;
use http::{Method, StatusCode};
use http_body::Body as _;
use http_body_util::{BodyExt, LengthLimitError, Limited};

use super::query::{shorten, Params, Wait};
use crate::drain::{AdminSeam, Drain};
use crate::vocab::budget::parse_duration;
use crate::vocab::phase::Trigger;

mod admission;

use admission::BodyUse;
pub(super) use admission::{AdminRefusal, AdminState, HandlerOutcome, Token};

pub use crate::vocab::token::ADMIN_TOKEN_ENV;

/// Longest `timeout=` value looked at; anything longer is refused before parsing.
const MAX_TIMEOUT_LEN: usize = 32;

const PROBE_METHODS: &[Method] = &[Method::GET, Method::HEAD];
const DRAIN_METHODS: &[Method] = &[Method::GET, Method::POST];

pub(super) async fn livez(State(s): State<Arc<AdminState>>, req: Request) -> HandlerOutcome {
    let parts = s
        .admit(req, "/livez", PROBE_METHODS, "GET, HEAD", BodyUse::Ignore)
        .await?;
    let params = Params::parse(parts.uri.query(), "/livez", &["verbose"]).map_err(bad_request)?;
    // Always alive while the process runs: a failing liveness probe during a drain would make
    // kubelet restart the container and lose the work being drained.
    if params.flag("verbose").map_err(bad_request)? {
        Ok(text(StatusCode::OK, "[+]ping ok\nlivez check passed\n"))
    } else {
        Ok(text(StatusCode::OK, "ok"))
    }
}

pub(super) async fn readyz(State(s): State<Arc<AdminState>>, req: Request) -> HandlerOutcome {
    let parts = s
        .admit(req, "/readyz", PROBE_METHODS, "GET, HEAD", BodyUse::Ignore)
        .await?;
    let params = Params::parse(parts.uri.query(), "/readyz", &["verbose"]).map_err(bad_request)?;
    let verbose = params.flag("verbose").map_err(bad_request)?;
    // Who asks decides what `auto` answers: probe headers first, then the User-Agent.
    let get = |name: &str| parts.headers.get(name).map(HeaderValue::as_bytes);
    let probe = crate::readiness::sources::classify::ProbeCaller::classify(
        get(header::USER_AGENT.as_str()),
        get(crate::readiness::KNATIVE_PROBE_HEADER),
        get(crate::readiness::PROBE_HEADER),
    );
    let r = s.seam.readiness_for_probe(&probe);
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

pub(super) async fn status(State(s): State<Arc<AdminState>>, req: Request) -> HandlerOutcome {
    let parts = s
        .admit(req, "/status", PROBE_METHODS, "GET, HEAD", BodyUse::Ignore)
        .await?;
    Params::parse(parts.uri.query(), "/status", &[]).map_err(bad_request)?;
    Ok(status_json(StatusCode::OK, &s.drain))
}

pub(super) async fn drain(State(s): State<Arc<AdminState>>, req: Request) -> HandlerOutcome {
    let parts = s
        .admit(req, "/drain", DRAIN_METHODS, "GET, POST", BodyUse::Read)
        .await?;
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
    // On `AdminBuilder::serve`, a waiter holds its connection for the whole drain: only a
    // share of the connections may wait, so that kubelet's probes keep theirs.
    let _seat = match parts.extensions.get::<Arc<super::serve::WaitSeats>>() {
        Some(seats) if s.drain.phase() < target => match seats.take() {
            Some(seat) => Some(seat),
            None => return Ok(no_wait_seat(seats, &s.drain, wait.as_str(), &parts)),
        },
        _ => None,
    };
    s.seam.say_weak_wait(wait.as_str());
    // An answer is owed from now on: `Drain::run` does not return before the response body
    // holding this token is handed to the server (or the caller went away).
    let owed = s.seam.exit_holds().token();
    let reached = s.drain.moments().reached(target);
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
pub(super) async fn prometheus_metrics(
    State(s): State<Arc<AdminState>>,
    req: Request,
) -> HandlerOutcome {
    let parts = s
        .admit(req, "/metrics", PROBE_METHODS, "GET, HEAD", BodyUse::Ignore)
        .await?;
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
    crate::Metrics::new(&s.drain).record();
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

pub(super) async fn not_found(req: Request) -> Response {
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

/// How long a `/drain` caller turned away for want of a wait seat is asked to wait.
const NO_SEAT_RETRY_AFTER_SECS: u64 = 2;

/// The answer to a `/drain?wait=…` caller beyond the waiters' share of the admin connections:
/// the drain has started (the caller's trigger counts), but its wait is not kept.
fn no_wait_seat(
    seats: &super::serve::WaitSeats,
    drain: &Drain,
    wait: &str,
    parts: &Parts,
) -> Response {
    tracing::warn!(
        max_waiters = seats.max(),
        "lameduck: /drain caller not kept waiting: every wait seat of the admin port is taken"
    );
    let mut res = text(
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "the drain is started (phase {}), but {} /drain callers already wait for it, the most \
             the admin port keeps (of its {} connections, the rest answer kubelet's probes); \
             not waiting for `{wait}`: retry later, poll /status, or call /drain?wait=none\n",
            drain.phase(),
            seats.max(),
            seats.connections()
        ),
    );
    let h = res.headers_mut();
    h.insert(
        header::RETRY_AFTER,
        HeaderValue::from(NO_SEAT_RETRY_AFTER_SECS),
    );
    // The slot goes back to the probes at once (HTTP/2 has no such header: its stream ends).
    if parts.version < http::Version::HTTP_2 {
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    res
}

fn bad_request(msg: impl Into<String>) -> AdminRefusal {
    // Messages quote decoded client input, which may hold line breaks: keep the answer one line.
    let msg: String = msg
        .into()
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    AdminRefusal::BadRequest(msg)
}

fn unauthorized(msg: impl Into<String>) -> AdminRefusal {
    AdminRefusal::Unauthorized(msg.into())
}

#[cfg(test)]
mod tests;
