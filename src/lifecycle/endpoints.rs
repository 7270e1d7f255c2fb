//! The Kubernetes API's part of the drain (feature `kube`): the events the watch saw before
//! the trigger, and the slice evidence added to the propagation evidence. Without the feature
//! the link stays empty and says why.

use std::time::Duration;

use tokio::time::Instant;

use crate::propagation::link::{Hold, Link};
use crate::report::{EvidenceKind, EvidenceReport, MaxReason};
use crate::vocab::phase::Event;

/// Events the Kubernetes watch saw before the trigger enter the timeline only when this
/// recent.
const EARLY_EVENT_WINDOW: Duration = Duration::from_secs(60);

/// The events the link saw before the drain started at `origin`, for the timeline: at 0 ms,
/// each saying how long before; older ones say nothing about this drain (a flap at startup).
pub(super) fn early_events(link: &Link, origin: Instant) -> Vec<Event> {
    let mut out = Vec::new();
    for e in link.take_early() {
        let before = origin.saturating_duration_since(e.at).as_millis();
        if before > EARLY_EVENT_WINDOW.as_millis() {
            continue;
        }
        let mut ev = Event::new(e.kind, e.at.saturating_duration_since(origin), e.unix_ms);
        ev.name = e.name;
        ev.detail = Some(if before > 0 {
            format!("{before} ms before the trigger: {}", e.detail)
        } else {
            e.detail
        });
        out.push(ev);
    }
    out
}

/// Adds the slice evidence to the propagation evidence, or why there was none.
pub(super) fn endpoint_evidence(link: &Link, report: &mut EvidenceReport, origin: Instant) {
    let hold = link.hold();
    report.endpoint_slice_unused = link.unused_reason();
    if link.is_watching() {
        report.endpoint_slice = Some(link.evidence(origin, report.weak.map(|w| w.as_str())));
    }
    if hold == Hold::Pending && report.kind == EvidenceKind::Max {
        report.max_reason = Some(MaxReason::EndpointSliceStillRouting);
    }
}
