//! The drain's moments on the handle: the three tokens, the deadlines, the budget, the
//! timeline, phase changes.

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Drain;
use crate::vocab::budget::Budget;
use crate::vocab::phase::{Event, Phase};

/// When things happen in a [`Drain`]: its three moments as tokens, its deadlines and budget,
/// the timeline so far, and every phase change.
///
/// The three moments of a drain have one name each, here and on
/// [`TaskContext`](crate::TaskContext) alike, the names of their timeline events:
/// [`drain_started`](Self::drain_started) (the trigger),
/// [`stopped_accepting`](Self::stopped_accepting) (the propagation policy committed: listeners
/// close, streams end) and [`deadline_exceeded`](Self::deadline_exceeded) (the quiesce
/// deadline: force-close what is left); [`quiesce_deadline`](Self::quiesce_deadline) is when
/// the last fires.
///
/// Returned by [`Drain::moments`]; it borrows the drain. The tokens it returns are clones that
/// outlive it.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// # let drain = lameduck::Drain::builder().signals(lameduck::Signals::none())
/// #     .report_to_stderr(false).termination_log(None).build().unwrap();
/// use lameduck::Trigger;
///
/// let started = drain.moments().drain_started();
/// assert_eq!(drain.moments().quiesce_deadline(), None); // set by the trigger
/// drain.start(Trigger::Api);
/// started.cancelled().await;
/// let quiesce = drain.moments().quiesce_deadline().unwrap();
/// assert!(quiesce < drain.moments().hard_deadline().unwrap());
/// # }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Moments<'a> {
    drain: &'a Drain,
}

impl<'a> Moments<'a> {
    pub(super) fn new(drain: &'a Drain) -> Self {
        Self { drain }
    }

    /// A token that fires at `drain_started`: readiness flips, cancel-on-drain work stops
    /// taking new work.
    ///
    /// An axum app's `with_graceful_shutdown` wants
    /// [`stopped_accepting`](Self::stopped_accepting), not this one: load balancers still send
    /// new work while the drain propagates.
    pub fn drain_started(&self) -> CancellationToken {
        self.drain.inner.driver.tokens.drain.clone()
    }

    /// A token that fires at `stopped_accepting`: listeners close, streams should end. The
    /// same token as [`Drain::stopped_accepting`].
    pub fn stopped_accepting(&self) -> CancellationToken {
        self.drain.stopped_accepting()
    }

    /// A token that fires at `deadline_exceeded`, the quiesce deadline (or when forced):
    /// force-close what is left.
    pub fn deadline_exceeded(&self) -> CancellationToken {
        self.drain.inner.driver.tokens.deadline.clone()
    }

    /// The quiesce deadline, once the drain has started: when
    /// [`deadline_exceeded`](Self::deadline_exceeded) fires. The same instant as
    /// [`TaskContext::deadline`](crate::TaskContext::deadline).
    pub fn quiesce_deadline(&self) -> Option<Instant> {
        self.drain.inner.driver.deadlines().quiesce_deadline()
    }

    /// The hard deadline (grace period minus safety margin), once the drain has started.
    pub fn hard_deadline(&self) -> Option<Instant> {
        self.drain.inner.driver.deadlines().hard_deadline()
    }

    /// The validated budget.
    pub fn budget(&self) -> Budget {
        self.drain.inner.driver.deadlines().budget()
    }

    /// The timeline so far (empty before the drain starts).
    pub fn timeline(&self) -> Vec<Event> {
        self.drain.inner.driver.record().timeline()
    }

    /// A receiver that sees every phase change; `rx.wait_for(|p| *p >= Phase::Closing)` awaits
    /// a phase (as [`Drain::reached`] does).
    pub fn subscribe(&self) -> watch::Receiver<Phase> {
        self.drain.inner.driver.progress().subscribe()
    }
}
