//! The admin router over real HTTP on 127.0.0.1: probes, `/drain`, `/status`, the token, bad
//! input, and the `preStop` client helper.
#![cfg(feature = "admin")]

#[path = "support/rng.rs"]
mod rng;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use lameduck::admin::{prestop, prestop_blocking, PrestopOptions, Wait};
use lameduck::{
    Drain, DrainBuilder, EventKind, Phase, Propagation, ReadinessWhileDraining, Signals, Status,
    Trigger,
};
use rng::Rng;
use tokio::net::{TcpListener, TcpStream};

/// Upper bound for any single exchange; generous, never a timing assertion.
const BOUND: Duration = Duration::from_secs(20);
const TOKEN: &str = "s3cr3t-t0ken";

type ReqBody = BoxBody<Bytes, Infallible>;

fn builder() -> DrainBuilder {
    Drain::builder()
        .grace_period(Duration::from_secs(20))
        .propagation(Propagation::fixed(Duration::from_millis(100)))
        .signals(Signals::none())
        .report_to_stderr(false)
        .termination_log(None)
}

fn serving() -> Drain {
    let drain = builder().build().unwrap();
    drain.mark_started();
    assert_eq!(drain.phase(), Phase::Serving);
    drain
}

async fn serve(router: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    addr
}

/// Serves `drain`'s admin router with the test token.
async fn serve_with_token(drain: &Drain) -> SocketAddr {
    serve(drain.admin().token(TOKEN).router()).await
}

/// Serves `drain`'s admin router with no token.
async fn serve_open(drain: &Drain) -> SocketAddr {
    serve(drain.admin().without_token().router()).await
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Answer {
    fn json(&self) -> Status {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not the status JSON ({e}): {}", self.body))
    }
}

/// One request on a fresh HTTP/1.1 connection (so a refused body can never spoil a pooled
/// connection for the next request).
async fn send(addr: SocketAddr, req: Request<ReqBody>) -> Answer {
    tokio::time::timeout(BOUND, async {
        let stream = TcpStream::connect(addr).await.unwrap();
        let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let res = tx.send_request(req).await.unwrap();
        let (parts, body) = res.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8(body.to_vec()).unwrap(),
        }
    })
    .await
    .expect("admin answered within the bound")
}

fn request(method: Method, addr: SocketAddr, target: &str) -> http::request::Builder {
    Request::builder()
        .method(method)
        .uri(format!("http://{addr}{target}"))
        .header(http::header::HOST, addr.to_string())
}

fn empty() -> ReqBody {
    Empty::new().boxed()
}

async fn get(addr: SocketAddr, target: &str) -> Answer {
    send(
        addr,
        request(Method::GET, addr, target).body(empty()).unwrap(),
    )
    .await
}

async fn drain_call(addr: SocketAddr, target: &str) -> Answer {
    let req = request(Method::GET, addr, target)
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(empty())
        .unwrap();
    send(addr, req).await
}

fn count(drain: &Drain, kind: EventKind) -> usize {
    drain.timeline().iter().filter(|e| e.event == kind).count()
}

/// A body of `n` bytes sent in 100-byte frames with no declared length (chunked on the wire).
struct Chunked(usize);

impl Body for Chunked {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.0 == 0 {
            return Poll::Ready(None);
        }
        let n = self.0.min(100);
        self.0 -= n;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![b'x'; n])))))
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[tokio::test]
async fn livez_answers_ok_through_the_whole_lifecycle() {
    let drain = builder().build().unwrap();
    let gate = drain.startup_gate("cache-warmup");
    let addr = serve_open(&drain).await;

    let mut seen = Vec::new();
    let check = |a: Answer| {
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.body, "ok");
    };
    check(get(addr, "/livez").await);
    seen.push(drain.phase());
    gate.open();
    check(get(addr, "/livez").await);
    seen.push(drain.phase());

    let guard = drain.enter();
    drain.start(Trigger::Api);
    check(get(addr, "/livez").await);
    drain.reached(Phase::StoppedAccepting).await;
    check(get(addr, "/livez").await);
    seen.push(drain.phase());
    drop(guard);
    drain.drained().await;
    check(get(addr, "/livez").await);
    seen.push(drain.phase());
    assert_eq!(
        seen,
        [
            Phase::Starting,
            Phase::Serving,
            Phase::StoppedAccepting,
            Phase::Done
        ]
    );

    let head = send(
        addr,
        request(Method::HEAD, addr, "/livez").body(empty()).unwrap(),
    )
    .await;
    assert_eq!(head.status, StatusCode::OK);
    assert_eq!(head.body, "");
    let verbose = get(addr, "/livez?verbose").await;
    assert_eq!(verbose.status, StatusCode::OK);
    assert_eq!(verbose.body, "[+]ping ok\nlivez check passed\n");
    assert_eq!(verbose.headers["cache-control"], "no-store");
}

#[tokio::test]
async fn readyz_follows_starting_serving_draining() {
    let drain = builder().build().unwrap();
    let gate = drain.startup_gate("cache-warmup");
    let addr = serve_open(&drain).await;

    let a = get(addr, "/readyz").await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(a.body, "starting: waiting for cache-warmup");
    let a = get(addr, "/readyz?verbose").await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        a.body.contains("[-]gate cache-warmup waiting\n"),
        "{}",
        a.body
    );
    assert!(
        a.body
            .ends_with("readyz check failed: starting: waiting for cache-warmup\n"),
        "{}",
        a.body
    );

    gate.open();
    let a = get(addr, "/readyz").await;
    assert_eq!((a.status, a.body.as_str()), (StatusCode::OK, "ok"));
    let a = get(addr, "/readyz?verbose=1").await;
    assert_eq!(a.status, StatusCode::OK);
    let lines: Vec<&str> = a.body.lines().collect();
    assert_eq!(
        lines,
        [
            "[+]gate cache-warmup ok",
            "[+]drain ok",
            "readyz check passed"
        ]
    );
    let head = send(
        addr,
        request(Method::HEAD, addr, "/readyz")
            .body(empty())
            .unwrap(),
    )
    .await;
    assert_eq!(head.status, StatusCode::OK);

    let guard = drain.enter();
    drain.start(Trigger::Api);
    let a = get(addr, "/readyz").await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(a.body, "draining");
    let a = get(addr, "/readyz?verbose").await;
    assert!(a.body.contains("[-]drain "), "{}", a.body);
    assert!(
        a.body.ends_with("readyz check failed: draining\n"),
        "{}",
        a.body
    );
    drop(guard);
    drain.drained().await;
    assert_eq!(
        get(addr, "/readyz").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
}

#[tokio::test]
async fn readyz_stays_ready_until_stop_under_serving_until_stop() {
    let drain = builder()
        .propagation(Propagation::fixed(Duration::from_secs(2)))
        .readiness_while_draining(ReadinessWhileDraining::ServingUntilStop)
        .build()
        .unwrap();
    drain.mark_started();
    let addr = serve_open(&drain).await;
    let guard = drain.enter();
    drain.start(Trigger::Api);
    let a = get(addr, "/readyz").await;
    // Only meaningful if the answer came before the fixed propagation delay ran out.
    if drain.phase() == Phase::Draining {
        assert_eq!((a.status, a.body.as_str()), (StatusCode::OK, "ok"));
    }
    drain.reached(Phase::StoppedAccepting).await;
    let a = get(addr, "/readyz").await;
    assert_eq!(
        (a.status, a.body.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "draining")
    );
    drop(guard);
    drain.drained().await;
}

#[tokio::test]
async fn readyz_reports_a_failing_check() {
    let drain = serving();
    drain.readiness_check("local-disk", || Err("full".to_owned()));
    let addr = serve_open(&drain).await;
    let a = get(addr, "/readyz").await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(a.body, "check local-disk failed: full");
    let a = get(addr, "/readyz?verbose").await;
    assert!(
        a.body.contains("[-]local-disk failed: full\n"),
        "{}",
        a.body
    );
}

#[tokio::test]
async fn status_reports_phase_counts_and_timeline() {
    let drain = serving();
    let addr = serve_open(&drain).await;
    let guard = drain.enter();
    let a = get(addr, "/status").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.headers["content-type"], "application/json");
    let s = a.json();
    assert_eq!(s.phase, Phase::Serving);
    assert!(s.ready);
    assert_eq!(s.in_flight, 1);
    assert_eq!(s.budget.grace_ms, 20_000);
    assert!(s.timeline.is_empty());
    let head = send(
        addr,
        request(Method::HEAD, addr, "/status")
            .body(empty())
            .unwrap(),
    )
    .await;
    assert_eq!((head.status, head.body.as_str()), (StatusCode::OK, ""));

    drain.start(Trigger::Api);
    drain.reached(Phase::StoppedAccepting).await;
    let s = get(addr, "/status").await.json();
    assert_eq!(s.phase, Phase::StoppedAccepting);
    assert_eq!(s.trigger, Some(Trigger::Api));
    assert!(!s.ready);
    let events: Vec<EventKind> = s.timeline.iter().map(|e| e.event).collect();
    assert!(events.starts_with(&[EventKind::DrainStarted]), "{events:?}");
    assert!(events.contains(&EventKind::StoppedAccepting), "{events:?}");
    drop(guard);
    drain.drained().await;
}

#[tokio::test]
async fn drain_wait_none_answers_202_at_once() {
    let drain = serving();
    let addr = serve_with_token(&drain).await;
    let guard = drain.enter();
    let a = drain_call(addr, "/drain?wait=none").await;
    assert_eq!(a.status, StatusCode::ACCEPTED);
    assert_eq!(a.headers["content-type"], "application/json");
    let s = a.json();
    assert!(s.phase.is_draining());
    assert_eq!(s.trigger, Some(Trigger::PreStop));
    // A guard is held, so the drain cannot be past StoppedAccepting yet.
    assert!(s.phase <= Phase::StoppedAccepting, "{:?}", s.phase);
    assert_eq!(drain.timeline()[0].trigger, Some(Trigger::PreStop));
    drop(guard);
    assert_eq!(drain.drained().await.exit_code, 0);
}

#[tokio::test]
async fn drain_wait_propagated_answers_after_stopped_accepting() {
    let drain = serving();
    let addr = serve_with_token(&drain).await;
    let guard = drain.enter();
    let a = drain_call(addr, "/drain?wait=propagated").await;
    assert_eq!(a.status, StatusCode::OK);
    let s = a.json();
    assert_eq!(s.phase, Phase::StoppedAccepting);
    assert!(s
        .timeline
        .iter()
        .any(|e| e.event == EventKind::StoppedAccepting));
    drop(guard);
    drain.drained().await;
}

#[tokio::test]
async fn drain_waits_for_the_whole_drain_by_default() {
    let drain = serving();
    let addr = serve_with_token(&drain).await;
    let guard = drain.enter();
    let pending = tokio::spawn(drain_call(addr, "/drain"));
    drain.reached(Phase::StoppedAccepting).await;
    // The guard is still held: the default wait (drained) cannot have answered.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!pending.is_finished());
    drop(guard);
    let a = tokio::time::timeout(BOUND, pending).await.unwrap().unwrap();
    assert_eq!(a.status, StatusCode::OK);
    let s = a.json();
    assert_eq!(s.phase, Phase::Done);
    assert!(s.timeline.iter().any(|e| e.event == EventKind::Done));
    assert_eq!(drain.report().unwrap().exit_code, 0);

    // Once done, wait=drained answers at once.
    let a = drain_call(addr, "/drain?wait=drained").await;
    assert_eq!((a.status, a.json().phase), (StatusCode::OK, Phase::Done));
}

#[tokio::test]
async fn drain_timeout_answers_504_and_the_drain_goes_on() {
    let drain = serving();
    let addr = serve_with_token(&drain).await;
    let guard = drain.enter();
    let a = drain_call(addr, "/drain?wait=drained&timeout=200ms").await;
    assert_eq!(a.status, StatusCode::GATEWAY_TIMEOUT);
    let s = a.json();
    assert!(
        s.phase.is_draining() && s.phase < Phase::Done,
        "{:?}",
        s.phase
    );
    assert_eq!(s.in_flight, 1);

    // The drain went on without the caller.
    assert_eq!(
        get(addr, "/readyz").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(get(addr, "/livez").await.status, StatusCode::OK);
    drop(guard);
    let report = tokio::time::timeout(BOUND, drain.drained()).await.unwrap();
    assert_eq!(report.exit_code, 0);
    assert_eq!(count(&drain, EventKind::DrainStarted), 1);
}

#[tokio::test]
async fn drain_is_idempotent_under_50_concurrent_calls() {
    let drain = serving();
    let addr = serve_with_token(&drain).await;
    let calls: Vec<_> = (0..50)
        .map(|i| {
            let target = if i % 2 == 0 {
                "/drain?wait=none"
            } else {
                "/drain"
            };
            tokio::spawn(drain_call(addr, target))
        })
        .collect();
    for (i, call) in calls.into_iter().enumerate() {
        let a = call.await.unwrap();
        let want = if i % 2 == 0 {
            StatusCode::ACCEPTED
        } else {
            StatusCode::OK
        };
        assert_eq!(a.status, want, "{}", a.body);
    }
    drain.drained().await;
    assert_eq!(count(&drain, EventKind::DrainStarted), 1);
    let repeats: Vec<_> = drain
        .timeline()
        .into_iter()
        .filter(|e| e.event == EventKind::SignalReceived)
        .collect();
    // The 49 repeats collapse into one event with a count.
    assert_eq!(repeats.len(), 1);
    assert_eq!(repeats[0].count, Some(49));
    assert!(repeats.iter().all(|e| e.trigger == Some(Trigger::PreStop)));
    assert_eq!(drain.report().unwrap().trigger, Some(Trigger::PreStop));
}

#[tokio::test]
async fn drain_accepts_post_and_ignores_a_small_body() {
    let drain = serving();
    let addr = serve_with_token(&drain).await;
    let req = request(Method::POST, addr, "/drain?wait=none&timeout=5s")
        .header("authorization", format!("bearer {TOKEN}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{}")).boxed())
        .unwrap();
    let a = send(addr, req).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
    drain.drained().await;
}

#[tokio::test]
async fn token_is_required_accepted_and_rejected() {
    let drain = serving();
    let addr = serve_with_token(&drain).await;
    let right = format!("Bearer {TOKEN}");
    let refused: Vec<Vec<String>> = vec![
        vec![],
        vec!["Bearer wrong-token".into()],
        vec![format!("Bearer {TOKEN}x")],
        vec![format!("Basic {TOKEN}")],
        vec!["Bearer".into()],
        vec![TOKEN.into()],
        vec![right.clone(), right.clone()],
    ];
    for headers in refused {
        let mut req = request(Method::GET, addr, "/drain?wait=none");
        for v in &headers {
            req = req.header("authorization", v);
        }
        let a = send(addr, req.body(empty()).unwrap()).await;
        assert_eq!(
            a.status,
            StatusCode::UNAUTHORIZED,
            "{headers:?}: {}",
            a.body
        );
        assert_eq!(
            a.headers["www-authenticate"],
            "Bearer realm=\"lameduck-admin\""
        );
        assert_eq!(drain.phase(), Phase::Serving, "{headers:?}");
        assert!(drain.timeline().is_empty());
    }
    // Probes and status need no token.
    assert_eq!(get(addr, "/livez").await.status, StatusCode::OK);
    assert_eq!(get(addr, "/readyz").await.status, StatusCode::OK);
    assert_eq!(get(addr, "/status").await.status, StatusCode::OK);

    let a = drain_call(addr, "/drain?wait=none").await;
    assert_eq!(a.status, StatusCode::ACCEPTED);
    drain.drained().await;
}

#[tokio::test]
async fn unusable_token_fails_closed() {
    let drain = serving();
    let addr = serve(drain.admin().token("  ").router()).await;
    let a = get(addr, "/drain?wait=none").await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert!(a.body.contains("unusable"), "{}", a.body);
    assert_eq!(drain.phase(), Phase::Serving);
}

#[tokio::test]
async fn token_defaults_to_the_environment() {
    // The only test that touches this variable; every other router sets its token explicitly.
    std::env::set_var(lameduck::admin::ADMIN_TOKEN_ENV, format!("  {TOKEN}\n"));
    let drain = serving();
    let addr = serve(drain.admin_router()).await;
    let options = PrestopOptions::from_env();
    std::env::remove_var(lameduck::admin::ADMIN_TOKEN_ENV);
    assert_eq!(options.token.as_deref(), Some(TOKEN));

    assert_eq!(get(addr, "/drain").await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(drain.phase(), Phase::Serving);
    let status = prestop(addr, options).await.unwrap();
    assert_eq!(status.phase, Phase::Done);
}

#[tokio::test]
async fn bad_input_is_refused_and_changes_nothing() {
    let drain = serving();
    let addr = serve_with_token(&drain).await;
    let auth = format!("Bearer {TOKEN}");
    let big = || Full::new(Bytes::from(vec![b'x'; 2048])).boxed();
    // (method, target, authorized, body, expected status, text the answer must contain)
    type Case = (
        Method,
        &'static str,
        bool,
        fn() -> ReqBody,
        u16,
        &'static str,
    );
    let none: fn() -> ReqBody = empty;
    // A table reads best one case per line.
    #[rustfmt::skip]
    let cases: Vec<Case> = vec![
        (Method::GET, "/", true, none, 404, "/livez"),
        (Method::GET, "/nope", true, none, 404, "/nope"),
        (Method::GET, "/livez/", true, none, 404, ""),
        (Method::GET, "/DRAIN", true, none, 404, ""),
        (Method::GET, "/drain/now", true, none, 404, ""),
        (Method::PUT, "/drain", true, none, 405, "GET, POST"),
        (Method::HEAD, "/drain", true, none, 405, ""),
        (Method::DELETE, "/drain", true, none, 405, "GET, POST"),
        (Method::DELETE, "/livez", false, none, 405, "GET, HEAD"),
        (Method::POST, "/readyz", false, none, 405, "GET, HEAD"),
        (Method::OPTIONS, "/status", false, none, 405, "GET, HEAD"),
        (Method::GET, "/drain?wait=none", false, none, 401, "missing bearer token"),
        (Method::GET, "/drain?foo=1", true, none, 400, "`foo`"),
        (Method::GET, "/drain?Wait=none", true, none, 400, "`Wait`"),
        (Method::GET, "/drain?wait=soon", true, none, 400, "`wait`"),
        (Method::GET, "/drain?wait=", true, none, 400, "`wait`"),
        (Method::GET, "/drain?wait", true, none, 400, "`wait`"),
        (Method::GET, "/drain?wait=Drained", true, none, 400, "`wait`"),
        (Method::GET, "/drain?timeout=", true, none, 400, "`timeout`"),
        (Method::GET, "/drain?timeout=soon", true, none, 400, "`timeout`"),
        (Method::GET, "/drain?timeout=-1s", true, none, 400, "`timeout`"),
        (Method::GET, "/drain?timeout=5parsecs", true, none, 400, "`timeout`"),
        (Method::GET, "/drain?timeout=99999999999999999999999999999999999999s", true, none, 400, "`timeout`"),
        (Method::GET, "/drain?wait=none&wait=none", true, none, 400, "duplicate"),
        (Method::GET, "/drain?wait=none&wait=drained", true, none, 400, "duplicate"),
        (Method::GET, "/drain?wait=none&timeout=1s&timeout=2s", true, none, 400, "duplicate"),
        (Method::GET, "/drain?=none", true, none, 400, "empty parameter name"),
        (Method::GET, "/drain?wait=%zz", true, none, 400, "`wait`"),
        (Method::GET, "/drain?wait=none%0D%0AX:1", true, none, 400, "`wait`"),
        (Method::GET, "/readyz?verbose=maybe", false, none, 400, "`verbose`"),
        (Method::GET, "/readyz?x", false, none, 400, "`x`"),
        (Method::GET, "/livez?verbose&verbose", false, none, 400, "duplicate"),
        (Method::GET, "/status?pretty", false, none, 400, "takes no parameters"),
        (Method::POST, "/drain?wait=none", true, big, 413, "1024 bytes"),
        (Method::GET, "/livez", false, big, 413, "1024 bytes"),
        (Method::POST, "/drain?wait=none", true, || Chunked(4096).boxed(), 413, "1024 bytes"),
        (Method::POST, "/drain?wait=none", false, big, 413, ""),
    ];
    for (method, target, authorized, body, want, needle) in cases {
        let mut req = request(method.clone(), addr, target);
        if authorized {
            req = req.header("authorization", &auth);
        }
        let a = send(addr, req.body(body()).unwrap()).await;
        assert_eq!(a.status.as_u16(), want, "{method} {target}: {}", a.body);
        assert!(a.body.contains(needle), "{method} {target}: {:?}", a.body);
        assert!(!a.body.trim_end().contains('\n'), "one line: {:?}", a.body);
        if want == 405 {
            assert!(a.headers.contains_key("allow"), "{method} {target}");
        }
        assert_eq!(drain.phase(), Phase::Serving, "{method} {target}");
        assert!(drain.timeline().is_empty(), "{method} {target}");
        let r = get(addr, "/readyz").await;
        assert_eq!(r.status, StatusCode::OK, "{method} {target}");
    }
    // Empty segments are ignored, so this one is valid — and it is the only drain.
    let a = drain_call(addr, "/drain?wait=none&&").await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
    drain.drained().await;
    assert_eq!(count(&drain, EventKind::DrainStarted), 1);
}

#[tokio::test]
async fn admin_answers_over_http2() {
    let drain = serving();
    let addr = serve_with_token(&drain).await;
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut tx, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut call = |target: &str, auth: bool| {
        let mut req = Request::builder()
            .uri(format!("http://{addr}{target}"))
            .version(http::Version::HTTP_2);
        if auth {
            req = req.header("authorization", format!("Bearer {TOKEN}"));
        }
        let fut = tx.send_request(req.body(empty()).unwrap());
        async move {
            let res = tokio::time::timeout(BOUND, fut).await.unwrap().unwrap();
            let status = res.status();
            let body = res.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8(body.to_vec()).unwrap())
        }
    };
    assert_eq!(
        call("/livez", false).await,
        (StatusCode::OK, "ok".to_owned())
    );
    assert_eq!(call("/drain", false).await.0, StatusCode::UNAUTHORIZED);
    let (status, body) = call("/drain?wait=drained&timeout=15s", true).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let s: Status = serde_json::from_str(&body).unwrap();
    assert_eq!(s.phase, Phase::Done);
    assert_eq!(
        call("/readyz", false).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
}

#[tokio::test]
async fn prestop_helper_drains_a_live_admin_port() {
    let drain = serving();
    let addr = serve_with_token(&drain).await;
    let options = PrestopOptions {
        token: Some(TOKEN.into()),
        wait: Wait::Drained,
        timeout: Some(Duration::from_secs(15)),
    };
    // The address the app binds (0.0.0.0) works as well: it means the loopback address.
    let unspecified = SocketAddr::from(([0, 0, 0, 0], addr.port()));
    let status = prestop(unspecified, options).await.unwrap();
    assert_eq!(status.phase, Phase::Done);
    assert_eq!(status.trigger, Some(Trigger::PreStop));
    assert_eq!(drain.report().unwrap().exit_code, 0);
}

#[tokio::test]
async fn prestop_helper_reports_each_failure() {
    // A closed port: bind, learn the port, close.
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    };
    let err = prestop(closed, PrestopOptions::default())
        .await
        .unwrap_err();
    assert!(err.is_connect(), "{err}");
    assert!(err.to_string().contains("cannot connect"), "{err}");

    let drain = serving();
    let addr = serve_with_token(&drain).await;
    let err = prestop(addr, PrestopOptions::default()).await.unwrap_err();
    assert_eq!(err.status(), Some(401), "{err}");
    assert!(err.to_string().contains("LAMEDUCK_ADMIN_TOKEN"), "{err}");
    let wrong = PrestopOptions {
        token: Some("nope".into()),
        ..PrestopOptions::default()
    };
    assert_eq!(prestop(addr, wrong).await.unwrap_err().status(), Some(401));
    assert_eq!(drain.phase(), Phase::Serving);

    let guard = drain.enter();
    let timed = PrestopOptions {
        token: Some(TOKEN.into()),
        wait: Wait::Drained,
        timeout: Some(Duration::from_millis(200)),
    };
    let err = prestop(addr, timed).await.unwrap_err();
    assert!(err.is_status() && err.status() == Some(504), "{err}");
    assert!(err.to_string().contains("it goes on"), "{err}");

    let now = PrestopOptions {
        token: Some(TOKEN.into()),
        wait: Wait::None,
        timeout: None,
    };
    let status = prestop(addr, now).await.unwrap();
    assert!(status.phase.is_draining());
    drop(guard);
    drain.drained().await;

    // Not an HTTP server at all: the answer is refused as malformed, not trusted.
    let bogus = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let bogus_addr = bogus.local_addr().unwrap();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut s, _) = bogus.accept().await.unwrap();
        // Read the request first: closing with unread input would reset the connection.
        let mut buf = [0u8; 1024];
        let _ = s.read(&mut buf).await;
        let _ = s.write_all(b"SSH-2.0-nope\r\n\r\n").await;
        let _ = s.shutdown().await;
    });
    let err = prestop(bogus_addr, PrestopOptions::default())
        .await
        .unwrap_err();
    assert!(err.is_invalid_response(), "{err}");
}

#[tokio::test]
async fn prestop_helper_refuses_an_oversized_answer() {
    // An HTTP server that answers 200 with a body far past the helper's limit: refused as
    // malformed, without reading it all.
    let big = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = big.local_addr().unwrap();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut s, _) = big.accept().await.unwrap();
        let mut buf = [0u8; 1024];
        let _ = s.read(&mut buf).await;
        let len = 64 << 20;
        let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {len}\r\n\r\n");
        let _ = s.write_all(head.as_bytes()).await;
        let chunk = vec![b'x'; 1 << 16];
        for _ in 0..(len / chunk.len()) {
            if s.write_all(&chunk).await.is_err() {
                break; // the helper gave up and closed
            }
        }
    });
    let err = tokio::time::timeout(
        Duration::from_secs(15),
        prestop(addr, PrestopOptions::default()),
    )
    .await
    .expect("the helper gives up in time")
    .unwrap_err();
    assert!(err.is_invalid_response(), "{err}");
    assert!(err.to_string().contains("larger than"), "{err}");
}

#[test]
fn prestop_blocking_works_before_a_runtime_exists() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (drain, addr) = rt.block_on(async {
        let drain = serving();
        let addr = serve_with_token(&drain).await;
        (drain, addr)
    });
    let options = PrestopOptions {
        token: Some(TOKEN.into()),
        wait: Wait::Propagated,
        timeout: Some(Duration::from_secs(15)),
    };
    let status = std::thread::spawn(move || prestop_blocking(addr, options))
        .join()
        .unwrap()
        .unwrap();
    assert!(status.phase >= Phase::StoppedAccepting);
    rt.block_on(drain.drained());

    // Inside a runtime it refuses instead of panicking.
    let err = rt
        .block_on(async { prestop_blocking(addr, PrestopOptions::default()) })
        .unwrap_err();
    assert!(err.to_string().contains("inside a Tokio runtime"), "{err}");
}

#[tokio::test]
async fn random_requests_never_fail_the_server_nor_change_state() {
    let seed = std::env::var("LAMEDUCK_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x1a4e_d0c5_eed5_u64);
    let mut rng = Rng(seed | 1);
    let drain = serving();
    let addr = serve_with_token(&drain).await;

    let methods = [
        "GET", "GET", "GET", "POST", "POST", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE",
        "PURGE", "get", "BREW",
    ];
    let paths = [
        "/",
        "/livez",
        "/readyz",
        "/drain",
        "/drain",
        "/drain",
        "/status",
        "/livez/",
        "/drain/",
        "//drain",
        "/drain/x",
        "/DRAIN",
        "/%64rain",
        "/readyz/verbose",
        "/metrics",
        "/drain.json",
    ];
    let keys = [
        "wait",
        "wait",
        "timeout",
        "timeout",
        "verbose",
        "foo",
        "",
        "WAIT",
        "w%61it",
        "wait%00",
        "timeout%20",
    ];
    let values = [
        "none",
        "propagated",
        "drained",
        "",
        "1s",
        "0",
        "250ms",
        "soon",
        "%zz",
        "%",
        "-1",
        "99999999999999999999",
        "true",
        "1",
        "%E2%9C%93",
        "none%0Anone",
        "+",
    ];
    let auths = [
        "Bearer s3cr3t-t0ken",
        "bearer s3cr3t-t0ken",
        "Bearer wrong",
        "Basic czNjcjN0",
        "Bearer",
        "Bearer s3cr3t-t0ken extra",
        "s3cr3t-t0ken",
    ];

    let mut codes = std::collections::BTreeMap::<u16, usize>::new();
    let rounds = 1500;
    let mut sent = 0;
    for round in 0..rounds {
        let method = rng.pick(&methods);
        let path = if rng.chance(15) {
            format!("/{}", rng.word())
        } else {
            rng.pick(&paths).to_owned()
        };
        let mut query = Vec::new();
        for _ in 0..rng.below(4) {
            let key = if rng.chance(10) {
                rng.word()
            } else {
                rng.pick(&keys).to_owned()
            };
            let value = if rng.chance(10) {
                rng.word()
            } else {
                rng.pick(&values).to_owned()
            };
            query.push(match rng.below(4) {
                0 => key,
                _ => format!("{key}={value}"),
            });
        }
        let mut auth_headers = Vec::new();
        for _ in 0..rng.below(3) {
            auth_headers.push(rng.pick(&auths));
        }
        let body_len = match rng.below(10) {
            0 => 2048,
            1 => 16,
            _ => 0,
        };

        // A request that could pass every check would legitimately start the drain; give it a
        // parameter nobody knows, so it must be refused after auth and before the drain.
        let right = |a: &&str| a.eq_ignore_ascii_case("bearer s3cr3t-t0ken");
        let maybe_valid = matches!(method, "GET" | "POST")
            && path.to_ascii_lowercase().contains("rain")
            && auth_headers.len() == 1
            && auth_headers.iter().any(right)
            && body_len <= 1024;
        if maybe_valid {
            query.push("fuzz-unknown=1".to_owned());
        }
        let target = if query.is_empty() && rng.chance(50) {
            path.clone()
        } else {
            format!(
                "{path}?{}",
                query.join(if rng.chance(10) { "&&" } else { "&" })
            )
        };

        let mut req = request(
            Method::from_bytes(method.as_bytes()).unwrap(),
            addr,
            &target,
        );
        for a in &auth_headers {
            req = req.header("authorization", *a);
        }
        if rng.chance(20) {
            req = req.header("x-fuzz", rng.word());
        }
        if rng.chance(10) {
            req = req.header(
                "content-type",
                rng.pick(&["application/json", "text/plain", "x/y"]),
            );
        }
        let body = if body_len > 0 && rng.chance(50) {
            // Set explicitly: a client sends no body on a GET of unknown length otherwise.
            req = req.header("transfer-encoding", "chunked");
            Chunked(body_len).boxed()
        } else if body_len > 0 {
            Full::new(Bytes::from(vec![b'x'; body_len])).boxed()
        } else {
            empty()
        };
        let Ok(req) = req.body(body) else {
            continue; // not a valid URI: the client cannot even send it
        };
        let a = send(addr, req).await;
        sent += 1;
        let code = a.status.as_u16();
        *codes.entry(code).or_default() += 1;
        assert!(
            matches!(code, 200 | 400 | 401 | 404 | 405 | 413),
            "round {round} (seed {seed:#x}): {method} {target} {auth_headers:?} body {body_len} -> {code}: {}",
            a.body
        );
        if maybe_valid {
            assert_ne!(code, 200, "round {round}: {method} {target}");
        }
        assert_eq!(
            drain.phase(),
            Phase::Serving,
            "round {round}: {method} {target} {auth_headers:?} {body_len} -> {code}"
        );
        assert!(
            drain.timeline().is_empty(),
            "round {round}: {method} {target}"
        );
    }
    assert!(
        sent > rounds * 9 / 10,
        "only {sent} of {rounds} requests could be sent"
    );
    // The loop reached every kind of refusal, not just one.
    for code in [200, 400, 401, 404, 405, 413] {
        assert!(codes.contains_key(&code), "no {code} in {codes:?}");
    }
    assert_eq!(get(addr, "/readyz").await.status, StatusCode::OK);
}
