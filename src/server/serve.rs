//! [`serve`]: the accept loop on hyper-util's auto builder (HTTP/1.1 and h2c on one port).
//!
//! # Connection lifecycle
//!
//! | Phase | Listener | HTTP/1 connections | HTTP/2 connections |
//! |---|---|---|---|
//! | Serving | accepts | keep-alive | normal |
//! | Draining | **still accepts** | busy: `Connection: close` on the response (the layer); idle: left open | open before the trigger: GOAWAY at once, in-flight streams finish; opened during the drain: left open |
//! | StoppedAccepting | closed | idle ones closed now, busy ones after their response | GOAWAY to those opened during the drain |
//! | Closing (nothing in flight) | — | never sent a complete request head: closed | same |
//! | quiesce deadline | — | force-closed | force-closed |
//!
//! A connection that has not sent a byte is closed at `stopped_accepting` like an idle one; one
//! that sent part of a first request head and stalls (slowloris) is bounded by the header-read
//! timeout and closed at the latest when the drain has nothing left in flight, so it cannot keep
//! [`serve`] from returning.
//!
//! # In flight until the response has left
//!
//! Each connection's socket is wrapped so that a connection whose response bytes could not all
//! be handed to the socket (a slow or stalled reader: the kernel's send queue is full) counts
//! as in-flight work until hyper's flush completes. The drain's `in_flight_zero` therefore
//! waits for those bytes; at the quiesce deadline the connection is named as a `response`
//! straggler (peer, bytes written on the connection) and cut. Writes that complete at once cost
//! one addition to a plain field.
//!
//! HTTP/2 queues a response's data behind the peer's flow-control window, where the socket never
//! sees it; so an HTTP/2 connection also counts as in flight from its GOAWAY until it closes
//! (hyper closes it once every stream has sent everything). Connections opened before the
//! drain get their GOAWAY at the trigger, so this covers them from the start; one opened during
//! the drain is counted from `stopped_accepting`, when its GOAWAY goes out. While draining, each poll of a connection also holds a guard
//! for its duration, so that the moment a body's last frame is handed to hyper and the moment
//! its bytes fail to go out cannot leave a gap in which nothing is counted.
//!
//! Idle HTTP/1 connections are not closed at the trigger: closing an idle pooled socket races
//! with the client's next request on it, and a request lost in that race is a client error.
//!
//! `hyper_util::server::graceful::GracefulShutdown` signals every connection at once; here the
//! signal comes in two stages (HTTP/2 at the trigger, HTTP/1 at `stopped_accepting`) plus a
//! forced one, so each connection task calls its connection's own `graceful_shutdown` at the
//! right stage.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use http_body::Body;
use hyper::body::Incoming;
use tokio::net::TcpListener;

use crate::drain::Drain;
use crate::work::closers::BoxError;

mod accept_loop;
mod bound;
mod state;

use state::with_state;

/// The default for [`Serve::http2_max_concurrent_streams`]: as many streams as nginx allows
/// an HTTP/2 connection by default (hyper's own default is 200).
pub const DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS: u32 = 128;

/// A header-read timeout for [`Serve::header_read_timeout`] when the port faces clients you do
/// not trust: above the common 60 s idle timeouts of load balancers, so their pooled
/// connections are not closed under them. Not the default: see the setter.
pub const SUGGESTED_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(75);

/// Serves `service` on `listener` until the drain is over: HTTP/1.1 and HTTP/2 (prior
/// knowledge, h2c) on one port, with upgrades (WebSocket).
///
/// **axum handlers that extract `ConnectInfo<SocketAddr>` or `ConnectInfo<ConnMeta>` answer
/// 500 under `serve` unless you call [`Serve::connect_info`][connect-info]** — the same opt-in
/// as `axum::serve`'s `into_make_service_with_connect_info`, and for the same reason: it costs
/// every request allocations. [`axum_serve`][axum-serve] always attaches both; the
/// [axum guide][which-one] puts the two side by side.
///
#[cfg_attr(
    feature = "axum",
    doc = "[which-one]: crate::guide::axum#which-serve\n[axum-serve]: crate::axum_serve\n[connect-info]: Serve::connect_info"
)]
#[cfg_attr(
    not(feature = "axum"),
    doc = "[which-one]: crate#feature-flags\n[axum-serve]: crate#feature-flags\n[connect-info]: crate#feature-flags"
)]
///
/// * Marks startup complete ([`Readiness::mark_serving`](crate::Readiness::mark_serving)) when
///   it starts.
/// * Keeps accepting while Draining, and records each new connection (time, peer) as activity
///   for the propagation policy and the report.
/// * Sends a graceful GOAWAY to HTTP/2 connections when the drain starts; leaves idle HTTP/1
///   connections open until `stopped_accepting`, then closes them (busy ones close after their
///   response; the [`DrainLayer`](crate::DrainLayer) adds `Connection: close` while draining).
/// * Closes the listener at `stopped_accepting`, force-closes what is left at the quiesce
///   deadline, keeps [`Counts::connections`](crate::Counts::connections) up to date, and
///   resolves when every connection is gone.
/// * Accept errors (out of file descriptors and the like) do not end the loop: they are
///   logged, and the loop backs off briefly (10 ms doubling to 1 s) and continues.
/// * Attaches a [`ConnMeta`](crate::ConnMeta) to every request that arrives while draining,
///   which is when the [`DrainLayer`](crate::DrainLayer) reads it to count requests on new
///   versus reused connections. While Serving it attaches nothing, so a request costs no
///   allocation here; handlers that read `ConnMeta` on every request turn that on with
///   [`Serve::conn_meta_on_every_request`]. Sets `TCP_NODELAY` on accepted sockets.
/// * Counts a connection whose response bytes wait for a slow reader as in flight until they
///   have been handed to the socket, and names it as a `response` straggler at the quiesce
///   deadline (an HTTP/2 connection from its GOAWAY until it closes, for data queued behind
///   flow control); the layer alone cannot see those bytes (see
///   [`DrainLayer`](crate::DrainLayer#what-the-layer-can-and-cannot-see)). While draining, a
///   connection also counts as one in flight for the duration of each poll (so
///   [`Counts::in_flight`](crate::Counts::in_flight) read by an HTTP/1 handler then includes
///   its own connection): the instant a body's last frame is handed over and the instant its
///   bytes fail to go out are one poll apart, and nothing may look finished in between.
/// * Bounds open connections ([`Serve::max_connections`]; by default from the process's
///   descriptor limit, keeping a reserve for the admin port, files and outgoing connections):
///   at the bound it stops accepting until a connection closes, and new connections wait in
///   the kernel's accept queue. So a flood of connections on this port cannot take the last
///   file descriptor from the admin port's probes, or from the app.
/// * Bounds the streams of an HTTP/2 connection ([`Serve::http2_max_concurrent_streams`],
///   128 by default).
/// * Bounds HTTP/1 header reads only when asked ([`Serve::header_read_timeout`]: no limit by
///   default; set [`SUGGESTED_HEADER_READ_TIMEOUT`], 75 s, when the port faces clients you do
///   not trust — otherwise connections that stall their request head hold their descriptor,
///   up to the bound, until they go away), and closes connections that never delivered a
///   complete request head once the drain has nothing in flight, so slowloris connections
///   cannot hold the drain open.
///
/// # What to set
///
/// On a port that untrusted clients reach, set [`Serve::header_read_timeout`] (the
/// [`SUGGESTED_HEADER_READ_TIMEOUT`] fits most proxy chains; see the setter). The connection
/// bound needs no setting unless the app itself holds many descriptors (large pools, many
/// files): then give [`Serve::max_connections`] a number that leaves them room.
///
/// `serve` does not count requests itself: wrap the service with [`Drain::layer`]. The
/// returned future resolves to `()`, as [`axum_serve`][axum-serve]'s does: accept errors are
/// logged and retried, never returned.
///
/// An `axum::Router` passed as it is, or wrapped in the drain layer, gets its state once, as
/// `axum::serve` gives it (feature `axum`); until then axum builds every handler, and applies
/// every `Router::layer`, anew for each request. A router wrapped in another service of your
/// own is yours to prepare: `router.with_state(())` before wrapping it.
///
/// An upgraded connection (WebSocket) leaves hyper, and the connection count, when it is
/// upgraded; see [`DrainLayer`](crate::DrainLayer#upgraded-connections) for keeping it counted.
///
/// HTTP/2 connections are recognised by their first request: one that has carried no request
/// yet when the drain starts gets its GOAWAY with its first request, or at `stopped_accepting`.
/// HTTP/2 connections *accepted during the drain* get theirs at `stopped_accepting`: their
/// client still routes here, and a GOAWAY after every first request would make it reconnect
/// for every call, each reconnect racing the GOAWAY.
///
/// # Examples
///
/// ```no_run
/// # #[cfg(feature = "admin")] {
/// use axum::{routing::get, Router};
/// use lameduck::{Drain, DrainReport};
///
/// #[tokio::main]
/// async fn main() -> Result<DrainReport, Box<dyn std::error::Error>> {
///     let drain = Drain::builder().build()?;
///     let app = Router::new()
///         .route("/", get(|| async { "hello" }))
///         .layer(drain.layer());
///
///     let listener = tokio::net::TcpListener::bind("0.0.0.0:8080").await?;
///     let server = tokio::spawn(lameduck::serve(listener, app, &drain));
///
///     let report = drain.run().await; // SIGTERM → drain → report
///     server.await?; // serve itself cannot fail: accept errors are retried, logged
///     Ok(report) // exits 0 (clean) or 1, after destructors ran
/// }
/// # }
/// ```
pub fn serve<S, B>(listener: TcpListener, service: S, drain: &Drain) -> Serve<S>
where
    S: tower_service::Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    Serve {
        setup: Some(Setup {
            listener,
            service: with_state(service),
            drain: drain.clone(),
            keep_listening: false,
            header_read_timeout: None,
            h2_streams: DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS,
            max_connections: MaxConnections::FromLimit,
            conn_meta_always: false,
            #[cfg(feature = "axum")]
            connect_info: false,
        }),
        running: None,
    }
}

/// The future returned by [`serve`]; resolves when every connection is gone.
///
/// It has no error to return: accept errors are logged and retried with a backoff, and the
/// listener is given up only at `stopped_accepting`.
///
/// Options can be set before it is first polled.
#[must_use = "futures do nothing unless polled"]
pub struct Serve<S> {
    setup: Option<Setup<S>>,
    running: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

struct Setup<S> {
    listener: TcpListener,
    service: S,
    drain: Drain,
    keep_listening: bool,
    header_read_timeout: Option<Duration>,
    h2_streams: u32,
    max_connections: MaxConnections,
    conn_meta_always: bool,
    #[cfg(feature = "axum")]
    connect_info: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MaxConnections {
    /// From the descriptor limit, read when serving starts.
    FromLimit,
    Given(usize),
}

// `Serve` never pins `S` or the listener in place: they are moved into the boxed future on the
// first poll. So `Serve` is `Unpin` whatever `S` is.
impl<S> Unpin for Serve<S> {}

impl<S> Serve<S> {
    /// Keeps the listener (and idle connections) open after `stopped_accepting`, until
    /// in-flight work reaches zero or the quiesce deadline passes — for use with
    /// [`DrainLayer::refuse_after_stop`](crate::DrainLayer::refuse_after_stop), so that late
    /// clients get `503` + `Retry-After` instead of a refused connection, as kube-apiserver
    /// does with `--shutdown-send-retry-after`.
    pub fn keep_listening_after_stop(mut self) -> Self {
        if let Some(setup) = &mut self.setup {
            setup.keep_listening = true;
        }
        self
    }

    /// How long an HTTP/1 client may take to send a complete request head; `None` (the
    /// default, as with hyper and `axum::serve` without a timer) sets no limit. A connection
    /// that exceeds it is closed.
    ///
    /// Off by default because of its price: hyper (1.12) allocates and registers a timer for
    /// every request head, an allocation per request (`benches/callgrind.sh` measures it; the
    /// figures are in BENCHMARKS.md). Without it a client that never finishes
    /// its head still cannot hold up a drain: connections that never sent a byte close at
    /// `stopped_accepting`, and half-sent heads at Closing. Set it when the port faces clients
    /// you do not trust ([`SUGGESTED_HEADER_READ_TIMEOUT`], 75 s).
    ///
    /// hyper runs this timer whenever an HTTP/1 connection waits for a request head, including
    /// between requests: it is also the idle timeout of keep-alive connections. Keep it above
    /// the idle timeout of the load balancers and proxies in front (their pooled connections
    /// would otherwise be closed under them, racing their next request); 75 s is above the
    /// common 60 s defaults. HTTP/2 connections are not affected.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(drain: lameduck::Drain, app: axum::Router) -> std::io::Result<()> {
    /// use std::time::Duration;
    ///
    /// let listener = tokio::net::TcpListener::bind("0.0.0.0:8080").await?;
    /// lameduck::serve(listener, app, &drain)
    ///     .header_read_timeout(Duration::from_secs(620)) // behind a proxy that pools for 600 s
    ///     .await;
    /// # Ok(()) }
    /// ```
    pub fn header_read_timeout(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        if let Some(setup) = &mut self.setup {
            setup.header_read_timeout = timeout.into();
        }
        self
    }

    /// The most connections open at once (at least 1). At the bound the accept loop stops
    /// accepting until one closes; new connections wait in the kernel's accept queue (the
    /// listener's backlog) meanwhile, and are not refused. Upgraded connections (WebSocket)
    /// leave the count when they are upgraded, as they leave hyper.
    ///
    /// The default comes from the process's soft descriptor limit (`RLIMIT_NOFILE`, read from
    /// `/proc/self/limits` when serving starts): the limit less a reserve of a quarter of it
    /// (at least 128 descriptors, at most half the limit) for the admin port, files and the
    /// app's own outgoing connections — 768 connections at the common limit of 1,024. Where
    /// the limit cannot be read (not Linux) or is unlimited, there is no default bound.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(drain: lameduck::Drain, app: axum::Router) -> std::io::Result<()> {
    /// let listener = tokio::net::TcpListener::bind("0.0.0.0:8080").await?;
    /// lameduck::serve(listener, app, &drain)
    ///     .header_read_timeout(lameduck::server::SUGGESTED_HEADER_READ_TIMEOUT)
    ///     .max_connections(10_000) // after raising the descriptor limit well above that
    ///     .await;
    /// # Ok(()) }
    /// ```
    pub fn max_connections(mut self, max: usize) -> Self {
        if let Some(setup) = &mut self.setup {
            setup.max_connections = MaxConnections::Given(max.max(1));
        }
        self
    }

    /// The most streams an HTTP/2 connection may have open at once (at least 1; default
    /// [`DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS`](crate::server::DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS)); a client that opens more has them refused
    /// (`REFUSED_STREAM`, which clients retry). Each open stream is a request in flight: a
    /// peer that opens streams and never reads their answers holds them to the quiesce
    /// deadline, so the bound is what one connection can leave hanging.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(drain: lameduck::Drain, app: axum::Router) -> std::io::Result<()> {
    /// let listener = tokio::net::TcpListener::bind("0.0.0.0:8080").await?;
    /// lameduck::serve(listener, app, &drain)
    ///     .http2_max_concurrent_streams(256) // gRPC clients that multiplex heavily
    ///     .await;
    /// # Ok(()) }
    /// ```
    pub fn http2_max_concurrent_streams(mut self, max: u32) -> Self {
        if let Some(setup) = &mut self.setup {
            setup.h2_streams = max.max(1);
        }
        self
    }

    /// Attaches a [`ConnMeta`](crate::ConnMeta) to every request's extensions, for handlers
    /// that read it (`Extension<ConnMeta>` in axum, `req.extensions().get::<ConnMeta>()`).
    ///
    /// Off by default: inserting into a request's extensions allocates (the extension map and
    /// the boxed value: two allocations per request), and the drain
    /// needs the value only for requests that arrive while draining, so by default `serve`
    /// attaches it only to those. With this on, every request carries it, in every phase.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[cfg(feature = "admin")] {
    /// use axum::{routing::get, Extension, Router};
    /// use lameduck::ConnMeta;
    ///
    /// async fn handler(Extension(conn): Extension<ConnMeta>) -> String {
    ///     format!("request {:?} on connection {}", conn.request_index(), conn.id())
    /// }
    ///
    /// # async fn run(drain: lameduck::Drain) -> std::io::Result<()> {
    /// let app = Router::new().route("/", get(handler)).layer(drain.layer());
    /// let listener = tokio::net::TcpListener::bind("0.0.0.0:8080").await?;
    /// lameduck::serve(listener, app, &drain)
    ///     .conn_meta_on_every_request()
    ///     .await;
    /// # Ok(()) }
    /// # }
    /// ```
    pub fn conn_meta_on_every_request(mut self) -> Self {
        if let Some(setup) = &mut self.setup {
            setup.conn_meta_always = true;
        }
        self
    }

    /// Attaches axum's `ConnectInfo<SocketAddr>` and `ConnectInfo<ConnMeta>` to every request,
    /// so `ConnectInfo` extractors work as under `axum::serve` with
    /// `into_make_service_with_connect_info`, and under [`axum_serve`](crate::axum_serve) —
    /// without it they answer 500 ("Missing request extension").
    ///
    /// Off by default, like axum's own: the two inserts cost every request allocations (the
    /// extension map and a box per value; `tests/alloc.rs` counts them), in every phase. With
    /// it on, the layer reads the `ConnMeta` from there;
    /// [`ConnMeta::request_index`](crate::ConnMeta::request_index) is set.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::net::SocketAddr;
    ///
    /// use axum::{extract::ConnectInfo, routing::get, Router};
    ///
    /// async fn hello(ConnectInfo(peer): ConnectInfo<SocketAddr>) -> String {
    ///     format!("hello, {peer}")
    /// }
    ///
    /// # async fn run(drain: lameduck::Drain) -> std::io::Result<()> {
    /// let app = Router::new().route("/", get(hello)).layer(drain.layer());
    /// let listener = tokio::net::TcpListener::bind("0.0.0.0:8080").await?;
    /// lameduck::serve(listener, app, &drain).connect_info().await;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "axum")]
    pub fn connect_info(mut self) -> Self {
        if let Some(setup) = &mut self.setup {
            setup.connect_info = true;
        }
        self
    }
}

impl<S, B> Future for Serve<S>
where
    S: tower_service::Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if let Some(setup) = this.setup.take() {
            this.running = Some(Box::pin(accept_loop::run(setup)));
        }
        match &mut this.running {
            Some(fut) => fut.as_mut().poll(cx),
            None => Poll::Ready(()),
        }
    }
}

impl<S> fmt::Debug for Serve<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Serve")
            .field("started", &self.running.is_some())
            .finish_non_exhaustive()
    }
}
