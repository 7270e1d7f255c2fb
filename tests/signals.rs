//! Real signals delivered to real child processes.
//!
//! Each test re-runs this test binary as a child (selected with `--exact` and an environment
//! variable), so the child is an ordinary process with the coordinator's default signal setup.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lameduck::report::Outcome;
use lameduck::AdminBuilder;
use lameduck::{Drain, DrainReport, EventKind, Phase, Propagation, Signals, StopSignal, Trigger};

const CHILD_ENV: &str = "LAMEDUCK_SIGNAL_CHILD";
/// The report file a child writes, for the scenarios that use one.
const REPORT_ENV: &str = "LAMEDUCK_TEST_REPORT_FILE";
/// The termination log a child writes, for the scenarios that use one.
const TERMINATION_LOG_ENV: &str = "LAMEDUCK_TEST_TERMINATION_LOG";
/// The admin port a child serves on, for the scenario that calls `/drain`.
const ADMIN_PORT_ENV: &str = "LAMEDUCK_TEST_ADMIN_PORT";
/// The port a child serves HTTP on with `lameduck::serve`, for the young-process scenario.
const HTTP_PORT_ENV: &str = "LAMEDUCK_TEST_HTTP_PORT";
/// Longer than the window (100 ms) in which a repeat of the same signal is an echo of the
/// first (a sender signalling the child, then its group), not a second request.
const SECOND_REQUEST_GAP: Duration = Duration::from_millis(300);

/// Child side: build a coordinator, announce readiness, run, exit with the report's code.
fn child_main(scenario: &str) -> ! {
    let rt = if scenario.starts_with("starved") {
        // Two workers, both blocked below: the drain's driver can never run.
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let code = rt.block_on(async {
        let mut builder = Drain::builder()
            .grace_period(Duration::from_secs(3))
            // Hard deadline at 2 s, the watchdog at 2.5 s: a loaded machine has half a
            // second before the grace period ends.
            .safety_margin(Duration::from_secs(1))
            .propagation(Propagation::fixed(Duration::from_millis(200)))
            .termination_log(None);
        if let Ok(path) = std::env::var(REPORT_ENV) {
            builder = builder.report_file(path);
        }
        if let Ok(path) = std::env::var(TERMINATION_LOG_ENV) {
            builder = builder.termination_log(Some(path.into()));
        }
        if scenario == "weak-drain" || scenario == "young-serve" {
            // The default policy: an idle process has too little traffic to measure. A grace
            // of its own, so that waiting to `max` on a loaded machine stays far from the
            // deadline (the test is about the stderr line, not the budget).
            builder = builder
                .grace_period(Duration::from_secs(8))
                .propagation(Propagation::default());
        }
        if scenario == "node-shutdown" {
            // A rollout's budget: only `LAMEDUCK_SHORTEST_GRACE` (set by the test or not)
            // says the kill may come sooner.
            builder = builder.grace_period(Duration::from_secs(30));
        }
        if scenario == "stop-quit-builder" {
            builder = builder.signals(Signals::default().stop_signal(StopSignal::Sigquit));
        }
        let drain = builder.build().unwrap();
        let mut held = None;
        match scenario {
            "idle" | "prestop" | "stop-quit-env" | "stop-quit-builder" | "report-file" => {}
            "report-file-closers" => {
                // A report of about 3 KiB: a 4 KiB pipe takes it once, not twice.
                for i in 0..4 {
                    drain
                        .work()
                        .on_close(format!("closer-{i}-{}", "x".repeat(120)), || async {
                            Ok::<(), std::io::Error>(())
                        });
                }
            }
            #[cfg(feature = "admin")]
            "weak-drain" => {
                let port: u16 = std::env::var(ADMIN_PORT_ENV).unwrap().parse().unwrap();
                let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
                    .await
                    .unwrap();
                tokio::spawn(AdminBuilder::new(&drain).without_token().serve(listener));
            }
            #[cfg(feature = "admin")]
            "young-serve" => {
                let port: u16 = std::env::var(HTTP_PORT_ENV).unwrap().parse().unwrap();
                let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
                    .await
                    .unwrap();
                let app = axum::Router::new()
                    .route("/", axum::routing::get(|| async { "ok" }))
                    .layer(drain.layer());
                tokio::spawn(lameduck::serve(listener, app, &drain));
            }
            "stuck-task" => {
                drain
                    .work()
                    .spawn("stuck-task", std::future::pending::<()>());
            }
            "stuck-request" => held = Some(drain.enter()),
            "node-shutdown" => {
                // Work that never ends on its own, and closers that must run after it.
                held = Some(drain.enter());
                drain.work().spawn("flush", std::future::pending::<()>());
                for name in ["db-pool", "exporter"] {
                    drain
                        .work()
                        .on_close(name, || async { Ok::<(), std::io::Error>(()) });
                }
            }
            "stuck-request-closers" => {
                held = Some(drain.enter());
                drain.work().spawn("flush", std::future::pending::<()>());
                for name in ["db-pool", "exporter"] {
                    drain
                        .work()
                        .on_close(name, || async { Ok::<(), std::io::Error>(()) });
                }
            }
            "starved" | "starved-stalled-stderr" => {
                if scenario == "starved-stalled-stderr" {
                    stall_stderr();
                }
                // Handlers that block their worker thread (synchronous I/O, a busy loop).
                let blocked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
                for _ in 0..2 {
                    let b = blocked.clone();
                    tokio::spawn(async move {
                        b.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        std::thread::sleep(Duration::from_secs(60));
                    });
                }
                // Bounded: both workers pick their task up at once.
                for _ in 0..500 {
                    if blocked.load(std::sync::atomic::Ordering::SeqCst) == 2 {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                assert_eq!(blocked.load(std::sync::atomic::Ordering::SeqCst), 2);
            }
            "stalled-stderr" => stall_stderr(),
            other => panic!("unknown scenario {other}"),
        }
        drain.install_signals();
        drain.readiness().mark_serving();
        // Tells the parent the drain started, a synchronisation point for its next signal.
        let started = drain.clone();
        tokio::spawn(async move {
            started.moments().reached(Phase::Draining).await;
            println!("DRAINING");
        });
        if scenario == "prestop" {
            // What the admin endpoint does for a preStop hook.
            drain.start(Trigger::PreStop);
        }
        println!("READY");
        let report = drain.run().await;
        drop(held);
        println!("EXITING");
        report.exit_code
    });
    std::process::exit(code)
}

/// A log reader that stopped reading: a thread fills the pipe and then blocks in the middle
/// of a write, holding stderr's lock.
fn stall_stderr() {
    std::thread::spawn(|| {
        let chunk = vec![b'x'; 64 * 1024];
        let mut err = std::io::stderr().lock();
        for _ in 0..64 {
            let _ = std::io::Write::write_all(&mut err, &chunk);
        }
    });
    std::thread::sleep(Duration::from_millis(200));
}

struct Proc {
    child: Child,
    stdout: BufReader<std::process::ChildStdout>,
    stderr: BufReader<std::process::ChildStderr>,
    /// The stderr lines [`wait_for_stderr`] read already.
    stderr_seen: String,
}

fn spawn(test: &str, scenario: &str) -> Proc {
    spawn_with(test, scenario, &[])
}

fn spawn_with(test: &str, scenario: &str, env: &[(&str, &str)]) -> Proc {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, scenario)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let mut p = Proc {
        child,
        stdout,
        stderr,
        stderr_seen: String::new(),
    };
    wait_for_stdout(&mut p, "READY");
    p
}

/// Reads the child's stdout up to a line ending with `word`; kills the child and panics if
/// it ends first. Bounded: each child prints a few lines and exits by its hard deadline.
fn wait_for_stdout(p: &mut Proc, word: &str) {
    let mut line = String::new();
    for _ in 0..50 {
        line.clear();
        if p.stdout.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        if line.trim_end().ends_with(word) {
            return;
        }
    }
    let _ = p.child.kill();
    let _ = p.child.wait();
    panic!("child never printed {word}");
}

/// Reads the child's stderr up to a line containing `text` (kept for [`wait_stderr`]); panics
/// if the stream ends first. Bounded like [`wait_for_stdout`].
fn wait_for_stderr(p: &mut Proc, text: &str) {
    let mut line = String::new();
    for _ in 0..50 {
        line.clear();
        if p.stderr.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        p.stderr_seen.push_str(&line);
        if line.contains(text) {
            return;
        }
    }
    let _ = p.child.kill();
    let _ = p.child.wait();
    panic!("child never said {text:?} on stderr: {}", p.stderr_seen);
}

fn kill(p: &Proc, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &p.child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} failed");
}

/// Waits (bounded) for the child to exit; returns its code, elapsed time and the report from
/// its stderr.
fn wait(p: Proc, limit: Duration) -> (i32, Duration, DrainReport) {
    let (code, took, report, _) = wait_stderr(p, limit);
    (code, took, report)
}

/// [`wait`], also returning the child's whole stderr.
fn wait_stderr(mut p: Proc, limit: Duration) -> (i32, Duration, DrainReport, String) {
    let start = Instant::now();
    loop {
        if let Some(status) = p.child.try_wait().unwrap() {
            let mut err = std::mem::take(&mut p.stderr_seen);
            p.stderr.read_to_string(&mut err).unwrap();
            let json = err
                .lines()
                .find(|l| l.starts_with("{\"outcome\""))
                .unwrap_or_else(|| panic!("no report on stderr: {err}"));
            let report: DrainReport = serde_json::from_str(json).unwrap();
            common::assert_figures_fit(&report);
            assert_eq!(
                err.lines()
                    .filter(|l| l.starts_with("{\"outcome\""))
                    .count(),
                1,
                "one report line on stderr: {err}"
            );
            let mut rest = String::new();
            let _ = p.stdout.read_to_string(&mut rest);
            return (status.code().unwrap_or(-1), start.elapsed(), report, err);
        }
        if start.elapsed() > limit {
            let _ = p.child.kill();
            let _ = p.child.wait();
            panic!("child did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn is_child() -> Option<String> {
    std::env::var(CHILD_ENV).ok()
}

#[test]
fn sigterm_drains_an_idle_process_which_exits_0() {
    if let Some(s) = is_child() {
        child_main(&s);
    }
    let p = spawn("sigterm_drains_an_idle_process_which_exits_0", "idle");
    kill(&p, "-TERM");
    let (code, _, report) = wait(p, Duration::from_secs(20));
    assert_eq!(code, 0);
    assert_eq!(report.outcome, Outcome::Clean);
    assert_eq!(report.trigger, Some(Trigger::Sigterm));
    assert_exit_event(&report, 0);
    // Received on the signal thread, noticed by the runtime: both recorded, in that order.
    let r = report.signal_receipt.as_ref().expect("signal_receipt");
    assert_eq!(r.received_unix_ms, report.timeline[0].unix_ms);
    assert!(r.noticed_unix_ms.unwrap() >= r.received_unix_ms, "{r:?}");
}

/// The last event is `exit` with the code the process exits with.
fn assert_exit_event(report: &DrainReport, code: i32) {
    let last = report.timeline.last().expect("a timeline");
    assert_eq!(last.event, EventKind::Exit, "{:?}", report.timeline);
    assert_eq!(last.code, Some(code));
    assert_eq!(report.exit_code, code);
}

#[test]
fn a_stuck_task_is_named_and_the_process_exits_1_before_the_grace_period() {
    if let Some(s) = is_child() {
        child_main(&s);
    }
    let p = spawn(
        "a_stuck_task_is_named_and_the_process_exits_1_before_the_grace_period",
        "stuck-task",
    );
    kill(&p, "-TERM");
    let (code, _, report) = wait(p, Duration::from_secs(20));
    assert_eq!(code, 1);
    assert_eq!(report.outcome, Outcome::DeadlineExceeded);
    assert_eq!(report.stragglers[0].name, "stuck-task");
    // Measured on the child's own clock: it finished inside the grace period (3 s).
    assert!(report.budget.used_ms < 3000, "{}", report.budget.used_ms);
}

#[test]
fn a_second_sigint_forces_the_exit() {
    if let Some(s) = is_child() {
        child_main(&s);
    }
    let mut p = spawn("a_second_sigint_forces_the_exit", "stuck-request");
    kill(&p, "-INT");
    // Synchronisation point: the child says the first signal started the drain, so the
    // second is a delivery of its own (pending signals of one kind would merge).
    wait_for_stdout(&mut p, "DRAINING");
    // A person's second signal: past the echo window of the first.
    std::thread::sleep(SECOND_REQUEST_GAP);
    kill(&p, "-INT");
    let (code, _, report) = wait(p, Duration::from_secs(20));
    assert_eq!(code, 1);
    assert_eq!(report.outcome, Outcome::Forced);
    assert_eq!(report.trigger, Some(Trigger::Sigint));
}

#[test]
fn a_forced_exit_lists_the_closers_it_skipped() {
    if let Some(s) = is_child() {
        child_main(&s);
    }
    let mut p = spawn(
        "a_forced_exit_lists_the_closers_it_skipped",
        "stuck-request-closers",
    );
    kill(&p, "-INT");
    wait_for_stdout(&mut p, "DRAINING");
    std::thread::sleep(SECOND_REQUEST_GAP);
    kill(&p, "-INT");
    let (code, _, report) = wait(p, Duration::from_secs(20));
    assert_eq!(code, 1);
    assert_eq!(report.outcome, Outcome::Forced);
    // In the order they would have run (reverse registration), each one skipped.
    let closers: Vec<_> = report
        .closers
        .iter()
        .map(|c| (c.name.as_str(), c.result.to_string()))
        .collect();
    assert_eq!(
        closers,
        [
            ("exporter", "skipped".to_owned()),
            ("db-pool", "skipped".to_owned())
        ],
        "{:?}",
        report.closers
    );
    assert!(
        report
            .advice
            .iter()
            .any(|a| a.message.contains("exporter, db-pool") && a.message.contains("forced")),
        "{:?}",
        report.advice
    );
}

#[test]
fn sighup_and_sigusr1_are_recorded_and_change_nothing() {
    if let Some(s) = is_child() {
        child_main(&s);
    }
    let p = spawn("sighup_and_sigusr1_are_recorded_and_change_nothing", "idle");
    // While serving: their default action would end the process here, without a report.
    kill(&p, "-HUP");
    kill(&p, "-USR1");
    kill(&p, "-HUP");
    kill(&p, "-TERM");
    let (code, _, report) = wait(p, Duration::from_secs(20));
    assert_eq!(report.outcome, Outcome::Clean, "{:?}", report.timeline);
    assert_eq!(code, 0);
    assert_eq!(report.trigger, Some(Trigger::Sigterm));
    for name in ["SIGHUP", "SIGUSR1"] {
        let e = report
            .timeline
            .iter()
            .find(|e| e.event == EventKind::SignalReceived && e.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no {name} in {:?}", report.timeline));
        assert!(
            e.detail.as_deref().is_some_and(|d| d.contains("ignored")),
            "{e:?}"
        );
    }
}

#[test]
fn a_sigterm_repeated_within_milliseconds_is_one_request_and_forces_nothing() {
    if let Some(s) = is_child() {
        child_main(&s);
    }
    let p = spawn(
        "a_sigterm_repeated_within_milliseconds_is_one_request_and_forces_nothing",
        "idle",
    );
    // As GNU `timeout` does (the child, then its process group), a few milliseconds apart so
    // that the signal thread takes each as a delivery of its own rather than one pending
    // signal: the shell's builtin `kill`, with an external `sleep` between.
    let pid = p.child.id();
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "kill -TERM {pid}; sleep 0.002; kill -TERM {pid}; sleep 0.002; kill -TERM {pid}"
        ))
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill failed");
    let (code, _, report) = wait(p, Duration::from_secs(20));
    assert_eq!(report.outcome, Outcome::Clean, "{:?}", report.timeline);
    assert_eq!(code, 0);
    assert_eq!(report.trigger, Some(Trigger::Sigterm));
}

/// SIGINT and SIGTERM in the same millisecond are one stop request: Ctrl-C reaches the whole
/// process group, and a wrapper in it that traps INT and TERM forwards a SIGTERM of its own.
/// Either may arrive first.
#[test]
fn a_sigint_and_a_forwarded_sigterm_together_are_one_request_and_force_nothing() {
    if let Some(s) = is_child() {
        child_main(&s);
    }
    for (first, second) in [("INT", "TERM"), ("TERM", "INT")] {
        let p = spawn(
            "a_sigint_and_a_forwarded_sigterm_together_are_one_request_and_force_nothing",
            "idle",
        );
        // The shell's builtin `kill`, twice: microseconds apart, two deliveries.
        let pid = p.child.id();
        let ok = Command::new("sh")
            .arg("-c")
            .arg(format!("kill -{first} {pid}; kill -{second} {pid}"))
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill failed");
        let (code, _, report) = wait(p, Duration::from_secs(20));
        assert_eq!(
            (report.outcome, code),
            (Outcome::Clean, 0),
            "SIG{first} then SIG{second}: {:?}",
            report.timeline
        );
        // Both were received: one started the drain (the signal thread may read two pending
        // signals in either order), the other is recorded and changed nothing.
        let mut received: Vec<_> = report
            .timeline
            .iter()
            .filter(|e| e.event == EventKind::SignalReceived)
            .filter_map(|e| e.trigger)
            .chain(report.trigger)
            .collect();
        received.sort_by_key(|t| t.as_str());
        assert_eq!(
            received,
            [Trigger::Sigint, Trigger::Sigterm],
            "SIG{first} then SIG{second}: {:?}",
            report.timeline
        );
    }
}

#[test]
fn sigquit_forces_the_exit() {
    if let Some(s) = is_child() {
        child_main(&s);
    }
    let p = spawn("sigquit_forces_the_exit", "stuck-request");
    kill(&p, "-QUIT");
    let (code, _, report) = wait(p, Duration::from_secs(20));
    assert_eq!(code, 1);
    assert_eq!(report.outcome, Outcome::Forced);
}

#[test]
fn after_a_prestop_drain_the_process_waits_for_sigterm() {
    if let Some(s) = is_child() {
        child_main(&s);
    }
    let mut p = spawn(
        "after_a_prestop_drain_the_process_waits_for_sigterm",
        "prestop",
    );
    // Synchronisation point: the child says it drained and now waits for the stop signal.
    // The report below then shows that this SIGTERM, not the deadline, ended the wait.
    wait_for_stderr(&mut p, "waiting for the stop signal (SIGTERM)");
    kill(&p, "-TERM");
    let (code, _, report) = wait(p, Duration::from_secs(20));
    assert_eq!(code, 0);
    assert_eq!(report.trigger, Some(Trigger::PreStop));
    // The SIGTERM that ended the wait is in the report written last, before the exit.
    let n = report.timeline.len();
    assert_eq!(report.timeline[n - 2].event, EventKind::SignalReceived);
    assert_eq!(report.timeline[n - 2].trigger, Some(Trigger::Sigterm));
    assert_exit_event(&report, 0);
    assert!(report.stop_signal_wait.as_ref().unwrap().arrived);
}

#[test]
fn after_a_prestop_drain_a_missing_stop_signal_is_named_and_the_process_exits_by_the_hard_deadline()
{
    if let Some(s) = is_child() {
        child_main(&s);
    }
    let p = spawn(
        "after_a_prestop_drain_a_missing_stop_signal_is_named_and_the_process_exits_by_the_hard_deadline",
        "prestop",
    );
    // No signal at all: an entrypoint that swallows SIGTERM.
    let pid = p.child.id();
    let (code, _, report, err) = wait_stderr(p, Duration::from_secs(20));
    assert_eq!(code, 0, "the drain itself was clean");
    assert!(
        err.contains("waiting for the stop signal (SIGTERM)"),
        "no subscriber: the wait is said on stderr: {err}"
    );
    assert!(
        err.contains(&format!("kill -TERM {pid}")),
        "the line says how to end the wait: {err}"
    );
    let wait = report.stop_signal_wait.as_ref().expect("stop_signal_wait");
    assert!(!wait.arrived);
    let advice = &report.advice[0];
    assert_eq!(advice.rule.as_str(), "stop_signal_missing");
    assert!(
        advice.message.contains("did not arrive")
            && advice
                .message
                .contains("is the entrypoint forwarding signals?"),
        "{}",
        advice.message
    );
    assert_eq!(advice.observed, wait.waited_ms);
    assert_exit_event(&report, 0);
    // Waited until the hard deadline (grace 3 s − margin 1 s) and no longer than the grace
    // period, on the child's own clock.
    let exit = report.timeline.last().unwrap();
    assert!(exit.at_ms >= 2000 && exit.at_ms < 3000, "{exit:?}");
}

#[test]
fn the_configured_stop_signal_drains_instead_of_forcing() {
    if let Some(s) = is_child() {
        child_main(&s);
    }
    let test = "the_configured_stop_signal_drains_instead_of_forcing";
    for p in [
        spawn_with(
            test,
            "stop-quit-env",
            &[("LAMEDUCK_STOP_SIGNAL", "SIGQUIT")],
        ),
        spawn_with(test, "stop-quit-builder", &[]),
    ] {
        kill(&p, "-QUIT");
        let (code, _, report) = wait(p, Duration::from_secs(20));
        assert_eq!(code, 0);
        assert_eq!(report.outcome, Outcome::Clean);
        assert_eq!(report.trigger, Some(Trigger::Sigquit));
        assert_exit_event(&report, 0);
    }
}

#[test]
fn a_second_signal_of_any_kind_forces_the_exit() {
    if let Some(s) = is_child() {
        child_main(&s);
    }
    // The second as the same signal, and as SIGINT after a SIGTERM-started drain: a person's
    // Ctrl-C during a drain.
    for second in ["-TERM", "-INT"] {
        let mut p = spawn(
            "a_second_signal_of_any_kind_forces_the_exit",
            "stuck-request",
        );
        kill(&p, "-TERM");
        // Synchronisation point: the child says the first signal started the drain, so the
        // second is a delivery of its own (pending signals of one kind would merge).
        wait_for_stdout(&mut p, "DRAINING");
        // A person's second signal: past the echo window of the first.
        std::thread::sleep(SECOND_REQUEST_GAP);
        kill(&p, second);
        let (code, _, report) = wait(p, Duration::from_secs(20));
        assert_eq!(code, 1, "{second}");
        assert_eq!(report.outcome, Outcome::Forced, "{second}");
        assert_eq!(report.trigger, Some(Trigger::Sigterm));
        assert_exit_event(&report, 1);
    }
}

#[test]
fn a_starved_runtime_is_cut_by_the_watchdog_with_a_forced_report() {
    if let Some(s) = is_child() {
        child_main(&s);
    }
    let p = spawn(
        "a_starved_runtime_is_cut_by_the_watchdog_with_a_forced_report",
        "starved",
    );
    kill(&p, "-TERM");
    let (code, _, report) = wait(p, Duration::from_secs(20));
    assert_eq!(code, 1);
    assert_eq!(report.outcome, Outcome::Forced);
    assert!(
        report
            .cause
            .as_deref()
            .is_some_and(|c| c.starts_with("runtime starved")),
        "{:?}",
        report.cause
    );
    // The signal was received (the budget's origin) but the runtime never noticed it.
    let r = report.signal_receipt.as_ref().expect("signal_receipt");
    assert_eq!(r.noticed_unix_ms, None);
    assert_exit_event(&report, 1);
    // Cut after the hard deadline (2 s) and before the grace period (3 s), on the child's clock.
    assert!(
        report.budget.used_ms >= 2000 && report.budget.used_ms < 3000,
        "{}",
        report.budget.used_ms
    );
}

fn report_path(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("lameduck-signals-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn a_stalled_stderr_does_not_keep_the_process_from_exiting() {
    if let Some(s) = is_child() {
        child_main(&s);
    }
    let path = report_path("stalled.json");
    let mut p = spawn_with(
        "a_stalled_stderr_does_not_keep_the_process_from_exiting",
        "stalled-stderr",
        &[(REPORT_ENV, path.to_str().unwrap())],
    );
    kill(&p, "-TERM");
    // Nobody reads the child's stderr: it must exit anyway (bounded wait, then kill).
    let start = Instant::now();
    let status = loop {
        if let Some(status) = p.child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = p.child.kill();
            let _ = p.child.wait();
            panic!("the child did not exit with its stderr stalled");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    // The file came first and holds the final report, which names the stalled sink.
    let text = std::fs::read_to_string(&path).unwrap();
    let report: DrainReport = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(report.outcome, Outcome::Clean);
    assert_eq!(report.timeline.last().unwrap().event, EventKind::Exit);
    assert!(
        report
            .sink_errors
            .iter()
            .any(|e| e.starts_with("stderr: the write did not finish within 1000 ms")),
        "{:?}",
        report.sink_errors
    );
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_report_file_that_cannot_be_written_is_said_and_exits_1() {
    if let Some(s) = is_child() {
        child_main(&s);
    }
    for (path, why) in [
        ("/nonexistent/dir/report.json", "No such file or directory"),
        // A device that is not one of the special sinks: refused, not written.
        (
            "/dev/full",
            "it is a character device, not a regular file or a FIFO: not written",
        ),
    ] {
        let p = spawn_with(
            "a_report_file_that_cannot_be_written_is_said_and_exits_1",
            "report-file",
            &[(REPORT_ENV, path)],
        );
        kill(&p, "-TERM");
        let (code, _, report, err) = wait_stderr(p, Duration::from_secs(20));
        assert_eq!(code, 1, "{path}: {err}");
        assert_eq!(report.outcome, Outcome::Clean, "the drain itself was clean");
        assert_eq!(report.exit_code, 1);
        let expected = format!("lameduck: cannot write the drain report: report file {path}: ");
        assert!(
            err.contains(&expected) && err.contains(why),
            "{path}: {err}"
        );
        // Said once, though the report is written twice under `run` (at Done, at the exit).
        assert_eq!(err.matches(&expected).count(), 1, "{path}: {err}");
        assert!(
            report.sink_errors.iter().any(|e| e.contains(path)),
            "{:?}",
            report.sink_errors
        );
    }
    // `/dev/full` is still the device: refused, never renamed over.
    let meta = std::fs::metadata("/dev/full").unwrap();
    assert!(!meta.is_file());
}

#[test]
fn the_report_file_is_replaced_atomically_with_the_final_report() {
    if let Some(s) = is_child() {
        child_main(&s);
    }
    let path = report_path("final.json");
    std::fs::write(&path, "the previous report\n").unwrap();
    // Kubernetes creates the termination log; lameduck only writes an existing one.
    let tlog = report_path("termination-log");
    std::fs::write(&tlog, "").unwrap();
    let p = spawn_with(
        "the_report_file_is_replaced_atomically_with_the_final_report",
        "report-file",
        &[
            (REPORT_ENV, path.to_str().unwrap()),
            (TERMINATION_LOG_ENV, tlog.to_str().unwrap()),
        ],
    );
    kill(&p, "-TERM");
    let (code, _, stderr_report) = wait(p, Duration::from_secs(20));
    assert_eq!(code, 0);
    let text = std::fs::read_to_string(&path).unwrap();
    let file_report: DrainReport = serde_json::from_str(text.trim()).unwrap();
    // The file and the stderr line are the same final report, exit event included.
    assert_eq!(file_report, stderr_report);
    assert_exit_event(&file_report, 0);
    let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("final.json") && n != "final.json")
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // The termination log is the summary of the same final report: it ends with the exit.
    let summary = std::fs::read_to_string(&tlog).unwrap();
    let last = summary.lines().last().unwrap_or_default();
    assert!(last.ends_with(" exit code=0"), "{summary}");
    assert!(
        summary.contains("drain_started trigger=sigterm"),
        "{summary}"
    );
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&tlog);
}

/// The grace period every child gets (see `child_main`): kubelet's SIGKILL would come then.
const GRACE: Duration = Duration::from_secs(3);

/// Waits (bounded) for the child to exit without reading its pipes first (a test whose child
/// has a stalled stderr); returns the exit code and the time it took.
fn wait_unread(p: &mut Proc, limit: Duration) -> (Option<i32>, Duration) {
    let start = Instant::now();
    loop {
        if let Some(status) = p.child.try_wait().unwrap() {
            return (status.code(), start.elapsed());
        }
        if start.elapsed() > limit {
            let _ = p.child.kill();
            let _ = p.child.wait();
            panic!("the child did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A FIFO at `path` whose reader never reads, full but for `room` bytes. The returned file is
/// that reader (and the writer that filled it): keep it open for the test.
fn stalled_fifo(path: &std::path::Path, room: usize) -> std::fs::File {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    assert!(Command::new("mkfifo").arg(path).status().unwrap().success());
    // Read and write: opening does not wait for another end, and the FIFO has a reader.
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .unwrap();
    let page = [b'#'; 4096];
    // Bounded: a pipe holds at most 1 MiB (64 KiB by default).
    for _ in 0..=256 {
        match f.write(&page) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("filling the FIFO: {e}"),
        }
    }
    let mut freed = vec![0; room];
    f.read_exact(&mut freed).unwrap();
    f
}

#[test]
fn a_report_file_on_a_stalled_pipe_does_not_hold_the_exit() {
    if let Some(s) = is_child() {
        child_main(&s);
    }
    let path = report_path("stalled.fifo");
    // Room for the first write only, as a log pipe whose reader stopped.
    let reader = stalled_fifo(&path, 4096);
    let p = spawn_with(
        "a_report_file_on_a_stalled_pipe_does_not_hold_the_exit",
        "report-file-closers",
        &[(REPORT_ENV, path.to_str().unwrap())],
    );
    kill(&p, "-TERM");
    let (code, took, report, err) = wait_stderr(p, Duration::from_secs(20));
    assert!(took < GRACE, "exited {took:?} after SIGTERM: {err}");
    assert!(report.to_json().len() > 2048, "{}", report.to_json().len());
    // The report still reached stderr, naming the stalled file; the drain itself was clean.
    assert_eq!(report.outcome, Outcome::Clean);
    assert!(
        report
            .sink_errors
            .iter()
            .any(|e| e.contains("stalled.fifo")),
        "{:?}",
        report.sink_errors
    );
    assert_eq!(code, 1, "the report file failed: {err}");
    assert_exit_event(&report, 1);
    drop(reader);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_report_fifo_without_a_reader_is_said_and_the_report_reaches_stderr() {
    if let Some(s) = is_child() {
        child_main(&s);
    }
    let path = report_path("unread.fifo");
    let _ = std::fs::remove_file(&path);
    assert!(Command::new("mkfifo")
        .arg(&path)
        .status()
        .unwrap()
        .success());
    let p = spawn_with(
        "a_report_fifo_without_a_reader_is_said_and_the_report_reaches_stderr",
        "report-file",
        &[(REPORT_ENV, path.to_str().unwrap())],
    );
    kill(&p, "-TERM");
    let (code, took, report, err) = wait_stderr(p, Duration::from_secs(20));
    assert!(took < GRACE, "exited {took:?} after SIGTERM: {err}");
    assert_eq!(code, 1);
    assert_exit_event(&report, 1);
    assert!(
        err.contains("unread.fifo") && err.contains("no process reads"),
        "{err}"
    );
    let _ = std::fs::remove_file(&path);
}

#[test]
fn the_watchdog_exits_inside_the_grace_period_with_stderr_stalled() {
    if let Some(s) = is_child() {
        child_main(&s);
    }
    let path = report_path("starved-stalled.json");
    let _ = std::fs::remove_file(&path);
    let mut p = spawn_with(
        "the_watchdog_exits_inside_the_grace_period_with_stderr_stalled",
        "starved-stalled-stderr",
        &[(REPORT_ENV, path.to_str().unwrap())],
    );
    kill(&p, "-TERM");
    let (code, took) = wait_unread(&mut p, Duration::from_secs(20));
    assert!(took < GRACE, "exited {took:?} after SIGTERM");
    assert_eq!(code, Some(1));
    // The file is the sink that works: it holds the watchdog's report.
    let text = std::fs::read_to_string(&path).unwrap();
    let report: DrainReport = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(report.outcome, Outcome::Forced);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_symlink_planted_at_the_temporary_name_is_not_followed() {
    if let Some(s) = is_child() {
        child_main(&s);
    }
    let path = report_path("planted.json");
    let victim = report_path("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    let _ = std::fs::remove_file(&path);
    let p = spawn_with(
        "a_symlink_planted_at_the_temporary_name_is_not_followed",
        "report-file",
        &[(REPORT_ENV, path.to_str().unwrap())],
    );
    // The names an attacker can guess: the file's name and the process id.
    let dir = path.parent().unwrap();
    let planted: Vec<_> = [
        format!(".planted.json.{}.tmp", p.child.id()),
        format!(".planted.json.{}", p.child.id()),
        "planted.json.tmp".to_owned(),
        ".planted.json.tmp".to_owned(),
    ]
    .into_iter()
    .map(|n| dir.join(n))
    .collect();
    for link in &planted {
        let _ = std::fs::remove_file(link);
        std::os::unix::fs::symlink(&victim, link).unwrap();
    }
    kill(&p, "-TERM");
    let (code, took, stderr_report) = wait(p, Duration::from_secs(20));
    assert!(took < GRACE, "exited {took:?} after SIGTERM");
    assert_eq!(code, 0);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert!(meta.is_file(), "the report is a regular file: {meta:?}");
    let file_report: DrainReport =
        serde_json::from_str(std::fs::read_to_string(&path).unwrap().trim()).unwrap();
    assert_eq!(file_report, stderr_report);
    for link in &planted {
        let _ = std::fs::remove_file(link);
    }
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&victim);
}

/// A file bind-mounted over another, as a Kubernetes `subPath` file mount; unmounted on drop,
/// also when the test fails.
struct BindMount {
    target: std::path::PathBuf,
}

impl BindMount {
    /// `None` (said on stderr) where mounting is not allowed, unless `LAMEDUCK_E2E=require`.
    fn new(source: &std::path::Path, target: &std::path::Path) -> Option<Self> {
        let out = Command::new("mount")
            .arg("--bind")
            .arg(source)
            .arg(target)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(BindMount {
                target: target.to_owned(),
            }),
            other => {
                let why =
                    format!("this test needs root to bind-mount a file (mount --bind): {other:?}");
                if std::env::var("LAMEDUCK_E2E").as_deref() == Ok("require") {
                    panic!("{why}");
                }
                eprintln!("SKIPPED: {why}");
                None
            }
        }
    }
}

impl Drop for BindMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.target).status();
    }
}

#[test]
fn a_bind_mounted_report_file_is_written_in_place() {
    if let Some(s) = is_child() {
        child_main(&s);
    }
    let source = report_path("mounted-source.json");
    let target = report_path("mounted.json");
    std::fs::write(&source, "the previous report\n").unwrap();
    std::fs::write(&target, "").unwrap();
    let Some(mount) = BindMount::new(&source, &target) else {
        return;
    };
    let p = spawn_with(
        "a_bind_mounted_report_file_is_written_in_place",
        "report-file",
        &[(REPORT_ENV, target.to_str().unwrap())],
    );
    kill(&p, "-TERM");
    let (code, took, stderr_report, err) = wait_stderr(p, Duration::from_secs(20));
    assert!(took < GRACE, "exited {took:?} after SIGTERM");
    assert_eq!(code, 0, "{err}");
    // Written through the mount: the volume's file holds the final report, whole.
    let text = std::fs::read_to_string(&source).unwrap();
    let file_report: DrainReport = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(file_report, stderr_report);
    assert_exit_event(&file_report, 0);
    drop(mount);
    let _ = std::fs::remove_file(&source);
    let _ = std::fs::remove_file(&target);
}

/// A `/drain` that waits on weak evidence (an idle process: the wait runs to `max`) says so on
/// stderr, with the way out (`?wait=none`), when the call starts waiting.
#[cfg(feature = "admin")]
#[test]
fn a_drain_call_that_waits_on_weak_evidence_says_so_on_stderr() {
    use std::io::Write;

    if let Some(s) = is_child() {
        child_main(&s);
    }
    let port = free_port();
    let p = spawn_with(
        "a_drain_call_that_waits_on_weak_evidence_says_so_on_stderr",
        "weak-drain",
        &[(ADMIN_PORT_ENV, &port.to_string())],
    );
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // Gives up waiting after 300 ms (504); the drain goes on.
    conn.write_all(
        b"GET /drain?timeout=300ms HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let mut head = [0u8; 12];
    conn.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 504");
    kill(&p, "-TERM");
    let (code, _, report, err) = wait_stderr(p, Duration::from_secs(20));
    assert_eq!(code, 0, "{err}");
    assert_eq!(report.trigger, Some(Trigger::PreStop));
    let line = err
        .lines()
        .find(|l| l.starts_with("lameduck: /drain (wait=drained)"))
        .unwrap_or_else(|| panic!("no line about the wait: {err}"));
    assert!(
        line.contains("waits for max") && line.contains("/drain?wait=none"),
        "{line}"
    );
    // The line names the weak evidence's own cause, the one the report names too.
    let weak = report.propagation.evidence.as_ref().and_then(|e| e.weak);
    let weak = weak.unwrap_or_else(|| panic!("the report names no weak evidence: {err}"));
    assert!(
        line.contains(weak.as_str()) && line.contains(weak.cause()),
        "{weak:?}: {line}"
    );
}

/// A process that served for less than the evidence window waits to `max`, and the one line
/// it writes on stderr at the exit (before the JSON report) says why.
#[cfg(feature = "admin")]
#[test]
fn a_young_process_says_on_stderr_that_it_waited_to_max_for_its_age() {
    use std::io::Write;

    if let Some(s) = is_child() {
        child_main(&s);
    }
    let port = free_port();
    let p = spawn_with(
        "a_young_process_says_on_stderr_that_it_waited_to_max_for_its_age",
        "young-serve",
        &[(HTTP_PORT_ENV, &port.to_string())],
    );
    // Traffic on fresh connections: the process has connection data, only too little of it.
    for _ in 0..3 {
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        conn.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut answer = String::new();
        conn.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    kill(&p, "-TERM");
    let (code, _, report, err) = wait_stderr(p, Duration::from_secs(20));
    assert_eq!(code, 0, "{err}");
    let evidence = report.propagation.evidence.as_ref().unwrap();
    assert_eq!(
        (evidence.kind.as_str(), evidence.weak.map(|w| w.as_str())),
        ("max", Some("too_few_slots")),
        "{err}"
    );
    let line = err
        .lines()
        .find(|l| l.starts_with("lameduck drain clean (exit 0), trigger sigterm"))
        .unwrap_or_else(|| panic!("no summary line: {err}"));
    assert!(
        line.contains(&format!(
            "waited to max ({} ms): the process had seen only",
            report.propagation.max_ms
        )) && line.contains("(too_few_slots)"),
        "{line}"
    );
    // The line comes before the report, which stays the one JSON line.
    let at = |prefix: &str| err.lines().position(|l| l.starts_with(prefix)).unwrap();
    assert!(at("lameduck drain") < at("{\"outcome\""), "{err}");
}

/// A loopback port nothing listens on (bound, read, released) for a child to listen on.
#[cfg(feature = "admin")]
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// What the kubelet's graceful node shutdown does to an ordinary Pod of a spot node: SIGTERM,
/// then SIGKILL at the node's budget (6 s here) whatever the Pod's grace (30 s). With
/// `LAMEDUCK_SHORTEST_GRACE=6s` the drain is planned to fit: the stuck work is cut at the
/// shortened quiesce deadline, both closers run, the report is written and names the budget,
/// and the process is gone before the kill.
#[test]
fn a_node_shutdown_budget_shorter_than_the_grace_is_fitted_with_the_shortest_grace() {
    const TEST: &str =
        "a_node_shutdown_budget_shorter_than_the_grace_is_fitted_with_the_shortest_grace";
    if let Some(s) = is_child() {
        child_main(&s);
    }
    let p = spawn_with(TEST, "node-shutdown", &[("LAMEDUCK_SHORTEST_GRACE", "6s")]);
    kill(&p, "-TERM");
    let start = Instant::now();
    let (code, took, report) = wait(p, Duration::from_secs(6));
    assert!(start.elapsed() < Duration::from_secs(6), "{took:?}");
    assert_eq!(code, 1, "work was cut: {:?}", report.timeline);
    let d = report.budget.deletion.as_ref().expect("budget.deletion");
    assert_eq!(d.source, lameduck::report::BudgetSource::ShortestGrace);
    assert_eq!(d.kill_at_ms, 6_000);
    // 6/30 of the 1 s margin and of the 5 s close budget.
    assert_eq!(d.hard_ms, 5_800);
    assert_eq!(d.quiesce_ms, 4_800);
    assert!(report.budget.used_ms < 5_800, "{}", report.budget.used_ms);
    let closers: Vec<_> = report
        .closers
        .iter()
        .map(|c| (c.name.as_str(), c.result.to_string()))
        .collect();
    assert_eq!(
        closers,
        [("exporter", "ok".to_owned()), ("db-pool", "ok".to_owned())],
        "{:?}",
        report.closers
    );
    assert_eq!(report.straggler_counts.requests, 1);
    assert_eq!(report.straggler_counts.tasks, 1);
    let a = report
        .advice
        .iter()
        .find(|a| a.rule == lameduck::report::AdviceRule::BudgetShortened)
        .unwrap_or_else(|| panic!("no budget_shortened: {:?}", report.advice));
    assert_eq!(a.level, lameduck::report::AdviceLevel::Warn);
    assert!(
        a.message.contains("shortest_grace") && a.message.contains("1 request(s) and 1 task(s)"),
        "{}",
        a.message
    );
}

/// The negative control of the test above: the same process without the setting plans for its
/// 30 s grace, so the node's kill at 6 s finds it waiting for its stuck work — no closer ran,
/// no report was written.
#[test]
fn without_the_shortest_grace_a_node_shutdown_kills_the_drain_before_its_closers_and_report() {
    const TEST: &str =
        "without_the_shortest_grace_a_node_shutdown_kills_the_drain_before_its_closers_and_report";
    if let Some(s) = is_child() {
        child_main(&s);
    }
    let mut p = spawn_with(TEST, "node-shutdown", &[("LAMEDUCK_SHORTEST_GRACE", "")]);
    kill(&p, "-TERM");
    wait_for_stdout(&mut p, "DRAINING");
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(6) {
        assert!(
            p.child.try_wait().unwrap().is_none(),
            "the child exited before the kill"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    kill(&p, "-KILL");
    let status = p.child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9));
    let mut err = String::new();
    p.stderr.read_to_string(&mut err).unwrap();
    assert!(!err.contains("{\"outcome\""), "a report was written: {err}");
    assert!(!err.contains("db-pool"), "{err}");
}
