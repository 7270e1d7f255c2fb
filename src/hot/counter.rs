//! The in-flight counter: the only part of lameduck on every request's path.
//!
//! # Invariants
//!
//! * One `AtomicUsize` holds both the number of in-flight guards (in the upper bits, in steps of
//!   [`ONE`]) and the *draining* flag (bit 0). Packing them together means the leave path learns
//!   from the value its own `fetch_sub` returned whether it was the last guard **while draining**,
//!   so exactly one party observes the "zero while draining" edge without a second load.
//! * Entering is one `fetch_add`, leaving is one `fetch_sub`; neither locks nor allocates.
//! * The draining flag is set once and never cleared.
//! * "Zero while draining" is reported by exactly one of: the [`Counter::leave`] that took the
//!   count from one to zero after the flag was set, or the [`Counter::start_draining`] that set
//!   the flag while the count was already zero. Both take place on the same atomic, so they are
//!   totally ordered and a waiter that checks [`Counter::is_drained`] after being woken (or
//!   before sleeping) can never miss the zero. This is checked by the loom model at the bottom of
//!   this file.

use crate::hot::loom::{AtomicUsize, Ordering};

/// Bit 0: the drain has started.
const DRAINING: usize = 1;
/// One in-flight guard.
const ONE: usize = 2;

/// The packed counter. See the module docs for its invariants.
#[derive(Debug)]
pub(crate) struct Counter {
    state: AtomicUsize,
}

impl Counter {
    pub(crate) fn new() -> Self {
        Self {
            state: AtomicUsize::new(0),
        }
    }

    /// Counts one more guard. Returns `true` if the drain had already started.
    #[inline]
    pub(crate) fn enter(&self) -> bool {
        // Relaxed: entering publishes nothing; the count itself is totally ordered by the
        // atomic's modification order, which is all the leave path and the waiter rely on.
        let prev = self.state.fetch_add(ONE, Ordering::Relaxed);
        prev & DRAINING != 0
    }

    /// Counts one guard less. Returns `true` if this call took the count to zero while
    /// draining, i.e. the caller must wake the waiters.
    #[inline]
    pub(crate) fn leave(&self) -> bool {
        // Release: whatever the request did happens-before the waiter's Acquire load that sees
        // zero, so closers never run before the effects of the work that used the resource.
        let prev = self.state.fetch_sub(ONE, Ordering::Release);
        debug_assert!(prev >= ONE, "in-flight counter underflow");
        prev == ONE | DRAINING
    }

    /// Sets the draining flag. Returns `true` if the count was already zero at that instant,
    /// i.e. the caller must wake the waiters itself (no leave will).
    pub(crate) fn start_draining(&self) -> bool {
        // AcqRel: Acquire pairs with earlier leaves (their work is visible to the caller that
        // sees zero here); Release publishes the flag to later enters/leaves.
        let prev = self.state.fetch_or(DRAINING, Ordering::AcqRel);
        prev >> 1 == 0 && prev & DRAINING == 0
    }

    /// The number of guards alive now.
    #[inline]
    pub(crate) fn count(&self) -> usize {
        self.state.load(Ordering::Acquire) >> 1
    }

    /// `true` once the drain has started.
    #[inline]
    pub(crate) fn is_draining(&self) -> bool {
        // Relaxed: a hint for cheap checks; decisions that need ordering use the RMW results.
        self.state.load(Ordering::Relaxed) & DRAINING != 0
    }

    /// `true` when draining and no guard is alive.
    pub(crate) fn is_drained(&self) -> bool {
        // Acquire: pairs with the Release of the last leave (see `leave`).
        self.state.load(Ordering::Acquire) == DRAINING
    }
}

#[cfg(all(test, lameduck_loom))]
mod loom_model {
    //! Model: the waiter must never miss the zero, whatever the interleaving of the last guard's
    //! release, the drain start, and new guards entering during the drain.
    use super::Counter;
    use loom::sync::atomic::{AtomicUsize, Ordering};
    use loom::sync::{Arc, Notify};
    use loom::thread;

    /// Shared state of one model run: the counter, the wake-up, and how many times "zero while
    /// draining" was reported (so we can check it is never reported spuriously).
    struct CounterModel {
        counter: Counter,
        zero: Notify,
        fired: AtomicUsize,
    }

    impl CounterModel {
        fn leave(&self) {
            if self.counter.leave() {
                self.fired.fetch_add(1, Ordering::Relaxed);
                self.zero.notify();
            }
        }
        fn start(&self) {
            if self.counter.start_draining() {
                self.fired.fetch_add(1, Ordering::Relaxed);
                self.zero.notify();
            }
        }
        /// The waiter's loop: check, then sleep; loom's `Notify` keeps a permit, standing in for
        /// tokio's `Notified::enable` before the check.
        fn wait_drained(&self) {
            while !self.counter.is_drained() {
                self.zero.wait();
            }
        }
    }

    fn model() -> Arc<CounterModel> {
        Arc::new(CounterModel {
            counter: Counter::new(),
            zero: Notify::new(),
            fired: AtomicUsize::new(0),
        })
    }

    #[test]
    fn last_guard_drops_while_drain_starts() {
        loom::model(|| {
            let m = model();
            assert!(!m.counter.enter());
            let leaver = {
                let m = m.clone();
                thread::spawn(move || m.leave())
            };
            let starter = {
                let m = m.clone();
                thread::spawn(move || m.start())
            };
            m.wait_drained();
            leaver.join().unwrap();
            starter.join().unwrap();
            assert_eq!(m.counter.count(), 0);
            // Exactly one party saw the edge.
            assert_eq!(m.fired.load(Ordering::Relaxed), 1);
        });
    }

    #[test]
    fn enters_during_the_drain_do_not_hide_the_zero() {
        loom::model(|| {
            let m = model();
            m.counter.enter();
            let starter = {
                let m = m.clone();
                thread::spawn(move || m.start())
            };
            // A request that arrives during the drain and finishes.
            let late = {
                let m = m.clone();
                thread::spawn(move || {
                    let draining = m.counter.enter();
                    m.leave();
                    draining
                })
            };
            // The guard that was in flight before the drain.
            m.leave();
            m.wait_drained();
            starter.join().unwrap();
            late.join().unwrap();
            assert_eq!(m.counter.count(), 0);
            let fired = m.fired.load(Ordering::Relaxed);
            assert!((1..=2).contains(&fired), "fired {fired} times");
        });
    }

    #[test]
    fn no_zero_reported_while_a_guard_lives() {
        loom::model(|| {
            let m = model();
            m.counter.enter();
            m.counter.enter();
            let a = {
                let m = m.clone();
                thread::spawn(move || m.leave())
            };
            m.start();
            a.join().unwrap();
            // One guard is still alive: nobody may have reported zero.
            assert_eq!(m.fired.load(Ordering::Relaxed), 0);
            assert!(!m.counter.is_drained());
            m.leave();
            assert_eq!(m.fired.load(Ordering::Relaxed), 1);
            assert!(m.counter.is_drained());
        });
    }
}
