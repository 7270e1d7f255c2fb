//! What a drain observes beside the in-flight count: the arrival ring (the propagation
//! evidence), activity timestamps, the counts of what arrived after the drain started, open
//! connections, and the connections stalled on a slow reader.
//!
//! # Invariants
//!
//! * One [`Observed`] per coordinator, inside the leaked `Core` (`guard.rs`), written through
//!   its methods only; readers above (the evidence, the report, the driver) read through
//!   methods too. It depends on nothing above it.
//! * While Serving, only the arrival ring and the connection count are written (one relaxed
//!   atomic operation per connection; per request a clock read and one relaxed load, see
//!   [`Observed::note_request_arrival`]); the after-drain counters and activity timestamps
//!   are written only once draining.
//! * Timestamps are nanoseconds since `base` + 1 in an `AtomicU64`, 0 meaning "none", written
//!   with `fetch_max` so they stay monotonic across threads.

use std::collections::HashMap;
use std::net::IpAddr;
#[cfg(feature = "http")]
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::sync::MutexExt;

mod arrivals;

pub(crate) use arrivals::{slot_of, Arrivals, PathId, RING, SLOT};

/// Counters of what arrived after the drain started (the readiness flip under the default
/// policy): the observed propagation.
#[derive(Debug, Default)]
struct AfterFlip {
    new_connections: AtomicU64,
    requests_on_new: AtomicU64,
    requests_on_reused: AtomicU64,
    /// Nanoseconds since `Observed::base` + 1 of the last new connection; 0 = none.
    last_new_connection: AtomicU64,
    peers: Mutex<HashMap<IpAddr, u64>>,
    /// Requests by traffic-path label (`x-traffic-path`), the most frequent kept.
    paths: Mutex<crate::path_counts::PathCounts>,
}

/// The counts of what arrived after the drain started, as read at one moment.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct AfterFlipCounts {
    pub(crate) new_connections: u64,
    pub(crate) requests_on_new: u64,
    pub(crate) requests_on_reused: u64,
    /// The last new connection, if any.
    pub(crate) last_new_connection: Option<Instant>,
}

/// See the [module docs](self).
#[derive(Debug)]
pub(crate) struct Observed {
    base: Instant,
    /// The last new request or connection while draining.
    last_activity: AtomicU64,
    /// The drain start; 0 = not draining. Lets the HTTP layer tell, without a lock, whether a
    /// connection was accepted before or after the drain.
    #[cfg(feature = "http")]
    drain_started: AtomicU64,
    connections: AtomicUsize,
    after_flip: AfterFlip,
    /// Which recent slots saw a new connection, while Serving too: the propagation evidence.
    arrivals: Arrivals,
    /// The move to Serving; 0 = not yet.
    serving_since: AtomicU64,
    /// Connections whose response bytes wait for a slow peer (`lameduck::serve`).
    stalls: crate::stall::Stalls,
}

impl Observed {
    pub(crate) fn new() -> Self {
        Self {
            base: Instant::now(),
            last_activity: AtomicU64::new(0),
            #[cfg(feature = "http")]
            drain_started: AtomicU64::new(0),
            connections: AtomicUsize::new(0),
            after_flip: AfterFlip::default(),
            arrivals: Arrivals::new(),
            serving_since: AtomicU64::new(0),
            stalls: crate::stall::Stalls::default(),
        }
    }

    /// The instant slots and timestamps count from.
    pub(crate) fn base(&self) -> Instant {
        self.base
    }

    /// The arrival ring, for the evidence to read.
    pub(crate) fn arrivals(&self) -> &Arrivals {
        &self.arrivals
    }

    /// The connections stalled on a slow reader.
    pub(crate) fn stalls(&self) -> &crate::stall::Stalls {
        &self.stalls
    }

    /// Open connections (of `lameduck::serve` and `ConnMeta`).
    pub(crate) fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    /// A connection opened.
    #[cfg(feature = "http")]
    #[inline]
    pub(crate) fn connection_opened(&self) {
        self.connections.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection closed.
    #[cfg(feature = "http")]
    #[inline]
    pub(crate) fn connection_closed(&self) {
        self.connections.fetch_sub(1, Ordering::Relaxed);
    }

    /// Counts a new connection from `peer` in its path's arrival ring (Serving or not) and
    /// returns the path, for the connection to count its requests on: a few relaxed atomic
    /// operations, once per connection, never per request.
    #[inline]
    #[cfg(feature = "http")]
    pub(crate) fn note_arrival(&self, peer: Option<IpAddr>) -> PathId {
        let path = self.arrivals.path_of(peer);
        self.arrivals
            .record(path, slot_of(self.base, Instant::now()));
        path
    }

    /// A connection of `path` accepted at `accepted` closed: no longer open on it; when it
    /// closed while Serving after `few` requests, a fresh connection in its slot; when it was
    /// open at the drain's start and not `told` to close, one that left by itself.
    #[cfg(feature = "http")]
    pub(crate) fn connection_ended(&self, path: PathId, accepted: Instant, told: bool, few: bool) {
        self.arrivals.closed(path);
        match self.drain_started() {
            None if few => self
                .arrivals
                .closed_fresh(path, slot_of(self.base, accepted)),
            None => {}
            Some(start) if accepted < start && !told => self.arrivals.left(path),
            Some(_) => {}
        }
    }

    /// A connection of `path` open at the drain's start (`start`) was told to close now.
    #[cfg(feature = "http")]
    pub(crate) fn connection_told(&self, path: PathId, start: Instant) {
        self.arrivals
            .told(path, Instant::now().saturating_duration_since(start));
    }

    /// Counts a request of `path` in the arrival ring: the clock read, and one relaxed load
    /// of the ring entry of the slot (a write only for the first request of a slot).
    #[inline]
    #[cfg(feature = "http")] // `serve`'s and `axum::serve`'s per-connection service only
    pub(crate) fn note_request_arrival(&self, path: PathId) {
        let slot = slot_of(self.base, Instant::now());
        self.arrivals.note_request(path, slot);
    }

    /// Connection data is counted from now on (the accept loop starts).
    #[cfg(feature = "http")] // called by the accept loop
    pub(crate) fn observe_arrivals(&self) {
        self.arrivals.observe_from(self.stamp(Instant::now()));
    }

    /// Connection data is counted from the coordinator's build (a server other than `serve`,
    /// which runs from then on; slots before Serving are left out anyway).
    #[cfg(feature = "http")]
    pub(crate) fn observe_arrivals_from_build(&self) {
        self.arrivals.observe_from(1);
    }

    /// The phase moved to Serving: slots before it say nothing about routing.
    pub(crate) fn mark_serving(&self) {
        let _ = self.serving_since.compare_exchange(
            0,
            self.stamp(Instant::now()),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    pub(crate) fn serving_since(&self) -> Option<Instant> {
        self.unstamp(self.serving_since.load(Ordering::Relaxed))
    }

    /// The last new connection counted while draining.
    pub(crate) fn last_new_connection(&self) -> Option<Instant> {
        self.unstamp(self.after_flip.last_new_connection.load(Ordering::Relaxed))
    }

    fn stamp(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.base).as_nanos() as u64 + 1
    }

    fn unstamp(&self, v: u64) -> Option<Instant> {
        (v != 0).then(|| self.base + Duration::from_nanos(v - 1))
    }

    /// [`record_activity`](Self::record_activity) for a request that arrived while draining,
    /// out of line (the HTTP layer's cold path).
    #[cfg(feature = "http")] // the `http` feature's layer only
    #[cold]
    #[inline(never)]
    pub(crate) fn note_request_activity(&self) {
        self.record_activity();
    }

    pub(crate) fn record_activity(&self) {
        let now = self.stamp(Instant::now());
        // Relaxed: a timestamp read by the propagation policy, which tolerates staleness of a
        // few nanoseconds; fetch_max keeps it monotonic across threads.
        self.last_activity.fetch_max(now, Ordering::Relaxed);
    }

    pub(crate) fn last_activity(&self) -> Option<Instant> {
        self.unstamp(self.last_activity.load(Ordering::Relaxed))
    }

    /// Stamps the drain's start, before the counter's draining flag is set.
    pub(crate) fn mark_drain_started(&self) {
        // Release, before the flag is set: a reader that Acquire-loads a non-zero stamp sees a
        // consistent instant. Readers that learned about the drain from the flag alone may
        // still see 0 for a moment and must treat that as "unknown".
        #[cfg(feature = "http")]
        self.drain_started
            .store(self.stamp(Instant::now()), Ordering::Release);
    }

    /// When the drain started, once the stamp is visible (see `mark_drain_started`).
    #[cfg(feature = "http")] // the `http` feature's accept loop and layer only
    pub(crate) fn drain_started(&self) -> Option<Instant> {
        self.unstamp(self.drain_started.load(Ordering::Acquire))
    }

    /// A new connection accepted while draining.
    #[cfg(feature = "http")] // called by the accept loop
    pub(crate) fn note_connection(&self, peer: Option<SocketAddr>, path: PathId) {
        let now = self.stamp(Instant::now());
        self.arrivals.after_drain(path, now);
        self.last_activity.fetch_max(now, Ordering::Relaxed);
        let af = &self.after_flip;
        af.new_connections.fetch_add(1, Ordering::Relaxed);
        af.last_new_connection.fetch_max(now, Ordering::Relaxed);
        if let Some(peer) = peer {
            *af.peers.locked().entry(peer.ip()).or_insert(0) += 1;
        }
    }

    /// A request that arrived while draining, on a new or a reused connection.
    #[cfg(feature = "http")] // called by the HTTP layer
    pub(crate) fn note_request(&self, on_new_connection: bool) {
        let c = if on_new_connection {
            &self.after_flip.requests_on_new
        } else {
            &self.after_flip.requests_on_reused
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// A request that arrived while draining carried this traffic-path label. Only while
    /// draining (the layer's cold path), so a short lock is fine.
    #[cfg(feature = "http")] // the `http` feature's accept loop and layer only
    pub(crate) fn note_path(&self, label: &[u8], on_new_connection: bool) {
        self.after_flip
            .paths
            .locked()
            .note(label, on_new_connection);
    }

    /// The after-drain counts now. Relaxed: plain statistics.
    pub(crate) fn after_flip(&self) -> AfterFlipCounts {
        let af = &self.after_flip;
        AfterFlipCounts {
            new_connections: af.new_connections.load(Ordering::Relaxed),
            requests_on_new: af.requests_on_new.load(Ordering::Relaxed),
            requests_on_reused: af.requests_on_reused.load(Ordering::Relaxed),
            last_new_connection: self.last_new_connection(),
        }
    }

    /// New connections after the drain started, per peer address.
    pub(crate) fn peers(&self) -> Vec<(IpAddr, u64)> {
        self.after_flip
            .peers
            .locked()
            .iter()
            .map(|(ip, n)| (*ip, *n))
            .collect()
    }

    /// Requests after the drain started by traffic-path label: `(label, on new, on reused)`.
    pub(crate) fn paths(&self) -> Vec<(String, u64, u64)> {
        self.after_flip.paths.locked().counts()
    }

    /// Frees the per-peer and per-path counts once the report holds them.
    pub(crate) fn release(&self) {
        drop(std::mem::take(&mut *self.after_flip.peers.locked()));
        drop(std::mem::take(&mut *self.after_flip.paths.locked()));
    }
}
