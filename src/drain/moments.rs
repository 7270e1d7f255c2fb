//! The drain's moments on the handle: the three tokens, the deadlines, the budget, the
//! timeline, phase changes.

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use std::future::Future;
use std::sync::Arc;

use crate::lifecycle::Driver;
use crate::vocab::budget::Budget;
use crate::vocab::phase::{Event, Phase};

/// When things happen in a [`Drain`](crate::Drain): its three moments as tokens, its deadlines and budget,
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
/// Returned by [`Drain::moments`](crate::Drain::moments): a cheap clone, `'static`, that
/// owns what it reads; the tokens it returns are clones too.
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
#[derive(Clone, Debug)]
pub struct Moments {
    driver: Arc<Driver>,
}

impl Moments {
    pub(super) fn new(driver: Arc<Driver>) -> Self {
        Self { driver }
    }

    /// A token that fires at `drain_started`: readiness flips, cancel-on-drain work stops
    /// taking new work.
    ///
    /// An axum app's `with_graceful_shutdown` wants
    /// [`stopped_accepting`](Self::stopped_accepting), not this one: load balancers still send
    /// new work while the drain propagates.
    pub fn drain_started(&self) -> CancellationToken {
        self.driver.tokens.drain.clone()
    }

    /// A token that fires at `stopped_accepting`: listeners close, streams should end. The
    /// same token as [`Moments::stopped_accepting`].
    pub fn stopped_accepting(&self) -> CancellationToken {
        self.driver.tokens.stop.clone()
    }

    /// A token that fires at `deadline_exceeded`, the quiesce deadline (or when forced):
    /// force-close what is left.
    pub fn deadline_exceeded(&self) -> CancellationToken {
        self.driver.tokens.deadline.clone()
    }

    /// The quiesce deadline, once the drain has started: when
    /// [`deadline_exceeded`](Self::deadline_exceeded) fires. The same instant as
    /// [`TaskContext::deadline`](crate::TaskContext::deadline).
    pub fn quiesce_deadline(&self) -> Option<Instant> {
        self.driver.deadlines().quiesce_deadline()
    }

    /// The hard deadline (grace period minus safety margin), once the drain has started.
    pub fn hard_deadline(&self) -> Option<Instant> {
        self.driver.deadlines().hard_deadline()
    }

    /// The validated budget.
    pub fn budget(&self) -> Budget {
        self.driver.deadlines().budget()
    }

    /// The timeline so far (empty before the drain starts).
    pub fn timeline(&self) -> Vec<Event> {
        self.driver.record().timeline()
    }

    /// A receiver that sees every phase change; `rx.wait_for(|p| *p >= Phase::Closing)` awaits
    /// a phase (as [`reached`](Self::reached) does).
    pub fn subscribe(&self) -> watch::Receiver<Phase> {
        self.driver.progress().subscribe()
    }

    /// Waits until the phase is at least `phase` (at once if it already is).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// # let drain = lameduck::Drain::builder().signals(lameduck::Signals::none())
    /// #     .report_to_stderr(false).termination_log(None).build().unwrap();
    /// use lameduck::{Phase, Trigger};
    ///
    /// let moments = drain.moments(); // owned: it can move into a task
    /// let closing = tokio::spawn(async move { moments.reached(Phase::Closing).await });
    /// drain.start(Trigger::Api);
    /// closing.await.unwrap();
    /// assert!(drain.phase() >= Phase::Closing);
    /// # }
    /// ```
    ///
    /// The future owns what it waits on (it does not borrow this handle), so
    /// `drain.moments().reached(phase)` can be kept, moved or raced in a `select!`.
    pub fn reached(&self, phase: Phase) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.driver.progress().subscribe();
        // The sender lives in the driver; if every handle is gone it closes, and the wait ends.
        async move {
            let _ = rx.wait_for(|p| *p >= phase).await;
        }
    }
}
