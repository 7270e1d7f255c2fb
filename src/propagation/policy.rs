//! The validated policy: when propagation may commit, checked against what arrived.

use std::time::Duration;

use tokio::time::Instant;

use crate::hot::guard::Core;
use crate::propagation::confirm::{Confirmations, NodesSay};
use crate::propagation::evidence::{slot_of, Evidence, Window, DEFAULT_EPSILON};
use crate::propagation::link::{Hold, Link};
use crate::report::EvidenceKind;
use crate::report::{PolicyKind, PolicyReport};
use crate::vocab::phase::CommitReason;

/// A validated policy, offsets from the origin.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Policy {
    Quiet {
        quiet: Duration,
        min: Duration,
        max: Duration,
        fallback: Option<Duration>,
        epsilon: f64,
        /// The peers declared to route per request.
        per_request: super::PeerSet,
        /// The node agents to ask.
        agents: super::confirm::NodeAgents,
    },
    Fixed(Duration),
}

/// What the policy makes of one check: see [`Policy::check`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Check {
    /// `max` is reached.
    Max,
    /// Past `max`, every node's agent said its rules no longer route here: commit on their
    /// word (`confirmed`), not on `max`, whatever is in flight.
    ConfirmedPastMax,
    /// The window holds: commit on `kind` once nothing is in flight.
    Ready(EvidenceKind),
    /// Not before `until` (re-check then, or when the slices change).
    Wait { until: Instant },
}

/// When the policy must commit: `max_at`, the cap on guessing; and `cap_at`, the latest it
/// may serve past `max` while new connections show it is still routed here (what the budget
/// for the rest of the shutdown allows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limits {
    pub(crate) max_at: Instant,
    pub(crate) cap_at: Instant,
}

impl Limits {
    /// `max_at`, and a cap `reserve` before the quiesce deadline `quiesce` (never before
    /// `max_at`): what is in flight at the commit keeps that long before it is cut.
    pub(crate) fn new(max_at: Instant, quiesce: Instant) -> Self {
        let room = quiesce.saturating_duration_since(max_at);
        let reserve = (room / 2).min(Duration::from_secs(1));
        Self {
            max_at,
            cap_at: (quiesce - reserve).max(max_at),
        }
    }
}

/// What one check reads: the clock and what arrived.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seen {
    pub(crate) now: Instant,
    /// The last new connection after the trigger.
    pub(crate) last_connection: Option<Instant>,
    /// The last new connection or request after the trigger.
    pub(crate) last_activity: Option<Instant>,
}

impl Policy {
    pub(crate) fn report(&self) -> PolicyReport {
        let ms = |d: Duration| d.as_millis() as u64;
        match *self {
            Policy::Quiet {
                quiet, min, max, ..
            } => PolicyReport {
                kind: PolicyKind::Quiet,
                quiet_ms: Some(ms(quiet)),
                min_ms: ms(min),
                max_ms: ms(max),
                evidence: None,
            },
            Policy::Fixed(d) => PolicyReport {
                kind: PolicyKind::Fixed,
                quiet_ms: None,
                min_ms: ms(d),
                max_ms: ms(d),
                evidence: None,
            },
        }
    }

    /// The evidence at the trigger `now`: the window of slots before it, fitted.
    pub(crate) fn evidence_at(&self, core: &Core, now: Instant) -> Evidence {
        let (epsilon, max, fallback, peers) = match self {
            Policy::Quiet {
                epsilon,
                max,
                fallback,
                per_request,
                ..
            } => (*epsilon, *max, *fallback, per_request.clone()),
            Policy::Fixed(d) => (DEFAULT_EPSILON, *d, None, super::PeerSet::default()),
        };
        let window = Window::at(
            core.observed().arrivals(),
            core.observed().base(),
            now,
            core.observed().serving_since(),
        );
        let mut evidence = Evidence::new(window, epsilon, max, fallback).per_request(peers);
        evidence.refit(
            core.observed().arrivals(),
            now,
            slot_of(core.observed().base(), now),
        );
        evidence
    }

    /// Refits `evidence` with what arrived since the trigger `origin`, as of now.
    pub(crate) fn refit(core: &Core, origin: Instant, evidence: &mut Evidence) {
        evidence.refit(
            core.observed().arrivals(),
            origin,
            slot_of(core.observed().base(), Instant::now()),
        );
    }

    /// The node agents to ask, if any.
    pub(crate) fn node_agents(&self) -> Option<&super::confirm::NodeAgents> {
        match self {
            Policy::Quiet { agents, .. } if !agents.is_empty() => Some(agents),
            _ => None,
        }
    }

    /// What the policy expects to commit on, while it waits, with the slices' `hold`.
    pub(crate) fn waiting_on(&self, evidence: &Evidence, hold: Hold) -> EvidenceKind {
        let hold = hold.judged(evidence.weak().is_none());
        match *self {
            Policy::Fixed(_) => EvidenceKind::Fixed,
            Policy::Quiet { .. } if matches!(hold, Hold::Pending | Hold::Until(_)) => {
                EvidenceKind::EndpointSlice
            }
            Policy::Quiet { .. } if evidence.weak().is_none() => EvidenceKind::Confidence,
            Policy::Quiet {
                fallback: Some(_), ..
            } => EvidenceKind::Fallback,
            Policy::Quiet { .. } => EvidenceKind::Max,
        }
    }

    /// One check of the quiet policy: the rule itself, with no clock, no task and no I/O, so
    /// the simulation (`propagation::sim`) drives the same code as the drain. `evidence` is
    /// refitted to what `seen` says arrived; `limits.max_at` is `origin + max` or earlier.
    ///
    /// At `max` a path whose new connections are still arriving is still routed here: `max`
    /// caps how long the policy guesses, it does not end a drain that can see it is still
    /// routed. So from `max` on it waits while some path's last new connection is recent for
    /// that path ([`Evidence::routed_until`]: a silence it shows by chance less than once in
    /// 1/ε drains), up to `limits.cap_at`.
    pub(crate) fn check(
        &self,
        origin: Instant,
        limits: Limits,
        evidence: &Evidence,
        seen: Seen,
        (hold, nodes): (Hold, NodesSay),
    ) -> Check {
        let max_at = limits.max_at;
        let Policy::Quiet {
            quiet,
            min,
            fallback,
            ..
        } = *self
        else {
            return Check::Max;
        };
        if seen.now >= max_at {
            return past_max(evidence, origin, limits, seen.now, nodes);
        }
        let hold = hold.judged(evidence.weak().is_none());
        let last_conn = seen.last_connection.unwrap_or(origin).max(origin);
        // With connection data, only new connections are routing decisions: requests on
        // open connections (a pool, an HTTP/2 connection accepted during the drain, which
        // gets its GOAWAY at the commit) say nothing about the proxies and must not hold
        // the window open. Without it, requests are the only signal there is.
        let last = if evidence.has_data() {
            last_conn
        } else {
            seen.last_activity.unwrap_or(origin).max(origin)
        };
        // When every path's silence proves its convergence, counted on the slot grid;
        // `None`: the arrival data cannot say how long to wait, only the fallback or max can.
        let proved_at = evidence.conf_at();
        let conf_at = proved_at.unwrap_or(max_at);
        let (conf_at, kind) =
            commit_at(evidence, (origin, max_at, conf_at), fallback, (hold, nodes));
        let ready_at = (last + quiet).max(origin + min).max(conf_at);
        let pending = hold == Hold::Pending && kind != EvidenceKind::Confirmed;
        if !pending && seen.now >= ready_at {
            return Check::Ready(kind);
        }
        // Data that cannot say now may say at the next slot: a path that comes back after
        // each close shows it routes per request once it opened more than a reconnect wave,
        // and the slots after the trigger are samples of its rate. Without a look at each
        // slot a drain that could not say at its first check waited to `max` whatever came
        // after (a pool behind kube-proxy 8 s behind: silent from 4.0 s, committed at 15 s).
        let until = match evidence.next_slot() {
            Some(next) if proved_at.is_none() => ready_at.min(next),
            _ => ready_at,
        };
        Check::Wait {
            until: until.min(max_at),
        }
    }

    /// Waits until the policy commits, and says on what evidence. Event-driven: it sleeps
    /// until the earliest instant the policy could hold (while the evidence cannot say, the
    /// next slot), or until in-flight work reaches zero, or until the `link` changes, then
    /// refits the evidence with what arrived and re-checks.
    ///
    /// `max_at` is `origin + max`, unless a deletion with a shorter grace left less (the
    /// driver's deadlines); the link's [`Hold`] is the EndpointSlice's say (feature `kube`).
    /// `on_hold` is called with the instant the window held while work was in flight (once
    /// per such wait; the caller names that work): [`Commit::held_since`] says whether that
    /// wait was the last one before the commit.
    pub(crate) async fn commit(
        &self,
        core: &Core,
        origin: Instant,
        evidence: &mut Evidence,
        (link, nodes): (&Link, Option<&Confirmations>),
        limits: impl Fn() -> Limits,
        mut on_hold: impl FnMut(Instant),
    ) -> Commit {
        let mut changes = link.subscribe();
        let mut answers = nodes.map(Confirmations::subscribe);
        let say = || nodes.map_or(NodesSay::Nothing, Confirmations::say);
        if let Policy::Fixed(_) = self {
            // The delay, unless this deletion's grace leaves less.
            link.sleep_until(|| limits().max_at).await;
            return Commit::new(CommitReason::Fixed, EvidenceKind::Fixed, None);
        }
        // Set while the window holds and in-flight work keeps the commit waiting.
        let mut held_since = None;
        loop {
            Self::refit(core, origin, evidence);
            let limits = limits();
            let max_at = limits.max_at;
            let seen = Seen {
                now: Instant::now(),
                last_connection: core.observed().last_new_connection(),
                last_activity: core.observed().last_activity(),
            };
            match self.check(origin, limits, evidence, seen, (link.hold(), say())) {
                Check::Max => return Commit::new(CommitReason::Max, EvidenceKind::Max, held_since),
                Check::ConfirmedPastMax => {
                    return Commit::new(CommitReason::Quiet, EvidenceKind::Confirmed, held_since)
                }
                Check::Ready(kind) => {
                    if core.counter.is_drained() {
                        return Commit::new(CommitReason::Quiet, kind, held_since);
                    }
                    if held_since.is_none() {
                        held_since = Some(seen.now);
                        on_hold(seen.now);
                    }
                    // Quiet, but something is in flight: wait for zero (or max), then re-check
                    // the window.
                    tokio::select! {
                        () = core.wait_zero() => {}
                        () = tokio::time::sleep_until(max_at) => {}
                        _ = changes.changed() => {}
                        () = answer_changed(&mut answers) => {}
                    }
                }
                Check::Wait { until } => {
                    // The window no longer holds: what was in flight did not set the time.
                    held_since = None;
                    tokio::select! {
                        () = tokio::time::sleep_until(until) => {}
                        // The slices changed, or the deletion shortened `max`: re-check.
                        _ = changes.changed() => {}
                        // A node agent's verdict changed: re-check.
                        () = answer_changed(&mut answers) => {}
                    }
                }
            }
        }
    }
}

/// When the policy may commit and on what, before the quiet window and `min`: the silence's
/// proof (`conf_at`, or `max_at` when the arrivals cannot say), the fallback, the slices'
/// `hold` and the node agents' word.
fn commit_at(
    evidence: &Evidence,
    (origin, max_at, conf_at): (Instant, Instant, Instant),
    fallback: Option<Duration>,
    (hold, nodes): (Hold, NodesSay),
) -> (Instant, EvidenceKind) {
    match hold {
        // Every node's proxy said it stopped routing here: only the paths declared to
        // route per request (which kube-proxy does not route) still need their silence.
        _ if matches!(nodes, NodesSay::Confirmed(_)) => {
            let NodesSay::Confirmed(at) = nodes else {
                unreachable!()
            };
            (
                evidence.conf_at_nodes_confirmed(at).unwrap_or(max_at),
                EvidenceKind::Confirmed,
            )
        }
        // The slices are the authoritative step: no commit before they stop routing
        // here plus the proxies' allowance; strong arrival evidence still adds its
        // silence, weak evidence no longer waits to `max`.
        // A pool's wait is for reconnects through proxies that may still route here; the
        // slices plus the allowance say they no longer do, so only the silences count.
        Hold::Until(allowed) => (
            evidence
                .conf_at_proxies_converged()
                .map_or(allowed, |t| allowed.max(t)),
            EvidenceKind::EndpointSlice,
        ),
        Hold::Pending => (max_at, EvidenceKind::EndpointSlice),
        // An unmeasured allowance is a floor, not proof: what the arrival evidence alone
        // would commit on, and not before the slices plus the allowance. So is a measured
        // one while some path's arrivals cannot judge its silence (`Hold::judged`).
        Hold::None | Hold::Floor(_) | Hold::Measured(_) => {
            let alone = match fallback {
                Some(f) if origin + f < conf_at => (origin + f, EvidenceKind::Fallback),
                _ => (conf_at, EvidenceKind::Confidence),
            };
            match hold {
                Hold::Floor(at) if at > alone.0 => (at, EvidenceKind::EndpointSlice),
                _ => alone,
            }
        }
    }
}

/// A check at or after `max`: wait while some path is still visibly routed here, or some
/// node's agent says its rules still route here, up to the cap; else commit.
fn past_max(
    evidence: &Evidence,
    origin: Instant,
    limits: Limits,
    now: Instant,
    nodes: NodesSay,
) -> Check {
    // Past the cap: nothing more to outwait. Every node's proxy said it no longer routes
    // here: the commit rests on their word.
    if now >= limits.cap_at {
        return Check::Max;
    }
    if matches!(nodes, NodesSay::Confirmed(_)) {
        return Check::ConfirmedPastMax;
    }
    if nodes == (NodesSay::Waiting { routed: true }) {
        // Asked again every poll; an answer that changes wakes the policy before that.
        return Check::Wait {
            until: (now + crate::propagation::confirm::POLL).min(limits.cap_at),
        };
    }
    match evidence.routed_until(origin, limits.cap_at) {
        Some(until) if until > now => Check::Wait {
            until: until.min(limits.cap_at),
        },
        _ => Check::Max,
    }
}

/// Resolves when an agent's verdict changes; never without agents.
async fn answer_changed(answers: &mut Option<tokio::sync::watch::Receiver<()>>) {
    let gone = match answers {
        Some(rx) => rx.changed().await.is_err(),
        None => true,
    };
    if gone {
        std::future::pending::<()>().await;
    }
}

/// What [`Policy::commit`] committed on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Commit {
    pub(crate) reason: CommitReason,
    pub(crate) kind: EvidenceKind,
    /// When the window held while work was in flight, if the commit then waited for it: the
    /// in-flight work, not the silence, set the commit's time.
    pub(crate) held_since: Option<Instant>,
}

impl Commit {
    pub(crate) fn new(
        reason: CommitReason,
        kind: EvidenceKind,
        held_since: Option<Instant>,
    ) -> Self {
        Self {
            reason,
            kind,
            held_since,
        }
    }
}

/// Silence so far: since the later of the trigger and the last new connection.
pub(crate) fn silence(core: &Core, origin: Instant) -> Duration {
    let last = core
        .observed()
        .last_new_connection()
        .unwrap_or(origin)
        .max(origin);
    Instant::now().saturating_duration_since(last)
}

// The tests open connections as the accept loop of the `http` feature does.
#[cfg(all(test, feature = "http", not(lameduck_loom)))]
mod tests {
    use super::*;
    use crate::drain::signal::Signals;
    use crate::drain::Drain;
    use crate::report::WeakEvidence;

    const SECOND: Duration = Duration::from_secs(1);

    /// `max_at`, and no serving past it.
    fn limits(max_at: Instant) -> Limits {
        Limits {
            max_at,
            cap_at: max_at,
        }
    }

    fn quiet() -> Policy {
        Policy::Quiet {
            quiet: Duration::from_millis(500),
            min: Duration::ZERO,
            max: Duration::from_secs(15),
            fallback: None,
            epsilon: DEFAULT_EPSILON,
            per_request: super::super::PeerSet::default(),
            agents: super::super::confirm::NodeAgents::default(),
        }
    }

    /// A drain that has seen a new connection every `every` for 30 s, and the evidence at
    /// the trigger, right after the last of them.
    async fn served(every: Duration) -> (Drain, Evidence, Instant) {
        let d = Drain::builder()
            .grace_period(Duration::from_secs(30))
            .signals(Signals::none())
            .report_to_stderr(false)
            .termination_log(None)
            .build()
            .unwrap();
        d.core().observed().observe_arrivals();
        d.readiness().mark_serving();
        let n = (Duration::from_secs(30).as_millis() / every.as_millis()) as u32;
        for _ in 0..n {
            tokio::time::sleep(every).await;
            // Accepted and closed at once, from one peer (connections of no known peer share
            // a row that proves nothing).
            let (_, path) = crate::drain::ServeSeam::new(&d)
                .note_connection(Some("198.18.0.9:40000".parse().unwrap()));
            d.core().observed().arrivals().closed(path);
        }
        let origin = Instant::now();
        let mut evidence = quiet().evidence_at(d.core(), origin);
        Policy::refit(d.core(), origin, &mut evidence);
        (d, evidence, origin)
    }

    fn seen(now: Instant) -> Seen {
        Seen {
            now,
            last_connection: None,
            last_activity: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_measured_allowance_is_proof_while_every_path_judges_its_silence() {
        // 20 connections a second: the path's silence can say, in well under a second.
        let (_d, evidence, origin) = served(Duration::from_millis(50)).await;
        assert_eq!(evidence.weak(), None);
        let max_at = origin + 15 * SECOND;
        let allowed = origin + 3 * SECOND;
        let policy = quiet();
        for hold in [Hold::Measured(allowed), Hold::Until(allowed)] {
            assert_eq!(
                policy.check(
                    origin,
                    limits(max_at),
                    &evidence,
                    seen(origin + 2 * SECOND),
                    (hold, NodesSay::Nothing)
                ),
                Check::Wait { until: allowed },
                "{hold:?}"
            );
            assert_eq!(
                policy.check(
                    origin,
                    limits(max_at),
                    &evidence,
                    seen(allowed),
                    (hold, NodesSay::Nothing)
                ),
                Check::Ready(EvidenceKind::EndpointSlice),
                "{hold:?}"
            );
        }
        assert_eq!(
            policy.waiting_on(&evidence, Hold::Measured(allowed)),
            EvidenceKind::EndpointSlice
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_measured_allowance_is_a_floor_while_a_path_is_too_sparse_to_judge() {
        // One connection a second: too sparse for its silence to say anything before `max`.
        let (_d, evidence, origin) = served(SECOND).await;
        assert_eq!(evidence.weak(), Some(WeakEvidence::TooSparse));
        let max_at = origin + 15 * SECOND;
        let allowed = origin + 3 * SECOND;
        let policy = quiet();
        // Configured: the operator knows the proxies, so the allowance alone commits.
        assert_eq!(
            policy.check(
                origin,
                limits(max_at),
                &evidence,
                seen(allowed),
                (Hold::Until(allowed), NodesSay::Nothing)
            ),
            Check::Ready(EvidenceKind::EndpointSlice)
        );
        // Measured: one sample of each proxy's delay; the path that cannot judge its own
        // silence holds the drain to `max`, as the default allowance does — looking again at
        // the next slot, when its data may say more.
        for hold in [Hold::Measured(allowed), Hold::Floor(allowed)] {
            let next = evidence.next_slot().expect("refitted");
            assert!(next < max_at);
            assert_eq!(
                policy.check(
                    origin,
                    limits(max_at),
                    &evidence,
                    seen(allowed),
                    (hold, NodesSay::Nothing)
                ),
                Check::Wait { until: next },
                "{hold:?}"
            );
            assert_eq!(
                policy.check(
                    origin,
                    limits(max_at),
                    &evidence,
                    seen(max_at),
                    (hold, NodesSay::Nothing)
                ),
                Check::Max,
                "{hold:?}"
            );
        }
        assert_eq!(
            policy.waiting_on(&evidence, Hold::Measured(allowed)),
            EvidenceKind::Max
        );
        assert_eq!(
            policy.waiting_on(&evidence, Hold::Until(allowed)),
            EvidenceKind::EndpointSlice
        );
    }
}
