//! The Kubernetes API's part of the drain (feature `kube`): the link the watch writes, the
//! events it reports, and the slice evidence added to the propagation evidence. Without the
//! feature the link stays empty and says why.

use std::time::Duration;

use tokio::time::Instant;

use super::Driver;
#[cfg(feature = "kube")]
use crate::link::Early;
use crate::link::Hold;
#[cfg(any(feature = "http", feature = "kube"))]
use crate::link::Link;
use crate::phase::Event;
#[cfg(feature = "kube")]
use crate::phase::EventKind;
use crate::report::{EvidenceKind, EvidenceReport, MaxReason};

/// Events the Kubernetes watch saw before the trigger enter the timeline only when this
/// recent.
const EARLY_EVENT_WINDOW: Duration = Duration::from_secs(60);

impl Driver {
    /// The link the Kubernetes watch writes (and the accept loop, for the startup measurement).
    #[cfg(any(feature = "http", feature = "kube"))]
    pub(crate) fn link(&self) -> &Link {
        self.deadlines.link()
    }

    /// Records an event the API reported (an endpoint condition change, the deletion's
    /// budget) at `at`: in the timeline once the drain started, kept for its start before.
    #[cfg(feature = "kube")]
    pub(crate) fn record_external(
        &self,
        kind: EventKind,
        name: Option<String>,
        detail: String,
        at: Instant,
        unix_ms: u64,
    ) {
        match self.origin() {
            Some(o) => {
                let mut e = Event::new(kind, at.saturating_duration_since(o.at), unix_ms);
                e.name = name;
                e.detail = Some(detail);
                self.push(e);
            }
            None => {
                tracing::info!(event = kind.as_str(), name = name.as_deref(), detail = %detail, "lameduck: {kind}");
                self.deadlines.link().push_early(Early {
                    kind,
                    at,
                    unix_ms,
                    name,
                    detail,
                });
            }
        }
    }

    /// Adds the events seen before the trigger to the timeline, at 0 ms with how long before.
    /// Each had its log line when it was seen, so they skip the funnel's.
    pub(super) fn flush_early_events(&self, origin: Instant) {
        let early = self.deadlines.link().take_early();
        let mut st = self.lock();
        for e in early {
            let before = origin.saturating_duration_since(e.at).as_millis();
            // Older changes say nothing about this drain (a flap at startup, say).
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
            st.timeline.push(ev);
        }
    }

    /// Adds the slice evidence to the propagation evidence, or why there was none.
    pub(super) fn endpoint_evidence(&self, report: &mut EvidenceReport, origin: Instant) {
        let link = self.deadlines.link();
        let hold = link.hold();
        report.endpoint_slice_unused = link.unused_reason();
        if link.is_watching() {
            report.endpoint_slice = Some(link.evidence(origin, report.weak.map(|w| w.as_str())));
        }
        if hold == Hold::Pending && report.kind == EvidenceKind::Max {
            report.max_reason = Some(MaxReason::EndpointSliceStillRouting);
        }
    }
}
