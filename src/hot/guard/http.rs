//! What only the HTTP side (`lameduck::serve`'s accept loop and connections, the drain layer)
//! uses of the hot-path block: a guard's tag, its description for the straggler list. What a
//! tag's option index means is the HTTP layer's business (`server::options`): the hot block
//! holds no table of it.

use std::sync::atomic::Ordering;

use super::{Core, InFlightGuard, RequestInfo, Site, NO_SLOT};

impl Site {
    /// The coordinator's hot-path block.
    #[inline]
    pub(crate) fn core(&self) -> &'static Core {
        self.core
    }

    /// The HTTP layer's tag (see [`Site`]).
    pub(crate) fn tag(&self) -> u32 {
        // Relaxed: a plain site's tag never changes; an entry site's was set under the
        // registry's lock before its holder got the site.
        self.tag.load(Ordering::Relaxed)
    }
}

impl Core {
    /// Takes a guard that is not an arrival: no activity is recorded for the propagation
    /// policy (a response waiting for its reader, a connection being polled).
    #[inline]
    pub(crate) fn hold(&'static self) -> InFlightGuard {
        self.plain().enter().0
    }
}

impl InFlightGuard {
    /// Registers what this guard counts, for the straggler list. Only called while draining.
    pub(crate) fn describe(&mut self, info: RequestInfo) {
        if !self.is_described() {
            self.site = self.site.core.register(info, self.tag());
        }
    }

    /// Moves this guard to an entry site registered by [`Core::register`] for the request it
    /// counts, so that its drop unregisters the entry. A guard already described keeps its own
    /// entry, and `entry` is released at once.
    #[cold]
    #[inline(never)]
    pub(crate) fn adopt(&mut self, entry: &'static Site) {
        if self.is_described() {
            self.site.core.unregister(entry.slot);
        } else {
            self.site = entry;
        }
    }

    /// `true` once [`describe`](Self::describe) registered this guard.
    pub(crate) fn is_described(&self) -> bool {
        self.site.slot != NO_SLOT
    }

    pub(crate) fn core(&self) -> &'static Core {
        self.site.core
    }

    /// The HTTP layer's tag of the request this guard counts (see [`Site`]).
    pub(crate) fn tag(&self) -> u32 {
        self.site.tag()
    }
}
