//! The test application behind the drain layer, its streaming bodies, and `lameduck::serve`
//! started on 127.0.0.1.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body::{Body, Frame};
use lameduck::{Drain, EventKind};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::{bind, eventually, h1, has_event, send1, text, within};
use lameduck::StreamStop;

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
                in_flight: drain.counts().in_flight(),
                in_flight_zero_recorded: has_event(&drain, EventKind::InFlightZero),
            });
        });
        with_conn(conn_id(&req), AxBody::new(body).into_response())
    }
    async fn forever(req: AxRequest) -> axum::response::Response {
        with_conn(conn_id(&req), AxBody::new(endless()).into_response())
    }
    async fn events(State(st): State<AppState>, req: AxRequest) -> axum::response::Response {
        let body = StreamStop::new(&st.drain).wrap(endless());
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

/// Waits for the drain, which must end clean, then for `serve` to return; the report is for
/// the caller's own checks.
pub async fn drained_clean(drain: &Drain, server: JoinHandle<()>) -> lameduck::DrainReport {
    let report = within("drain done", drain.drained()).await;
    assert_eq!(report.outcome, lameduck::report::Outcome::Clean);
    within("serve returns", server).await.unwrap();
    report
}

/// `GET /slow/{ms}` on a new HTTP/1.1 connection, returned once it is in flight (the only
/// request in flight); the task resolves to its answer.
pub async fn slow_request(
    drain: &Drain,
    addr: SocketAddr,
    ms: u64,
) -> JoinHandle<(StatusCode, http::HeaderMap, String)> {
    let (mut sender, _conn) = h1(addr).await;
    let path = format!("/slow/{ms}");
    let slow = tokio::spawn(async move { text(send1(&mut sender, &path).await).await });
    eventually("slow request in flight", || drain.counts().in_flight() == 1).await;
    slow
}
