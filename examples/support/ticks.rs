//! A server-sent-events endpoint that ends cleanly at `stopped_accepting`, and a client that
//! reads it and resumes with `Last-Event-ID`. Shared by `examples/sse.rs` and `tests/sse.rs`.
//!
//! `GET /events?every_ms=N` sends `id: <n>` / `data: tick <n> on connection <c>` every `N` ms
//! (default 1000), starting after the `Last-Event-ID` the client sends, so a client that
//! reconnects — to this replica or another one — loses nothing and sees nothing twice.
// Each user needs a different part of it.
#![allow(dead_code)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Extension, Router};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use lameduck::StreamStop;
use lameduck::{ConnMeta, Drain};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio::time::{Interval, MissedTickBehavior};

/// What a client waits before reconnecting (the SSE `retry` field, sent with the first event).
pub(crate) const RETRY: Duration = Duration::from_millis(100);

#[derive(Clone)]
struct AppState {
    drain: Drain,
    /// Streams end spread over this window after `stopped_accepting`.
    window: Duration,
}

#[derive(serde::Deserialize)]
struct Params {
    every_ms: Option<u64>,
}

/// `/events`, behind the drain layer.
pub(crate) fn router(drain: &Drain, window: Duration) -> Router {
    Router::new()
        .route("/events", get(events))
        .with_state(AppState {
            drain: drain.clone(),
            window,
        })
        .layer(drain.layer())
}

async fn events(
    State(state): State<AppState>,
    Query(params): Query<Params>,
    meta: Option<Extension<ConnMeta>>,
    headers: HeaderMap,
) -> impl IntoResponse {
    let after = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    let every = Duration::from_millis(params.every_ms.unwrap_or(1000).clamp(1, 60_000));
    let mut interval = tokio::time::interval(every);
    interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let ticks = Ticks {
        next: after + 1,
        connection: meta.map_or(0, |Extension(m)| m.id()),
        interval,
        first: true,
    };
    // Ends the stream at stopped_accepting (plus this stream's share of the window): after load
    // balancers stopped sending here, so the client's reconnection lands on another replica.
    let stream = StreamStop::new(&state.drain)
        .spread(state.window)
        .wrap(ticks);
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// One event per interval tick, numbered on from the client's `Last-Event-ID`.
pub(crate) struct Ticks {
    next: u64,
    connection: u64,
    interval: Interval,
    first: bool,
}

impl futures_core::Stream for Ticks {
    type Item = Result<Event, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        std::task::ready!(self.interval.poll_tick(cx));
        let id = self.next;
        self.next += 1;
        let mut event = Event::default()
            .id(id.to_string())
            .data(format!("tick {id} on connection {}", self.connection));
        if std::mem::take(&mut self.first) {
            event = event.retry(RETRY);
        }
        Poll::Ready(Some(Ok(event)))
    }
}

/// One event as the client sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Tick {
    pub(crate) id: u64,
    /// The server-side connection id ([`ConnMeta::id`]) that carried it.
    pub(crate) connection: u64,
}

/// A client side of one `/events` stream over HTTP/1.1.
pub(crate) struct EventStream {
    body: Incoming,
    buf: String,
    /// Resolves when the connection closes.
    pub(crate) connection: JoinHandle<hyper::Result<()>>,
}

impl EventStream {
    /// Opens `/events` on `addr`, resuming after `last_id`.
    pub(crate) async fn open(
        addr: SocketAddr,
        every: Duration,
        last_id: Option<u64>,
    ) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        let io = TokioIo::new(TcpStream::connect(addr).await?);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await?;
        let connection = tokio::spawn(conn);
        let mut req = http::Request::builder()
            .uri(format!("/events?every_ms={}", every.as_millis()))
            .header("host", addr.to_string())
            .header("accept", "text/event-stream");
        if let Some(id) = last_id {
            req = req.header("last-event-id", id.to_string());
        }
        let res = sender
            .send_request(req.body(Empty::<Bytes>::new())?)
            .await?;
        if !res.status().is_success() {
            return Err(format!("status {}", res.status()).into());
        }
        Ok(Self {
            body: res.into_body(),
            buf: String::new(),
            connection,
        })
    }

    /// The next event; `Ok(None)` when the server ended the stream cleanly, `Err` when it was
    /// cut (connection reset, malformed chunk).
    pub(crate) async fn next(&mut self) -> Result<Option<Tick>, hyper::Error> {
        loop {
            while let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                if let Some(tick) = parse(&block) {
                    return Ok(Some(tick));
                }
                // A keep-alive comment or a field-only block: nothing to hand out.
            }
            match self.body.frame().await {
                None => return Ok(None),
                Some(Err(e)) => return Err(e),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.push_str(&String::from_utf8_lossy(&data));
                    }
                }
            }
        }
    }
}

fn parse(block: &str) -> Option<Tick> {
    let mut id = None;
    let mut connection = None;
    for line in block.lines() {
        if let Some(v) = line.strip_prefix("id:") {
            id = v.trim().parse().ok();
        } else if let Some(v) = line.strip_prefix("data:") {
            connection = v.trim().rsplit(' ').next().and_then(|c| c.parse().ok());
        }
    }
    Some(Tick {
        id: id?,
        connection: connection?,
    })
}
