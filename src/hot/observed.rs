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
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::vocab::sync::MutexExt;

mod arrivals;
#[cfg(feature = "http")]
mod http;
#[cfg(feature = "http")]
pub(crate) use http::RequestTally;

#[cfg(test)]
pub(crate) use arrivals::PATHS;
#[cfg(all(test, feature = "http"))]
pub(crate) use arrivals::SECONDS;
pub(crate) use arrivals::{second_tag, slot_of, Arrivals, PathId, RING, SLOT, SLOTS_PER_SECOND};

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
    paths: Mutex<crate::hot::path_counts::PathCounts>,
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
    /// connection was accepted before or after the drain. The same block with or without the
    /// HTTP side: only its reader is compiled with it.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    drain_started: AtomicU64,
    connections: AtomicUsize,
    after_flip: AfterFlip,
    /// Which recent slots saw a new connection, while Serving too: the propagation evidence.
    arrivals: Arrivals,
    /// The move to Serving; 0 = not yet.
    serving_since: AtomicU64,
    /// Connections whose response bytes wait for a slow peer (`lameduck::serve`).
    stalls: crate::hot::stall::Stalls,
}

impl Observed {
    pub(crate) fn new() -> Self {
        Self {
            base: Instant::now(),
            last_activity: AtomicU64::new(0),
            drain_started: AtomicU64::new(0),
            connections: AtomicUsize::new(0),
            after_flip: AfterFlip::default(),
            arrivals: Arrivals::new(),
            serving_since: AtomicU64::new(0),
            stalls: crate::hot::stall::Stalls::default(),
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
    pub(crate) fn stalls(&self) -> &crate::hot::stall::Stalls {
        &self.stalls
    }

    /// Open connections (of `lameduck::serve` and `ConnMeta`).
    pub(crate) fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
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
        // The rows the drain's evidence reads keep their owners from now on.
        self.arrivals.freeze();
        // Release, before the flag is set: a reader that Acquire-loads a non-zero stamp sees a
        // consistent instant. Readers that learned about the drain from the flag alone may
        // still see 0 for a moment and must treat that as "unknown".
        self.drain_started
            .store(self.stamp(Instant::now()), Ordering::Release);
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
