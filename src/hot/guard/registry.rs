//! The straggler registry: what is known about the requests still in flight while draining,
//! one *entry* [`Site`] per described request (see the parent module's invariants).

// Only the HTTP side (feature `http`) describes requests; every build reads the registry.
#![cfg_attr(not(feature = "http"), allow(dead_code))]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};

use tokio::time::Instant;

use super::{Core, Site, NO_SLOT};
use crate::vocab::sync::MutexExt;

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
pub(super) struct RequestRegistry {
    /// The description behind each entry site, by the site's slot.
    pub(super) entries: Vec<Option<RequestInfo>>,
    /// The entry sites, by slot: leaked once each, reused (only the HTTP layer describes
    /// requests).
    pub(super) sites: Vec<&'static Site>,
    /// Slots whose entry is empty and whose site no guard holds.
    pub(super) free: Vec<u32>,
}

impl Core {
    /// The requests registered as in flight while draining.
    #[cfg(test)]
    pub(crate) fn registered_requests(&self) -> Vec<RequestInfo> {
        let reg = self.requests.locked();
        reg.entries.iter().flatten().cloned().collect()
    }

    /// The `keep` oldest requests registered as in flight while draining (those of unknown
    /// start, begun before the drain, first), and how many there are: one walk under the
    /// lock, copying only those kept, however many streams a peer left hanging.
    pub(crate) fn oldest_registered(&self, keep: usize) -> (Vec<RequestInfo>, usize) {
        let reg = self.requests.locked();
        let mut total = 0;
        let oldest = crate::vocab::sync::oldest(
            reg.entries.iter().flatten().inspect(|_| total += 1),
            keep,
            |r| r.started,
        );
        (oldest.into_iter().cloned().collect(), total)
    }

    /// Registers a request for the straggler list: the entry site a guard with `tag` moves to
    /// (see [`InFlightGuard::adopt`]). Only called while draining.
    pub(crate) fn register(&'static self, info: RequestInfo, tag: u32) -> &'static Site {
        let mut reg = self.requests.locked();
        let site = match reg.free.pop() {
            Some(slot) => {
                reg.entries[slot as usize] = Some(info);
                reg.sites[slot as usize]
            }
            None => {
                let slot = u32::try_from(reg.entries.len())
                    .ok()
                    .filter(|&s| s != NO_SLOT)
                    .expect("fewer than 2^32 requests described at once");
                reg.entries.push(Some(info));
                let site: &'static Site = Box::leak(Box::new(Site {
                    core: self,
                    tag: AtomicU32::new(0),
                    slot,
                }));
                reg.sites.push(site);
                site
            }
        };
        // Relaxed: the lock orders this store before any use of the site by its new holder.
        site.tag.store(tag, Ordering::Relaxed);
        site
    }

    /// The guard holding the entry site at `slot` is gone.
    pub(super) fn unregister(&self, slot: u32) {
        let mut reg = self.requests.locked();
        // An entry emptied at Done stays off the free list (see `release_drain_state`).
        if let Some(entry) = reg.entries.get_mut(slot as usize) {
            if entry.take().is_some() {
                reg.free.push(slot);
            }
        }
    }
}
