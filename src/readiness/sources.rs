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

use crate::report::ProbeSources;
use crate::vocab::sync::MutexExt;

#[cfg(feature = "admin")]
pub(crate) mod classify;

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

/// The coordinator's table of probe sources, shared by the readiness part (which writes it)
/// and the driver (which reads it into `/status` and the report).
#[derive(Debug, Default)]
pub(crate) struct SourceTable {
    seen: Mutex<SourcesSeen>,
}

/// The rows, and beside each its eviction weight (the sketch's over-estimate of its calls).
#[derive(Debug, Default)]
struct SourcesSeen {
    table: ProbeSources,
    #[cfg(feature = "admin")]
    weights: Vec<u64>,
}

impl SourceTable {
    pub(crate) fn snapshot(&self) -> ProbeSources {
        self.seen.locked().table.clone()
    }
}
