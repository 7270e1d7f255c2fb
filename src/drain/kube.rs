//! The handle's seam for the Kubernetes watch (feature `kube`, `src/kube/`): the few methods
//! through which it reaches the coordinator. The watch writes the link and reports events;
//! the driver reads them.

use tokio::time::Instant;

use super::Drain;
use crate::propagation::link::{Kill, Link};
use crate::vocab::phase::EventKind;

impl Drain {
    /// The link the Kubernetes watch writes: where the slice evidence stands, the routing.
    pub(crate) fn link(&self) -> &Link {
        self.inner.driver.deadlines().link()
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
        self.inner
            .driver
            .record_external(kind, name, detail, at, unix_ms);
    }

    /// Records the deletion's kill time; `true` if it tightened the budget.
    pub(crate) fn tighten(&self, kill: Kill) -> bool {
        self.inner.driver.deadlines().tighten(kill)
    }

    /// The kubelet terminates this Pod without a deletion: under `Auto`, kubelet's probe too
    /// sees "not ready" while draining; `true` when that changed what it sees.
    pub(crate) fn kubelet_terminates(&self) -> bool {
        self.inner.readiness.kubelet_terminates()
    }
}
