//! Where the drain is and who hears of it: the phase (mirrored in the hot-path block and
//! published on a `watch` channel), the counts sampled at each lifecycle event, the one log
//! line per event, and the observer (the metrics, feature `metrics`) told.
//!
//! # Invariants
//!
//! * Phases only move forward; each transition is published on the `watch` channel after
//!   the hot-path block's mirror, so whoever the channel wakes reads the new phase from
//!   either.
//! * The observer is told at lifecycle events and phase changes, never per request, never
//!   under another part's lock.

use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use super::observer::{Observer, Sample};
use crate::hot::guard::Core;
use crate::report::DrainReport;
use crate::vocab::phase::{CommitReason, Event, Phase};

/// The phase, the counts and the observer.
pub(crate) struct Progress {
    core: &'static Core,
    phase: watch::Sender<Phase>,
    observer: Option<Box<dyn Observer>>,
    /// The tasks' tracker, for their count.
    tasks: TaskTracker,
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Progress")
            .field("phase", &*self.phase.borrow())
            .finish_non_exhaustive()
    }
}

impl Progress {
    pub(super) fn new(
        core: &'static Core,
        observer: Option<Box<dyn Observer>>,
        tasks: TaskTracker,
    ) -> Self {
        Self {
            core,
            phase: watch::channel(Phase::Starting).0,
            observer,
            tasks,
        }
    }

    pub(crate) fn phase(&self) -> Phase {
        self.core.phase()
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<Phase> {
        self.phase.subscribe()
    }

    /// Moves to `phase` and samples the metrics.
    pub(super) fn set(&self, phase: Phase) {
        // The mirror first: whoever the channel wakes reads the new phase from either.
        self.core.set_phase(phase);
        self.phase.send_modify(|p| *p = phase);
        self.observe();
    }

    /// Starting → Serving (once).
    pub(crate) fn mark_serving(&self) {
        let moved = self.phase.send_if_modified(|p| {
            let moved = *p == Phase::Starting;
            if moved {
                self.core.set_phase(Phase::Serving);
                *p = Phase::Serving;
            }
            moved
        });
        if moved {
            self.core.observed().mark_serving();
            tracing::info!("lameduck: serving");
            self.observe();
        }
    }

    pub(crate) fn connections(&self) -> usize {
        self.core.observed().connections()
    }

    /// The lifecycle's counts now: what an observer is told.
    pub(crate) fn sample(&self) -> Sample {
        let af = self.core.observed().after_flip();
        Sample {
            phase: self.phase(),
            in_flight: self.core.counter.count(),
            connections: self.connections(),
            tasks: self.tasks.len(),
            requests_on_new: af.requests_on_new,
            requests_on_reused: af.requests_on_reused,
        }
    }

    /// Tells the observer the counts now.
    pub(crate) fn observe(&self) {
        if let Some(o) = &self.observer {
            o.sampled(&self.sample());
        }
    }

    /// The report is final: the observer records it (before the phase turns Done, so whoever
    /// awaits Done finds the histograms recorded).
    pub(super) fn done(&self, report: &DrainReport) {
        if let Some(o) = &self.observer {
            o.done(report);
        }
    }

    /// The log line of a lifecycle event: one INFO line each (a production log tells the
    /// drain in a handful of lines), with the counts, so each line stands on its own.
    pub(super) fn log(&self, e: &Event) {
        tracing::info!(
            event = e.event.as_str(),
            at_ms = e.at_ms,
            in_flight = self.core.counter.count(),
            connections = self.connections(),
            tasks = self.tasks.len(),
            reason = e.reason.map(CommitReason::as_str),
            name = e.name.as_deref(),
            detail = e.detail.as_deref(),
            "lameduck: {}",
            e.event
        );
    }
}
