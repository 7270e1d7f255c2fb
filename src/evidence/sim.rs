//! One drain in virtual time over an arrival trace, for the simulation that checks ε
//! (`tests/evidence_sim.rs`, `examples/evidence_sim.rs`). Not a public API: it exists so the
//! simulation drives the estimator and the policy check the drain itself runs — the same
//! ring, the same window, the same fit, the same `Policy::check` — and not a copy of their
//! formulas. Nothing sleeps: the loop jumps from one check to the instant the check asks for,
//! as the drain's task would wake.

use std::time::Duration;

use tokio::time::Instant;

use super::{slot_of, Arrivals, Evidence, EvidenceKind, EvidenceReport, Window};
use crate::budget::Budget;
use crate::link::Hold;
use crate::propagation::{Check, Policy, Seen};
use crate::{ConfigError, Propagation};

/// What one simulated drain committed on.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Outcome {
    /// When the policy committed, after the trigger.
    pub commit: Duration,
    /// The evidence as the report would show it at the commit.
    pub evidence: EvidenceReport,
}

impl Outcome {
    /// What the commit went on.
    pub fn kind(&self) -> EvidenceKind {
        self.evidence.kind
    }
}

/// Runs the propagation policy of a drain triggered at `trigger` over `arrivals` (sorted
/// instants of activity, from the start of serving: each a new connection), with the budget
/// of `grace` and nothing in flight. The caller ends `arrivals` where the proxies stopped
/// routing here.
pub fn drain(
    arrivals: &[Duration],
    trigger: Duration,
    propagation: &Propagation,
    grace: Duration,
) -> Result<Outcome, ConfigError> {
    let budget = Budget::resolve(Some(grace), None, None, None)?;
    let policy = propagation.resolve(&budget)?;
    let Policy::Quiet { max, .. } = policy else {
        return Err(ConfigError::propagation(
            "the simulation runs the quiet policy; a fixed delay needs none",
        ));
    };
    let base = Instant::from_std(std::time::Instant::now());
    let ring = Arrivals::new();
    ring.observe_from(1);
    let mut next = 0;
    let mut last_connection = None;
    let origin = base + trigger;
    // Feeds the ring up to `now`, in time order, as the accept loop would have.
    let mut feed = |now: Instant, last: &mut Option<Instant>| {
        while let Some(&t) = arrivals.get(next) {
            let at = base + t;
            if at > now {
                break;
            }
            ring.record(slot_of(base, at));
            if at >= origin {
                *last = Some(at);
            }
            next += 1;
        }
    };
    feed(origin, &mut last_connection);
    let (epsilon, fallback) = match policy {
        Policy::Quiet {
            epsilon, fallback, ..
        } => (epsilon, fallback),
        Policy::Fixed(_) => unreachable!("checked above"),
    };
    let window = Window::at(&ring, base, origin, Some(base));
    let mut evidence = Evidence::new(window, epsilon, max, fallback);
    let max_at = origin + max;
    let mut now = origin;
    loop {
        feed(now, &mut last_connection);
        let last = last_connection.map(|t| slot_of(base, t));
        evidence.refit(&ring, last, slot_of(base, now));
        let seen = Seen {
            now,
            last_connection,
            last_activity: last_connection,
        };
        let kind = match policy.check(origin, max_at, &evidence, seen, Hold::None) {
            Check::Max => {
                now = now.max(max_at);
                EvidenceKind::Max
            }
            Check::Ready(kind) => kind,
            Check::Wait { until } => {
                now = until;
                continue;
            }
        };
        let silence = now.saturating_duration_since(last_connection.unwrap_or(origin).max(origin));
        return Ok(Outcome {
            commit: now - origin,
            evidence: evidence.report(kind, silence),
        });
    }
}
