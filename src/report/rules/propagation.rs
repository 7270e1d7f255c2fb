//! Propagation as observed: when the last new connection came against the policy, `max`
//! cutting the wait, and one peer dominating new connections.

use super::{advice, Ctx};
use crate::report::AdviceLevel::{Info, Warn};
use crate::report::{Advice, AdviceRule, PolicyKind};
use crate::report::{MaxReason, WeakEvidence};
use crate::vocab::phase::CommitReason;

/// Below this many requests after the drain started, propagation is not measured.
const MIN_TRAFFIC: u64 = 5;

/// `not_enough_traffic`, `no_new_connections`, or what the last new connection says
/// ([`last_new_connection`]).
pub(super) fn observed(cx: &Ctx<'_>) -> Option<Advice> {
    let af = &cx.r.after_flip;
    let p = &cx.r.propagation;
    let traffic = cx.traffic;
    // A process with no connection source at all (a worker without HTTP) and no traffic has
    // nothing to measure: saying so would be noise.
    let nothing_to_measure = traffic + af.new_connections == 0
        && (p.kind == PolicyKind::Fixed
            || p.evidence
                .as_ref()
                .is_some_and(|e| e.weak == Some(WeakEvidence::NoConnectionData)));
    if nothing_to_measure {
        None
    } else if traffic + af.new_connections < MIN_TRAFFIC {
        Some(advice(
            Info,
            AdviceRule::NotEnoughTraffic,
            traffic,
            format!(
                "not enough traffic after the flip to measure propagation ({traffic} requests, {} new connections)",
                af.new_connections
            ),
        ))
    } else if let Some(last) = af.last_new_connection_ms {
        Some(last_new_connection(cx, last))
    } else {
        Some(advice(
            Info,
            AdviceRule::NoNewConnections,
            traffic,
            format!(
                "no new connection after the drain started; {traffic} requests came on connections opened before it"
            ),
        ))
    }
}

/// The last new connection, `last` ms after the drain started, against `min` or the fixed
/// delay.
fn last_new_connection(cx: &Ctx<'_>, last: u64) -> Advice {
    let p = &cx.r.propagation;
    if p.kind == PolicyKind::Quiet && last > p.min_ms && cx.routed_until_cut {
        // A min at or above `last` is a min at max: say what happened instead.
        advice(
            Warn,
            AdviceRule::PropagationAfterMin,
            last,
            format!(
                "new connections kept arriving past min ({} ms), until {last} ms after the drain \
                 started, when max ({} ms) cut the wait: some path still routed here when the \
                 process stopped accepting; find it (after_flip.peers) — no min or max below \
                 that was safe",
                p.min_ms, p.max_ms
            ),
        )
    } else if p.kind == PolicyKind::Quiet && last > p.min_ms {
        advice(
            Warn,
            AdviceRule::PropagationAfterMin,
            last,
            format!(
                "new connections kept arriving until {last} ms after the drain started, past min ({} ms): \
                 some path took that long to stop routing here; consider min ≥ {last} ms",
                p.min_ms
            ),
        )
    } else if p.kind == PolicyKind::Fixed && last + p.quiet_ms.unwrap_or(0) > p.min_ms {
        advice(
            Warn,
            AdviceRule::PropagationAfterFixed,
            last,
            format!(
                "the last new connection came {last} ms after the drain started, close to or past the fixed delay ({} ms)",
                p.min_ms
            ),
        )
    } else {
        advice(
            Info,
            AdviceRule::PropagationObserved,
            last,
            format!(
                "the last new connection came {last} ms after the drain started, before min \
                 ({} ms, the earliest the policy commits): the paths caught up inside the floor",
                p.min_ms
            ),
        )
    }
}

/// `quiet_window_never_held`: the commit was `max`'s. Silent when the evidence was too weak
/// or traffic ran until the cut: those rules say it better.
pub(super) fn quiet_window_never_held(cx: &Ctx<'_>) -> Option<Advice> {
    let weak_at_max =
        cx.r.propagation
            .evidence
            .as_ref()
            .is_some_and(|e| e.max_reason == Some(MaxReason::NotEnoughEvidence));
    let e = cx
        .stopped
        .filter(|_| !weak_at_max && !cx.routed_until_cut)?;
    (e.reason == Some(CommitReason::Max)).then(|| {
        advice(
            Warn,
            AdviceRule::QuietWindowNeverHeld,
            e.at_ms,
            format!(
                "the quiet window never held: activity continued until max ({} ms); \
                 something still routes new work here — find that path before raising max",
                e.at_ms
            ),
        )
    })
}

/// `one_peer`: one peer opened most new connections after the drain started.
pub(super) fn one_peer(cx: &Ctx<'_>) -> Option<Advice> {
    let af = &cx.r.after_flip;
    if af.new_connections < MIN_TRAFFIC {
        return None;
    }
    let top = af.peers.first()?;
    let pct = top.new_connections * 100 / af.new_connections;
    if pct < 80 {
        return None;
    }
    let last = af.last_new_connection_ms.map_or_else(String::new, |ms| {
        format!(", the last {ms} ms after the drain started")
    });
    Some(advice(
        Info,
        AdviceRule::OnePeer,
        pct,
        format!(
            "{pct}% of new connections after the drain started ({} of {}) came from one peer, {}{last}: \
             if that is not the Service's own proxy, it is a path that bypasses the Service \
             (another Service, a direct Pod IP, a slow ingress)",
            top.new_connections, af.new_connections, top.peer
        ),
    ))
}
