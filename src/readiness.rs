//! Readiness: startup gates, readiness checks, the policy while draining, and the one rule
//! that turns a phase into "ready" for `/readyz` and gRPC health alike.
//!
//! # Invariants
//!
//! * Gates and checks sit behind this part's own lock, never taken on the request path and
//!   never held while a check runs: checks are user code.
//! * A gate only ever goes from closed to open; a gate dropped unopened stays closed.

pub(crate) mod sources;

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::vocab::phase::{Phase, ReadinessWhileDraining};
use crate::vocab::sync::MutexExt;
pub(crate) use sources::SourceTable;
pub use sources::{KNATIVE_PROBE_HEADER, PROBE_HEADER};

/// The one phase → ready rule, for `/readyz` and gRPC health alike: whether the phase alone
/// lets `caller` see "ready" (gates and checks aside).
pub(crate) fn ready_in(phase: Phase, policy: ReadinessWhileDraining, caller: Caller) -> bool {
    match phase {
        Phase::Serving => true,
        Phase::Draining => ready_while_draining(policy, caller),
        _ => false,
    }
}

/// Whether the caller sees "ready" while Draining (before `stopped_accepting`; after it,
/// no caller does).
fn ready_while_draining(policy: ReadinessWhileDraining, caller: Caller) -> bool {
    match policy {
        ReadinessWhileDraining::NotReady => false,
        ReadinessWhileDraining::ServingUntilStop => true,
        ReadinessWhileDraining::Auto => caller == Caller::Kubelet,
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

struct ReadinessCheck {
    name: String,
    f: Arc<CheckFn>,
}

#[derive(Default)]
struct ReadinessRegistry {
    gates: Vec<Gate>,
    checks: Vec<ReadinessCheck>,
}

/// The readiness part of a coordinator: its policy, gates and checks.
pub(crate) struct ReadinessState {
    policy: ReadinessWhileDraining,
    registry: Mutex<ReadinessRegistry>,
    /// The kubelet terminates this Pod without a deletion (node shutdown, node-pressure
    /// eviction; feature `kube`): no `terminating` condition will take it out of its slices,
    /// only its readiness probe can, so under `Auto` kubelet's probe too sees "not ready"
    /// while draining.
    kubelet_terminates: std::sync::atomic::AtomicBool,
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
            registry: Mutex::new(ReadinessRegistry::default()),
            kubelet_terminates: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The kubelet terminates this Pod without a deletion; `true` the first time, when that
    /// changes what kubelet's probe sees (the policy is `Auto`).
    #[cfg(feature = "kube")]
    pub(crate) fn kubelet_terminates(&self) -> bool {
        let first = !self
            .kubelet_terminates
            .swap(true, std::sync::atomic::Ordering::Relaxed);
        first && self.policy == ReadinessWhileDraining::Auto
    }

    /// The policy as it applies now: `Auto` answers every caller as `NotReady` once the
    /// kubelet terminates the Pod without a deletion (kube-proxy's fallback to terminating
    /// endpoints, what `Auto` keeps kubelet's probe green for, does not apply to an endpoint
    /// that is not terminating).
    fn effective(&self) -> ReadinessWhileDraining {
        if self.policy == ReadinessWhileDraining::Auto
            && self
                .kubelet_terminates
                .load(std::sync::atomic::Ordering::Relaxed)
        {
            ReadinessWhileDraining::NotReady
        } else {
            self.policy
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ReadinessRegistry> {
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
        self.lock().checks.push(ReadinessCheck { name, f });
    }

    /// Which semantics applied and why, for the `drain` line: under `auto`, by whom it asks.
    fn why(&self, policy: ReadinessWhileDraining, who: &str) -> String {
        if policy == ReadinessWhileDraining::Auto {
            format!("policy auto, {who}")
        } else if policy != self.policy {
            "policy auto, every caller: the kubelet terminates this Pod without a deletion, \
             so only its readiness probe takes it out of its EndpointSlices"
                .to_owned()
        } else {
            format!("policy {}", policy.as_str())
        }
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
        let policy = self.effective();
        // While Starting the gates decide; from then on the one rule.
        let phase_ready = phase == Phase::Starting || ready_in(phase, policy, caller);
        let why = self.why(policy, who);
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
