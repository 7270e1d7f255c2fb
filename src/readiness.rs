//! Readiness: startup gates, readiness checks, the policy while draining, and the one rule
//! that turns a phase into "ready" for `/readyz` and gRPC health alike.
//!
//! # Invariants
//!
//! * Gates and checks sit behind this part's own lock, never taken on the request path and
//!   never held while a check runs: checks are user code.
//! * A gate only ever goes from closed to open; a gate dropped unopened stays closed.

mod sources;

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;
use crate::phase::Phase;
use crate::sync::MutexExt;
#[cfg(feature = "admin")]
pub(crate) use sources::ProbeCaller;
pub(crate) use sources::SourceTable;
pub use sources::{ProbeClass, ProbeSource, ProbeSources, KNATIVE_PROBE_HEADER, PROBE_HEADER};

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
    /// `X-Lameduck-Probe: kubelet` ([`PROBE_HEADER`], set in the probe's `httpHeaders`, which
    /// survives a mesh that rewrites probes), or Knative's `K-Kubelet-Probe` header
    /// ([`KNATIVE_PROBE_HEADER`]), or a `User-Agent` starting with `kube-probe/` (kubelet's
    /// own). `X-Lameduck-Probe: load-balancer` and the `User-Agent`s of known load-balancer
    /// checkers (`GoogleHC/`, `ELB-HealthChecker/`, `Envoy/HC`, …) are classed as load
    /// balancers; they and everyone else see "not ready" from the trigger. An external checker
    /// that sends kubelet's `User-Agent` or the header is taken for kubelet. `/status` and the
    /// report list the sources seen and how each was classified ([`ProbeSources`]).
    /// [`Readiness::answer`](crate::Readiness::answer) and `/status` answer as for other callers;
    /// gRPC health goes by `User-Agent` only.
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
        crate::names::of(&self)
    }

    /// Whether the caller sees "ready" while Draining (before `stopped_accepting`; after it,
    /// no caller does).
    fn ready_while_draining(self, caller: Caller) -> bool {
        match self {
            ReadinessWhileDraining::NotReady => false,
            ReadinessWhileDraining::ServingUntilStop => true,
            ReadinessWhileDraining::Auto => caller == Caller::Kubelet,
        }
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

/// The one phase → ready rule, for `/readyz` and gRPC health alike: whether the phase alone
/// lets `caller` see "ready" (gates and checks aside).
pub(crate) fn ready_in(phase: Phase, policy: ReadinessWhileDraining, caller: Caller) -> bool {
    match phase {
        Phase::Serving => true,
        Phase::Draining => policy.ready_while_draining(caller),
        _ => false,
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
    #[cfg(feature = "grpc")]
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

/// Readiness and why, as `/readyz` reports it: [`Readiness::answer`](crate::Readiness::answer).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ReadinessAnswer {
    /// `true` when `/readyz` answers 200 to the caller this describes
    /// ([`Readiness::answer`](crate::Readiness::answer): any caller but kubelet's probe, see
    /// [`ReadinessWhileDraining::Auto`]).
    pub ready: bool,
    /// `ok`, `starting: waiting for <gate>`, `draining`, `check <name> failed: <why>`.
    pub reason: String,
    /// Every check, one per line, as `/readyz?verbose` shows: `[+]name ok` / `[-]name failed: …`.
    pub checks: Vec<String>,
}

type CheckFn = dyn Fn() -> Result<(), String> + Send + Sync;

struct Gate {
    name: String,
    open: bool,
}

struct Check {
    name: String,
    f: Arc<CheckFn>,
}

#[derive(Default)]
struct Registry {
    gates: Vec<Gate>,
    checks: Vec<Check>,
}

/// The readiness part of a coordinator: its policy, gates and checks.
pub(crate) struct ReadinessState {
    policy: ReadinessWhileDraining,
    registry: Mutex<Registry>,
}

impl std::fmt::Debug for ReadinessState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadinessState")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl ReadinessState {
    pub(crate) fn new(policy: ReadinessWhileDraining) -> Self {
        Self {
            policy,
            registry: Mutex::new(Registry::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        // Every write is one push or one flag: a panic elsewhere leaves the registry whole.
        self.registry.locked()
    }

    pub(crate) fn policy(&self) -> ReadinessWhileDraining {
        self.policy
    }

    /// Adds a closed gate; returns its index.
    pub(crate) fn add_gate(&self, name: String) -> usize {
        let mut reg = self.lock();
        reg.gates.push(Gate { name, open: false });
        reg.gates.len() - 1
    }

    /// Opens gate `index`; returns its name.
    pub(crate) fn open_gate(&self, index: usize) -> String {
        let mut reg = self.lock();
        let gate = &mut reg.gates[index];
        gate.open = true;
        gate.name.clone()
    }

    pub(crate) fn gate_name(&self, index: usize) -> String {
        self.lock().gates[index].name.clone()
    }

    pub(crate) fn all_gates_open(&self) -> bool {
        self.lock().gates.iter().all(|g| g.open)
    }

    pub(crate) fn add_check(&self, name: String, f: Arc<CheckFn>) {
        self.lock().checks.push(Check { name, f });
    }

    /// Readiness in `phase` as `caller` (described as `who`) sees it, with `evidence` (one line:
    /// what the propagation policy waits on or went on) as an informational line while
    /// draining.
    pub(crate) fn evaluate(
        &self,
        phase: Phase,
        caller: Caller,
        who: &str,
        evidence: Option<String>,
    ) -> ReadinessAnswer {
        type Gates = Vec<(String, bool)>;
        type Checks = Vec<(String, Arc<CheckFn>)>;
        let (gates, checks): (Gates, Checks) = {
            let reg = self.lock();
            (
                reg.gates.iter().map(|g| (g.name.clone(), g.open)).collect(),
                reg.checks
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
        let policy = self.policy;
        // While Starting the gates decide; from then on the one rule.
        let phase_ready = phase == Phase::Starting || ready_in(phase, policy, caller);
        // Under `auto`, say which semantics applied and why.
        let why = if policy == ReadinessWhileDraining::Auto {
            format!("policy auto, {who}")
        } else {
            format!("policy {}", policy.as_str())
        };
        if phase_ready && phase == Phase::Draining {
            lines.push(format!(
                "[+]drain draining, ready until stopped_accepting ({why}: keeps kube-proxy's fallback to serving terminating endpoints)"
            ));
        } else if phase_ready {
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
            if let Some(ev) = evidence {
                lines.push(format!("[i]propagation {ev}"));
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
        ReadinessAnswer {
            ready: reason.is_none(),
            reason: reason.unwrap_or_else(|| "ok".to_owned()),
            checks: lines,
        }
    }
}
