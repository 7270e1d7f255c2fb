//! The propagation wait's part of the drive: the policy, the evidence it waits on while the
//! drain propagates, and the record of what it went on once it committed.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::endpoints::endpoint_evidence;
use super::record::Lifecycle;
use super::stragglers::in_flight_work;
use crate::hot::guard::Core;
use crate::propagation::confirm::Confirmations;
use crate::propagation::evidence::Evidence;
use crate::propagation::link::Link;
use crate::propagation::{silence, Commit, Limits, Policy};
use crate::report::{EvidenceKind, EvidenceReport, InFlightHold, PolicyReport};
use crate::vocab::phase::CommitReason;

/// The propagation policy, and what its commit went on.
#[derive(Debug)]
pub(super) struct Commitment {
    policy: Policy,
}

impl Commitment {
    pub(super) fn new(policy: Policy) -> Self {
        Self { policy }
    }

    /// The latest the policy commits, from the trigger: `max`, or the fixed delay.
    pub(super) fn max(&self) -> Duration {
        match self.policy {
            Policy::Quiet { max, .. } => max,
            Policy::Fixed(d) => d,
        }
    }

    /// The policy's settings, as the report gives them.
    pub(super) fn report(&self) -> PolicyReport {
        self.policy.report()
    }

    /// The arrival-rate evidence at the trigger, `at`.
    pub(super) fn evidence_at(&self, core: &Core, at: Instant) -> Evidence {
        self.policy.evidence_at(core, at)
    }

    /// Waits for the policy to commit (by `max`, or past it up to the cap while new
    /// connections show the process still routed; at once when the process `never_served` or
    /// `force` fires), and returns why with what it went on.
    pub(super) async fn wait(
        &self,
        core: &Core,
        (origin, origin_unix_ms): (Instant, u64),
        (mut evidence, never_served): (Evidence, bool),
        link: &Link,
        limits: impl Fn() -> Limits,
        force: &CancellationToken,
    ) -> (CommitReason, EvidenceReport) {
        // What was in flight when the window held, should the commit wait for it.
        let mut in_flight_then = None;
        // The node agents, asked from the trigger to the commit.
        let nodes = self.policy.node_agents().map(Confirmations::new);
        let mut asking = nodes.clone().map(|c| tokio::spawn(c.ask_until_dropped()));
        let commit = if never_served {
            // Never ready, so never in any proxy's endpoints: nothing to wait for.
            Commit::new(CommitReason::NeverServed, EvidenceKind::NeverServed, None)
        } else {
            let on_hold = |at: Instant| {
                in_flight_then = Some((
                    core.counter.count(),
                    in_flight_work(core, at, origin, InFlightHold::LISTED).named,
                ));
            };
            let sources = (link, nodes.as_deref());
            let commit = tokio::select! {
                r = self.policy.commit(core, origin, &mut evidence, sources, &limits, on_hold) => r,
                () = force.cancelled() => {
                    Commit::new(CommitReason::Forced, EvidenceKind::Cut, None)
                }
            };
            if let Some(t) = asking.take() {
                t.abort();
            }
            commit
        };
        // What arrived up to the commit is part of what it went on.
        Policy::refit(core, origin, &mut evidence);
        let mut committed = evidence.report(commit.kind, silence(core, origin));
        if let (Some(since), Some((count, mut work))) = (commit.held_since, in_flight_then) {
            work.sort_by_key(|w| std::cmp::Reverse(w.age_ms));
            work.truncate(InFlightHold::LISTED);
            committed.in_flight_hold = Some(InFlightHold {
                since_ms: since.saturating_duration_since(origin).as_millis() as u64,
                waited_ms: since.elapsed().as_millis() as u64,
                in_flight: count as u64,
                work,
            });
        }
        // Served past `max` while new connections kept arriving: how long, and whether the cap
        // cut it before their silence showed they had stopped.
        let now = Instant::now();
        let Limits { max_at, cap_at } = limits();
        let past = commit.reason == CommitReason::Max || commit.kind == EvidenceKind::Confirmed;
        if past && now > max_at + Duration::from_millis(50) {
            committed.past_max_ms = Some(now.saturating_duration_since(max_at).as_millis() as u64);
            committed.still_routed_at_cap = now >= cap_at
                && evidence
                    .routed_until(origin, cap_at)
                    .is_some_and(|u| u >= cap_at);
        }
        if let Some(c) = &nodes {
            committed.nodes = c.report(origin, origin_unix_ms);
        }
        endpoint_evidence(link, &mut committed, origin);
        let committed = crate::report::evidence_json::fixed_only(committed);
        (commit.reason, committed)
    }

    /// While draining, the evidence the policy waits on now, from the evidence the `record`
    /// took at the trigger; once committed, what it went on.
    pub(super) fn evidence_now(
        &self,
        core: &Core,
        link: &Link,
        record: &Lifecycle,
    ) -> Option<EvidenceReport> {
        let (evidence, committed, origin) = record.evidence_now();
        let origin = origin.map(|o| o.at);
        if committed.is_some() {
            return committed;
        }
        let (mut evidence, origin) = (evidence?, origin?);
        Policy::refit(core, origin, &mut evidence);
        let kind = self.policy.waiting_on(&evidence, link.hold());
        let mut report = evidence.report(kind, silence(core, origin));
        endpoint_evidence(link, &mut report, origin);
        Some(crate::report::evidence_json::fixed_only(report))
    }
}
