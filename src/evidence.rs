//! Evidence for the propagation policy: how arrivals came while routing was unchanged (before
//! the trigger) and while some of it still went on (during the drain), and so how much silence
//! means that the proxies stopped routing here.
//!
//! # What is recorded
//!
//! Time is cut into slots of [`SLOT`] (250 ms). A slot is *active* when a new connection or a
//! request arrived in it. New connections are counted by the accept loop (`serve`,
//! `axum_serve`, or `ConnMeta::accepted` in a loop of one's own); requests by `serve`'s and
//! `axum_serve`'s per-connection
//! service — not by the tower layer, whose hot path stays as it was. Requests matter because a
//! pooling proxy (HAProxy keeps its backend connections) opens few connections while Serving,
//! yet once draining every response carries `Connection: close`, so while it still routes
//! here each of its next requests comes on a *new* connection: the process to model is the
//! activity, and after the trigger it shows up as new connections. So a slot before the
//! trigger is busy when anything arrived in it, a slot after it when a new connection did.
//! Where no request is counted (plain `axum::serve`, a custom loop), the slots are
//! connections only, as the report's `requests_seen` says.
//!
//! # The model
//!
//! The fit reads the window before the trigger ([`WINDOW`], 30 s, or less for a younger
//! process) and the slots from the trigger's up to the last new connection: arrivals during
//! the drain are samples of the routing while some of it still went on, and the silence after
//! the last one is what is being tested, so it is left out (the part of a gap that began
//! before the trigger is conditioned on, not fitted). It is refitted at each check.
//!
//! Slots are a two-state chain, busy and empty. From the transitions:
//!
//! ```text
//! p̂ = (empty + ½) / (slots + 1)                the fraction of empty slots
//! q̂ = (busy→empty + ½) / (busy→· + 1)          the chance that a gap begins after a busy slot
//! s ~ Beta(ee + κ·p̂, eb + κ·(1 − p̂))            "empty follows empty", κ = 10 slots of prior
//!                                                 pulling it towards independence (â = E[s])
//! P(a gap lasts ≥ k slots) = E[s^(k−1)]          the uncertainty of s included, its tail
//!                                                 made no lighter than k^−2
//! ```
//!
//! The drain gives a gap many chances to pass for convergence: every busy slot before `max` is
//! one, and so is the current position (a gap that began before the trigger is conditioned on
//! its elapsed part). The required number of empty slots k is the smallest with
//!
//! ```text
//! P(the current gap lasts k more) + max/SLOT · (1 − p̂) · q̂ · E[s^(k−1)]  ≤  ε
//! ```
//!
//! and at least one more than **the longest gap seen** (a silence that already happened while
//! routing was unchanged proves nothing). The silence asked for, `T_conf`, is k + 1 slots, so
//! that a silence that long holds k whole empty slots wherever it starts. The report names the
//! bound that set it ([`SilenceRule`]: `markov` or `longest_gap`).
//!
//! Why this and not the fraction of empty slots alone (the first estimator): slots are not
//! independent. A client that works for 5 s and pauses for 5 s leaves half the slots empty,
//! which, taken as independent slots, asked for 3.7 s of silence — a silence that happened
//! every 10 s while nothing changed. The chain sees that empty slots come in runs (â near 1)
//! and the longest gap bounds the rest. Why the tail: the window holds tens of gaps at most,
//! too few to tell a geometric tail from a power law, and traffic whose slow phase lasts
//! longer than anything in the window (Markov-modulated rates, Pareto gaps) broke ε by an
//! order of magnitude in the simulation with a geometric tail; with k^−2 it holds (the
//! simulation, `tests/evidence_sim.rs` and `examples/evidence_sim.rs`, drives this code). Why
//! the chances: one gap at ε each would be many gaps at many ε over a drain that waits 15 s.
//! The price is speed for moderate rates: at 10 arrivals/s the silence is a few seconds, at
//! 2/s or below it exceeds the default `max` and the drain says `too_sparse`.
//!
//! Why a heavy tail on every window, and not only on those that look clustered: a lighter
//! tail (k^−3 or k^−2.25) when one-sided tests of independence all pass (empty-after-empty
//! against p̂, the longest gap against a geometric law, the recent slots against the whole)
//! halved the wait at 10 arrivals/s, and broke ε on Pareto gaps (scale 100 ms, shape 2.5):
//! 120 binary slots tell those from a Poisson rate in only about half the windows, and their
//! gaps of seconds are what the k^−2 tail is for (BENCHMARKS.md §8 has the numbers). Telling
//! them apart needs finer data than one bit per slot (counts or arrival times within a slot).
//!
//! Why 250 ms slots: dense traffic needs a handful of slots of silence (0.5–1 s at 50/s; the
//! default `quiet`, 500 ms, adds nothing); with 1 s slots it would be 4 s. Shorter slots would
//! need a larger ring for the same window and would measure scheduler jitter more than traffic.
//!
//! # What it cannot see
//!
//! * Traffic that stops at the trigger for reasons of its own (a client that finished, a batch
//!   that paused) looks like converged proxies. Nothing local can tell the two apart; the
//!   simulation reports it and does not hold it to ε. The EndpointSlice (feature `kube`) can.
//! * Pauses much longer than anything in the 30 s window — a client idle for minutes, a rate
//!   that falls steeply during the drain — beyond what the k^−2 tail allows for.
//! * Connections that never reach this process (refused by a full backlog).
//! * Requests on an HTTP/2 connection opened during the drain, after its first: only its
//!   opening counts (it keeps its requests until the commit).
//!
//! # Invariants
//!
//! * Recording a connection is one relaxed `fetch_max` on the ring entry of its slot; a
//!   request is a clock read and one relaxed load of the entry, and a `fetch_max` only for the
//!   first request of its slot (no lock, no allocation, no task). The entry holds the latest slot index (+1) that
//!   saw activity, shifted left by one, with the low bit for "a connection": a late writer of
//!   an older slot never hides a newer one, a connection is never hidden by a request of the
//!   same slot, and a stale entry (from a slot one ring-turn ago) reads as empty.
//! * The window is copied at the trigger (the ring turns over during a long drain); the ring
//!   holds more slots than the window, so no write during the trigger's own slot can overwrite
//!   a slot of it. Slots after the trigger older than a ring-turn read as empty, which only
//!   lengthens the silence asked for.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

mod fit;
#[doc(hidden)]
pub mod sim;

pub(crate) use fit::Estimate;
pub use fit::SilenceRule;
use fit::Slots;

/// The length of one slot of the arrival ring.
pub(crate) const SLOT: Duration = Duration::from_millis(250);
/// How far back before the trigger the process is observed.
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
const _: () = assert!(WINDOW_SLOTS <= 128, "the window is copied into a u128");
const _: () = assert!(fit::MAX_SEQ as u64 > WINDOW_SLOTS + RING as u64);

/// Which slots saw activity: a new connection, or a request.
///
/// Each ring entry holds `(slot + 1) << 1 | connection` for the latest slot that wrote it, so
/// `fetch_max` keeps the newest slot, and within one slot a connection over a request.
#[derive(Debug)]
pub(crate) struct Arrivals {
    ring: [AtomicU64; RING],
    /// Nanoseconds since `Core::base` + 1 of when connections started to be counted; 0 = no
    /// source of connection data (neither `serve` nor `ConnMeta` through `axum::serve`).
    observing_since: AtomicU64,
    /// At least one request was counted (not only connections).
    requests_seen: AtomicBool,
}

impl Arrivals {
    pub(crate) fn new() -> Self {
        Self {
            ring: std::array::from_fn(|_| AtomicU64::new(0)),
            observing_since: AtomicU64::new(0),
            requests_seen: AtomicBool::new(false),
        }
    }

    /// Counts one new connection in slot `slot`. One relaxed atomic operation: the value is
    /// read by the driver, which tolerates a slot seen a moment late.
    #[inline]
    pub(crate) fn record(&self, slot: u64) {
        self.ring[(slot % RING as u64) as usize]
            .fetch_max(((slot + 1) << 1) | 1, Ordering::Relaxed);
    }

    /// Counts one request in `slot`. While the slot's entry already says so (every request
    /// after the first of each slot), one relaxed load of the entry, no write.
    #[cfg(feature = "http")] // only `serve`'s and `axum_serve`'s per-connection services count requests
    #[inline]
    pub(crate) fn note_request(&self, slot: u64) {
        let entry = &self.ring[(slot % RING as u64) as usize];
        let v = (slot + 1) << 1;
        // Relaxed: read by the driver, which tolerates a slot seen a moment late.
        if entry.load(Ordering::Relaxed) < v {
            self.note_request_slow(entry, v);
        }
    }

    /// The first request of a slot.
    #[cfg(feature = "http")]
    #[cold]
    #[inline(never)]
    fn note_request_slow(&self, entry: &AtomicU64, v: u64) {
        entry.fetch_max(v, Ordering::Relaxed);
        if !self.requests_seen.load(Ordering::Relaxed) {
            self.requests_seen.store(true, Ordering::Relaxed);
        }
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

    /// Whether `slot` saw activity, and whether a new connection: `(active, connection)`. An
    /// entry from another ring-turn reads as empty.
    fn activity(&self, slot: u64) -> (bool, bool) {
        let v = self.ring[(slot % RING as u64) as usize].load(Ordering::Relaxed);
        if v >> 1 == slot + 1 {
            (true, v & 1 == 1)
        } else {
            (false, false)
        }
    }

    fn requests_seen(&self) -> bool {
        self.requests_seen.load(Ordering::Relaxed)
    }
}

/// The slot of `t`, counted from `base`. No 128-bit division: it runs on every request.
#[inline]
pub(crate) fn slot_of(base: Instant, t: Instant) -> u64 {
    const PER_SEC: u64 = 1_000_000_000 / SLOT.as_nanos() as u64;
    let d = t.saturating_duration_since(base);
    d.as_secs() * PER_SEC + u64::from(d.subsec_nanos() / SLOT.as_nanos() as u32)
}

const _: () = assert!(
    1_000_000_000 % SLOT.as_nanos() == 0,
    "a slot divides a second"
);

/// The window before the trigger, copied at the trigger (the ring turns over during a long
/// drain).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Window {
    /// Bit i: slot `first + i` saw activity.
    bits: u128,
    first: u64,
    trigger_slot: u64,
}

impl Window {
    /// The window at `at` from what `arrivals` counted, slots numbered from `base`. `None`: no
    /// connection data at all.
    pub(crate) fn at(
        arrivals: &Arrivals,
        base: Instant,
        at: Instant,
        serving_since: Option<Instant>,
    ) -> Option<Self> {
        let since = match arrivals.observing_since() {
            0 => return None,
            stamp => base + Duration::from_nanos(stamp - 1),
        };
        let since = serving_since.map_or(since, |s| s.max(since));
        let trigger_slot = slot_of(base, at);
        // The first slot observed from its start.
        let since_ns = since.saturating_duration_since(base).as_nanos();
        let first = since_ns.div_ceil(SLOT.as_nanos()) as u64;
        let first = first
            .max(trigger_slot.saturating_sub(WINDOW_SLOTS))
            .min(trigger_slot);
        let mut bits = 0u128;
        for (i, k) in (first..trigger_slot).enumerate() {
            if arrivals.activity(k).0 {
                bits |= 1 << i;
            }
        }
        Some(Self {
            bits,
            first,
            trigger_slot,
        })
    }

    fn slots(&self) -> u64 {
        self.trigger_slot - self.first
    }
}

/// The whole evidence as the driver holds it: the window taken at the trigger, the fit of the
/// latest check, and the policy's numbers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Evidence {
    window: Option<Window>,
    pub(crate) estimate: Option<Estimate>,
    pub(crate) epsilon: f64,
    /// `max`, to tell "too sparse" from "never went quiet", and the drain's horizon.
    pub(crate) max: Duration,
    /// The user's fallback ([`Propagation::quiet_suffices_after`](crate::Propagation::quiet_suffices_after)).
    pub(crate) fallback: Option<Duration>,
}

impl Evidence {
    pub(crate) fn new(
        window: Option<Window>,
        epsilon: f64,
        max: Duration,
        fallback: Option<Duration>,
    ) -> Self {
        Self {
            window,
            estimate: None,
            epsilon,
            max,
            fallback,
        }
    }

    /// Fits the chain to the window and to the slots from the trigger's up to
    /// `last_connection`, the slot of the last new connection after the trigger: arrivals
    /// during the drain are samples of the routing while some of it still went on, and the
    /// silence after the last one is what is being tested. `now` is the current slot (older
    /// slots than a ring-turn read as empty).
    pub(crate) fn refit(&mut self, arrivals: &Arrivals, last_connection: Option<u64>, now: u64) {
        let Some(w) = self.window else {
            self.estimate = None;
            return;
        };
        let mut slots = Slots::new();
        for i in 0..w.slots() {
            slots.push(w.bits & (1 << i) != 0);
        }
        let before = w.slots() as usize;
        let end = last_connection.filter(|&s| s >= w.trigger_slot);
        if let Some(end) = end {
            // The newest slots are the ones to keep, should the drain outlast the buffer.
            let room = (fit::MAX_SEQ - before) as u64;
            let start = w.trigger_slot.max((end + 1).saturating_sub(room));
            for k in start..=end {
                let (active, connection) = if k + RING as u64 <= now {
                    (false, false)
                } else {
                    arrivals.activity(k)
                };
                // In the trigger's slot, what came before the trigger counts as before it.
                slots.push(if k == w.trigger_slot {
                    active
                } else {
                    connection
                });
            }
        }
        self.estimate = Some(Estimate::fit(
            &slots,
            before,
            arrivals.requests_seen(),
            self.epsilon,
            self.max,
        ));
    }

    /// The silence needed and the rule that set it, when the data can say.
    pub(crate) fn required(&self) -> Option<(Duration, SilenceRule)> {
        self.estimate.and_then(|e| e.required())
    }

    /// The silence needed, when the data can say.
    pub(crate) fn t_conf(&self) -> Option<Duration> {
        self.required().map(|(t, _)| t)
    }

    /// Why the data cannot decide the commit, if it cannot.
    pub(crate) fn weak(&self) -> Option<WeakEvidence> {
        match self.estimate {
            None => Some(WeakEvidence::NoConnectionData),
            Some(e) if e.slots_before + e.slots_after < MIN_SLOTS => {
                Some(WeakEvidence::TooFewSlots)
            }
            Some(e) if e.required().is_none_or(|(t, _)| t >= self.max) => {
                Some(WeakEvidence::TooSparse)
            }
            Some(_) => None,
        }
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

/// What the propagation policy went on when it committed (or, while draining, what it waits
/// for).
///
/// In JSON: `confidence`, `fallback`, `max`, `fixed`, `cut`, `endpoint_slice`, `never_served`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EvidenceKind {
    /// Silence long enough, by the arrivals measured before the trigger and during the
    /// drain, that a new connection would have come with probability ≥ 1 − ε had the proxies
    /// still routed here; [`EvidenceReport::rule`] names the bound that set it.
    Confidence,
    /// The user's fallback
    /// ([`Propagation::quiet_suffices_after`](crate::Propagation::quiet_suffices_after))
    /// passed before the evidence could say, and the quiet window held. A fallback, not a
    /// floor: `min` is the floor.
    Fallback,
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
    /// no fallback was set.
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
/// p̂ in millionths, `rate_per_1000s` is λ̂ in arrivals per 1000 s. A slot is *active* when a
/// new connection or a request arrived in it before the trigger, and when a new connection
/// arrived in it after (every reused connection is told to close then, so a proxy that still
/// routes here shows up as new connections).
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
    /// Slots fitted from the trigger's on: up to the last one with a new connection (the
    /// silence after it is what is being tested).
    #[serde(default)]
    pub slots_after_trigger: u64,
    /// Of the slots observed before and fitted after the trigger, those without activity.
    pub empty_slots: u64,
    /// Requests were counted, not only new connections (`lameduck::serve` and
    /// `lameduck::axum_serve` count both; `ConnMeta` under `axum::serve` only connections).
    #[serde(default)]
    pub requests_seen: bool,
    /// p̂ = (empty + ½) / (slots + 1), in millionths.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p_empty_ppm: Option<u64>,
    /// λ̂ = −ln p̂ / slot, the equivalent Poisson rate, in arrivals per 1000 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_per_1000s: Option<u64>,
    /// â, the estimated chance that an empty slot follows an empty slot, in millionths: near
    /// p̂ for independent arrivals, near 1 for traffic that pauses for many slots at a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stay_empty_ppm: Option<u64>,
    /// The longest run of empty slots seen while routing was unchanged, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub longest_gap_ms: Option<u64>,
    /// ε, the accepted chance that a connection would still have come, in millionths.
    pub epsilon_ppm: u64,
    /// The silence the evidence asks for, in milliseconds (before `max` bounds it); absent
    /// when even four times `max` would not be enough.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t_conf_ms: Option<u64>,
    /// The bound that set `t_conf_ms`: `markov` or `longest_gap`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<SilenceRule>,
    /// The user's fallback
    /// ([`Propagation::quiet_suffices_after`](crate::Propagation::quiet_suffices_after)), in
    /// milliseconds after the trigger, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_ms: Option<u64>,
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
    /// λ̂ in arrivals per second, for display.
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
                "{r:.2} {}/s ({} of {} slots empty, {} before the trigger; longest gap {} ms, \
                 empty after empty {} ppm)",
                if self.requests_seen {
                    "arrivals (connections or requests)"
                } else {
                    "new connections"
                },
                self.empty_slots,
                self.slots_observed + self.slots_after_trigger,
                self.slots_observed,
                self.longest_gap_ms.unwrap_or(0),
                self.stay_empty_ppm.unwrap_or(0),
            ),
            (None, _) => "no rate".to_owned(),
        };
        let need = match self.t_conf_ms {
            Some(t) if self.weak.is_none() => format!(
                "needs {t} ms of silence ({})",
                self.rule.map_or("no rule", SilenceRule::as_str)
            ),
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

impl Evidence {
    pub(crate) fn report(&self, kind: EvidenceKind, silence: Duration) -> EvidenceReport {
        let ms = |d: Duration| d.as_millis() as u64;
        let ppm = |x: f64| (x * 1e6).round() as u64;
        let weak = self.weak();
        let e = self.estimate;
        let required = self.required();
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
            slots_observed: e.map_or(0, |e| e.slots_before),
            slots_after_trigger: e.map_or(0, |e| e.slots_after),
            empty_slots: e.map_or(0, |e| e.empty),
            requests_seen: e.is_some_and(|e| e.requests_seen),
            p_empty_ppm: e.map(|e| ppm(e.p_empty())),
            rate_per_1000s: e.map(|e| (e.rate() * 1000.0).round() as u64),
            stay_empty_ppm: e.map(|e| ppm(e.stay_empty())),
            longest_gap_ms: e.map(|e| e.longest_gap * ms(SLOT)),
            epsilon_ppm: ppm(self.epsilon),
            t_conf_ms: required.map(|(t, _)| ms(t)),
            rule: required.map(|(_, r)| r),
            fallback_ms: self.fallback.map(ms),
            silence_ms: ms(silence),
            endpoint_slice: None,
            endpoint_slice_unused: None,
        }
    }
}

#[cfg(all(test, not(lameduck_loom)))]
mod tests;
