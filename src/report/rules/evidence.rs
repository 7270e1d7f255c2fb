//! What the propagation evidence says: why the drain waited as long as it did, and what the
//! EndpointSlice warns of. Every rule here speaks only when the report has evidence and the
//! process stopped accepting.

use super::{advice, secs, Ctx};
use crate::report::AdviceLevel::{Info, Warn};
use crate::report::{Advice, AdviceRule};
use crate::report::{EvidenceKind, EvidenceReport, MaxReason, WeakEvidence};

/// The evidence, and when the process stopped accepting (ms after the trigger).
fn evidence<'a>(cx: &Ctx<'a>) -> Option<(&'a EvidenceReport, u64)> {
    Some((cx.r.propagation.evidence.as_ref()?, cx.stopped?.at_ms))
}

/// What the evidence the commit went on says: one line for its kind, or none.
pub(super) fn commit(cx: &Ctx<'_>) -> Option<Advice> {
    let (e, stopped_ms) = evidence(cx)?;
    let not_enough = e.max_reason == Some(MaxReason::NotEnoughEvidence);
    Some(match (e.kind, e.weak) {
        (EvidenceKind::Max, Some(WeakEvidence::NoConnectionData)) if not_enough => {
            no_connection_data(cx, stopped_ms)
        }
        (EvidenceKind::Max, Some(WeakEvidence::TooFewSlots)) if not_enough => {
            too_few_slots(cx, e, stopped_ms)
        }
        (EvidenceKind::Max, Some(WeakEvidence::KeptConnections)) if not_enough => {
            kept_connections(cx, e, stopped_ms)
        }
        (EvidenceKind::Max, Some(WeakEvidence::TooManyPeers)) if not_enough => {
            too_many_peers(cx, stopped_ms)
        }
        (EvidenceKind::Max, Some(_)) if not_enough => weak_rate(cx, e, stopped_ms),
        (EvidenceKind::NeverServed, _) => never_served(cx, stopped_ms),
        (EvidenceKind::Confidence, _) => confidence(cx, e),
        (EvidenceKind::Fallback, _) => fallback(e, stopped_ms),
        (EvidenceKind::EndpointSlice, _) => endpoint_slice(e, stopped_ms),
        (EvidenceKind::Max, _) if e.max_reason == Some(MaxReason::EndpointSliceStillRouting) => {
            still_routing(stopped_ms)
        }
        _ => return None,
    })
}

/// What to change after a wait to `max` on weak evidence.
fn what_to_set(cx: &Ctx<'_>) -> &'static str {
    // New connections still came when max cut the wait: the proxies had *not* converged, so
    // a floor below max, or a lower max, would have cut them off sooner (rule
    // `propagation_after_min` says where they came from).
    if cx.routed_until_cut {
        "New connections kept coming until the cut, so the proxies had not converged: find that path \
         before shortening the wait"
    } else {
        "If your proxies converge faster, set `Propagation::quiet_suffices_after` to that (a fallback, not a floor), or lower max"
    }
}

/// `no_connection_data`: no connection was ever counted, so silence was no evidence.
fn no_connection_data(cx: &Ctx<'_>, stopped_ms: u64) -> Advice {
    // Requests arrived, but no connection was ever counted: the server does not count
    // them (a wiring matter). Nothing arrived at all: an idle process, not a bug.
    let why = if cx.requests() {
        "requests arrived but no connection was counted: serve with lameduck::serve or \
         lameduck::axum_serve, or count a custom loop's connections with ConnMeta::accepted \
         (axum::serve's own connect info cannot count them)"
    } else {
        "nothing arrived: no request during the drain, no connection counted before it"
    };
    advice(
        if cx.requests() { Warn } else { Info },
        AdviceRule::NoConnectionData,
        stopped_ms,
        format!(
            "{why}; without an arrival rate, silence is not evidence, so the drain waited \
             {} (max). {}",
            secs(stopped_ms),
            what_to_set(cx)
        ),
    )
}

/// `weak_evidence`: the process had not served long enough to measure a rate.
fn too_few_slots(cx: &Ctx<'_>, e: &EvidenceReport, stopped_ms: u64) -> Advice {
    advice(
        Warn,
        AdviceRule::WeakEvidence,
        stopped_ms,
        format!(
            "the process had served for only {} before the drain, too short to measure a rate \
             (15 s at least): waited {} (max). {}",
            secs(e.slots_observed * e.slot_ms),
            secs(stopped_ms),
            what_to_set(cx)
        ),
    )
}

/// `weak_evidence`: the rate was measured, but too low for silence to prove anything.
fn weak_rate(cx: &Ctx<'_>, e: &EvidenceReport, stopped_ms: u64) -> Advice {
    advice(
        Warn,
        AdviceRule::WeakEvidence,
        stopped_ms,
        format!(
            "{:.2} {}/s before the drain ({} of {} slots of {} ms empty): \
             {} of silence is not evidence, confidence needed {}; waited {} (max). \
             {}",
            e.rate_per_s().unwrap_or(0.0),
            if e.requests_seen {
                "arrivals"
            } else {
                "new connections"
            },
            e.empty_slots,
            e.slots_observed,
            e.slot_ms,
            secs(cx.quiet),
            e.t_conf_ms.map_or_else(|| "more than max".to_owned(), secs),
            secs(stopped_ms),
            what_to_set(cx)
        ),
    )
}

/// `weak_evidence` for a path that kept connections alive: no silence bounds when its client
/// next connects.
fn kept_connections(cx: &Ctx<'_>, e: &EvidenceReport, stopped_ms: u64) -> Advice {
    let peer = e.held_by.as_deref().unwrap_or("a peer");
    let path = e
        .paths
        .iter()
        .find(|p| Some(p.peer.as_str()) == e.held_by.as_deref());
    let (kept, open) = path.map_or((0, 0), |p| (p.kept_alive, p.open_now));
    advice(
        Warn,
        AdviceRule::WeakEvidence,
        stopped_ms,
        format!(
            "{peer} kept connections alive ({kept} closed by the drain, {open} open at the \
             commit): a client pool opens new ones when its own demand needs them, which no \
             silence here bounds, so the drain waited {} (max). If {peer} is an L7 proxy, a \
             gateway or a mesh sidecar that chooses an endpoint for every request (HAProxy, \
             nginx, Envoy, an ingress controller), declare it and its silence decides: \
             Propagation::per_request_peers([\"{peer}\"]) or LAMEDUCK_PER_REQUEST_PEERS={peer}. \
             The EndpointSlice (feature `kube`, an EndpointWatch with a proxy_allowance you \
             configure) ends such a drain once the proxies stopped routing here. {}",
            secs(stopped_ms),
            what_to_set(cx)
        ),
    )
}

/// `weak_evidence` for the shared row: peers beyond the table, or of no known address.
fn too_many_peers(cx: &Ctx<'_>, stopped_ms: u64) -> Advice {
    advice(
        Warn,
        AdviceRule::WeakEvidence,
        stopped_ms,
        format!(
            "more peers were live at once than the arrival table tells apart (63 active within              32 s), or connections came with no peer address: they share one row (`other`),              whose silence proves nothing about its sparsest peer, so the drain waited {}              (max). A custom accept loop should pass the peer to ConnMeta::accepted. {}",
            secs(stopped_ms),
            what_to_set(cx)
        ),
    )
}

/// `node_agent_unanswered`: a node agent that never confirmed because it could not say (no
/// answer, its rules unreadable), each named: its node's Pods were not confirmed.
pub(super) fn node_agents_unanswered(cx: &Ctx<'_>) -> Vec<Advice> {
    let Some((e, stopped_ms)) = evidence(cx) else {
        return Vec::new();
    };
    e.nodes
        .iter()
        .filter(|n| n.confirmed_at_ms.is_none())
        .filter_map(|n| n.error.as_ref().map(|err| (n, err)))
        .map(|(n, err)| {
            advice(
                Warn,
                AdviceRule::NodeAgentUnanswered,
                stopped_ms,
                format!(
                    "the node agent at {}{} could not say whether its node still routes here \
                     ({err}), so the drain went on without it; check that the DaemonSet runs \
                     on every node and can read the rules (NET_ADMIN, the node's iptables or \
                     nft in its image)",
                    n.agent,
                    n.node
                        .as_ref()
                        .map_or_else(String::new, |node| format!(" (node {node})"))
                ),
            )
        })
        .collect()
}

/// `declared_peer_like_a_pool`: a peer declared to route per request that behaved like a
/// client pool, each named with what it did.
pub(super) fn declared_peer_like_a_pool(cx: &Ctx<'_>) -> Vec<Advice> {
    let Some((e, _)) = evidence(cx) else {
        return Vec::new();
    };
    e.paths
        .iter()
        .filter(|p| p.like_a_pool)
        .map(|p| {
            advice(
                Warn,
                AdviceRule::DeclaredPeerLikeAPool,
                u64::from(p.new_after_trigger),
                format!(
                    "{} was declared to route per request, but it behaved like a client pool: \
                     it kept connections alive ({} of them) and after the drain's \
                     Connection: close came back on {} new connection(s), no more than a \
                     pool's reconnect wave. A client pool connects again when its demand needs \
                     it, however late, which its silence does not bound: if {} is a client \
                     behind kube-proxy and not an L7 proxy, remove it from per_request_peers \
                     (LAMEDUCK_PER_REQUEST_PEERS)",
                    p.peer, p.kept_alive, p.new_after_trigger, p.peer
                ),
            )
        })
        .collect()
}

/// `never_served`: the drain started before the process was ever ready.
fn never_served(cx: &Ctx<'_>, stopped_ms: u64) -> Advice {
    advice(
        Info,
        AdviceRule::NeverServed,
        stopped_ms,
        format!(
            "the drain started while the process was still starting (never ready): no proxy \
             routed here, so it stopped accepting after {} instead of waiting for propagation \
             (max {})",
            secs(stopped_ms),
            secs(cx.r.propagation.max_ms)
        ),
    )
}

/// `confidence`: the commit went on silence at the measured rate.
fn confidence(cx: &Ctx<'_>, e: &EvidenceReport) -> Advice {
    advice(
        Info,
        AdviceRule::Confidence,
        e.t_conf_ms.unwrap_or(0),
        format!(
            "committed on evidence: {:.2} arrivals/s ({} slots before the drain, {} after; \
             longest gap {}), so {} of silence meant the proxies had moved on (ε = {}, rule {}); \
             silent for {} at the commit",
            e.rate_per_s().unwrap_or(0.0),
            e.slots_observed,
            e.slots_after_trigger,
            secs(e.longest_gap_ms.unwrap_or(0)),
            secs(e.t_conf_ms.unwrap_or(0).max(cx.quiet)),
            e.epsilon_ppm as f64 / 1e6,
            e.rule.map_or("none", crate::report::SilenceRule::as_str),
            secs(e.silence_ms)
        ),
    )
}

/// `fallback`: the commit went on `Propagation::quiet_suffices_after`.
fn fallback(e: &EvidenceReport, stopped_ms: u64) -> Advice {
    advice(
        Info,
        AdviceRule::Fallback,
        stopped_ms,
        format!(
            "committed on the fallback you set (quiet_suffices_after {}): the arrival evidence \
             alone ({:.2} arrivals/s) {}. It is not a floor: to never commit before it, set \
             min as well",
            secs(e.fallback_ms.unwrap_or(0)),
            e.rate_per_s().unwrap_or(0.0),
            match (e.weak, e.t_conf_ms) {
                (None, Some(t)) => format!("would have needed {} of silence", secs(t)),
                _ => "was not enough evidence".to_owned(),
            }
        ),
    )
}

/// `endpoint_slice`: the commit went on the EndpointSlice plus the proxy allowance.
fn endpoint_slice(e: &EvidenceReport, stopped_ms: u64) -> Advice {
    let slice = e.endpoint_slice.as_ref();
    advice(
        Info,
        AdviceRule::EndpointSlice,
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
    )
}

/// `endpoint_slice_still_routing`: a slice still listed this Pod as ready at `max`.
fn still_routing(stopped_ms: u64) -> Advice {
    advice(
        Warn,
        AdviceRule::EndpointSliceStillRouting,
        stopped_ms,
        format!(
            "an EndpointSlice still listed this Pod as ready at max ({}), or the API had \
             not answered: proxies may still have routed here when it stopped accepting. \
             A drain without a Pod deletion (Drain::start, a preStop call alone) leaves \
             the slice as it is",
            secs(stopped_ms)
        ),
    )
}

/// `publish_not_ready_addresses`: one line per Service that keeps this Pod ready in its slice.
pub(super) fn publish_not_ready_addresses(cx: &Ctx<'_>) -> Vec<Advice> {
    let Some((e, _)) = evidence(cx) else {
        return Vec::new();
    };
    let services = e
        .endpoint_slice
        .iter()
        .flat_map(|s| &s.publish_not_ready_addresses);
    services
        .map(|svc| {
            advice(
                Warn,
                AdviceRule::PublishNotReadyAddresses,
                0,
                format!(
                    "Service {svc} has publishNotReadyAddresses: true: its EndpointSlice keeps this \
                     Pod ready=true while it drains, so flipping /readyz removes nothing from it and \
                     its proxies keep sending until the Pod is gone; unset it unless this Service \
                     is for peer discovery (a StatefulSet's headless Service)"
                ),
            )
        })
        .collect()
}

/// `endpoint_slice_unavailable`: a started watch could not be used.
pub(super) fn endpoint_slice_unavailable(cx: &Ctx<'_>) -> Option<Advice> {
    let why = evidence(cx)?.0.endpoint_slice_unused.as_ref()?;
    // Only a watch that was started and failed is worth a line; a build without the
    // feature is a choice.
    let failed = why.starts_with("forbidden")
        || why.starts_with("unauthorized")
        || why.starts_with("unreachable")
        || why.starts_with("the API answered")
        || why.starts_with("no Kubernetes client");
    failed.then(|| {
        advice(
            Info,
            AdviceRule::EndpointSliceUnavailable,
            0,
            format!(
                "the EndpointSlice was not the evidence: {why}; the drain went on the arrival rate"
            ),
        )
    })
}
