//! The per-coordinator hot-path block and the in-flight guard.
//!
//! # Invariants
//!
//! * [`Core`] is allocated once per [`Drain`](crate::Drain) and leaked, so an
//!   [`InFlightGuard`] is a plain `&'static` reference: taking and releasing one is exactly one
//!   atomic read-modify-write each (the counter), with no reference count to bump. A process
//!   builds one coordinator, so the leak is one small fixed block for the life of the process;
//!   what a drain accumulates in it (peer and path counts, the registry) is freed at Done.
//! * While Serving nothing but the counter is touched. Activity timestamps, after-drain
//!   connection counters and the straggler registry are written only once the counter's
//!   draining flag is set, which `enter` learns from the value its own `fetch_add` returned.
//! * Wake-ups: the 1→0 transition while draining (or the flag set at zero) calls
//!   `Notify::notify_waiters`; waiters enable their `Notified` before checking the count, so a
//!   wake-up between the check and the sleep is never lost (see `counter.rs` for the model).

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::counter::Counter;
use crate::evidence::Arrivals;

/// What is known about a request that is in flight while draining, for the straggler list.
#[derive(Clone, Debug)]
pub(crate) struct RequestInfo {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) peer: Option<SocketAddr>,
    /// When the request started, if known; `None` for requests that entered before the drain
    /// and were described later (their age is then at least the drain's age).
    pub(crate) started: Option<Instant>,
}

#[derive(Debug, Default)]
struct Registry {
    slots: Vec<Option<RequestInfo>>,
    free: Vec<u32>,
}

/// Counters of what arrived after the drain started (the readiness flip under the default
/// policy): the observed propagation.
#[derive(Debug, Default)]
pub(crate) struct AfterFlip {
    pub(crate) new_connections: AtomicU64,
    pub(crate) requests_on_new: AtomicU64,
    pub(crate) requests_on_reused: AtomicU64,
    /// Nanoseconds since `Core::base` + 1 of the last new connection; 0 = none.
    pub(crate) last_new_connection: AtomicU64,
    pub(crate) peers: Mutex<HashMap<IpAddr, u64>>,
    /// Requests by traffic-path label (`x-traffic-path`): (label, on new, on reused), at most
    /// [`MAX_PATHS`] labels in arrival order, then `other`.
    pub(crate) paths: Mutex<Vec<(String, u64, u64)>>,
}

/// Distinct traffic-path labels kept; later ones count as `other`, so a client cannot grow
/// the report.
#[cfg(feature = "http")]
pub(crate) const MAX_PATHS: usize = 16;
/// Longest label kept; a longer one counts as `other`.
#[cfg(feature = "http")]
const MAX_PATH_LABEL: usize = 64;

/// The hot-path block, leaked once per coordinator (`size_of::<Core>()` is checked below).
#[derive(Debug)]
pub(crate) struct Core {
    pub(crate) counter: Counter,
    zero: Notify,
    pub(crate) base: Instant,
    /// Nanoseconds since `base` + 1 of the last new request or connection while draining;
    /// 0 = none yet.
    last_activity: AtomicU64,
    /// Nanoseconds since `base` + 1 of the drain start; 0 = not draining. Lets the HTTP layer
    /// tell, without a lock, whether a connection was accepted before or after the drain.
    #[cfg(feature = "http")]
    drain_started: AtomicU64,
    pub(crate) connections: AtomicUsize,
    pub(crate) after_flip: AfterFlip,
    /// Which recent slots saw a new connection, while Serving too: the propagation evidence.
    pub(crate) arrivals: Arrivals,
    /// Nanoseconds since `base` + 1 of the move to Serving; 0 = not yet.
    serving_since: AtomicU64,
    requests: Mutex<Registry>,
    /// Connections whose response bytes wait for a slow peer (`lameduck::serve`).
    pub(crate) stalls: crate::stall::Stalls,
}

const NO_SLOT: u32 = u32::MAX;

impl Core {
    pub(crate) fn leak() -> &'static Core {
        Box::leak(Box::new(Core {
            counter: Counter::new(),
            zero: Notify::new(),
            base: Instant::now(),
            last_activity: AtomicU64::new(0),
            #[cfg(feature = "http")]
            drain_started: AtomicU64::new(0),
            connections: AtomicUsize::new(0),
            after_flip: AfterFlip::default(),
            arrivals: Arrivals::new(),
            serving_since: AtomicU64::new(0),
            requests: Mutex::new(Registry::default()),
            stalls: crate::stall::Stalls::default(),
        }))
    }

    /// Frees what a drain accumulated (per-peer connection counts, traffic-path counts, the
    /// straggler registry) once the report holds it: the block itself is leaked, so its growth
    /// must not be. Called when the drain reaches Done; a guard described before that and
    /// dropped after finds its slot gone, which is harmless.
    pub(crate) fn release_drain_state(&self) {
        drop(std::mem::take(
            &mut *self
                .after_flip
                .peers
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        ));
        drop(std::mem::take(
            &mut *self
                .after_flip
                .paths
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        ));
        drop(std::mem::take(
            &mut *self.requests.lock().unwrap_or_else(|e| e.into_inner()),
        ));
    }

    /// Counts a new connection in the arrival ring (Serving or not): one relaxed atomic
    /// operation, once per connection, never per request.
    #[inline]
    pub(crate) fn note_arrival(&self) {
        let slot = Instant::now()
            .saturating_duration_since(self.base)
            .as_nanos()
            / crate::evidence::SLOT.as_nanos();
        self.arrivals.record(slot as u64);
    }

    /// Connection data is counted from now on (the accept loop starts).
    #[cfg_attr(not(feature = "http"), allow(dead_code))] // called by the accept loop of the `http` feature
    pub(crate) fn observe_arrivals(&self) {
        self.arrivals.observe_from(self.stamp(Instant::now()));
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

    pub(crate) fn unstamp(&self, v: u64) -> Option<Instant> {
        (v != 0).then(|| self.base + Duration::from_nanos(v - 1))
    }

    /// Takes a guard. Returns it with `true` if the drain has started.
    #[inline]
    pub(crate) fn enter(&'static self) -> (InFlightGuard, bool) {
        let draining = self.counter.enter();
        if draining {
            self.record_activity();
        }
        (
            InFlightGuard {
                core: self,
                slot: NO_SLOT,
                #[cfg(feature = "http")]
                tag: 0,
            },
            draining,
        )
    }

    /// Takes a guard that is not an arrival: no activity is recorded for the propagation
    /// policy (a response waiting for its reader, a connection being polled).
    #[inline]
    #[cfg(feature = "http")] // the `http` feature's accept loop and layer only
    pub(crate) fn hold(&'static self) -> InFlightGuard {
        self.counter.enter();
        InFlightGuard {
            core: self,
            slot: NO_SLOT,
            tag: 0,
        }
    }

    /// Takes a guard without the draining-time bookkeeping: the caller learns whether the drain
    /// has started and, if so, must call [`record_activity`](Self::record_activity) itself (the
    /// HTTP layer does it out of line, to keep its inlined path small).
    #[inline]
    #[cfg(feature = "http")] // the `http` feature's accept loop and layer only
    pub(crate) fn enter_tagged(&'static self, tag: u32) -> (InFlightGuard, bool) {
        let draining = self.counter.enter();
        (
            InFlightGuard {
                core: self,
                slot: NO_SLOT,
                tag,
            },
            draining,
        )
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

    /// When the drain started, once the stamp is visible (see `start_draining`).
    #[cfg(feature = "http")] // the `http` feature's accept loop and layer only
    pub(crate) fn drain_started(&self) -> Option<Instant> {
        self.unstamp(self.drain_started.load(Ordering::Acquire))
    }

    /// A new connection accepted while draining.
    #[cfg_attr(not(feature = "http"), allow(dead_code))] // called by the accept loop of the `http` feature
    pub(crate) fn note_connection(&self, peer: Option<SocketAddr>) {
        let now = self.stamp(Instant::now());
        self.last_activity.fetch_max(now, Ordering::Relaxed);
        let af = &self.after_flip;
        af.new_connections.fetch_add(1, Ordering::Relaxed);
        af.last_new_connection.fetch_max(now, Ordering::Relaxed);
        if let Some(peer) = peer {
            *af.peers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(peer.ip())
                .or_insert(0) += 1;
        }
    }

    /// A request that arrived while draining, on a new or a reused connection.
    #[cfg_attr(not(feature = "http"), allow(dead_code))] // called by the HTTP layer of the `http` feature
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
        let label = std::str::from_utf8(label)
            .ok()
            .map(str::trim)
            .filter(|l| !l.is_empty() && l.len() <= MAX_PATH_LABEL && l != &"other");
        let mut paths = self
            .after_flip
            .paths
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let key = match label {
            Some(l) if paths.iter().any(|(k, _, _)| k == l) => l,
            Some(l) if paths.iter().filter(|(k, _, _)| k != "other").count() < MAX_PATHS => {
                paths.push((l.to_owned(), 0, 0));
                l
            }
            _ => {
                if !paths.iter().any(|(k, _, _)| k == "other") {
                    paths.push(("other".to_owned(), 0, 0));
                }
                "other"
            }
        };
        if let Some(entry) = paths.iter_mut().find(|(k, _, _)| k == key) {
            if on_new_connection {
                entry.1 += 1;
            } else {
                entry.2 += 1;
            }
        }
    }

    pub(crate) fn wake_zero(&self) {
        self.zero.notify_waiters();
    }

    /// Sets the draining flag and wakes waiters if nothing is in flight.
    pub(crate) fn start_draining(&self) {
        // Release, before the flag is set: a reader that Acquire-loads a non-zero stamp sees a
        // consistent instant. Readers that learned about the drain from the flag alone may
        // still see 0 for a moment and must treat that as "unknown".
        #[cfg(feature = "http")]
        self.drain_started
            .store(self.stamp(Instant::now()), Ordering::Release);
        if self.counter.start_draining() {
            self.wake_zero();
        }
    }

    /// Resolves once draining with nothing in flight. Event-driven: no polling.
    pub(crate) async fn wait_zero(&self) {
        loop {
            let notified = self.zero.notified();
            tokio::pin!(notified);
            // Enable first, then check: a wake-up between the check and the await is kept.
            notified.as_mut().enable();
            if self.counter.is_drained() {
                return;
            }
            notified.await;
        }
    }

    /// The requests registered as in flight while draining.
    pub(crate) fn registered_requests(&self) -> Vec<RequestInfo> {
        let reg = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        reg.slots.iter().flatten().cloned().collect()
    }

    /// Registers a request for the straggler list; its guard adopts the slot with
    /// [`InFlightGuard::adopt`]. Only called while draining.
    #[cfg(feature = "http")] // the `http` feature's accept loop and layer only
    pub(crate) fn register_request(&self, info: RequestInfo) -> RequestSlot {
        RequestSlot(self.register(info))
    }

    #[cfg(feature = "http")] // the `http` feature's accept loop and layer only
    fn register(&self, info: RequestInfo) -> u32 {
        let mut reg = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = reg.free.pop() {
            reg.slots[i as usize] = Some(info);
            i
        } else {
            reg.slots.push(Some(info));
            (reg.slots.len() - 1) as u32
        }
    }

    fn unregister(&self, slot: u32) {
        let mut reg = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = reg.slots.get_mut(slot as usize) {
            *s = None;
            reg.free.push(slot);
        }
    }
}

/// A request's place in the straggler registry, or none.
#[cfg(feature = "http")] // the `http` feature's accept loop and layer only
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RequestSlot(u32);

#[cfg(feature = "http")]
impl RequestSlot {
    /// Not registered.
    pub(crate) const NONE: RequestSlot = RequestSlot(NO_SLOT);
}

/// Counts one unit of in-flight work for as long as it lives.
///
/// Taken with [`Drain::enter`](crate::Drain::enter) (the HTTP layer takes one per request and
/// moves it into the response body). Dropping it — normally, by panic unwinding, or by dropping
/// the future that held it — releases it. Taking and releasing a guard is one atomic operation
/// each; no lock, no allocation.
///
/// Not `Clone`: a clone would count the same work twice or release it early.
#[must_use = "the work counts as in flight only while the guard lives"]
pub struct InFlightGuard {
    core: &'static Core,
    slot: u32,
    /// Free bits in what would otherwise be padding, for the HTTP layer: the request's HTTP
    /// version class and its layer's options (see `http::service`). Keeping them here keeps
    /// the layer's response future and body at the inner ones + 16 bytes.
    #[cfg(feature = "http")]
    pub(crate) tag: u32,
}

impl InFlightGuard {
    /// Registers what this guard counts, for the straggler list. Only called while draining.
    #[cfg(feature = "http")] // the `http` feature's accept loop and layer only
    pub(crate) fn describe(&mut self, info: RequestInfo) {
        if self.slot == NO_SLOT {
            self.slot = self.core.register(info);
        }
    }

    /// Takes over a slot registered by [`Core::register_request`] for the request this guard
    /// counts, so that the guard's drop unregisters it. A guard already described keeps its own
    /// slot and the new one is released at once.
    #[cfg(feature = "http")] // the `http` feature's accept loop and layer only
    #[cold]
    #[inline(never)]
    pub(crate) fn adopt(&mut self, slot: RequestSlot) {
        if slot == RequestSlot::NONE {
            return;
        }
        if self.slot == NO_SLOT {
            self.slot = slot.0;
        } else {
            self.core.unregister(slot.0);
        }
    }

    /// `true` once [`describe`](Self::describe) registered this guard.
    #[cfg(feature = "http")] // the `http` feature's accept loop and layer only
    pub(crate) fn is_described(&self) -> bool {
        self.slot != NO_SLOT
    }

    #[cfg(feature = "http")] // the `http` feature's accept loop and layer only
    pub(crate) fn core(&self) -> &'static Core {
        self.core
    }
}

impl fmt::Debug for InFlightGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightGuard")
            .field("in_flight", &self.core.counter.count())
            .finish()
    }
}

impl Drop for InFlightGuard {
    #[inline]
    fn drop(&mut self) {
        if self.slot != NO_SLOT {
            // Unregister before leaving, so whoever sees zero sees an empty registry.
            self.core.unregister(self.slot);
        }
        if self.core.counter.leave() {
            self.core.wake_zero();
        }
    }
}

#[cfg(all(test, not(lameduck_loom)))]
mod tests {
    use super::*;

    #[test]
    fn the_leaked_block_is_small() {
        // `DrainBuilder::build` documents the leak's size; keep it honest.
        let size = std::mem::size_of::<Core>();
        assert!(size <= 2048, "Core is {size} bytes");
    }

    #[cfg(feature = "http")] // describes a guard, as the HTTP layer does
    #[tokio::test]
    async fn done_frees_what_the_drain_accumulated() {
        let core = Core::leak();
        core.start_draining();
        core.note_connection(Some("127.0.0.1:1".parse().unwrap()));
        core.note_path(b"ingress", true);
        let (mut guard, draining) = core.enter();
        assert!(draining);
        guard.describe(RequestInfo {
            method: "GET".into(),
            path: "/".into(),
            peer: None,
            started: None,
        });
        assert_eq!(core.registered_requests().len(), 1);
        core.release_drain_state();
        assert!(core.after_flip.peers.lock().unwrap().is_empty());
        assert!(core.after_flip.paths.lock().unwrap().is_empty());
        assert!(core.registered_requests().is_empty());
        // The described guard's slot is gone; dropping it only leaves the counter.
        drop(guard);
        assert_eq!(core.counter.count(), 0);
        assert_eq!(
            core.after_flip.new_connections.load(Ordering::Relaxed),
            1,
            "the counters the report reads stay"
        );
    }
}
