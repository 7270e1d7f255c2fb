//! When to commit to leaving: the quiet window weighed by evidence (default) or a fixed delay.

use std::time::Duration;

use tokio::time::Instant;

use crate::budget::{Budget, DurationDisplay};
use crate::evidence::{slot_of, Evidence, EvidenceKind, Window, DEFAULT_EPSILON};
use crate::guard::Core;
use crate::link::{Hold, Link};
use crate::phase::CommitReason;
use crate::report::{PolicyKind, PolicyReport};
use crate::ConfigError;

// The confidence rule guards sparse traffic and decides the silence needed, so `quiet` is only
// a floor on it (what the evidence cannot see: a last connection already in the kernel's accept
// queue, a proxy's last retry) and `min` the floor on the whole wait. At 50 arrivals/s the
// evidence itself asks for 0.5–1 s of silence, so a `quiet` of 500 ms changes no loss in the
// simulation (BENCHMARKS.md §8) and ends dense drains where the evidence says.
const DEFAULT_QUIET: Duration = Duration::from_millis(500);
const DEFAULT_MIN: Duration = Duration::from_secs(1);

/// The propagation policy: how long to keep accepting after the trigger, while load balancers
/// catch up with the readiness flip.
///
/// * [`Propagation::quiet`] (the default, with `quiet = 500ms`, `min = 1s`, `max = grace/2`,
///   ε = 10⁻³): commit once at least `min` has passed since the trigger **and** no new
///   connection has arrived for `quiet` (no new request either, when there is no connection
///   data: requests on open connections are not routing decisions) **and** nothing is in flight
///   **and** no new *connection* has arrived for `T_conf` — commit anyway at `max`.
///   This *measures* propagation instead of guessing it.
/// * [`Propagation::fixed`]: commit a fixed time after the trigger (a `sleep` in `preStop`,
///   done inside the process).
///
/// # Silence is evidence only in proportion to traffic
///
/// `T_conf` is the silence that, had the proxies still routed here, would have been broken by
/// a new connection with probability ≥ 1 − ε at any time before `max`. It is counted from the
/// later of the trigger and the last new connection. It comes from 250 ms slots in which a
/// new connection or a request arrived — in the 30 s before the trigger, and during the drain
/// up to the last new connection (every reused connection is told to close then, so a proxy
/// that still routes here shows up as new connections) — fitted as a busy/empty chain, so that
/// traffic that pauses for seconds is judged by its pauses, with a tail no lighter than a
/// power law, and never shorter than the longest gap seen while routing was unchanged. The
/// report's [`EvidenceReport::rule`](crate::EvidenceReport::rule) names the bound that set it;
/// the Kubernetes guide has the model, what it cannot see, and the simulation that checks ε.
/// Connections are counted by `lameduck::serve`, `lameduck::axum_serve`, or
/// `ConnMeta::accepted` in an accept loop of one's own; requests by the first two. Plain
/// `axum::serve` counts nothing here: its connect-info hook cannot name a coordinator.
///
/// With too little evidence — no connection data (the layer alone sees requests, not
/// connections), less than 5 s of slots, or a `T_conf` beyond `max` — the policy waits to
/// `max`, or to the fallback set with [`quiet_suffices_after`](Self::quiet_suffices_after),
/// and the report says so. `min` is the floor: never before it. The report's
/// [`EvidenceReport`](crate::EvidenceReport) names the evidence that committed.
///
/// With the `kube` feature and an `EndpointWatch` started, the EndpointSlice is the
/// authoritative step: no commit before every slice that lists the Pod shows it not ready,
/// plus the proxy allowance; strong arrival evidence still adds its `T_conf`. Weak evidence no
/// longer waits to `max` when the allowance was measured or set; the unmeasured default is
/// only a floor. A Pod deletion with a shorter grace than `grace_period` shrinks
/// `max` with the other deadlines.
///
/// `max` is clamped to the quiesce deadline when it is left at its default; an explicit `max`
/// beyond it is a [`ConfigError`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lameduck::{Drain, Propagation};
///
/// let drain = Drain::builder()
///     .grace_period(Duration::from_secs(60))
///     .propagation(
///         Propagation::quiet(Duration::from_secs(3))
///             .min(Duration::from_secs(5))
///             .max(Duration::from_secs(40)),
///     )
///     .build()?;
/// # Ok::<(), lameduck::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Propagation {
    kind: Kind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    Quiet {
        quiet: Option<Duration>,
        min: Option<Duration>,
        max: Option<Duration>,
        fallback: Option<Duration>,
        /// ε as `f64` bits, so the type stays `Eq`.
        epsilon_bits: Option<u64>,
    },
    Fixed {
        delay: Duration,
        /// An evidence setting given to a fixed delay, refused by `resolve`.
        misplaced: Option<&'static str>,
    },
}

impl Default for Propagation {
    fn default() -> Self {
        Self {
            kind: Kind::Quiet {
                quiet: None,
                min: None,
                max: None,
                fallback: None,
                epsilon_bits: None,
            },
        }
    }
}

impl Propagation {
    /// The quiet-window policy with the given quiet period; `min` and `max` keep their defaults
    /// until set.
    pub fn quiet(quiet: Duration) -> Self {
        Self {
            kind: Kind::Quiet {
                quiet: Some(quiet),
                min: None,
                max: None,
                fallback: None,
                epsilon_bits: None,
            },
        }
    }

    /// The earliest commit, counted from the trigger. [`Propagation::fixed`] takes none: `build`
    /// refuses it there.
    pub fn min(mut self, d: Duration) -> Self {
        match &mut self.kind {
            Kind::Quiet { min, .. } => *min = Some(d),
            Kind::Fixed { misplaced, .. } => *misplaced = Some("min"),
        }
        self
    }

    /// The latest commit, counted from the trigger. [`Propagation::fixed`] takes none: `build`
    /// refuses it there.
    pub fn max(mut self, d: Duration) -> Self {
        match &mut self.kind {
            Kind::Quiet { max, .. } => *max = Some(d),
            Kind::Fixed { misplaced, .. } => *misplaced = Some("max"),
        }
        self
    }

    /// A **fallback, not a floor**: from `d` after the trigger, silence for `quiet` is
    /// enough, even when the arrival evidence cannot show convergence yet (too little
    /// traffic, or a silence it asks for that is longer). Without it, a drain with too little
    /// evidence waits to `max`. The drain may still commit *before* `d` when the evidence is
    /// strong: the floor — never before — is [`min`](Self::min). With
    /// [`Propagation::fixed`], `build` refuses it (a fixed delay takes no evidence).
    ///
    /// Set it to the slowest proxy's convergence time you have measured (kube-proxy's sync
    /// period plus the EndpointSlice delay, an ingress's refresh interval), not to a hope;
    /// if your proxies are known to need `d`, set `min(d)` as well.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use lameduck::{Drain, Propagation};
    ///
    /// // A quiet service behind proxies known to converge within 4 s: never before 2 s, and
    /// // from 4 s on a quiet second is enough whatever the evidence says.
    /// let drain = Drain::builder()
    ///     .propagation(
    ///         Propagation::default()
    ///             .min(Duration::from_secs(2))
    ///             .quiet_suffices_after(Duration::from_secs(4)),
    ///     )
    ///     .build()?;
    /// # Ok::<(), lameduck::ConfigError>(())
    /// ```
    pub fn quiet_suffices_after(mut self, d: Duration) -> Self {
        match &mut self.kind {
            Kind::Quiet { fallback, .. } => *fallback = Some(d),
            Kind::Fixed { misplaced, .. } => *misplaced = Some("quiet_suffices_after"),
        }
        self
    }

    /// ε: the accepted chance that, had the proxies still routed here, no new connection would
    /// have arrived during the silence the policy takes for proof (default 10⁻³). Smaller is
    /// safer and slower: the silence needed grows with `ln(1/ε)`. Must be in (0, 1); with
    /// [`Propagation::fixed`], `build` refuses it.
    ///
    /// # Examples
    ///
    /// ```
    /// use lameduck::{Drain, Propagation};
    ///
    /// let drain = Drain::builder()
    ///     .propagation(Propagation::default().miss_probability(1e-4))
    ///     .build()?;
    /// # Ok::<(), lameduck::ConfigError>(())
    /// ```
    pub fn miss_probability(mut self, epsilon: f64) -> Self {
        match &mut self.kind {
            Kind::Quiet { epsilon_bits, .. } => *epsilon_bits = Some(epsilon.to_bits()),
            Kind::Fixed { misplaced, .. } => *misplaced = Some("miss_probability"),
        }
        self
    }

    /// Commit exactly `d` after the trigger, whatever the traffic.
    pub fn fixed(d: Duration) -> Self {
        Self {
            kind: Kind::Fixed {
                delay: d,
                misplaced: None,
            },
        }
    }

    pub(crate) fn resolve(&self, budget: &Budget) -> Result<Policy, ConfigError> {
        let window = budget.quiesce_deadline();
        match self.kind {
            Kind::Fixed {
                misplaced: Some(setting),
                ..
            } => Err(ConfigError::propagation(format!(
                "{setting} does not apply to Propagation::fixed, which commits at its one delay \
                 whatever the evidence: remove it, or use the default policy"
            ))),
            Kind::Fixed { delay: d, .. } => {
                if d > window {
                    return Err(ConfigError::propagation(format!(
                        "fixed propagation delay ({}) is past the quiesce deadline ({} after the trigger): \
                         lower the delay or raise grace_period",
                        DurationDisplay(d),
                        DurationDisplay(window)
                    )));
                }
                Ok(Policy::Fixed(d))
            }
            Kind::Quiet {
                quiet,
                min,
                max,
                fallback,
                epsilon_bits,
            } => {
                let max = match max {
                    Some(m) if m > window => {
                        return Err(ConfigError::propagation(format!(
                            "propagation max ({}) is past the quiesce deadline ({} after the trigger \
                             = grace_period − safety_margin − close_budget): lower max or raise grace_period",
                            DurationDisplay(m),
                            DurationDisplay(window)
                        )))
                    }
                    Some(m) => m,
                    None => (budget.grace_period / 2).min(window),
                };
                let min = match min {
                    Some(m) if m > max => {
                        return Err(ConfigError::propagation(format!(
                            "propagation min ({}) is above max ({}): lower min or raise max",
                            DurationDisplay(m),
                            DurationDisplay(max)
                        )))
                    }
                    Some(m) => m,
                    None => DEFAULT_MIN.min(max),
                };
                let quiet = quiet.unwrap_or(DEFAULT_QUIET.min(max));
                if quiet.is_zero() {
                    return Err(ConfigError::propagation(
                        "propagation quiet window is zero: use Propagation::fixed for a fixed delay, \
                         or set quiet to e.g. 2s",
                    ));
                }
                if let Some(f) = fallback {
                    if f > max {
                        return Err(ConfigError::propagation(format!(
                            "quiet_suffices_after ({}) is above max ({}): lower it or raise max",
                            DurationDisplay(f),
                            DurationDisplay(max)
                        )));
                    }
                }
                let epsilon = epsilon_bits.map_or(DEFAULT_EPSILON, f64::from_bits);
                if !(epsilon > 0.0 && epsilon < 1.0) {
                    return Err(ConfigError::propagation(format!(
                        "miss_probability ({epsilon}) is not between 0 and 1 (exclusive): use e.g. 0.001"
                    )));
                }
                Ok(Policy::Quiet {
                    quiet,
                    min,
                    max,
                    fallback,
                    epsilon,
                })
            }
        }
    }
}

/// A validated policy, offsets from the origin.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Policy {
    Quiet {
        quiet: Duration,
        min: Duration,
        max: Duration,
        fallback: Option<Duration>,
        epsilon: f64,
    },
    Fixed(Duration),
}

/// What the policy makes of one check: see [`Policy::check`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Check {
    /// `max` is reached.
    Max,
    /// The window holds: commit on `kind` once nothing is in flight.
    Ready(EvidenceKind),
    /// Not before `until` (re-check then, or when the slices change).
    Wait { until: Instant },
}

/// What one check reads: the clock and what arrived.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seen {
    pub(crate) now: Instant,
    /// The last new connection after the trigger.
    pub(crate) last_connection: Option<Instant>,
    /// The last new connection or request after the trigger.
    pub(crate) last_activity: Option<Instant>,
}

impl Policy {
    pub(crate) fn report(&self) -> PolicyReport {
        let ms = |d: Duration| d.as_millis() as u64;
        match *self {
            Policy::Quiet {
                quiet, min, max, ..
            } => PolicyReport {
                kind: PolicyKind::Quiet,
                quiet_ms: Some(ms(quiet)),
                min_ms: ms(min),
                max_ms: ms(max),
                evidence: None,
            },
            Policy::Fixed(d) => PolicyReport {
                kind: PolicyKind::Fixed,
                quiet_ms: None,
                min_ms: ms(d),
                max_ms: ms(d),
                evidence: None,
            },
        }
    }

    /// The evidence at the trigger `now`: the window of slots before it, fitted.
    pub(crate) fn evidence_at(&self, core: &Core, now: Instant) -> Evidence {
        let (epsilon, max, fallback) = match *self {
            Policy::Quiet {
                epsilon,
                max,
                fallback,
                ..
            } => (epsilon, max, fallback),
            Policy::Fixed(d) => (DEFAULT_EPSILON, d, None),
        };
        let window = Window::at(&core.arrivals, core.base, now, core.serving_since());
        let mut evidence = Evidence::new(window, epsilon, max, fallback);
        evidence.refit(&core.arrivals, None, slot_of(core.base, now));
        evidence
    }

    /// Refits `evidence` with what arrived since the trigger `origin`, as of now.
    pub(crate) fn refit(core: &Core, origin: Instant, evidence: &mut Evidence) {
        let last = core
            .last_new_connection()
            .filter(|&t| t >= origin)
            .map(|t| slot_of(core.base, t));
        evidence.refit(&core.arrivals, last, slot_of(core.base, Instant::now()));
    }

    /// What the policy expects to commit on, while it waits, with the slices' `hold`.
    pub(crate) fn waiting_on(&self, evidence: &Evidence, hold: Hold) -> EvidenceKind {
        match *self {
            Policy::Fixed(_) => EvidenceKind::Fixed,
            Policy::Quiet { .. } if matches!(hold, Hold::Pending | Hold::Until(_)) => {
                EvidenceKind::EndpointSlice
            }
            Policy::Quiet { .. } if evidence.weak().is_none() => EvidenceKind::Confidence,
            Policy::Quiet {
                fallback: Some(_), ..
            } => EvidenceKind::Fallback,
            Policy::Quiet { .. } => EvidenceKind::Max,
        }
    }

    /// One check of the quiet policy: the rule itself, with no clock, no task and no I/O, so
    /// the simulation (`evidence::sim`) drives the same code as the drain. `evidence` is
    /// refitted to what `seen` says arrived; `max_at` is `origin + max` or earlier.
    pub(crate) fn check(
        &self,
        origin: Instant,
        max_at: Instant,
        evidence: &Evidence,
        seen: Seen,
        hold: Hold,
    ) -> Check {
        let Policy::Quiet {
            quiet,
            min,
            fallback,
            ..
        } = *self
        else {
            return Check::Max;
        };
        if seen.now >= max_at {
            return Check::Max;
        }
        // `None`: the arrival data cannot say how long to wait; only the fallback or max can.
        let t_conf = if evidence.weak().is_some() {
            None
        } else {
            evidence.t_conf()
        };
        let last_conn = seen.last_connection.unwrap_or(origin).max(origin);
        // With connection data, only new connections are routing decisions: requests on
        // open connections (a pool, an HTTP/2 connection accepted during the drain, which
        // gets its GOAWAY at the commit) say nothing about the proxies and must not hold
        // the window open. Without it, requests are the only signal there is.
        let last = if evidence.estimate.is_some() {
            last_conn
        } else {
            seen.last_activity.unwrap_or(origin).max(origin)
        };
        let conf_at = t_conf.map_or(max_at, |t| last_conn + t);
        let (conf_at, kind) = match hold {
            // The slices are the authoritative step: no commit before they stop routing
            // here plus the proxies' allowance; strong arrival evidence still adds its
            // silence, weak evidence no longer waits to `max`.
            Hold::Until(allowed) => (
                t_conf.map_or(allowed, |t| allowed.max(last_conn + t)),
                EvidenceKind::EndpointSlice,
            ),
            Hold::Pending => (max_at, EvidenceKind::EndpointSlice),
            // An unmeasured allowance is a floor, not proof: what the arrival evidence alone
            // would commit on, and not before the slices plus the allowance.
            Hold::None | Hold::Floor(_) => {
                let alone = match fallback {
                    Some(f) if origin + f < conf_at => (origin + f, EvidenceKind::Fallback),
                    _ => (conf_at, EvidenceKind::Confidence),
                };
                match hold {
                    Hold::Floor(at) if at > alone.0 => (at, EvidenceKind::EndpointSlice),
                    _ => alone,
                }
            }
        };
        let ready_at = (last + quiet).max(origin + min).max(conf_at);
        if hold != Hold::Pending && seen.now >= ready_at {
            Check::Ready(kind)
        } else {
            Check::Wait {
                until: ready_at.min(max_at),
            }
        }
    }

    /// Waits until the policy commits, and says on what evidence. Event-driven: it sleeps
    /// until the earliest instant the policy could hold, or until in-flight work reaches zero,
    /// or until the `link` changes, then refits the evidence with what arrived and re-checks.
    ///
    /// `max_at` is `origin + max`, unless a deletion with a shorter grace left less (the
    /// driver's deadlines); the link's [`Hold`] is the EndpointSlice's say (feature `kube`).
    pub(crate) async fn commit(
        &self,
        core: &Core,
        origin: Instant,
        evidence: &mut Evidence,
        link: &Link,
        max_at: impl Fn() -> Instant,
    ) -> (CommitReason, EvidenceKind) {
        let mut changes = link.subscribe();
        if let Policy::Fixed(_) = self {
            // The delay, unless this deletion's grace leaves less.
            link.sleep_until(max_at).await;
            return (CommitReason::Fixed, EvidenceKind::Fixed);
        }
        loop {
            Self::refit(core, origin, evidence);
            let max_at = max_at();
            let seen = Seen {
                now: Instant::now(),
                last_connection: core.last_new_connection(),
                last_activity: core.last_activity(),
            };
            match self.check(origin, max_at, evidence, seen, link.hold()) {
                Check::Max => return (CommitReason::Max, EvidenceKind::Max),
                Check::Ready(kind) => {
                    if core.counter.is_drained() {
                        return (CommitReason::Quiet, kind);
                    }
                    // Quiet, but something is in flight: wait for zero (or max), then re-check
                    // the window.
                    tokio::select! {
                        () = core.wait_zero() => {}
                        () = tokio::time::sleep_until(max_at) => {}
                        _ = changes.changed() => {}
                    }
                }
                Check::Wait { until } => {
                    tokio::select! {
                        () = tokio::time::sleep_until(until) => {}
                        // The slices changed, or the deletion shortened `max`: re-check.
                        _ = changes.changed() => {}
                    }
                }
            }
        }
    }
}

/// Silence so far: since the later of the trigger and the last new connection.
pub(crate) fn silence(core: &Core, origin: Instant) -> Duration {
    let last = core.last_new_connection().unwrap_or(origin).max(origin);
    Instant::now().saturating_duration_since(last)
}
