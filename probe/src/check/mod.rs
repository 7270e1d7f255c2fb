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
//!    send the stop signal to the process, as kubelet asks the runtime to;
//! 4. keep sending through the drain window (the proxies that have not caught up yet), then
//!    stop sending new requests and wait for the running ones;
//! 5. SIGKILL at `t+grace` if the process is still there;
//! 6. judge: `startup`, `readiness`, `liveness`, `stop_signal`, `listener_open`,
//!    `in_flight`, `keepalive_close`, `exit`, `report` — each PASS, FAIL, WARN or NOT
//!    MEASURED, with its evidence.
//!
//! Nothing here depends on the service using lameduck; the `report` contract reads a lameduck
//! drain report when there is one.

mod cli;
mod contracts;
mod http;
mod output;
mod process;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

pub use cli::{check_usage, parse_check};
pub use contracts::{Contract, Verdict};
pub use process::{Disposition, ExitView};

use crate::config::{ConnectionMode, HttpVersion, ProbeConfig};
use crate::record::Record;
use crate::runner::Probe;
use contracts::ReportFacts;
use http::Url;

/// How often readiness and liveness are polled.
const POLL_EVERY: Duration = Duration::from_millis(100);
/// Limit for one poll.
const POLL_TIMEOUT: Duration = Duration::from_secs(1);
/// Polls kept per URL at most (10 minutes at the poll rate).
const MAX_POLLS: usize = 6_000;
/// After the exit, how long requests still running get before the run is cut.
const AFTER_EXIT: Duration = Duration::from_secs(3);

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
    /// How long the service may take to turn ready.
    pub startup_timeout: Duration,
    /// Traffic before the stop.
    pub warmup: Duration,
    /// How long after the stop new connections still arrive (proxies catching up).
    pub drain_window: Duration,
    /// Where the service writes its lameduck drain report (else its stderr is searched).
    pub report_file: Option<PathBuf>,
    /// The traffic: target, rates, paths, HTTP version, connections. `duration` and
    /// `drain_wait` are set by the run.
    pub traffic: ProbeConfig,
    /// `--json FILE`.
    pub json: Option<PathBuf>,
    /// `--junit FILE`.
    pub junit: Option<PathBuf>,
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
    /// When the service could first know: the hook's start for httpGet/exec, else the signal.
    told_at: Option<f64>,
    signal_at: Option<f64>,
    signal_name: String,
    signal_number: i32,
    target_pid: u32,
    disposition: Result<Disposition, String>,
    exit: Option<ExitView>,
    exited_at: Option<f64>,
    grace_ms: f64,
    drain_window_ms: f64,
    http: HttpVersion,
    ready_polls: Vec<Poll>,
    live_polls: Vec<Poll>,
    records: Vec<Record>,
    report: Option<ReportFacts>,
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
    /// The contracts, in order.
    pub contracts: Vec<Contract>,
    /// Requests sent.
    pub requests: usize,
    /// The last lines the service wrote to stderr (at most 20).
    pub stderr_tail: Vec<String>,
}

impl CheckReport {
    /// `true` when every contract passed: the exit code is 0 only then.
    pub fn passed(&self) -> bool {
        self.contracts.iter().all(|c| c.verdict == Verdict::Pass)
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

/// Polls `url` every [`POLL_EVERY`] until `stop` turns `true`.
async fn poll_loop(
    url: Url,
    headers: Vec<(String, String)>,
    polls: Arc<Mutex<Vec<Poll>>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(POLL_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tick.tick() => {}
        }
        let start = unix_now();
        let result = http::get(&url, &headers, POLL_TIMEOUT).await;
        let poll = Poll {
            start,
            end: unix_now(),
            status: result.as_ref().ok().copied(),
            error: result.err(),
        };
        let mut polls = polls.lock().expect("polls lock");
        if polls.len() < MAX_POLLS {
            polls.push(poll);
        }
    }
}

/// Runs `args`' command through the whole stop and judges it.
///
/// # Errors
///
/// Bad URLs or signal names, or a command that cannot be started at all. A service that
/// starts and misbehaves is a report with failed contracts, not an error.
pub async fn run_check(args: &CheckArgs) -> Result<CheckReport, CheckError> {
    let ready_url = Url::parse(&args.ready_url).map_err(|e| error(format!("--ready: {e}")))?;
    let live_url = args
        .live_url
        .as_deref()
        .map(Url::parse)
        .transpose()
        .map_err(|e| error(format!("--live: {e}")))?;
    let sig = signal_of(&args.stop_signal).map_err(|e| error(format!("--stop-signal: {e}")))?;
    let prestop_url = match &args.prestop {
        Some(PreStop::Http(u)) => {
            Some(Url::parse(u).map_err(|e| error(format!("--prestop-http: {e}")))?)
        }
        _ => None,
    };
    let mut traffic = args.traffic.clone();
    traffic.duration = args.warmup + args.drain_window;
    // Requests run until the process is gone; the run cuts them after the exit.
    traffic.drain_wait = args.grace_period + AFTER_EXIT + Duration::from_secs(1);
    traffic.progress = false;
    let probe = Probe::new(traffic.clone()).map_err(|e| error(format!("invalid setting {e}")))?;

    let started_unix_ms = unix_now();
    let started = tokio::time::Instant::now();
    let mut service = process::Service::spawn(&args.command, args.pid_namespace)
        .await
        .map_err(error)?;
    let output = service.output();

    let mut observed = Observed {
        ready_url: ready_url.to_string(),
        live_url: live_url.as_ref().map(Url::to_string),
        ready_after: None,
        startup_error: None,
        t0: None,
        told_at: None,
        signal_at: None,
        signal_name: format!("{sig}"),
        signal_number: sig as i32,
        target_pid: service.target(),
        disposition: Err("not read".to_owned()),
        exit: None,
        exited_at: None,
        grace_ms: args.grace_period.as_secs_f64() * 1000.0,
        drain_window_ms: args.drain_window.as_secs_f64() * 1000.0,
        http: traffic.http,
        ready_polls: Vec::new(),
        live_polls: Vec::new(),
        records: Vec::new(),
        report: None,
    };

    // 1. Startup.
    let startup_deadline = started + args.startup_timeout;
    let mut last = String::from("no poll yet");
    loop {
        if let Some(exit) = service.try_exit() {
            observed.exit = Some(exit);
            observed.exited_at = Some(unix_now());
            observed.startup_error = Some(format!(
                "the process ended before it was ready ({}); last poll: {last}",
                exit_text(&exit)
            ));
            break;
        }
        match http::get(&ready_url, &args.probe_headers, POLL_TIMEOUT).await {
            Ok(200) => {
                observed.ready_after = Some(started.elapsed().as_secs_f64() * 1000.0);
                break;
            }
            Ok(status) => last = format!("{status}"),
            Err(e) => last = e,
        }
        if tokio::time::Instant::now() >= startup_deadline {
            observed.startup_error = Some(format!(
                "{ready_url} not 200 within {:?}; last poll: {last}",
                args.startup_timeout
            ));
            break;
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
    if observed.ready_after.is_none() {
        service.kill();
        if observed.exit.is_none() {
            observed.exit = Some(service.wait_or_kill(tokio::time::Instant::now()).await);
        }
        return Ok(finish(args, started_unix_ms, observed, &output, None));
    }

    // 2. Traffic and probes.
    let (stop_polls, stop_rx) = watch::channel(false);
    let ready_polls = Arc::new(Mutex::new(Vec::new()));
    let live_polls = Arc::new(Mutex::new(Vec::new()));
    let mut pollers = vec![tokio::spawn(poll_loop(
        ready_url.clone(),
        args.probe_headers.clone(),
        ready_polls.clone(),
        stop_rx.clone(),
    ))];
    if let Some(url) = &live_url {
        pollers.push(tokio::spawn(poll_loop(
            url.clone(),
            args.probe_headers.clone(),
            live_polls.clone(),
            stop_rx,
        )));
    }
    let handle = probe.handle();
    let traffic_task = tokio::spawn(probe.run());
    tokio::time::sleep(args.warmup).await;

    // 3. The stop, as kubelet does it: the hook, then the signal; SIGKILL at the grace period.
    let t0 = unix_now();
    let kill_at = tokio::time::Instant::now() + args.grace_period;
    observed.t0 = Some(t0);
    let mut prestop_text = None;
    if let Some(hook) = &args.prestop {
        let (text, informs) = run_prestop(hook, prestop_url.as_ref(), kill_at).await;
        if informs {
            observed.told_at = Some(t0);
        }
        prestop_text = Some(format!(
            "{} ({}; ended at {})",
            text,
            hook_name(hook),
            contracts::at(unix_now(), t0)
        ));
    }
    if let Some(exit) = service.try_exit() {
        observed.exit = Some(exit);
        observed.exited_at = Some(unix_now());
    } else {
        observed.disposition = process::disposition(service.target(), sig);
        let now = unix_now();
        if let Err(e) = service.signal(sig) {
            observed.disposition = Err(e);
        }
        observed.signal_at = Some(now);
        observed.told_at.get_or_insert(now);
        let exit = service.wait_or_kill(kill_at).await;
        observed.exited_at = Some(unix_now());
        observed.exit = Some(exit);
    }

    // 4. What is still running gets a moment, then the run is cut.
    tokio::time::sleep(Duration::from_millis(200)).await;
    handle.stop();
    stop_polls.send_replace(true);
    for p in pollers {
        let _ = p.await;
    }
    let mut traffic_task = traffic_task;
    let result = match tokio::time::timeout(AFTER_EXIT, &mut traffic_task).await {
        Ok(joined) => joined,
        Err(_) => {
            // Still running: recorded `unfinished`, within the runner's abort grace.
            handle.abort();
            traffic_task.await
        }
    };
    service.kill();
    match result {
        Ok(Ok(result)) => observed.records = result.records,
        Ok(Err(e)) => return Err(error(format!("the traffic could not start: {e}"))),
        Err(e) => return Err(error(format!("the traffic task failed: {e}"))),
    }
    observed.ready_polls = std::mem::take(&mut *ready_polls.lock().expect("polls lock"));
    observed.live_polls = std::mem::take(&mut *live_polls.lock().expect("polls lock"));
    Ok(finish(
        args,
        started_unix_ms,
        observed,
        &output,
        prestop_text,
    ))
}

fn hook_name(hook: &PreStop) -> &'static str {
    match hook {
        PreStop::Http(_) => "httpGet",
        PreStop::Exec(_) => "exec",
        PreStop::Sleep(_) => "sleep",
    }
}

/// Runs the hook until it ends or the grace period is over. Returns what happened and
/// whether the hook can have told the service (httpGet and exec can, sleep cannot).
async fn run_prestop(
    hook: &PreStop,
    url: Option<&Url>,
    kill_at: tokio::time::Instant,
) -> (String, bool) {
    let left = kill_at.saturating_duration_since(tokio::time::Instant::now());
    match hook {
        PreStop::Sleep(d) => {
            tokio::time::sleep((*d).min(left)).await;
            (format!("slept {d:?}"), false)
        }
        PreStop::Http(text) => {
            let url = url.expect("parsed with the args");
            match http::get(url, &[], left).await {
                Ok(status) => (format!("GET {text}: {status}"), true),
                Err(e) => (format!("GET {text}: {e}"), true),
            }
        }
        PreStop::Exec(cmd) => {
            let child = tokio::process::Command::new("sh")
                .args(["-c", cmd])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .status();
            match tokio::time::timeout(left, child).await {
                Ok(Ok(status)) => (format!("sh -c {cmd:?}: {status}"), true),
                Ok(Err(e)) => (format!("sh -c {cmd:?}: {e}"), true),
                Err(_) => (
                    format!("sh -c {cmd:?}: still running at the grace period"),
                    true,
                ),
            }
        }
    }
}

fn exit_text(exit: &ExitView) -> String {
    match (exit.code, exit.signal) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("signal {s}"),
        (None, None) => "unknown status".to_owned(),
    }
}

fn finish(
    args: &CheckArgs,
    started_unix_ms: f64,
    mut observed: Observed,
    output: &Arc<Mutex<process::Output>>,
    prestop: Option<String>,
) -> CheckReport {
    let (report_line, stderr_tail) = {
        let out = output.lock().expect("output lock");
        let tail: Vec<String> = out.stderr.iter().rev().take(20).rev().cloned().collect();
        (out.report_line.clone(), tail)
    };
    observed.report = match &args.report_file {
        Some(path) => std::fs::read_to_string(path)
            .ok()
            .and_then(|t| ReportFacts::parse(&t, &path.display().to_string())),
        None => None,
    }
    .or_else(|| report_line.and_then(|l| ReportFacts::parse(&l, "stderr")));
    let expect_serving = args.expect_readiness == ExpectReadiness::Serving;
    let contracts = vec![
        contracts::startup(&observed),
        contracts::readiness(&observed, expect_serving),
        contracts::liveness(&observed),
        contracts::stop_signal(&observed),
        contracts::listener_open(&observed),
        contracts::in_flight(&observed),
        contracts::keepalive_close(&observed),
        contracts::exit(&observed),
        contracts::report(&observed),
    ];
    CheckReport {
        command: args.command.clone(),
        pid_namespace: args.pid_namespace,
        started_unix_ms,
        stop_unix_ms: observed.t0,
        prestop,
        signal_unix_ms: observed.signal_at,
        exit: observed.exit,
        exit_unix_ms: observed.exited_at,
        contracts,
        requests: observed.records.len(),
        stderr_tail,
    }
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
