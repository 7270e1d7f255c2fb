//! Phases, triggers and the timeline of lifecycle events.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::vocab::error::ConfigError;

/// Where the service is in its life. Phases only move forward.
///
/// ```text
/// Starting ──(all startup gates open)──▶ Serving
/// Serving ──(preStop call │ SIGTERM │ Drain::start)──▶ Draining
/// Draining ──(propagation policy commits)──▶ StoppedAccepting
/// StoppedAccepting ──(in-flight = 0 and tasks = 0, or quiesce deadline)──▶ Closing ──▶ Done
/// ```
///
/// In JSON: `starting`, `serving`, `draining`, `stopped_accepting`, `closing`, `done`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Phase {
    /// Not ready yet: at least one startup gate is closed. `/readyz` is 503, `/livez` 200.
    Starting,
    /// Ready and serving.
    Serving,
    /// A trigger arrived: readiness is flipped, everything is still served, the propagation
    /// policy is waiting for load balancers to catch up.
    Draining,
    /// Committed to leaving: listeners close, idle connections close, streams are told to stop;
    /// requests on open connections are still served.
    StoppedAccepting,
    /// In-flight work reached zero (or the quiesce deadline passed): closers run.
    Closing,
    /// The drain is over and the report is ready.
    Done,
}

impl Phase {
    /// The phase for its position in the order (`phase as u8`), as the hot-path block mirrors
    /// it; anything past the last is `Done`.
    pub(crate) fn from_index(i: u8) -> Phase {
        match i {
            0 => Phase::Starting,
            1 => Phase::Serving,
            2 => Phase::Draining,
            3 => Phase::StoppedAccepting,
            4 => Phase::Closing,
            _ => Phase::Done,
        }
    }

    /// The phase's name as it appears in JSON (`"stopped_accepting"`).
    pub fn as_str(self) -> &'static str {
        crate::vocab::names::of(&self)
    }

    /// `true` from the trigger on.
    pub fn is_draining(self) -> bool {
        self >= Phase::Draining
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What started (or asked to start) the drain.
///
/// In JSON: `api`, `prestop`, `sigterm`, `sigint`, `sigquit`, `task_panic`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Trigger {
    /// The application called [`Drain::start`](crate::Drain::start).
    Api,
    /// The admin `/drain` endpoint (a Kubernetes `preStop` hook).
    #[serde(rename = "prestop")]
    PreStop,
    /// SIGTERM (kubelet's stop signal).
    Sigterm,
    /// SIGINT (Ctrl-C).
    Sigint,
    /// SIGQUIT.
    Sigquit,
    /// A background task panicked, with
    /// [`DrainBuilder::drain_on_task_panic`](crate::DrainBuilder::drain_on_task_panic) set.
    TaskPanic,
}

impl Trigger {
    /// The trigger's name as it appears in JSON (`"prestop"`).
    pub fn as_str(self) -> &'static str {
        crate::vocab::names::of(&self)
    }

    /// `true` for the OS signals.
    pub fn is_signal(self) -> bool {
        matches!(self, Trigger::Sigterm | Trigger::Sigint | Trigger::Sigquit)
    }
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why the drain stopped accepting.
///
/// In JSON: `quiet`, `max`, `fixed`, `forced`, `never_served`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CommitReason {
    /// The quiet window held: `min` passed, no activity for `quiet`, nothing in flight.
    Quiet,
    /// The quiet window never held; `max` was reached.
    Max,
    /// The fixed propagation delay passed.
    Fixed,
    /// The drain was forced (a second signal, a SIGQUIT that is not the stop signal,
    /// [`Drain::force`](crate::Drain::force)).
    Forced,
    /// The drain started while the process was still Starting: it was never ready, so no
    /// proxy routed here and there was nothing to wait for (a Service with
    /// `publishNotReadyAddresses` is the exception: it is for peer discovery).
    NeverServed,
}

impl CommitReason {
    /// The reason's name as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        crate::vocab::names::of(&self)
    }
}

/// The kind of a lifecycle event in the timeline.
///
/// In JSON: `drain_started`, `readiness_flipped`, `signal_received`, `propagation_done`, `stopped_accepting`, `in_flight_zero`, `tasks_done`, `deadline_exceeded`, `resource_closed`, `done`, `endpoint_changed`, `budget_tightened`, `exit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EventKind {
    /// The first trigger arrived; the budget's origin.
    DrainStarted,
    /// `/readyz` started answering 503.
    ReadinessFlipped,
    /// A trigger arrived after the first one (recorded, changes nothing), or a signal arrived.
    /// One event per trigger kind: repeats raise its `count` and keep the first one's time.
    SignalReceived,
    /// The propagation policy is satisfied (or gave up).
    PropagationDone,
    /// Listeners closed; `reason` says why.
    StoppedAccepting,
    /// The last in-flight request guard was released.
    InFlightZero,
    /// The last background task ended.
    TasksDone,
    /// The quiesce deadline passed with work still running.
    DeadlineExceeded,
    /// One resource closer finished (`name`, `result`).
    ResourceClosed,
    /// The drain is over.
    Done,
    /// An EndpointSlice changed this Pod's endpoint conditions (feature `kube`): `name` is the
    /// slice, `detail` the service and each condition (`ready true→false, serving true,
    /// terminating false→true`). Changes before the trigger are added at 0 ms with how long
    /// before.
    EndpointChanged,
    /// The Pod's deletion left less than the grace period (feature `kube`,
    /// `kubectl delete --grace-period`): the deadlines shrink; `detail` says to what.
    BudgetTightened,
    /// The process is exiting with `code`: the last event, recorded in the report as it is
    /// written for the last time (by [`Drain::run`](crate::Drain::run) or the watchdog).
    Exit,
}

impl EventKind {
    /// The event's name as it appears in JSON (`"in_flight_zero"`).
    pub fn as_str(self) -> &'static str {
        crate::vocab::names::of(&self)
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One entry of the timeline.
///
/// JSON form: `{"event":"stopped_accepting","at_ms":2004,"unix_ms":1764477000123,"reason":"quiet"}`;
/// optional fields are left out when empty.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// What happened.
    pub event: EventKind,
    /// Milliseconds since the drain's origin (the first trigger).
    pub at_ms: u64,
    /// Wall-clock time, milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// The trigger, for `drain_started` and `signal_received`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<Trigger>,
    /// Why, for `stopped_accepting` (`quiet`, `max`, `fixed`, `forced`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<CommitReason>,
    /// The closer's name, for `resource_closed`; the EndpointSlice's, for `endpoint_changed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A short free-form detail (a closer's result, the number of stragglers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// For `signal_received`: how many times this trigger arrived (left out when once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// For `exit`: the process's exit code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
}

/// Wall-clock milliseconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Event {
    pub(crate) fn new(event: EventKind, at: Duration, unix_ms: u64) -> Self {
        Self {
            event,
            at_ms: at.as_millis() as u64,
            unix_ms,
            trigger: None,
            reason: None,
            name: None,
            detail: None,
            count: None,
            code: None,
        }
    }
}

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
///
/// In JSON: `auto`, `not_ready`, `serving_until_stop`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ReadinessWhileDraining {
    /// By caller (the default): kubelet's probe gets
    /// [`ServingUntilStop`](Self::ServingUntilStop), which keeps kube-proxy's all-terminating
    /// fallback; every other caller gets [`NotReady`](Self::NotReady).
    ///
    /// `/readyz` takes a caller for kubelet's probe when, in this order: it sends
    /// `X-Lameduck-Probe: kubelet` ([`PROBE_HEADER`](crate::PROBE_HEADER), set in the probe's `httpHeaders`, which
    /// survives a mesh that rewrites probes), or Knative's `K-Kubelet-Probe` header
    /// ([`KNATIVE_PROBE_HEADER`](crate::KNATIVE_PROBE_HEADER)), or a `User-Agent` starting with `kube-probe/` (kubelet's
    /// own). `X-Lameduck-Probe: load-balancer` and the `User-Agent`s of known load-balancer
    /// checkers (`GoogleHC/`, `ELB-HealthChecker/`, `Envoy/HC`, …) are classed as load
    /// balancers; they and everyone else see "not ready" from the trigger. An external checker
    /// that sends kubelet's `User-Agent` or the header is taken for kubelet. `/status` and the
    /// report list the sources seen and how each was classified ([`ProbeSources`](crate::report::ProbeSources)).
    /// [`Readiness::answer`](crate::Readiness::answer) and `/status` answer as for other callers;
    /// gRPC health goes by `User-Agent` only.
    ///
    /// With the `kube` feature, once the watch sees the kubelet terminate the Pod without a
    /// deletion (graceful node shutdown, node-pressure eviction), `/readyz` answers kubelet's
    /// probe as [`NotReady`](Self::NotReady) does: no `terminating` condition will take the
    /// endpoint out of its slices (nor put it in kube-proxy's fallback), only the probe can.
    /// gRPC health keeps the policy it was built with.
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
        crate::vocab::names::of(&self)
    }

    /// `true` when the trigger itself flips readiness for someone (every policy but
    /// [`ServingUntilStop`](Self::ServingUntilStop)).
    pub(crate) fn flips_at_trigger(self) -> bool {
        self != ReadinessWhileDraining::ServingUntilStop
    }
}

impl std::str::FromStr for ReadinessWhileDraining {
    type Err = ConfigError;

    /// The JSON name, with `-` accepted for `_` (`not-ready`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = s.replace('-', "_");
        [Self::Auto, Self::NotReady, Self::ServingUntilStop]
            .into_iter()
            .find(|p| p.as_str() == name)
            .ok_or_else(|| {
                ConfigError::parse(format!(
                    "`{s}` is not a readiness policy: expected auto, not-ready or serving-until-stop"
                ))
            })
    }
}
