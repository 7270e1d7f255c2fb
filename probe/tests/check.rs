//! `lameduck-probe check` against real services: the example service, the baselines beside it
//! (`examples/baseline.rs`: naive and fixed-sleep), a shell-form wrapper as PID 1 of a PID
//! namespace (root), and Python's `http.server`. Each run starts the real binary, which starts
//! the real service, sends it real requests on 127.0.0.1 and real signals.
//!
//! The examples must be built first, from the workspace root:
//! `cargo build --example service --example baseline --features admin`
//! (`cargo test --workspace --all-features` builds them too). `LAMEDUCK_CHECK_SERVICE`
//! overrides the service's path; the baseline is the `baseline` next to it.

use std::net::TcpListener;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

/// One check at a time: each judges timing, and two at once on a small machine disturb it.
static SERIAL: Mutex<()> = Mutex::new(());

fn service_bin() -> PathBuf {
    if let Ok(p) = std::env::var("LAMEDUCK_CHECK_SERVICE") {
        return p.into();
    }
    // target/<profile>/deps/check-… → target/<profile>/examples/service
    let exe = std::env::current_exe().expect("test binary path");
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("examples").join("service"))
        .expect("target directory");
    assert!(
        bin.is_file(),
        "{} is missing: build it first with `cargo build --example service --features admin` \
         from the workspace root (or set LAMEDUCK_CHECK_SERVICE)",
        bin.display()
    );
    bin
}

/// `examples/baseline` (the shutdowns lameduck is compared against), next to the service.
fn baseline_bin() -> String {
    let bin = service_bin().with_file_name("baseline");
    assert!(
        bin.is_file(),
        "{} is missing: build it first with `cargo build --example baseline --features admin`",
        bin.display()
    );
    bin.display().to_string()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn scratch(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe
        .ancestors()
        .nth(3)
        .unwrap()
        .join("check-tests")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

struct Run {
    out: Output,
    json: Value,
    junit: PathBuf,
    /// The checker's peak resident memory, in kB.
    peak_kb: u64,
}

impl Run {
    fn verdict(&self, name: &str) -> String {
        self.contract(name)["verdict"].as_str().unwrap().to_owned()
    }

    fn has(&self, name: &str) -> bool {
        self.json["contracts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["name"] == name)
    }

    fn notes(&self) -> Vec<String> {
        self.json["notes"].as_array().map_or_else(Vec::new, |n| {
            n.iter().map(|e| e.as_str().unwrap().to_owned()).collect()
        })
    }

    fn contract(&self, name: &str) -> &Value {
        self.json["contracts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no contract {name}: {}", self.table()))
    }

    fn summary(&self, name: &str) -> String {
        self.contract(name)["summary"].as_str().unwrap().to_owned()
    }

    fn evidence(&self, name: &str) -> Vec<String> {
        self.contract(name)["evidence"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_str().unwrap().to_owned())
            .collect()
    }

    fn table(&self) -> String {
        format!(
            "{}\n{}",
            String::from_utf8_lossy(&self.out.stdout),
            String::from_utf8_lossy(&self.out.stderr)
        )
    }
}

/// The checker under test; `LAMEDUCK_PROBE_BIN` runs another build against the same tests
/// (an older one, to see a test fail before its fix).
fn probe_bin() -> PathBuf {
    std::env::var_os("LAMEDUCK_PROBE_BIN").map_or_else(
        || env!("CARGO_BIN_EXE_lameduck-probe").into(),
        PathBuf::from,
    )
}

/// Runs `lameduck-probe check FLAGS -- COMMAND`, with JSON and JUnit written to `dir`; its
/// output goes to files there. Panics when the check is still running after [`HUNG`].
/// Checks on every run that the exit code and the JUnit file agree.
fn check(dir: &Path, flags: &[&str], command: &[&str]) -> Run {
    let json = dir.join("check.json");
    let junit = dir.join("check.junit.xml");
    let (stdout, stderr) = (dir.join("check.stdout"), dir.join("check.stderr"));
    let mut child = Command::new(probe_bin())
        .arg("check")
        .args(flags)
        .args(["--json", json.to_str().unwrap()])
        .args(["--junit", junit.to_str().unwrap()])
        .arg("--")
        .args(command)
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .expect("run lameduck-probe check");
    // Peak resident memory (VmHWM only grows), read until the exit.
    let status_path = format!("/proc/{}/status", child.id());
    let started = Instant::now();
    let mut peak_kb = 0;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if let Ok(text) = std::fs::read_to_string(&status_path) {
            if let Some(kb) = text
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            {
                peak_kb = peak_kb.max(kb);
            }
        }
        if started.elapsed() > HUNG {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the check still ran after {HUNG:?}; stdout:\n{}",
                std::fs::read_to_string(&stdout).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = Output {
        status,
        stdout: std::fs::read(&stdout).unwrap(),
        stderr: std::fs::read(&stderr).unwrap(),
    };
    let text = std::fs::read_to_string(&json).unwrap_or_else(|e| {
        panic!(
            "no JSON ({e}); stdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let run = Run {
        out,
        json: serde_json::from_str(&text).unwrap(),
        junit,
        peak_kb,
    };
    eprintln!("{}", run.table());
    let (_, failures, _) = parse_junit(&run.junit);
    assert_eq!(
        run.out.status.success(),
        failures == 0,
        "the exit code and the JUnit file disagree: {failures} failures: {}",
        run.table()
    );
    run
}

/// Longest a check in these tests may run.
const HUNG: Duration = Duration::from_secs(90);

/// The example service's flags and the check's flags aimed at it.
fn service_setup(dir: &Path) -> (Vec<String>, Vec<String>) {
    let (listen, admin) = (free_port(), free_port());
    let report = dir.join("report.json");
    let service = vec![
        service_bin().display().to_string(),
        "--listen".into(),
        format!("127.0.0.1:{listen}"),
        "--admin".into(),
        format!("127.0.0.1:{admin}"),
        "--report-file".into(),
        report.display().to_string(),
    ];
    let flags = vec![
        "--target".into(),
        format!("127.0.0.1:{listen}"),
        "--ready".into(),
        format!("http://127.0.0.1:{admin}/readyz"),
        "--live".into(),
        format!("http://127.0.0.1:{admin}/livez"),
        "--report-file".into(),
        report.display().to_string(),
        "--warmup".into(),
        "1500ms".into(),
        "--drain-window".into(),
        "1500ms".into(),
    ];
    (service, flags)
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Parses the JUnit file with Python's XML parser (a real one, not ours) and returns
/// (test cases, failures attribute, skipped attribute).
fn parse_junit(path: &Path) -> (usize, usize, usize) {
    let script = "import sys, xml.etree.ElementTree as ET\n\
                  root = ET.parse(sys.argv[1]).getroot()\n\
                  assert root.tag == 'testsuites', root.tag\n\
                  suite = root.find('testsuite')\n\
                  cases = suite.findall('testcase')\n\
                  fails = sum(1 for c in cases if c.find('failure') is not None)\n\
                  assert fails == int(suite.get('failures')), (fails, suite.get('failures'))\n\
                  print(len(cases), suite.get('failures'), suite.get('skipped'))\n";
    let out = Command::new("python3")
        .args(["-c", script, path.to_str().unwrap()])
        .output()
        .expect("python3 parses the JUnit file");
    assert!(
        out.status.success(),
        "the JUnit file is not valid XML: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(path).unwrap_or_default()
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let n: Vec<usize> = text
        .split_whitespace()
        .map(|w| w.parse().unwrap())
        .collect();
    (n[0], n[1], n[2])
}

#[test]
fn naive_service_fails_with_the_lost_requests_listed() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("naive");
    let (mut service, flags) = service_setup(&dir);
    service[0] = baseline_bin();
    service.push("--naive".into());
    let run = check(&dir, &strs(&flags), &strs(&service));
    assert_eq!(run.out.status.code(), Some(1), "{}", run.table());
    assert_eq!(run.verdict("startup"), "pass");
    assert_eq!(run.verdict("in_flight"), "fail", "{}", run.table());
    // Each lost request by id, with where it was and when.
    let lost: Vec<String> = run
        .evidence("in_flight")
        .into_iter()
        .filter(|e| e.contains(" lost at t+"))
        .collect();
    assert!(!lost.is_empty(), "{}", run.table());
    assert!(
        lost.iter()
            .all(|l| l.contains("started t") && l.contains("conn ")),
        "{lost:?}"
    );
    assert!(
        lost.iter()
            .any(|l| l.contains(" slow ") || l.contains(" stream ")),
        "slow requests and streams in flight were cut: {lost:?}"
    );
    assert_eq!(run.verdict("listener_open"), "fail", "{}", run.table());
    assert_eq!(
        run.verdict("readiness"),
        "fail",
        "never flips: {}",
        run.table()
    );
    // --report-file was given, so a report is expected; the naive mode writes none.
    assert_eq!(run.verdict("report"), "fail", "{}", run.table());
    assert!(
        run.summary("report").contains("--report-file"),
        "{}",
        run.table()
    );
    // A handler is installed (tokio's), and the process reacted by exiting at once.
    assert_eq!(run.verdict("stop_signal"), "pass", "{}", run.table());
    let table = String::from_utf8_lossy(&run.out.stdout);
    assert!(table.contains("in_flight        FAIL"), "{table}");

    let (cases, failures, _) = parse_junit(&run.junit);
    assert_eq!(cases, 9);
    assert!(failures >= 4, "{failures}");
}

#[test]
fn lameduck_default_passes_every_contract() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("lameduck");
    let (mut service, mut flags) = service_setup(&dir);
    service.extend(["--grace-period".into(), "12s".into()]);
    flags.extend(["--grace-period".into(), "12s".into()]);
    let run = check(&dir, &strs(&flags), &strs(&service));
    for c in run.json["contracts"].as_array().unwrap() {
        assert_eq!(c["verdict"], "pass", "{}: {}", c["name"], run.table());
    }
    assert_eq!(run.out.status.code(), Some(0), "{}", run.table());
    assert!(
        run.summary("stop_signal").contains("caught by"),
        "{}",
        run.table()
    );
    let (cases, failures, skipped) = parse_junit(&run.junit);
    assert_eq!((cases, failures, skipped), (9, 0, 0));
    // Served 1.5 s before the stop: the drain waited to max by design, and the run says why
    // without failing the service for it.
    assert!(
        run.notes()
            .iter()
            .any(|n| n.contains("waited to max") && n.contains("--warmup 16s")),
        "{:?}",
        run.notes()
    );
}

#[test]
fn lameduck_behind_a_prestop_hook_over_http2_passes_every_contract() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("lameduck-prestop-h2");
    let (mut service, mut flags) = service_setup(&dir);
    service.extend(["--grace-period".into(), "12s".into()]);
    // The admin URL is the readiness URL's authority: the hook of examples/k8s.
    let ready = flags[3].clone();
    let drain = ready.replace("/readyz", "/drain?wait=drained");
    flags.extend([
        "--grace-period".into(),
        "12s".into(),
        "--http".into(),
        "2".into(),
        "--prestop-http".into(),
        drain,
    ]);
    let run = check(&dir, &strs(&flags), &strs(&service));
    for c in run.json["contracts"].as_array().unwrap() {
        assert_eq!(c["verdict"], "pass", "{}: {}", c["name"], run.table());
    }
    assert!(
        run.summary("keepalive_close").contains("GOAWAY"),
        "{}",
        run.table()
    );
    let prestop = run.json["prestop"].as_str().unwrap();
    assert!(prestop.contains(": 200 (httpGet"), "{prestop}");
    assert!(
        run.json["contracts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["name"] == "prestop" && c["verdict"] == "pass"),
        "{}",
        run.table()
    );
}

/// A preStop `/drain` the service refuses (its admin token is not the hook's: the hook sends
/// none) told the service nothing; kubelet ignores a hook's status, so `check` is where it
/// shows: the `prestop` contract fails and names the token, and the run fails.
#[test]
fn a_prestop_hook_the_service_refuses_fails_the_check_and_names_the_token() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("lameduck-prestop-401");
    let (service, mut flags) = service_setup(&dir);
    // `env` execs the service: the same pid, with a token the hook does not send.
    let mut with_token = vec![
        "env".to_owned(),
        "LAMEDUCK_ADMIN_TOKEN=only-the-service-knows".to_owned(),
    ];
    with_token.extend(service);
    with_token.extend(["--grace-period".into(), "12s".into()]);
    let drain = flags[3].replace("/readyz", "/drain?wait=drained");
    flags.extend([
        "--grace-period".into(),
        "12s".into(),
        "--prestop-http".into(),
        drain,
    ]);
    let run = check(&dir, &strs(&flags), &strs(&with_token));
    let prestop = run.json["contracts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "prestop")
        .unwrap_or_else(|| panic!("no prestop contract: {}", run.table()));
    assert_eq!(prestop["verdict"], "fail", "{}", run.table());
    let summary = prestop["summary"].as_str().unwrap();
    assert!(
        summary.contains("refused (401)") && summary.contains("LAMEDUCK_ADMIN_TOKEN"),
        "{summary}"
    );
    assert_eq!(run.out.status.code(), Some(1), "{}", run.table());
    assert!(run.json["prestop"]
        .as_str()
        .unwrap()
        .contains(": 401 (httpGet"));
}

#[test]
fn a_mesh_rewritten_kubelet_probe_with_the_header_stays_serving_through_the_window() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("rewritten-probe");
    let (service, mut flags) = service_setup(&dir);
    flags.extend([
        "--grace-period".into(),
        "30s".into(),
        "--probe-header".into(),
        "User-Agent: Go-http-client/1.1".into(),
        "--probe-header".into(),
        "K-Kubelet-Probe: queue".into(),
        "--expect-readiness".into(),
        "serving".into(),
    ]);
    let run = check(&dir, &strs(&flags), &strs(&service));
    assert_eq!(run.verdict("readiness"), "pass", "{}", run.table());
    assert_eq!(run.out.status.code(), Some(0), "{}", run.table());
    // The service's report says how it classified the probe.
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    let sources = report["probe_sources"]["sources"].as_array().unwrap();
    let kubelet = sources
        .iter()
        .find(|s| s["header"] == "K-Kubelet-Probe")
        .unwrap_or_else(|| panic!("{sources:?}"));
    assert_eq!(kubelet["classified_as"], "kubelet");
    assert_eq!(kubelet["user_agent"], "Go-http-client/1.1");
    assert!(kubelet["while_draining"].as_u64().unwrap() > 0, "{kubelet}");
}

#[test]
fn fixed_sleep_keeps_serving_but_never_tells_keepalive_clients() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("fixed-sleep");
    let (mut service, mut flags) = service_setup(&dir);
    service[0] = baseline_bin();
    service.extend(["--fixed-sleep".into(), "2500ms".into()]);
    flags.extend(["--grace-period".into(), "10s".into()]);
    let run = check(&dir, &strs(&flags), &strs(&service));
    assert_eq!(run.out.status.code(), Some(1), "{}", run.table());
    // What the sleep buys: the listener stays open, in-flight work finishes, readiness flips,
    // the exit is clean.
    for name in [
        "readiness",
        "liveness",
        "stop_signal",
        "listener_open",
        "in_flight",
        "exit",
    ] {
        assert_eq!(run.verdict(name), "pass", "{name}: {}", run.table());
    }
    // What it does not: pooled clients are never told to move.
    assert_eq!(run.verdict("keepalive_close"), "fail", "{}", run.table());
    assert!(
        run.summary("keepalive_close").contains("Connection: close"),
        "{}",
        run.table()
    );
    assert_eq!(run.verdict("report"), "fail", "{}", run.table());
}

#[test]
fn shell_form_as_pid1_fails_the_signal_contract() {
    // Needs root (or unprivileged user namespaces) for a new PID namespace.
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let probe = Command::new("unshare")
        .args(["--pid", "--fork", "--", "true"])
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        let msg = "CHECK TEST SKIPPED: cannot create a PID namespace here (run as root)";
        if std::env::var("LAMEDUCK_E2E").as_deref() == Ok("require") {
            panic!("{msg}, and LAMEDUCK_E2E=require");
        }
        eprintln!("\n!!!!!!!! {msg} !!!!!!!!\n");
        return;
    }
    let dir = scratch("shell-pid1");
    let (service, mut flags) = service_setup(&dir);
    // What a shell-form CMD runs: /bin/sh -c "<command>", the shell staying PID 1 (the
    // trailing `exit` keeps it from exec-ing the service itself).
    let script = format!("{} ; exit $?", service.join(" "));
    flags.extend([
        "--grace-period".into(),
        "4s".into(),
        "--pid-namespace".into(),
    ]);
    let run = check(&dir, &strs(&flags), &["sh", "-c", &script]);
    assert_eq!(run.out.status.code(), Some(1), "{}", run.table());
    assert_eq!(run.verdict("stop_signal"), "fail", "{}", run.table());
    let why = run.summary("stop_signal");
    assert!(
        why.contains("PID 1 of its PID namespace") && why.contains("no SIGTERM handler"),
        "{why}"
    );
    assert!(why.contains("SIGKILLed at t+4000 ms"), "{why}");
    assert_eq!(run.verdict("exit"), "fail", "{}", run.table());
    assert!(run.summary("exit").contains("SIGKILLed"), "{}", run.table());
    // Everything else about the service is fine: it is the wrapper that loses the signal.
    assert_eq!(run.verdict("startup"), "pass");
    assert_eq!(run.verdict("listener_open"), "pass", "{}", run.table());
}

#[test]
fn python_http_server_gets_a_sensible_verdict() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("python");
    let script = dir.join("server.py");
    std::fs::write(
        &script,
        "import sys, time, urllib.parse\n\
         from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler\n\
         class H(BaseHTTPRequestHandler):\n\
         \x20   protocol_version = 'HTTP/1.1'\n\
         \x20   def do_GET(self):\n\
         \x20       u = urllib.parse.urlparse(self.path)\n\
         \x20       if u.path == '/slow':\n\
         \x20           time.sleep(int(urllib.parse.parse_qs(u.query).get('ms', ['0'])[0]) / 1000)\n\
         \x20       self.send_response(200)\n\
         \x20       self.send_header('Content-Length', '2')\n\
         \x20       self.end_headers()\n\
         \x20       self.wfile.write(b'ok')\n\
         \x20   def log_message(self, *args):\n\
         \x20       pass\n\
         ThreadingHTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n",
    )
    .unwrap();
    let port = free_port();
    let run = check(
        &dir,
        &[
            "--target",
            &format!("127.0.0.1:{port}"),
            "--ready",
            &format!("http://127.0.0.1:{port}/"),
            "--stream-rate",
            "0",
            "--warmup",
            "1500ms",
            "--drain-window",
            "1s",
            "--grace-period",
            "5s",
        ],
        &["python3", script.to_str().unwrap(), &port.to_string()],
    );
    assert_eq!(run.out.status.code(), Some(1), "{}", run.table());
    assert_eq!(run.verdict("startup"), "pass", "{}", run.table());
    // No SIGTERM handler: the default action kills it at once, mid-request.
    assert_eq!(run.verdict("stop_signal"), "warn", "{}", run.table());
    assert!(
        run.summary("stop_signal").contains("without a handler"),
        "{}",
        run.table()
    );
    assert_eq!(run.verdict("exit"), "warn", "{}", run.table());
    assert!(run.summary("exit").contains("143"), "{}", run.table());
    assert_eq!(run.verdict("in_flight"), "fail", "{}", run.table());
    assert_eq!(run.verdict("listener_open"), "fail", "{}", run.table());
    assert_eq!(run.verdict("liveness"), "not_measured");
    // Not a lameduck service and none expected: the contract is left out, with a note.
    assert!(!run.has("report"), "{}", run.table());
    assert!(
        run.notes()
            .iter()
            .any(|n| n.starts_with("report: left out")),
        "{}",
        run.table()
    );
    let (cases, failures, _) = parse_junit(&run.junit);
    assert_eq!(cases, 8);
    assert!(failures >= 3, "JUnit red: {failures}");
}

/// A Python HTTP server written for these tests: `/`, `/slow?ms=`, `/stream?ms=` and
/// `/readyz` on one port. Words after the port choose its behaviour:
///
/// * `graceful`: on SIGTERM, `/readyz` answers 503, every answer says `Connection: close`,
///   new connections are still served for 3 s; then it stops accepting, lets the requests
///   running finish, closes idle connections and exits 0. A correct shutdown, no lameduck.
/// * `big-readyz`: `/readyz` answers 200 with a 300 MB body.
/// * `/prestop` always answers an endless chunked body; `/drain` starts the drain SIGTERM
///   starts (a preStop endpoint).
/// * `no-slow-routes`: `/slow` and `/stream` answer 404 (a service with routes of its own).
/// * `bigline`: writes a 400 MB line without a newline to stdout at start.
/// * `badutf8`: before it serves, writes 200 lines of 256 KiB of invalid UTF-8 to stdout and
///   to stderr (each byte becomes three in a lossy conversion).
/// * `evil`: a process name and a drain-report line on stderr with terminal escapes in them.
/// * `daemon`: starts `sleep 300` in a session of its own (setsid), its pid in `daemon.pid`.
/// * `pidfile`: writes its pid to `server.pid`.
fn python_server(dir: &Path) -> PathBuf {
    let script = dir.join("server.py");
    std::fs::write(
        &script,
        r#"import os, signal, socket, subprocess, sys, threading, time, urllib.parse
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
port, modes = int(sys.argv[1]), set(sys.argv[2:])
draining = threading.Event()
conns, lock = set(), threading.Lock()

class H(BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    timeout = 10
    def log_message(self, *args):
        pass
    def setup(self):
        super().setup()
        with lock:
            conns.add(self)
    def finish(self):
        with lock:
            conns.discard(self)
        super().finish()
    def head(self, status, length=None):
        self.send_response(status)
        if length is None:
            self.send_header('Transfer-Encoding', 'chunked')
        else:
            self.send_header('Content-Length', str(length))
        if draining.is_set():
            self.send_header('Connection', 'close')
        self.end_headers()
    def chunk(self, data):
        self.wfile.write(b'%x\r\n%s\r\n' % (len(data), data))
    def do_GET(self):
        u = urllib.parse.urlparse(self.path)
        ms = int(urllib.parse.parse_qs(u.query).get('ms', ['0'])[0])
        if 'no-slow-routes' in modes and u.path in ('/slow', '/stream'):
            self.head(404, 9)
            self.wfile.write(b'not found')
        elif u.path == '/readyz' and draining.is_set():
            self.head(503, 8)
            self.wfile.write(b'draining')
        elif u.path == '/readyz' and 'big-readyz' in modes:
            block = b'r' * (1 << 20)
            self.head(200, 300 * len(block))
            for _ in range(300):
                self.wfile.write(block)
        elif u.path == '/drain':
            on_term()
            self.head(200, 2)
            self.wfile.write(b'ok')
        elif u.path == '/prestop':
            self.head(200)
            block = b'p' * 65536
            while True:
                self.chunk(block)
        elif u.path == '/stream':
            self.head(200)
            end = time.time() + ms / 1000
            while time.time() < end:
                self.chunk(b'ok')
                self.wfile.flush()
                time.sleep(0.1)
            self.wfile.write(b'0\r\n\r\n')
        else:
            if u.path == '/slow':
                time.sleep(ms / 1000)
            self.head(200, 2)
            self.wfile.write(b'ok')

srv = ThreadingHTTPServer(('127.0.0.1', port), H)
srv.daemon_threads = False

def drain():
    draining.wait()
    time.sleep(3)
    srv.shutdown()

# The handler only sets the event: one that started a thread could deadlock on the lock the
# main thread holds while it starts a request's thread.
def on_term(*args):
    draining.set()

if 'graceful' in modes:
    threading.Thread(target=drain, daemon=True).start()
    signal.signal(signal.SIGTERM, on_term)
if 'bigline' in modes:
    def bigline():
        block = b'z' * (1 << 20)
        for _ in range(400):
            sys.stdout.buffer.write(block)
        sys.stdout.flush()
    threading.Thread(target=bigline, daemon=True).start()
if 'badutf8' in modes:
    def flood(stream):
        line = b'\xff' * (256 * 1024 - 1) + b'\n'
        for _ in range(200):
            stream.write(line)
        stream.flush()
    floods = [threading.Thread(target=flood, args=(s,)) for s in (sys.stdout.buffer, sys.stderr.buffer)]
    for t in floods:
        t.start()
    for t in floods:
        t.join()
if 'evil' in modes:
    with open('/proc/self/comm', 'w') as f:
        f.write('ev\x9b2J\x08il')
if 'pidfile' in modes:
    with open('server.pid', 'w') as f:
        f.write(str(os.getpid()))
if 'daemon' in modes:
    subprocess.Popen(['setsid', 'sh', '-c', 'echo $$ > daemon.pid; exec sleep 300'])
srv.serve_forever()
# Stopped accepting: idle keep-alive connections see the end of input, running requests end.
with lock:
    for c in list(conns):
        try:
            c.connection.shutdown(socket.SHUT_RD)
        except OSError:
            pass
srv.server_close()
if 'evil' in modes:
    print('{"outcome":"clean\\u001b]0;pwned\\u0007","exit_code":0,"timeline":[]}', file=sys.stderr)
sys.exit(0)
"#,
    )
    .unwrap();
    script
}

/// `check` flags and command for [`python_server`] with `modes`.
fn python_setup(dir: &Path, modes: &[&str]) -> (Vec<String>, Vec<String>) {
    let script = python_server(dir);
    let port = free_port();
    let flags = vec![
        "--target".into(),
        format!("127.0.0.1:{port}"),
        "--ready".into(),
        format!("http://127.0.0.1:{port}/readyz"),
        "--warmup".into(),
        "1500ms".into(),
        "--drain-window".into(),
        "1s".into(),
        "--grace-period".into(),
        "15s".into(),
    ];
    let mut command = vec![
        "python3".to_owned(),
        script.display().to_string(),
        port.to_string(),
    ];
    command.extend(modes.iter().map(|m| (*m).to_owned()));
    (flags, command)
}

#[test]
fn a_correct_server_without_lameduck_passes() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("python-graceful");
    let (flags, command) = python_setup(&dir, &["graceful"]);
    let run = check(&dir, &strs(&flags), &strs(&command));
    assert_eq!(run.out.status.code(), Some(0), "{}", run.table());
    for name in [
        "startup",
        "readiness",
        "stop_signal",
        "listener_open",
        "in_flight",
        "keepalive_close",
        "exit",
    ] {
        assert_eq!(run.verdict(name), "pass", "{name}: {}", run.table());
    }
    // No --live: not measured, and that is no failure without --strict.
    assert_eq!(run.verdict("liveness"), "not_measured");
    assert!(!run.has("report"), "{}", run.table());
    let (cases, failures, skipped) = parse_junit(&run.junit);
    assert_eq!((cases, failures, skipped), (8, 0, 1));
    let table = String::from_utf8_lossy(&run.out.stdout);
    assert!(table.contains("\nPASS: 7 passed"), "{table}");
}

/// A correct service without `/slow` or `/stream` passes with the guide's flags: the routes it
/// lacks are left out before the run, with a note naming the flags, not filed as lost requests.
#[test]
fn a_correct_server_without_slow_or_stream_routes_passes_and_the_run_says_what_it_left_out() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("python-no-slow-routes");
    let (flags, command) = python_setup(&dir, &["graceful", "no-slow-routes"]);
    let run = check(&dir, &strs(&flags), &strs(&command));
    assert_eq!(run.out.status.code(), Some(0), "{}", run.table());
    for name in ["listener_open", "keepalive_close", "exit"] {
        assert_eq!(run.verdict(name), "pass", "{name}: {}", run.table());
    }
    // Short requests only: one in flight at the stop is chance, so it passes or is not
    // measured, never fails.
    let in_flight = run.verdict("in_flight");
    assert!(
        in_flight == "pass" || in_flight == "not_measured",
        "{}",
        run.table()
    );
    for (kind, flag) in [("slow", "--slow-path"), ("stream", "--stream-path")] {
        assert!(
            run.notes()
                .iter()
                .any(|n| n.starts_with(&format!("{kind}: left out"))
                    && n.contains("404")
                    && n.contains(flag)),
            "{kind}: {:?}",
            run.notes()
        );
    }
    // Nothing of the kinds left out was sent.
    let records = run.json["requests"].as_u64().unwrap();
    assert!(records > 0, "{}", run.table());
}

/// A path the command line names and the service lacks stops the run before it starts, naming
/// the flag that fixes it; the service is stopped with it.
#[test]
fn a_named_path_the_service_lacks_is_an_error_before_the_run() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("python-named-path-404");
    let (mut flags, command) = python_setup(&dir, &["graceful", "no-slow-routes"]);
    let port: u16 = flags[1].rsplit(':').next().unwrap().parse().unwrap();
    flags.extend(["--slow-path".into(), "/slow?ms={ms}&named=1".into()]);
    let out = Command::new(probe_bin())
        .arg("check")
        .args(&flags)
        .arg("--")
        .args(&command)
        .output()
        .expect("run lameduck-probe check");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("answers 404 to GET /slow?ms=10&named=1")
            && err.contains("--slow-path")
            && err.contains("--slow-rate 0"),
        "{err}"
    );
    // The service went with the run: its port is free again.
    std::net::TcpListener::bind(("127.0.0.1", port)).expect("the service still holds its port");
}

#[test]
fn strict_fails_what_was_not_measured_and_the_junit_file_says_so() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("python-strict");
    let (mut flags, command) = python_setup(&dir, &["graceful"]);
    flags.push("--strict".into());
    let run = check(&dir, &strs(&flags), &strs(&command));
    assert_eq!(run.verdict("liveness"), "not_measured");
    assert_eq!(run.out.status.code(), Some(1), "{}", run.table());
    let (_, failures, skipped) = parse_junit(&run.junit);
    assert_eq!((failures, skipped), (1, 0));
}

/// Bounded reads: the checker's memory stays far below what the service sends.
const BOUNDED_KB: u64 = 150 * 1024;

#[test]
fn an_endless_prestop_body_and_a_300_mb_readyz_body_are_read_bounded() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("python-big-bodies");
    let (mut flags, command) = python_setup(&dir, &["graceful", "big-readyz"]);
    let prestop = flags[3].replace("/readyz", "/prestop");
    flags.extend(["--prestop-http".into(), prestop]);
    let run = check(&dir, &strs(&flags), &strs(&command));
    assert!(run.peak_kb < BOUNDED_KB, "peak {} kB", run.peak_kb);
    // The hook ended on the bounded read, then the signal went as usual.
    let hook = run.json["prestop"].as_str().unwrap();
    assert!(hook.contains(": 200 (httpGet"), "{hook}");
    assert_eq!(run.verdict("startup"), "pass", "{}", run.table());
    assert_eq!(run.verdict("exit"), "pass", "{}", run.table());
}

#[test]
fn a_400_mb_stdout_line_without_a_newline_is_read_bounded() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("python-bigline");
    let (flags, command) = python_setup(&dir, &["graceful", "bigline"]);
    let run = check(&dir, &strs(&flags), &strs(&command));
    assert!(run.peak_kb < BOUNDED_KB, "peak {} kB", run.peak_kb);
    assert_eq!(run.verdict("exit"), "pass", "{}", run.table());
}

#[test]
fn lines_of_invalid_utf8_are_kept_bounded_after_their_conversion() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("python-badutf8");
    let (flags, command) = python_setup(&dir, &["graceful", "badutf8"]);
    let run = check(&dir, &strs(&flags), &strs(&command));
    let json_bytes = std::fs::metadata(dir.join("check.json")).unwrap().len();
    eprintln!("peak {} kB, JSON {json_bytes} bytes", run.peak_kb);
    // 100 MiB written, 300 MiB once converted: what is kept is a few lines' worth.
    assert!(run.peak_kb < STORE_BOUNDED_KB, "peak {} kB", run.peak_kb);
    assert!(json_bytes < 256 * 1024, "JSON {json_bytes} bytes");
    let tail = run.json["stderr_tail"].as_array().unwrap();
    assert_eq!(tail.len(), 20, "{}", run.table());
    assert!(tail.iter().all(|l| l.as_str().unwrap().len() <= 2048));
    assert_eq!(run.verdict("exit"), "pass", "{}", run.table());
}

/// The checker's peak with the service's output store full: its runtime and traffic, and a
/// few lines.
const STORE_BOUNDED_KB: u64 = 64 * 1024;

#[test]
fn a_report_file_that_is_a_fifo_is_refused_not_waited_on() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("python-fifo");
    let fifo = dir.join("report.fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let (mut flags, command) = python_setup(&dir, &["graceful"]);
    flags.extend(["--report-file".into(), fifo.display().to_string()]);
    // `check` panics after HUNG if the read waits for a writer.
    let run = check(&dir, &strs(&flags), &strs(&command));
    assert_eq!(run.verdict("report"), "fail", "{}", run.table());
    assert!(
        run.summary("report").contains("not a regular file"),
        "{}",
        run.table()
    );
}

#[test]
fn a_report_file_that_cannot_be_read_fails_the_report_and_names_why() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("report-file-unread");
    let fifo = dir.join("report.fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let large = dir.join("large.json");
    std::fs::write(&large, vec![b' '; 5 * 1024 * 1024]).unwrap();
    let missing = dir.join("missing.json");
    let cases: [(&Path, &str); 4] = [
        (&missing, "No such file or directory"),
        (&fifo, "not a regular file"),
        (Path::new("/dev/zero"), "not a regular file"),
        (&large, "larger than"),
    ];
    for (path, why) in cases {
        let (mut service, mut flags) = service_setup(&dir);
        // No report file: the service writes its report to stderr, which must not stand in
        // for the file named.
        service.truncate(5);
        service.extend(["--grace-period".into(), "12s".into()]);
        let at = flags.iter().position(|f| f == "--report-file").unwrap();
        flags[at + 1] = path.display().to_string();
        flags.extend(["--grace-period".into(), "12s".into()]);
        let run = check(&dir, &strs(&flags), &strs(&service));
        let summary = run.summary("report");
        assert_eq!(
            run.verdict("report"),
            "fail",
            "{}: {}",
            path.display(),
            run.table()
        );
        assert!(
            summary.contains(&path.display().to_string()) && summary.contains(why),
            "{}: {summary}",
            path.display()
        );
        assert!(summary.contains("on stderr was not used"), "{summary}");
        assert_eq!(run.out.status.code(), Some(1), "{}", run.table());
    }
}

#[test]
fn a_daemon_the_service_started_in_its_own_session_does_not_outlive_the_check() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("python-daemon");
    let (flags, command) = python_setup(&dir, &["graceful", "daemon"]);
    let run = check(&dir, &strs(&flags), &strs(&in_dir(&dir, &command)));
    let pid = daemon_pid(&dir).expect("the daemon wrote its pid");
    assert!(!running(pid), "the daemon (pid {pid}) still runs");
    assert!(
        run.notes()
            .iter()
            .any(|n| n.contains(&format!("pid {pid} (sleep)"))),
        "{:?}",
        run.notes()
    );
}

#[test]
fn terminal_escapes_from_the_process_name_and_the_report_are_not_printed() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("python-evil");
    let (flags, command) = python_setup(&dir, &["graceful", "evil"]);
    let run = check(&dir, &strs(&flags), &strs(&command));
    let text = String::from_utf8_lossy(&run.out.stdout);
    // No control character but the line ends: no C0 (ESC, BEL, backspace), no C1 (CSI).
    assert!(
        !text.chars().any(|c| c.is_control() && c != '\n'),
        "{}",
        run.table()
    );
    // Still shown, as text: the name in the signal contract, the outcome in the report's.
    assert!(text.contains("ev\\u{9b}2J\\u{8}il"), "{text}");
    assert!(text.contains("clean\\u{1b}]0;pwned\\u{7}"), "{text}");
}

/// `command` run from `dir` (where the daemon writes its pid).
fn in_dir(dir: &Path, command: &[String]) -> Vec<String> {
    let mut cmd = vec![
        "sh".to_owned(),
        "-c".to_owned(),
        "cd \"$0\" && exec \"$@\"".to_owned(),
        dir.display().to_string(),
    ];
    cmd.extend(command.iter().cloned());
    cmd
}

fn daemon_pid(dir: &Path) -> Option<u32> {
    Some(pids(&dir.join("daemon.pid"))?[0])
}

/// The pids in the file at `path`, separated by white space; `None` while it is missing or
/// not yet whole.
fn pids(path: &Path) -> Option<Vec<u32>> {
    let text = std::fs::read_to_string(path).ok()?;
    let pids: Option<Vec<u32>> = text.split_whitespace().map(|p| p.parse().ok()).collect();
    pids.filter(|p| !p.is_empty())
}

/// `true` while `pid` exists and is not a zombie (one waiting for its new parent to reap it).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("State:"))
        .is_some_and(|s| !s.trim().starts_with('Z'))
}

/// A check started on [`python_server`] with `modes` (`daemon`, `pidfile`), in its warm-up,
/// and its service serving.
struct Started {
    child: std::process::Child,
    target: String,
    junit: PathBuf,
    started: Instant,
}

fn start_check(dir: &Path, modes: &[&str]) -> Started {
    start_check_with(dir, modes, &[], &[])
}

/// [`start_check`] with `extra` flags, waiting also for the pid files `pid_files` in `dir`.
fn start_check_with(dir: &Path, modes: &[&str], extra: &[String], pid_files: &[&str]) -> Started {
    let (mut flags, command) = python_setup(dir, modes);
    // Long enough to be interrupted in the warm-up.
    flags.extend(["--warmup".into(), "60s".into()]);
    flags.extend(extra.iter().cloned());
    let target = flags[1].clone();
    let junit = dir.join("check.junit.xml");
    let child = Command::new(probe_bin())
        .arg("check")
        .args(&flags)
        .args(["--junit", junit.to_str().unwrap()])
        .arg("--")
        .args(in_dir(dir, &command))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    // Each pid file whole (a reader may see one half written), and the service serving.
    let mut files: Vec<&str> = pid_files.to_vec();
    for (mode, file) in [("daemon", "daemon.pid"), ("pidfile", "server.pid")] {
        if modes.contains(&mode) {
            files.push(file);
        }
    }
    while !files.iter().all(|f| pids(&dir.join(f)).is_some())
        || std::net::TcpStream::connect(&target).is_err()
    {
        assert!(started.elapsed() < HUNG, "the service never came up");
        std::thread::sleep(Duration::from_millis(100));
    }
    Started {
        child,
        target,
        junit,
        started,
    }
}

impl Started {
    /// Sends `signal` (`INT`, `HUP`, `KILL`) to the check and waits for its exit.
    fn signal(&mut self, signal: &str) -> std::process::ExitStatus {
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if self.started.elapsed() > HUNG {
                let _ = self.child.kill();
                panic!("the check did not end on SIG{signal}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// SIGKILLs the processes still running when dropped: a test that fails leaves nothing behind.
struct Leftovers(Vec<u32>);

impl Drop for Leftovers {
    fn drop(&mut self) {
        for pid in self.0.iter().filter(|p| running(**p)) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
}

/// Waits until none of `pids` runs and nothing accepts on `target`; `false` if either still
/// holds after `limit` (an upper bound: the kernel delivers a signal at once, but a process
/// whose main thread is a zombie may still hold its sockets until its other threads exit).
fn gone_within(pids: &[u32], target: Option<&str>, limit: Duration) -> bool {
    let since = Instant::now();
    while pids.iter().any(|p| running(*p))
        || target.is_some_and(|t| std::net::TcpStream::connect(t).is_ok())
    {
        if since.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

/// The check ends on `signal` (INT, HUP) with 130, the service and the daemon it started in
/// its own session gone, and a JUnit file that says so.
fn interrupted_takes_everything_with_it(name: &str, signal: &str) {
    let dir = scratch(name);
    let mut check = start_check(&dir, &["graceful", "daemon", "pidfile"]);
    let daemon = daemon_pid(&dir).unwrap();
    let service = server_pid(&dir).unwrap();
    let _leftovers = Leftovers(vec![daemon, service]);
    let status = check.signal(signal);
    assert_eq!(status.code(), Some(130), "SIG{signal}: {status}");
    assert!(!running(daemon), "the daemon (pid {daemon}) still runs");
    assert!(
        gone_within(&[service], Some(&check.target), Duration::from_secs(20)),
        "the service (pid {service}) still runs or accepts on {}",
        check.target
    );
    let xml = std::fs::read_to_string(&check.junit).unwrap();
    assert!(
        xml.contains("errors=\"1\"") && xml.contains("interrupted"),
        "{xml}"
    );
}

fn server_pid(dir: &Path) -> Option<u32> {
    Some(pids(&dir.join("server.pid"))?[0])
}

#[test]
fn an_interrupted_check_takes_the_service_and_its_daemon_with_it() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    interrupted_takes_everything_with_it("python-interrupted", "INT");
}

#[test]
fn a_hung_up_check_takes_the_service_and_its_daemon_with_it() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    interrupted_takes_everything_with_it("python-hung-up", "HUP");
}

#[test]
fn a_killed_check_takes_the_service_with_it() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("python-killed");
    let mut check = start_check(&dir, &["graceful", "pidfile"]);
    let service = server_pid(&dir).unwrap();
    let _leftovers = Leftovers(vec![service]);
    let status = check.signal("KILL");
    assert_eq!(status.signal(), Some(9), "{status}");
    // No drop ran in the check: only the service's parent-death signal can end it.
    assert!(
        gone_within(&[service], Some(&check.target), Duration::from_secs(20)),
        "the service (pid {service}) still runs or accepts on {} after the check was SIGKILLed",
        check.target
    );
}

/// The children of `pid`, from `/proc/<pid>/task/*/children`.
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|text| {
            text.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

#[test]
fn a_killed_check_takes_its_pid_namespace_with_it() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let probe = Command::new("unshare")
        .args(["--pid", "--fork", "--", "true"])
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        eprintln!("\n!!!!!!!! CHECK TEST SKIPPED: cannot create a PID namespace here !!!!!!!!\n");
        return;
    }
    let dir = scratch("python-killed-pid-namespace");
    let mut check = start_check_with(&dir, &["graceful"], &["--pid-namespace".into()], &[]);
    // unshare, then the service as PID 1 of the namespace.
    let unshare = children(check.child.id());
    assert_eq!(unshare.len(), 1, "{unshare:?}");
    let service = children(unshare[0]);
    assert_eq!(service.len(), 1, "{service:?}");
    let _leftovers = Leftovers(vec![unshare[0], service[0]]);
    let status = check.signal("KILL");
    assert_eq!(status.signal(), Some(9), "{status}");
    assert!(
        gone_within(
            &[unshare[0], service[0]],
            Some(&check.target),
            Duration::from_secs(20)
        ),
        "unshare (pid {}) or the service (pid {}) still runs or accepts on {}",
        unshare[0],
        service[0],
        check.target
    );
}

#[test]
fn what_a_prestop_exec_hook_started_ends_with_the_check() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("prestop-exec-background");
    let (mut flags, command) = python_setup(&dir, &["graceful"]);
    let pid_file = dir.join("hook.pid");
    flags.extend([
        "--prestop-exec".into(),
        format!(
            "sleep 300 >/dev/null 2>&1 & echo $! > '{}'",
            pid_file.display()
        ),
    ]);
    let run = check(&dir, &strs(&flags), &strs(&command));
    let sleep = pids(&pid_file).expect("the hook wrote its pid")[0];
    let _leftovers = Leftovers(vec![sleep]);
    let hook = run.json["prestop"].as_str().unwrap();
    assert!(hook.contains("exit status: 0 (exec"), "{hook}");
    // SIGKILLed once the service was gone, seconds before the check ended.
    assert!(
        gone_within(&[sleep], None, Duration::from_secs(20)),
        "the hook's background sleep (pid {sleep}) still runs"
    );
}

#[test]
fn an_interrupted_prestop_exec_hook_takes_what_it_started_with_it() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("prestop-exec-interrupted");
    let (pid_file, written) = (dir.join("hook.pid"), dir.join("hook.pid.part"));
    // The hook waits on its background sleep: the check is interrupted inside it.
    let hook = format!(
        "sleep 300 >/dev/null 2>&1 & echo $$ $! > '{}' && mv '{0}' '{}'; wait",
        written.display(),
        pid_file.display()
    );
    let extra = [
        "--warmup".to_owned(),
        "1500ms".to_owned(),
        "--prestop-exec".to_owned(),
        hook,
    ];
    let mut check = start_check_with(&dir, &["graceful", "pidfile"], &extra, &["hook.pid"]);
    let hook = pids(&pid_file).unwrap();
    let service = server_pid(&dir).unwrap();
    let _leftovers = Leftovers(vec![hook[0], hook[1], service]);
    let status = check.signal("INT");
    assert_eq!(status.code(), Some(130), "{status}");
    assert!(
        gone_within(&hook, None, Duration::from_secs(20)),
        "the hook (sh {}, its sleep {}) still runs",
        hook[0],
        hook[1]
    );
    assert!(gone_within(
        &[service],
        Some(&check.target),
        Duration::from_secs(20)
    ));
}

/// Every contract passed (liveness unmeasured without `--live`), and a note says how the exec
/// hook was judged (`judged`).
fn passes_with_the_hook_judged(run: &Run, judged: &str) {
    for c in run.json["contracts"].as_array().unwrap() {
        let unmeasured = c["name"] == "liveness" && c["verdict"] == "not_measured";
        assert!(
            c["verdict"] == "pass" || unmeasured,
            "{}: {}",
            c["name"],
            run.table()
        );
    }
    assert_eq!(run.out.status.code(), Some(0), "{}", run.table());
    assert!(
        run.notes()
            .iter()
            .any(|n| n.starts_with("preStop exec: ") && n.contains(judged)),
        "{:?}",
        run.notes()
    );
}

#[test]
fn a_prestop_exec_sleep_is_judged_as_a_sleep_hook_is() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("prestop-exec-sleep");
    let (mut flags, command) = python_setup(&dir, &["graceful"]);
    // Traffic past the signal, so kept connections are seen after the service is told.
    flags.extend([
        "--prestop-exec".into(),
        "sleep 2".into(),
        "--drain-window".into(),
        "3s".into(),
    ]);
    let run = check(&dir, &strs(&flags), &strs(&command));
    passes_with_the_hook_judged(
        &run,
        "as a sleep hook is: it did not tell the service (nothing",
    );
}

#[test]
fn a_prestop_exec_sleep_before_a_lameduck_service_is_judged_by_its_reports_trigger() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("prestop-exec-sleep-lameduck");
    let (mut service, mut flags) = service_setup(&dir);
    service.extend(["--grace-period".into(), "12s".into()]);
    flags.extend([
        "--grace-period".into(),
        "12s".into(),
        "--prestop-exec".into(),
        "sleep 2".into(),
        "--drain-window".into(),
        "3s".into(),
    ]);
    let run = check(&dir, &strs(&flags), &strs(&service));
    passes_with_the_hook_judged(&run, "the drain report's trigger is sigterm");
}

#[test]
fn a_prestop_exec_calling_the_admin_port_is_judged_from_the_reports_drain_start() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // The example's own preStop client, as in examples/k8s for images without curl.
    let dir = scratch("prestop-exec-client");
    let (mut service, mut flags) = service_setup(&dir);
    service.extend(["--grace-period".into(), "12s".into()]);
    let admin = service[4].clone();
    flags.extend([
        "--grace-period".into(),
        "12s".into(),
        "--prestop-exec".into(),
        format!("'{}' prestop --admin {admin}", service[0]),
    ]);
    let run = check(&dir, &strs(&flags), &strs(&service));
    passes_with_the_hook_judged(&run, "it told the service, which is judged from t+");
    assert!(
        run.notes()
            .iter()
            .any(|n| n.contains("trigger is prestop, drain_started at t+")),
        "{:?}",
        run.notes()
    );
}

#[test]
fn a_prestop_exec_calling_a_drain_endpoint_is_judged_from_the_first_changed_answer() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // No report: the hook's call shows in the answers before the signal.
    let dir = scratch("prestop-exec-drain-endpoint");
    let (mut flags, command) = python_setup(&dir, &["graceful"]);
    let drain = flags[3].replace("/readyz", "/drain");
    flags.extend([
        "--prestop-exec".into(),
        format!("python3 -c 'import urllib.request as u; u.urlopen(\"{drain}\")' && sleep 2"),
    ]);
    let run = check(&dir, &strs(&flags), &strs(&command));
    passes_with_the_hook_judged(&run, "it told the service, which is judged from t+");
    assert!(
        run.notes().iter().any(|n| n.contains(" answered at t+")),
        "{:?}",
        run.notes()
    );
}

/// `--kill-after`: the kubelet's SIGKILL at a node shutdown's budget (8 s here), shorter than
/// the 30 s grace the service was told. The example service planning for its grace is killed
/// mid-drain and `exit` fails naming the budget; told the shortest grace it may get
/// (`--shortest-grace 8s`, `LAMEDUCK_SHORTEST_GRACE`), it fits and passes.
#[test]
fn kill_after_a_budget_shorter_than_the_grace_fails_a_drain_planned_for_the_grace() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (shortest, expect) in [(false, "fail"), (true, "pass")] {
        let dir = scratch(if shortest {
            "kill-after-fitted"
        } else {
            "kill-after-killed"
        });
        let (mut service, mut flags) = service_setup(&dir);
        service.extend(["--grace-period".into(), "30s".into()]);
        if shortest {
            service.extend(["--shortest-grace".into(), "8s".into()]);
        }
        flags.extend([
            "--grace-period".into(),
            "30s".into(),
            "--kill-after".into(),
            "8s".into(),
        ]);
        let run = check(&dir, &strs(&flags), &strs(&service));
        assert_eq!(run.verdict("exit"), expect, "{}", run.table());
        let table = run.table();
        if shortest {
            assert_eq!(run.out.status.code(), Some(0), "{table}");
            assert!(
                table.contains("of the 8.0 s --kill-after budget"),
                "{table}"
            );
        } else {
            assert_eq!(run.out.status.code(), Some(1), "{table}");
            assert!(
                table.contains("still running at the --kill-after budget (8.0 s)"),
                "{table}"
            );
        }
    }
}

/// `--kill-after` longer than the grace period means nothing: refused before the run.
#[test]
fn kill_after_longer_than_the_grace_is_refused() {
    let out = Command::new(probe_bin())
        .args([
            "check",
            "--target",
            "127.0.0.1:1",
            "--ready",
            "http://127.0.0.1:1/readyz",
            "--grace-period",
            "10s",
            "--kill-after",
            "15s",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains(
            "--kill-after (15000 ms) must be above zero and at most --grace-period (10000 ms)"
        ),
        "{err}"
    );
}
