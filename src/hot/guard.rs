//! The per-coordinator hot-path block and the in-flight guard.
//!
//! # Invariants
//!
//! * [`Core`] is allocated once per [`Drain`](crate::Drain) and leaked, and so is every
//!   [`Site`]: an [`InFlightGuard`] is one `&'static Site` (8 bytes), so taking and releasing one
//!   is exactly one atomic read-modify-write each (the counter), with no reference count to
//!   bump. A process builds one coordinator, so the leak is a few small fixed blocks for the
//!   life of the process; what a drain accumulates in them (peer and path counts, the
//!   registry's entries) is freed at Done.
//! * A site says where its guards count (the core) and, for the HTTP layer, what the layer
//!   needs to know about the request once draining (its tag: HTTP version class and options).
//!   Plain sites are fixed: one per core, two per layer. An *entry* site stands for one entry
//!   of the straggler registry and belongs to one described guard at a time: it is handed out
//!   while draining, and back on the free list when that guard drops. Entry sites are reused,
//!   so their number is the most requests ever described at once, not the number described.
//! * While Serving nothing but the counter is touched. Activity timestamps, after-drain
//!   connection counters and the straggler registry are written only once the counter's
//!   draining flag is set, which `enter` learns from the value its own `fetch_add` returned.
//! * Wake-ups: the 1→0 transition while draining (or the flag set at zero) calls
//!   `Notify::notify_waiters`; waiters enable their `Notified` before checking the count, so a
//!   wake-up between the check and the sleep is never lost (see `counter.rs` for the model).

use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

use tokio::sync::Notify;

use crate::hot::counter::Counter;
use crate::hot::observed::Observed;
use crate::vocab::phase::Phase;
use crate::vocab::sync::MutexExt;

#[cfg(feature = "http")]
mod http;
mod registry;

#[cfg(feature = "http")]
pub(crate) use registry::RequestInfo;
use registry::RequestRegistry;

/// The hot-path block, leaked once per coordinator (`size_of::<Core>()` is checked below).
#[derive(Debug)]
pub(crate) struct Core {
    pub(crate) counter: Counter,
    zero: Notify,
    /// What the drain observes beside the count (`observed.rs`).
    observed: Observed,
    requests: Mutex<RequestRegistry>,
    /// The site of guards taken outside the HTTP layer; set by [`Core::leak`].
    plain: OnceLock<&'static Site>,
    /// The lifecycle's phase (`Phase as u8`), mirrored here by the driver where it changes, so
    /// that the HTTP layer reads it (its phase header, refusal mode) without the facade.
    phase: AtomicU8,
}

const NO_SLOT: u32 = u32::MAX;

/// Where a guard counts; leaked, so that a guard is one `&'static` reference. See the module
/// docs.
#[derive(Debug)]
pub(crate) struct Site {
    core: &'static Core,
    /// The HTTP layer's tag: bit 0 set for an HTTP/1.x request, the layer's options index
    /// above (see `server::options`); 0 outside the layer. Fixed for a plain site; an entry site
    /// takes the tag of the guard it describes when it is handed out.
    #[cfg_attr(not(feature = "http"), allow(dead_code))] // read by the HTTP layer only
    tag: AtomicU32,
    /// An entry site's slot in the registry; `NO_SLOT` for a plain site.
    slot: u32,
}

impl Site {
    /// A plain site for `core`'s guards with `tag` (see [`Site`]), to be leaked by the caller.
    pub(crate) fn new(core: &'static Core, tag: u32) -> Site {
        Site {
            core,
            tag: AtomicU32::new(tag),
            slot: NO_SLOT,
        }
    }

    /// Takes a guard without the draining-time bookkeeping: returns it with `true` if the drain
    /// has started, and the caller records the activity itself (the HTTP layer does it out of
    /// line, to keep its inlined path small).
    #[inline]
    pub(crate) fn enter(&'static self) -> (InFlightGuard, bool) {
        let draining = self.core.counter.enter();
        (InFlightGuard { site: self }, draining)
    }
}

impl Core {
    pub(crate) fn leak() -> &'static Core {
        let core: &'static Core = Box::leak(Box::new(Core {
            counter: Counter::new(),
            zero: Notify::new(),
            observed: Observed::new(),
            requests: Mutex::new(RequestRegistry::default()),
            plain: OnceLock::new(),
            phase: AtomicU8::new(Phase::Starting as u8),
        }));
        let _ = core.plain.set(Box::leak(Box::new(Site::new(core, 0))));
        core
    }

    /// The lifecycle's phase, as the driver last mirrored it.
    pub(crate) fn phase(&self) -> Phase {
        // Acquire: pairs with `set_phase`'s release, so a reader that sees a phase sees what
        // the driver did before publishing it.
        Phase::from_index(self.phase.load(Ordering::Acquire))
    }

    /// Mirrors the lifecycle's phase (the driver, where the phase changes).
    pub(crate) fn set_phase(&self, phase: Phase) {
        self.phase.store(phase as u8, Ordering::Release);
    }

    /// The site of guards taken outside the HTTP layer.
    #[inline]
    pub(crate) fn plain(&self) -> &'static Site {
        self.plain.get().expect("Core::leak sets the plain site")
    }

    /// Frees what a drain accumulated (per-peer connection counts, traffic-path counts, the
    /// straggler registry) once the report holds it: the block itself is leaked, so its growth
    /// must not be. Called when the drain reaches Done; a guard described before that and
    /// dropped after finds its slot gone, which is harmless.
    pub(crate) fn release_drain_state(&self) {
        self.observed.release();
        let mut reg = self.requests.locked();
        // The sites stay (leaked, and maybe still held by a guard); their descriptions go.
        // An emptied entry is not put on the free list: its site may still have a holder.
        for entry in &mut reg.entries {
            *entry = None;
        }
        reg.free = Vec::new();
    }

    /// What the drain observes beside the count.
    #[inline]
    pub(crate) fn observed(&self) -> &Observed {
        &self.observed
    }

    pub(crate) fn wake_zero(&self) {
        self.zero.notify_waiters();
    }

    /// Sets the draining flag and wakes waiters if nothing is in flight.
    pub(crate) fn start_draining(&self) {
        self.observed.mark_drain_started();
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
    /// One pointer: a guard is 8 bytes, so the HTTP layer's response (head, body and guard)
    /// stays small enough to be moved without a call to `memcpy`.
    site: &'static Site,
}

impl fmt::Debug for InFlightGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightGuard")
            .field("in_flight", &self.site.core.counter.count())
            .finish()
    }
}

impl Drop for InFlightGuard {
    #[inline]
    fn drop(&mut self) {
        let core = self.site.core;
        if self.site.slot != NO_SLOT {
            // Unregister before leaving, so whoever sees zero sees an empty registry.
            core.unregister(self.site.slot);
        }
        if core.counter.leave() {
            core.wake_zero();
        }
    }
}

#[cfg(all(test, not(lameduck_loom)))]
mod tests;
