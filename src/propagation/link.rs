//! What the Kubernetes API says, as the coordinator reads it: a small state the watch
//! (`src/kube/`, feature `kube`) writes and the driver reads — the slices' hold on
//! propagation, the deletion's kill time, the events seen before the trigger.
//!
//! Compiled in every build, so the report says which evidence was used and, without the
//! feature, why the API was not. It depends on nothing of the coordinator's: the driver reads
//! it, the watch writes it through the [`Drain`](crate::Drain) handle.
//!
//! Invariants:
//! - The deletion budget only tightens: a later deletion with a longer grace changes nothing
//!   (the API server keeps the earliest `deletionTimestamp` too).
//! - `unrouted_since` is set when every slice that lists this Pod first shows it not routable,
//!   and cleared when one shows it routable again (a flap before the trigger).
//! - One std mutex, never held across an await or while calling out; every write bumps the
//!   generation so a waiting driver re-reads.

#[cfg(feature = "kube")]
mod kube;
mod startup;

use std::sync::Mutex;
use std::time::Duration;

use startup::Startup;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::report::{AllowanceSource, EndpointSliceEvidence};
use crate::vocab::sync::MutexExt;

/// Where the slice evidence stands.
#[derive(Clone, Debug, PartialEq, Eq)]
// Without `kube` only the first two are made; the readers match every variant in every build.
#[cfg_attr(not(feature = "kube"), allow(dead_code))]
pub(crate) enum Source {
    /// Built without the `kube` feature.
    NotBuilt,
    /// Built with it, but no `EndpointWatch` was started.
    NotStarted,
    /// Started; the first list has not answered yet.
    Connecting,
    /// Listed and watching.
    Watching,
    /// The API refused or could not be reached: why.
    Unavailable(String),
}

/// What the slices allow the propagation policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
// Without `kube` only `None` is made (nothing watches the slices); the propagation policy
// matches every variant in every build so that it is written once, not once per feature.
#[cfg_attr(not(feature = "kube"), allow(dead_code))]
pub(crate) enum Hold {
    /// No slice evidence: the policy goes on what it has today.
    None,
    /// Slice evidence is coming or the slices still route here: no commit yet.
    Pending,
    /// The slices stopped routing here; proxies are allowed until then, by an allowance the
    /// operator configured: proof enough to commit on.
    Until(Instant),
    /// The slices stopped routing here; proxies are allowed until then, by the allowance
    /// measured at startup: one sample of each proxy's delay, which varies from one sync to
    /// the next. Proof (as [`Until`](Self::Until)) while every path's arrivals can judge its
    /// own silence; a floor (as [`Floor`](Self::Floor)) while some path's cannot: see
    /// [`Hold::judged`].
    Measured(Instant),
    /// The slices stopped routing here, but the allowance is the unmeasured default: no commit
    /// before this instant, and not before the arrival evidence alone would commit either.
    Floor(Instant),
}

impl Hold {
    /// The hold as the policy uses it, given whether the arrival evidence can judge every
    /// path's silence (`judged`): a measured allowance is proof only then.
    ///
    /// A measured allowance is one sample per proxy, taken when this Pod was added; the
    /// proxy's delay when it is removed is another sample (on the testbed, a loaded node's
    /// kube-proxy took 13.7 s to stop routing here after 12.2 s had been measured). A path
    /// whose arrivals are dense enough shows by its own silence whether its proxy converged;
    /// a sparse one cannot, so the drain waits for what the arrival evidence alone commits on
    /// (`max`, or the fallback), not before the slices plus the allowance.
    pub(crate) fn judged(self, judged: bool) -> Hold {
        match self {
            Hold::Measured(at) if !judged => Hold::Floor(at),
            Hold::Measured(at) => Hold::Until(at),
            h => h,
        }
    }
}

/// The routing state of this Pod's endpoint across the slices that list it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Routing {
    /// `name (service)` of each slice that lists this Pod and can stop routing to it.
    pub(crate) slices: Vec<String>,
    /// When every one of them first showed the endpoint not routable.
    pub(crate) unrouted_since: Option<Instant>,
    /// Services that select this Pod with `publishNotReadyAddresses: true`.
    pub(crate) publish_not_ready: Vec<String>,
    /// The condition waited for (`ready=false`, or `ready=false or terminating=true`).
    pub(crate) condition: &'static str,
}

/// The real end of this deletion, from the Pod's `deletionTimestamp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Kill {
    /// When kubelet may send SIGKILL.
    pub(crate) at: Instant,
    /// The grace the source gave (for a deletion, `deletionGracePeriodSeconds`).
    pub(crate) grace: Duration,
    /// What gave it.
    pub(crate) source: crate::report::BudgetSource,
}

/// An event seen before the trigger, added to the timeline when the drain starts.
#[derive(Clone, Debug)]
pub(crate) struct Early {
    pub(crate) kind: crate::vocab::phase::EventKind,
    pub(crate) at: Instant,
    pub(crate) unix_ms: u64,
    pub(crate) name: Option<String>,
    pub(crate) detail: String,
}

struct LinkState {
    source: Source,
    /// The configured allowance, or the default when not `configured`.
    allowance: Duration,
    configured: bool,
    routing: Routing,
    kill: Option<Kill>,
    early: Vec<Early>,
}

pub(crate) struct Link {
    state: Mutex<LinkState>,
    generation: watch::Sender<u64>,
    /// Lock order: `state`, then `startup`'s own lock, never the other way.
    startup: Startup,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("source", &self.lock().source)
            .finish_non_exhaustive()
    }
}

impl Link {
    pub(crate) fn new() -> Self {
        let source = if cfg!(feature = "kube") {
            Source::NotStarted
        } else {
            Source::NotBuilt
        };
        Self {
            state: Mutex::new(LinkState {
                source,
                allowance: Duration::ZERO,
                configured: false,
                routing: Routing::default(),
                kill: None,
                early: Vec::new(),
            }),
            generation: watch::channel(0).0,
            startup: Startup::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LinkState> {
        self.state.locked()
    }

    /// Changes whenever the link does: the driver waits on it next to its deadlines.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Sleeps until the instant `at` gives, re-reading it whenever the link changes (a
    /// deletion with a shorter grace moves the deadlines earlier).
    pub(crate) async fn sleep_until(&self, at: impl Fn() -> Instant) {
        let mut changes = self.subscribe();
        loop {
            let t = at();
            tokio::select! {
                () = tokio::time::sleep_until(t) => return,
                changed = changes.changed() => {
                    if changed.is_err() {
                        // The link lives as long as the coordinator: no more changes.
                        tokio::time::sleep_until(t).await;
                        return;
                    }
                }
            }
        }
    }

    /// The allowance in force and where it came from.
    fn allowance(&self, st: &LinkState) -> (Duration, AllowanceSource) {
        if st.configured {
            return (st.allowance, AllowanceSource::Configured);
        }
        match self.startup.measured() {
            Some(m) => (m, AllowanceSource::Measured),
            None => (st.allowance, AllowanceSource::Default),
        }
    }

    pub(crate) fn kill(&self) -> Option<Kill> {
        self.lock().kill
    }

    pub(crate) fn take_early(&self) -> Vec<Early> {
        std::mem::take(&mut self.lock().early)
    }

    /// What the slices allow the propagation policy now.
    pub(crate) fn hold(&self) -> Hold {
        let st = self.lock();
        match st.source {
            Source::NotBuilt | Source::NotStarted => Hold::None,
            Source::Unavailable(_) => Hold::None,
            Source::Connecting => Hold::Pending,
            Source::Watching if st.routing.slices.is_empty() => Hold::None,
            Source::Watching => match st.routing.unrouted_since {
                Some(at) => match self.allowance(&st) {
                    (a, AllowanceSource::Default) => Hold::Floor(at + a),
                    (a, AllowanceSource::Measured) => Hold::Measured(at + a),
                    (a, AllowanceSource::Configured) => Hold::Until(at + a),
                },
                None => Hold::Pending,
            },
        }
    }

    /// Why the slices were not the evidence, when they were not.
    pub(crate) fn unused_reason(&self) -> Option<String> {
        let st = self.lock();
        match &st.source {
            Source::NotBuilt => Some("the kube feature is not built".to_owned()),
            Source::NotStarted => Some("no EndpointWatch was started".to_owned()),
            Source::Connecting => Some("the Kubernetes API had not answered yet".to_owned()),
            Source::Unavailable(why) => Some(why.clone()),
            Source::Watching if st.routing.slices.is_empty() => {
                Some(if st.routing.publish_not_ready.is_empty() {
                    "no EndpointSlice lists this Pod's addresses".to_owned()
                } else {
                    "every Service listing this Pod publishes not-ready addresses".to_owned()
                })
            }
            Source::Watching => None,
        }
    }

    /// The slice evidence for the report, relative to the drain's origin; `weak`: why the
    /// arrival evidence could not judge some path's silence (its name), if it could not.
    pub(crate) fn evidence(&self, origin: Instant, weak: Option<&str>) -> EndpointSliceEvidence {
        let st = self.lock();
        let r = &st.routing;
        let (allowance, allowance_source) = self.allowance(&st);
        let allowance_proof = match allowance_source {
            AllowanceSource::Configured => true,
            AllowanceSource::Measured => weak.is_none(),
            AllowanceSource::Default => false,
        };
        let allowance_note = match allowance_source {
            AllowanceSource::Measured => {
                let peers = self.startup.report().peers;
                let slowest = peers.iter().max_by_key(|p| p.delay_ms);
                format!(
                    "measured: the largest delay from the slices listing this Pod ready to a \
                     peer's first new connection, at startup: {} ({} ms), the slowest of {} \
                     peer{}; a proxy none of whose clients connected then is not measured; {}",
                    slowest.map_or("-", |p| p.peer.as_str()),
                    slowest.map_or(0, |p| p.delay_ms),
                    peers.len(),
                    if peers.len() == 1 { "" } else { "s" },
                    match weak {
                        None => "proof, as every path's arrivals judged its own silence".to_owned(),
                        Some(w) => format!(
                            "a floor only, as some path's arrivals could not judge its silence \
                             ({}): one sample of a proxy's delay does not bound the next",
                            w
                        ),
                    }
                )
            }
            AllowanceSource::Configured => "configured: EndpointWatch::proxy_allowance".to_owned(),
            AllowanceSource::Default => format!(
                "default: DEFAULT_PROXY_ALLOWANCE ({} ms: kube-proxy's minSyncPeriod of 1 s \
                 plus its rule write), not measured; a floor only: the commit also waits for \
                 what the arrival evidence alone would commit on",
                st.allowance.as_millis()
            ),
        };
        EndpointSliceEvidence {
            condition: r.condition.to_owned(),
            slices: r.slices.clone(),
            changed_at_ms: r.unrouted_since.map(|at| signed_ms(at, origin)),
            allowance_ms: allowance.as_millis() as u64,
            allowance_source,
            allowance_proof,
            allowance_note,
            startup: self.startup.report(),
            allowed_at_ms: r.unrouted_since.map(|at| {
                (at + allowance)
                    .saturating_duration_since(origin)
                    .as_millis() as u64
            }),
            publish_not_ready_addresses: r.publish_not_ready.clone(),
        }
    }

    /// Listed and watching: the slice evidence is worth reporting, used or not.
    pub(crate) fn is_watching(&self) -> bool {
        self.lock().source == Source::Watching
    }
}

/// `at - origin` in whole milliseconds, rounded down also when `at` is before `origin`: the
/// same monotonic clock and rounding as every `at_ms` of the timeline, so a commit at least the
/// allowance after the change never reads a millisecond short of it.
fn signed_ms(at: Instant, origin: Instant) -> i64 {
    match at.checked_duration_since(origin) {
        Some(d) => d.as_millis() as i64,
        None => {
            let before = origin.duration_since(at);
            -(before.as_nanos().div_ceil(1_000_000) as i64)
        }
    }
}
