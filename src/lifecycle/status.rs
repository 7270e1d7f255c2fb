//! `/status`: a snapshot of the coordinator.

use serde::{Deserialize, Serialize};

use crate::report::{BudgetReport, EvidenceReport, ProbeSources};
use crate::vocab::phase::{Event, Phase, ReadinessWhileDraining, Trigger};

/// The most events `/status` (and `/drain`) carry; the rest are counted in
/// [`Status::timeline_omitted`].
pub const STATUS_TIMELINE_LIMIT: usize = 64;

/// A snapshot of the coordinator, as `/status` serves it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Status {
    /// The current phase.
    pub phase: Phase,
    /// Whether `/readyz` answers 200 to callers other than kubelet's probe.
    pub ready: bool,
    /// Whether `/readyz` answers 200 to kubelet's probe (`User-Agent: kube-probe/…`). Differs
    /// from `ready` while draining under [`ReadinessWhileDraining::Auto`], the default: kubelet
    /// is still answered 200 until accepting stops, so the EndpointSlice keeps `serving=true`.
    #[serde(default)]
    pub ready_for_kubelet: bool,
    /// The first trigger, once draining.
    pub trigger: Option<Trigger>,
    /// Requests (guards) in flight.
    pub in_flight: usize,
    /// Open connections on `lameduck::serve` listeners.
    pub connections: usize,
    /// Background tasks still running.
    pub tasks: usize,
    /// The readiness policy in force.
    pub readiness_policy: ReadinessWhileDraining,
    /// The budget: grace, used so far, remaining (all zero-used before the drain starts).
    pub budget: BudgetReport,
    /// The timeline so far: at most [`STATUS_TIMELINE_LIMIT`] events (the first and the last
    /// halves when longer).
    pub timeline: Vec<Event>,
    /// Events left out of `timeline` to keep the body bounded.
    #[serde(default)]
    pub timeline_omitted: usize,
    /// While draining, the evidence the propagation policy waits on (its kind is what it
    /// expects to commit on); once committed, the evidence it went on.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::report::evidence_json"
    )]
    pub evidence: Option<EvidenceReport>,
    /// Who called `/readyz` so far and how each caller was classified (bounded; see
    /// [`ReadinessWhileDraining::Auto`]).
    #[serde(default, skip_serializing_if = "ProbeSources::is_empty")]
    pub probe_sources: ProbeSources,
}
