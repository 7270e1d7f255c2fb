//! [`ConnMeta`]: what is known about the connection a request arrived on.
//!
//! # Invariants
//!
//! * One [`ConnShared`] is allocated per connection (never per request); every `ConnMeta` of
//!   that connection points at it.
//! * `accepted_while_draining` is fixed at accept time when the accept loop knows the drain
//!   state (`lameduck::serve`); otherwise (`axum::serve` through `ConnectInfo`) the layer
//!   compares the accept time with the drain's start.
//! * `recorded` turns `true` at most once: the connection has been counted in the after-flip
//!   report, by the accept loop or by the layer on the connection's first request while
//!   draining, never by both.

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::hot::guard::Core;
use crate::hot::observed::{PathId, RequestTally};

/// A connection that closed while Serving after at most this many requests was a fresh
/// connection (the propagation evidence's rate of new connections); one that carried more
/// was a pool's.
const FRESH_REQUESTS: u64 = 4;

/// Connection ids are unique per process, whatever accepted the connection.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) const PROTO_UNKNOWN: u8 = 0;
pub(crate) const PROTO_H1: u8 = 1;
pub(crate) const PROTO_H2: u8 = 2;

pub(crate) struct ConnShared {
    id: u64,
    accepted_at: Instant,
    peer: Option<SocketAddr>,
    requests: AtomicU64,
    /// `Some` when the accept loop knew the drain state at accept time.
    accepted_while_draining: Option<bool>,
    recorded: AtomicBool,
    /// A connection accepted before the drain has been told to close since it started
    /// (counted once for the propagation evidence).
    told: AtomicBool,
    /// The protocol, learned from the first request (maintained by `serve` only).
    proto: AtomicU8,
    /// Woken once when `proto` becomes known, so a connection task waiting to send GOAWAY
    /// learns it without polling.
    pub(crate) proto_known: Notify,
    /// The connection task's question to the socket before it closes an idle HTTP/1
    /// connection, answered by the socket's next read (`server::io::Peek`).
    pub(crate) peek: AtomicU8,
    /// The arrival path the connection is counted on, open until this is dropped; `None`
    /// when no coordinator counted it (`axum::serve`'s own hook).
    path: Option<(&'static Core, PathId)>,
    /// Its requests not yet handed in to the path's requests per second.
    tally: RequestTally,
}

impl Drop for ConnShared {
    fn drop(&mut self) {
        if let Some((core, path)) = self.path {
            let told = self.told.load(Ordering::Relaxed);
            // A fresh connection carries a request or a few; one that carried more was a
            // pool's, closed by its owner when idle: its opening was no arrival of a rate.
            let requests = self.requests.load(Ordering::Relaxed);
            let few = requests <= FRESH_REQUESTS;
            self.tally.close(core.observed().arrivals(), path, requests);
            core.observed()
                .connection_ended(path, self.accepted_at, told, few);
        }
    }
}

/// Facts about the connection a request arrived on: a process-unique id, when it was accepted,
/// the peer address, and the request's index on the connection.
///
/// axum handlers read it the same way under both serve functions, as `ConnectInfo<ConnMeta>`:
/// [`axum_serve`][axum-serve] always attaches it, [`serve`](crate::serve) with
/// [`Serve::connect_info`][connect-info] (and, for services that are not
/// axum routers, as a plain extension with
/// [`Serve::conn_meta_on_every_request`](crate::server::Serve::conn_meta_on_every_request):
/// `req.extensions().get::<ConnMeta>()`). Either costs every request an allocation, which
/// `serve` does not make unless asked: by default it attaches one only to requests that arrive
/// while draining, for the layer. Apps that keep `axum::serve` get it through
/// `ConnectInfo<ConnMeta>` too — but axum's hook cannot name a coordinator, so those
/// connections count in no arrival rate (see the [axum guide][axum-guide]):
///
#[cfg_attr(
    feature = "axum",
    doc = "[axum-serve]: crate::axum_serve\n[connect-info]: crate::server::Serve::connect_info\n[axum-guide]: crate::guide::axum"
)]
#[cfg_attr(
    not(feature = "axum"),
    doc = "[axum-serve]: crate#feature-flags\n[connect-info]: crate#feature-flags\n[axum-guide]: crate#feature-flags"
)]
///
/// ```no_run
/// # #[cfg(feature = "admin")] {
/// use axum::{extract::ConnectInfo, routing::get, Router};
/// use lameduck::ConnMeta;
///
/// async fn handler(ConnectInfo(conn): ConnectInfo<ConnMeta>) -> String {
///     format!("connection {} from {:?}", conn.id(), conn.peer())
/// }
///
/// # async fn run(drain: lameduck::Drain) -> std::io::Result<()> {
/// let app = Router::new().route("/", get(handler)).layer(drain.layer());
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
/// lameduck::serve(listener, app, &drain).connect_info().await;
/// # Ok(()) }
/// # }
/// ```
///
/// The [`DrainLayer`](crate::DrainLayer) reads it to count, after the drain starts, requests
/// on connections accepted after the drain (*new*) versus before it (*reused*: pooled
/// keep-alive connections say nothing about whether load balancers caught up).
///
/// Cloning is cheap (one reference count); the per-connection part is shared.
#[derive(Clone)]
pub struct ConnMeta {
    conn: Arc<ConnShared>,
    index: Option<u64>,
}

impl ConnMeta {
    /// Metadata for a connection `drain`'s server accepted now from `peer`, for custom accept
    /// loops: attach [`for_request`](Self::for_request) to each of its requests.
    ///
    /// The [hyper guide](crate::guide::hyper) shows a complete loop.
    ///
    /// Call it once per accepted connection: it counts the connection in `drain`'s arrival rate
    /// of new connections (one atomic operation), the evidence the default
    /// [`Propagation`](crate::Propagation) policy weighs silence by. Only `drain`'s: two
    /// coordinators in one process never see each other's connections.
    ///
    /// # Examples
    ///
    /// ```
    /// use lameduck::{ConnMeta, Drain};
    ///
    /// let drain = Drain::builder().build().unwrap();
    /// let conn = ConnMeta::accepted(&drain, Some("10.0.0.7:51234".parse().unwrap()));
    /// let first = conn.for_request(); // insert into the request's extensions
    /// let second = conn.for_request();
    /// assert_eq!((first.request_index(), second.request_index()), (Some(0), Some(1)));
    /// assert_eq!(first.id(), second.id());
    /// ```
    pub fn accepted(drain: &crate::drain::Drain, peer: Option<SocketAddr>) -> Self {
        let path = note_accepted(drain.core(), peer);
        Self::counted(peer, None, drain.core(), path)
    }

    /// Metadata for a connection counted by no coordinator (axum's `Connected` hook).
    #[cfg(feature = "axum")]
    pub(crate) fn new(peer: Option<SocketAddr>, accepted_while_draining: Option<bool>) -> Self {
        Self::with_path(peer, accepted_while_draining, None)
    }

    /// Metadata for a connection `core` counted open on `path` (by
    /// [`Observed::note_arrival`](crate::hot::observed::Observed::note_arrival)): open on it until
    /// the last copy is dropped.
    pub(crate) fn counted(
        peer: Option<SocketAddr>,
        accepted_while_draining: Option<bool>,
        core: &'static Core,
        path: PathId,
    ) -> Self {
        Self::with_path(peer, accepted_while_draining, Some((core, path)))
    }

    fn with_path(
        peer: Option<SocketAddr>,
        accepted_while_draining: Option<bool>,
        path: Option<(&'static Core, PathId)>,
    ) -> Self {
        Self {
            conn: Arc::new(ConnShared {
                // Relaxed: ids only need to be unique, not ordered with anything.
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                accepted_at: Instant::now(),
                peer,
                requests: AtomicU64::new(0),
                accepted_while_draining,
                recorded: AtomicBool::new(accepted_while_draining == Some(true)),
                told: AtomicBool::new(false),
                proto: AtomicU8::new(PROTO_UNKNOWN),
                proto_known: Notify::new(),
                peek: AtomicU8::new(0),
                path,
                tally: RequestTally::default(),
            }),
            index: None,
        }
    }

    /// The copy to attach to the connection's next request: counts the request and carries its
    /// index.
    ///
    /// On a connection counted by a coordinator ([`ConnMeta::accepted`]) it also counts the
    /// request in the propagation evidence, as `lameduck::serve` does: requests, not only new
    /// connections, say how often this process is picked (a pool sends many requests on few
    /// connections), so a custom accept loop that calls this once per request gives the
    /// estimator the same arrivals `serve` does. A clock read and one relaxed load, a write
    /// only for the first request of a 250 ms slot.
    pub fn for_request(&self) -> Self {
        let index = self.next_request_index();
        self.note_arrival(index);
        self.with_index(index)
    }

    /// Counts the request of index `index` in the propagation evidence, on the connection's
    /// path (nothing when no coordinator counted the connection).
    #[inline]
    pub(crate) fn note_arrival(&self, index: u64) {
        if let Some((core, path)) = self.conn.path {
            core.observed()
                .note_request_arrival(path, &self.conn.tally, index);
        }
    }

    /// Counts one more request on the connection; returns its index.
    #[inline]
    pub(crate) fn next_request_index(&self) -> u64 {
        // Relaxed: the count only needs to be unique per request on this connection.
        self.conn.requests.fetch_add(1, Ordering::Relaxed)
    }

    /// The copy for the request at `index`.
    pub(crate) fn with_index(&self, index: u64) -> Self {
        Self {
            conn: Arc::clone(&self.conn),
            index: Some(index),
        }
    }

    /// The connection's id, unique in this process.
    pub fn id(&self) -> u64 {
        self.conn.id
    }

    /// When the connection was accepted.
    pub fn accepted_at(&self) -> Instant {
        self.conn.accepted_at
    }

    /// The peer's address, when known.
    pub fn peer(&self) -> Option<SocketAddr> {
        self.conn.peer
    }

    /// This request's index on its connection (`0` for the first), when the value was attached
    /// per request ([`serve`](crate::serve), [`for_request`](Self::for_request)).
    ///
    /// `None` on the value `axum::serve` attaches through `ConnectInfo`: axum clones one value
    /// per connection into every request, and counting there would cost every request an
    /// extra lookup in the layer while Serving, which lameduck avoids. New-versus-reused
    /// accounting does not need it (it compares the accept time with the drain's start).
    pub fn request_index(&self) -> Option<u64> {
        self.index
    }

    /// Requests counted on this connection so far (by [`for_request`](Self::for_request)).
    pub fn requests(&self) -> u64 {
        self.conn.requests.load(Ordering::Relaxed)
    }

    /// `true` if the connection was accepted after the drain started, `false` if before;
    /// `false` too while the drain's start instant is not yet visible (a window of
    /// nanoseconds), so lameduck never claims "new" without knowing.
    pub(crate) fn is_new_since_drain(&self, core: &Core) -> bool {
        match self.conn.accepted_while_draining {
            Some(known) => known,
            None => core
                .observed()
                .drain_started()
                .is_some_and(|started| self.conn.accepted_at >= started),
        }
    }

    /// Marks the connection as counted in the after-flip report; `true` for the one caller
    /// that must count it.
    pub(crate) fn claim_record(&self) -> bool {
        // Relaxed: a once-flag; the counters it guards are themselves atomic.
        !self.conn.recorded.swap(true, Ordering::Relaxed)
    }

    pub(crate) fn proto(&self) -> u8 {
        self.conn.proto.load(Ordering::Relaxed)
    }

    pub(crate) fn set_proto(&self, proto: u8) {
        if self.conn.proto.swap(proto, Ordering::Relaxed) == PROTO_UNKNOWN {
            // notify_one keeps a permit if nobody waits yet, so the wake-up is never lost.
            self.conn.proto_known.notify_one();
        }
    }

    pub(crate) fn shared(&self) -> &ConnShared {
        &self.conn
    }

    /// The connection's shared state, owned: for the socket's wrapper.
    pub(crate) fn shared_arc(&self) -> Arc<ConnShared> {
        Arc::clone(&self.conn)
    }

    /// The connection, accepted before the drain, is told to close (its response says
    /// `Connection: close`, or a GOAWAY went out): counted once on its path, with how long
    /// after the drain's start, for the evidence of how fast the path's kept connections move.
    pub(crate) fn note_told(&self) {
        let Some((core, path)) = self.conn.path else {
            return;
        };
        let Some(start) = core.observed().drain_started() else {
            return;
        };
        if self.conn.accepted_at < start && !self.conn.told.swap(true, Ordering::Relaxed) {
            let kept = self.conn.requests.load(Ordering::Relaxed) > FRESH_REQUESTS;
            core.observed().connection_told(path, start, kept);
        }
    }

    /// The arrival path the connection is counted on ([`PathId::OTHER`] when none counted
    /// it).
    #[inline]
    pub(crate) fn path(&self) -> PathId {
        self.conn.path.map_or(PathId::OTHER, |(_, p)| p)
    }
}

impl fmt::Debug for ConnMeta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnMeta")
            .field("id", &self.conn.id)
            .field("peer", &self.conn.peer)
            .field("accepted_at", &self.conn.accepted_at)
            .field("request_index", &self.index)
            .finish()
    }
}

#[cfg(feature = "axum")]
impl
    axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, tokio::net::TcpListener>>
    for ConnMeta
{
    /// Called by axum once per accepted connection: the per-connection part is allocated here,
    /// and axum clones the value into each of the connection's requests.
    ///
    /// axum's hook cannot name a coordinator, so a connection made here is counted in no
    /// arrival rate: the layer still tells new connections from reused ones, but the
    /// propagation policy has no rate to weigh silence by (evidence `no_connection_data`).
    /// [`lameduck::axum_serve`](crate::axum_serve) makes its `ConnMeta` with its coordinator
    /// and counts them.
    fn connect_info(stream: axum::serve::IncomingStream<'_, tokio::net::TcpListener>) -> Self {
        ConnMeta::new(Some(*stream.remote_addr()), None)
    }
}

#[cfg(feature = "axum")]
impl axum::extract::connect_info::Connected<SocketAddr> for ConnMeta {
    /// Counted in no arrival rate, as for a `TcpListener` above.
    fn connect_info(peer: SocketAddr) -> Self {
        ConnMeta::new(Some(peer), None)
    }
}

/// A connection accepted by a server other than [`serve`](crate::serve) (`axum_serve`, a
/// custom loop): counts it in `core`'s arrival rate, observed from the coordinator's build on
/// (the server runs from then on, and slots before Serving are left out anyway).
pub(crate) fn note_accepted(core: &Core, peer: Option<SocketAddr>) -> PathId {
    core.observed().observe_arrivals_from_build();
    core.observed().note_arrival(peer.map(|p| p.ip()))
}
