//! One path's evidence: how it is routed, the fits its silence is judged by, and when that
//! silence proves its proxy converged (a pool's wait for its kept connections included).

use std::net::IpAddr;
use std::time::Duration;

use tokio::time::Instant;

use super::{beyond_wave, slot_of, Estimate, MIN_SLOTS, SLOT};
use crate::hot::observed::PathId;
use crate::report::{PathRouting, SilenceRule, WeakEvidence};

/// One path's evidence at the latest check: how it is routed, and the fits its silence is
/// judged by.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct PathFit {
    pub(crate) path: PathId,
    pub(crate) peer: Option<IpAddr>,
    pub(crate) routing: PathRouting,
    /// Connections open at the trigger that have not left by themselves since (the ones the
    /// drain moves), and new ones since.
    pub(crate) open: u32,
    pub(crate) after: u32,
    /// Slots of the window with a fresh connection (accepted and closed while Serving).
    pub(crate) fresh_slots: u64,
    /// The last new connection of the path after the trigger.
    pub(crate) last: Option<Instant>,
    /// Connections of the path open at the check.
    pub(crate) open_now: u32,
    /// Of the connections open at the trigger, those told to close since, and the sum of how
    /// long after the trigger.
    pub(crate) told: u32,
    pub(crate) told_sum: Duration,
    /// Of the connections open at the trigger, those seen kept alive (more requests than a
    /// fresh connection carries) when told to close or when they closed.
    pub(crate) kept: u32,
    /// The fit of the path's activity (requests and new connections) before the trigger, and
    /// for a path routed per request its new connections after it: what a proxy that routes
    /// per request would keep sending.
    pub(crate) activity: Estimate,
    /// The fit of the path's new connections alone before the trigger, when it opened some
    /// and is not routed per request: fresh connections keep coming while a proxy routes
    /// here, whatever the path's kept connections do, so the silence must satisfy both.
    pub(crate) fresh: Option<Estimate>,
    /// The peer was declared to route per request
    /// ([`Propagation::per_request_peers`](crate::Propagation::per_request_peers)): judged
    /// by the silence of all its arrivals, never held for its kept connections.
    pub(crate) declared: bool,
    /// The last new connection of the path after the trigger (`last` is that too, but for a
    /// declared path, whose `last` is its last arrival of any kind).
    pub(crate) last_new: Option<Instant>,
    /// Its requests counted in the window's whole seconds (the most any check read: a second's
    /// count only grows, until a later second takes its bucket over).
    pub(crate) requests_before: u64,
}

impl PathFit {
    /// Whether the path holds the commit: it carried traffic before the trigger, or has sent
    /// more since than its reconnect wave.
    pub(crate) fn counts(&self) -> bool {
        match self.routing {
            PathRouting::New => {
                (self.open == 0 && self.after > 0) || beyond_wave(self.open, self.after)
            }
            _ => self.activity.slots_before > 0 && self.activity.busy() > 0,
        }
    }

    /// The silence the path needs, and the fit that set it; `None` when the data cannot say.
    pub(crate) fn required(&self) -> Option<(Duration, SilenceRule, &Estimate)> {
        if self.routing == PathRouting::New {
            return None;
        }
        let (t, rule) = self.activity.required()?;
        match &self.fresh {
            None => Some((t, rule, &self.activity)),
            Some(f) => {
                let (tf, rf) = f.required()?;
                Some(if tf > t {
                    (tf, rf, f)
                } else {
                    (t, rule, &self.activity)
                })
            }
        }
    }

    /// The estimate to show for the path: the one that set its silence, or the activity's.
    pub(crate) fn shown(&self) -> &Estimate {
        match self.required() {
            Some((_, _, e)) => e,
            None => match &self.fresh {
                Some(f) if f.required().is_none() => f,
                _ => &self.activity,
            },
        }
    }

    /// Why the path's data cannot decide the commit, if it cannot.
    pub(crate) fn weak(&self, max: Duration) -> Option<WeakEvidence> {
        if self.path == PathId::OTHER {
            // Peers beyond the table, or of no known address, mixed: a dense one that stopped
            // would prove a silence no sparse one behind it could.
            return Some(WeakEvidence::TooManyPeers);
        }
        if self.routing == PathRouting::New {
            return Some(WeakEvidence::NewPath);
        }
        if self.activity.slots_before + self.activity.slots_after < MIN_SLOTS {
            return Some(WeakEvidence::TooFewSlots);
        }
        if self.holds_kept_connections() {
            return Some(WeakEvidence::KeptConnections);
        }
        match self.required() {
            Some((t, _, _)) if t < max => None,
            _ => Some(WeakEvidence::TooSparse),
        }
    }

    /// Whether the path kept connections alive that the drain closes, or may still close: a
    /// client that keeps connections opens new ones when its own demand needs them — a pool
    /// that takes its most recent idle connection first (hyper's) at its next concurrency
    /// peak, however late — so no silence here bounds when it next connects, and the path
    /// waits to `max` or the EndpointSlice. Connections open at the trigger and not yet told
    /// to close count too, until they are (fresh ones with a request in flight, about as long
    /// as that request).
    ///
    /// Whatever its routing: a path that opened more than a reconnect wave since the trigger
    /// (`per_request`) may be an L7 router whose requests are its routing decisions, or an L4
    /// pool whose demand grew while its proxy still routed here, which goes quiet once its
    /// connections have settled on other endpoints and connects here again at its next peak.
    /// Nothing local tells the two apart. In the simulation the pool wait alone lost 0.5–3.5 %
    /// of most-recent-first pools' drains, and the exemption of per-request paths 0.6 % of a
    /// pool's whose demand surged during the drain (BENCHMARKS.md §8).
    pub(crate) fn holds_kept_connections(&self) -> bool {
        !self.declared && (self.kept > 0 || self.open > self.told)
    }

    /// Whether a path declared to route per request behaved like a client pool: it kept
    /// connections alive and, since the trigger (`origin`), opened new ones over a span in
    /// which a router at its own request rate would have opened more than a reconnect wave —
    /// and opened no more than that wave. A router keeps choosing this Pod, request after
    /// request (each on a new connection once the drain told its kept ones to close), until it
    /// stops; a pool reconnects once per connection the drain closed, however long its proxy
    /// still routes here, and connects again whenever its demand needs it, which no silence
    /// bounds.
    pub(crate) fn declared_like_a_pool(&self, origin: Instant) -> bool {
        if !self.declared || self.kept == 0 || self.after == 0 || beyond_wave(self.open, self.after)
        {
            return false;
        }
        let Some(last) = self.last_new else {
            return false;
        };
        let span = last.saturating_duration_since(origin).as_secs_f64();
        // The requests a router at the path's rate before the trigger would have sent in that
        // span, each beyond the kept connections' first on a new connection.
        let routed = (self.activity.rate() * span) as u64;
        let routed = routed.saturating_sub(u64::from(self.open));
        beyond_wave(self.open, u32::try_from(routed).unwrap_or(u32::MAX))
    }

    /// When the path's silence proves the run of empty slots its fit asks for: the end of the
    /// slot of its last new connection (or of the trigger's) plus the silence needed, so the
    /// slots counted are whole slots of the chain.
    ///
    /// A path that kept connections open at the trigger and is not routed per request (a
    /// pool) also waits, after its last new connection, long enough that a connection that
    /// landed here again has made its next request (and reconnected elsewhere, or here): see
    /// [`pool_silence`]; and, while some of its kept connections are still open (one closed
    /// by the commit reconnects through a proxy that may still route here), as long from the
    /// trigger. Until one of them has been used the path asks to be checked again at the next
    /// slot (`next`). A path whose connections were kept alive never gets here: its evidence
    /// is weak ([`holds_kept_connections`](Self::holds_kept_connections)); what remains are
    /// fresh connections (four requests or fewer) open at the trigger, all told to close.
    pub(super) fn conf_at(&self, base: Instant, origin: Instant, next: Instant) -> Option<Instant> {
        let proved = self.silence_proved_at(base, origin)?;
        let last = self.last.unwrap_or(origin).max(origin);
        if self.open == 0 || self.routing == PathRouting::PerRequest {
            return Some(proved);
        }
        let Some(wait) = self.pool_wait() else {
            // None of its kept connections used yet: nothing says how soon they will be.
            return Some(proved.max(next));
        };
        let mut at = proved.max(last + wait);
        if self.open_now > 0 {
            // A kept connection still unused when a used one would, at the rate the used ones
            // show, have been used again with chance 1 − ε/C is parked (a pool that takes its
            // most recent connection first): closing it makes no reconnect of its own.
            at = at.max(origin + wait);
        }
        Some(at)
    }

    /// When the path's silence alone proves its run of empty slots: the end of the slot of
    /// its last new connection (or of the trigger's) plus the silence its fit asks for.
    pub(super) fn silence_proved_at(&self, base: Instant, origin: Instant) -> Option<Instant> {
        let (t, _, _) = self.required()?;
        let last = self.last.unwrap_or(origin).max(origin);
        let end = (slot_of(base, last) + 1) * SLOT.as_nanos() as u64;
        Some(base + Duration::from_nanos(end) + t)
    }

    /// A pool's wait after its last new connection (see [`pool_silence`]), from the kept
    /// connections used since the trigger; `None` for a path that is no pool, or a pool none
    /// of whose kept connections has been used yet.
    pub(crate) fn pool_wait(&self) -> Option<Duration> {
        (self.open > 0 && self.routing != PathRouting::PerRequest && self.told > 0)
            .then(|| pool_silence(self.open, self.told, self.told_sum, self.activity.epsilon))
    }
}

/// The silence a pool of `open` kept connections needs after its last new connection: each
/// connection is used again after a time of its own, about exponential (requests spread over
/// the pool); `told` of them were used (or closed) first `sum` after the trigger in all, which
/// bounds the mean time between two uses of one connection from above (a sum of `told`
/// exponentials, at its lower 1 % quantile). A connection that landed here again reconnects
/// after such a time; the wait makes it unlikely (below ε over all `open`) that one still has
/// not by the commit.
pub(crate) fn pool_silence(open: u32, told: u32, sum: Duration, epsilon: f64) -> Duration {
    let n = f64::from(told.max(1));
    let mean = sum.as_secs_f64() / gamma_lower_quantile(n);
    let s = mean * (f64::from(open.max(1)) / epsilon).ln();
    Duration::from_secs_f64(s.min(3600.0))
}

/// A lower 1 % quantile of the Gamma(k, 1) law (a sum of k unit exponentials), never above it.
///
/// For the whole k a pool gives (up to [`EXACT_UP_TO`]) it is the quantile itself, by bisection
/// of the law's distribution function (the Poisson sum): with one or two samples the cube-root
/// approximation used beyond errs low by a factor of 7 (k = 1: 0.0014 against 0.0101), and
/// the pool's wait, inversely proportional to it, long by as much.
pub(crate) fn gamma_lower_quantile(k: f64) -> f64 {
    const P: f64 = 0.01;
    if k >= 1.0 && k <= EXACT_UP_TO as f64 && k.fract() == 0.0 {
        // P(Gamma(k) ≤ x) rises with x from 0: keep `lo` below the quantile.
        let (mut lo, mut hi) = (0.0_f64, k + 10.0 * k.sqrt() + 10.0);
        for _ in 0..64 {
            let mid = 0.5 * (lo + hi);
            if gamma_cdf(k as u32, mid) < P {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        return lo.max(1e-3);
    }
    const Z: f64 = 2.326; // the normal law's 1 % quantile, negated
    let v = 1.0 / (9.0 * k);
    let c = (1.0 - v - Z * v.sqrt()).max(0.0);
    // Wilson–Hilferty's cube root; 0.99: within half a percent of the quantile from k = 10 on,
    // on either side.
    (0.99 * k * c * c * c).max(1e-3)
}

/// Up to this many samples the Gamma quantile is computed exactly.
const EXACT_UP_TO: u32 = 256;

/// P(Gamma(k, 1) ≤ x) for a whole k: 1 − Σ_{j<k} e^{−x} x^j / j!, each term in logs.
fn gamma_cdf(k: u32, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    let ln_x = x.ln();
    let (mut tail, mut ln_fact) = (0.0_f64, 0.0_f64);
    for j in 0..k {
        if j > 0 {
            ln_fact += f64::from(j).ln();
        }
        tail += (f64::from(j) * ln_x - x - ln_fact).exp();
    }
    (1.0 - tail).max(0.0)
}
