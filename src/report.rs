//! The drain report: one JSON document that explains a drain after the fact.
//!
//! Field names are an interface: tools parse them. They only grow (new optional fields); they
//! are not renamed.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

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
    /// A second signal, a SIGQUIT that is not the stop signal or
    /// [`Drain::force`](crate::Drain::force) asked to exit now, or the watchdog found the
    /// runtime starved at the hard deadline (see [`DrainReport::cause`]). Exit code 1.
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
    /// This deletion's budget, when the Pod's `deletionGracePeriodSeconds` left less than
    /// `grace_ms` (feature `kube`): the deadlines the drain kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion: Option<crate::DeletionBudget>,
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
            deletion: None,
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
    /// The evidence the commit went on, with its numbers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<crate::EvidenceReport>,
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
    /// The same requests by the route they took, from the `x-traffic-path` request header
    /// (the rollout probe sets it; a proxy can too): which path still sent work after the
    /// drain started. At most 16 labels in order of first arrival, then `other`; empty when no
    /// request carried the header.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<PathCount>,
}

/// Requests after the drain started that came by one route (`x-traffic-path`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathCount {
    /// The label, or `other` past the first 16.
    pub path: String,
    /// Requests on connections opened after the drain started: this route still routed here.
    pub requests_on_new_connections: u64,
    /// Requests on connections opened before it.
    pub requests_on_reused_connections: u64,
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
    /// The timeouts of this process's own accept loop, when it is [`serve`][serve-fn]:
    /// the one layer of the timeout chain the drain can see (advice
    /// `server_idle_timeout_short`).
    ///
    #[cfg_attr(feature = "http", doc = "[serve-fn]: crate::serve")]
    #[cfg_attr(not(feature = "http"), doc = "[serve-fn]: crate#feature-flags")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerReport>,
}

/// The accept loop's own timeouts (the report's `server`), recorded by
/// [`serve`][serve-fn] when it starts.
///
#[cfg_attr(feature = "http", doc = "[serve-fn]: crate::serve")]
#[cfg_attr(not(feature = "http"), doc = "[serve-fn]: crate#feature-flags")]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
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

    /// A short human summary, at most [`TERMINATION_LOG_LIMIT`] bytes, for
    /// `/dev/termination-log` (`kubectl describe pod` shows it).
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let trigger = self.trigger.map_or("none", Trigger::as_str);
        if let Some(c) = &self.cause {
            let _ = writeln!(s, "forced: {c}");
        }
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
        if let Some(p) = &self.proxy_label {
            let _ = writeln!(s, "measured through: {p}");
        }
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
            if let Some(n) = e.count {
                let _ = write!(line, " count={n}");
            }
            if let Some(c) = e.code {
                let _ = write!(line, " code={c}");
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

/// How long a stderr write may take before it is given up: a log pipe nobody reads must not
/// keep the process from exiting.
pub(crate) const STDERR_WAIT: Duration = Duration::from_secs(1);

/// Set once a stderr write was given up: later writes are skipped instead of piling up threads
/// behind the same stalled pipe.
static STDERR_STALLED: AtomicBool = AtomicBool::new(false);

/// Writes `text` to stderr from a plain thread and waits at most `wait` for it. A reader that
/// stalls the pipe leaves that thread blocked (the process exits past it), not the caller.
pub(crate) fn stderr_bounded(text: String, wait: Duration) -> Result<(), String> {
    // Relaxed: a stale `false` only costs one more bounded attempt.
    if STDERR_STALLED.load(Ordering::Relaxed) {
        return Err("stderr: skipped, an earlier write stalled".to_owned());
    }
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let spawned = std::thread::Builder::new()
        .name("lameduck-stderr".to_owned())
        .spawn(move || {
            let mut err = std::io::stderr().lock();
            let r = err.write_all(text.as_bytes()).and_then(|()| err.flush());
            let _ = tx.send(r);
        });
    if let Err(e) = spawned {
        return Err(format!("stderr: cannot start the writer thread: {e}"));
    }
    match rx.recv_timeout(wait) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("stderr: {e}")),
        Err(_) => {
            STDERR_STALLED.store(true, Ordering::Relaxed);
            Err(format!(
                "stderr: the write did not finish within {} ms (is the log reader stalled?)",
                wait.as_millis()
            ))
        }
    }
}

/// What one emission of the report achieved.
#[derive(Debug, Default)]
pub(crate) struct Emitted {
    /// The report file could not be written (its error message).
    pub(crate) file_failed: bool,
    /// Every failed sink, as `sink: why`.
    pub(crate) errors: Vec<String>,
}

/// Where the report goes when the drain ends.
///
/// Order: the file first (atomically), then the termination log, then stderr from a plain
/// thread with a bounded wait. Nothing here can block for longer than the file system takes
/// plus [`STDERR_WAIT`].
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
    /// Writes the report to every sink; `stderr` says whether this emission includes the
    /// stderr line (the last emission does). Failures are said on stderr (best effort,
    /// bounded) and returned.
    ///
    /// Nothing here goes through tracing: a subscriber may write synchronously to the very
    /// stderr that stalls (the driver logs the report itself, before calling this).
    pub(crate) fn emit(&self, report: &DrainReport, stderr: bool) -> Emitted {
        let json = report.to_json();
        let mut out = Emitted::default();
        if let Some(path) = &self.file {
            if let Err(e) = write_report_file(path, &format!("{json}\n")) {
                out.file_failed = true;
                out.errors.push(format!(
                    "report file {}: {e}; fix the path or the volume given to report_file",
                    path.display()
                ));
            }
        }
        if let Some(path) = &self.termination_log {
            if let Err(e) = write_termination_log(path, &report.summary()) {
                out.errors
                    .push(format!("termination log {}: {e}", path.display()));
            }
        }
        let mut text = String::new();
        if stderr && self.stderr {
            text.push_str(&json);
            text.push('\n');
        }
        for e in &out.errors {
            let _ = writeln!(text, "lameduck: cannot write the drain report: {e}");
        }
        if !text.is_empty() {
            if let Err(e) = stderr_bounded(text, STDERR_WAIT) {
                // The file is the durable sink: rewrite it so it names the stalled stderr.
                if let (Some(path), false) = (&self.file, out.file_failed) {
                    let mut r = report.clone();
                    r.sink_errors.push(e.clone());
                    let _ = write_report_file(path, &format!("{}\n", r.to_json()));
                }
                out.errors.push(e);
            }
        }
        out
    }
}

/// The report as one INFO tracing event (target `lameduck::report`).
pub(crate) fn log_report(report: &DrainReport, json: &str) {
    tracing::info!(
        target: "lameduck::report",
        outcome = report.outcome.as_str(),
        exit_code = report.exit_code,
        used_ms = report.budget.used_ms,
        report = %json,
        "lameduck: drain report"
    );
}

/// Replaces the report file atomically: a temporary file in the same directory is written,
/// synced and renamed over the target, then the directory is synced. A crash at any moment
/// leaves the previous report or the new one, never a truncated file.
///
/// A target that exists and is not a regular file (`/dev/stdout`, a FIFO, `/dev/full`) is
/// written in place: renaming over a device would replace it.
fn write_report_file(path: &Path, contents: &str) -> std::io::Result<()> {
    use std::fs;
    if let Ok(meta) = fs::metadata(path) {
        if !meta.is_file() {
            let mut f = fs::OpenOptions::new().write(true).open(path)?;
            f.write_all(contents.as_bytes())?;
            return f.flush();
        }
    }
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "the path names no file")
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = dir.join(tmp_name);
    let written = (|| {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        f.write_all(contents.as_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    // The rename is durable once the directory is synced; some file systems cannot sync a
    // directory, and the report is in place either way.
    if let Ok(d) = fs::File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Writes the summary to the termination log if the path exists. Kubernetes creates
/// `/dev/termination-log` (a bind mount: written in place, it cannot be renamed over);
/// elsewhere it is missing and this is quiet.
fn write_termination_log(path: &Path, summary: &str) -> std::io::Result<()> {
    let open = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path);
    match open {
        Ok(mut f) => f.write_all(summary.as_bytes()),
        // Outside Kubernetes the file is missing: nothing to write, nothing failed.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_file_is_replaced_whole_and_leaves_no_temporary_file() {
        let dir = std::env::temp_dir().join(format!("lameduck-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("report.json");
        std::fs::write(&path, "previous\n").unwrap();
        write_report_file(&path, "new\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new\n");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [std::ffi::OsString::from("report.json")]);
        let err = write_report_file(&dir.join("missing").join("r.json"), "x").unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
