//! The evidence as the report shows it: [`Evidence::report`] fills in the report's data.

use std::time::Duration;

use super::{Evidence, PathFit, SLOT};
use crate::report::{EvidenceKind, EvidenceReport, MaxReason, PathEvidence, PathRouting};

impl Evidence {
    /// Every path as the report shows it, the busiest first.
    fn paths_shown(&self) -> Vec<PathEvidence> {
        let ms = |d: Duration| d.as_millis() as u64;
        let now = tokio::time::Instant::now();
        let per_1000s = self.per_1000s();
        let mut paths: Vec<PathEvidence> = self
            .fits
            .iter()
            .map(|f| {
                let shown = f.shown();
                let since = f.last.or(self.origin).unwrap_or(now);
                PathEvidence {
                    peer: f.peer.map_or_else(|| "other".to_owned(), |p| p.to_string()),
                    routing: f.routing,
                    counted: f.counts(),
                    active_slots: f.activity.busy().min(f.activity.slots_before),
                    connection_slots: f.fresh_slots,
                    open_at_trigger: f.open,
                    new_after_trigger: f.after,
                    open_now: f.open_now,
                    pool_wait_ms: f.pool_wait().map(ms),
                    kept_reused: (f.open > 0 && f.routing != PathRouting::PerRequest)
                        .then_some(f.told),
                    kept_alive: f.kept,
                    rate_per_1000s: (f.routing != PathRouting::New)
                        .then(|| (shown.rate() * 1000.0).round() as u64),
                    requests_per_1000s: per_1000s(f.requests_before),
                    t_conf_ms: f.required().map(|(t, _, _)| ms(t)),
                    weak: f.weak(self.max),
                    declared_per_request: f.declared,
                    like_a_pool: self.origin.is_some_and(|o| f.declared_like_a_pool(o)),
                    silence_ms: ms(now.saturating_duration_since(since)),
                }
            })
            .collect();
        paths.sort_by(|a, b| {
            (b.active_slots + u64::from(b.new_after_trigger))
                .cmp(&(a.active_slots + u64::from(a.new_after_trigger)))
        });
        paths
    }

    /// Turns a count over the window's whole seconds into requests per 1000 s; `None` with no
    /// request counted or no whole second.
    fn per_1000s(&self) -> impl Fn(u64) -> Option<u64> {
        let seconds = self.counted_seconds().filter(|_| self.requests_seen);
        move |n| seconds.map(|s| n * 1000 / s)
    }

    /// The whole seconds of the window the request counts cover, if any.
    fn counted_seconds(&self) -> Option<u64> {
        let seconds = self.window.as_ref()?.seconds();
        Some(seconds.end.saturating_sub(seconds.start)).filter(|&s| s > 0)
    }

    pub(crate) fn report(&self, kind: EvidenceKind, silence: Duration) -> EvidenceReport {
        let ms = |d: Duration| d.as_millis() as u64;
        let ppm = |x: f64| (x * 1e6).round() as u64;
        let weak = self.weak();
        let binding = self.binding();
        let e = binding.map(|f| *f.shown());
        let required = self.required();
        let peer_name = |f: &PathFit| f.peer.map_or_else(|| "other".to_owned(), |p| p.to_string());
        let mut paths = self.paths_shown();
        // The busiest few, and the one that held the commit wherever it ranks.
        let held = binding.map(peer_name);
        if let Some(at) = held
            .as_ref()
            .and_then(|h| paths.iter().position(|p| &p.peer == h))
            .filter(|&at| at >= PathEvidence::LISTED)
        {
            paths.swap(PathEvidence::LISTED - 1, at);
        }
        paths.truncate(PathEvidence::LISTED);
        EvidenceReport {
            kind,
            max_reason: (kind == EvidenceKind::Max).then(|| {
                if weak.is_some() && self.fallback.is_none() {
                    MaxReason::NotEnoughEvidence
                } else {
                    MaxReason::TrafficNeverWentQuiet
                }
            }),
            weak,
            slot_ms: ms(SLOT),
            // With no path that carried traffic, the window's slots, all empty.
            slots_observed: e.map_or(self.window_slots(), |e| e.slots_before),
            slots_after_trigger: e.map_or(0, |e| e.slots_after),
            empty_slots: e.map_or(self.window_slots(), |e| e.empty),
            requests_seen: self.requests_seen,
            p_empty_ppm: e.map(|e| ppm(e.p_empty())),
            rate_per_1000s: e.map(|e| (e.rate() * 1000.0).round() as u64),
            requests_per_1000s: self.per_1000s()(self.fits.iter().map(|f| f.requests_before).sum()),
            counted_seconds: self.counted_seconds(),
            stay_empty_ppm: e.map(|e| ppm(e.stay_empty())),
            longest_gap_ms: e.map(|e| e.longest_gap * ms(SLOT)),
            epsilon_ppm: ppm(self.epsilon),
            t_conf_ms: required.map(|(t, _)| ms(t)),
            rule: required.map(|(_, r)| r),
            fallback_ms: self.fallback.map(ms),
            silence_ms: ms(silence),
            endpoint_slice: None,
            endpoint_slice_unused: None,
            held_by: held,
            per_request_peers: self.per_request.describe(),
            past_max_ms: None,
            nodes: Vec::new(),
            still_routed_at_cap: false,
            paths,
            in_flight_hold: None,
        }
    }
}
