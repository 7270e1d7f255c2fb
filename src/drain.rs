//! The coordinator: [`Drain`], its builder, startup gates, and the drain's driver.
//!
//! # Invariants
//!
//! * `Drain` is a thin handle over `Arc<Inner>`; the hot-path counter lives in a leaked
//!   [`Core`] so that request guards need no reference count (see `guard.rs`).
//! * The first trigger wins: it fixes the budget's origin under the `state` lock, sets the
//!   counter's draining flag, and spawns the one driver task. Later triggers only raise the
//!   count of one `signal_received` event per trigger kind, so the timeline stays bounded
//!   whatever the number of triggers; once the Done event is in, the timeline is final.
//! * The final report is written by exactly one of the driver and the watchdog thread: each
//!   claims the `emission` flag with a compare-exchange before writing.
//! * The `state` mutex is never held across an `.await` and never taken on the request path,
//!   so it cannot deadlock with the driver or stall a request.
//! * Phases only move forward; each transition is published on a `watch` channel.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::budget::{Budget, GRACE_PERIOD_ENV};
use crate::closers::{BoxError, CloseOptions, Closer, CloserResult};
use crate::evidence::{Estimate, Evidence, EvidenceKind, EvidenceReport};
use crate::guard::{Core, InFlightGuard};
use crate::kube::link::{Deadlines, Hold};
use crate::phase::{CommitReason, Event, EventKind, Phase, Trigger};
use crate::propagation::{Policy, Propagation};
use crate::report::{
    AfterFlipReport, BudgetReport, DrainReport, Emitted, Outcome, PeerCount, PodInfo,
    SignalReceipt, Sinks, StopSignalWait, Straggler,
};
use crate::signal::{Receipt, Signals, STOP_SIGNAL_ENV};
use crate::tasks::{Recovery, TaskKind, Tasks};
use crate::ConfigError;

/// The environment variable naming the path in front of the process, for the report's
/// `proxy_label` (see [`DrainBuilder::proxy_label`]).
pub const PROXY_LABEL_ENV: &str = "LAMEDUCK_PROXY_LABEL";

/// What `/readyz` says while draining: a policy, because neither answer is right everywhere.
///
/// When a Pod is deleted, the EndpointSlice controller marks its endpoint `ready=false`,
/// `terminating=true` whatever the probe says; `serving` follows the Pod's Ready condition,
/// i.e. this probe. Proxies ignore terminating endpoints, except that when *every* endpoint of
/// a Service is terminating, kube-proxy falls back to those still `serving` (a single replica
/// evicted while its replacement is not ready yet, a scale to zero).
///
/// The trade-off: kubelet's probe decides `serving`, which only matters for that fallback, and
/// `ready` turns false at deletion anyway — so kubelet should see "ready" until the process
/// stops accepting. A load balancer that probes the Pod directly (a cloud LB, HAProxy) has no
/// EndpointSlice to tell it: it must see "not ready" from the trigger, or it keeps sending new
/// work for its whole probe interval. [`Auto`](Self::Auto), the default, answers each by who
/// asks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ReadinessWhileDraining {
    /// By caller (the default): a probe whose `User-Agent` starts with `kube-probe/` —
    /// kubelet's HTTP and gRPC probes — gets [`ServingUntilStop`](Self::ServingUntilStop),
    /// which keeps kube-proxy's all-terminating fallback; every other caller gets
    /// [`NotReady`](Self::NotReady). An external checker that sends kubelet's User-Agent is
    /// taken for kubelet. [`Drain::readiness`] and `/status` answer as for other callers.
    #[default]
    Auto,
    /// 503 from the trigger on, for every caller (the convention of kube-apiserver). Load
    /// balancers that probe the Pod directly stop sending soonest; kube-proxy's all-terminating
    /// fallback loses this endpoint.
    NotReady,
    /// 200 until `stopped_accepting`, then 503. Keeps kube-proxy's all-terminating fallback
    /// (scale to zero, one replica, `externalTrafficPolicy: Local` on a draining node), at the
    /// cost of load balancers that probe the Pod directly sending new work for longer.
    ServingUntilStop,
}

impl ReadinessWhileDraining {
    /// The policy's name as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            ReadinessWhileDraining::Auto => "auto",
            ReadinessWhileDraining::NotReady => "not_ready",
            ReadinessWhileDraining::ServingUntilStop => "serving_until_stop",
        }
    }

    /// The one rule, for `/readyz` and gRPC health alike: whether the caller sees "ready"
    /// while Draining (before `stopped_accepting`; after it, no caller does).
    pub(crate) fn ready_while_draining(self, caller: Caller) -> bool {
        match self {
            ReadinessWhileDraining::NotReady => false,
            ReadinessWhileDraining::ServingUntilStop => true,
            ReadinessWhileDraining::Auto => caller == Caller::Kubelet,
        }
    }
}

impl std::str::FromStr for ReadinessWhileDraining {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.replace('-', "_").as_str() {
            "auto" => Ok(Self::Auto),
            "not_ready" => Ok(Self::NotReady),
            "serving_until_stop" => Ok(Self::ServingUntilStop),
            _ => Err(ConfigError::parse(format!(
                "`{s}` is not a readiness policy: expected auto, not-ready or serving-until-stop"
            ))),
        }
    }
}

/// Who asks for readiness: kubelet's probe or anyone else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Caller {
    /// `User-Agent: kube-probe/…` (kubelet's HTTP and gRPC probes).
    Kubelet,
    /// A load balancer, a monitor, a person — or no User-Agent at all.
    Other,
}

impl Caller {
    #[cfg_attr(not(any(feature = "admin", feature = "grpc")), allow(dead_code))] // used by the admin router and gRPC health
    pub(crate) fn from_user_agent(ua: Option<&[u8]>) -> Self {
        match ua {
            Some(ua) if ua.starts_with(b"kube-probe/") => Caller::Kubelet,
            _ => Caller::Other,
        }
    }

    pub(crate) fn describe(self) -> &'static str {
        match self {
            Caller::Kubelet => "kubelet's probe (User-Agent kube-probe/)",
            Caller::Other => "not kubelet's probe",
        }
    }
}

/// Builds a [`Drain`]. Every setting has a default; [`build`](Self::build) validates them.
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lameduck::{Drain, Propagation, ReadinessWhileDraining};
///
/// let drain = Drain::builder()
///     .grace_period(Duration::from_secs(60)) // = terminationGracePeriodSeconds
///     .close_budget(Duration::from_secs(10))
///     .propagation(Propagation::quiet(Duration::from_secs(3)).max(Duration::from_secs(30)))
///     .readiness_while_draining(ReadinessWhileDraining::NotReady)
///     .build()?;
/// assert_eq!(drain.budget().quiesce_deadline(), Duration::from_secs(49)); // 60 − 1 − 10
/// # Ok::<(), lameduck::ConfigError>(())
/// ```
#[derive(Clone, Debug, Default)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct DrainBuilder {
    grace_period: Option<Duration>,
    safety_margin: Option<Duration>,
    close_budget: Option<Duration>,
    propagation: Propagation,
    signals: Option<Signals>,
    readiness: ReadinessWhileDraining,
    sinks: Sinks,
    hurry_lead: Option<Duration>,
    drain_on_task_panic: bool,
    proxy_label: Option<String>,
}

impl DrainBuilder {
    /// The Pod's `terminationGracePeriodSeconds`. Default: env `LAMEDUCK_GRACE_PERIOD`
    /// (`30s`, `1500ms`, `2m`, or a bare number of seconds), else 30 s.
    pub fn grace_period(mut self, d: Duration) -> Self {
        self.grace_period = Some(d);
        self
    }

    /// Kept free before SIGKILL. Default 1 s (scaled down for grace periods under 30 s).
    pub fn safety_margin(mut self, d: Duration) -> Self {
        self.safety_margin = Some(d);
        self
    }

    /// Reserved for resource closers. Default 5 s (scaled down for grace periods under 30 s).
    pub fn close_budget(mut self, d: Duration) -> Self {
        self.close_budget = Some(d);
        self
    }

    /// When to stop accepting. Default: [`Propagation::default`] (quiet window 1 s, min 1 s,
    /// confidence from the arrival rate with ε = 10⁻³, max half the grace period).
    pub fn propagation(mut self, p: Propagation) -> Self {
        self.propagation = p;
        self
    }

    /// Which OS signals [`Drain::run`] listens to. Default [`Signals::default`], with the
    /// stop signal from env `LAMEDUCK_STOP_SIGNAL` (else SIGTERM).
    pub fn signals(mut self, s: Signals) -> Self {
        self.signals = Some(s);
        self
    }

    /// What `/readyz` says while draining. Default [`ReadinessWhileDraining::Auto`].
    pub fn readiness_while_draining(mut self, r: ReadinessWhileDraining) -> Self {
        self.readiness = r;
        self
    }

    /// Also write the final report (one JSON line) to this file.
    ///
    /// The file is replaced atomically (a temporary file in the same directory, synced, then
    /// renamed), so a crash leaves the previous report or the new one, never a truncated file;
    /// a device or FIFO (`/dev/stdout`) is written in place. If it cannot be written, the
    /// error is said on stderr, recorded in the report's `sink_errors`, and the exit code is 1.
    pub fn report_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.sinks.file = Some(path.into());
        self
    }

    /// Write the report's JSON line to stderr (default `true`).
    pub fn report_to_stderr(mut self, yes: bool) -> Self {
        self.sinks.stderr = yes;
        self
    }

    /// Where the short summary goes; default `/dev/termination-log`, written only when that
    /// file exists and is writable. `None` turns it off.
    pub fn termination_log(mut self, path: Option<PathBuf>) -> Self {
        self.sinks.termination_log = path;
        self
    }

    /// How long before the quiesce deadline cancellable tasks get their *hurry* signal
    /// ([`TaskContext::hurry`]). Default: a fifth of the window between the trigger and the
    /// quiesce deadline, at most 5 s.
    pub fn hurry_lead(mut self, d: Duration) -> Self {
        self.hurry_lead = Some(d);
        self
    }

    /// Start the drain (trigger `task_panic`) when a background task started with
    /// [`Drain::spawn`] and friends panics: a process whose must-finish work died is better
    /// replaced than left serving half-broken. Default `false`: the panic is recorded in the
    /// report (`tasks`) and the process goes on.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// use lameduck::{Drain, Signals, Trigger};
    ///
    /// let drain = Drain::builder()
    ///     .drain_on_task_panic(true)
    ///     # .signals(Signals::none()).report_to_stderr(false).termination_log(None)
    ///     .build()
    ///     .unwrap();
    /// drain.spawn("exporter", async { panic!("lost the connection") });
    /// let report = drain.drained().await;
    /// assert_eq!(report.trigger, Some(Trigger::TaskPanic));
    /// assert_eq!(report.tasks[0].result, "panicked");
    /// # }
    /// ```
    pub fn drain_on_task_panic(mut self, yes: bool) -> Self {
        self.drain_on_task_panic = yes;
        self
    }

    /// Names what stands between the clients and this process — `kube-proxy iptables 1.31`,
    /// `ingress-nginx 1.11`, `AWS ALB (ip targets)` — for the report (`proxy_label`): its
    /// numbers are evidence about that path only. Default: env `LAMEDUCK_PROXY_LABEL`, else
    /// none.
    pub fn proxy_label(mut self, label: impl Into<String>) -> Self {
        self.proxy_label = Some(label.into());
        self
    }

    /// Validates the settings and builds the coordinator.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the setting to change: a zero grace period, a close budget plus
    /// safety margin that leave nothing of the grace period, a propagation `min` above `max`
    /// or a `max` past the quiesce deadline, an unparsable `LAMEDUCK_GRACE_PERIOD`, a grace
    /// period under 1 s or above 24 h, an unknown `LAMEDUCK_STOP_SIGNAL`.
    pub fn build(self) -> Result<Drain, ConfigError> {
        let env = std::env::var(GRACE_PERIOD_ENV).ok();
        let budget = Budget::resolve(
            self.grace_period,
            self.safety_margin,
            self.close_budget,
            env.as_deref(),
        )?;
        // Every deadline is `origin + offset ≤ origin + grace`: refuse a grace period the
        // clock cannot represent now rather than overflow at the trigger.
        if Instant::now().checked_add(budget.grace_period).is_none() {
            return Err(ConfigError::budget(format!(
                "grace_period ({}) overflows this platform's clock: lower it",
                crate::budget::DurationDisplay(budget.grace_period)
            )));
        }
        let stop_env = std::env::var(STOP_SIGNAL_ENV).ok();
        let signals = self
            .signals
            .unwrap_or_default()
            .resolve(stop_env.as_deref())?;
        let policy = self.propagation.resolve(&budget)?;
        let window = budget.quiesce_deadline();
        let hurry_lead = match self.hurry_lead {
            Some(d) if d > window => {
                return Err(ConfigError::budget(format!(
                    "hurry_lead ({}) is longer than the window before the quiesce deadline ({}): lower hurry_lead",
                    crate::budget::DurationDisplay(d),
                    crate::budget::DurationDisplay(window)
                )))
            }
            Some(d) => d,
            None => (window / 5).min(Duration::from_secs(5)),
        };
        let (phase, _) = watch::channel(Phase::Starting);
        let core = Core::leak();
        crate::evidence::set_connect_info_target(core);
        let drain = Drain {
            inner: Arc::new(Inner {
                core,
                budget,
                policy,
                signals,
                readiness: self.readiness,
                sinks: self.sinks,
                hurry_lead,
                phase,
                state: Mutex::new(State::default()),
                drain_token: CancellationToken::new(),
                stop_token: CancellationToken::new(),
                hurry_token: CancellationToken::new(),
                deadline_token: CancellationToken::new(),
                force_token: CancellationToken::new(),
                forced: AtomicBool::new(false),
                emission: AtomicU8::new(EMIT_NONE),
                terminate_seen: Notify::new(),
                tasks: Tasks::default(),
                exit: crate::exit::ExitHolds::default(),
                proxy_label: self.proxy_label.or_else(|| {
                    std::env::var(PROXY_LABEL_ENV)
                        .ok()
                        .map(|v| v.trim().to_owned())
                        .filter(|v| !v.is_empty())
                }),
                link: crate::kube::link::Link::new(),
            }),
        };
        if self.drain_on_task_panic {
            // Weak: the hook lives in the coordinator it would otherwise keep alive.
            let weak = Arc::downgrade(&drain.inner);
            drain.inner.tasks.set_on_panic(Arc::new(move |name: &str| {
                if let Some(inner) = weak.upgrade() {
                    tracing::warn!(task = %name, "lameduck: a task panicked; starting the drain");
                    Drain { inner }.start(Trigger::TaskPanic);
                }
            }));
        }
        #[cfg(feature = "metrics")]
        crate::metrics::init(&drain);
        Ok(drain)
    }
}

#[derive(Default)]
struct State {
    origin: Option<Origin>,
    trigger: Option<Trigger>,
    timeline: Vec<Event>,
    gates: Vec<GateState>,
    checks: Vec<Check>,
    closers: Vec<Closer>,
    /// A signal arrived (any kind): after a `preStop` drain, `run` may return.
    stop_seen: bool,
    signals_installed: bool,
    /// `run` owns the process: the stderr line is written once, at exit, with the exit event.
    owned_by_run: bool,
    /// The timeline is final (the Done event is in); later signals go to `late_signals`.
    frozen: bool,
    /// Signals received after Done, one event per trigger kind, added to the report at exit.
    late_signals: Vec<Event>,
    /// Receipt of the signal that started the drain, and when the driver first ran (unix ms).
    receipt: Option<u64>,
    noticed: Option<u64>,
    report: Option<DrainReport>,
    /// The arrival-rate evidence taken at the trigger.
    evidence: Option<Evidence>,
    /// What the propagation commit went on, once it committed.
    committed: Option<EvidenceReport>,
    /// The accept loop's timeouts, when `serve` runs the accept loop.
    server: Option<crate::report::ServerReport>,
}

/// Events the Kubernetes watch saw before the trigger enter the timeline only when this
/// recent (feature `kube`).
const EARLY_EVENT_WINDOW: Duration = Duration::from_secs(60);

/// The most events `/status` (and `/drain`) carry; the rest are counted in
/// [`Status::timeline_omitted`].
pub const STATUS_TIMELINE_LIMIT: usize = 64;

// Who writes the final report: the driver and the watchdog must not both write it.
const EMIT_NONE: u8 = 0;
const EMIT_DRIVER: u8 = 1;
const EMIT_WATCHDOG: u8 = 2;

/// Collapses a repeated trigger into the first event of its kind (a count, the first time).
/// Returns `false` when there is no such event yet.
fn collapse_signal(timeline: &mut [Event], trigger: Trigger) -> bool {
    match timeline
        .iter_mut()
        .find(|e| e.event == EventKind::SignalReceived && e.trigger == Some(trigger))
    {
        Some(e) => {
            e.count = Some(e.count.unwrap_or(1).saturating_add(1));
            true
        }
        None => false,
    }
}

#[derive(Clone, Copy)]
struct Origin {
    at: Instant,
    unix_ms: u64,
}

struct GateState {
    name: String,
    open: bool,
}

type CheckFn = Box<dyn Fn() -> Result<(), String> + Send + Sync>;

struct Check {
    name: String,
    f: Arc<CheckFn>,
}

pub(crate) struct Inner {
    pub(crate) core: &'static Core,
    budget: Budget,
    policy: Policy,
    signals: Signals,
    readiness: ReadinessWhileDraining,
    sinks: Sinks,
    hurry_lead: Duration,
    phase: watch::Sender<Phase>,
    state: Mutex<State>,
    drain_token: CancellationToken,
    stop_token: CancellationToken,
    hurry_token: CancellationToken,
    deadline_token: CancellationToken,
    force_token: CancellationToken,
    forced: AtomicBool,
    /// `EMIT_*`: who writes the final report (the loser of the swap backs off).
    emission: AtomicU8,
    terminate_seen: Notify,
    tasks: Tasks,
    pub(crate) exit: crate::exit::ExitHolds,
    /// The operator's name for the path in front (the report's `proxy_label`).
    proxy_label: Option<String>,
    /// What the Kubernetes API says (feature `kube`): the slices' hold, the deletion's budget.
    link: crate::kube::link::Link,
}

/// The drain coordinator: a cheap-to-clone handle shared by the server, the admin endpoint,
/// background tasks and `main`.
///
/// It holds the lifecycle [`Phase`], counts in-flight work ([`enter`](Self::enter), the HTTP
/// layer), tracks named background tasks ([`spawn`](Self::spawn)), and on the first trigger
/// drives the drain: readiness flip, propagation window, stop accepting, wait for zero or the
/// quiesce deadline, close resources in reverse order, emit the [`DrainReport`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lameduck::{Drain, Phase, Propagation, Signals, Trigger};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), lameduck::ConfigError> {
/// let drain = Drain::builder()
///     .grace_period(Duration::from_secs(30))
///     .propagation(Propagation::fixed(Duration::from_secs(1)))
///     .signals(Signals::none())
///     .report_to_stderr(false)
///     .build()?;
///
/// let gate = drain.startup_gate("cache-warmup");
/// assert!(!drain.is_ready());
/// gate.open();
/// assert!(drain.is_ready());
///
/// let guard = drain.enter(); // one request in flight
/// assert!(drain.start(Trigger::Api));
/// assert!(!drain.start(Trigger::Api)); // idempotent
/// drop(guard);
///
/// let report = drain.drained().await;
/// assert_eq!(report.exit_code, 0);
/// assert_eq!(drain.phase(), Phase::Done);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Drain {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Drain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Drain")
            .field("phase", &self.phase())
            .field("in_flight", &self.in_flight())
            .field("budget", &self.inner.budget)
            .finish_non_exhaustive()
    }
}

/// A startup gate: readiness stays false until every gate is [`open`](Self::open)ed.
///
/// Dropping a gate without opening it keeps it closed for good (readiness never turns true) and
/// logs a warning: a warm-up that failed must not make the service look ready.
#[derive(Debug)]
#[must_use = "readiness stays false until the gate is opened"]
pub struct StartupGate {
    drain: Drain,
    index: usize,
    opened: bool,
}

impl StartupGate {
    /// Opens the gate. When it was the last closed one, the phase moves to Serving.
    pub fn open(mut self) {
        self.opened = true;
        let name = {
            let mut st = self.drain.inner.lock();
            let gate = &mut st.gates[self.index];
            gate.open = true;
            gate.name.clone()
        };
        tracing::info!(gate = %name, "lameduck: startup gate opened");
        self.drain.maybe_serving();
    }
}

impl Drop for StartupGate {
    fn drop(&mut self) {
        if !self.opened {
            let st = self.drain.inner.lock();
            tracing::warn!(
                gate = %st.gates[self.index].name,
                "lameduck: startup gate dropped without open(); readiness stays false"
            );
        }
    }
}

/// Readiness and why, as `/readyz` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Readiness {
    /// `true` when `/readyz` answers 200 to the caller this describes ([`Drain::readiness`]:
    /// any caller but kubelet's probe, see [`ReadinessWhileDraining::Auto`]).
    pub ready: bool,
    /// `ok`, `starting: waiting for <gate>`, `draining`, `check <name> failed: <why>`.
    pub reason: String,
    /// Every check, one per line, as `/readyz?verbose` shows: `[+]name ok` / `[-]name failed: …`.
    pub checks: Vec<String>,
}

/// A snapshot of the coordinator, as `/status` serves it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// The current phase.
    pub phase: Phase,
    /// Whether `/readyz` answers 200 to callers other than kubelet's probe.
    pub ready: bool,
    /// The first trigger, once draining.
    pub trigger: Option<Trigger>,
    /// Requests (guards) in flight.
    pub in_flight: usize,
    /// Open connections on `lameduck::serve` listeners.
    pub connections: usize,
    /// Background tasks still running.
    pub tasks: usize,
    /// The readiness policy in force.
    pub readiness_policy: ReadinessWhileDraining,
    /// The budget: grace, used so far, remaining (all zero-used before the drain starts).
    pub budget: BudgetReport,
    /// The timeline so far: at most [`STATUS_TIMELINE_LIMIT`] events (the first and the last
    /// halves when longer).
    pub timeline: Vec<Event>,
    /// Events left out of `timeline` to keep the body bounded.
    #[serde(default)]
    pub timeline_omitted: usize,
    /// While draining, the evidence the propagation policy waits on (its kind is what it
    /// expects to commit on); once committed, the evidence it went on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<EvidenceReport>,
}

/// Given to cancellable tasks: when to stop taking new work, and when to hurry.
#[derive(Clone, Debug)]
pub struct TaskContext {
    drain: CancellationToken,
    hurry: CancellationToken,
    deadline: CancellationToken,
    drain_handle: Drain,
}

impl TaskContext {
    /// Fires when the drain starts: stop taking new work.
    pub fn stop(&self) -> &CancellationToken {
        &self.drain
    }

    /// Fires `hurry_lead` before the quiesce deadline: checkpoint, nack, re-enqueue now.
    pub fn hurry(&self) -> &CancellationToken {
        &self.hurry
    }

    /// Fires at the quiesce deadline, just before unfinished tasks are aborted.
    pub fn deadline_reached(&self) -> &CancellationToken {
        &self.deadline
    }

    /// The quiesce deadline, once the drain has started.
    pub fn deadline(&self) -> Option<Instant> {
        self.drain_handle.deadline()
    }
}

pub(crate) fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves State consistent (every write is a single
        // push/assignment), so poisoning is ignored rather than spread.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drain {
    /// The hot-path block, for the add-ons (HTTP layer, `serve`, metrics) that count on it.
    /// The one seam through which they reach the coordinator's counters.
    #[inline]
    #[cfg_attr(not(any(feature = "http", feature = "metrics")), allow(dead_code))] // only they call it
    pub(crate) fn core(&self) -> &'static Core {
        self.inner.core
    }
}

impl Drain {
    /// A builder with every default.
    pub fn builder() -> DrainBuilder {
        DrainBuilder::default()
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        *self.inner.phase.borrow()
    }

    /// A receiver that sees every phase change; `rx.wait_for(|p| *p >= Phase::Closing)` awaits
    /// a phase.
    pub fn subscribe(&self) -> watch::Receiver<Phase> {
        self.inner.phase.subscribe()
    }

    /// Resolves once the phase is `phase` or later.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn reached(&self, phase: Phase) {
        let mut rx = self.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = rx.wait_for(|p| *p >= phase).await;
    }

    /// Resolves at the next phase change and returns the new phase.
    pub async fn phase_changed(&self) -> Phase {
        let mut rx = self.subscribe();
        let _ = rx.changed().await;
        let p = *rx.borrow();
        p
    }

    /// The validated budget.
    pub fn budget(&self) -> Budget {
        self.inner.budget
    }

    /// The readiness policy in force.
    pub fn readiness_policy(&self) -> ReadinessWhileDraining {
        self.inner.readiness
    }

    /// Counts one unit of in-flight work until the returned guard is dropped.
    ///
    /// This is what the HTTP layer does per request; use it directly for work the layer does
    /// not see (a message handler, a raw TCP exchange). One atomic operation, no allocation.
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// # let drain = lameduck::Drain::builder().signals(lameduck::Signals::none())
    /// #     .report_to_stderr(false).termination_log(None).build().unwrap();
    /// use lameduck::Trigger;
    ///
    /// let guard = drain.enter(); // e.g. one message taken from a raw TCP protocol
    /// assert_eq!(drain.in_flight(), 1);
    /// drain.start(Trigger::Api);
    /// // ... finish the work; the drain cannot reach zero before ...
    /// drop(guard);
    /// let report = drain.drained().await;
    /// assert_eq!(report.exit_code, 0);
    /// # }
    /// ```
    #[inline]
    pub fn enter(&self) -> InFlightGuard {
        self.inner.core.enter().0
    }

    /// Requests (guards) in flight now.
    pub fn in_flight(&self) -> usize {
        self.inner.core.counter.count()
    }

    /// Open connections on `lameduck::serve` listeners.
    pub fn connections(&self) -> usize {
        self.inner
            .core
            .connections
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Background tasks still running.
    pub fn tasks(&self) -> usize {
        self.inner.tasks.len()
    }

    /// `true` from the first trigger on.
    pub fn is_draining(&self) -> bool {
        self.inner.core.counter.is_draining()
    }

    /// A startup gate named `name`. Readiness is false until every gate is opened.
    ///
    /// Create every gate before the phase can turn Serving — before [`run`](Self::run) or the
    /// server starts — since opening the last closed gate (or starting with none) makes the
    /// service ready.
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// # let drain = lameduck::Drain::builder().signals(lameduck::Signals::none())
    /// #     .report_to_stderr(false).termination_log(None).build().unwrap();
    /// use lameduck::Phase;
    ///
    /// let cache = drain.startup_gate("cache");
    /// drain.mark_started(); // what `run` and `serve` do; no effect while a gate is closed
    /// assert_eq!(drain.phase(), Phase::Starting);
    /// assert!(!drain.is_ready());
    ///
    /// tokio::spawn(async move {
    ///     // ... load the cache ...
    ///     cache.open();
    /// });
    /// drain.reached(Phase::Serving).await;
    /// assert!(drain.is_ready());
    /// # }
    /// ```
    pub fn startup_gate(&self, name: impl Into<String>) -> StartupGate {
        let name = name.into();
        let index = {
            let mut st = self.inner.lock();
            st.gates.push(GateState {
                name: name.clone(),
                open: false,
            });
            st.gates.len() - 1
        };
        if self.phase() != Phase::Starting {
            tracing::warn!(gate = %name, "lameduck: startup gate created after startup; it only affects readiness reporting");
        }
        StartupGate {
            drain: self.clone(),
            index,
            opened: false,
        }
    }

    /// Adds a readiness check evaluated on every `/readyz`. Keep it local: readiness must not
    /// depend on shared downstream services, or one slow database takes every replica out of
    /// the load balancer at once.
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// # let drain = lameduck::Drain::builder().signals(lameduck::Signals::none())
    /// #     .report_to_stderr(false).termination_log(None).build().unwrap();
    /// use std::sync::atomic::{AtomicBool, Ordering};
    /// use std::sync::Arc;
    ///
    /// let disk_ok = Arc::new(AtomicBool::new(true));
    /// let flag = Arc::clone(&disk_ok);
    /// drain.readiness_check("scratch-disk", move || {
    ///     if flag.load(Ordering::Relaxed) { Ok(()) } else { Err("disk full".to_owned()) }
    /// });
    /// drain.mark_started();
    /// assert!(drain.is_ready());
    /// disk_ok.store(false, Ordering::Relaxed);
    /// assert_eq!(drain.readiness().reason, "check scratch-disk failed: disk full");
    /// # }
    /// ```
    pub fn readiness_check<F>(&self, name: impl Into<String>, check: F)
    where
        F: Fn() -> Result<(), String> + Send + Sync + 'static,
    {
        let f: CheckFn = Box::new(check);
        self.inner.lock().checks.push(Check {
            name: name.into(),
            f: Arc::new(f),
        });
    }

    /// Marks startup complete if no gate is closed (Starting → Serving). Called by
    /// [`run`](Self::run), by `serve`, and when the last gate opens.
    pub fn mark_started(&self) {
        self.maybe_serving();
    }

    fn maybe_serving(&self) {
        let all_open = self.inner.lock().gates.iter().all(|g| g.open);
        if all_open {
            let moved = self.inner.phase.send_if_modified(|p| {
                if *p == Phase::Starting {
                    *p = Phase::Serving;
                    true
                } else {
                    false
                }
            });
            if moved {
                self.inner.core.mark_serving();
                tracing::info!("lameduck: serving");
                #[cfg(feature = "metrics")]
                self.record_metrics();
            }
        }
    }

    /// `true` when `/readyz` answers 200 to callers other than kubelet's probe (see
    /// [`ReadinessWhileDraining::Auto`]).
    pub fn is_ready(&self) -> bool {
        self.readiness().ready
    }

    /// Readiness with its reason and every check, as a caller other than kubelet's probe sees
    /// it (see [`ReadinessWhileDraining::Auto`]).
    pub fn readiness(&self) -> Readiness {
        self.readiness_for(Caller::Other)
    }

    /// Readiness as `caller` sees it: `/readyz` passes who asked.
    pub(crate) fn readiness_for(&self, caller: Caller) -> Readiness {
        let phase = self.phase();
        type Gates = Vec<(String, bool)>;
        type Checks = Vec<(String, Arc<CheckFn>)>;
        let (gates, checks): (Gates, Checks) = {
            let st = self.inner.lock();
            (
                st.gates.iter().map(|g| (g.name.clone(), g.open)).collect(),
                st.checks
                    .iter()
                    .map(|c| (c.name.clone(), Arc::clone(&c.f)))
                    .collect(),
            )
        };
        let mut lines = Vec::new();
        let mut reason: Option<String> = None;
        for (name, open) in &gates {
            if *open {
                lines.push(format!("[+]gate {name} ok"));
            } else {
                lines.push(format!("[-]gate {name} waiting"));
                reason.get_or_insert_with(|| format!("starting: waiting for {name}"));
            }
        }
        let policy = self.inner.readiness;
        let draining_ready = match phase {
            Phase::Starting | Phase::Serving => true,
            Phase::Draining => policy.ready_while_draining(caller),
            _ => false,
        };
        // Under `auto`, say which semantics applied and why.
        let why = if policy == ReadinessWhileDraining::Auto {
            format!("policy auto, {}", caller.describe())
        } else {
            format!("policy {}", policy.as_str())
        };
        if draining_ready && phase == Phase::Draining {
            lines.push(format!(
                "[+]drain draining, ready until stopped_accepting ({why}: keeps kube-proxy's fallback to serving terminating endpoints)"
            ));
        } else if draining_ready {
            lines.push("[+]drain ok".to_owned());
        } else if phase == Phase::Draining {
            lines.push(format!(
                "[-]drain draining, not ready from the trigger ({why})"
            ));
            reason.get_or_insert_with(|| "draining".to_owned());
        } else {
            lines.push(format!("[-]drain {phase} ({why})"));
            reason.get_or_insert_with(|| "draining".to_owned());
        }
        if phase >= Phase::Draining {
            if let Some(ev) = self.evidence_now() {
                lines.push(format!("[i]propagation {}", describe_evidence(&ev)));
            }
        }
        if phase == Phase::Starting && reason.is_none() {
            reason = Some("starting".to_owned());
        }
        // Checks run outside the lock: they are user code.
        for (name, f) in checks {
            match f() {
                Ok(()) => lines.push(format!("[+]{name} ok")),
                Err(why) => {
                    lines.push(format!("[-]{name} failed: {why}"));
                    reason.get_or_insert_with(|| format!("check {name} failed: {why}"));
                }
            }
        }
        Readiness {
            ready: reason.is_none(),
            reason: reason.unwrap_or_else(|| "ok".to_owned()),
            checks: lines,
        }
    }

    /// A token that fires when the drain starts.
    pub fn drain_token(&self) -> CancellationToken {
        self.inner.drain_token.clone()
    }

    /// A token that fires at `stopped_accepting`: listeners close, streams should end.
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// # let drain = lameduck::Drain::builder().signals(lameduck::Signals::none())
    /// #     .report_to_stderr(false).termination_log(None).build().unwrap();
    /// use lameduck::{Phase, Trigger};
    ///
    /// let stop = drain.stop_token();
    /// drain.start(Trigger::Api);
    /// stop.cancelled().await; // after the propagation policy committed
    /// assert!(drain.phase() >= Phase::StoppedAccepting);
    /// # }
    /// ```
    pub fn stop_token(&self) -> CancellationToken {
        self.inner.stop_token.clone()
    }

    /// A token that fires at the quiesce deadline (or when forced): force-close what is left.
    pub fn deadline_token(&self) -> CancellationToken {
        self.inner.deadline_token.clone()
    }

    /// The quiesce deadline, once the drain has started.
    pub fn deadline(&self) -> Option<Instant> {
        let origin = self.inner.lock().origin?;
        Some(self.deadlines(origin.at).quiesce)
    }

    /// The hard deadline (grace period minus safety margin), once the drain has started.
    pub fn hard_deadline(&self) -> Option<Instant> {
        let origin = self.inner.lock().origin?;
        Some(self.deadlines(origin.at).hard)
    }

    /// Starts the drain. Returns `true` only for the call that started it; later calls are
    /// recorded as `signal_received` and change nothing.
    ///
    /// # Panics
    ///
    /// If called outside a Tokio runtime for the first time (the drain's driver is spawned).
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// # let drain = lameduck::Drain::builder().signals(lameduck::Signals::none())
    /// #     .report_to_stderr(false).termination_log(None).build().unwrap();
    /// use lameduck::{Phase, Trigger};
    ///
    /// assert!(drain.start(Trigger::Api)); // started it
    /// assert!(!drain.start(Trigger::Sigterm)); // recorded as `signal_received`, changes nothing
    /// assert_eq!(drain.phase(), Phase::Draining);
    /// assert!(!drain.is_ready());
    /// # }
    /// ```
    pub fn start(&self, trigger: Trigger) -> bool {
        self.start_at(trigger, Instant::now(), unix_ms_now(), false)
    }

    /// Starts the drain with its origin at `now` (a signal's receipt time), or records a later
    /// trigger: one `signal_received` event per trigger kind, a count for repeats, nothing
    /// appended to the timeline once it is final.
    fn start_at(&self, trigger: Trigger, now: Instant, unix_ms: u64, from_signal: bool) -> bool {
        let watchdog = {
            let mut st = self.inner.lock();
            if let Some(origin) = st.origin {
                let st = &mut *st;
                let timeline = if st.frozen {
                    &mut st.late_signals
                } else {
                    &mut st.timeline
                };
                if !collapse_signal(timeline, trigger) {
                    let mut e = Event::new(
                        EventKind::SignalReceived,
                        now.saturating_duration_since(origin.at),
                        unix_ms,
                    );
                    e.trigger = Some(trigger);
                    tracing::info!(
                        event = "signal_received",
                        trigger = trigger.as_str(),
                        at_ms = e.at_ms,
                        "lameduck: trigger received while draining"
                    );
                    timeline.push(e);
                }
                return false;
            }
            st.origin = Some(Origin { at: now, unix_ms });
            st.trigger = Some(trigger);
            st.receipt = from_signal.then_some(unix_ms);
            let mut e = Event::new(EventKind::DrainStarted, Duration::ZERO, unix_ms);
            e.trigger = Some(trigger);
            st.timeline.push(e);
            if self.inner.readiness != ReadinessWhileDraining::ServingUntilStop {
                let mut e = Event::new(EventKind::ReadinessFlipped, Duration::ZERO, unix_ms);
                if self.inner.readiness == ReadinessWhileDraining::Auto {
                    e.detail = Some("for callers other than kubelet's probe".to_owned());
                }
                st.timeline.push(e);
            }
            st.evidence = Some(self.take_evidence(now));
            st.signals_installed
        };
        if watchdog {
            // Only a process that installed the handlers owns its exit.
            crate::signal::arm_watchdog(
                self.clone(),
                now.into_std(),
                self.inner.budget.watchdog_deadline(),
            );
        }
        tracing::info!(
            event = "drain_started",
            trigger = trigger.as_str(),
            in_flight = self.in_flight(),
            grace_ms = self.inner.budget.grace_period.as_millis() as u64,
            "lameduck: drain_started"
        );
        if self.inner.readiness != ReadinessWhileDraining::ServingUntilStop {
            tracing::info!(
                event = "readiness_flipped",
                at_ms = 0u64,
                policy = self.inner.readiness.as_str(),
                "lameduck: readiness_flipped"
            );
        }
        self.inner.core.start_draining();
        self.inner.phase.send_modify(|p| *p = Phase::Draining);
        #[cfg(feature = "metrics")]
        self.record_metrics();
        self.inner.drain_token.cancel();
        let drain = self.clone();
        let span = tracing::info_span!(
            "lameduck_drain",
            trigger = trigger.as_str(),
            grace_ms = self.inner.budget.grace_period.as_millis() as u64
        );
        tokio::spawn(tracing::Instrument::instrument(
            async move {
                // The runtime's notice, against the signal's receipt.
                drain.inner.lock().noticed = Some(unix_ms_now());
                drain.drive(now).await
            },
            span,
        ));
        true
    }

    /// A signal arrived (on the signal thread, `receipt` is when): start the drain with the
    /// receipt as its origin (or record it), let `run` return after a `preStop` drain, and
    /// force the exit when the signal table says so.
    pub(crate) fn on_signal(&self, trigger: Trigger, receipt: Receipt, force: bool) {
        let origin = Instant::from_std(receipt.at);
        // Recorded before `run` is woken, so the report it completes holds this signal.
        self.start_at(trigger, origin, receipt.unix_ms, true);
        self.inner.lock().stop_seen = true;
        self.inner.terminate_seen.notify_waiters();
        if force {
            self.force();
        }
    }

    /// Exit now: skip the remaining waits and the closers, report `forced`. Starts the drain if
    /// it had not started. Returns `true` if this call forced it.
    pub fn force(&self) -> bool {
        if self.inner.forced.swap(true, Ordering::AcqRel) {
            return false;
        }
        if !self.is_draining() {
            self.start(Trigger::Api);
        }
        tracing::warn!("lameduck: drain forced, exiting now");
        self.inner.force_token.cancel();
        true
    }

    /// Runs `fut` as a must-finish background task named `name`: the drain waits for it (up to
    /// the quiesce deadline, where it is named as a straggler and aborted).
    ///
    /// A panic in the task is caught and recorded with its name.
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// # let drain = lameduck::Drain::builder().signals(lameduck::Signals::none())
    /// #     .report_to_stderr(false).termination_log(None).build().unwrap();
    /// use lameduck::Trigger;
    ///
    /// drain.spawn("flush-uploads", async {
    ///     // ... upload what is buffered ...
    /// });
    /// drain.start(Trigger::Api);
    /// let report = drain.drained().await; // waited for the task
    /// assert!(report.tasks.is_empty()); // lists only tasks that panicked or were cut
    /// # }
    /// ```
    pub fn spawn<F>(&self, name: impl Into<String>, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.inner
            .tasks
            .spawn(name.into(), TaskKind::MustFinish, None, fut);
    }

    /// Runs a cancel-on-drain task: `make` gets a [`TaskContext`] whose [`stop`](TaskContext::stop)
    /// token fires when the drain starts (stop taking new work). The task is counted until it
    /// returns.
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// # let drain = lameduck::Drain::builder().signals(lameduck::Signals::none())
    /// #     .report_to_stderr(false).termination_log(None).build().unwrap();
    /// use std::time::Duration;
    /// use lameduck::Trigger;
    ///
    /// drain.spawn_cancellable("poller", |cx| async move {
    ///     loop {
    ///         tokio::select! {
    ///             () = cx.stop().cancelled() => break, // stop taking new work
    ///             () = tokio::time::sleep(Duration::from_secs(1)) => { /* poll, handle */ }
    ///         }
    ///     }
    ///     // ... finish what was taken ...
    /// });
    /// drain.start(Trigger::Api);
    /// assert_eq!(drain.drained().await.exit_code, 0);
    /// # }
    /// ```
    pub fn spawn_cancellable<F, Fut>(&self, name: impl Into<String>, make: F)
    where
        F: FnOnce(TaskContext) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let fut = make(self.task_context());
        self.inner
            .tasks
            .spawn(name.into(), TaskKind::CancelOnDrain, None, fut);
    }

    /// Like [`spawn_cancellable`](Self::spawn_cancellable), with a recovery action that runs if
    /// the task is still unfinished at the quiesce deadline, before it is aborted (e.g. return
    /// an unacknowledged message to its queue), bounded by `timeout`. The report records
    /// whether it ran and its result.
    pub fn spawn_with_recovery<F, Fut, R, RFut>(
        &self,
        name: impl Into<String>,
        make: F,
        timeout: Duration,
        recovery: R,
    ) where
        F: FnOnce(TaskContext) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
        R: FnOnce() -> RFut + Send + 'static,
        RFut: Future<Output = Result<(), String>> + Send + 'static,
    {
        let fut = make(self.task_context());
        let rec: Recovery = Box::new(move || Box::pin(recovery()));
        self.inner.tasks.spawn(
            name.into(),
            TaskKind::CancelOnDrain,
            Some((timeout, rec)),
            fut,
        );
    }

    fn task_context(&self) -> TaskContext {
        TaskContext {
            drain: self.inner.drain_token.clone(),
            hurry: self.inner.hurry_token.clone(),
            deadline: self.inner.deadline_token.clone(),
            drain_handle: self.clone(),
        }
    }

    /// Registers a resource closer. Closers run after in-flight requests and tasks reach zero
    /// (or the quiesce deadline passes), in reverse registration order, inside `close_budget`.
    /// Each gets a fair share of what is left when its turn comes (what is left before the hard
    /// deadline, divided by the closers still to run), so one slow closer cannot leave the
    /// ones after it nothing; see [`on_close_with`](Self::on_close_with) for a timeout of its
    /// own or a *critical* closer. A closer that errors, panics or times out is recorded; the
    /// next one still runs.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// # let drain = lameduck::Drain::builder().signals(lameduck::Signals::none())
    /// #     .report_to_stderr(false).termination_log(None).build().unwrap();
    /// use lameduck::Trigger;
    ///
    /// drain.on_close("database", || async { /* pool.close().await */ Ok::<_, std::io::Error>(()) });
    /// drain.on_close("tracer", || async { /* flush spans */ Ok::<_, std::io::Error>(()) });
    /// drain.start(Trigger::Api);
    /// let report = drain.drained().await;
    /// let order: Vec<_> = report.closers.iter().map(|c| c.name.as_str()).collect();
    /// assert_eq!(order, ["tracer", "database"]); // reverse registration order
    /// # }
    /// ```
    pub fn on_close<F, Fut, E>(&self, name: impl Into<String>, close: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        self.push_closer(name.into(), CloseOptions::new(), close);
    }

    /// Like [`on_close`](Self::on_close), bounded by its own `timeout` instead of a fair share
    /// (and always by what is left of the budget). Same as
    /// `on_close_with(name, CloseOptions::new().timeout(timeout), close)`.
    pub fn on_close_with_timeout<F, Fut, E>(
        &self,
        name: impl Into<String>,
        timeout: Duration,
        close: F,
    ) where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        self.push_closer(name.into(), CloseOptions::new().timeout(timeout), close);
    }

    /// Like [`on_close`](Self::on_close), with [`CloseOptions`]: a timeout of its own, or
    /// *critical* (keeps its time however long the closers before it take).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// # let drain = lameduck::Drain::builder().signals(lameduck::Signals::none())
    /// #     .report_to_stderr(false).termination_log(None).build().unwrap();
    /// use std::time::Duration;
    /// use lameduck::{CloseOptions, Trigger};
    ///
    /// // Registered first, closed last: the pool gets its time even if the exporter hangs.
    /// drain.on_close_with("database", CloseOptions::new().critical(), || async {
    ///     Ok::<_, std::io::Error>(())
    /// });
    /// drain.on_close_with("exporter", CloseOptions::new().timeout(Duration::from_secs(60)), || async {
    ///     std::future::pending::<Result<(), std::io::Error>>().await // hangs
    /// });
    /// drain.start(Trigger::Api);
    /// let report = drain.drained().await;
    /// assert_eq!(report.closers[0].result, "timed_out"); // the exporter, cut to leave time
    /// assert_eq!(report.closers[1].result, "ok"); // the database
    /// # }
    /// ```
    pub fn on_close_with<F, Fut, E>(&self, name: impl Into<String>, options: CloseOptions, close: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        self.push_closer(name.into(), options, close);
    }

    fn push_closer<F, Fut, E>(&self, name: String, options: CloseOptions, close: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        let f: crate::closers::CloseFn =
            Box::new(move || Box::pin(async move { close().await.map_err(Into::into) }));
        self.inner.lock().closers.push(Closer { name, options, f });
    }

    /// The timeline so far (empty before the drain starts).
    pub fn timeline(&self) -> Vec<Event> {
        self.inner.lock().timeline.clone()
    }

    /// A snapshot for `/status`.
    pub fn status(&self) -> Status {
        let phase = self.phase();
        let ready = self.is_ready();
        let (trigger, timeline, timeline_omitted, origin) = {
            let st = self.inner.lock();
            let all = &st.timeline;
            let (timeline, omitted) = if all.len() <= STATUS_TIMELINE_LIMIT {
                (all.clone(), 0)
            } else {
                // The start and the end say the most: keep both halves, count the middle.
                let half = STATUS_TIMELINE_LIMIT / 2;
                let mut kept = all[..half].to_vec();
                kept.extend_from_slice(&all[all.len() - half..]);
                (kept, all.len() - STATUS_TIMELINE_LIMIT)
            };
            (st.trigger, timeline, omitted, st.origin)
        };
        let used = origin.map_or(Duration::ZERO, |o| o.at.elapsed());
        Status {
            phase,
            ready,
            trigger,
            in_flight: self.in_flight(),
            connections: self.connections(),
            tasks: self.tasks(),
            readiness_policy: self.inner.readiness,
            budget: BudgetReport {
                deletion: origin.and_then(|o| self.deadlines_report(o.at)),
                ..BudgetReport::new(&self.inner.budget, used)
            },
            timeline,
            timeline_omitted,
            evidence: self.evidence_now(),
        }
    }

    /// The report, once the drain is Done.
    pub fn report(&self) -> Option<DrainReport> {
        self.inner.lock().report.clone()
    }

    /// Resolves when the drain is Done, with its report. Does not start the drain.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn drained(&self) -> DrainReport {
        self.reached(Phase::Done).await;
        self.report()
            .expect("the report is stored before the phase turns Done")
    }

    /// Drives the whole lifecycle for apps that want one call in `main`: listens to the
    /// configured signals, marks startup complete when no gate is closed, waits for a trigger
    /// and the end of the drain, and returns the report (exit with its `exit_code`).
    ///
    /// When the drain was started by a `preStop` call and finished before the stop signal
    /// arrived, it waits for the stop signal before returning, so the hook never sees its own
    /// process vanish — at most until the hard deadline: an entrypoint that does not forward
    /// signals is named in the report (`stop_signal_wait`) and its advice.
    ///
    /// Before returning it lets the admin endpoint answer every `/drain?wait=…` caller (and,
    /// with [`AdminBuilder::serve`], finish writing every admin response), bounded by the hard
    /// deadline.
    ///
    #[cfg_attr(
        feature = "admin",
        doc = "[`AdminBuilder::serve`]: crate::admin::AdminBuilder::serve"
    )]
    #[cfg_attr(
        not(feature = "admin"),
        doc = "[`AdminBuilder::serve`]: crate#feature-flags"
    )]
    ///
    /// The report returned is the one written last: it ends with an `exit` event carrying the
    /// exit code, after every signal received (also the one that followed a `preStop` drain).
    /// The file and the termination log are written when the drain is Done and again here; the
    /// stderr line only here, once.
    pub async fn run(&self) -> DrainReport {
        self.inner.lock().owned_by_run = true;
        self.install_signals();
        self.mark_started();
        let mut report = self.drained().await;
        let wait_for_stop = {
            let st = self.inner.lock();
            st.trigger == Some(Trigger::PreStop) && !self.inner.signals.is_none() && !st.stop_seen
        };
        if wait_for_stop && !self.is_forced() {
            let stop = self.inner.signals.stop();
            let since = Instant::now();
            let until = self.hard_deadline().unwrap_or(since);
            tracing::info!(
                stop_signal = stop.as_str(),
                "lameduck: drained after preStop; waiting for the stop signal to exit"
            );
            if !tracing::dispatcher::has_been_set() {
                let line = format!(
                    "lameduck: drained after preStop; waiting for the stop signal ({stop}) to exit, \
                     at most {} ms\n",
                    until.saturating_duration_since(since).as_millis()
                );
                let _ = tokio::task::spawn_blocking(move || {
                    crate::report::stderr_bounded(line, crate::report::STDERR_WAIT)
                })
                .await;
            }
            let mut arrived = true;
            loop {
                let n = self.inner.terminate_seen.notified();
                tokio::pin!(n);
                n.as_mut().enable();
                if self.inner.lock().stop_seen || self.is_forced() {
                    break;
                }
                tokio::select! {
                    () = n => {}
                    () = self.inner.force_token.cancelled() => break,
                    () = tokio::time::sleep_until(until) => {
                        arrived = false;
                        break;
                    }
                }
            }
            let waited_ms = since.elapsed().as_millis() as u64;
            report.stop_signal_wait = Some(StopSignalWait { waited_ms, arrived });
            if !arrived {
                tracing::warn!(
                    waited_ms,
                    "lameduck: the stop signal did not arrive after the preStop drain"
                );
                report.advice.insert(
                    0,
                    crate::Advice {
                        level: crate::AdviceLevel::Warn,
                        rule: "stop_signal_missing".to_owned(),
                        message: format!(
                            "stop signal ({stop}) did not arrive {waited_ms} ms after the preStop \
                             drain: is the entrypoint forwarding signals? run the binary as PID 1 \
                             or use an init that forwards"
                        ),
                        observed: waited_ms,
                    },
                );
            }
        }
        self.settle_before_exit().await;
        self.finish(report).await
    }

    /// Completes the report for the exit (signals received after Done, the `exit` event) and
    /// writes it to every sink for the last time.
    async fn finish(&self, mut report: DrainReport) -> DrainReport {
        let (late, origin) = {
            let st = self.inner.lock();
            (st.late_signals.clone(), st.origin)
        };
        report.timeline.extend(late);
        let at = origin.map_or(Duration::ZERO, |o| o.at.elapsed());
        let unix_ms = origin.map_or_else(unix_ms_now, |o| o.unix_ms + at.as_millis() as u64);
        let mut e = Event::new(EventKind::Exit, at, unix_ms);
        e.code = Some(report.exit_code);
        report.timeline.push(e);
        let emitted = self.emit_off_runtime(&report, true).await;
        apply_emitted(&mut report, emitted);
        self.inner.lock().report = Some(report.clone());
        report
    }

    /// Writes the report through the sinks on a blocking thread (a slow disk or a stalled
    /// stderr must not hold a runtime worker).
    async fn emit_off_runtime(&self, report: &DrainReport, stderr: bool) -> Emitted {
        // Logged here, in the drain's span and the caller's subscriber; written over there.
        crate::report::log_report(report, &report.to_json());
        let sinks = self.inner.sinks.clone();
        let r = report.clone();
        let emitted = tokio::task::spawn_blocking(move || sinks.emit(&r, stderr))
            .await
            .unwrap_or_else(|e| Emitted {
                file_failed: false,
                errors: vec![format!("report writer: {e}")],
            });
        for e in &emitted.errors {
            tracing::warn!(error = %e, "lameduck: a report sink failed");
        }
        emitted
    }

    /// Called on the watchdog thread once the hard deadline (plus half the safety margin) has
    /// passed: if the drain is not Done, the runtime is starved. Writes a `forced` report with
    /// what is known and exits the process with code 1.
    pub(crate) fn watchdog_fire(&self) {
        if self.phase() == Phase::Done {
            return;
        }
        // AcqRel: whoever wins writes; the driver checks the same flag before writing.
        match self.inner.emission.compare_exchange(
            EMIT_NONE,
            EMIT_WATCHDOG,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => {}
            Err(_) => {
                // The driver is writing the report and has not finished by now: exit anyway.
                let _ = crate::report::stderr_bounded(
                    "lameduck: the drain report was still being written at the hard deadline; exiting with code 1\n".to_owned(),
                    crate::report::STDERR_WAIT,
                );
                std::process::exit(1);
            }
        }
        let Some(origin) = self.inner.lock().origin else {
            return;
        };
        let now = Instant::now();
        let stragglers = self.collect_stragglers(now, origin.at);
        let used = now.saturating_duration_since(origin.at);
        {
            // Not through `push`: its log line may go to the very stderr that stalls.
            let mut st = self.inner.lock();
            let mut e = Event::new(
                EventKind::Done,
                used,
                origin.unix_ms + used.as_millis() as u64,
            );
            e.detail = Some("forced: runtime starved".to_owned());
            st.timeline.push(e);
            st.frozen = true;
        }
        self.inner.forced.store(true, Ordering::Release);
        let mut report = self.build_report(origin.at, Outcome::Forced, stragglers, Vec::new());
        report.cause = Some(format!(
            "runtime starved: the drain had not finished {} ms after the trigger (hard deadline \
             {} ms); something blocks the runtime's worker threads",
            used.as_millis(),
            self.inner.budget.hard_deadline().as_millis()
        ));
        let mut e = Event::new(
            EventKind::Exit,
            used,
            origin.unix_ms + used.as_millis() as u64,
        );
        e.code = Some(1);
        report.timeline.push(e);
        let _ = self.inner.sinks.emit(&report, true);
        std::process::exit(1);
    }

    /// Installs the configured OS signal handlers (once). [`run`](Self::run) calls it; call it
    /// yourself when you drive the lifecycle with [`drained`](Self::drained).
    pub fn install_signals(&self) {
        {
            let mut st = self.inner.lock();
            if st.signals_installed || self.inner.signals.is_none() {
                return;
            }
            st.signals_installed = true;
        }
        if let Err(e) = crate::signal::install(self, self.inner.signals) {
            tracing::error!(error = %e, "lameduck: cannot install signal handlers");
        }
    }

    // ---- hooks for the HTTP parts ----

    /// A new connection was accepted; counts it as activity while draining.
    /// Records the accept loop's timeouts for the report (`server`).
    #[cfg(feature = "http")]
    pub(crate) fn note_server(&self, server: crate::report::ServerReport) {
        self.inner.lock().server = Some(server);
    }

    #[cfg_attr(not(feature = "http"), allow(dead_code))] // called by the accept loop of the `http` feature
    pub(crate) fn note_connection(&self, peer: Option<SocketAddr>) -> bool {
        self.inner.core.note_arrival();
        let draining = self.is_draining();
        if draining {
            self.inner.core.note_connection(peer);
        }
        draining
    }

    // ---- hooks for the kube feature (src/kube/) ----
    //
    // Everything the Kubernetes watch and the driver exchange goes through these methods and
    // the `link` field: the watch writes the link (slice routing, the deletion's kill time) and
    // records events; the driver reads deadlines and the slice hold from it. Without the
    // feature the link stays empty and reports why.

    /// The link the Kubernetes watch writes.
    #[cfg_attr(not(feature = "kube"), allow(dead_code))] // the watch is behind `kube`
    pub(crate) fn link(&self) -> &crate::kube::link::Link {
        &self.inner.link
    }

    /// Records an event the API reported (an endpoint condition change, the deletion's
    /// budget) at `at`: in the timeline once the drain started, kept for its start before.
    #[cfg_attr(not(feature = "kube"), allow(dead_code))] // the watch is behind `kube`
    pub(crate) fn record_external(
        &self,
        kind: EventKind,
        name: Option<String>,
        detail: String,
        at: Instant,
        unix_ms: u64,
    ) {
        let origin = self.inner.lock().origin;
        match origin {
            Some(o) => {
                let mut e = Event::new(kind, at.saturating_duration_since(o.at), unix_ms);
                e.name = name;
                e.detail = Some(detail);
                self.push(e);
            }
            None => {
                tracing::info!(event = kind.as_str(), name = name.as_deref(), detail = %detail, "lameduck: {kind}");
                self.inner.link.push_early(crate::kube::link::Early {
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
    fn flush_early_events(&self, origin: Instant) {
        let early = self.inner.link.take_early();
        let mut st = self.inner.lock();
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

    /// The deadlines from `origin`, tightened by this deletion's grace when it is shorter.
    pub(crate) fn deadlines(&self, origin: Instant) -> Deadlines {
        self.tightened(origin).0
    }

    fn deadlines_report(&self, origin: Instant) -> Option<crate::kube::DeletionBudget> {
        self.tightened(origin).1
    }

    fn tightened(&self, origin: Instant) -> (Deadlines, Option<crate::kube::DeletionBudget>) {
        let max = match self.inner.policy {
            Policy::Quiet { max, .. } => max,
            Policy::Fixed(d) => d,
        };
        Deadlines::at(&self.inner.budget, max, origin, self.inner.link.kill())
    }

    /// Sleeps until the deadline `pick` chooses, re-reading the deadlines when the link
    /// changes (a deletion with a shorter grace moves them earlier).
    async fn until_deadline(&self, origin: Instant, pick: impl Fn(&Deadlines) -> Instant) {
        let mut link = self.inner.link.subscribe();
        loop {
            let at = pick(&self.deadlines(origin));
            tokio::select! {
                () = tokio::time::sleep_until(at) => return,
                changed = link.changed() => {
                    if changed.is_err() {
                        // The link lives as long as the coordinator: no more changes.
                        tokio::time::sleep_until(at).await;
                        return;
                    }
                }
            }
        }
    }

    /// Adds the slice evidence to the propagation evidence, or why there was none.
    fn endpoint_evidence(&self, report: &mut EvidenceReport, origin: Instant) {
        let link = &self.inner.link;
        let unix = self.inner.lock().origin.map_or(0, |o| o.unix_ms);
        let hold = link.hold();
        report.endpoint_slice_unused = link.unused_reason();
        if link.is_watching() {
            report.endpoint_slice = Some(link.evidence(origin, unix));
        }
        if hold == Hold::Pending && report.kind == EvidenceKind::Max {
            report.max_reason = Some(crate::evidence::MaxReason::EndpointSliceStillRouting);
        }
    }

    // ---- the driver ----

    fn event(&self, kind: EventKind, origin: Instant) -> Event {
        let st = self.inner.lock();
        let o = st
            .origin
            .expect("events are recorded after the origin is set");
        let at = Instant::now().saturating_duration_since(origin);
        Event::new(kind, at, o.unix_ms + at.as_millis() as u64)
    }

    fn push(&self, e: Event) {
        // One INFO line per lifecycle event (a production log tells the drain in a handful of
        // lines); counts ride along so each line stands on its own.
        tracing::info!(
            event = e.event.as_str(),
            at_ms = e.at_ms,
            in_flight = self.in_flight(),
            connections = self.connections(),
            tasks = self.tasks(),
            reason = e.reason.map(CommitReason::as_str),
            name = e.name.as_deref(),
            detail = e.detail.as_deref(),
            "lameduck: {}",
            e.event
        );
        {
            let mut st = self.inner.lock();
            // Nothing is appended once the timeline is final (the report is built from it).
            if !st.frozen {
                st.timeline.push(e);
            }
        }
        // Metrics are sampled at lifecycle events, never per request.
        #[cfg(feature = "metrics")]
        self.record_metrics();
    }

    fn is_forced(&self) -> bool {
        self.inner.forced.load(Ordering::Acquire)
    }

    async fn drive(self, origin: Instant) {
        let inner = &self.inner;
        // Events the Kubernetes watch saw before the trigger (feature `kube`).
        self.flush_early_events(origin);
        {
            let hurry = inner.hurry_token.clone();
            let deadline = inner.deadline_token.clone();
            let lead = inner.hurry_lead;
            let drain = self.clone();
            tokio::spawn(async move {
                let hurry_at =
                    |d: &Deadlines| d.quiesce.checked_sub(lead).unwrap_or(origin).max(origin);
                tokio::select! {
                    () = drain.until_deadline(origin, hurry_at) => hurry.cancel(),
                    () = deadline.cancelled() => hurry.cancel(),
                    // Holds a handle on the coordinator: not past the end of the drain.
                    () = drain.reached(Phase::Done) => {}
                }
            });
        }

        // 1. Propagation.
        let evidence = inner
            .lock()
            .evidence
            .expect("the evidence is taken with the origin");
        let (reason, kind) = tokio::select! {
            r = self.propagate(origin, evidence) => r,
            () = inner.force_token.cancelled() => (CommitReason::Forced, EvidenceKind::Cut),
        };
        let mut committed = evidence.report(kind, self.silence(origin));
        self.endpoint_evidence(&mut committed, origin);
        let mut e = self.event(EventKind::PropagationDone, origin);
        e.reason = Some(reason);
        // The evidence rides on its event's log line and in the timeline.
        e.detail = Some(describe_evidence(&committed));
        inner.lock().committed = Some(committed);
        self.push(e);
        let mut e = self.event(EventKind::StoppedAccepting, origin);
        e.reason = Some(reason);
        self.push(e);
        match inner.readiness {
            ReadinessWhileDraining::ServingUntilStop => {
                self.push(self.event(EventKind::ReadinessFlipped, origin));
            }
            ReadinessWhileDraining::Auto => {
                let mut e = self.event(EventKind::ReadinessFlipped, origin);
                e.detail = Some("for kubelet's probe".to_owned());
                self.push(e);
            }
            _ => {}
        }
        inner.phase.send_modify(|p| *p = Phase::StoppedAccepting);
        #[cfg(feature = "metrics")]
        self.record_metrics();
        inner.stop_token.cancel();
        inner.tasks.tracker.close();

        // 2. Wait for zero (requests and tasks), or the quiesce deadline.
        let mut stragglers = Vec::new();
        let mut deadline_hit = false;
        if !self.is_forced() {
            let requests = async {
                inner.core.wait_zero().await;
                self.push(self.event(EventKind::InFlightZero, origin));
            };
            let tasks = async {
                inner.tasks.tracker.wait().await;
                self.push(self.event(EventKind::TasksDone, origin));
            };
            let both = async { tokio::join!(requests, tasks) };
            tokio::select! {
                _ = both => {}
                () = self.until_deadline(origin, |d| d.quiesce) => deadline_hit = true,
                () = inner.force_token.cancelled() => {}
            }
        }
        if deadline_hit {
            stragglers = self.collect_stragglers(self.deadlines(origin).quiesce, origin);
            let mut e = self.event(EventKind::DeadlineExceeded, origin);
            e.detail = Some(format!("{} stragglers", stragglers.len()));
            self.push(e);
            inner.deadline_token.cancel();
            self.recover_and_abort(&mut stragglers, self.deadlines(origin).hard)
                .await;
        }
        if self.is_forced() {
            inner.deadline_token.cancel();
            for task in inner.tasks.take_stragglers() {
                task.abort.abort();
            }
        }

        // 3. Closing.
        inner.phase.send_modify(|p| *p = Phase::Closing);
        #[cfg(feature = "metrics")]
        self.record_metrics();
        let closers = std::mem::take(&mut inner.lock().closers);
        let closers = if self.is_forced() {
            Vec::new()
        } else {
            crate::closers::run_all(closers, self.deadlines(origin).hard, |r: &CloserResult| {
                let mut e = self.event(EventKind::ResourceClosed, origin);
                e.name = Some(r.name.clone());
                e.detail = Some(r.result.clone());
                self.push(e);
            })
            .await
        };

        // 4. Done.
        let outcome = if self.is_forced() {
            Outcome::Forced
        } else if deadline_hit {
            Outcome::DeadlineExceeded
        } else if closers.iter().any(|c| !c.is_ok()) {
            Outcome::CloserFailed
        } else {
            Outcome::Clean
        };
        let mut e = self.event(EventKind::Done, origin);
        e.detail = Some(outcome.as_str().to_owned());
        self.push(e);
        let owned_by_run = {
            let mut st = inner.lock();
            st.frozen = true;
            st.owned_by_run
        };
        let mut report = self.build_report(origin, outcome, stragglers, closers);
        // AcqRel: pairs with the watchdog's claim; only one of them writes the report.
        if inner
            .emission
            .compare_exchange(EMIT_NONE, EMIT_DRIVER, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            // The watchdog took over: it writes the report and exits the process.
            return;
        }
        // Under `run`, the stderr line waits for the exit, so it is written once and complete.
        let emitted = self.emit_off_runtime(&report, !owned_by_run).await;
        apply_emitted(&mut report, emitted);
        // Before the phase turns Done, so whoever awaits Done finds the histograms recorded.
        #[cfg(feature = "metrics")]
        crate::metrics::record_done(&report);
        inner.lock().report = Some(report);
        inner.phase.send_modify(|p| *p = Phase::Done);
        #[cfg(feature = "metrics")]
        self.record_metrics();
    }

    /// Waits until the propagation policy commits, and says on what evidence. Event-driven:
    /// it sleeps until the earliest instant the policy could hold, or until in-flight work
    /// reaches zero, then re-checks.
    async fn propagate(&self, origin: Instant, evidence: Evidence) -> (CommitReason, EvidenceKind) {
        let core = self.inner.core;
        let mut link = self.inner.link.subscribe();
        match self.inner.policy {
            Policy::Fixed(_) => {
                // The delay, unless this deletion's grace leaves less (`Deadlines::at`).
                self.until_deadline(origin, |d| d.max_at).await;
                (CommitReason::Fixed, EvidenceKind::Fixed)
            }
            Policy::Quiet {
                quiet, min, floor, ..
            } => {
                // `None`: the arrival data cannot say how long to wait; only the floor or max can.
                let t_conf = if evidence.weak().is_some() {
                    None
                } else {
                    evidence.t_conf()
                };
                loop {
                    let now = Instant::now();
                    // `max`, unless this deletion's grace leaves less (`Deadlines::at`).
                    let max_at = self.deadlines(origin).max_at;
                    if now >= max_at {
                        return (CommitReason::Max, EvidenceKind::Max);
                    }
                    let last_conn = core.last_new_connection().unwrap_or(origin).max(origin);
                    // With connection data, only new connections are routing decisions:
                    // requests on open connections (a pool, an HTTP/2 connection accepted
                    // during the drain, which gets its GOAWAY at the commit) say nothing about
                    // the proxies and must not hold the window open. Without it, requests are
                    // the only signal there is.
                    let last = if evidence.estimate.is_some() {
                        last_conn
                    } else {
                        core.last_activity().unwrap_or(origin).max(origin)
                    };
                    let conf_at = t_conf.map_or(max_at, |t| last_conn + t);
                    let hold = self.inner.link.hold();
                    let (conf_at, kind) = match hold {
                        // The slices are the authoritative step: no commit before they stop
                        // routing here plus the proxies' allowance; strong arrival evidence
                        // still adds its silence, weak evidence no longer waits to `max`.
                        Hold::Until(allowed) => (
                            t_conf.map_or(allowed, |t| allowed.max(last_conn + t)),
                            EvidenceKind::EndpointSlice,
                        ),
                        Hold::Pending => (max_at, EvidenceKind::EndpointSlice),
                        Hold::None => match floor {
                            Some(f) if origin + f < conf_at => (origin + f, EvidenceKind::Floor),
                            _ => (conf_at, EvidenceKind::Confidence),
                        },
                    };
                    let ready_at = (last + quiet).max(origin + min).max(conf_at);
                    if hold != Hold::Pending && now >= ready_at {
                        if core.counter.is_drained() {
                            return (CommitReason::Quiet, kind);
                        }
                        // Quiet, but something is in flight: wait for zero (or max), then
                        // re-check the window.
                        tokio::select! {
                            () = core.wait_zero() => {}
                            () = tokio::time::sleep_until(max_at) => {}
                            _ = link.changed() => {}
                        }
                        continue;
                    }
                    tokio::select! {
                        () = tokio::time::sleep_until(ready_at.min(max_at)) => {}
                        // The slices changed, or the deletion shortened `max`: re-check.
                        _ = link.changed() => {}
                    }
                }
            }
        }
    }

    /// The evidence at the trigger `now`: the arrival rate over the slots observed before it.
    fn take_evidence(&self, now: Instant) -> Evidence {
        let core = self.inner.core;
        let (epsilon, max, floor) = match self.inner.policy {
            Policy::Quiet {
                epsilon,
                max,
                floor,
                ..
            } => (epsilon, max, floor),
            Policy::Fixed(d) => (crate::evidence::DEFAULT_EPSILON, d, None),
        };
        Evidence {
            estimate: Estimate::at(core, now, core.serving_since(), epsilon),
            epsilon,
            max,
            floor,
        }
    }

    /// Silence so far: since the later of the trigger and the last new connection.
    fn silence(&self, origin: Instant) -> Duration {
        let last = self
            .inner
            .core
            .last_new_connection()
            .unwrap_or(origin)
            .max(origin);
        Instant::now().saturating_duration_since(last)
    }

    /// The committed evidence, or while draining the evidence the policy waits on.
    fn evidence_now(&self) -> Option<EvidenceReport> {
        let (evidence, committed, origin) = {
            let st = self.inner.lock();
            (st.evidence, st.committed.clone(), st.origin)
        };
        if committed.is_some() {
            return committed;
        }
        let (evidence, origin) = (evidence?, origin?);
        let kind = match self.inner.policy {
            Policy::Fixed(_) => EvidenceKind::Fixed,
            Policy::Quiet { .. } if self.inner.link.hold() != Hold::None => {
                EvidenceKind::EndpointSlice
            }
            Policy::Quiet { .. } if evidence.weak().is_none() => EvidenceKind::Confidence,
            Policy::Quiet { floor: Some(_), .. } => EvidenceKind::Floor,
            Policy::Quiet { .. } => EvidenceKind::Max,
        };
        let mut report = evidence.report(kind, self.silence(origin.at));
        self.endpoint_evidence(&mut report, origin.at);
        Some(report)
    }

    fn collect_stragglers(&self, now: Instant, origin: Instant) -> Vec<Straggler> {
        let mut out = Vec::new();
        let registered = self.inner.core.registered_requests();
        let named = registered.len();
        for r in registered {
            let age = now.saturating_duration_since(r.started.unwrap_or(origin));
            out.push(Straggler {
                kind: "request".to_owned(),
                name: format!("{} {}", r.method, r.path),
                age_ms: age.as_millis() as u64,
                peer: r.peer.map(|p| p.to_string()),
                recovery: None,
            });
        }
        // Responses handed to the connection whose bytes still wait for the peer to read them.
        let stalled = self.inner.core.stalls.snapshot();
        for w in &stalled {
            out.push(Straggler {
                kind: "response".to_owned(),
                name: w.describe(),
                age_ms: now.saturating_duration_since(w.since).as_millis() as u64,
                peer: w.peer.map(|p| p.to_string()),
                recovery: None,
            });
        }
        let unnamed = self
            .in_flight()
            .saturating_sub(named)
            .saturating_sub(stalled.len());
        for _ in 0..unnamed {
            out.push(Straggler {
                kind: "request".to_owned(),
                name: "(undescribed guard)".to_owned(),
                age_ms: now.saturating_duration_since(origin).as_millis() as u64,
                peer: None,
                recovery: None,
            });
        }
        for (name, _, started) in self.inner.tasks.running() {
            out.push(Straggler {
                kind: "task".to_owned(),
                name,
                age_ms: now.saturating_duration_since(started).as_millis() as u64,
                peer: None,
                recovery: None,
            });
        }
        out
    }

    /// Runs the recovery actions of unfinished tasks (each bounded by its timeout and the hard
    /// deadline), then aborts the tasks.
    async fn recover_and_abort(&self, stragglers: &mut [Straggler], hard: Instant) {
        for crate::tasks::Unfinished {
            name,
            abort,
            recovery,
        } in self.inner.tasks.take_stragglers()
        {
            if let Some((timeout, rec)) = recovery {
                let left = hard.saturating_duration_since(Instant::now());
                let handle = tokio::spawn(rec());
                let result = match tokio::time::timeout(timeout.min(left), handle).await {
                    Ok(Ok(Ok(()))) => "ok".to_owned(),
                    Ok(Ok(Err(e))) => format!("error: {e}"),
                    Ok(Err(e)) if e.is_panic() => "panicked".to_owned(),
                    Ok(Err(_)) => "aborted".to_owned(),
                    Err(_) => "timed_out".to_owned(),
                };
                tracing::warn!(task = %name, result = %result, "lameduck: recovery action ran");
                if let Some(s) = stragglers
                    .iter_mut()
                    .find(|s| s.kind == "task" && s.name == name && s.recovery.is_none())
                {
                    s.recovery = Some(result);
                }
            }
            abort.abort();
        }
        // Wait for the aborted tasks' wrappers to record their end (the tracker is closed, so
        // `wait` resolves once they have); bounded, in case a task blocks its thread.
        let settle = (Instant::now() + Duration::from_millis(100)).min(hard);
        let _ = tokio::time::timeout_at(settle, self.inner.tasks.tracker.wait()).await;
    }

    fn build_report(
        &self,
        origin: Instant,
        outcome: Outcome,
        stragglers: Vec<Straggler>,
        closers: Vec<CloserResult>,
    ) -> DrainReport {
        let core = self.inner.core;
        let af = &core.after_flip;
        let mut peers: Vec<PeerCount> = af
            .peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(ip, n)| PeerCount {
                peer: ip.to_string(),
                new_connections: *n,
            })
            .collect();
        peers.sort_by(|a, b| {
            b.new_connections
                .cmp(&a.new_connections)
                .then(a.peer.cmp(&b.peer))
        });
        peers.truncate(10);
        let last_new = core
            .unstamp(af.last_new_connection.load(Ordering::Relaxed))
            .map(|t| t.saturating_duration_since(origin).as_millis() as u64);
        let used = origin.elapsed();
        let (trigger, timeline, receipt, noticed, server) = {
            let st = self.inner.lock();
            (
                st.trigger,
                st.timeline.clone(),
                st.receipt,
                st.noticed,
                st.server.clone(),
            )
        };
        let signal_receipt = receipt.map(|received| SignalReceipt {
            received_unix_ms: received,
            noticed_unix_ms: noticed,
            notice_delay_ms: noticed.map(|n| n.saturating_sub(received)),
        });
        let mut propagation = self.inner.policy.report();
        propagation.evidence = self.inner.lock().committed.clone();
        let mut report = DrainReport {
            outcome,
            trigger,
            exit_code: outcome.exit_code(),
            readiness_policy: self.inner.readiness,
            budget: BudgetReport::new(&self.inner.budget, used),
            propagation,
            timeline,
            after_flip: AfterFlipReport {
                new_connections: af.new_connections.load(Ordering::Relaxed),
                requests_on_new_connections: af.requests_on_new.load(Ordering::Relaxed),
                requests_on_reused_connections: af.requests_on_reused.load(Ordering::Relaxed),
                last_new_connection_ms: last_new,
                peers,
                paths: af
                    .paths
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .map(|(path, on_new, on_reused)| crate::report::PathCount {
                        path: path.clone(),
                        requests_on_new_connections: *on_new,
                        requests_on_reused_connections: *on_reused,
                    })
                    .collect(),
            },
            stragglers,
            tasks: self.inner.tasks.ended(),
            closers,
            pod: PodInfo::from_env(),
            advice: Vec::new(),
            cause: None,
            signal_receipt,
            stop_signal_wait: None,
            sink_errors: Vec::new(),
            proxy_label: self.inner.proxy_label.clone(),
            server,
        };
        report.budget.deletion = self.deadlines_report(origin);
        report.advice = crate::advice::advise(&report);
        report
    }
}

/// Records what an emission achieved: failed sinks, and exit code 1 when the report file
/// could not be written.
fn apply_emitted(report: &mut DrainReport, emitted: Emitted) {
    if emitted.file_failed {
        report.exit_code = 1;
    }
    for e in emitted.errors {
        if !report.sink_errors.contains(&e) {
            report.sink_errors.push(e);
        }
    }
}

/// One line for `/readyz?verbose`: the evidence and its numbers.
fn describe_evidence(e: &EvidenceReport) -> String {
    let rate = match (e.rate_per_s(), e.weak) {
        (_, Some(crate::WeakEvidence::NoConnectionData)) => {
            "no connection data (use lameduck::serve or ConnMeta)".to_owned()
        }
        (Some(r), _) => format!(
            "{r:.2} new connections/s before the trigger ({} of {} slots empty)",
            e.empty_slots, e.slots_observed
        ),
        (None, _) => "no rate".to_owned(),
    };
    let need = match e.t_conf_ms {
        Some(t) if e.weak.is_none() => format!("needs {t} ms of silence"),
        _ => match e.weak {
            Some(w) => format!("not enough evidence ({})", w.as_str()),
            None => String::new(),
        },
    };
    let slices = match (&e.endpoint_slice, &e.endpoint_slice_unused) {
        (Some(s), None) => match (s.changed_at_ms, s.allowed_at_ms) {
            (Some(c), Some(a)) => format!(
                "; EndpointSlice {} at {c} ms, allowed from {a} ms ({} ms allowance)",
                s.condition, s.allowance_ms
            ),
            _ => format!("; waiting for the EndpointSlice to show {}", s.condition),
        },
        // A watch that was started and could not be used is worth the line; a build without
        // the feature is a choice.
        (_, Some(why))
            if !why.starts_with("the kube feature") && !why.starts_with("no EndpointWatch") =>
        {
            format!("; no EndpointSlice evidence: {why}")
        }
        _ => String::new(),
    };
    format!(
        "{}: {rate}; {need}; silent for {} ms{slices}",
        e.kind.as_str(),
        e.silence_ms
    )
}
