//! Who asks `/readyz`: each caller classified from its headers, and a bounded table of the
//! sources seen, for `/status` and the report.
//!
//! # Invariants
//!
//! * The table holds at most [`MAX_SOURCES`](classify::MAX_SOURCES) rows (feature `admin`),
//!   so a caller that varies its `User-Agent` cannot grow memory; and no such caller can
//!   squat it: kubelet's and known load balancers' rows are never evicted for another
//!   class's row, and a new caller when the table is full replaces the row of least weight
//!   (a Space-Saving sketch: it takes that weight plus one), kubelet and load balancers
//!   first from the other callers' rows, so the sources that matter, and any that makes more
//!   than 1/16 of the calls, stay listed.
//! * Every call is counted once: in its row (exact from the row's admission), or in
//!   `unlisted_requests` (calls that found no row, and the calls of an evicted row).
//! * The table's lock is held for one lookup and one increment, never across an await or user
//!   code.

use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::sync::MutexExt;

#[cfg(feature = "admin")]
mod classify;
#[cfg(feature = "admin")]
pub(crate) use classify::ProbeCaller;

/// The header a probe's `httpHeaders` can set to say who it is, whatever its `User-Agent`
/// became on the way (a mesh that rewrites probes): `X-Lameduck-Probe: kubelet` or
/// `X-Lameduck-Probe: load-balancer`.
pub const PROBE_HEADER: &str = "x-lameduck-probe";

/// Knative's header for kubelet's probes (any non-empty value): its queue-proxy rewrites the
/// probe and marks it so.
///
/// Any client can send it (or `X-Lameduck-Probe: kubelet`): it is read-only. It changes only
/// the answer that caller gets from `/readyz` (under
/// [`Auto`](super::ReadinessWhileDraining::Auto), `200` while draining until accepting
/// stops), never the drain or what anyone else is told; `/status` says as much to anyone.
pub const KNATIVE_PROBE_HEADER: &str = "k-kubelet-probe";

/// How a readiness caller was classified.
///
/// In JSON: `kubelet`, `load_balancer`, `other`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ProbeClass {
    /// kubelet's probe: under [`Auto`](super::ReadinessWhileDraining::Auto) it sees "ready"
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
    /// under [`Auto`](super::ReadinessWhileDraining::Auto)).
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

/// The coordinator's table of probe sources, shared by the readiness part (which writes it)
/// and the driver (which reads it into `/status` and the report).
#[derive(Debug, Default)]
pub(crate) struct SourceTable {
    seen: Mutex<Seen>,
}

/// The rows, and beside each its eviction weight (the sketch's over-estimate of its calls).
#[derive(Debug, Default)]
struct Seen {
    table: ProbeSources,
    #[cfg(feature = "admin")]
    weights: Vec<u64>,
}

impl SourceTable {
    pub(crate) fn snapshot(&self) -> ProbeSources {
        self.seen.locked().table.clone()
    }
}
