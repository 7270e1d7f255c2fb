//! Real signals delivered to real child processes.
//!
//! Each test re-runs this test binary as a child (selected with `--exact` and an environment
//! variable), so the child is an ordinary process with the coordinator's default signal setup.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lameduck::{
    Drain, DrainReport, EventKind, Outcome, Phase, Propagation, Signals, StopSignal, Trigger,
};

const CHILD_ENV: &str = "LAMEDUCK_SIGNAL_CHILD";
/// The report file a child writes, for the scenarios that use one.
const REPORT_ENV: &str = "LAMEDUCK_TEST_REPORT_FILE";
/// The termination log a child writes, for the scenarios that use one.
const TERMINATION_LOG_ENV: &str = "LAMEDUCK_TEST_TERMINATION_LOG";

/// Child side: build a coordinator, announce readiness, run, exit with the report's code.
fn child_main(scenario: &str) -> ! {
    let rt = if scenario == "starved" {
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
        if scenario == "stop-quit-builder" {
            builder = builder.signals(Signals::default().stop_signal(StopSignal::Sigquit));
        }
        let drain = builder.build().unwrap();
        let mut held = None;
        match scenario {
            "idle" | "prestop" | "stop-quit-env" | "stop-quit-builder" | "report-file" => {}
            "stuck-task" => {
                drain.spawn("stuck-task", std::future::pending::<()>());
            }
            "stuck-request" => held = Some(drain.enter()),
            "starved" => {
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
            "stalled-stderr" => {
                // A log reader that stopped reading: this thread fills the pipe and then
                // blocks in the middle of a write, holding stderr's lock.
                std::thread::spawn(|| {
                    let chunk = vec![b'x'; 64 * 1024];
                    let mut err = std::io::stderr().lock();
                    for _ in 0..64 {
                        let _ = std::io::Write::write_all(&mut err, &chunk);
                    }
                });
                std::thread::sleep(Duration::from_millis(200));
            }
            other => panic!("unknown scenario {other}"),
        }
        drain.install_signals();
        drain.mark_started();
        // Tells the parent the drain started, a synchronisation point for its next signal.
        let started = drain.clone();
        tokio::spawn(async move {
            started.reached(Phase::Draining).await;
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
    kill(&p, "-INT");
    let (code, _, report) = wait(p, Duration::from_secs(20));
    assert_eq!(code, 1);
    assert_eq!(report.outcome, Outcome::Forced);
    assert_eq!(report.trigger, Some(Trigger::Sigint));
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
    let (code, _, report, err) = wait_stderr(p, Duration::from_secs(20));
    assert_eq!(code, 0, "the drain itself was clean");
    assert!(
        err.contains("waiting for the stop signal (SIGTERM)"),
        "no subscriber: the wait is said on stderr: {err}"
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
    let mut p = spawn(
        "a_second_signal_of_any_kind_forces_the_exit",
        "stuck-request",
    );
    kill(&p, "-TERM");
    // Synchronisation point: the child says the first signal started the drain, so the
    // second is a delivery of its own (pending signals of one kind would merge).
    wait_for_stdout(&mut p, "DRAINING");
    kill(&p, "-TERM");
    let (code, _, report) = wait(p, Duration::from_secs(20));
    assert_eq!(code, 1);
    assert_eq!(report.outcome, Outcome::Forced);
    assert_eq!(report.trigger, Some(Trigger::Sigterm));
    assert_exit_event(&report, 1);
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
        ("/dev/full", "No space left on device"),
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
        assert!(
            report.sink_errors.iter().any(|e| e.contains(path)),
            "{:?}",
            report.sink_errors
        );
    }
    // `/dev/full` is still the device: it was written in place, never renamed over.
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
