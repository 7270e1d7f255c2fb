//! Evidence for the propagation policy: how arrivals came while routing was unchanged (before
//! the trigger) and while some of it still went on (during the drain), and so how much silence
//! means that the proxies stopped routing here.
//!
//! # What is recorded
//!
//! Time is cut into slots of [`SLOT`] (250 ms), per **path**: a peer address, one row each for
//! up to 63 peers live at once (a connection open, or an arrival within the last 32 s; a peer
//! silent longer gives its row up while Serving); the rest, and connections of no known peer,
//! share one row, which never proves a silence (`too_many_peers`: mixed, a dense peer's
//! silence says nothing of a sparse one behind it). A slot of a path is *active* when
//! a new connection or a request of it arrived in it, and *fresh* when a connection accepted
//! in it closed while Serving after at most four requests. New connections are counted by the
//! accept loop (`serve`, `axum_serve`, or `ConnMeta::accepted` in a loop of one's own);
//! requests by `serve`'s and `axum_serve`'s per-connection service — not by the tower layer,
//! whose hot path stays as it was. Per path the drain also counts the connections open at the
//! trigger, the new connections since, and when each connection open at the trigger was told
//! to close (its first response after it, a GOAWAY) or closed.
//!
//! # What is evidence
//!
//! Only what a proxy that still routes here would *keep* sending. A request on a kept
//! connection is not: when the drain tells the connection to close, an L4 client (behind
//! kube-proxy) reconnects through its proxy, lands here again with chance 1/n, else elsewhere,
//! and stays there — whatever the proxies do. A per-request L7 router (HAProxy, Envoy) comes
//! back on a new connection for as long as it routes here; so does an L4 pool whose demand
//! grows during the drain, until its connections settle elsewhere — and when it next connects,
//! at its next concurrency peak, no silence bounds. So a path that kept connections alive holds
//! the drain to `max` whatever it does after the trigger
//! ([`PathFit::holds_kept_connections`], `kept_connections`); a path that kept none and opens
//! more than a reconnect wave ([`beyond_wave`]) routes per request and is judged by its rate. And
//! proxies converge one by one, each carrying its own clients, so each path is judged by its
//! own arrivals ([`PathFit`], [`PathRouting`]) and the commit waits for the path whose proof
//! comes last; a path whose data cannot say holds the drain to `max`. The simulation
//! (`tests/evidence_sim.rs`) drives kept-alive pools and 2 to 20 proxies through this code.
//!
//! # The model
//!
//! Per path, the fit reads the window before the trigger ([`WINDOW`], 30 s, or less for a
//! younger process) — its activity, and, apart, its fresh connections — and, for a path that
//! routes per request, the slots from the trigger's up to its last new connection: arrivals during
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
//! routing was unchanged proves nothing). The silence asked for, `T_conf`, is k slots, counted
//! on the slot grid: from the end of the slot of the last new connection (or of the trigger's),
//! so that it is k whole empty slots, the runs the chain counts. The silence since the
//! connection itself is thus between `T_conf` and `T_conf` + 250 ms. (Counting from the
//! connection instead needs k + 1 slots to hold k whole ones wherever it starts, an eighth of a
//! second more on average: the first estimator did.) The report names the bound that set it
//! ([`SilenceRule`]: `markov` or `longest_gap`).
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
//! 2/s or below it exceeds the default `max` and the drain says `too_sparse`. A process that has
//! served for less than 15 s says `too_few_slots` and waits too: in the simulation, processes
//! that young (the proxies starting to route a random delay after serving began) broke ε on
//! Markov-modulated traffic with 5 s and 10 s of window, as a window that short sees too few
//! of the traffic's phases.
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

//! * **When a client that keeps connections next connects.** A pool that takes its most
//!   recent idle connection first and opens one only when none is idle (hyper's) replaces
//!   the connections the drain closed at its next concurrency peak, however late. So a path
//!   that kept connections alive holds the drain to `max` (`kept_connections`); the pool
//!   wait alone lost 0.5–3.5 % of the simulation's most-recent-first pools' drains, judging a
//!   surging pool as a per-request router 0.6 % (BENCHMARKS.md §8).
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

use std::net::IpAddr;
use std::time::Duration;

use tokio::time::Instant;

mod fit;
mod path;
mod peers;
mod report;
mod window;

pub(crate) use fit::Estimate;
use fit::Slots;
pub(crate) use path::PathFit;
pub(crate) use peers::PeerSet;
pub use peers::PER_REQUEST_PEERS_ENV;
pub(crate) use window::Window;

pub(crate) use crate::hot::observed::{slot_of, Arrivals, SLOT};
use crate::hot::observed::{PathId, RING};
use crate::report::{PathRouting, SilenceRule, WeakEvidence};

/// The least and the most silence past `max` that ends a path's claim to be still routed
/// here ([`Evidence::routed_until`]).
pub(crate) const PAST_MAX_SILENCE: (Duration, Duration) =
    (Duration::from_millis(500), Duration::from_secs(10));

/// How far back before the trigger the process is observed.
pub(crate) const WINDOW: Duration = Duration::from_secs(30);
const WINDOW_SLOTS: u64 = (WINDOW.as_millis() / SLOT.as_millis()) as u64;
/// Fewer observed slots than this (15 s) is not enough to tell a rate from a burst: a window
/// that short has seen too few of the traffic's phases. The simulation's young processes
/// (serving 6–30 s, the proxies starting to route a random delay after) broke ε on
/// Markov-modulated traffic with 5 s (22 and 22 in 20,000 drains) and 10 s (17), not with 15 s.
pub(crate) const MIN_SLOTS: u64 = 60;
/// The default accepted chance that a connection would still have arrived had routing not
/// changed.
pub(crate) const DEFAULT_EPSILON: f64 = 1e-3;

const _: () = assert!(RING as u64 > WINDOW_SLOTS);
const _: () = assert!(WINDOW_SLOTS <= 128, "the window is copied into a u128");
const _: () = assert!(fit::MAX_SEQ as u64 > WINDOW_SLOTS + RING as u64);

/// Whether `after` new connections since the trigger (less those its fresh connections
/// explain) are more than a path with `open` connections at the trigger sends by reconnecting
/// them: each closed connection reconnects
/// through its proxy and lands here again with chance 1/n, so n ≥ 2 endpoints give about
/// `open` more (2·`open` at most on average); three times that plus four is beyond the wave
/// (a pool of 32 would need 100, more than 8 standard deviations above its mean with two
/// endpoints). A path beyond it keeps coming back after being told to close: it routes per
/// request (an L7 proxy), or through a proxy that still sends it all here.
pub(crate) fn beyond_wave(open: u32, after: u32) -> bool {
    u64::from(after) > 3 * u64::from(open) + 4
}

/// The whole evidence as the driver holds it: the window taken at the trigger, the fits of
/// the latest check, and the policy's numbers.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Evidence {
    window: Option<Window>,
    /// Per path, as of the latest check; the trigger instant (slots after it are fitted).
    pub(crate) fits: Vec<PathFit>,
    origin: Option<Instant>,
    /// The start of the slot after the latest check's.
    next: Option<Instant>,
    requests_seen: bool,
    pub(crate) epsilon: f64,
    /// `max`, to tell "too sparse" from "never went quiet", and the drain's horizon.
    pub(crate) max: Duration,
    /// The user's fallback ([`Propagation::quiet_suffices_after`](crate::Propagation::quiet_suffices_after)).
    pub(crate) fallback: Option<Duration>,
    /// The peers declared to route per request.
    per_request: PeerSet,
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
            fits: Vec::new(),
            origin: None,
            next: None,
            requests_seen: false,
            epsilon,
            max,
            fallback,
            per_request: PeerSet::default(),
        }
    }

    /// Judges the paths of `peers` as routing per request (see
    /// [`Propagation::per_request_peers`](crate::Propagation::per_request_peers)).
    pub(crate) fn per_request(mut self, peers: PeerSet) -> Self {
        self.per_request = peers;
        self
    }

    /// Whether `peer` was declared to route per request.
    fn declared(&self, peer: Option<IpAddr>) -> bool {
        peer.is_some_and(|ip| self.per_request.contains(ip))
    }

    /// Slots of the window before the trigger (0 without connection data).
    pub(crate) fn window_slots(&self) -> u64 {
        self.window.as_ref().map_or(0, Window::slots)
    }

    /// Whether connection data exists at all (a server counted connections).
    pub(crate) fn has_data(&self) -> bool {
        self.window.is_some()
    }

    /// Refits every path to its window and to what arrived since the trigger `origin`: its
    /// new connections (their number against the connections it had open decides whether it
    /// routes per request) and, for a path that does, the slots from the trigger's up to its
    /// last new connection — samples of the routing while some of it still went on; the
    /// silence after it is what is being tested. `now` is the current slot (older slots than
    /// a ring-turn read as empty).
    pub(crate) fn refit(&mut self, arrivals: &Arrivals, origin: Instant, now: u64) {
        let Some(w) = &self.window else {
            self.fits.clear();
            return;
        };
        self.origin = Some(origin);
        self.next = Some(w.base + SLOT * (now + 1) as u32);
        self.requests_seen = arrivals.requests_seen();
        let mut fits = Vec::with_capacity(w.paths.len());
        for (path, peer) in arrivals.paths() {
            let declared = self.declared(peer);
            let (after, last) = arrivals.after(path);
            let last_new = (last != 0)
                .then(|| w.base + Duration::from_nanos(last - 1))
                .filter(|&t| t >= origin);
            let last = if declared {
                // A declared router's every request is a routing decision: its silence runs
                // from its last arrival of any kind.
                let slot = arrivals.last_active(path);
                (slot > w.trigger_slot).then(|| (w.base + SLOT * (slot - 1) as u32).max(origin))
            } else {
                last_new
            };
            let pw = w.paths.iter().find(|p| p.path == path);
            let fit = match pw.filter(|p| p.activity != 0) {
                Some(pw) => self.fit_path(w, pw, arrivals, (origin, now), (after, last), declared),
                // Nothing in the window: a new path, once it sent anything.
                None if after > 0 => {
                    let mut fit = self.fit_new_path(w, path, peer, pw, arrivals, (after, last));
                    fit.declared = declared;
                    fit
                }
                None => continue,
            };
            let counted = arrivals.requests_in(path, w.seconds());
            let read = self.fits.iter().find(|f| f.path == path);
            let requests_before = counted.max(read.map_or(0, |f| f.requests_before));
            fits.push(PathFit {
                last_new,
                requests_before,
                ..fit
            });
        }
        self.fits = fits;
    }

    /// A path with nothing in the window that sent `after` new connections since, the last at
    /// `last`: no rate of its own to judge.
    fn fit_new_path(
        &self,
        w: &Window,
        path: PathId,
        peer: Option<IpAddr>,
        pw: Option<&window::PathWindow>,
        arrivals: &Arrivals,
        (after, last): (u32, Option<Instant>),
    ) -> PathFit {
        let before = w.slots() as usize;
        let mut slots = Slots::new();
        (0..before).for_each(|_| slots.push(false));
        PathFit {
            path,
            peer,
            routing: PathRouting::New,
            open: pw.map_or(0, |p| p.open),
            after,
            fresh_slots: 0,
            last,
            open_now: arrivals.open_count(path),
            told: 0,
            told_sum: Duration::ZERO,
            kept: arrivals.kept_count(path),
            activity: Estimate::fit(&slots, before, self.requests_seen, self.epsilon, self.max),
            fresh: None,
            declared: false,
            last_new: None,
            requests_before: 0,
        }
    }

    /// A path that was active in the window: how it is routed, and its fits. A `declared`
    /// path routes per request whatever its connections did, and its requests after the
    /// trigger are samples too.
    fn fit_path(
        &self,
        w: &Window,
        pw: &window::PathWindow,
        arrivals: &Arrivals,
        (origin, now): (Instant, u64),
        (after, last): (u32, Option<Instant>),
        declared: bool,
    ) -> PathFit {
        let path = pw.path;
        let before = w.slots() as usize;
        // Fresh connections explain some of what came since: a slot marks one or more,
        // so four per fresh slot of the window, at its rate, over the time elapsed.
        let fresh_slots = u64::from(pw.fresh.count_ones());
        let elapsed = (w.base + SLOT * (now + 1) as u32).saturating_duration_since(origin);
        let explained = (4 * fresh_slots) as f64 / (w.slots().max(1) as f64 * SLOT.as_secs_f64())
            * elapsed.as_secs_f64();
        let beyond = u64::from(after).saturating_sub(explained.ceil() as u64);
        // The connections open at the trigger that the drain moves: not those that left
        // by themselves since (a request in flight whose client then closed).
        let open = pw.open.saturating_sub(arrivals.left_count(path));
        let per_request = declared || beyond_wave(open, u32::try_from(beyond).unwrap_or(u32::MAX));
        let (told, told_sum) = arrivals.told_sum(path);
        // After the trigger, up to the path's last new connection: samples of its arrivals
        // while some proxy still routed it here, for a path that routes per request and
        // for a fresh-connection client alike (its rate may have changed since the window:
        // a slow phase at the trigger is what its silence is weighed by; without them the
        // simulation's Markov-modulated 20/s ↔ 0.5/s lost 235 in 200,000 at the gap
        // start, 179 with them). Not while the drain's own reconnect wave could be most of
        // them: each connection open at the trigger comes back at most once, so a path
        // with kept connections is sampled only once its new connections are more than
        // twice those.
        let sampled =
            per_request || (pw.fresh != 0 && (open == 0 || u64::from(after) > 2 * u64::from(open)));
        let after_slots = match last.filter(|_| sampled) {
            Some(last) => w.samples_after(arrivals, path, (slot_of(w.base, last), now), declared),
            None => Vec::new(),
        };
        let fit = |bits: u128, requests_seen: bool, pick: fn(&(bool, bool)) -> bool| {
            let mut slots = Slots::new();
            for i in 0..before {
                slots.push(bits & (1 << i) != 0);
            }
            after_slots.iter().for_each(|a| slots.push(pick(a)));
            Estimate::fit(&slots, before, requests_seen, self.epsilon, self.max)
        };
        let activity = fit(pw.activity, self.requests_seen, |a| a.0);
        let fresh = (!per_request && pw.fresh != 0).then(|| fit(pw.fresh, false, |a| a.1));
        PathFit {
            path,
            peer: pw.peer,
            routing: if per_request {
                PathRouting::PerRequest
            } else if pw.fresh != 0 {
                PathRouting::Connections
            } else {
                PathRouting::Pool
            },
            open,
            after,
            fresh_slots,
            last,
            open_now: arrivals.open_count(path),
            told,
            told_sum,
            kept: arrivals.kept_count(path),
            activity,
            fresh,
            declared,
            last_new: None,
            requests_before: 0,
        }
    }

    /// The path that sets the commit: the first that cannot say (in
    /// `WeakEvidence::BINDING_ORDER`), else the one whose proof comes last.
    pub(crate) fn binding(&self) -> Option<&PathFit> {
        let origin = self.origin?;
        let base = self.window.as_ref()?.base;
        let counted = || self.fits.iter().filter(|f| f.counts());
        for w in WeakEvidence::BINDING_ORDER {
            if let Some(f) = counted().find(|f| f.weak(self.max) == Some(w)) {
                return Some(f);
            }
        }
        let next = self.next?;
        counted().max_by_key(|f| f.conf_at(base, origin, next))
    }

    /// Until when the latest arrivals show some path still routed here (`None`: no path sent a
    /// new connection since the trigger `origin`): each path's last new connection (for a
    /// declared router, its last arrival) plus the silence that a path still routed here shows
    /// by chance less than once in 1/ε drains before the cap `cap_at`, within
    /// [`PAST_MAX_SILENCE`]. What the policy serves past `max` for.
    ///
    /// A connection here proves that a proxy routed it here then. At a mean gap `g`, a path
    /// routed here is silent for `t` with chance about `e^(-t/g)` per gap, and it has about
    /// `(cap - last) / g` gaps left before the cap: so `t = g · ln(gaps / ε)`. The gap is the
    /// longer of two estimates, each one standard error long (`· (1 + 1/√n)` over `n`
    /// arrivals): since the trigger alone (the rate may have dropped), and with the window's
    /// fresh-connection slots before it (a few connections since the trigger overstate a
    /// sparse path's rate as often as they understate it). Three mean gaps since the trigger,
    /// the rule before, are a silence a Poisson path shows about once in twenty gaps: on the
    /// simulation's paths at 0.5–5/s through a proxy 0.5–7 s slower than `max`, 22–62 % of the
    /// drains committed while it still routed here. The 10 s bound keeps a path that sent
    /// one connection early in the drain from holding it to the cap: at 0.5/s such a path
    /// still loses about one drain in ninety (19 % before); at 1/s 2 in 20,000, faster none.
    pub(crate) fn routed_until(&self, origin: Instant, cap_at: Instant) -> Option<Instant> {
        let window = self
            .window
            .as_ref()
            .map_or(0.0, |w| w.slots() as f64 * SLOT.as_secs_f64());
        let gap = |secs: f64, n: f64| secs / n * (1.0 + n.sqrt().recip());
        self.fits
            .iter()
            .filter(|f| f.after > 0)
            .filter_map(|f| {
                let last = f.last?;
                let span = last.saturating_duration_since(origin).as_secs_f64();
                let after = f64::from(f.after);
                let g = match f.fresh_slots {
                    0 => gap(span, after),
                    fresh => gap(span, after).max(gap(window + span, fresh as f64 + after)),
                };
                let left = cap_at.saturating_duration_since(last).as_secs_f64();
                let gaps = if g > 0.0 { (left / g).max(1.0) } else { 1.0 };
                let silence = g * (gaps / self.epsilon.max(f64::MIN_POSITIVE)).ln();
                let silence = Duration::try_from_secs_f64(silence.max(0.0))
                    .unwrap_or(Duration::MAX)
                    .clamp(PAST_MAX_SILENCE.0, PAST_MAX_SILENCE.1);
                Some(
                    last.checked_add(silence)
                        .unwrap_or(cap_at)
                        .min(cap_at.max(last)),
                )
            })
            .max()
    }

    /// The start of the slot after the latest refit: when the data next changes.
    pub(crate) fn next_slot(&self) -> Option<Instant> {
        self.next
    }

    /// The silence the binding path needs and the rule that set it, when the data can say.
    pub(crate) fn required(&self) -> Option<(Duration, SilenceRule)> {
        self.binding()
            .and_then(|f| f.required())
            .map(|(t, r, _)| (t, r))
    }

    /// When the silence of every path that carried traffic proves the run of empty slots its
    /// own fit asks for (see [`PathFit`]): the latest of them. `None` when some path's data
    /// cannot say, or none carried traffic.
    pub(crate) fn conf_at(&self) -> Option<Instant> {
        let next = self.next?;
        self.latest(|f, base, origin| f.conf_at(base, origin, next))
    }

    /// [`conf_at`](Self::conf_at) once the proxies are known to have converged (the
    /// EndpointSlice plus the allowance, feature `kube`): each path's silence only, without a
    /// pool's wait for reconnects through a proxy that may still route here.
    pub(crate) fn conf_at_proxies_converged(&self) -> Option<Instant> {
        self.latest(PathFit::silence_proved_at)
    }

    /// When every path declared to route per request has proved its silence, and not before
    /// `confirmed` (every node's agent said its rules no longer route here, which covers every
    /// path kube-proxy routes). `None`: a declared path's data cannot say (it waits to `max`).
    pub(crate) fn conf_at_nodes_confirmed(&self, confirmed: Instant) -> Option<Instant> {
        let (Some(origin), Some(w)) = (self.origin, &self.window) else {
            return Some(confirmed);
        };
        let mut at = confirmed;
        for f in self.fits.iter().filter(|f| f.declared && f.counts()) {
            if f.weak(self.max).is_some() {
                return None;
            }
            at = at.max(f.silence_proved_at(w.base, origin)?);
        }
        Some(at)
    }

    /// The latest of `at` over the paths that hold the commit; `None` when some path's data
    /// cannot say, or none carried traffic.
    fn latest(
        &self,
        at: impl Fn(&PathFit, Instant, Instant) -> Option<Instant>,
    ) -> Option<Instant> {
        if self.weak().is_some() {
            return None;
        }
        let origin = self.origin?;
        let base = self.window.as_ref()?.base;
        self.fits
            .iter()
            .filter(|f| f.counts())
            .map(|f| at(f, base, origin))
            .max()
            .flatten()
    }

    /// Why the data cannot decide the commit, if it cannot.
    pub(crate) fn weak(&self) -> Option<WeakEvidence> {
        let Some(w) = &self.window else {
            return Some(WeakEvidence::NoConnectionData);
        };
        if self.origin.is_none() {
            return Some(if w.slots() < MIN_SLOTS {
                WeakEvidence::TooFewSlots
            } else {
                WeakEvidence::TooSparse
            });
        }
        match self.binding() {
            // Nothing carried traffic: no rate to weigh a silence by.
            None if w.slots() < MIN_SLOTS => Some(WeakEvidence::TooFewSlots),
            None => Some(WeakEvidence::TooSparse),
            Some(f) => f.weak(self.max),
        }
    }
}

#[cfg(all(test, not(lameduck_loom)))]
mod tests;
