//! Who called `/readyz` and how each was classified, as the report and `/status` show it. The
//! readiness part keeps the table and converts it into these.

use serde::{Deserialize, Serialize};

/// How a readiness caller was classified.
///
/// In JSON: `kubelet`, `load_balancer`, `other`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ProbeClass {
    /// kubelet's probe: under [`Auto`](crate::ReadinessWhileDraining::Auto) it sees "ready"
    /// until `stopped_accepting`.
    Kubelet,
    /// A load balancer's health checker, known by its `User-Agent` or said by the header: it
    /// sees "not ready" from the trigger.
    LoadBalancer,
    /// Anyone else (a monitor, a person, an unrecognised checker): "not ready" from the
    /// trigger.
    Other,
}

/// One kind of caller `/readyz` saw, and how it was classified.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ProbeSource {
    /// The `User-Agent`'s first product (`kube-probe/1.31`, `GoogleHC/1.0`), at most 40
    /// printable characters; `(none)` when absent.
    pub user_agent: String,
    /// The probe header that decided, when one did (`K-Kubelet-Probe`,
    /// `X-Lameduck-Probe: kubelet`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// How it was classified.
    pub classified_as: ProbeClass,
    /// The rule that classified it.
    pub rule: String,
    /// Calls seen.
    pub requests: u64,
    /// Of those, calls while draining (before `stopped_accepting` they are answered by class
    /// under [`Auto`](crate::ReadinessWhileDraining::Auto)).
    pub while_draining: u64,
}

/// The probe sources `/readyz` saw: at most 16 rows in order of first call, and
/// the calls beyond them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ProbeSources {
    /// One row per (user agent, header, class).
    pub sources: Vec<ProbeSource>,
    /// Calls from sources that are not listed: they did not fit in the table, or their row
    /// was replaced by a busier source's (kubelet's and load balancers' rows are kept first).
    #[serde(default)]
    pub unlisted_requests: u64,
}

impl ProbeSources {
    /// `true` when no caller was seen.
    pub fn is_empty(&self) -> bool {
        self.sources.is_empty() && self.unlisted_requests == 0
    }
}
