//! [`AdminBuilder::serve`]: the admin listener's own accept loop, built to answer probes under
//! a slowloris and to answer every `/drain` caller before the process exits.
//!
//! # Invariants
//!
//! * At most `max_connections` connections are open. A new connection at the cap evicts the
//!   oldest connection with no request in progress (idle keep-alive, or a request head still
//!   arriving); only when every open connection is busy is the new one refused (closed at
//!   once). So a flood of slow or silent connections cannot lock kubelet's probes out, and an
//!   answer being computed or written is never cut to make room.
//! * HTTP/1 request heads must arrive within the header-read timeout.
//! * Every connection task runs as owed work of the drain's exit holds: when
//!   [`Drain::run`](crate::Drain::run) is about to return, the listener closes, connections
//!   with no request in progress close, and busy ones finish their response (hyper's graceful
//!   shutdown writes it out) before `run` returns.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use http::Request;
use http_body::{Frame, SizeHint};
use hyper::body::Bytes;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::Drain;

/// The admin server's default HTTP/1 header-read timeout: probes send their head at once.
pub const DEFAULT_ADMIN_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The admin server's default cap on open connections.
pub const DEFAULT_ADMIN_MAX_CONNECTIONS: usize = 64;

const MIN_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// The future returned by [`AdminBuilder::serve`](super::AdminBuilder::serve): serves the
/// admin router until [`Drain::run`](crate::Drain::run) is about to return, then stops
/// accepting and resolves (connections still writing an answer finish on their own, and `run`
/// waits for them).
#[must_use = "futures do nothing unless polled"]
pub struct AdminServe {
    inner: Pin<Box<dyn Future<Output = io::Result<()>> + Send>>,
}

impl AdminServe {
    pub(crate) fn new(
        listener: TcpListener,
        router: Router,
        drain: Drain,
        header_read_timeout: Duration,
        max_connections: usize,
    ) -> Self {
        Self {
            inner: Box::pin(run(
                listener,
                router,
                drain,
                header_read_timeout,
                max_connections.max(1),
            )),
        }
    }
}

impl Future for AdminServe {
    type Output = io::Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl fmt::Debug for AdminServe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminServe").finish_non_exhaustive()
    }
}

/// One open admin connection, as the cap sees it.
struct Slot {
    accepted: Instant,
    /// Requests whose response has not been fully handed to hyper yet.
    busy: AtomicUsize,
    /// Requests started on the connection so far.
    started: AtomicUsize,
    evict: CancellationToken,
}

impl Slot {
    fn is_busy(&self) -> bool {
        self.busy.load(Ordering::Acquire) != 0
    }
}

#[derive(Default)]
struct Slots(Mutex<Vec<Arc<Slot>>>);

impl Slots {
    /// Makes room for `slot`: `false` when every open connection is busy.
    fn admit(&self, slot: &Arc<Slot>, cap: usize) -> bool {
        let mut open = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if open.len() >= cap {
            let oldest_idle = open
                .iter()
                .enumerate()
                .filter(|(_, s)| !s.is_busy())
                .min_by_key(|(_, s)| s.accepted)
                .map(|(i, _)| i);
            match oldest_idle {
                Some(i) => {
                    let evicted = open.swap_remove(i);
                    evicted.evict.cancel();
                }
                None => return false,
            }
        }
        open.push(Arc::clone(slot));
        true
    }

    fn remove(&self, slot: &Arc<Slot>) {
        let mut open = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = open.iter().position(|s| Arc::ptr_eq(s, slot)) {
            open.swap_remove(i);
        }
    }
}

async fn run(
    listener: TcpListener,
    router: Router,
    drain: Drain,
    header_read_timeout: Duration,
    cap: usize,
) -> io::Result<()> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    let exiting = drain.exit_holds().exiting().clone();
    let slots = Arc::new(Slots::default());
    let mut backoff = MIN_BACKOFF;
    loop {
        let accepted = tokio::select! {
            biased;
            () = exiting.cancelled() => break,
            r = listener.accept() => r,
        };
        let stream = match accepted {
            Ok((stream, _)) => {
                backoff = MIN_BACKOFF;
                stream
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused
                        | io::ErrorKind::ConnectionAborted
                        | io::ErrorKind::ConnectionReset
                ) =>
            {
                continue
            }
            Err(e) => {
                tracing::warn!(error = %e, backoff_ms = backoff.as_millis() as u64, "lameduck: admin accept failed; backing off");
                tokio::select! {
                    biased;
                    () = exiting.cancelled() => break,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        let slot = Arc::new(Slot {
            accepted: Instant::now(),
            busy: AtomicUsize::new(0),
            started: AtomicUsize::new(0),
            evict: CancellationToken::new(),
        });
        if !slots.admit(&slot, cap) {
            tracing::warn!(
                max_connections = cap,
                "lameduck: admin connection refused: every admin connection is busy"
            );
            drop(stream);
            continue;
        }
        let conn = serve_conn(
            builder.clone(),
            stream,
            router.clone(),
            slot,
            Arc::clone(&slots),
            exiting.clone(),
        );
        drain.exit_holds().spawn(conn);
    }
    Ok(())
}

async fn serve_conn(
    builder: auto::Builder<TokioExecutor>,
    stream: TcpStream,
    router: Router,
    slot: Arc<Slot>,
    slots: Arc<Slots>,
    exiting: CancellationToken,
) {
    let _ = stream.set_nodelay(true);
    let counted = Arc::clone(&slot);
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let busy = Busy::new(Arc::clone(&counted));
        let mut router = router.clone();
        async move {
            let res = tower_service::Service::call(&mut router, req).await?;
            Ok::<_, Infallible>(res.map(|body| {
                Body::new(Held {
                    inner: body,
                    _hold: busy,
                })
            }))
        }
    });
    let conn = builder.serve_connection(TokioIo::new(stream), svc);
    let mut conn = pin!(conn);
    let mut shutting_down = false;
    loop {
        tokio::select! {
            res = conn.as_mut() => {
                if let Err(e) = res {
                    tracing::debug!(error = %e, "lameduck: admin connection ended with an error");
                }
                break;
            }
            () = slot.evict.cancelled() => {
                tracing::debug!("lameduck: admin connection evicted at the connection cap");
                break;
            }
            () = exiting.cancelled(), if !shutting_down => {
                shutting_down = true;
                if slot.started.load(Ordering::Acquire) == 0 {
                    // Never delivered a request head: nothing is owed.
                    break;
                }
                // Idle: closes now. Busy: finishes the answer (and writes it out), then closes.
                conn.as_mut().graceful_shutdown();
            }
        }
    }
    slots.remove(&slot);
}

/// Counts one admin request as in progress on its connection until dropped.
struct Busy(Arc<Slot>);

impl Busy {
    fn new(slot: Arc<Slot>) -> Self {
        // Release/Acquire: the cap's eviction check must not miss a request that started.
        slot.busy.fetch_add(1, Ordering::Release);
        slot.started.fetch_add(1, Ordering::Release);
        Self(slot)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::Release);
    }
}

/// A response body that keeps `_hold` alive until the body is done or dropped.
pub(crate) struct Held<T> {
    pub(crate) inner: Body,
    pub(crate) _hold: T,
}

impl<T: Unpin> http_body::Body for Held<T> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
