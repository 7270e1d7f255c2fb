//! What the HTTP side (`lameduck::serve`'s accept loop and connections, the drain layer)
//! writes into [`Observed`]: connections opened and closed, arrivals, requests and what came
//! after the drain started.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::time::Instant;

use super::{second_tag, slot_of, Arrivals, Observed, PathId};
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

/// A connection's requests not yet handed in to its path's counts, as `tag << 32 | index`:
/// the second (see [`second_tag`](super::second_tag)) and the index of its first request in that second. Its
/// connection's requests are noted one at a time (HTTP/1) or from its one connection task
/// (HTTP/2), so only one writer touches it.
///
/// Per request, one relaxed load and a compare; once a second, the requests of the second
/// before are added to the path's count of it ([`Arrivals::count_requests`]).
#[derive(Debug, Default)]
pub(crate) struct RequestTally(AtomicU64);

impl RequestTally {
    /// Notes the request of index `index` (the connection's requests before it), in `slot`.
    #[inline]
    pub(crate) fn note(&self, arrivals: &Arrivals, path: PathId, slot: u64, index: u64) {
        let tag = second_tag(slot);
        let mark = self.0.load(Ordering::Relaxed);
        if (mark >> 32) as u32 != tag {
            self.hand_in(arrivals, path, mark, (tag, index));
        }
    }

    /// The first request of a new second: hands in the requests of the second before.
    #[cold]
    #[inline(never)]
    fn hand_in(&self, arrivals: &Arrivals, path: PathId, mark: u64, (tag, index): (u32, u64)) {
        Self::add(arrivals, path, mark, index);
        self.0.store(
            u64::from(tag) << 32 | u64::from(index as u32),
            Ordering::Relaxed,
        );
    }

    /// The connection closed after `requests` requests: hands in what is left.
    pub(crate) fn close(&self, arrivals: &Arrivals, path: PathId, requests: u64) {
        Self::add(arrivals, path, self.0.load(Ordering::Relaxed), requests);
    }

    /// Adds the requests from the mark's index up to `end` to the mark's second.
    fn add(arrivals: &Arrivals, path: PathId, mark: u64, end: u64) {
        let (held, n) = ((mark >> 32) as u32, (end as u32).wrapping_sub(mark as u32));
        if held != 0 && n != 0 {
            arrivals.count_requests(path, held, n);
        }
    }
}
