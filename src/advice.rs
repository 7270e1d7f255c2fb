//! Advice computed from one drain's measurements, each line with the number it came from.
//!
//! Every rule reads only the [`DrainReport`]: what this process saw. None of them claims more
//! than that — a quiet drain here says nothing about a proxy that sends to other Pods.

use crate::action::ActionResult;
use crate::evidence::{EvidenceKind, EvidenceReport, MaxReason, WeakEvidence};
use crate::phase::{CommitReason, EventKind};
use crate::report::{
    Advice, AdviceLevel, AdviceRule as Rule, DrainReport, PolicyKind, PolicyReport, StragglerKind,
};
use crate::tasks::TaskResult;

fn advice(level: AdviceLevel, rule: Rule, observed: u64, message: String) -> Advice {
    Advice::new(level, rule, observed, message)
}

/// Below this many requests after the drain started, propagation is not measured.
const MIN_TRAFFIC: u64 = 5;

/// The idle timeout proxies commonly keep pooled upstream connections for (nginx's upstream
/// `keepalive_timeout`, common cloud load-balancer defaults): a server idle timeout below it
/// invites resets on reused connections.
const PROXY_IDLE_TIMEOUT_MS: u64 = 60_000;

/// What the rules check before they speak, beyond the numbers of one rule.
#[derive(Clone, Copy)]
struct Seen {
    /// Any request arrived after the drain started.
    requests: bool,
    /// The commit was `max`'s and new connections still came within the quiet window before
    /// it: traffic ran until `max` cut it off.
    routed_until_cut: bool,
}

/// Seconds with one decimal, for messages.
fn secs(ms: u64) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}

/// What the propagation evidence says: why the drain waited as long as it did.
fn evidence_advice(
    out: &mut Vec<Advice>,
    e: &EvidenceReport,
    stopped_ms: u64,
    p: &PolicyReport,
    seen: Seen,
) {
    use AdviceLevel::{Info, Warn};
    let rate = e.rate_per_s().unwrap_or(0.0);
    let quiet = p.quiet_ms.unwrap_or(p.min_ms);
    // New connections still came when max cut the wait: the proxies had *not* converged, so
    // a floor below max, or a lower max, would have cut them off sooner (rule `propagation_after_min`
    // says where they came from).
    let set = if seen.routed_until_cut {
        "New connections kept coming until the cut, so the proxies had not converged: find that path \
         before shortening the wait"
    } else {
        "If your proxies converge faster, set `Propagation::quiet_suffices_after` to that (a fallback, not a floor), or lower max"
    };
    match (e.kind, e.weak) {
        (EvidenceKind::Max, Some(WeakEvidence::NoConnectionData))
            if e.max_reason == Some(MaxReason::NotEnoughEvidence) =>
        {
            // Requests arrived, but no connection was ever counted: the server does not count
            // them (a wiring matter). Nothing arrived at all: an idle process, not a bug.
            let why = if seen.requests {
                "requests arrived but no connection was counted: serve with lameduck::serve or \
                 lameduck::axum_serve, or count a custom loop's connections with ConnMeta::accepted \
                 (axum::serve's own connect info cannot count them)"
            } else {
                "nothing arrived: no request during the drain, no connection counted before it"
            };
            out.push(advice(
                if seen.requests { Warn } else { Info },
                Rule::NoConnectionData,
                stopped_ms,
                format!(
                    "{why}; without an arrival rate, silence is not evidence, so the drain waited \
                     {} (max). {set}",
                    secs(stopped_ms)
                ),
            ));
        }
        (EvidenceKind::Max, Some(WeakEvidence::TooFewSlots))
            if e.max_reason == Some(MaxReason::NotEnoughEvidence) =>
        {
            out.push(advice(
                Warn,
                Rule::WeakEvidence,
                stopped_ms,
                format!(
                    "the process had served for only {} before the drain, too short to measure a rate: \
                     waited {} (max). {set}",
                    secs(e.slots_observed * e.slot_ms),
                    secs(stopped_ms)
                ),
            ));
        }
        (EvidenceKind::Max, Some(_)) if e.max_reason == Some(MaxReason::NotEnoughEvidence) => {
            out.push(advice(
                Warn,
                Rule::WeakEvidence,
                stopped_ms,
                format!(
                    "{rate:.2} {}/s before the drain ({} of {} slots of {} ms empty): \
                     {} of silence is not evidence, confidence needed {}; waited {} (max). \
                     {set}",
                    if e.requests_seen { "arrivals" } else { "new connections" },
                    e.empty_slots,
                    e.slots_observed,
                    e.slot_ms,
                    secs(quiet),
                    e.t_conf_ms.map_or_else(|| "more than max".to_owned(), secs),
                    secs(stopped_ms)
                ),
            ));
        }
        (EvidenceKind::NeverServed, _) => out.push(advice(
            Info,
            Rule::NeverServed,
            stopped_ms,
            format!(
                "the drain started while the process was still starting (never ready): no proxy \
                 routed here, so it stopped accepting after {} instead of waiting for propagation \
                 (max {})",
                secs(stopped_ms),
                secs(p.max_ms)
            ),
        )),
        (EvidenceKind::Confidence, _) => out.push(advice(
            Info,
            Rule::Confidence,
            e.t_conf_ms.unwrap_or(0),
            format!(
                "committed on evidence: {rate:.2} arrivals/s ({} slots before the drain, {} after; \
                 longest gap {}), so {} of silence meant the proxies had moved on (ε = {}, rule {}); \
                 silent for {} at the commit",
                e.slots_observed,
                e.slots_after_trigger,
                secs(e.longest_gap_ms.unwrap_or(0)),
                secs(e.t_conf_ms.unwrap_or(0).max(quiet)),
                e.epsilon_ppm as f64 / 1e6,
                e.rule.map_or("none", crate::SilenceRule::as_str),
                secs(e.silence_ms)
            ),
        )),
        (EvidenceKind::Fallback, _) => out.push(advice(
            Info,
            Rule::Fallback,
            stopped_ms,
            format!(
                "committed on the fallback you set (quiet_suffices_after {}): the arrival evidence \
                 alone ({rate:.2} arrivals/s) {}. It is not a floor: to never commit before it, set \
                 min as well",
                secs(e.fallback_ms.unwrap_or(0)),
                match (e.weak, e.t_conf_ms) {
                    (None, Some(t)) => format!("would have needed {} of silence", secs(t)),
                    _ => "was not enough evidence".to_owned(),
                }
            ),
        )),
        (EvidenceKind::EndpointSlice, _) => {
            let slice = e.endpoint_slice.as_ref();
            out.push(advice(
                Info,
                Rule::EndpointSlice,
                slice.and_then(|s| s.allowed_at_ms).unwrap_or(stopped_ms),
                format!(
                    "committed on the EndpointSlice: {} showed {} at {} ms after the trigger, plus \
                     the proxy allowance of {} ({}); silent for {} at the commit",
                    slice.map_or_else(|| "the slices".to_owned(), |s| s.slices.join(", ")),
                    slice.map_or("ready=false", |s| s.condition.as_str()),
                    slice.and_then(|s| s.changed_at_ms).unwrap_or(0),
                    secs(slice.map_or(0, |s| s.allowance_ms)),
                    slice.map_or("default", |s| s.allowance_source.as_str()),
                    secs(e.silence_ms)
                ),
            ))
        }
        (EvidenceKind::Max, _) if e.max_reason == Some(MaxReason::EndpointSliceStillRouting) => {
            out.push(advice(
                Warn,
                Rule::EndpointSliceStillRouting,
                stopped_ms,
                format!(
                    "an EndpointSlice still listed this Pod as ready at max ({}), or the API had \
                     not answered: proxies may still have routed here when it stopped accepting. \
                     A drain without a Pod deletion (Drain::start, a preStop call alone) leaves \
                     the slice as it is",
                    secs(stopped_ms)
                ),
            ));
        }
        _ => {}
    }
    if let Some(s) = &e.endpoint_slice {
        for svc in &s.publish_not_ready_addresses {
            out.push(advice(
                Warn,
                Rule::PublishNotReadyAddresses,
                0,
                format!(
                    "Service {svc} has publishNotReadyAddresses: true: its EndpointSlice keeps this \
                     Pod ready=true while it drains, so flipping /readyz removes nothing from it and \
                     its proxies keep sending until the Pod is gone; unset it unless this Service \
                     is for peer discovery (a StatefulSet's headless Service)"
                ),
            ));
        }
    }
    if let Some(why) = &e.endpoint_slice_unused {
        // Only a watch that was started and failed is worth a line; a build without the
        // feature is a choice.
        if why.starts_with("forbidden")
            || why.starts_with("unauthorized")
            || why.starts_with("unreachable")
            || why.starts_with("the API answered")
            || why.starts_with("no Kubernetes client")
        {
            out.push(advice(
                Info,
                Rule::EndpointSliceUnavailable,
                0,
                format!("the EndpointSlice was not the evidence: {why}; the drain went on the arrival rate"),
            ));
        }
    }
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
    use AdviceLevel::{Info, Warn};
    let mut out = Vec::new();
    let af = &r.after_flip;
    let p = &r.propagation;
    let traffic = af.requests_on_new_connections + af.requests_on_reused_connections;
    let stopped = r.event(EventKind::StoppedAccepting);
    let quiet = p.quiet_ms.unwrap_or(p.min_ms);
    let seen = Seen {
        requests: traffic > 0,
        routed_until_cut: stopped.is_some_and(|e| {
            e.reason == Some(CommitReason::Max)
                && af
                    .last_new_connection_ms
                    .is_some_and(|last| last + quiet >= e.at_ms)
        }),
    };

    // Propagation. A process with no connection source at all (a worker without HTTP) and no
    // traffic has nothing to measure: saying so would be noise.
    let nothing_to_measure = traffic + af.new_connections == 0
        && (p.kind == PolicyKind::Fixed
            || p.evidence
                .as_ref()
                .is_some_and(|e| e.weak == Some(WeakEvidence::NoConnectionData)));
    if nothing_to_measure {
        // Nothing arrived and nothing could have been counted.
    } else if traffic + af.new_connections < MIN_TRAFFIC {
        out.push(advice(
            Info,
            Rule::NotEnoughTraffic,
            traffic,
            format!(
                "not enough traffic after the flip to measure propagation ({traffic} requests, {} new connections)",
                af.new_connections
            ),
        ));
    } else if let Some(last) = af.last_new_connection_ms {
        if p.kind == PolicyKind::Quiet && last > p.min_ms && seen.routed_until_cut {
            // A min at or above `last` is a min at max: say what happened instead.
            out.push(advice(
                Warn,
                Rule::PropagationAfterMin,
                last,
                format!(
                    "new connections kept arriving until {last} ms after the drain started, when max \
                     ({} ms) cut the wait: some path still routed here when the process stopped \
                     accepting; find it (after_flip.peers) — no min or max below that was safe",
                    p.max_ms
                ),
            ));
        } else if p.kind == PolicyKind::Quiet && last > p.min_ms {
            out.push(advice(
                Warn,
                Rule::PropagationAfterMin,
                last,
                format!(
                    "new connections kept arriving until {last} ms after the drain started, past min ({} ms): \
                     some path took that long to stop routing here; consider min ≥ {last} ms",
                    p.min_ms
                ),
            ));
        } else if p.kind == PolicyKind::Fixed && last + p.quiet_ms.unwrap_or(0) > p.min_ms {
            out.push(advice(
                Warn,
                Rule::PropagationAfterFixed,
                last,
                format!(
                    "the last new connection came {last} ms after the drain started, close to or past the fixed delay ({} ms)",
                    p.min_ms
                ),
            ));
        } else {
            out.push(advice(
                Info,
                Rule::PropagationObserved,
                last,
                format!(
                    "the last new connection came {last} ms after the drain started (min {} ms)",
                    p.min_ms
                ),
            ));
        }
    } else {
        out.push(advice(
            Info,
            Rule::NoNewConnections,
            traffic,
            format!(
                "no new connection after the drain started; {traffic} requests came on connections opened before it"
            ),
        ));
    }
    let weak_at_max = p
        .evidence
        .as_ref()
        .is_some_and(|e| e.max_reason == Some(MaxReason::NotEnoughEvidence));
    if let (Some(ev), Some(stop)) = (&p.evidence, stopped) {
        evidence_advice(&mut out, ev, stop.at_ms, p, seen);
    }
    if let Some(e) = stopped.filter(|_| !weak_at_max && !seen.routed_until_cut) {
        if e.reason == Some(CommitReason::Max) {
            out.push(advice(
                Warn,
                Rule::QuietWindowNeverHeld,
                e.at_ms,
                format!(
                    "the quiet window never held: activity continued until max ({} ms); \
                     something still routes new work here — find that path before raising max",
                    e.at_ms
                ),
            ));
        }
    }

    // One peer dominating new connections.
    if af.new_connections >= MIN_TRAFFIC {
        if let Some(top) = af.peers.first() {
            let pct = top.new_connections * 100 / af.new_connections;
            if pct >= 80 {
                let last = af.last_new_connection_ms.map_or_else(String::new, |ms| {
                    format!(", the last {ms} ms after the drain started")
                });
                out.push(advice(
                    Info,
                    Rule::OnePeer,
                    pct,
                    format!(
                        "{pct}% of new connections after the drain started ({} of {}) came from one peer, {}{last}: \
                         if that is not the Service's own proxy, it is a path that bypasses the Service \
                         (another Service, a direct Pod IP, a slow ingress)",
                        top.new_connections, af.new_connections, top.peer
                    ),
                ));
            }
        }
    }

    // In-flight work against the quiesce window.
    let requests_cut: Vec<_> = r
        .stragglers
        .iter()
        .filter(|s| s.kind == StragglerKind::Request)
        .collect();
    if let Some(oldest) = requests_cut.iter().map(|s| s.age_ms).max() {
        out.push(advice(
            Warn,
            Rule::RequestsCut,
            oldest,
            format!(
                "{} requests were still running at the quiesce deadline ({} ms), the oldest {oldest} ms old: \
                 bound those handlers or raise grace_period",
                requests_cut.len(),
                r.budget.quiesce_ms
            ),
        ));
    }
    let cut: Vec<_> = r
        .stragglers
        .iter()
        .filter(|s| s.kind == StragglerKind::Task)
        .collect();
    let recovered = cut
        .iter()
        .filter(|s| s.recovery == Some(ActionResult::Ok))
        .count();
    if !cut.is_empty() {
        let tasks_cut = cut.len();
        let message = if recovered == tasks_cut {
            // Each one used spawn_with_recovery and its recovery worked: recommending it
            // again would be wrong; what is left is that the task did not end by itself.
            format!(
                "{tasks_cut} background tasks were still running at the quiesce deadline and were \
                 aborted; their recovery actions ran and reported ok, so their work was handed \
                 back. The drain still counts as deadline_exceeded (exit 1): the tasks did not end \
                 by themselves. Return on TaskContext::hurry (it fires hurry_lead before the \
                 deadline), or raise grace_period"
            )
        } else {
            let with = if recovered > 0 {
                format!(" ({recovered} of them handed their work back in a recovery action)")
            } else {
                String::new()
            };
            format!(
                "{tasks_cut} background tasks were still running at the quiesce deadline{with}: a task \
                 from spawn needs a way to finish sooner (or a longer grace_period); one from \
                 spawn_cancellable must return once its stop signal fires — these did not — or \
                 hand its work back in a recovery action (spawn_with_recovery)"
            )
        };
        out.push(advice(Warn, Rule::TasksCut, tasks_cut as u64, message));
    }
    let panicked: Vec<&str> = r
        .tasks
        .iter()
        .filter(|t| t.result == TaskResult::Panicked)
        .map(|t| t.name.as_str())
        .collect();
    if !panicked.is_empty() {
        out.push(advice(
            Warn,
            Rule::TasksPanicked,
            panicked.len() as u64,
            format!(
                "{} background tasks panicked: {}; their work is not done \
                 (DrainBuilder::drain_on_task_panic replaces such a process instead of leaving it serving)",
                panicked.len(),
                panicked.join(", ")
            ),
        ));
    }
    let skipped: Vec<&str> = r
        .closers
        .iter()
        .filter(|c| c.result == ActionResult::Skipped)
        .map(|c| c.name.as_str())
        .collect();
    if !skipped.is_empty() {
        out.push(advice(
            Warn,
            Rule::ClosersSkipped,
            skipped.len() as u64,
            format!(
                "{} closers were skipped, with no time left before the hard deadline: {}; \
                 raise close_budget, bound the closers before them, or mark them critical \
                 (CloseOptions::critical)",
                skipped.len(),
                skipped.join(", ")
            ),
        ));
    }
    let failed: Vec<String> = r
        .closers
        .iter()
        .filter(|c| !c.is_ok() && c.result != ActionResult::Skipped)
        .map(|c| format!("{} ({})", c.name, c.result))
        .collect();
    if !failed.is_empty() {
        out.push(advice(
            Warn,
            Rule::ClosersFailed,
            failed.len() as u64,
            format!(
                "{} closers did not close cleanly: {}",
                failed.len(),
                failed.join(", ")
            ),
        ));
    }
    if let Some(zero) = r.event(EventKind::InFlightZero) {
        let q = r.budget.quiesce_ms;
        if q > 0 && zero.at_ms * 10 >= q * 8 {
            out.push(advice(
                Warn,
                Rule::InFlightLate,
                zero.at_ms,
                format!(
                    "in-flight requests reached zero at {} ms, {}% of the quiesce window ({q} ms): little headroom",
                    zero.at_ms,
                    zero.at_ms * 100 / q
                ),
            ));
        }
    }

    // The one layer of the timeout chain this process can see: its own idle timeout.
    if let Some(t) = r.server.as_ref().and_then(|s| s.header_read_timeout_ms) {
        if t < PROXY_IDLE_TIMEOUT_MS {
            out.push(advice(
                Warn,
                Rule::ServerIdleTimeoutShort,
                t,
                format!(
                    "serve closes a keep-alive connection after {} without a request (header_read_timeout), \
                     shorter than the {} idle timeout many proxies keep upstream connections for: \
                     a proxy that keeps one longer than this server gets a reset or a 502 on its next request over it. \
                     Set it above every proxy's idle timeout (SUGGESTED_HEADER_READ_TIMEOUT is 75 s) \
                     or lower the proxies' below it",
                    secs(t),
                    secs(PROXY_IDLE_TIMEOUT_MS)
                ),
            ));
        }
    }

    // Grace headroom.
    if let Some(pct) = (r.budget.used_ms * 100).checked_div(r.budget.grace_ms) {
        if r.budget.remaining_ms < r.budget.close_budget_ms / 2 {
            out.push(advice(
                Warn,
                Rule::GraceHeadroom,
                r.budget.remaining_ms,
                format!(
                    "only {} ms of the {} ms grace period were left at the end",
                    r.budget.remaining_ms, r.budget.grace_ms
                ),
            ));
        } else {
            out.push(advice(
                Info,
                Rule::GraceUsed,
                pct,
                format!(
                    "this drain used {} ms, {pct}% of the {} ms grace period",
                    r.budget.used_ms, r.budget.grace_ms
                ),
            ));
        }
    }

    // Warnings first; the order within a level is the order above.
    out.sort_by_key(|a| a.level);
    out
}
