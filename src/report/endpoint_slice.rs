//! The EndpointSlice evidence as the report shows it (feature `kube`): data, filled in by the
//! link to the Kubernetes API (`link.rs`, `link/startup.rs`).

use serde::{Deserialize, Serialize};

/// Where the proxy allowance came from:
/// [`EndpointSliceEvidence::allowance_source`](crate::report::EndpointSliceEvidence::allowance_source).
///
/// In JSON: `measured`, `configured`, `default`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AllowanceSource {
    /// This Pod's own delay at startup, from the slice listing it ready to the first new
    /// connection of each peer: the largest of them. Proof enough to commit on while every
    /// path's arrivals can judge its own silence; otherwise a floor, as the default is (one
    /// sample of a proxy's delay does not bound the next).
    Measured,
    /// Set with `EndpointWatch::proxy_allowance` (feature `kube`): the operator knows the
    /// proxies. Proof enough to commit on.
    Configured,
    /// Nothing measured, nothing set: `DEFAULT_PROXY_ALLOWANCE` (2 s). Only a floor: the
    /// commit also waits for what the arrival evidence alone would have committed on.
    #[default]
    Default,
}

impl AllowanceSource {
    /// The name as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            AllowanceSource::Measured => "measured",
            AllowanceSource::Configured => "configured",
            AllowanceSource::Default => "default",
        }
    }
}

/// One peer's delay from the slice listing this Pod ready to its first new connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerDelay {
    /// The peer's IP address.
    pub peer: String,
    /// Milliseconds after the watch saw the slice list this Pod ready.
    pub delay_ms: u64,
}

/// The startup measurement behind a measured allowance (feature `kube`): part of
/// [`EndpointSliceEvidence`](crate::report::EndpointSliceEvidence).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartupMeasurement {
    /// Per peer, its first new connection after the listing (at most 16 peers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<PeerDelay>,
    /// Peers left out because they connected before any slice listed this Pod ready: they
    /// came another way (its IP, a port-forward), not through the proxies.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub peers_left_out: u64,
    /// Why there is no measurement, when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unmeasured: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The EndpointSlice evidence behind a propagation commit (feature `kube`): part of
/// [`EvidenceReport`](crate::report::EvidenceReport).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointSliceEvidence {
    /// The endpoint condition waited for: `ready=false` (or, under
    /// [`ServingUntilStop`](crate::ReadinessWhileDraining::ServingUntilStop),
    /// `ready=false or terminating=true`). An endpoint removed from its slice counts too.
    pub condition: String,
    /// The slices that list this Pod, as `name (service)`.
    pub slices: Vec<String>,
    /// When every slice first showed the condition, in milliseconds after the trigger
    /// (negative: before it). Absent while a slice still routes here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed_at_ms: Option<i64>,
    /// The proxy allowance added to it, in milliseconds.
    pub allowance_ms: u64,
    /// Where the allowance came from: `measured` at startup, `configured`, or the `default`
    /// (then only a floor: the commit also waits for the arrival evidence).
    #[serde(default)]
    pub allowance_source: AllowanceSource,
    /// Whether the allowance was proof enough to commit on: `configured`, or `measured` while
    /// every path's arrivals could judge its own silence. Otherwise it was a floor only: the
    /// commit also waited for what the arrival evidence alone would commit on (`max` on
    /// sparse traffic, or the fallback). A measured allowance is one sample per proxy, taken
    /// when this Pod was added; the delay when it is removed is another.
    #[serde(default)]
    pub allowance_proof: bool,
    /// One sentence: how the allowance was measured, or which default was used and why.
    #[serde(default)]
    pub allowance_note: String,
    /// This Pod's own delay at startup, from the slices listing it ready to each peer's first
    /// new connection, or why there is none.
    #[serde(default)]
    pub startup: StartupMeasurement,
    /// `changed_at + allowance`, in milliseconds after the trigger (0 if before it): the
    /// earliest commit the slices allow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_at_ms: Option<u64>,
    /// Services selecting this Pod with `publishNotReadyAddresses: true`: their slices keep
    /// `ready=true`, so they are not waited on (see the advice).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub publish_not_ready_addresses: Vec<String>,
}

/// The budget this drain kept when something gave it less than `grace_period`: the Pod's
/// deletion (`deletionGracePeriodSeconds`, feature `kube`), the kubelet's own termination
/// (node shutdown, node-pressure eviction; feature `kube`), or the configured shortest grace
/// ([`DrainBuilder::shortest_grace`](crate::DrainBuilder::shortest_grace)). Part of
/// [`BudgetReport`](crate::report::BudgetReport). Margin, close budget and propagation `max`
/// shrink in the same proportion as the grace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeletionBudget {
    /// The grace the source gave (for a deletion, its `deletionGracePeriodSeconds`), in
    /// milliseconds.
    pub deletion_grace_ms: u64,
    /// When the process may be killed, in milliseconds after the trigger.
    pub kill_at_ms: u64,
    /// The hard deadline it leaves, in milliseconds after the trigger.
    pub hard_ms: u64,
    /// The quiesce deadline it leaves, in milliseconds after the trigger.
    pub quiesce_ms: u64,
    /// Propagation `max` it leaves, in milliseconds after the trigger.
    pub max_ms: u64,
    /// What gave the shorter budget. Reports written before this field read as `deletion`.
    #[serde(default)]
    pub source: BudgetSource,
}

/// What gave a drain less than its `grace_period`: [`DeletionBudget::source`].
///
/// In JSON: `deletion`, `shortest_grace`, `node_shutdown`, `node_pressure_eviction`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum BudgetSource {
    /// The Pod was deleted with a shorter grace (`kubectl delete --grace-period`, an API
    /// eviction or preemption with its own): `deletionGracePeriodSeconds`.
    #[default]
    Deletion,
    /// The configured shortest grace ([`DrainBuilder::shortest_grace`](crate::DrainBuilder::shortest_grace),
    /// env `LAMEDUCK_SHORTEST_GRACE`): every drain is planned to fit it.
    ShortestGrace,
    /// The kubelet's graceful node shutdown (condition `DisruptionTarget`, reason
    /// `TerminationByKubelet`, no deletion): the node's budget for this Pod.
    NodeShutdown,
    /// The kubelet's node-pressure eviction (the same condition, "low on resource"): a soft
    /// threshold's `evictionMaxPodGracePeriod`, a hard one's minimum.
    NodePressureEviction,
}

impl BudgetSource {
    /// The name used in JSON and in the report's text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Deletion => "deletion",
            Self::ShortestGrace => "shortest_grace",
            Self::NodeShutdown => "node_shutdown",
            Self::NodePressureEviction => "node_pressure_eviction",
        }
    }
}

impl std::fmt::Display for BudgetSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
