//! Evidence for the propagation policy: how often new connections arrived before the trigger,
//! and so how much silence after it means that the proxies stopped routing here.
//!
//! # The estimator
//!
//! Time is cut into slots of [`SLOT`] (250 ms). For each slot the process only remembers
//! whether at least one new connection arrived in it. At the trigger, over the observed slots
//! of the window `W` before it ([`WINDOW`], 30 s, or fewer when the process has not been
//! serving that long), the fraction of empty slots estimates the chance `p` that a slot stays
//! empty while routing is unchanged:
//!
//! ```text
//! p̂ = (empty + ½) / (slots + 1)            (never 0 or 1: ½ of a slot of doubt either way)
//! T_conf = SLOT · ln ε / ln p̂              (k empty slots in a row have chance p̂^k = ε)
//! λ̂ = −ln p̂ / SLOT                         (the equivalent Poisson rate)
//! ```
//!
//! For Poisson arrivals at rate λ, `p = e^(−λ·SLOT)` and `T_conf = ln(1/ε) / λ`. A burst fills
//! one or two slots whatever its size, so one burst followed by silence leaves `p̂` near 1 and
//! `T_conf` long: the estimator is not fooled by it. Traffic that comes in regular bursts
//! separated by gaps is judged by its gaps, which is what matters for "would a connection
//! have arrived by now".
//!
//! Why 250 ms slots: the shortest `T_conf` the estimator can give is
//! `SLOT · ln ε / ln(½ / (slots + 1))`, 0.31 s with 120 slots; with 1 s slots it would be
//! 1.7 s even for the densest traffic, longer than the default quiet window, and every dense
//! drain would pay for it. Shorter slots would need a larger ring for the same window and
//! would measure scheduler jitter more than traffic.
//!
//! # Failure modes
//!
//! * Traffic that stops at the trigger for reasons of its own (a client that finished) looks
//!   like converged proxies. Nothing local can tell the two apart; `T_conf` is only as good as
//!   "the recent past predicts the next seconds".
//! * A rate that rose during the window (a ramp) is underestimated, which errs on the safe
//!   side (longer wait); one that fell just before the trigger is overestimated.
//! * Connections that never reach this process (refused by a full backlog) are not counted.
//!
//! # Invariants
//!
//! * Recording an arrival is one relaxed `fetch_max` on the ring entry of its slot: the entry
//!   holds the latest slot index (+1) that saw a connection, so a late writer of an older slot
//!   never hides a newer one, and a stale entry (from a slot one ring-turn ago) reads as empty.
//! * The estimate is taken once, at the trigger, over slots that are complete then; the ring
//!   holds more slots than the window, so no write during the trigger's own slot can overwrite
//!   a slot of the window.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// The length of one slot of the arrival ring.
pub(crate) const SLOT: Duration = Duration::from_millis(250);
/// How far back before the trigger the rate is measured.
pub(crate) const WINDOW: Duration = Duration::from_secs(30);
const WINDOW_SLOTS: u64 = (WINDOW.as_millis() / SLOT.as_millis()) as u64;
/// Ring entries: more than the window, so the trigger's slot never overwrites one of it.
const RING: usize = 128;
/// Fewer observed slots than this (5 s) is not enough to tell a rate from a burst.
pub(crate) const MIN_SLOTS: u64 = 20;
/// The default accepted chance that a connection would still have arrived had routing not
/// changed.
pub(crate) const DEFAULT_EPSILON: f64 = 1e-3;

const _: () = assert!(RING as u64 > WINDOW_SLOTS);

/// Which slots saw at least one new connection.
#[derive(Debug)]
pub(crate) struct Arrivals {
    ring: [AtomicU64; RING],
    /// Nanoseconds since `Core::base` + 1 of when connections started to be counted; 0 = no
    /// source of connection data (neither `serve` nor `ConnMeta` through `axum::serve`).
    observing_since: AtomicU64,
}

impl Arrivals {
    pub(crate) fn new() -> Self {
        Self {
            ring: std::array::from_fn(|_| AtomicU64::new(0)),
            observing_since: AtomicU64::new(0),
        }
    }

    /// Counts one new connection in slot `slot`. One relaxed atomic operation: the value is
    /// read once, at the trigger, by a thread that synchronised with the drain's start.
    #[inline]
    pub(crate) fn record(&self, slot: u64) {
        self.ring[(slot % RING as u64) as usize].fetch_max(slot + 1, Ordering::Relaxed);
    }

    /// Connection data is available from `stamp` on (the first caller wins).
    pub(crate) fn observe_from(&self, stamp: u64) {
        // A plain load first: after the first connection this is never written again.
        if self.observing_since.load(Ordering::Relaxed) == 0 {
            let _ = self.observing_since.compare_exchange(
                0,
                stamp,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    fn observing_since(&self) -> u64 {
        self.observing_since.load(Ordering::Relaxed)
    }

    fn has(&self, slot: u64) -> bool {
        self.ring[(slot % RING as u64) as usize].load(Ordering::Relaxed) == slot + 1
    }
}

/// Why the arrival data cannot say how long to wait.
///
/// In JSON: `no_connection_data`, `too_few_slots`, `too_sparse`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum WeakEvidence {
    /// No connection was ever counted: no server counted them (`lameduck::serve`,
    /// `lameduck::axum_serve` and `ConnMeta::accepted` do; axum's own `ConnectInfo` hook
    /// cannot) — a worker with no HTTP, or a raw `axum::serve`.
    NoConnectionData,
    /// The process had been serving for less than 5 s before the trigger.
    TooFewSlots,
    /// New connections were too rare before the trigger: the silence needed for confidence
    /// is longer than `max`.
    TooSparse,
}

impl WeakEvidence {
    /// The name as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        crate::names::of(&self)
    }
}

/// What the arrival rate measured at the trigger says.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Estimate {
    /// Slots observed before the trigger (at most 120).
    pub(crate) slots: u64,
    /// Of those, the slots without a new connection.
    pub(crate) empty: u64,
    /// ε, the accepted chance of being wrong.
    pub(crate) epsilon: f64,
}

impl Estimate {
    /// The estimate at `at` from what `arrivals` counted, slots numbered from `base`.
    /// `None`: no connection data at all.
    pub(crate) fn at(
        arrivals: &Arrivals,
        base: Instant,
        at: Instant,
        serving_since: Option<Instant>,
        epsilon: f64,
    ) -> Option<Self> {
        let since = match arrivals.observing_since() {
            0 => return None,
            stamp => base + Duration::from_nanos(stamp - 1),
        };
        let since = serving_since.map_or(since, |s| s.max(since));
        let slot_of = |t: Instant| t.saturating_duration_since(base).as_nanos() / SLOT.as_nanos();
        let trigger_slot = slot_of(at) as u64;
        // The first slot observed from its start.
        let since_ns = since.saturating_duration_since(base).as_nanos();
        let first = since_ns.div_ceil(SLOT.as_nanos()) as u64;
        let lo = first.max(trigger_slot.saturating_sub(WINDOW_SLOTS));
        let slots = trigger_slot.saturating_sub(lo);
        let empty = (lo..trigger_slot).filter(|&k| !arrivals.has(k)).count() as u64;
        Some(Self {
            slots,
            empty,
            epsilon,
        })
    }

    /// p̂, the chance that a slot stays empty.
    pub(crate) fn p_empty(&self) -> f64 {
        (self.empty as f64 + 0.5) / (self.slots as f64 + 1.0)
    }

    /// λ̂, new connections per second.
    pub(crate) fn rate(&self) -> f64 {
        -self.p_empty().ln() / SLOT.as_secs_f64()
    }

    /// The silence after which a connection would have arrived with probability ≥ 1 − ε;
    /// `None` with too few slots to say. Saturates at a day.
    pub(crate) fn t_conf(&self) -> Option<Duration> {
        if self.slots < MIN_SLOTS {
            return None;
        }
        let secs = SLOT.as_secs_f64() * self.epsilon.ln() / self.p_empty().ln();
        Some(Duration::from_secs_f64(secs.clamp(0.0, 86_400.0)))
    }
}

/// What the propagation policy went on when it committed (or, while draining, what it waits
/// for).
///
/// In JSON: `confidence`, `floor`, `max`, `fixed`, `cut`, `endpoint_slice`, `never_served`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EvidenceKind {
    /// Silence long enough, at the arrival rate measured before the trigger, that a new
    /// connection would have come with probability ≥ 1 − ε had the proxies still routed here.
    Confidence,
    /// The user's floor ([`Propagation::assume_converged_after`](crate::Propagation::assume_converged_after))
    /// passed and the quiet window held.
    Floor,
    /// `max` was reached; [`EvidenceReport::max_reason`] says why.
    Max,
    /// A fixed delay ([`Propagation::fixed`](crate::Propagation::fixed)): no evidence taken.
    Fixed,
    /// The drain was forced or the quiesce deadline came first.
    Cut,
    /// Every EndpointSlice listing this Pod showed it not ready (feature `kube`), the proxy
    /// allowance passed and the quiet window held: [`EvidenceReport::endpoint_slice`] has the
    /// numbers.
    EndpointSlice,
    /// The process was never ready (the drain started while it was Starting): nothing
    /// routed here, nothing to wait for.
    NeverServed,
}

impl EvidenceKind {
    /// The name as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        crate::names::of(&self)
    }
}

/// Why the policy waited until `max`.
///
/// In JSON: `not_enough_evidence`, `traffic_never_went_quiet`, `endpoint_slice_still_routing`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum MaxReason {
    /// The arrival data could not say how long to wait ([`EvidenceReport::weak`] says why) and
    /// no floor was set.
    NotEnoughEvidence,
    /// The evidence was good, but new connections, requests or in-flight work went on until
    /// `max`.
    TrafficNeverWentQuiet,
    /// An EndpointSlice still listed this Pod as ready at `max`, or the Kubernetes API had
    /// not answered (feature `kube`).
    EndpointSliceStillRouting,
}

impl MaxReason {
    /// The name as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        crate::names::of(&self)
    }
}

/// The evidence behind the propagation commit, with its numbers. Part of
/// [`PolicyReport`](crate::PolicyReport); while draining, [`Status`](crate::Status) shows the
/// evidence the policy is waiting on.
///
/// Fractions and rates are integers so the report stays exactly comparable: `p_empty_ppm` is
/// p̂ in millionths, `rate_per_1000s` is λ̂ in new connections per 1000 s.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct EvidenceReport {
    /// What the commit went on (or, before it, what the policy waits for).
    pub kind: EvidenceKind,
    /// With [`EvidenceKind::Max`]: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_reason: Option<MaxReason>,
    /// Why the arrival data was not enough, when it was not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weak: Option<WeakEvidence>,
    /// The slot length, in milliseconds.
    pub slot_ms: u64,
    /// Slots observed before the trigger (at most the 30 s window).
    pub slots_observed: u64,
    /// Of those, slots without any new connection.
    pub empty_slots: u64,
    /// p̂ = (empty + ½) / (slots + 1), in millionths.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p_empty_ppm: Option<u64>,
    /// λ̂ = −ln p̂ / slot, in new connections per 1000 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_per_1000s: Option<u64>,
    /// ε, the accepted chance that a connection would still have come, in millionths.
    pub epsilon_ppm: u64,
    /// The silence the evidence asks for, in milliseconds (before `max` bounds it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t_conf_ms: Option<u64>,
    /// The user's floor, in milliseconds after the trigger, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor_ms: Option<u64>,
    /// Silence observed when the policy committed (or so far): time since the later of the
    /// trigger and the last new connection, in milliseconds.
    pub silence_ms: u64,
    /// The EndpointSlice evidence (feature `kube`), when the slices were watched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_slice: Option<crate::EndpointSliceEvidence>,
    /// Why the EndpointSlice was not the evidence, when it was not: the feature is not built,
    /// no watch was started, the API refused or could not be reached, no slice lists the Pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_slice_unused: Option<String>,
}

impl EvidenceReport {
    /// λ̂ in new connections per second, for display.
    pub fn rate_per_s(&self) -> Option<f64> {
        self.rate_per_1000s.map(|r| r as f64 / 1000.0)
    }

    /// One line for `/readyz?verbose` and the `propagation_done` event: the evidence and its
    /// numbers.
    pub(crate) fn describe(&self) -> String {
        if self.kind == EvidenceKind::NeverServed {
            return "never_served: the drain started before the process was ever ready; no \
                    proxy routed here, nothing to wait for"
                .to_owned();
        }
        if self.kind == EvidenceKind::Fixed {
            // A set delay reads no evidence: saying what evidence was missing would be noise
            // (a worker with no HTTP was told to use `serve`).
            return format!(
                "fixed: a set delay, no evidence read; silent for {} ms",
                self.silence_ms
            );
        }
        let rate = match (self.rate_per_s(), self.weak) {
            (_, Some(WeakEvidence::NoConnectionData)) => {
                "no connection counted (no server counts them here)".to_owned()
            }
            (Some(r), _) => format!(
                "{r:.2} new connections/s before the trigger ({} of {} slots empty)",
                self.empty_slots, self.slots_observed
            ),
            (None, _) => "no rate".to_owned(),
        };
        let need = match self.t_conf_ms {
            Some(t) if self.weak.is_none() => format!("needs {t} ms of silence"),
            _ => match self.weak {
                Some(w) => format!("not enough evidence ({})", w.as_str()),
                None => String::new(),
            },
        };
        let slices = match (&self.endpoint_slice, &self.endpoint_slice_unused) {
            (Some(s), None) => match (s.changed_at_ms, s.allowed_at_ms) {
                (Some(c), Some(a)) => format!(
                    "; EndpointSlice {} at {c} ms, allowed from {a} ms ({} ms allowance)",
                    s.condition, s.allowance_ms
                ),
                _ => format!("; waiting for the EndpointSlice to show {}", s.condition),
            },
            // A watch that was started and could not be used is worth the line; a build
            // without the feature is a choice.
            (_, Some(why))
                if !why.starts_with("the kube feature") && !why.starts_with("no EndpointWatch") =>
            {
                format!("; no EndpointSlice evidence: {why}")
            }
            _ => String::new(),
        };
        format!(
            "{}: {rate}; {need}; silent for {} ms{slices}",
            self.kind.as_str(),
            self.silence_ms
        )
    }
}

/// The whole evidence as the driver holds it: the estimate taken at the trigger and what the
/// policy made of it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Evidence {
    pub(crate) estimate: Option<Estimate>,
    pub(crate) epsilon: f64,
    /// `max`, to tell "too sparse" from "never went quiet".
    pub(crate) max: Duration,
    pub(crate) floor: Option<Duration>,
}

impl Evidence {
    /// The silence needed, when the data can say.
    pub(crate) fn t_conf(&self) -> Option<Duration> {
        self.estimate.and_then(|e| e.t_conf())
    }

    /// Why the data cannot decide the commit, if it cannot.
    pub(crate) fn weak(&self) -> Option<WeakEvidence> {
        match self.estimate {
            None => Some(WeakEvidence::NoConnectionData),
            Some(e) if e.slots < MIN_SLOTS => Some(WeakEvidence::TooFewSlots),
            Some(e) if e.t_conf().is_none_or(|t| t >= self.max) => Some(WeakEvidence::TooSparse),
            Some(_) => None,
        }
    }

    pub(crate) fn report(&self, kind: EvidenceKind, silence: Duration) -> EvidenceReport {
        let ms = |d: Duration| d.as_millis() as u64;
        let weak = self.weak();
        EvidenceReport {
            kind,
            max_reason: (kind == EvidenceKind::Max).then(|| {
                if weak.is_some() && self.floor.is_none() {
                    MaxReason::NotEnoughEvidence
                } else {
                    MaxReason::TrafficNeverWentQuiet
                }
            }),
            weak,
            slot_ms: ms(SLOT),
            slots_observed: self.estimate.map_or(0, |e| e.slots),
            empty_slots: self.estimate.map_or(0, |e| e.empty),
            p_empty_ppm: self.estimate.map(|e| (e.p_empty() * 1e6).round() as u64),
            rate_per_1000s: self.estimate.map(|e| (e.rate() * 1000.0).round() as u64),
            epsilon_ppm: (self.epsilon * 1e6).round() as u64,
            t_conf_ms: self.t_conf().map(ms),
            floor_ms: self.floor.map(ms),
            silence_ms: ms(silence),
            endpoint_slice: None,
            endpoint_slice_unused: None,
        }
    }
}

#[cfg(all(test, not(lameduck_loom)))]
mod tests;
