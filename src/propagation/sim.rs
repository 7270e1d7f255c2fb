//! One drain in virtual time over an arrival trace, for the simulation that checks ε
//! (`tests/evidence_sim.rs`, `examples/evidence_sim.rs`). Not a public API: it exists so the
//! simulation drives the estimator and the policy check the drain itself runs — the same
//! rows, the same window, the same fits, the same `Policy::check` — and not a copy of their
//! formulas. Nothing sleeps: the loop jumps from one check to the instant the check asks for,
//! as the drain's task would wake.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use tokio::time::Instant;

use super::{Check, Limits, Policy, Propagation, Seen};
use crate::hot::observed::{second_tag, PathId};
use crate::propagation::confirm::NodesSay;
use crate::propagation::evidence::{slot_of, Arrivals, Evidence, Window};
use crate::propagation::link::Hold;
use crate::report::{EvidenceKind, EvidenceReport};
use crate::vocab::budget::Budget;
use crate::vocab::error::ConfigError;

/// What one simulated drain committed on.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct DrainOutcome {
    /// When the policy committed, after the trigger.
    pub commit: Duration,
    /// The evidence as the report would show it at the commit.
    pub evidence: EvidenceReport,
}

impl DrainOutcome {
    /// What the commit went on.
    pub fn kind(&self) -> EvidenceKind {
        self.evidence.kind
    }
}

/// What happened on a path at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum What {
    /// A new connection that carries one request and closes (a fresh-connection client).
    Fresh,
    /// A new connection kept open (a pool's), with its first request.
    Open,
    /// A request on a kept connection (after the trigger: its first, which is told to
    /// close).
    Request,
    /// A kept connection closed.
    Close,
    /// A connection open at the trigger closed by its client before being told to close (a
    /// fresh connection whose request was in flight at the trigger): it leaves by itself.
    Left,
}

/// One arrival of a trace: when, on which path (a peer address of its own per path), what.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Arrival {
    /// From the start of serving.
    pub at: Duration,
    /// The path: peers 198.18.0.1, 198.18.0.2, … for 0, 1, ….
    pub path: u16,
    /// What arrived.
    pub what: What,
}

impl Arrival {
    /// An arrival of `what` on `path` at `at`.
    pub fn new(at: Duration, path: u16, what: What) -> Self {
        Self { at, path, what }
    }
}

/// Runs the propagation policy of a drain triggered at `trigger` over `arrivals` (sorted by
/// time, from the start of serving), with the budget of `grace` and nothing in flight. The
/// caller ends each path's arrivals where its proxy stopped routing here.
pub fn drain(
    arrivals: &[Arrival],
    trigger: Duration,
    propagation: &Propagation,
    grace: Duration,
) -> Result<DrainOutcome, ConfigError> {
    let budget = Budget::resolve(Some(grace), None, None, None)?;
    let policy = propagation.resolve(&budget, Default::default())?;
    let Policy::Quiet {
        max,
        epsilon,
        fallback,
        per_request,
        ..
    } = policy.clone()
    else {
        return Err(ConfigError::propagation(
            "the simulation runs the quiet policy; a fixed delay needs none",
        ));
    };
    let mut feed = Feed::new(arrivals, trigger);
    let (base, origin) = (feed.base, feed.origin);
    feed.up_to(origin);
    // As the drain's start does: the rows keep their owners from the trigger on.
    feed.rows.freeze();
    let window = Window::at(&feed.rows, base, origin, Some(base));
    let mut evidence = Evidence::new(window, epsilon, max, fallback).per_request(per_request);
    let max_at = origin + max;
    let limits = Limits::new(max_at, origin + budget.quiesce_deadline());
    let mut now = origin;
    loop {
        feed.up_to(now);
        evidence.refit(&feed.rows, origin, slot_of(base, now));
        let seen = Seen {
            now,
            last_connection: feed.last_connection,
            last_activity: feed.last_connection,
        };
        let kind = match policy.check(
            origin,
            limits,
            &evidence,
            seen,
            (Hold::None, NodesSay::Nothing),
        ) {
            Check::Max => {
                now = now.max(max_at);
                EvidenceKind::Max
            }
            // The simulation has no node agents: nothing confirms.
            Check::Ready(kind) => kind,
            Check::ConfirmedPastMax => EvidenceKind::Confirmed,
            Check::Wait { until } => {
                now = until;
                continue;
            }
        };
        let last = feed.last_connection.unwrap_or(origin).max(origin);
        return Ok(DrainOutcome {
            commit: now - origin,
            evidence: evidence.report(kind, now.saturating_duration_since(last)),
        });
    }
}

/// The peer address of a trace's path: 198.18.0.1, 198.18.0.2, … for 0, 1, ….
fn peer(path: u16) -> IpAddr {
    let first = u32::from(Ipv4Addr::new(198, 18, 0, 0));
    IpAddr::V4(Ipv4Addr::from(first + u32::from(path) + 1))
}

/// The rows a drain reads, fed from a trace in time order as the accept loop and the
/// connections would have.
struct Feed<'a> {
    arrivals: &'a [Arrival],
    /// The next arrival to feed.
    next: usize,
    rows: Arrivals,
    /// Per path of the trace, the row its latest connection was counted on (its requests and
    /// closes are counted there: a row keeps its owner while a connection is open on it).
    paths: Vec<PathId>,
    base: Instant,
    origin: Instant,
    /// The last new connection after the trigger.
    last_connection: Option<Instant>,
}

impl<'a> Feed<'a> {
    fn new(arrivals: &'a [Arrival], trigger: Duration) -> Self {
        let base = Instant::from_std(std::time::Instant::now());
        let rows = Arrivals::new();
        rows.observe_from(1);
        let paths = vec![
            PathId::OTHER;
            usize::from(arrivals.iter().map(|a| a.path).max().unwrap_or(0)) + 1
        ];
        Self {
            arrivals,
            next: 0,
            rows,
            paths,
            base,
            origin: base + trigger,
            last_connection: None,
        }
    }

    /// Feeds the arrivals up to `now`.
    fn up_to(&mut self, now: Instant) {
        let (base, origin) = (self.base, self.origin);
        let stamp = |t: Instant| t.saturating_duration_since(base).as_nanos() as u64 + 1;
        while let Some(a) = self.arrivals.get(self.next) {
            let at = base + a.at;
            if at > now {
                break;
            }
            let slot = slot_of(base, at);
            if at >= origin {
                self.rows.freeze();
            }
            let rows = &self.rows;
            let path = match a.what {
                What::Fresh | What::Open => {
                    let path = rows.open(Some(peer(a.path)), slot);
                    self.paths[usize::from(a.path)] = path;
                    path
                }
                _ => self.paths[usize::from(a.path)],
            };
            match a.what {
                What::Fresh | What::Open => {
                    if at >= origin {
                        rows.after_drain(path, stamp(at));
                        self.last_connection = Some(at);
                    }
                    if a.what == What::Fresh {
                        if at < origin {
                            // Closed at once, while Serving.
                            rows.closed_fresh(path, slot);
                        }
                        rows.closed(path);
                    }
                }
                What::Request => {
                    rows.note_request(path, slot);
                    rows.count_requests(path, second_tag(slot), 1);
                    if at >= origin {
                        // A kept connection's first request after the trigger: told to close,
                        // and kept alive (a pool's).
                        rows.told(path, at - origin);
                        rows.kept(path);
                    }
                }
                What::Close => rows.closed(path),
                What::Left => {
                    rows.closed(path);
                    rows.left(path);
                }
            }
            self.next += 1;
        }
    }
}
