//! Work that must end before the process exits: answers owed to admin callers.
//!
//! # Invariants
//!
//! * A `/drain?wait=…` caller holds a token from the moment it starts waiting until its
//!   response body is dropped (handed to the server, or the client went away); connections of
//!   [`AdminBuilder::serve`](crate::admin::AdminBuilder::serve) are tracked for their whole life.
//! * [`Drain::run`](crate::Drain::run) fires `exiting` as its last step (after `Done`, and after
//!   SIGTERM in the `preStop` case), then waits until nothing is tracked — bounded by the hard
//!   deadline, or one second when that has already passed. Admin connections stop accepting and
//!   close idle connections when `exiting` fires, and finish the responses they are writing;
//!   one whose peer does not take its answer is cut and noted here, for the last report.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
#[cfg(feature = "admin")]
use tokio_util::task::task_tracker::TaskTrackerToken;
use tokio_util::task::TaskTracker;

use crate::report::Straggler;
use crate::vocab::sync::MutexExt;

/// How long `run` waits for admin answers when the hard deadline has already passed (a drain
/// that finished after a `preStop` call and then waited for SIGTERM).
const LATE_EXIT_WAIT: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
pub(crate) struct ExitHolds {
    tracker: TaskTracker,
    exiting: CancellationToken,
    /// Set before `exiting` fires: when a connection still owing an answer is cut, and the
    /// wait that gives (less, when the hard deadline comes first).
    deliver_by: std::sync::OnceLock<(Instant, Duration)>,
    /// Admin connections cut at exit with an answer their peer did not take.
    cut: Mutex<Vec<Straggler>>,
}

#[cfg(feature = "admin")]
impl ExitHolds {
    /// Counts one answer owed until the token is dropped.
    pub(crate) fn token(&self) -> TaskTrackerToken {
        self.tracker.token()
    }

    /// Runs `fut` as owed work.
    pub(crate) fn spawn<F>(&self, fut: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.tracker.spawn(fut);
    }

    /// Fires when the process is about to exit.
    pub(crate) fn exiting(&self) -> &CancellationToken {
        &self.exiting
    }

    /// Once `exiting` fired: when an answer still owed is given up (its connection cut), and
    /// how long after the exit began that is.
    pub(crate) fn deliver_by(&self) -> Option<(Instant, Duration)> {
        self.deliver_by.get().copied()
    }

    /// Records a connection cut at exit with an answer undelivered, for the last report.
    pub(crate) fn note_cut(&self, straggler: Straggler) {
        self.cut.locked().push(straggler);
    }
}

impl ExitHolds {
    /// The connections cut at exit so far (see [`note_cut`](Self::note_cut)).
    pub(crate) fn take_cut(&self) -> Vec<Straggler> {
        std::mem::take(&mut *self.cut.locked())
    }

    /// The last step of `run`: lets admin servers finish what they owe, bounded by `hard`
    /// (the hard deadline) or, when that has passed, a second. An answer not delivered
    /// `deliver` after this call (or by that bound) is given up, its connection cut and
    /// named: by then every answer is computed, and its peer does not read.
    pub(crate) async fn settle(&self, hard: Option<Instant>, deliver: Duration) {
        let now = Instant::now();
        let until = hard
            .filter(|hard| *hard > now)
            .unwrap_or(now + LATE_EXIT_WAIT);
        let by = (now + deliver).min(until);
        let _ = self.deliver_by.set((by, by - now));
        self.exiting.cancel();
        self.tracker.close();
        if self.tracker.is_empty() {
            return;
        }
        if tokio::time::timeout_at(until, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                owed = self.tracker.len(),
                "lameduck: admin answers still owed at the hard deadline; exiting anyway"
            );
        }
    }
}
