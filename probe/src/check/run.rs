//! The run of a check, step by step as the [module docs](super) list them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::sync::watch;

use super::contracts;
use super::http::{self, Url};
use super::{
    error, process, signal_of, unix_now, CheckArgs, CheckError, CheckReport, ExitView, Observed,
    Poll, PreStop, AFTER_EXIT, MAX_POLLS, POLL_EVERY, POLL_TIMEOUT,
};
use crate::config::{HttpVersion, ProbeConfig};
use crate::record::Record;
use crate::runner::Probe;
use crate::{ProbeError, ProbeHandle, ProbeResult};

mod finish;
mod hook;
mod preflight;
mod told;

use finish::finish;

/// Runs `args`' command through the whole stop and judges it.
///
/// # Errors
///
/// Bad URLs or signal names, or a command that cannot be started at all. A service that
/// starts and misbehaves is a report with failed contracts, not an error.
pub async fn run_check(args: &CheckArgs) -> Result<CheckReport, CheckError> {
    let inputs = Inputs::parse(args)?;
    let mut traffic = traffic_for(args);
    // Checked before the service starts; built again once the paths are known.
    Probe::new(traffic.clone()).map_err(|e| error(format!("invalid setting {e}")))?;

    let started_unix_ms = unix_now();
    let started = tokio::time::Instant::now();
    let mut service = process::Service::spawn(&args.command, args.pid_namespace)
        .await
        .map_err(error)?;
    let output = service.output();
    let mut observed = Observed::before_start(args, &inputs, service.target(), traffic.http);

    // 1. Startup.
    wait_ready(
        &mut observed,
        &mut service,
        args,
        &inputs.ready_url,
        started,
    )
    .await;
    if observed.ready_after.is_none() {
        let mut left_behind = service.kill();
        if observed.exit.is_none() {
            observed.exit = Some(service.wait_or_kill(tokio::time::Instant::now()).await);
        }
        left_behind.extend(service.kill());
        return Ok(finish(
            args,
            started_unix_ms,
            observed,
            &output,
            None,
            &left_behind,
        ));
    }

    // 2. The paths the run sends (a route the service lacks is no lost request), then
    // traffic and probes.
    match preflight::paths(&mut traffic).await {
        Ok(notes) => observed.preflight = notes,
        Err(why) => {
            service.kill();
            let _ = service.wait_or_kill(tokio::time::Instant::now()).await;
            service.kill();
            return Err(error(why));
        }
    }
    let probe = Probe::new(traffic).map_err(|e| error(format!("invalid setting {e}")))?;
    let pollers = Pollers::start(args, &inputs);
    let handle = probe.handle();
    let traffic_task = tokio::spawn(probe.run());
    tokio::time::sleep(args.warmup).await;

    // 3. The stop, as kubelet does it: the hook, then the signal; SIGKILL at the grace period.
    let prestop_text = stop(&mut observed, &mut service, args, &inputs).await;

    // 4. What is still running gets a moment, then the run is cut.
    tokio::time::sleep(Duration::from_millis(200)).await;
    handle.stop();
    let (ready_polls, live_polls) = pollers.stop().await;
    let result = end_traffic(&handle, traffic_task).await;
    let left_behind = service.kill();
    observed.records = result?;
    observed.ready_polls = ready_polls;
    observed.live_polls = live_polls;
    Ok(finish(
        args,
        started_unix_ms,
        observed,
        &output,
        prestop_text,
        &left_behind,
    ))
}

/// The URLs and the signal from the args, parsed once.
struct Inputs {
    ready_url: Url,
    live_url: Option<Url>,
    sig: Signal,
    prestop_url: Option<Url>,
}

impl Inputs {
    fn parse(args: &CheckArgs) -> Result<Self, CheckError> {
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
        Ok(Inputs {
            ready_url,
            live_url,
            sig,
            prestop_url,
        })
    }
}

/// The traffic for the whole run: through warmup and the drain window, with requests kept
/// running until the process is gone (the run cuts them after the exit).
fn traffic_for(args: &CheckArgs) -> ProbeConfig {
    let mut traffic = args.traffic.clone();
    traffic.duration = args.warmup + args.drain_window;
    traffic.drain_wait = args.kill_budget() + AFTER_EXIT + Duration::from_secs(1);
    traffic.progress = false;
    traffic
}

impl Observed {
    /// Nothing observed yet: what the args and the started process say.
    fn before_start(args: &CheckArgs, inputs: &Inputs, target_pid: u32, http: HttpVersion) -> Self {
        Observed {
            ready_url: inputs.ready_url.to_string(),
            live_url: inputs.live_url.as_ref().map(Url::to_string),
            ready_after: None,
            startup_error: None,
            t0: None,
            told_at: None,
            exec_hook: false,
            signal_at: None,
            signal_name: format!("{}", inputs.sig),
            signal_number: inputs.sig as i32,
            target_pid,
            disposition: Err("not read".to_owned()),
            exit: None,
            exited_at: None,
            grace_ms: args.kill_budget().as_secs_f64() * 1000.0,
            kill_name: if args.kill_after.is_some() {
                "--kill-after budget"
            } else {
                "grace period"
            },
            drain_window_ms: args.drain_window.as_secs_f64() * 1000.0,
            http,
            ready_polls: Vec::new(),
            live_polls: Vec::new(),
            records: Vec::new(),
            report: None,
            report_expected: if args.expect_report {
                Some("--expect-report was given".to_owned())
            } else {
                args.report_file
                    .as_ref()
                    .map(|p| format!("--report-file {} was given", p.display()))
            },
            report_unread: None,
            hook: None,
            preflight: Vec::new(),
        }
    }
}

/// Polls readiness until 200 (sets `ready_after`), the process ends or the startup timeout
/// is over (sets `startup_error`).
async fn wait_ready(
    observed: &mut Observed,
    service: &mut process::Service,
    args: &CheckArgs,
    ready_url: &Url,
    started: tokio::time::Instant,
) {
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
            return;
        }
        match http::get(ready_url, &args.probe_headers, POLL_TIMEOUT).await {
            Ok(200) => {
                observed.ready_after = Some(started.elapsed().as_secs_f64() * 1000.0);
                return;
            }
            Ok(status) => last = format!("{status}"),
            Err(e) => last = e,
        }
        if tokio::time::Instant::now() >= startup_deadline {
            observed.startup_error = Some(format!(
                "{ready_url} not 200 within {:?}; last poll: {last}",
                args.startup_timeout
            ));
            return;
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// The readiness and liveness pollers, running like kubelet's probes.
struct Pollers {
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    ready: Arc<Mutex<Vec<Poll>>>,
    live: Arc<Mutex<Vec<Poll>>>,
}

impl Pollers {
    fn start(args: &CheckArgs, inputs: &Inputs) -> Self {
        let (stop, stop_rx) = watch::channel(false);
        let ready = Arc::new(Mutex::new(Vec::new()));
        let live = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = vec![tokio::spawn(poll_loop(
            inputs.ready_url.clone(),
            args.probe_headers.clone(),
            ready.clone(),
            stop_rx.clone(),
        ))];
        if let Some(url) = &inputs.live_url {
            tasks.push(tokio::spawn(poll_loop(
                url.clone(),
                args.probe_headers.clone(),
                live.clone(),
                stop_rx,
            )));
        }
        Pollers {
            stop,
            tasks,
            ready,
            live,
        }
    }

    /// Stops polling; the readiness and the liveness polls.
    async fn stop(self) -> (Vec<Poll>, Vec<Poll>) {
        self.stop.send_replace(true);
        for p in self.tasks {
            let _ = p.await;
        }
        let take =
            |polls: &Mutex<Vec<Poll>>| std::mem::take(&mut *polls.lock().expect("polls lock"));
        (take(&self.ready), take(&self.live))
    }
}

/// The stop at `t+0`: the preStop hook if there is one, then the signal, then SIGKILL at the
/// grace period if the process is still there. Returns what the hook did.
async fn stop(
    observed: &mut Observed,
    service: &mut process::Service,
    args: &CheckArgs,
    inputs: &Inputs,
) -> Option<String> {
    let t0 = unix_now();
    let kill_at = tokio::time::Instant::now() + args.kill_budget();
    observed.t0 = Some(t0);
    // An exec hook's processes live until the service is gone, as in a container, and no
    // longer: `ran` holds their process group, SIGKILLed when it is dropped at the end of the
    // stop, or when the check is interrupted.
    let ran = match &args.prestop {
        Some(hook) => Some(hook::run(hook, inputs.prestop_url.as_ref(), kill_at).await),
        None => None,
    };
    let mut prestop_text = None;
    if let (Some(hook), Some(ran)) = (&args.prestop, &ran) {
        match ran.reach() {
            hook::Reach::Told => observed.told_at = Some(t0),
            // Until settled from what the service did, judged from the signal.
            hook::Reach::Unknown => observed.exec_hook = true,
            hook::Reach::Nothing => {}
        }
        let ended_at = unix_now();
        prestop_text = Some(format!(
            "{} ({}; ended at {})",
            ran.text(),
            hook::name(hook),
            contracts::at(ended_at, t0)
        ));
        observed.hook = ran.ended().map(|ended| crate::check::HookSeen {
            kind: hook::name(hook),
            ended,
            at: ended_at,
        });
    }
    if let Some(exit) = service.try_exit() {
        observed.exit = Some(exit);
        observed.exited_at = Some(unix_now());
    } else {
        observed.disposition = process::disposition(service.target(), inputs.sig);
        let now = unix_now();
        if let Err(e) = service.signal(inputs.sig) {
            observed.disposition = Err(e);
        }
        observed.signal_at = Some(now);
        observed.told_at.get_or_insert(now);
        let exit = service.wait_or_kill(kill_at).await;
        observed.exited_at = Some(unix_now());
        observed.exit = Some(exit);
    }
    prestop_text
}

/// Waits [`AFTER_EXIT`] for the traffic to end, then aborts it (what still runs is recorded
/// `unfinished`, within the runner's abort grace); its records.
async fn end_traffic(
    handle: &ProbeHandle,
    mut traffic_task: tokio::task::JoinHandle<Result<ProbeResult, ProbeError>>,
) -> Result<Vec<Record>, CheckError> {
    let result = match tokio::time::timeout(AFTER_EXIT, &mut traffic_task).await {
        Ok(joined) => joined,
        Err(_) => {
            handle.abort();
            traffic_task.await
        }
    };
    match result {
        Ok(Ok(result)) => Ok(result.records),
        Ok(Err(e)) => Err(error(format!("the traffic could not start: {e}"))),
        Err(e) => Err(error(format!("the traffic task failed: {e}"))),
    }
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

fn exit_text(exit: &ExitView) -> String {
    match (exit.code, exit.signal) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("signal {s}"),
        (None, None) => "unknown status".to_owned(),
    }
}
