//! A small HTTP/1.1 + HTTP/2 (h2c) server on 127.0.0.1 that the probe tests aim at.
//!
//! It serves `/`, `/slow?ms=N` and `/stream?ms=N`, sets `x-instance`, and records for every
//! request the connection it came on and its index on that connection, so the tests can check
//! the probe's `reused` flag and counts against what the server saw. Switches make it answer
//! 503, send `Connection: close`, announce a drain phase, reset connections, hang, or send an
//! HTTP/2 GOAWAY.

#![allow(dead_code)] // each test file uses a different part of it

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::channel::Channel;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) id: String,
    pub(crate) conn: u64,
    /// 0 for the first request on its connection.
    pub(crate) index: u64,
    pub(crate) path: String,
    pub(crate) label: String,
    pub(crate) http2: bool,
    pub(crate) status: u16,
    pub(crate) connection_close_requested: bool,
}

#[derive(Debug)]
pub(crate) struct State {
    pub(crate) instance: String,
    /// Connections accepted (including ones that never carried a request).
    pub(crate) accepted: AtomicU64,
    seen: Mutex<Vec<Seen>>,
    /// Status to answer with (200 by default).
    pub(crate) status: AtomicU16,
    /// Send `Connection: close` on every HTTP/1 response.
    pub(crate) close: AtomicBool,
    /// Reset connections accepted from now on when they carry a request.
    pub(crate) reset: AtomicBool,
    /// `/slow` never answers.
    pub(crate) hang: AtomicBool,
    /// Answer 503 to every request that is not the first on its connection.
    pub(crate) fail_reused: AtomicBool,
    phase: Mutex<Option<String>>,
    goaway: watch::Sender<u64>,
}

impl State {
    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub(crate) fn seen_by_id(&self) -> HashMap<String, Seen> {
        self.seen().into_iter().map(|s| (s.id.clone(), s)).collect()
    }

    /// The `x-lameduck-phase` value to send, `None` for no header.
    pub(crate) fn set_phase(&self, phase: Option<&str>) {
        *self.phase.lock().unwrap() = phase.map(str::to_owned);
    }

    /// Gracefully shuts down every open connection (HTTP/2: GOAWAY; HTTP/1: close when idle);
    /// the listener keeps accepting.
    pub(crate) fn goaway(&self) {
        self.goaway.send_modify(|g| *g += 1);
    }
}

pub(crate) struct TestServer {
    pub(crate) addr: SocketAddr,
    pub(crate) state: Arc<State>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        // Dropping the accept task drops its JoinSet, which aborts every connection.
        self.accept.abort();
    }
}

pub(crate) async fn server(instance: &str) -> TestServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = Arc::new(State {
        instance: instance.to_owned(),
        accepted: AtomicU64::new(0),
        seen: Mutex::new(Vec::new()),
        status: AtomicU16::new(200),
        close: AtomicBool::new(false),
        reset: AtomicBool::new(false),
        hang: AtomicBool::new(false),
        fail_reused: AtomicBool::new(false),
        phase: Mutex::new(None),
        goaway: watch::Sender::new(0),
    });
    let accept_state = state.clone();
    let accept = tokio::spawn(async move {
        let mut conns = JoinSet::new();
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            // Reap finished connection tasks so the set stays small.
            while conns.try_join_next().is_some() {}
            let conn_id = accept_state.accepted.fetch_add(1, Ordering::SeqCst) + 1;
            let reset = accept_state.reset.load(Ordering::SeqCst);
            if reset {
                // Dropping the socket then sends RST instead of FIN.
                stream.set_zero_linger().unwrap();
            }
            let state = accept_state.clone();
            let mut goaway = state.goaway.subscribe();
            conns.spawn(async move {
                let index = Arc::new(AtomicU64::new(0));
                let kill = Arc::new(Notify::new());
                let service_kill = kill.clone();
                let service_state = state.clone();
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let state = service_state.clone();
                    let index = index.fetch_add(1, Ordering::SeqCst);
                    let kill = service_kill.clone();
                    async move {
                        Ok::<_, Infallible>(handle(&state, req, conn_id, index, reset, &kill).await)
                    }
                });
                let builder = auto::Builder::new(TokioExecutor::new());
                let conn = builder.serve_connection(TokioIo::new(stream), service);
                tokio::pin!(conn);
                tokio::select! {
                    _ = conn.as_mut() => return,
                    _ = kill.notified() => return,
                    _ = goaway.changed() => conn.as_mut().graceful_shutdown(),
                }
                tokio::select! {
                    _ = conn.as_mut() => {}
                    _ = kill.notified() => {}
                }
            });
        }
    });
    TestServer {
        addr,
        state,
        accept,
    }
}

async fn handle(
    state: &State,
    req: Request<Incoming>,
    conn: u64,
    index: u64,
    reset: bool,
    kill: &Notify,
) -> Response<BoxBody<Bytes, Infallible>> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let status = if index > 0 && state.fail_reused.load(Ordering::SeqCst) {
        503
    } else {
        state.status.load(Ordering::SeqCst)
    };
    state.seen.lock().unwrap().push(Seen {
        id: header("x-request-id"),
        conn,
        index,
        path: req.uri().path().to_owned(),
        label: header("x-traffic-path"),
        http2: req.version() == hyper::Version::HTTP_2,
        status: if reset { 0 } else { status },
        connection_close_requested: header("connection").eq_ignore_ascii_case("close"),
    });
    if reset {
        kill.notify_one();
        std::future::pending::<()>().await;
    }
    let ms: u64 = req
        .uri()
        .query()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("ms=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let body = match req.uri().path() {
        "/slow" => {
            if state.hang.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Full::new(Bytes::from_static(b"slow")).boxed()
        }
        "/stream" => {
            let (mut tx, body) = Channel::<Bytes, Infallible>::new(4);
            tokio::spawn(async move {
                let end = tokio::time::Instant::now() + Duration::from_millis(ms);
                // Bounded: one chunk per 20 ms until the end.
                while tokio::time::Instant::now() < end {
                    if tx.send_data(Bytes::from_static(b"tick\n")).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let _ = tx.send_data(Bytes::from_static(b"end\n")).await;
            });
            body.boxed()
        }
        _ => Full::new(Bytes::from_static(b"ok")).boxed(),
    };
    let mut res = Response::builder()
        .status(status)
        .header("x-instance", state.instance.as_str())
        .header("x-request-id", header("x-request-id"));
    if let Some(phase) = state.phase.lock().unwrap().as_deref() {
        res = res.header("x-lameduck-phase", phase);
    }
    if state.close.load(Ordering::SeqCst) && req.version() != hyper::Version::HTTP_2 {
        res = res.header("connection", "close");
    }
    res.body(body).unwrap()
}

/// A port nothing listens on: bound, then released.
pub(crate) async fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    addr
}
