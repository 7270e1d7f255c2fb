//! The share of the admin connections that `/drain?wait=…` callers may hold while they wait.
//!
//! # Invariants
//!
//! * At most [`WaitSeats::max`] requests (the cap less an eighth) wait for the drain at once: a waiter is busy (never
//!   evicted) for the whole drain, so without a bound 64 of them fill every slot and kubelet's
//!   probes are refused until the process exits. The rest of the cap stays for probes and
//!   `/status`, which answer at once and so can never starve the waiters in turn.
//! * A caller beyond the share is answered at once (`503`, `Retry-After`, `Connection: close`)
//!   after the drain was started for it: its trigger is never lost, only its wait.
//! * A seat is a counted guard: released when the wait ends, when the handler's future is
//!   dropped (the caller went away), or on a panic.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The seats for `/drain` waiters of one admin server; travels to the handler as a request
/// extension (the router served elsewhere has none, and no bound).
#[derive(Debug)]
pub(crate) struct WaitSeats {
    taken: AtomicUsize,
    max: usize,
    connections: usize,
}

impl WaitSeats {
    /// The connection cap less a reserve for probes of an eighth of it (at least one slot;
    /// a cap of 1 has none to spare): probes are answered at once and close, so a few slots
    /// answer many of them, while waiters keep theirs for the whole drain.
    pub(super) fn for_cap(connections: usize) -> Arc<Self> {
        Arc::new(Self {
            taken: AtomicUsize::new(0),
            max: connections
                .saturating_sub(probe_reserve(connections))
                .max(1),
            connections,
        })
    }

    /// A seat, or `None` when every seat is taken.
    pub(crate) fn take(self: &Arc<Self>) -> Option<WaitSeat> {
        // Relaxed: a count with no data behind it; the RMW alone makes the bound exact.
        self.taken
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| WaitSeat(Arc::clone(self)))
    }

    /// How many callers may wait at once.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// The admin server's connection cap.
    pub(crate) fn connections(&self) -> usize {
        self.connections
    }
}

/// The admin connections kept from `/drain` waiters for probes: an eighth, at least one.
fn probe_reserve(connections: usize) -> usize {
    (connections / 8).max(1)
}

/// One `/drain` caller waiting; frees its seat when dropped.
#[derive(Debug)]
pub(crate) struct WaitSeat(Arc<WaitSeats>);

impl Drop for WaitSeat {
    fn drop(&mut self) {
        self.0.taken.fetch_sub(1, Ordering::Relaxed);
    }
}
