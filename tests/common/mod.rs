//! Helpers shared by the HTTP integration tests: a drain with a short budget, hyper clients on
//! 127.0.0.1, and a channel-fed streaming body.
// Each test binary uses a different subset, and `pub` here only crosses the test's modules.
#![allow(dead_code, unreachable_pub)]

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use lameduck::{Drain, EventKind, Phase, Propagation, Signals};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Upper bound for anything a test waits for; generous, never a timing assertion.
pub const PATIENCE: Duration = Duration::from_secs(15);

pub fn drain(grace: Duration, propagation: Propagation) -> Drain {
    Drain::builder()
        .grace_period(grace)
        .propagation(propagation)
        .signals(Signals::none())
        .report_to_stderr(false)
        .termination_log(None)
        .build()
        .expect("valid test budget")
}

pub async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(PATIENCE, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

/// Polls `cond` every 10 ms, at most for [`PATIENCE`].
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    within(what, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

pub async fn bind() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (listener, addr)
}

pub fn has_event(drain: &Drain, kind: EventKind) -> bool {
    drain.timeline().iter().any(|e| e.event == kind)
}

pub fn is_phase(drain: &Drain, phase: Phase) -> bool {
    drain.phase() == phase
}

pub type H1 = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;
pub type H2 = hyper::client::conn::http2::SendRequest<Empty<Bytes>>;

/// A raw HTTP/1.1 client connection; the handle resolves when the connection closes.
pub async fn h1(addr: SocketAddr) -> (H1, JoinHandle<hyper::Result<()>>) {
    let io = TokioIo::new(TcpStream::connect(addr).await.unwrap());
    let (sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
    (sender, tokio::spawn(conn))
}

/// A raw HTTP/2 (prior knowledge) client connection.
pub async fn h2(addr: SocketAddr) -> (H2, JoinHandle<hyper::Result<()>>) {
    let io = TokioIo::new(TcpStream::connect(addr).await.unwrap());
    let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
        .await
        .unwrap();
    (sender, tokio::spawn(conn))
}

pub fn get(path: &str) -> Request<Empty<Bytes>> {
    Request::builder()
        .uri(path)
        .header("host", "test")
        .body(Empty::new())
        .unwrap()
}

pub async fn send1(sender: &mut H1, path: &str) -> Response<Incoming> {
    sender.ready().await.expect("connection ready");
    sender.send_request(get(path)).await.expect("response")
}

pub async fn send2(sender: &mut H2, path: &str) -> hyper::Result<Response<Incoming>> {
    sender.ready().await?;
    let req = Request::builder()
        .uri(format!("http://test{path}"))
        .version(http::Version::HTTP_2)
        .body(Empty::new())
        .unwrap();
    sender.send_request(req).await
}

pub async fn text(res: Response<Incoming>) -> (StatusCode, http::HeaderMap, String) {
    let (parts, body) = res.into_parts();
    let bytes = body.collect().await.expect("full body").to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8(bytes.to_vec()).unwrap(),
    )
}

pub fn connection_close(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONNECTION)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"))
}

/// A response body fed by a channel: it ends when the sender is dropped.
pub struct ChannelBody(pub mpsc::Receiver<Bytes>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|c| c.map(|b| Ok(Frame::data(b))))
    }
}

/// A body producing `count` chunks, one every `every`; `before_last` runs just before the last
/// one is handed over. Each send waits for the previous chunk to be taken (capacity 1).
pub fn chunks(
    count: usize,
    every: Duration,
    before_last: impl FnOnce() + Send + 'static,
) -> ChannelBody {
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(async move {
        let mut before_last = Some(before_last);
        for i in 0..count {
            tokio::time::sleep(every).await;
            if i + 1 == count {
                if let Some(f) = before_last.take() {
                    f();
                }
            }
            if tx.send(Bytes::from(format!("chunk {i}\n"))).await.is_err() {
                return;
            }
        }
    });
    ChannelBody(rx)
}

/// A body that never ends on its own (bounded only so a leaked task cannot spin forever):
/// a chunk every 100 ms until the receiver is gone.
pub fn endless() -> ChannelBody {
    chunks(10_000, Duration::from_millis(100), || {})
}

/// The id of the connection the request came on, from `ConnMeta` (lameduck::serve) or
/// `ConnectInfo<ConnMeta>` (axum::serve).
pub fn conn_id<B>(req: &Request<B>) -> u64 {
    if let Some(m) = req.extensions().get::<lameduck::ConnMeta>() {
        return m.id();
    }
    req.extensions()
        .get::<axum::extract::ConnectInfo<lameduck::ConnMeta>>()
        .map(|c| c.0.id())
        .expect("ConnMeta attached")
}

/// Parses the `conn` header the test apps set.
pub fn conn_header(headers: &http::HeaderMap) -> u64 {
    headers
        .get("conn")
        .expect("conn header")
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// What the streaming route saw just before handing over its last chunk.
#[derive(Clone, Default)]
pub struct Probe(pub std::sync::Arc<std::sync::Mutex<Option<LastChunk>>>);

#[derive(Clone, Copy, Debug)]
pub struct LastChunk {
    pub in_flight: usize,
    pub in_flight_zero_recorded: bool,
}

impl Probe {
    pub fn get(&self) -> Option<LastChunk> {
        *self.0.lock().unwrap()
    }
}

#[derive(Clone)]
pub struct AppState {
    pub drain: Drain,
    pub probe: Probe,
}

fn with_conn(id: u64, mut res: axum::response::Response) -> axum::response::Response {
    res.headers_mut().insert("conn", id.into());
    res
}

/// The test application (without the drain layer; tests add it with their options):
/// * `/conn`: answers at once;
/// * `/slow/{ms}`: answers after `ms` milliseconds;
/// * `/stream/{count}/{ms}`: `count` chunks, one every `ms` milliseconds, recording in the
///   probe what it saw before the last one;
/// * `/forever`: a chunk every 100 ms, never ending on its own;
/// * `/events`: like `/forever`, ended cleanly at `stopped_accepting` by `stream_stop`.
pub fn app(drain: &Drain, probe: Probe) -> axum::Router {
    use axum::body::Body as AxBody;
    use axum::extract::{Path, Request as AxRequest, State};
    use axum::routing::get as route;

    async fn conn(req: AxRequest) -> axum::response::Response {
        with_conn(conn_id(&req), AxBody::from("ok").into_response())
    }
    async fn slow(Path(ms): Path<u64>, req: AxRequest) -> axum::response::Response {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        with_conn(conn_id(&req), AxBody::from("slow done").into_response())
    }
    async fn stream(
        State(st): State<AppState>,
        Path((count, ms)): Path<(usize, u64)>,
        req: AxRequest,
    ) -> axum::response::Response {
        let AppState { drain, probe } = st;
        let body = chunks(count, Duration::from_millis(ms), move || {
            *probe.0.lock().unwrap() = Some(LastChunk {
                in_flight: drain.in_flight(),
                in_flight_zero_recorded: has_event(&drain, EventKind::InFlightZero),
            });
        });
        with_conn(conn_id(&req), AxBody::new(body).into_response())
    }
    async fn forever(req: AxRequest) -> axum::response::Response {
        with_conn(conn_id(&req), AxBody::new(endless()).into_response())
    }
    async fn events(State(st): State<AppState>, req: AxRequest) -> axum::response::Response {
        let body = st.drain.stream_stop().wrap(endless());
        with_conn(conn_id(&req), AxBody::new(body).into_response())
    }
    use axum::response::IntoResponse;

    axum::Router::new()
        .route("/conn", route(conn))
        .route("/slow/{ms}", route(slow))
        .route("/stream/{count}/{ms}", route(stream))
        .route("/forever", route(forever))
        .route("/events", route(events))
        .with_state(AppState {
            drain: drain.clone(),
            probe,
        })
}

/// Binds 127.0.0.1:0 and runs `lameduck::serve` with the app behind the default layer.
pub async fn start_serve(drain: &Drain, probe: Probe) -> (SocketAddr, JoinHandle<()>) {
    let (listener, addr) = bind().await;
    let app = app(drain, probe).layer(drain.layer());
    // The test app reports each request's connection id, from `ConnMeta`.
    let server = tokio::spawn(lameduck::serve(listener, app, drain).conn_meta_on_every_request());
    (addr, server)
}

/// [`start_serve`] with `describe_requests` on: requests that started before the trigger can be
/// named as stragglers.
pub async fn start_serve_describing(drain: &Drain, probe: Probe) -> (SocketAddr, JoinHandle<()>) {
    let (listener, addr) = bind().await;
    let app = app(drain, probe).layer(drain.layer().describe_requests());
    // The test app reports each request's connection id, from `ConnMeta`.
    let server = tokio::spawn(lameduck::serve(listener, app, drain).conn_meta_on_every_request());
    (addr, server)
}

/// Reads the next data frame of a response body.
pub async fn next_chunk(body: &mut Incoming) -> Option<Bytes> {
    loop {
        match body.frame().await? {
            Ok(f) => {
                if let Ok(d) = f.into_data() {
                    return Some(d);
                }
            }
            Err(_) => return None,
        }
    }
}
