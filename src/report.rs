//! The drain report: one JSON document that explains a drain after the fact.
//!
//! Field names are an interface: tools parse them. They only grow (new optional fields); they
//! are not renamed.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::closers::CloserResult;
use crate::phase::{Event, EventKind, Trigger};
use crate::tasks::TaskEnd;
use crate::ReadinessWhileDraining;

/// Kubernetes keeps at most this many bytes of a container's termination message.
pub const TERMINATION_LOG_LIMIT: usize = 4096;

/// How the drain ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Everything finished inside the budget and every closer succeeded. Exit code 0.
    Clean,
    /// The quiesce deadline cut stragglers. Exit code 1.
    DeadlineExceeded,
    /// A closer failed, panicked or timed out. Exit code 1.
    CloserFailed,
    /// A second SIGINT, a SIGQUIT or [`Drain::force`](crate::Drain::force) asked to exit now.
    /// Exit code 1.
    Forced,
}

impl Outcome {
    /// The outcome's name as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Clean => "clean",
            Outcome::DeadlineExceeded => "deadline_exceeded",
            Outcome::CloserFailed => "closer_failed",
            Outcome::Forced => "forced",
        }
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
pub struct BudgetReport {
    /// The grace period (`terminationGracePeriodSeconds`), in milliseconds.
    pub grace_ms: u64,
    /// Time from the first trigger to the end of the drain, in milliseconds.
    pub used_ms: u64,
    /// `grace_ms − used_ms` (0 if overrun).
    pub remaining_ms: u64,
    /// The quiesce deadline, in milliseconds after the trigger.
    #[serde(default)]
    pub quiesce_ms: u64,
    /// The time reserved for closers, in milliseconds.
    #[serde(default)]
    pub close_budget_ms: u64,
}

impl BudgetReport {
    pub(crate) fn new(budget: &crate::Budget, used: std::time::Duration) -> Self {
        let grace = budget.grace_period;
        Self {
            grace_ms: grace.as_millis() as u64,
            used_ms: used.as_millis() as u64,
            remaining_ms: grace.saturating_sub(used).as_millis() as u64,
            quiesce_ms: budget.quiesce_deadline().as_millis() as u64,
            close_budget_ms: budget.close_budget.as_millis() as u64,
        }
    }
}

/// The propagation policy that was in force, in milliseconds after the trigger.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyReport {
    /// `quiet` or `fixed`.
    pub kind: String,
    /// The quiet window (quiet policy only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quiet_ms: Option<u64>,
    /// The earliest commit (for `fixed`, the delay).
    pub min_ms: u64,
    /// The latest commit (for `fixed`, the delay).
    pub max_ms: u64,
}

/// New connections from one peer address after the drain started.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerCount {
    /// The peer's IP address.
    pub peer: String,
    /// How many new connections it opened after the drain started.
    pub new_connections: u64,
}

/// What arrived after the drain started (the readiness flip, under the default policy). This is
/// the observed propagation: it says what reached *this* process, through whatever paths
/// reached it, and nothing about other proxies.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AfterFlipReport {
    /// Connections accepted after the drain started.
    pub new_connections: u64,
    /// Requests that arrived on those new connections.
    pub requests_on_new_connections: u64,
    /// Requests that arrived on connections opened before the drain (pooled keep-alive).
    pub requests_on_reused_connections: u64,
    /// When the last new connection arrived, in milliseconds after the drain started; `None` if
    /// none arrived.
    pub last_new_connection_ms: Option<u64>,
    /// Peers by number of new connections, most first (at most 10).
    pub peers: Vec<PeerCount>,
}

/// Work still running at the quiesce deadline.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Straggler {
    /// `request`, `task`, or `response` (a connection of `lameduck::serve` whose response
    /// bytes were still waiting for the peer to read them).
    pub kind: String,
    /// For a request `METHOD /path`; for a task its name; for a response the peer and the
    /// bytes written on its connection so far.
    pub name: String,
    /// Age at the deadline, in milliseconds (for requests that started before the drain and
    /// were described late, a lower bound: the drain's age).
    pub age_ms: u64,
    /// The peer address, for requests whose connection is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// For tasks with a recovery action: `ok`, `error: …`, `panicked`, `timed_out`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<String>,
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
pub struct DrainReport {
    /// How the drain ended.
    pub outcome: Outcome,
    /// The first trigger.
    pub trigger: Option<Trigger>,
    /// The exit code the process should end with: 0 clean, 1 otherwise.
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
    /// Work still running at the quiesce deadline.
    pub stragglers: Vec<Straggler>,
    /// Background tasks that panicked or were aborted.
    pub tasks: Vec<TaskEnd>,
    /// Closers, in the order they ran.
    pub closers: Vec<CloserResult>,
    /// Pod identity, when the downward-API variables are set.
    pub pod: PodInfo,
    /// Advice computed only from what this drain measured, most important first.
    #[serde(default)]
    pub advice: Vec<crate::Advice>,
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

    /// A short human summary, at most [`TERMINATION_LOG_LIMIT`] bytes, for
    /// `/dev/termination-log` (`kubectl describe pod` shows it).
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let trigger = self.trigger.map_or("none", Trigger::as_str);
        if let Some(a) = self.advice.first() {
            let _ = writeln!(s, "{}: {}", a.level.as_str(), a.message);
        }
        let _ = writeln!(
            s,
            "lameduck drain {} (exit {}), trigger {}, {} ms of {} ms grace used",
            self.outcome.as_str(),
            self.exit_code,
            trigger,
            self.budget.used_ms,
            self.budget.grace_ms
        );
        let af = &self.after_flip;
        let _ = writeln!(
            s,
            "after drain start: {} new connections (last at {}), {} requests on new, {} on reused connections",
            af.new_connections,
            af.last_new_connection_ms
                .map_or_else(|| "-".to_owned(), |ms| format!("{ms} ms")),
            af.requests_on_new_connections,
            af.requests_on_reused_connections
        );
        for e in &self.timeline {
            let mut line = format!("{:>7} ms {}", e.at_ms, e.event);
            if let Some(t) = e.trigger {
                let _ = write!(line, " trigger={t}");
            }
            if let Some(r) = e.reason {
                let _ = write!(line, " reason={}", r.as_str());
            }
            if let Some(n) = &e.name {
                let _ = write!(line, " name={n}");
            }
            if let Some(d) = &e.detail {
                let _ = write!(line, " {d}");
            }
            let _ = writeln!(s, "{line}");
        }
        for st in &self.stragglers {
            let _ = writeln!(s, "straggler {} {} age {} ms", st.kind, st.name, st.age_ms);
        }
        for c in &self.closers {
            let _ = writeln!(s, "closer {} {} in {} ms", c.name, c.result, c.took_ms);
        }
        for t in &self.tasks {
            let _ = writeln!(s, "task {} {} after {} ms", t.name, t.result, t.ran_ms);
        }
        truncate_utf8(s, TERMINATION_LOG_LIMIT)
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

/// Cuts `s` to at most `limit` bytes on a character boundary, marking the cut.
pub(crate) fn truncate_utf8(mut s: String, limit: usize) -> String {
    if s.len() <= limit {
        return s;
    }
    const MARK: &str = "\n…(truncated)\n";
    let mut cut = limit - MARK.len();
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s.truncate(cut);
    s.push_str(MARK);
    s
}

/// Where the report goes when the drain ends.
#[derive(Clone, Debug)]
pub(crate) struct Sinks {
    pub(crate) stderr: bool,
    pub(crate) file: Option<std::path::PathBuf>,
    pub(crate) termination_log: Option<std::path::PathBuf>,
}

impl Default for Sinks {
    fn default() -> Self {
        Self {
            stderr: true,
            file: None,
            termination_log: Some("/dev/termination-log".into()),
        }
    }
}

impl Sinks {
    pub(crate) fn emit(&self, report: &DrainReport) {
        let json = report.to_json();
        tracing::info!(
            target: "lameduck::report",
            outcome = report.outcome.as_str(),
            exit_code = report.exit_code,
            used_ms = report.budget.used_ms,
            report = %json,
            "lameduck: drain report"
        );
        if self.stderr {
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "{json}");
        }
        if let Some(path) = &self.file {
            if let Err(e) = std::fs::write(path, format!("{json}\n")) {
                tracing::warn!(path = %path.display(), error = %e, "lameduck: cannot write the report file");
            }
        }
        if let Some(path) = &self.termination_log {
            write_termination_log(path, &report.summary());
        }
    }
}

/// Writes the summary to the termination log if the path exists and is writable. Kubernetes
/// creates `/dev/termination-log`; elsewhere it is missing and this is quiet. Never an error.
fn write_termination_log(path: &Path, summary: &str) {
    let open = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path);
    match open {
        Ok(mut f) => {
            if let Err(e) = f.write_all(summary.as_bytes()) {
                tracing::warn!(path = %path.display(), error = %e, "lameduck: cannot write the termination log");
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::debug!(path = %path.display(), "lameduck: no termination log at this path");
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "lameduck: cannot open the termination log");
        }
    }
}
