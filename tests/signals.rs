//! Real signals delivered to real child processes.
//!
//! Each test re-runs this test binary as a child (selected with `--exact` and an environment
//! variable), so the child is an ordinary process with the coordinator's default signal setup.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lameduck::{Drain, DrainReport, Outcome, Propagation, Trigger};

const CHILD_ENV: &str = "LAMEDUCK_SIGNAL_CHILD";

/// Child side: build a coordinator, announce readiness, run, exit with the report's code.
fn child_main(scenario: &str) -> ! {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let code = rt.block_on(async {
        let drain = Drain::builder()
            .grace_period(Duration::from_secs(3))
            .propagation(Propagation::fixed(Duration::from_millis(200)))
            .termination_log(None)
            .build()
            .unwrap();
        let mut held = None;
        match scenario {
            "idle" => {}
            "stuck-task" => drain.spawn("stuck-task", std::future::pending::<()>()),
            "stuck-request" => held = Some(drain.enter()),
            "prestop" => {}
            other => panic!("unknown scenario {other}"),
        }
        drain.install_signals();
        drain.mark_started();
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
}

fn spawn(test: &str, scenario: &str) -> Proc {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, scenario)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    // Bounded: the child prints READY within a few lines.
    for _ in 0..50 {
        line.clear();
        if stdout.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        if line.trim_end().ends_with("READY") {
            return Proc { child, stdout };
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("child never printed READY");
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
fn wait(mut p: Proc, limit: Duration) -> (i32, Duration, DrainReport) {
    let start = Instant::now();
    loop {
        if let Some(status) = p.child.try_wait().unwrap() {
            let mut err = String::new();
            p.child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            let json = err
                .lines()
                .find(|l| l.starts_with("{\"outcome\""))
                .unwrap_or_else(|| panic!("no report on stderr: {err}"));
            let report: DrainReport = serde_json::from_str(json).unwrap();
            let mut rest = String::new();
            let _ = p.stdout.read_to_string(&mut rest);
            return (status.code().unwrap_or(-1), start.elapsed(), report);
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
    let p = spawn("a_second_sigint_forces_the_exit", "stuck-request");
    kill(&p, "-INT");
    std::thread::sleep(Duration::from_millis(100));
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
    // The drain takes ~200 ms; the process must still be alive well after that.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        p.child.try_wait().unwrap().is_none(),
        "exited before SIGTERM"
    );
    kill(&p, "-TERM");
    let (code, _, report) = wait(p, Duration::from_secs(20));
    assert_eq!(code, 0);
    assert_eq!(report.trigger, Some(Trigger::PreStop));
}
