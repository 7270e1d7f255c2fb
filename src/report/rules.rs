//! Advice computed from one drain's measurements, each line with the number it came from.
//!
//! Every rule reads only the [`DrainReport`]: what this process saw. None of them claims more
//! than that — a quiet drain here says nothing about a proxy that sends to other Pods.
//!
//! # The rules
//!
//! A rule is a small function that reads a [`Ctx`] (the report, and the few numbers several
//! rules share) and returns what it has to say: `Option<Advice>`, or `Vec<Advice>` for a rule
//! with a line for each of several things (one per Service). [`RULES`] lists them in the order
//! their lines come out; [`advise`] walks it, then puts warnings first (a stable sort, so
//! within a level the order is the table's). The files group the rules by topic:
//!
//! - `propagation.rs`: when the last new connection came, against the policy; `max` cutting
//!   the wait; one peer dominating new connections.
//! - `evidence.rs`: what the commit went on, and the EndpointSlice's own warnings.
//! - `work.rs`: requests, tasks and closers the drain cut or that failed.
//! - `budget.rs`: the quiesce window, `serve`'s idle timeout and the grace period.
//!
//! To add a rule: add an [`AdviceRule`] variant (`report/advice.rs`, with its documented
//! name), write its function in the file of its topic (a new file for a new topic), and enter
//! it in [`RULES`] as `Rule::One(file::name)` (or `Rule::Each`) where its line belongs. A
//! rule that would repeat another's conditions to exclude it belongs in the same function,
//! as one `if … else if` (the propagation rules are one such chain).
//!
//! [`AdviceRule`]: crate::report::AdviceRule

use crate::report::{Advice, AdviceLevel, AdviceRule, DrainReport};
use crate::vocab::phase::{CommitReason, Event, EventKind};

mod budget;
mod evidence;
mod propagation;
mod work;

/// What every rule reads: the report, and the numbers several rules share.
struct Ctx<'a> {
    r: &'a DrainReport,
    /// Requests after the drain started, on new and reused connections.
    traffic: u64,
    /// When the process stopped accepting (the commit), if it did.
    stopped: Option<&'a Event>,
    /// The policy's quiet window, or its `min` without one.
    quiet: u64,
    /// The commit was `max`'s and new connections still came within the quiet window before
    /// it: traffic ran until `max` cut it off.
    routed_until_cut: bool,
}

impl<'a> Ctx<'a> {
    fn new(r: &'a DrainReport) -> Self {
        let af = &r.after_flip;
        let p = &r.propagation;
        let stopped = r.event(EventKind::StoppedAccepting);
        let quiet = p.quiet_ms.unwrap_or(p.min_ms);
        Self {
            r,
            traffic: af.requests_on_new_connections + af.requests_on_reused_connections,
            stopped,
            quiet,
            routed_until_cut: stopped.is_some_and(|e| {
                e.reason == Some(CommitReason::Max)
                    && af
                        .last_new_connection_ms
                        .is_some_and(|last| last + quiet >= e.at_ms)
            }),
        }
    }

    /// Any request arrived after the drain started.
    fn requests(&self) -> bool {
        self.traffic > 0
    }
}

/// A rule as the table holds it.
enum Rule {
    /// A rule with one line to say, or none.
    One(fn(&Ctx<'_>) -> Option<Advice>),
    /// A rule with a line for each of several things.
    Each(fn(&Ctx<'_>) -> Vec<Advice>),
}

/// Every rule, in the order its lines come out (before warnings move first).
const RULES: &[Rule] = &[
    Rule::One(propagation::observed),
    Rule::One(evidence::commit),
    Rule::Each(evidence::publish_not_ready_addresses),
    Rule::One(evidence::endpoint_slice_unavailable),
    Rule::Each(evidence::declared_peer_like_a_pool),
    Rule::Each(evidence::node_agents_unanswered),
    Rule::One(propagation::quiet_window_never_held),
    Rule::One(propagation::one_peer),
    Rule::One(work::requests_cut),
    Rule::One(work::tasks_cut),
    Rule::One(work::tasks_panicked),
    Rule::One(work::closers_skipped),
    Rule::One(work::closers_failed),
    Rule::One(budget::in_flight_late),
    Rule::One(budget::server_idle_timeout_short),
    Rule::One(budget::shortened),
    Rule::One(budget::grace),
];

fn advice(level: AdviceLevel, rule: AdviceRule, observed: u64, message: String) -> Advice {
    Advice::new(level, rule, observed, message)
}

/// Seconds with one decimal, for messages.
fn secs(ms: u64) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}

/// Computes the advice for a finished drain, most important first.
///
/// Rules: observed propagation (the last new connection after the drain started) against the
/// policy's `min` and `quiet`; a commit forced by `max`; requests still running at the quiesce
/// deadline; the evidence the commit went on (and, when it was too weak, its numbers and what to
/// set); how late in-flight work reached zero against the quiesce window; the headroom
/// left in the grace period; new connections dominated by one peer (a path that bypasses the
/// Service). With too little traffic after the flip it says so instead of guessing.
pub fn advise(r: &DrainReport) -> Vec<Advice> {
    let cx = Ctx::new(r);
    let mut out = Vec::new();
    for rule in RULES {
        match rule {
            Rule::One(says) => out.extend(says(&cx)),
            Rule::Each(says) => out.extend(says(&cx)),
        }
    }
    // Warnings first; the order within a level is the table's.
    out.sort_by_key(|a| a.level);
    out
}
