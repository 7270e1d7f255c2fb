//! `lameduck-probe check` against real services: the example service in its naive,
//! fixed-sleep and lameduck modes, a shell-form wrapper as PID 1 of a PID namespace (root),
//! and Python's `http.server`. Each run starts the real binary, which starts the real service,
//! sends it real requests on 127.0.0.1 and real signals.
//!
//! The example service must be built first, from the workspace root:
//! `cargo build --example service --features admin` (`cargo test --workspace --all-features`
//! builds it too). `LAMEDUCK_CHECK_SERVICE` overrides its path.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

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
}

impl Run {
    fn verdict(&self, name: &str) -> String {
        self.contract(name)["verdict"].as_str().unwrap().to_owned()
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

/// Runs `lameduck-probe check FLAGS -- COMMAND`, with JSON and JUnit written to `dir`.
fn check(dir: &Path, flags: &[&str], command: &[&str]) -> Run {
    let json = dir.join("check.json");
    let junit = dir.join("check.junit.xml");
    let out = Command::new(env!("CARGO_BIN_EXE_lameduck-probe"))
        .arg("check")
        .args(flags)
        .args(["--json", json.to_str().unwrap()])
        .args(["--junit", junit.to_str().unwrap()])
        .arg("--")
        .args(command)
        .output()
        .expect("run lameduck-probe check");
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
    };
    eprintln!("{}", run.table());
    run
}

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
    assert_eq!(run.verdict("report"), "not_measured");
    // A handler is installed (tokio's), and the process reacted by exiting at once.
    assert_eq!(run.verdict("stop_signal"), "pass", "{}", run.table());
    let table = String::from_utf8_lossy(&run.out.stdout);
    assert!(table.contains("in_flight        FAIL"), "{table}");

    let (cases, failures, skipped) = parse_junit(&run.junit);
    assert_eq!(cases, 9);
    assert!(failures >= 3, "{failures}");
    assert!(
        skipped >= 1,
        "the report contract is not measured: {skipped}"
    );
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
    assert_eq!(run.verdict("report"), "not_measured");
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
    assert_eq!(run.verdict("report"), "not_measured");
}
