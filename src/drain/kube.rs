//! The Kubernetes watch's seam (feature `kube`, `src/kube/`): the part of the coordinator it
//! is handed when it starts. The watch writes the link and reports events; the driver reads
//! them.

use std::sync::Arc;

use tokio::time::Instant;

use super::Drain;
use crate::lifecycle::Driver;
use crate::propagation::link::{Kill, Link};
use crate::readiness::ReadinessState;
use crate::vocab::phase::EventKind;

/// What [`EndpointWatch`](crate::EndpointWatch) writes to: the link, the timeline's external
/// events, the budget and kubelet's view of readiness. Built once from the handle when the
/// watch starts, and owned by the watch.
#[derive(Clone)]
pub(crate) struct WatchSeam {
    driver: Arc<Driver>,
    readiness: Arc<ReadinessState>,
}

impl WatchSeam {
    /// The parts of `drain` the watch writes to.
    pub(crate) fn new(drain: &Drain) -> Self {
        Self {
            driver: Arc::clone(&drain.inner.driver),
            readiness: Arc::clone(&drain.inner.readiness),
        }
    }

    /// The link the Kubernetes watch writes: where the slice evidence stands, the routing.
    pub(crate) fn link(&self) -> &Link {
        self.driver.deadlines().link()
    }

    /// Records an event the API reported (an endpoint condition change, the deletion's
    /// budget) at `at`: in the timeline once the drain started, kept for its start before.
    pub(crate) fn record_external(
        &self,
        kind: EventKind,
        name: Option<String>,
        detail: String,
        at: Instant,
        unix_ms: u64,
    ) {
        self.driver.record_external(kind, name, detail, at, unix_ms);
    }

    /// Records the deletion's kill time; `true` if it tightened the budget.
    pub(crate) fn tighten(&self, kill: Kill) -> bool {
        self.driver.deadlines().tighten(kill)
    }

    /// The kubelet terminates this Pod without a deletion: under `Auto`, kubelet's probe too
    /// sees "not ready" while draining; `true` when that changed what it sees.
    pub(crate) fn kubelet_terminates(&self) -> bool {
        self.readiness.kubelet_terminates()
    }
}
