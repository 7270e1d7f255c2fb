//! The command line: flag parsing and its errors, and the binary end to end (exit codes,
//! messages, the summary and the JSON lines file).

mod common;

use std::process::{Command as Process, Stdio};
use std::time::Duration;

use common::{closed_port, server};
use lameduck_probe::cli::{parse_args, parse_duration, usage, Command};
use lameduck_probe::{ConnectionMode, HttpVersion, Record};

fn run_args(args: &[&str]) -> Box<lameduck_probe::cli::RunArgs> {
    match parse_args(args.iter().copied()) {
        Ok(Command::Run(run)) => run,
        other => panic!("{args:?} gave {other:?}"),
    }
}

fn error(args: &[&str]) -> String {
    parse_args(args.iter().copied()).unwrap_err().to_string()
}

#[test]
fn durations_parse_with_units() {
    for (text, want) in [
        ("30s", Duration::from_secs(30)),
        ("1500ms", Duration::from_millis(1500)),
        ("2m", Duration::from_secs(120)),
        ("1h", Duration::from_secs(3600)),
        ("1m30s", Duration::from_secs(90)),
        ("0.5s", Duration::from_millis(500)),
        ("0.1s", Duration::from_millis(100)),
        (" 10s ", Duration::from_secs(10)),
        ("0s", Duration::ZERO),
    ] {
        assert_eq!(parse_duration(text).unwrap(), want, "{text}");
    }
}

#[test]
fn bad_durations_say_how_to_write_one() {
    for (text, needle) in [
        ("30", "has no unit"),
        ("", "empty duration"),
        ("s", "is not a duration"),
        ("10 s", "unknown unit"),
        ("5d", "unknown unit \"d\""),
        ("1.2.3s", "is not a duration"),
        ("-5s", "is not a duration"),
        ("99999999999h", "too long"),
    ] {
        let err = parse_duration(text).unwrap_err();
        assert!(err.contains(needle), "{text:?}: {err}");
        if needle != "too long" && needle != "unknown unit \"d\"" && needle != "unknown unit" {
            assert!(err.contains("30s"), "shows an example: {err}");
        }
    }
}

#[test]
fn defaults_and_every_flag() {
    let run = run_args(&["--target", "127.0.0.1:8080"]);
    assert_eq!(run.config.target, "127.0.0.1:8080");
    assert_eq!(run.config.short_rate, 20.0);
    assert_eq!(run.config.duration, Duration::from_secs(30));
    assert!(run.config.progress);
    assert!(!run.config.allow_unreachable_start);
    assert!(!run.config.retry_idempotent);
    assert_eq!(run.config.on_off, None);
    assert_eq!(run.out, None);

    let run = run_args(&[
        "--target=http://svc.ns.svc:80",
        "--host",
        "example.test",
        "--http",
        "2",
        "--connections",
        "mixed",
        "--label",
        "ingress",
        "--rate",
        "12.5",
        "--slow-rate=0",
        "--slow",
        "1500ms",
        "--stream-rate",
        "1",
        "--stream",
        "4s",
        "--path",
        "/healthz",
        "--slow-path",
        "/work?ms={ms}",
        "--stream-path",
        "/events?for={ms}",
        "--duration",
        "2m",
        "--drain-wait",
        "20s",
        "--connect-timeout",
        "500ms",
        "--max-in-flight",
        "64",
        "--max-idle",
        "8",
        "--out",
        "probe.jsonl",
        "--allow-unreachable-start",
        "--quiet",
        "--proxy-label",
        "kube-proxy ipvs 1.31",
        "--retry-idempotent",
        "--on-off",
        "200ms/2800ms",
    ]);
    let c = &run.config;
    assert_eq!(c.target, "http://svc.ns.svc:80");
    assert_eq!(c.host.as_deref(), Some("example.test"));
    assert_eq!(c.http, HttpVersion::Http2);
    assert_eq!(c.connections, ConnectionMode::Mixed);
    assert_eq!(c.label, "ingress");
    assert_eq!(c.short_rate, 12.5);
    assert_eq!(c.slow_rate, 0.0);
    assert_eq!(c.slow, Duration::from_millis(1500));
    assert_eq!(c.stream_rate, 1.0);
    assert_eq!(c.stream, Duration::from_secs(4));
    assert_eq!(c.path(lameduck_probe::Kind::Short), "/healthz");
    assert_eq!(c.path(lameduck_probe::Kind::Stream), "/events?for=4000");
    assert_eq!(c.duration, Duration::from_secs(120));
    assert_eq!(c.drain_wait, Duration::from_secs(20));
    assert_eq!(c.connect_timeout, Duration::from_millis(500));
    assert_eq!(c.max_in_flight, 64);
    assert_eq!(c.max_idle, 8);
    assert!(c.allow_unreachable_start);
    assert!(!c.progress);
    assert_eq!(c.proxy_label.as_deref(), Some("kube-proxy ipvs 1.31"));
    assert!(c.retry_idempotent);
    assert_eq!(
        c.on_off,
        Some(lameduck_probe::OnOff {
            on: Duration::from_millis(200),
            off: Duration::from_millis(2800),
        })
    );
    assert_eq!(
        run.out.as_deref(),
        Some(std::path::Path::new("probe.jsonl"))
    );
}

#[test]
fn help_and_version() {
    assert_eq!(parse_args(["--help"]).unwrap(), Command::Help);
    assert_eq!(parse_args(["-h"]).unwrap(), Command::Help);
    assert_eq!(
        parse_args(["--target", "x:1", "-V"]).unwrap(),
        Command::Version
    );
    let text = usage();
    for flag in [
        "--target",
        "--host",
        "--http",
        "--connections",
        "--label",
        "--rate",
        "--slow-rate",
        "--slow ",
        "--stream-rate",
        "--stream ",
        "--path",
        "--slow-path",
        "--stream-path",
        "--duration",
        "--drain-wait",
        "--connect-timeout",
        "--max-in-flight",
        "--max-idle",
        "--out",
        "--quiet",
        "--allow-unreachable-start",
    ] {
        assert!(text.contains(flag), "usage mentions {flag}");
    }
}

#[test]
fn bad_flags_get_clear_errors() {
    let t = ["--target", "127.0.0.1:8080"];
    let with = |extra: &[&str]| {
        let mut args = t.to_vec();
        args.extend_from_slice(extra);
        error(&args)
    };
    assert_eq!(
        error(&[]),
        "--target is required, e.g. --target 127.0.0.1:8080 (see --help)"
    );
    assert_eq!(
        with(&["--rate", "fast"]),
        r#"--rate: "fast" is not a number of requests per second"#
    );
    assert!(with(&["--rate", "-1"]).contains("a rate must be a number ≥ 0"));
    assert!(with(&["--slow-rate", "NaN"]).contains("a rate must be a number ≥ 0"));
    assert!(with(&["--stream-rate", "inf"]).starts_with("--stream-rate: "));
    assert_eq!(
        with(&["--duration", "30"]),
        r#"--duration: "30" has no unit; write it like 30s, 1500ms, 2m or 1m30s"#
    );
    assert!(with(&["--drain-wait", "ten"]).starts_with("--drain-wait: "));
    assert_eq!(
        with(&["--connections", "pooled"]),
        r#"--connections: expected keepalive, fresh or mixed, got "pooled""#
    );
    assert_eq!(
        with(&["--http", "3"]),
        r#"--http: expected 1 or 2, got "3""#
    );
    assert_eq!(
        with(&["--max-in-flight", "lots"]),
        r#"--max-in-flight: "lots" is not a whole number"#
    );
    assert!(with(&["--max-in-flight", "0"])
        .starts_with("--max-in-flight (max_in_flight): must be between 1"));
    assert_eq!(
        with(&["--frobnicate"]),
        "unknown flag --frobnicate; see --help for the list"
    );
    assert_eq!(with(&["--duration"]), "--duration needs a value");
    assert_eq!(
        with(&["--duration", "--rate", "3"]),
        "--duration needs a value"
    );
    assert_eq!(with(&["--quiet=yes"]), "--quiet takes no value");
    assert!(with(&["extra"]).starts_with("unexpected argument \"extra\""));
    assert!(with(&["--rate", "0", "--slow-rate", "0"]).contains("nothing would be sent"));
    assert!(with(&["--duration", "0s"]).starts_with("--duration (duration): must be at least"));
    assert!(with(&["--duration", "25h"]).contains("at most 24h"));
    assert!(with(&["--label", "a b"]).starts_with("--label (label): "));
    assert!(with(&["--path", "healthz"]).contains("must start with /"));
    assert!(with(&["--out="]).contains("--out needs a file name"));
    assert!(with(&["--proxy-label", "a\tb"]).starts_with("--proxy-label (proxy_label): "));
    assert_eq!(
        with(&["--durration", "3s"]),
        "unknown flag --durration (did you mean --duration?); see --help for the list"
    );
    assert!(error(&["--target", "https://x:443"]).contains("https is not supported"));
    assert!(error(&["--target", "myservice"]).contains("has no port"));
}

fn probe_bin() -> Process {
    let mut cmd = Process::new(env!("CARGO_BIN_EXE_lameduck-probe"));
    cmd.stdin(Stdio::null());
    cmd
}

#[test]
fn binary_exits_2_on_bad_flags_with_the_reason() {
    let out = probe_bin()
        .args(["--target", "127.0.0.1:1", "--duration", "30"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--duration: \"30\" has no unit"),
        "{stderr}"
    );
    assert!(stderr.contains("--help"), "{stderr}");
    assert!(out.stdout.is_empty());
}

#[test]
fn binary_help_exits_0() {
    let out = probe_bin().arg("--help").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("USAGE:"));
}

#[tokio::test]
async fn binary_fails_fast_on_an_unreachable_target() {
    let addr = closed_port().await;
    let out = tokio::task::spawn_blocking(move || {
        probe_bin()
            .args(["--target", &addr.to_string(), "--duration", "10s"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("target {addr} is unreachable")),
        "{stderr}"
    );
    assert!(stderr.contains("--allow-unreachable-start"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_runs_prints_the_table_and_writes_json_lines() {
    let srv = server("bin").await;
    let dir = std::env::temp_dir().join(format!("lameduck-probe-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("records.jsonl");
    let args = vec![
        "--target".to_owned(),
        srv.addr.to_string(),
        "--duration".to_owned(),
        "1200ms".to_owned(),
        "--rate".to_owned(),
        "20".to_owned(),
        "--slow".to_owned(),
        "100ms".to_owned(),
        "--label".to_owned(),
        "test-path".to_owned(),
        "--out".to_owned(),
        file.display().to_string(),
    ];
    let out = tokio::task::spawn_blocking(move || probe_bin().args(args).output().unwrap())
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("succeeded"), "{stdout}");
    assert!(stdout.contains("first failure           none"), "{stdout}");
    // At least the final progress line; one per second while it runs.
    assert!(stderr.contains("sent "), "{stderr}");

    let text = std::fs::read_to_string(&file).unwrap();
    let records: Vec<Record> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), srv.state.seen().len());
    assert!(
        stdout.contains(&format!("({} lines)", records.len())),
        "{stdout}"
    );
    assert!(records
        .iter()
        .all(|r| r.label == "test-path" && r.instance.as_deref() == Some("bin")));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn binary_takes_the_target_from_the_environment() {
    let addr = closed_port().await;
    let out = tokio::task::spawn_blocking(move || {
        probe_bin()
            .env("LAMEDUCK_PROBE_TARGET", addr.to_string())
            .args(["--duration", "10s"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    // Exit 3 (unreachable), not 2 (--target missing): the variable was read.
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("target {addr} is unreachable")),
        "{stderr}"
    );
}

#[test]
fn binary_exits_3_when_out_is_not_writable() {
    let out = probe_bin()
        .args([
            "--target",
            "127.0.0.1:1",
            "--out",
            "/nonexistent-dir-for-lameduck-probe/x.jsonl",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("--out /nonexistent-dir-for-lameduck-probe/x.jsonl"));
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_prints_the_summary_so_far_on_sigint() {
    let srv = server("int").await;
    let child = probe_bin()
        .args([
            "--target",
            &srv.addr.to_string(),
            "--duration",
            "60s",
            "--drain-wait",
            "5s",
            "--slow",
            "100ms",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the probe is sending (the server saw requests), then interrupt it.
    let start = std::time::Instant::now();
    while srv.state.seen().len() < 5 && start.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid = child.id().to_string();
    let killed = Process::new("kill").args(["-INT", &pid]).status().unwrap();
    assert!(killed.success());
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stderr.contains("stopping"), "{stderr}");
    assert!(stdout.contains("(stopped early)"), "{stdout}");
    assert!(stdout.contains("succeeded"), "{stdout}");
    assert!(start.elapsed() < Duration::from_secs(30));
}
