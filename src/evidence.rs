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
use std::sync::RwLock;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::guard::Core;

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

/// The coordinator whose rate `ConnMeta` counts when `axum::serve` builds it through
/// `ConnectInfo` (axum's hook has no way to name a coordinator): the one built last. A process
/// builds one.
static CONNECT_INFO_TARGET: RwLock<Option<&'static Core>> = RwLock::new(None);

pub(crate) fn set_connect_info_target(core: &'static Core) {
    *CONNECT_INFO_TARGET
        .write()
        .unwrap_or_else(|e| e.into_inner()) = Some(core);
}

/// A connection accepted by `axum::serve` or a custom accept loop (`ConnMeta::accepted`).
#[cfg_attr(not(feature = "http"), allow(dead_code))] // called by `ConnMeta` of the `http` feature
pub(crate) fn note_connect_info() {
    let target = *CONNECT_INFO_TARGET
        .read()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(core) = target {
        // Observation starts when the coordinator was built: the server runs from then on (and
        // slots before Serving are left out anyway).
        core.arrivals.observe_from(1);
        core.note_arrival();
    }
}

/// Why the arrival data cannot say how long to wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum WeakEvidence {
    /// No connection was ever counted: the service is not served by `lameduck::serve`, nor
    /// by `axum::serve` with `ConnMeta` — or no client ever connected.
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
        match self {
            WeakEvidence::NoConnectionData => "no_connection_data",
            WeakEvidence::TooFewSlots => "too_few_slots",
            WeakEvidence::TooSparse => "too_sparse",
        }
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
    /// The estimate at `at` from what `core` counted. `None`: no connection data at all.
    pub(crate) fn at(
        core: &Core,
        at: Instant,
        serving_since: Option<Instant>,
        epsilon: f64,
    ) -> Option<Self> {
        let since = core.unstamp(core.arrivals.observing_since())?;
        let since = serving_since.map_or(since, |s| s.max(since));
        let slot_of =
            |t: Instant| t.saturating_duration_since(core.base).as_nanos() / SLOT.as_nanos();
        let trigger_slot = slot_of(at) as u64;
        // The first slot observed from its start.
        let since_ns = since.saturating_duration_since(core.base).as_nanos();
        let first = since_ns.div_ceil(SLOT.as_nanos()) as u64;
        let lo = first.max(trigger_slot.saturating_sub(WINDOW_SLOTS));
        let slots = trigger_slot.saturating_sub(lo);
        let empty = (lo..trigger_slot)
            .filter(|&k| !core.arrivals.has(k))
            .count() as u64;
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
}

impl EvidenceKind {
    /// The name as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            EvidenceKind::Confidence => "confidence",
            EvidenceKind::Floor => "floor",
            EvidenceKind::Max => "max",
            EvidenceKind::Fixed => "fixed",
            EvidenceKind::Cut => "cut",
            EvidenceKind::EndpointSlice => "endpoint_slice",
        }
    }
}

/// Why the policy waited until `max`.
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
        match self {
            MaxReason::NotEnoughEvidence => "not_enough_evidence",
            MaxReason::TrafficNeverWentQuiet => "traffic_never_went_quiet",
            MaxReason::EndpointSliceStillRouting => "endpoint_slice_still_routing",
        }
    }
}

/// The evidence behind the propagation commit, with its numbers. Part of
/// [`PolicyReport`](crate::PolicyReport); while draining, [`Status`](crate::Status) shows the
/// evidence the policy is waiting on.
///
/// Fractions and rates are integers so the report stays exactly comparable: `p_empty_ppm` is
/// p̂ in millionths, `rate_per_1000s` is λ̂ in new connections per 1000 s.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
mod tests {
    use super::*;

    fn est(slots: u64, empty: u64) -> Estimate {
        Estimate {
            slots,
            empty,
            epsilon: DEFAULT_EPSILON,
        }
    }

    #[test]
    fn dense_traffic_needs_a_fraction_of_a_second() {
        let t = est(120, 0).t_conf().unwrap();
        assert!(
            t > Duration::from_millis(250) && t < Duration::from_millis(400),
            "{t:?}"
        );
    }

    #[test]
    fn poisson_rate_matches_ln_one_over_epsilon_over_lambda() {
        // λ = 1/s: a 250 ms slot is empty with chance e^(−0.25) ≈ 0.7788 → 93.5 of 120.
        let e = est(120, 93);
        let t = e.t_conf().unwrap().as_secs_f64();
        let ideal = (1.0f64 / DEFAULT_EPSILON).ln() / 1.0;
        assert!((t - ideal).abs() / ideal < 0.1, "t_conf {t} vs {ideal}");
        assert!((e.rate() - 1.0).abs() < 0.1, "rate {}", e.rate());
    }

    #[test]
    fn one_burst_is_not_a_rate() {
        let t = est(120, 119).t_conf().unwrap();
        assert!(t > Duration::from_secs(60), "{t:?}");
    }

    #[test]
    fn too_few_slots_say_nothing() {
        assert_eq!(est(MIN_SLOTS - 1, 0).t_conf(), None);
        assert!(est(MIN_SLOTS, 0).t_conf().is_some());
    }

    #[test]
    fn ring_entries_from_an_older_turn_read_as_empty() {
        let a = Arrivals::new();
        a.record(5);
        assert!(a.has(5));
        assert!(!a.has(5 + RING as u64));
        a.record(5 + RING as u64);
        assert!(!a.has(5));
        // A late write of the older slot does not hide the newer one.
        a.record(5);
        assert!(a.has(5 + RING as u64));
    }

    // ---- the rule, driven with synthetic arrivals on the paused clock ----
    //
    // Arrivals go through `Drain::note_connection`, the accept loop's own hook: counted in
    // the ring while Serving, and as new connections once draining.

    use crate::{Drain, EventKind, Phase, Propagation, Signals, Trigger};

    const PEER: Option<std::net::SocketAddr> = None;

    fn drain(p: Propagation) -> Drain {
        let d = Drain::builder()
            .grace_period(Duration::from_secs(30)) // max = 15 s
            .propagation(p)
            .signals(Signals::none())
            .report_to_stderr(false)
            .termination_log(None)
            .build()
            .unwrap();
        d.core().observe_arrivals();
        d.mark_started();
        d
    }

    /// One connection every `every`, `n` times.
    async fn arrivals(d: &Drain, every: Duration, n: u32) {
        for _ in 0..n {
            tokio::time::sleep(every).await;
            d.note_connection(PEER);
        }
    }

    async fn committed(d: &Drain) -> (u64, EvidenceReport) {
        let report = d.drained().await;
        let at = report.event(EventKind::StoppedAccepting).unwrap().at_ms;
        (at, report.propagation.evidence.clone().unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn dense_traffic_commits_quiet_after_the_last_connection() {
        let d = drain(Propagation::default());
        arrivals(&d, Duration::from_millis(50), 600).await; // 20/s for 30 s
        assert!(d.start(Trigger::Api));
        // The proxies keep sending for 2 s more, then move on.
        arrivals(&d, Duration::from_millis(50), 40).await;
        let (at, ev) = committed(&d).await;
        assert_eq!(ev.kind, EvidenceKind::Confidence, "{ev:?}");
        assert_eq!((ev.slots_observed, ev.empty_slots), (120, 0));
        assert!(ev.t_conf_ms.unwrap() < 1000, "{ev:?}");
        // Last connection at 2 s; quiet (1 s) is the longer of the two windows.
        assert_eq!(at, 3000);
        assert_eq!(ev.silence_ms, 1000);
    }

    #[tokio::test(start_paused = true)]
    async fn a_moderate_rate_asks_for_its_own_silence() {
        let d = drain(Propagation::default());
        // Every 500 ms: every other 250 ms slot is empty (61 of 120, slot 0 included).
        arrivals(&d, Duration::from_millis(500), 60).await;
        d.start(Trigger::Api);
        arrivals(&d, Duration::from_millis(500), 4).await; // the last at 2 s
        let (at, ev) = committed(&d).await;
        assert_eq!(ev.kind, EvidenceKind::Confidence);
        assert_eq!((ev.slots_observed, ev.empty_slots), (120, 61));
        let p = 61.5f64 / 121.0;
        assert_eq!(ev.p_empty_ppm, Some((p * 1e6).round() as u64));
        let t = ev.t_conf_ms.unwrap();
        assert_eq!(t, (250.0 * 1e-3f64.ln() / p.ln()) as u64); // 2551 ms
                                                               // The timer wakes on the next whole millisecond.
        assert!((2000 + t..=2001 + t).contains(&at), "{at} vs 2000 + {t}");
    }

    #[tokio::test(start_paused = true)]
    async fn requests_on_open_connections_do_not_hold_the_window() {
        let d = drain(Propagation::default());
        arrivals(&d, Duration::from_millis(50), 600).await;
        d.start(Trigger::Api);
        let d2 = d.clone();
        let pinned = tokio::spawn(async move {
            // A client pinned to an open connection: a request every 200 ms (bounded: 5 s).
            for _ in 0..25 {
                if d2.phase() >= Phase::StoppedAccepting {
                    break;
                }
                drop(d2.enter());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        let (at, ev) = committed(&d).await;
        pinned.await.unwrap();
        assert_eq!(ev.kind, EvidenceKind::Confidence);
        assert_eq!(
            at, 1000,
            "no new connection after the trigger: min and quiet, not max"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn sparse_traffic_waits_to_max_and_says_so() {
        let d = drain(Propagation::default());
        arrivals(&d, Duration::from_secs(3), 10).await; // 0.33/s
        d.start(Trigger::Api);
        let (at, ev) = committed(&d).await;
        assert_eq!(at, 15_000);
        assert_eq!(ev.kind, EvidenceKind::Max);
        assert_eq!(ev.max_reason, Some(MaxReason::NotEnoughEvidence));
        assert_eq!(ev.weak, Some(WeakEvidence::TooSparse));
        assert!(ev.t_conf_ms.unwrap() > 15_000, "{ev:?}");
        let report = d.report().unwrap();
        let weak = report
            .advice
            .iter()
            .find(|a| a.rule == "weak_evidence")
            .unwrap();
        assert!(
            weak.message.contains("new connections/s before the drain"),
            "{}",
            weak.message
        );
        assert!(weak.message.contains("waited 15.0 s"), "{}", weak.message);
    }

    #[tokio::test(start_paused = true)]
    async fn one_burst_then_silence_does_not_pass_for_a_rate() {
        let d = drain(Propagation::default());
        tokio::time::sleep(Duration::from_secs(10)).await;
        arrivals(&d, Duration::from_millis(1), 200).await; // 200 connections in 200 ms
        tokio::time::sleep(Duration::from_secs(20)).await;
        d.start(Trigger::Api);
        let (at, ev) = committed(&d).await;
        assert_eq!(at, 15_000);
        assert_eq!(ev.kind, EvidenceKind::Max);
        assert_eq!(ev.weak, Some(WeakEvidence::TooSparse));
        assert!(ev.slots_observed - ev.empty_slots <= 2, "{ev:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_process_younger_than_the_window_uses_only_what_it_saw() {
        let d = drain(Propagation::default());
        arrivals(&d, Duration::from_millis(50), 60).await; // 3 s of dense traffic
        d.start(Trigger::Api);
        let (at, ev) = committed(&d).await;
        assert_eq!(at, 15_000);
        assert_eq!(ev.weak, Some(WeakEvidence::TooFewSlots));
        assert_eq!(ev.slots_observed, 12);
        assert_eq!(ev.max_reason, Some(MaxReason::NotEnoughEvidence));

        // 8 s of the same traffic is enough, and only those 32 slots count.
        let d = drain(Propagation::default());
        arrivals(&d, Duration::from_millis(50), 160).await;
        d.start(Trigger::Api);
        let (at, ev) = committed(&d).await;
        assert_eq!(
            (ev.kind, ev.slots_observed, ev.empty_slots),
            (EvidenceKind::Confidence, 32, 0)
        );
        assert_eq!(at, 1000);
    }

    #[tokio::test(start_paused = true)]
    async fn no_connection_data_waits_to_max_and_names_the_fix() {
        let d = Drain::builder()
            .grace_period(Duration::from_secs(30))
            .signals(Signals::none())
            .report_to_stderr(false)
            .termination_log(None)
            .build()
            .unwrap();
        d.mark_started();
        tokio::time::sleep(Duration::from_secs(30)).await;
        d.start(Trigger::Api);
        let (at, ev) = committed(&d).await;
        assert_eq!(at, 15_000);
        assert_eq!(ev.weak, Some(WeakEvidence::NoConnectionData));
        let report = d.report().unwrap();
        let a = report
            .advice
            .iter()
            .find(|a| a.rule == "no_connection_data")
            .unwrap();
        assert!(
            a.message.contains("use lameduck::serve or ConnMeta"),
            "{}",
            a.message
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_floor_replaces_max_when_evidence_is_weak() {
        let d = drain(Propagation::default().assume_converged_after(Duration::from_secs(4)));
        arrivals(&d, Duration::from_secs(3), 10).await;
        d.start(Trigger::Api);
        // While draining, /status names what the policy waits on.
        tokio::task::yield_now().await;
        assert_eq!(d.status().evidence.unwrap().kind, EvidenceKind::Floor);
        let (at, ev) = committed(&d).await;
        assert_eq!(at, 4000);
        assert_eq!(ev.kind, EvidenceKind::Floor);
        assert_eq!(ev.floor_ms, Some(4000));
        assert_eq!(ev.max_reason, None);
    }

    #[tokio::test(start_paused = true)]
    async fn connections_that_never_stop_commit_at_max_as_never_quiet() {
        let d = drain(Propagation::default());
        arrivals(&d, Duration::from_millis(50), 600).await;
        d.start(Trigger::Api);
        let d2 = d.clone();
        let load = tokio::spawn(async move {
            // Bounded: 20 s of one connection every 100 ms, or until stopped.
            for _ in 0..200 {
                if d2.phase() >= Phase::StoppedAccepting {
                    break;
                }
                d2.note_connection(PEER);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let (at, ev) = committed(&d).await;
        load.await.unwrap();
        assert_eq!(at, 15_000);
        assert_eq!(ev.max_reason, Some(MaxReason::TrafficNeverWentQuiet));
        assert_eq!(ev.weak, None);
    }
}
