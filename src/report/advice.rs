//! The report's advice: each line, how much it matters, and the rule it comes from. The
//! rules themselves are in `advice.rs` (the table) and `advice/`; this is only what the report
//! holds.

use serde::{Deserialize, Serialize};

/// How much a piece of advice matters.
///
/// In JSON: `warn`, `info`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AdviceLevel {
    /// Something to change: the drain lost time or work, or nearly did.
    Warn,
    /// A measurement worth knowing; nothing to change on its evidence alone.
    Info,
}

impl AdviceLevel {
    /// `warn` or `info`.
    pub fn as_str(self) -> &'static str {
        crate::vocab::names::of(&self)
    }
}

/// The rule a piece of advice comes from: [`Advice::rule`], a stable identifier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AdviceRule {
    /// `not_enough_traffic`: too little traffic after the flip to measure propagation.
    NotEnoughTraffic,
    /// `propagation_after_min`: new connections came after the quiet policy's `min`.
    PropagationAfterMin,
    /// `propagation_after_fixed`: the last new connection came close to or past the fixed delay.
    PropagationAfterFixed,
    /// `propagation_observed`: when the last new connection came.
    PropagationObserved,
    /// `no_new_connections`: no new connection after the drain started.
    NoNewConnections,
    /// `no_connection_data`: no connection was ever counted, so silence was no evidence.
    NoConnectionData,
    /// `weak_evidence`: the arrival rate could not say how long to wait.
    WeakEvidence,
    /// `confidence`: the commit went on silence at the measured rate.
    Confidence,
    /// `fallback`: the commit went on the fallback the user set
    /// (`Propagation::quiet_suffices_after`).
    Fallback,
    /// `quiet_window_never_held`: activity went on until `max`.
    QuietWindowNeverHeld,
    /// `one_peer`: one peer opened most new connections after the drain started.
    OnePeer,
    /// `requests_cut`: requests were still running at the quiesce deadline.
    RequestsCut,
    /// `tasks_cut`: background tasks were still running at the quiesce deadline.
    TasksCut,
    /// `tasks_panicked`: background tasks panicked.
    TasksPanicked,
    /// `closers_skipped`: closers had no time left before the hard deadline.
    ClosersSkipped,
    /// `closers_failed`: closers failed, panicked or timed out.
    ClosersFailed,
    /// `in_flight_late`: in-flight work reached zero late in the quiesce window.
    InFlightLate,
    /// `server_idle_timeout_short`: `serve`'s idle timeout is shorter than common proxies'.
    ServerIdleTimeoutShort,
    /// `grace_headroom`: little of the grace period was left at the end.
    GraceHeadroom,
    /// `grace_used`: how much of the grace period the drain used.
    GraceUsed,
    /// `budget_shortened`: something gave the drain less than its grace period — the Pod's
    /// deletion, the kubelet's node shutdown or eviction, the configured shortest grace
    /// ([`DeletionBudget::source`](crate::report::DeletionBudget::source)) — and what it cut
    /// short because of it.
    BudgetShortened,
    /// `stop_signal_missing`: the stop signal did not come after a `preStop` drain.
    StopSignalMissing,
    /// `never_served`: the drain started while the process was still starting (never
    /// ready), so it did not wait for propagation.
    NeverServed,
    /// `endpoint_slice`: the commit went on the EndpointSlice (feature `kube`): when the
    /// slices stopped routing here, plus the proxy allowance.
    EndpointSlice,
    /// `endpoint_slice_still_routing`: an EndpointSlice still listed this Pod as ready at
    /// `max`, or the Kubernetes API had not answered (feature `kube`).
    EndpointSliceStillRouting,
    /// `publish_not_ready_addresses`: a Service selecting this Pod publishes not-ready
    /// addresses, so its slice never stops routing here while it drains (feature `kube`).
    PublishNotReadyAddresses,
    /// `endpoint_slice_unavailable`: a started `EndpointWatch` could not be used (refused,
    /// unreachable, no client), so the drain went on the arrival rate (feature `kube`).
    EndpointSliceUnavailable,
    /// `declared_peer_like_a_pool`: a peer declared to route per request
    /// ([`Propagation::per_request_peers`](crate::Propagation::per_request_peers)) behaved
    /// like a client pool: it kept connections alive and came back on no more new connections
    /// than a pool's reconnect wave.
    DeclaredPeerLikeAPool,
    /// `node_agent_unanswered`: a node agent
    /// ([`Propagation::node_agents`](crate::Propagation::node_agents)) could not say whether
    /// its node still routes here (no answer, its rules unreadable).
    NodeAgentUnanswered,
}

impl AdviceRule {
    /// The rule's name as it appears in JSON (`"one_peer"`).
    pub fn as_str(self) -> &'static str {
        crate::vocab::names::of(&self)
    }
}

impl std::fmt::Display for AdviceRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One line of advice and the measurement behind it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Advice {
    /// How much it matters.
    pub level: AdviceLevel,
    /// A stable identifier of the rule (`propagation_after_min`, `one_peer`, …).
    pub rule: AdviceRule,
    /// The advice, in one sentence, with its numbers.
    pub message: String,
    /// The measured value the advice rests on (milliseconds, a count or a percentage, as the
    /// message says).
    pub observed: u64,
}

impl Advice {
    pub(crate) fn new(
        level: AdviceLevel,
        rule: AdviceRule,
        observed: u64,
        message: String,
    ) -> Self {
        Self {
            level,
            rule,
            message,
            observed,
        }
    }
}
