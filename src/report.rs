//! The parts of the drain report: the types its fields hold.
//!
//! A [`DrainReport`] is one JSON document that explains a drain after the fact. The crate root
//! keeps [`DrainReport`] (also here); this module holds what it is made of — the budget as
//! spent, the outcome, the propagation policy and its evidence, the stragglers, tasks, closers
//! and recovery actions, the probe callers, the traffic after the flip and the advice.
//!
//! Field names are an interface: tools parse them. They only grow (new optional fields); they
//! are not renamed.

use serde::{Deserialize, Serialize};

use crate::vocab::phase::{Event, EventKind, ReadinessWhileDraining, Trigger};

mod advice;
mod after_flip;
mod endpoint_slice;
mod evidence;
mod probes;
mod results;
pub(crate) mod rules;
mod sinks;
mod summary;
mod work;

pub use advice::{Advice, AdviceLevel, AdviceRule};
pub use after_flip::{AfterFlipReport, PathCount, PeerCount};
pub use endpoint_slice::{
    AllowanceSource, BudgetSource, DeletionBudget, EndpointSliceEvidence, PeerDelay,
    StartupMeasurement,
};
pub use evidence::{
    EvidenceKind, EvidenceReport, MaxReason, NodeConfirmation, PathEvidence, PathRouting,
    SilenceRule, WeakEvidence,
};
pub use probes::{ProbeClass, ProbeSource, ProbeSources};
pub use results::{ActionResult, CloserResult, TaskEnd, TaskResult};
pub use work::{InFlightHold, Straggler, StragglerCounts, StragglerKind};

pub(crate) mod evidence_json;

pub(crate) use sinks::{log_report, stderr_bounded, Emitted, Sinks, STDERR_WAIT};

/// Kubernetes keeps at most this many bytes of a container's termination message.
pub const TERMINATION_LOG_LIMIT: usize = 4096;

/// How the drain ended.
///
/// In JSON: `clean`, `deadline_exceeded`, `closer_failed`, `forced`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Outcome {
    /// Everything finished inside the budget and every closer succeeded. Exit code 0.
    Clean,
    /// The quiesce deadline cut stragglers. Exit code 1 — also when every cut task's recovery
    /// action reported `ok`: its work was handed back, but it did not end inside the budget,
    /// and the next drain will cut it again (the `tasks_cut` advice says what to change).
    DeadlineExceeded,
    /// A closer failed, panicked or timed out. Exit code 1.
    CloserFailed,
    /// A second signal, a SIGQUIT that is not the stop signal or
    /// [`Drain::force`](crate::Drain::force) asked to exit now, or the watchdog found the
    /// runtime starved at the hard deadline (see [`DrainReport::cause`]). Exit code 1.
    Forced,
}

impl Outcome {
    /// The outcome's name as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        crate::vocab::names::of(&self)
    }

    /// `0` for [`Outcome::Clean`], `1` otherwise.
    pub fn exit_code(self) -> i32 {
        match self {
            Outcome::Clean => 0,
            _ => 1,
        }
    }
}

/// The budget as spent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct BudgetReport {
    /// The grace period (`terminationGracePeriodSeconds`), in milliseconds.
    pub grace_ms: u64,
    /// Time from the first trigger to the exit, in milliseconds (to `done` in a report read
    /// before the exit): a process that waits for its stop signal after a `preStop` drain
    /// uses its grace until it exits.
    pub used_ms: u64,
    /// `grace_ms − used_ms` (0 if overrun); with a shorter budget (`deletion`), what was left
    /// until its kill (`deletion.kill_at_ms − used_ms`).
    pub remaining_ms: u64,
    /// The quiesce deadline, in milliseconds after the trigger.
    #[serde(default)]
    pub quiesce_ms: u64,
    /// The time reserved for closers, in milliseconds.
    #[serde(default)]
    pub close_budget_ms: u64,
    /// The budget the drain kept when something gave it less than `grace_ms` — the Pod's
    /// deletion, the kubelet's own termination, the configured shortest grace — and what
    /// ([`DeletionBudget::source`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion: Option<DeletionBudget>,
}

/// Which propagation policy was in force: [`PolicyReport::kind`].
///
/// In JSON: `quiet`, `fixed`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum PolicyKind {
    /// The quiet window weighed by evidence ([`Propagation::quiet`](crate::Propagation::quiet)).
    #[default]
    Quiet,
    /// A fixed delay ([`Propagation::fixed`](crate::Propagation::fixed)).
    Fixed,
}

impl PolicyKind {
    /// The name as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        crate::vocab::names::of(&self)
    }
}

/// The propagation policy that was in force, in milliseconds after the trigger.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PolicyReport {
    /// `quiet` or `fixed`.
    pub kind: PolicyKind,
    /// The quiet window (quiet policy only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quiet_ms: Option<u64>,
    /// The earliest commit (for `fixed`, the delay).
    pub min_ms: u64,
    /// The latest commit (for `fixed`, the delay).
    pub max_ms: u64,
    /// The evidence the commit went on, with its numbers. A `fixed` policy reads none: its
    /// evidence is only `kind`, `silence_ms` and, when a started `EndpointWatch` failed,
    /// `endpoint_slice_unused`; the rest is left out of the JSON.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "evidence_json"
    )]
    pub evidence: Option<EvidenceReport>,
}

/// When the signal that started the drain was received, and when the runtime noticed it.
///
/// Signals are received on a plain thread, so the first time is right even when every runtime
/// worker is blocked; the budget counts from it. A large `notice_delay_ms` means the runtime
/// was starved (blocking code on its workers).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalReceipt {
    /// When the signal was received (the budget's origin), milliseconds since the Unix epoch.
    pub received_unix_ms: u64,
    /// When the runtime first ran the drain's driver; `None` if it never did (a report written
    /// by the watchdog).
    pub noticed_unix_ms: Option<u64>,
    /// `noticed − received`, in milliseconds.
    pub notice_delay_ms: Option<u64>,
}

/// How long [`Drain::run`](crate::Drain::run) waited for the stop signal after a drain that a
/// `preStop` hook started had finished.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopSignalWait {
    /// Milliseconds from the end of the drain to the stop signal (or to giving up).
    pub waited_ms: u64,
    /// `false` when the wait ended at the hard deadline without the stop signal.
    pub arrived: bool,
}

/// Pod identity from the downward API (`POD_NAME`, `POD_NAMESPACE`, `POD_UID`, `POD_IP`), each
/// present only when its variable is set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodInfo {
    /// `POD_NAME`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `POD_NAMESPACE`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// `POD_UID`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// `POD_IP`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
}

impl PodInfo {
    /// Reads the downward-API variables from the environment.
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Self {
            name: var("POD_NAME"),
            namespace: var("POD_NAMESPACE"),
            uid: var("POD_UID"),
            ip: var("POD_IP"),
        }
    }
}

/// The report of one drain: emitted when the drain ends, returned by
/// [`Drain::run`](crate::Drain::run) and [`Drain::drained`](crate::Drain::drained).
///
/// # JSON
///
/// ```json
/// {"outcome":"clean","trigger":"sigterm","exit_code":0,"readiness_policy":"not_ready",
///  "budget":{"grace_ms":30000,"used_ms":2310,"remaining_ms":27690},
///  "timeline":[{"event":"drain_started","at_ms":0,"unix_ms":1764477000000,"trigger":"sigterm"}, …],
///  "after_flip":{"new_connections":3,"requests_on_new_connections":3,
///                "requests_on_reused_connections":40,"last_new_connection_ms":812,
///                "peers":[{"peer":"10.0.0.7","new_connections":3}]},
///  "stragglers":[],"tasks":[],"closers":[{"name":"postgres","took_ms":12,"result":"ok"}],
///  "pod":{"name":"web-7d9f","namespace":"shop"}}
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DrainReport {
    /// How the drain ended.
    pub outcome: Outcome,
    /// The first trigger.
    pub trigger: Option<Trigger>,
    /// The exit code the process should end with: 0 clean, 1 otherwise — and 1 when the
    /// report file could not be written (see `sink_errors`), since the evidence asked for is
    /// missing. A failed termination log or stderr write is recorded but changes no code.
    pub exit_code: i32,
    /// The readiness policy that was in force.
    pub readiness_policy: ReadinessWhileDraining,
    /// The budget as spent.
    pub budget: BudgetReport,
    /// The propagation policy in force.
    #[serde(default)]
    pub propagation: PolicyReport,
    /// Every lifecycle event, in order.
    pub timeline: Vec<Event>,
    /// What arrived after the drain started.
    pub after_flip: AfterFlipReport,
    /// Work still running at the quiesce deadline (or at a forced exit), the oldest
    /// [`Straggler::NAMED_PER_KIND`] of each kind; `straggler_counts` counts them all.
    pub stragglers: Vec<Straggler>,
    /// How many stragglers of each kind there were, named or not.
    #[serde(default)]
    pub straggler_counts: StragglerCounts,
    /// Background tasks that panicked or were aborted.
    pub tasks: Vec<TaskEnd>,
    /// Closers, in the order they ran.
    pub closers: Vec<CloserResult>,
    /// Pod identity, when the downward-API variables are set.
    pub pod: PodInfo,
    /// Advice computed only from what this drain measured, most important first.
    #[serde(default)]
    pub advice: Vec<Advice>,
    /// Why the drain was forced when the drain itself could not say: `runtime starved …` for
    /// a report written by the watchdog.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    /// Signal receipt against the runtime's notice, when a signal started the drain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal_receipt: Option<SignalReceipt>,
    /// The wait for the stop signal after a `preStop` drain, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_signal_wait: Option<StopSignalWait>,
    /// Report sinks that failed on an earlier write of this report (a report cannot hold the
    /// result of its own write).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sink_errors: Vec<String>,
    /// What stands between the clients and this process, as the operator named it
    /// ([`DrainBuilder::proxy_label`](crate::DrainBuilder::proxy_label), env
    /// `LAMEDUCK_PROXY_LABEL`): evidence about one proxy does not transfer to another, so the
    /// report says what it measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_label: Option<String>,
    /// The timeouts of this process's own accept loop, when it is `lameduck::serve`
    /// (feature `http`):
    /// the one layer of the timeout chain the drain can see (advice
    /// `server_idle_timeout_short`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerReport>,
    /// Who called `/readyz` and how each caller was classified — kubelet's probe, a load
    /// balancer, anyone else — with counts (bounded; see
    /// [`ReadinessWhileDraining::Auto`]): a mesh that rewrites kubelet's probe shows here.
    #[serde(default, skip_serializing_if = "ProbeSources::is_empty")]
    pub probe_sources: ProbeSources,
}

/// The accept loop's own timeouts (the report's `server`), recorded by
/// `lameduck::serve` (feature `http`) when it starts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ServerReport {
    /// How long an HTTP/1 connection may wait for a request head, idle keep-alive included
    /// (`Serve::header_read_timeout`); absent when unbounded (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header_read_timeout_ms: Option<u64>,
}

impl DrainReport {
    /// The first timeline event of this kind.
    pub fn event(&self, kind: EventKind) -> Option<&Event> {
        self.timeline.iter().find(|e| e.event == kind)
    }

    /// The report as one JSON line.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

/// Return the report from `main` to exit with its code *after* destructors ran — unlike
/// `std::process::exit`, which skips them (flush guards of tracing appenders and exporters
/// included).
///
/// # Examples
///
/// ```no_run
/// use lameduck::{Drain, DrainReport};
///
/// #[tokio::main]
/// async fn main() -> Result<DrainReport, Box<dyn std::error::Error>> {
///     let drain = Drain::builder().build()?;
///     // ... serve ...
///     Ok(drain.run().await) // exit code 0 when clean, 1 otherwise
/// }
/// ```
impl std::process::Termination for DrainReport {
    fn report(self) -> std::process::ExitCode {
        std::process::ExitCode::from(&self)
    }
}

/// The report's [`exit_code`](DrainReport::exit_code) as an [`ExitCode`](std::process::ExitCode).
impl From<&DrainReport> for std::process::ExitCode {
    fn from(report: &DrainReport) -> Self {
        // Codes are 0 or 1; anything outside a byte is a failure all the same.
        std::process::ExitCode::from(u8::try_from(report.exit_code).unwrap_or(1))
    }
}
