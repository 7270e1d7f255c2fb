//! One accepted connection under [`serve`](super::serve): its task (the staged shutdown the
//! accept loop's tokens ask for), its count in `Counts::connections`, and the hyper service that
//! attaches `ConnMeta` before the tower service.

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, Version};
use http_body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::hot::guard::Core;
use crate::work::closers::BoxError;

use super::conn_meta::{ConnMeta, PROTO_H1, PROTO_H2, PROTO_UNKNOWN};
use super::io::{Peek, WatchedIo, WritePending};

#[derive(Clone)]
pub(super) struct ConnTokens {
    /// Drain start: GOAWAY to HTTP/2.
    pub(super) drain: CancellationToken,
    /// Listener closed: close idle HTTP/1 connections.
    pub(super) idle_close: CancellationToken,
    /// Quiesce deadline: force-close.
    pub(super) deadline: CancellationToken,
    /// Closing (nothing in flight): close connections that never delivered a request head.
    pub(super) closing: CancellationToken,
    /// Not a token, but per-connection settings travel with them: attach `ConnMeta` to every
    /// request, not only while draining.
    pub(super) conn_meta_always: bool,
    /// Attach axum's `ConnectInfo<ConnMeta>` and `ConnectInfo<SocketAddr>` to every request.
    #[cfg(feature = "axum")]
    pub(super) connect_info: bool,
}

/// Keeps `Counts::connections` exact even if a connection task panics or is aborted.
pub(super) struct Counted(&'static Core);

impl Counted {
    fn new(core: &'static Core) -> Self {
        // Relaxed: a gauge for status and reports; nothing synchronises through it.
        core.observed().connection_opened();
        Self(core)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.observed().connection_closed();
    }
}

pub(super) struct ConnTask {
    counted: Counted,
    meta: ConnMeta,
    tokens: ConnTokens,
}

impl ConnTask {
    pub(super) fn new(core: &'static Core, meta: ConnMeta, tokens: ConnTokens) -> Self {
        Self {
            counted: Counted::new(core),
            meta,
            tokens,
        }
    }

    pub(super) async fn run<S, B>(
        self,
        builder: auto::Builder<TokioExecutor>,
        stream: TcpStream,
        svc: TowerToHyperService<S>,
    ) where
        S: tower_service::Service<Request<Incoming>, Response = Response<B>>
            + Clone
            + Send
            + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<BoxError>,
    {
        let Self {
            counted,
            meta,
            tokens,
        } = self;
        let core = counted.0;
        let io = watched_io(stream, core, &meta);
        let svc = ConnService::new(svc, &meta, core, &tokens);
        let conn = builder.serve_connection_with_upgrades(io, svc);
        let mut conn = pin!(conn);
        let mut stage = Stage::new(tokens.drain.is_cancelled());
        loop {
            let proto = meta.proto();
            if stage.goaway_due(proto) {
                tracing::debug!(conn = meta.id(), "lameduck: GOAWAY to HTTP/2 connection");
                conn.as_mut().graceful_shutdown();
                stage.note_shutdown_sent(true, core, &meta);
            }
            // `select!` polls every enabled branch on each wake-up (about once per request), and
            // each poll of a `cancelled()` future locks its token: while Serving only the drain
            // token is polled (the others fire after it). While draining, each poll holds a
            // guard (module docs): the last frame of a body and a stalled write are counted.
            let held = HeldWhilePolled {
                fut: conn.as_mut(),
                core: stage.draining.then_some(core),
            };
            tokio::select! {
                res = held => {
                    if let Err(e) = res {
                        tracing::debug!(conn = meta.id(), error = %e, "lameduck: connection ended with an error");
                    }
                    break;
                }
                () = tokens.drain.cancelled(), if !stage.draining => stage.draining = true,
                () = meta.shared().proto_known.notified(), if stage.awaits_proto(proto) => {}
                () = tokens.idle_close.cancelled(), if stage.draining && !stage.idle_closed => {
                    stage.idle_closed = true;
                    stage.close_due = !stage.shutdown_sent;
                }
                () = stage.recheck(), if stage.recheck_at.is_some() => {}
                () = tokens.deadline.cancelled(), if stage.draining => {
                    tracing::debug!(conn = meta.id(), "lameduck: quiesce deadline; force-closing connection");
                    break;
                }
                () = tokens.closing.cancelled(), if stage.idle_closed && meta.requests() == 0 && stage.recheck_at.is_none() => {
                    tracing::debug!(conn = meta.id(), "lameduck: no request head by the end of the drain; closing connection");
                    break;
                }
            }
            if std::mem::take(&mut stage.close_due)
                && close_when_idle(
                    (conn.as_mut(), |c| c.graceful_shutdown()),
                    &mut stage,
                    &meta,
                    core,
                )
                .await
            {
                break;
            }
        }
        drop(stage);
        drop(counted);
    }
}

/// The socket, with `TCP_NODELAY` set and its writes watched for a slow reader.
fn watched_io(stream: TcpStream, core: &'static Core, meta: &ConnMeta) -> TokioIo<WatchedIo> {
    // Best effort: responses are small writes that should not wait for Nagle.
    let _ = stream.set_nodelay(true);
    TokioIo::new(WatchedIo::new(
        stream,
        core,
        (meta.id(), meta.peer()),
        meta.shared_arc(),
    ))
}

/// The listener closed: asks hyper to close the connection (HTTP/1: now if idle, after the
/// current response if busy; HTTP/2: GOAWAY). hyper closes an idle HTTP/1 connection without
/// reading, so first asks the socket whether a request is waiting unread; if one is, hyper
/// reads and answers it (`Connection: close`, as every response while draining), and the close
/// is asked again after [`RECHECK`]. `true`: the connection ended meanwhile.
async fn close_when_idle<C: Future>(
    (mut conn, shutdown): (Pin<&mut C>, impl FnOnce(Pin<&mut C>)),
    stage: &mut Stage,
    meta: &ConnMeta,
    core: &'static Core,
) -> bool {
    let h2 = meta.proto() == PROTO_H2;
    if !h2 {
        match request_waiting(conn.as_mut(), meta, core).await {
            Waiting::Ended => return true,
            Waiting::Yes => {
                tracing::debug!(
                    conn = meta.id(),
                    "lameduck: a request waits unread; closing after it"
                );
                stage.recheck_at = Some(Instant::now() + RECHECK);
                return false;
            }
            Waiting::No => {}
        }
    }
    shutdown(conn);
    stage.note_shutdown_sent(h2, core, meta);
    false
}

/// After a request found waiting at a close, when to ask again: hyper has read it by then
/// (the socket's readiness is seen within a turn of the runtime), and is answering it.
const RECHECK: Duration = Duration::from_millis(25);

/// Whether a request waits unread in the socket (see [`Peek`]).
enum Waiting {
    Yes,
    No,
    /// The connection ended while asked.
    Ended,
}

/// Asks the socket, through hyper's next read, whether bytes wait unread: polls the
/// connection once (holding a guard, as every poll while draining), and hyper, idle, reads.
/// Unanswered, hyper did not read: it is busy with a request, and its close waits for the
/// response.
async fn request_waiting<F>(mut conn: Pin<&mut F>, meta: &ConnMeta, core: &'static Core) -> Waiting
where
    F: Future,
{
    let peek = &meta.shared().peek;
    // Relaxed: asked and answered on this task.
    peek.store(Peek::ASKED, Ordering::Relaxed);
    let ended = std::future::poll_fn(|cx| {
        let _held = core.hold();
        Poll::Ready(conn.as_mut().poll(cx).is_ready())
    })
    .await;
    let answer = peek.swap(Peek::NONE, Ordering::Relaxed);
    match answer {
        _ if ended => Waiting::Ended,
        Peek::WAITING => Waiting::Yes,
        _ => Waiting::No,
    }
}

/// How far a connection's staged shutdown has got.
struct Stage {
    /// A connection that arrives while draining came from a client (or proxy) that still
    /// routes here; a GOAWAY right after its first request would only make it reconnect for
    /// every call, each reconnect racing the GOAWAY. It gets its GOAWAY at
    /// `stopped_accepting`, with the idle HTTP/1 connections.
    accepted_while_draining: bool,
    draining: bool,
    shutdown_sent: bool,
    idle_closed: bool,
    /// The listener closed (or a request found waiting then was given time): close the
    /// connection once it is idle.
    close_due: bool,
    /// A request was waiting unread when the close came: ask again at this instant.
    recheck_at: Option<Instant>,
    /// An HTTP/2 connection after its GOAWAY: in flight until it closes (see `WritePending`).
    h2_closing: Option<WritePending>,
}

impl Stage {
    fn new(accepted_while_draining: bool) -> Self {
        Self {
            accepted_while_draining,
            draining: accepted_while_draining,
            shutdown_sent: false,
            idle_closed: false,
            close_due: false,
            recheck_at: None,
            h2_closing: None,
        }
    }

    /// Resolves when a close put off for a request found waiting is due again.
    async fn recheck(&mut self) {
        if let Some(at) = self.recheck_at {
            tokio::time::sleep_until(at).await;
        }
        self.recheck_at = None;
        self.close_due = !self.shutdown_sent;
    }

    /// An HTTP/2 connection open before the drain started is owed its GOAWAY.
    #[inline]
    fn goaway_due(&self, proto: u8) -> bool {
        self.draining && !self.shutdown_sent && proto == PROTO_H2 && !self.accepted_while_draining
    }

    /// The GOAWAY would be due if the connection turns out to be HTTP/2: wait for its first
    /// request to tell.
    #[inline]
    fn awaits_proto(&self, proto: u8) -> bool {
        self.draining
            && !self.shutdown_sent
            && !self.accepted_while_draining
            && proto == PROTO_UNKNOWN
    }

    /// The connection's graceful shutdown was just asked for; an HTTP/2 one counts as in
    /// flight from its GOAWAY until it closes.
    fn note_shutdown_sent(&mut self, h2: bool, core: &'static Core, meta: &ConnMeta) {
        self.shutdown_sent = true;
        meta.note_told();
        if h2 {
            self.h2_closing = Some(WritePending::after_goaway(core, meta.id(), meta.peer()));
        }
    }
}

/// Polls `fut` holding an in-flight guard for the duration of each poll, when `core` is set.
pub(super) struct HeldWhilePolled<'a, F> {
    fut: Pin<&'a mut F>,
    core: Option<&'static Core>,
}

impl<F: Future> Future for HeldWhilePolled<'_, F> {
    type Output = F::Output;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let _held = self.core.map(Core::hold);
        self.fut.as_mut().poll(cx)
    }
}

/// The per-connection hyper service: learns the protocol from the first request, attaches the
/// request's [`ConnMeta`] while draining (or always, when asked), then hands over to the tower
/// service.
pub(super) struct ConnService<S> {
    inner: TowerToHyperService<S>,
    meta: ConnMeta,
    core: &'static Core,
    always: bool,
    #[cfg(feature = "axum")]
    connect_info: bool,
}

impl<S> ConnService<S> {
    fn new(
        inner: TowerToHyperService<S>,
        meta: &ConnMeta,
        core: &'static Core,
        tokens: &ConnTokens,
    ) -> Self {
        Self {
            inner,
            meta: meta.clone(),
            core,
            always: tokens.conn_meta_always,
            #[cfg(feature = "axum")]
            connect_info: tokens.connect_info,
        }
    }
}

impl<S, B> hyper::service::Service<Request<Incoming>> for ConnService<S>
where
    S: tower_service::Service<Request<Incoming>, Response = Response<B>> + Clone,
{
    type Response = Response<B>;
    type Error = S::Error;
    type Future = <TowerToHyperService<S> as hyper::service::Service<Request<Incoming>>>::Future;

    #[inline]
    fn call(&self, mut req: Request<Incoming>) -> Self::Future {
        let index = self.meta.next_request_index();
        // The propagation evidence: requests, not only new connections, say how often this
        // process is picked (a pooling proxy opens few connections). A clock read and two
        // relaxed loads; a write only for the first request of a 250 ms slot, and a hand-in
        // of the connection's requests once a second.
        self.meta.note_arrival(index);
        if index == 0 {
            let proto = if req.version() == Version::HTTP_2 {
                PROTO_H2
            } else {
                PROTO_H1
            };
            self.meta.set_proto(proto);
        }
        // Inserting allocates, so while Serving only when asked. A request that meets a drain
        // starting between this check and the layer's `call` carries no `ConnMeta` and is
        // counted as on a reused connection, which it is: a connection accepted after the drain
        // started always sees the flag here.
        #[cfg(feature = "axum")]
        if self.connect_info {
            // What `axum::serve` with `into_make_service_with_connect_info` attaches, and
            // `axum_serve` too; the layer reads this `ConnMeta` as well.
            let ext = req.extensions_mut();
            ext.insert(axum::extract::ConnectInfo(self.meta.with_index(index)));
            if let Some(peer) = self.meta.peer() {
                ext.insert(axum::extract::ConnectInfo(peer));
            }
            if !self.always {
                return self.inner.call(req);
            }
        }
        if self.always || self.core.counter.is_draining() {
            req.extensions_mut().insert(self.meta.with_index(index));
        }
        self.inner.call(req)
    }
}
