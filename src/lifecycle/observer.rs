//! What the lifecycle tells an add-on that follows it (the metrics, feature `metrics`): a
//! [`Sample`] at every lifecycle event and phase change, and the report once, just before the
//! phase turns Done. The add-on registers its [`Observer`] when the drain is built; the
//! lifecycle knows only this trait, so the arrow points from the add-on down to it.

use crate::report::DrainReport;
use crate::vocab::phase::Phase;

/// The lifecycle's counts at one instant: what the metrics' gauges and counters are set from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sample {
    pub(crate) phase: Phase,
    pub(crate) in_flight: usize,
    pub(crate) connections: usize,
    pub(crate) tasks: usize,
    pub(crate) requests_on_new: u64,
    pub(crate) requests_on_reused: u64,
}

/// Follows the lifecycle. Called on the driver's task (and from `Drain`'s own calls), never
/// per request, never under the driver's lock.
pub(crate) trait Observer: Send + Sync + 'static {
    /// A lifecycle event or a phase change happened; `sample` is the state after it.
    fn sampled(&self, sample: &Sample);
    /// The drain is over; `report` is final. Called before the phase turns Done, so whoever
    /// awaits Done finds what the observer did with it.
    fn done(&self, report: &DrainReport);
}
