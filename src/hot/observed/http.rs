//! What the HTTP side (`lameduck::serve`'s accept loop and connections, the drain layer)
//! writes into [`Observed`]: connections opened and closed, arrivals, requests and what came
//! after the drain started.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::{slot_of, Observed, PathId, RequestTally};
use crate::vocab::sync::MutexExt;

impl Observed {
    /// A connection opened.
    #[inline]
    pub(crate) fn connection_opened(&self) {
        self.connections.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection closed.
    #[inline]
    pub(crate) fn connection_closed(&self) {
        self.connections.fetch_sub(1, Ordering::Relaxed);
    }

    /// Counts a new connection from `peer` in its path's arrival ring (Serving or not) and
    /// returns the path, for the connection to count its requests on: open on it until
    /// [`connection_ended`](Self::connection_ended). A few relaxed atomic operations and a
    /// compare-exchange, once per connection, never per request.
    #[inline]
    pub(crate) fn note_arrival(&self, peer: Option<IpAddr>) -> PathId {
        self.arrivals.open(peer, slot_of(self.base, Instant::now()))
    }

    /// A connection of `path` accepted at `accepted` closed: no longer open on it; when it
    /// closed while Serving after `few` requests, a fresh connection in its slot; when it was
    /// open at the drain's start and not `told` to close, one that left by itself.
    pub(crate) fn connection_ended(&self, path: PathId, accepted: Instant, told: bool, few: bool) {
        match self.drain_started() {
            None if few => self
                .arrivals
                .closed_fresh(path, slot_of(self.base, accepted)),
            None => {}
            Some(start) if accepted < start && !told => {
                self.arrivals.left(path);
                if !few {
                    self.arrivals.kept(path);
                }
            }
            Some(_) => {}
        }
        // Last: the row may go to another peer once nothing is open on it.
        self.arrivals.closed(path);
    }

    /// A connection of `path` open at the drain's start (`start`) was told to close now,
    /// having carried more requests than a fresh connection does when `kept`.
    pub(crate) fn connection_told(&self, path: PathId, start: Instant, kept: bool) {
        self.arrivals
            .told(path, Instant::now().saturating_duration_since(start));
        if kept {
            self.arrivals.kept(path);
        }
    }

    /// Counts the request of index `index` on its connection (whose `tally` it is) on `path`:
    /// in the arrival ring, the clock read and one relaxed load of the slot's entry (a write
    /// only for the first request of a slot); in the path's requests per second, one relaxed
    /// load of the tally (a hand-in once a second).
    #[inline]
    // `serve`'s per-connection service and `ConnMeta::for_request` only
    pub(crate) fn note_request_arrival(&self, path: PathId, tally: &RequestTally, index: u64) {
        let slot = slot_of(self.base, Instant::now());
        self.arrivals.note_request(path, slot);
        tally.note(&self.arrivals, path, slot, index);
    }

    /// Connection data is counted from now on (the accept loop starts).
    // called by the accept loop
    pub(crate) fn observe_arrivals(&self) {
        self.arrivals.observe_from(self.stamp(Instant::now()));
    }

    /// Connection data is counted from the coordinator's build (a server other than `serve`,
    /// which runs from then on; slots before Serving are left out anyway).
    pub(crate) fn observe_arrivals_from_build(&self) {
        self.arrivals.observe_from(1);
    }

    /// [`record_activity`](Self::record_activity) for a request that arrived while draining,
    /// out of line (the HTTP layer's cold path).
    // the `http` feature's layer only
    #[cold]
    #[inline(never)]
    pub(crate) fn note_request_activity(&self) {
        self.record_activity();
    }

    /// When the drain started, once the stamp is visible (see `mark_drain_started`).
    // the `http` feature's accept loop and layer only
    pub(crate) fn drain_started(&self) -> Option<Instant> {
        self.unstamp(self.drain_started.load(Ordering::Acquire))
    }

    /// A new connection accepted while draining.
    // called by the accept loop
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
    // called by the HTTP layer
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
    // the `http` feature's accept loop and layer only
    pub(crate) fn note_path(&self, label: &[u8], on_new_connection: bool) {
        self.after_flip
            .paths
            .locked()
            .note(label, on_new_connection);
    }
}
