//! `lameduck-probe check`: start a service, stop it the way kubelet does, and judge its
//! shutdown against named contracts.
//!
//! The run, on one clock:
//!
//! 1. start the command (optionally as PID 1 of a new PID namespace, as in a container) and
//!    poll the readiness URL until it answers 200;
//! 2. send short, slow and streaming requests over kept and fresh connections (the probe's
//!    own runner, bounded by its in-flight cap) for `warmup`, while polling readiness and
//!    liveness like kubelet;
//! 3. at `t+0` — the Pod's deletion — run the `preStop` hook (httpGet, exec or sleep), then
//!    send the stop signal to the process, as kubelet asks the runtime to. The service is
//!    judged from when it was told: at `t+0` after httpGet, at the signal after sleep, and
//!    after exec from what the service shows (its report's trigger and drain start, else its
//!    first changed answer before the signal; nothing shown, the signal);
//! 4. keep sending through the drain window (the proxies that have not caught up yet), then
//!    stop sending new requests and wait for the running ones;
//! 5. SIGKILL at `t+grace` if the process is still there;
//! 6. judge: `startup`, `readiness`, `liveness`, `stop_signal`, `listener_open`,
//!    `in_flight`, `keepalive_close`, `exit`, `report` — each PASS, FAIL, WARN or NOT
//!    MEASURED, with its evidence;
//! 7. SIGKILL whatever the command left behind: its process group, and every process that
//!    carries the run's `LAMEDUCK_PROBE_CHECK` environment cookie (a daemon that left the
//!    group with `setsid`).
//!
//! Nothing here depends on the service using lameduck. The `report` contract is judged only
//! where a lameduck drain report is expected: one was found, `--report-file` or
//! `--expect-report` was given, or the answers carried `x-lameduck-phase`; elsewhere it is
//! left out, with a note saying so.
//!
//! Every read is bounded in bytes and time: probe and `preStop` bodies, the
//! service's output lines (and what is kept of them, counted after the conversion to text),
//! the report file (a regular file, at most
//! [`MAX_REPORT_FILE`] bytes; a FIFO or a device is not read).

mod cli;
mod contracts;
mod http;
mod output;
mod process;
mod run;

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};

pub use cli::{check_usage, parse_check};
pub use contracts::{Contract, Verdict};
pub use output::junit_error;
pub use process::{Disposition, ExitView};
pub use run::run_check;

use crate::config::{ConnectionMode, HttpVersion, ProbeConfig};
use crate::record::Record;
use contracts::ReportFacts;

/// How often readiness and liveness are polled.
const POLL_EVERY: Duration = Duration::from_millis(100);
/// Limit for one poll.
const POLL_TIMEOUT: Duration = Duration::from_secs(1);
/// Polls kept per URL at most (10 minutes at the poll rate).
const MAX_POLLS: usize = 6_000;
/// After the exit, how long requests still running get before the run is cut.
const AFTER_EXIT: Duration = Duration::from_secs(3);
/// The default traffic before the stop: past the 15 s a lameduck service observes before it
/// judges its traffic by evidence, so a default run drains as a Pod that served a while does
/// (a younger one waits to `max`, and the run says so in a note).
pub const DEFAULT_WARMUP: Duration = Duration::from_secs(16);
/// The largest `--report-file` read; a drain report is a few kilobytes.
pub const MAX_REPORT_FILE: u64 = 4 * 1024 * 1024;

/// The `preStop` hook to run before the stop signal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PreStop {
    /// `httpGet`: GET this URL; any answer ends the hook (kubelet ignores the status).
    Http(String),
    /// `exec`: run this command with `sh -c`.
    Exec(String),
    /// `sleep`: wait this long.
    Sleep(Duration),
}

/// How an httpGet or exec hook ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HookEnd {
    /// httpGet: the status of the answer.
    Answered(u16),
    /// httpGet: no answer (connect, handshake, timeout); exec: could not wait for it.
    NoAnswer(String),
    /// exec: its exit code (`None`: killed by a signal).
    Exited(Option<i32>),
    /// Still running when the grace period ended.
    OutOfTime,
}

/// The hook as the judge sees it: its kind, how it ended and when (ms since the Unix epoch).
#[derive(Debug, Clone)]
pub(crate) struct HookSeen {
    kind: &'static str,
    ended: HookEnd,
    at: f64,
}

/// What `/readyz` (the readiness URL) should do once the service is told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpectReadiness {
    /// Turn not-ready (the default: load balancers that probe the Pod stop sending).
    Flip,
    /// Stay 200 through the drain window (kubelet's view under lameduck's `auto` policy, or
    /// `serving-until-stop`).
    Serving,
}

/// A `check` run, as the command line describes it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct CheckArgs {
    /// The command and its arguments (after `--`).
    pub command: Vec<String>,
    /// Start it as PID 1 of a new PID namespace.
    pub pid_namespace: bool,
    /// The readiness URL.
    pub ready_url: String,
    /// The liveness URL, if any.
    pub live_url: Option<String>,
    /// Headers sent with readiness and liveness polls (a probe's `httpHeaders`).
    pub probe_headers: Vec<(String, String)>,
    /// What readiness should do after the stop.
    pub expect_readiness: ExpectReadiness,
    /// The `preStop` hook.
    pub prestop: Option<PreStop>,
    /// The stop signal (`SIGTERM` unless the image says otherwise).
    pub stop_signal: String,
    /// `terminationGracePeriodSeconds`.
    pub grace_period: Duration,
    /// A shorter budget (node shutdown, eviction): SIGKILL this long after the stop.
    pub kill_after: Option<Duration>,
    /// How long the service may take to turn ready.
    pub startup_timeout: Duration,
    /// Traffic before the stop.
    pub warmup: Duration,
    /// How long after the stop new connections still arrive (proxies catching up).
    pub drain_window: Duration,
    /// Where the service writes its lameduck drain report (else its stderr is searched).
    /// Given, a report is expected.
    pub report_file: Option<PathBuf>,
    /// A lameduck drain report is expected: its absence fails the `report` contract.
    pub expect_report: bool,
    /// NOT MEASURED fails the run too (else only FAIL and WARN do).
    pub strict: bool,
    /// The traffic: target, rates, paths, HTTP version, connections. `duration` and
    /// `drain_wait` are set by the run.
    pub traffic: ProbeConfig,
    /// `--json FILE`.
    pub json: Option<PathBuf>,
    /// `--junit FILE`.
    pub junit: Option<PathBuf>,
}

impl CheckArgs {
    /// How long after the stop the SIGKILL comes: `--kill-after`, else the grace period.
    pub fn kill_budget(&self) -> Duration {
        self.kill_after.unwrap_or(self.grace_period)
    }
}

/// One readiness or liveness poll.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Poll {
    /// When it was sent, ms since the Unix epoch.
    pub start: f64,
    /// When it ended.
    pub end: f64,
    /// The status, when one came.
    pub status: Option<u16>,
    /// Why none came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Poll {
    fn answer(&self) -> String {
        match (self.status, &self.error) {
            (Some(s), _) => s.to_string(),
            (None, Some(e)) => format!("no answer ({e})"),
            (None, None) => "no answer".to_owned(),
        }
    }
}

/// Everything the run saw, for the judge.
#[derive(Debug)]
pub(crate) struct Observed {
    ready_url: String,
    live_url: Option<String>,
    ready_after: Option<f64>,
    startup_error: Option<String>,
    /// The stop (`t+0`), ms since the Unix epoch.
    t0: Option<f64>,
    /// When the service could first know: the hook's start for httpGet, when an exec hook
    /// told it (if it did), else the signal.
    told_at: Option<f64>,
    /// An exec hook ran at `t+0`: whether and when it told the service is settled from what
    /// the service did once the run is over (until then `told_at` is the signal).
    exec_hook: bool,
    signal_at: Option<f64>,
    signal_name: String,
    signal_number: i32,
    target_pid: u32,
    disposition: Result<Disposition, String>,
    exit: Option<ExitView>,
    exited_at: Option<f64>,
    /// When the SIGKILL comes, from the stop: the grace period, or `--kill-after`.
    grace_ms: f64,
    /// What `grace_ms` is, for messages: "grace period" or "--kill-after budget".
    kill_name: &'static str,
    drain_window_ms: f64,
    http: HttpVersion,
    ready_polls: Vec<Poll>,
    live_polls: Vec<Poll>,
    records: Vec<Record>,
    report: Option<ReportFacts>,
    /// Why a lameduck report is expected, when one is.
    report_expected: Option<String>,
    /// Why `--report-file` gave no report (unreadable, or no report in it), when it gave none.
    report_unread: Option<String>,
    /// An httpGet or exec preStop hook, how it ended.
    hook: Option<HookSeen>,
    /// The kinds of request left out before the run (a default path the service lacks).
    preflight: Vec<String>,
}

/// What a `check` produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CheckReport {
    /// The command checked.
    pub command: Vec<String>,
    /// Whether it ran as PID 1 of a new PID namespace.
    pub pid_namespace: bool,
    /// When the check started, ms since the Unix epoch.
    pub started_unix_ms: f64,
    /// The stop (`t+0` in the evidence), ms since the Unix epoch.
    pub stop_unix_ms: Option<f64>,
    /// The `preStop` hook and how it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prestop: Option<String>,
    /// When the stop signal was sent, ms since the Unix epoch.
    pub signal_unix_ms: Option<f64>,
    /// How the process ended.
    pub exit: Option<ExitView>,
    /// When it ended, ms since the Unix epoch.
    pub exit_unix_ms: Option<f64>,
    /// The contracts, in order (`report` only where a lameduck report is expected).
    pub contracts: Vec<Contract>,
    /// `--strict`: NOT MEASURED counts as a failure.
    #[serde(default)]
    pub strict: bool,
    /// What the run noticed beside the contracts: a contract left out and why, a drain that
    /// waited to `max` because the process was young, processes killed after the exit.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Requests sent.
    pub requests: usize,
    /// The last lines the service wrote to stderr (at most 20, each cut at 2 KiB).
    pub stderr_tail: Vec<String>,
}

impl CheckReport {
    /// `true` when no contract failed: none FAIL or WARN, and with [`strict`](Self::strict)
    /// none NOT MEASURED. The exit code is 0 only then, and the JUnit file counts a failure
    /// for exactly the contracts that make it not 0.
    pub fn passed(&self) -> bool {
        self.contracts.iter().all(|c| !self.fails(c.verdict))
    }

    /// `true` when `verdict` fails the run.
    pub fn fails(&self, verdict: Verdict) -> bool {
        match verdict {
            Verdict::Pass => false,
            Verdict::Fail | Verdict::Warn => true,
            Verdict::NotMeasured => self.strict,
        }
    }

    /// The contract named `name`.
    pub fn contract(&self, name: &str) -> Option<&Contract> {
        self.contracts.iter().find(|c| c.name == name)
    }
}

/// Why a check could not run at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckError {
    message: String,
}

impl std::fmt::Display for CheckError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CheckError {}

fn error(message: impl Into<String>) -> CheckError {
    CheckError {
        message: message.into(),
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

pub(crate) fn signal_of(name: &str) -> Result<Signal, String> {
    let upper = name.trim().to_ascii_uppercase();
    let full = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    full.parse::<Signal>()
        .map_err(|_| format!("{name:?} is not a signal name (e.g. TERM, INT, QUIT)"))
}

/// The check defaults for traffic: more slow requests than a rollout probe, a stream a
/// second, kept and fresh connections alternating.
pub(crate) fn default_traffic() -> ProbeConfig {
    let mut c = ProbeConfig::new("");
    c.short_rate = 20.0;
    c.slow_rate = 4.0;
    c.slow = Duration::from_millis(1500);
    c.stream_rate = 1.0;
    c.stream = Duration::from_secs(2);
    c.connections = ConnectionMode::Mixed;
    c.label = "check".to_owned();
    c
}
