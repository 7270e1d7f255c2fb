//! `correlate` against a real run: the probe's records from a server on 127.0.0.1 that
//! drains, stops accepting (new connections reset) and then answers 503, joined with the drain
//! report and the external events written at the moments the test flipped the server.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command as Process, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::server;
use lameduck_probe::cli::{parse_args, Command};
use lameduck_probe::correlate::{correlate, parse_records, FailureClass, ReportView};
use lameduck_probe::{ConnectionMode, Failure, Outcome, Probe, ProbeConfig, Record};

const LIMIT: Duration = Duration::from_secs(30);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The times the test flipped the server, in unix ms.
struct Flips {
    drain: u64,
    stop: u64,
    fail: u64,
    end: u64,
}

/// Runs the probe (mixed connections) while the server goes serving → draining → new
/// connections reset → 503, and returns the records and when each flip happened.
async fn rollout(dir: &Path) -> (Vec<Record>, Flips) {
    let srv = server("web-1").await;
    srv.state.set_phase(Some("serving"));
    let mut c = ProbeConfig::new(srv.addr.to_string());
    c.short_rate = 60.0;
    c.slow_rate = 4.0;
    c.slow = Duration::from_millis(100);
    c.duration = Duration::from_millis(1600);
    c.drain_wait = Duration::from_secs(5);
    c.connections = ConnectionMode::Mixed;
    c.proxy_label = Some("direct loopback".into());
    let probe = Probe::new(c).unwrap();
    let handle = probe.handle();
    let state = srv.state.clone();
    let flips = tokio::spawn(async move {
        let wait_ok = |n: u64| {
            let handle = handle.clone();
            async move {
                let start = Instant::now();
                while handle.progress().sent < n && start.elapsed() < LIMIT {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        };
        wait_ok(20).await;
        state.set_phase(Some("draining"));
        let drain = now_ms();
        wait_ok(40).await;
        state.reset.store(true, Ordering::SeqCst);
        let stop = now_ms();
        wait_ok(60).await;
        state.status.store(503, Ordering::SeqCst);
        let fail = now_ms();
        (drain, stop, fail)
    });
    let result = tokio::time::timeout(LIMIT, probe.run())
        .await
        .unwrap()
        .unwrap();
    let (drain, stop, fail) = flips.await.unwrap();
    let mut buf = Vec::new();
    result.write_json_lines(&mut buf).unwrap();
    std::fs::write(dir.join("records.jsonl"), &buf).unwrap();
    (
        result.records,
        Flips {
            drain,
            stop,
            fail,
            end: now_ms(),
        },
    )
}

/// A drain report as the service writes it, at the flip times (extra fields as a real one
/// has, to show they are ignored).
fn report_json(f: &Flips) -> String {
    let ev = |event: &str, t: u64, extra: &str| {
        format!(
            r#"{{"event":"{event}","at_ms":{},"unix_ms":{t}{extra}}}"#,
            t - f.drain
        )
    };
    format!(
        r#"{{"outcome":"clean","trigger":"sigterm","exit_code":0,"readiness_policy":"fail","budget":{{"grace_ms":30000,"used_ms":{}}},"timeline":[{},{},{},{},{}],"after_flip":{{"new_connections":0}},"stragglers":[],"tasks":[],"closers":[],"pod":{{"name":"web-1","namespace":"default"}}}}"#,
        f.end - f.drain,
        ev("drain_started", f.drain, r#","trigger":"sigterm""#),
        ev("signal_received", f.drain, r#","trigger":"sigterm""#),
        ev("readiness_flipped", f.drain, ""),
        ev("stopped_accepting", f.stop, r#","reason":"quiet""#),
        ev("done", f.end, ""),
    )
}

fn events_jsonl(f: &Flips) -> String {
    format!(
        "{{\"unix_ms\":{},\"instance\":\"web-1\",\"event\":\"deleted\"}}\n\
         {{\"unix_ms\":{},\"instance\":\"web-1\",\"event\":\"endpoint_removed\"}}\n\
         \n\
         {{\"unix_ms\":{},\"instance\":\"web-1\",\"event\":\"proxy_updated\"}}\n\
         {{\"unix_ms\":{},\"instance\":\"web-1\",\"event\":\"exit\"}}\n",
        f.drain - 5,
        f.drain + 20,
        f.drain + 40,
        f.end + 1000,
    )
}

/// `(element text, attribute) → value`, for the SVG checks.
fn attr<'a>(element: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=\"");
    let start = element.find(&key)? + key.len();
    let len = element[start..].find('"')?;
    Some(&element[start..start + len])
}

/// The `<g class="lane" ...>` groups: instance → the group's text.
fn lanes(svg: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut rest = svg;
    while let Some(i) = rest.find("<g class=\"lane\"") {
        let group = &rest[i..];
        let end = group.find("</g>").expect("lane group closed");
        let head = &group[..group.find('>').unwrap()];
        let name = attr(head, "data-instance").unwrap().replace("&quot;", "\"");
        out.insert(name, group[..end].to_owned());
        rest = &group[end..];
    }
    out
}

/// Elements (from `<` to the end of the opening tag) whose class starts with `prefix`.
fn elements<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    let key = format!("class=\"{prefix}");
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(&key) {
        let open = rest[..i].rfind('<').unwrap();
        let close = i + rest[i..].find('>').unwrap();
        out.push(&rest[open..close]);
        rest = &rest[close..];
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn correlate_classifies_every_failure_and_draws_every_request() {
    let dir = std::env::temp_dir().join(format!("lameduck-probe-correlate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (records, flips) = rollout(&dir).await;
    std::fs::write(dir.join("web-1.report.json"), report_json(&flips)).unwrap();
    let text = std::fs::read_to_string(dir.join("records.jsonl")).unwrap();
    assert_eq!(parse_records(&text, "records.jsonl").unwrap(), records);
    std::fs::write(dir.join("events.jsonl"), events_jsonl(&flips)).unwrap();

    // The library: every failure has the class its cause says.
    let report = ReportView::parse(&report_json(&flips), None, "web-1.report.json").unwrap();
    assert_eq!(report.instance, "web-1", "named after pod.name");
    let c = correlate(&records, std::slice::from_ref(&report), &[]);
    let failed: Vec<&Record> = records
        .iter()
        .filter(|r| r.outcome == Outcome::Failed)
        .collect();
    assert_eq!(c.failures.len(), failed.len());
    let by_id: HashMap<&str, &Record> = records.iter().map(|r| (r.id.as_str(), r)).collect();
    let mut classes = HashMap::new();
    for f in &c.failures {
        let r = by_id[f.id.as_str()];
        let want = if r.status == Some(503) {
            assert!(
                r.end_ms.unwrap() - r.start_ms + r.start_unix_ms.unwrap() + 50.0
                    >= flips.fail as f64
            );
            FailureClass::Processing
        } else {
            // Reset before any answer: on new connections after stopped_accepting.
            assert_eq!(r.failure, Some(Failure::Request), "{r:?}");
            assert!(!r.reused, "{r:?}");
            assert!(
                r.start_unix_ms.unwrap() + 50.0 >= flips.stop as f64,
                "{r:?}"
            );
            FailureClass::RoutingSwitch
        };
        assert_eq!(f.class, want, "{f:?} for {r:?}");
        assert_eq!(f.instance.as_deref(), Some("web-1"), "{f:?}");
        *classes.entry(f.class).or_insert(0) += 1;
    }
    assert!(
        classes.get(&FailureClass::RoutingSwitch) > Some(&0),
        "{}",
        c.table()
    );
    assert!(
        classes.get(&FailureClass::Processing) > Some(&0),
        "{}",
        c.table()
    );

    // The binary, with the events file and the picture.
    let svg_path = dir.join("rollout.svg");
    let args: Vec<String> = vec![
        "correlate".into(),
        "--probe".into(),
        dir.join("records.jsonl").display().to_string(),
        "--report".into(),
        format!("web-1={}", dir.join("web-1.report.json").display()),
        "--events".into(),
        dir.join("events.jsonl").display().to_string(),
        "--svg".into(),
        svg_path.display().to_string(),
    ];
    let Command::Correlate(parsed) = parse_args(args.iter().cloned()).unwrap() else {
        panic!("correlate parses into Command::Correlate");
    };
    assert_eq!(parsed.reports[0].0.as_deref(), Some("web-1"));
    let out = Process::new(env!("CARGO_BIN_EXE_lameduck-probe"))
        .args(&args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{stdout}");
    std::fs::copy(&svg_path, "/tmp/probe-rollout.svg").ok();
    let origin = records
        .iter()
        .map(|r| r.start_unix_ms.unwrap())
        .chain([flips.drain as f64 - 5.0])
        .fold(f64::INFINITY, f64::min);
    let offset = |t: u64| format!("{:>9.0}", t as f64 - origin);
    for (row, at) in [
        ("deletion", flips.drain - 5),
        ("signal", flips.drain),
        ("drain started", flips.drain),
        ("readiness flipped", flips.drain),
        ("endpoint change", flips.drain + 20),
        ("proxy update", flips.drain + 40),
        ("stopped accepting", flips.stop),
        ("exit", flips.end + 1000),
    ] {
        let line = stdout
            .lines()
            .find(|l| l.trim_start().starts_with(row))
            .unwrap_or_else(|| panic!("no {row} row in\n{stdout}"));
        assert!(
            line.contains(&offset(at)),
            "{row}: {line} (want {})",
            offset(at)
        );
    }
    assert!(stdout.contains("through direct loopback"), "{stdout}");
    assert!(stdout.contains("routing switch"), "{stdout}");
    assert!(stdout.contains("processing"), "{stdout}");
    for f in &failed {
        assert!(stdout.contains(&f.id), "failure {} listed", f.id);
    }

    // The picture: one lane per instance, one mark per request in its lane, with its outcome
    // and connection in the class; the report's and the events' moments as lines.
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(svg.starts_with("<?xml") && svg.trim_end().ends_with("</svg>"));
    well_formed(&svg).unwrap_or_else(|e| panic!("{e}"));
    let lanes = lanes(&svg);
    let mut drawn = 0;
    for (name, group) in &lanes {
        for mark in elements(group, "mark ") {
            let id = attr(mark, "data-id").unwrap();
            let r = by_id[id];
            assert_eq!(r.instance.as_deref().unwrap_or("(no answer)"), name, "{id}");
            let class: Vec<&str> = attr(mark, "class").unwrap().split(' ').collect();
            assert!(class.contains(&r.outcome.as_str()), "{mark} vs {r:?}");
            assert!(class.contains(&r.kind.as_str()));
            if r.reused {
                assert!(
                    mark.starts_with("<rect") && class.contains(&"reused"),
                    "{mark}"
                );
            } else {
                assert!(
                    mark.starts_with("<circle") && class.contains(&"new"),
                    "{mark}"
                );
            }
            drawn += 1;
        }
    }
    assert_eq!(drawn, records.len(), "every request drawn once");
    assert!(lanes.contains_key("web-1"));
    assert_eq!(
        lanes.contains_key("(no answer)"),
        records.iter().any(|r| r.instance.is_none())
    );
    let web = &lanes["web-1"];
    let events: Vec<(&str, &str)> = elements(web, "event")
        .into_iter()
        .map(|e| {
            (
                attr(e, "data-event").unwrap(),
                attr(e, "data-source").unwrap(),
            )
        })
        .collect();
    for want in [
        ("signal_received", "report"),
        ("stopped_accepting", "report"),
        ("done", "report"),
        ("deleted", "events"),
        ("endpoint_removed", "events"),
        ("proxy_updated", "events"),
        ("exit", "events"),
    ] {
        assert!(events.contains(&want), "{want:?} in {events:?}");
    }
    let bands = elements(web, "band ");
    assert_eq!(bands.len(), 2, "draining and stopped bands: {bands:?}");
    let stop_at = attr(bands[0], "data-to-ms").unwrap();
    assert_eq!(stop_at, format!("{:.0}", flips.stop as f64 - origin));
    assert!(svg.contains("class=\"legend\""));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn correlate_refuses_bad_input_with_the_file_and_line() {
    let dir = std::env::temp_dir().join(format!(
        "lameduck-probe-correlate-bad-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let records = dir.join("r.jsonl");
    std::fs::write(&records, "{\"id\":1}\n").unwrap();
    let report = dir.join("a.json");
    std::fs::write(&report, "{\"timeline\":[]}").unwrap();
    let run = |args: &[&str]| {
        Process::new(env!("CARGO_BIN_EXE_lameduck-probe"))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let r = records.display().to_string();
    let a = report.display().to_string();
    let out = run(&["correlate", "--probe", &r, "--report", &a]);
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("line 1: not a probe record"), "{stderr}");

    let out = run(&["correlate", "--probe", &r]);
    assert_eq!(out.status.code(), Some(2), "--report is required");
    let out = run(&["correlate", "--probe", &r, "--reprot", &a]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("did you mean --report"));
    let out = run(&["correlate", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("--events"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A report exactly as the example service wrote it (`--report-file`, drained by SIGTERM).
#[test]
fn a_report_written_by_the_service_is_read() {
    let text = include_str!("fixtures/report-service-sigterm.json");
    let r = ReportView::parse(text, None, "report-service-sigterm.json").unwrap();
    assert_eq!(r.instance, "web-1");
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(r.outcome.as_deref(), Some("clean"));
    let names: Vec<&str> = r.timeline.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(names.first(), Some(&"drain_started"));
    assert_eq!(names.last(), Some(&"done"));
    let stop = r
        .timeline
        .iter()
        .find(|e| e.event == "stopped_accepting")
        .unwrap();
    assert_eq!(stop.unix_ms, 1_796_093_640_883.0);
    assert_eq!(stop.detail.as_deref(), Some("max"));
    // A refused connect 45 ms after it stopped accepting is a routing switch.
    let refused: Record = serde_json::from_str(
        r#"{"id":"x","kind":"short","label":"default","mode":"fresh","start_ms":0.0,"end_ms":1.0,
            "status":null,"outcome":"failed","failure":"connect","error":"refused","reused":false,
            "conn":null,"bytes":0,"start_unix_ms":1796093640927.0}"#,
    )
    .unwrap();
    let c = correlate(&[refused], &[r], &[]);
    assert_eq!(c.failures[0].class, FailureClass::RoutingSwitch);
    let table = c.table();
    assert!(table.contains("sigterm started the drain"), "{table}");
    assert!(table.contains("drain done, exit code 0"), "{table}");
}

/// Runs the probe binary with `args`, killed if it has not exited within `limit`; returns
/// its exit code, stdout and stderr.
fn run_bounded(args: &[&str], limit: Duration) -> (Option<i32>, String, String) {
    use std::io::Read as _;
    let mut child = Process::new(env!("CARGO_BIN_EXE_lameduck-probe"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read on threads: a large output must not block the child while it is watched.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("correlate {args:?} did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let lossy = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    (
        status.code(),
        lossy(out.join().unwrap()),
        lossy(err.join().unwrap()),
    )
}

fn scratch_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "lameduck-probe-correlate-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const A_RECORD: &str = r#"{"id":"r-1","kind":"short","label":"l","mode":"fresh","start_ms":0.0,"end_ms":10.0,"status":200,"outcome":"ok","reused":false,"conn":1,"bytes":2,"instance":"web-1","start_unix_ms":1764556801000.0}"#;
const A_REPORT: &str = r#"{"timeline":[{"event":"drain_started","at_ms":0,"unix_ms":1764556801100},{"event":"done","at_ms":500,"unix_ms":1764556801600}],"pod":{"name":"web-1"}}"#;

#[test]
fn times_no_clock_can_have_are_refused_before_anything_loops_on_them() {
    let dir = scratch_dir("extreme");
    let svg = dir.join("out.svg");
    let s = svg.display().to_string();
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let records = write("records.jsonl", &format!("{A_RECORD}\n"));
    let report = write("web-1.json", A_REPORT);
    let huge_end = write(
        "huge-end.jsonl",
        &format!(
            "{}\n",
            A_RECORD.replace(r#""end_ms":10.0"#, r#""end_ms":1.79e308"#)
        ),
    );
    let negative = write(
        "negative.jsonl",
        &format!(
            "{}\n",
            A_RECORD.replace(
                r#""start_unix_ms":1764556801000.0"#,
                r#""start_unix_ms":-5.0"#
            )
        ),
    );
    let far_report = write(
        "far.json",
        &A_REPORT.replace("1764556801600", "18446744073709551615"),
    );
    let events = write(
        "events.jsonl",
        "{\"unix_ms\": 1.7976e308, \"instance\": \"web-1\", \"event\": \"exit\"}\n",
    );
    let cases: [(&[&str], &str); 4] = [
        (
            &[
                "--probe", &records, "--report", &report, "--events", &events,
            ],
            "events.jsonl line 1: unix_ms",
        ),
        (
            &["--probe", &huge_end, "--report", &report],
            "huge-end.jsonl line 1: end_ms",
        ),
        (
            &["--probe", &negative, "--report", &report],
            "negative.jsonl line 1: start_unix_ms",
        ),
        (
            &["--probe", &records, "--report", &far_report],
            "far.json: event done: unix_ms",
        ),
    ];
    for (args, says) in cases {
        let mut argv = vec!["correlate"];
        argv.extend_from_slice(args);
        argv.extend_from_slice(&["--svg", &s]);
        let (code, _, err) = run_bounded(&argv, Duration::from_secs(10));
        assert_eq!(code, Some(3), "{args:?}: {err}");
        assert!(err.contains(says), "{says:?} in {err}");
        assert!(err.contains("not a plausible"), "{err}");
    }
    // The same inputs with plausible times draw.
    let (code, _, err) = run_bounded(
        &[
            "correlate",
            "--probe",
            &records,
            "--report",
            &report,
            "--svg",
            &s,
        ],
        Duration::from_secs(10),
    );
    assert_eq!(code, Some(0), "{err}");
    well_formed(&std::fs::read_to_string(&svg).unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn hostile_names_reach_neither_the_terminal_nor_the_svg_raw() {
    let dir = scratch_dir("hostile");
    // An OSC title change, a CSI colour, a bell, a C1 CSI and a \x01 in names of every kind.
    let osc = "\\u001b]0;pwned\\u0007";
    let csi = "\\u001b[31m";
    let record = A_RECORD
        .replace(r#""id":"r-1""#, &format!(r#""id":"r{csi}1""#))
        .replace(
            r#""instance":"web-1""#,
            &format!(r#""instance":"web{osc}1\u0001""#),
        )
        .replace(
            r#""outcome":"ok""#,
            r#""outcome":"failed","failure":"request","error":"boom\u0001\u009b2J""#,
        );
    let report = A_REPORT
        .replace(
            r#""event":"done""#,
            &format!(r#""event":"done{osc}","detail":"x\u0001{csi}""#),
        )
        .replace(r#""name":"web-1""#, &format!(r#""name":"web{osc}1\u0001""#));
    std::fs::write(dir.join("records.jsonl"), format!("{record}\n")).unwrap();
    std::fs::write(dir.join("report.json"), &report).unwrap();
    std::fs::write(
        dir.join("events.jsonl"),
        format!("{{\"unix_ms\": 1764556801300, \"instance\": \"web{osc}1\\u0001\", \"event\": \"proxy{csi}\\u0001\"}}\n"),
    )
    .unwrap();
    let p = |n: &str| dir.join(n).display().to_string();
    let (code, out, err) = run_bounded(
        &[
            "correlate",
            "--probe",
            &p("records.jsonl"),
            "--report",
            &p("report.json"),
            "--events",
            &p("events.jsonl"),
            "--svg",
            &p("out.svg"),
        ],
        Duration::from_secs(10),
    );
    assert_eq!(code, Some(0), "{err}");
    // The names are there, escaped: no control character reaches the terminal.
    assert!(out.contains("web\\x1b]0;pwned\\x071\\x01"), "{out}");
    assert!(out.contains("proxy\\x1b[31m\\x01"), "{out}");
    let raw: Vec<char> = out
        .chars()
        .filter(|c| c.is_control() && *c != '\n')
        .collect();
    assert!(raw.is_empty(), "{raw:?} in {out}");
    let svg = std::fs::read_to_string(dir.join("out.svg")).unwrap();
    well_formed(&svg).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        svg.contains("proxy\\x1b[31m\\x01"),
        "the name is kept, escaped"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn names_with_characters_xml_forbids_still_make_a_well_formed_svg() {
    let dir = scratch_dir("xml-forbidden");
    // U+FFFE and U+FFFF are Unicode scalar values (valid UTF-8, valid JSON) that XML 1.0
    // forbids anywhere in a document, escaped or not.
    let odd = "\\ufffe\\uffff";
    let record = A_RECORD.replace(
        r#""instance":"web-1""#,
        &format!(r#""instance":"web{odd}1""#),
    );
    let report = A_REPORT
        .replace(
            r#""event":"done""#,
            &format!(r#""event":"done{odd}","detail":"x{odd}""#),
        )
        .replace(r#""name":"web-1""#, &format!(r#""name":"web{odd}1""#));
    std::fs::write(dir.join("records.jsonl"), format!("{record}\n")).unwrap();
    std::fs::write(dir.join("report.json"), &report).unwrap();
    std::fs::write(
        dir.join("events.jsonl"),
        format!("{{\"unix_ms\": 1764556801300, \"instance\": \"web{odd}1\", \"event\": \"proxy{odd}\"}}\n"),
    )
    .unwrap();
    let p = |n: &str| dir.join(n).display().to_string();
    let (code, _out, err) = run_bounded(
        &[
            "correlate",
            "--probe",
            &p("records.jsonl"),
            "--report",
            &p("report.json"),
            "--events",
            &p("events.jsonl"),
            "--svg",
            &p("out.svg"),
        ],
        Duration::from_secs(10),
    );
    assert_eq!(code, Some(0), "{err}");
    let svg = std::fs::read_to_string(dir.join("out.svg")).unwrap();
    well_formed(&svg).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        svg.contains("proxy\\u{fffe}\\u{ffff}"),
        "the name is kept, its forbidden characters written out"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A small XML 1.0 well-formedness check, enough for the probe's SVG: legal characters only,
/// tags nested and matched, attributes quoted and unique, `&` only in known references, one
/// root element.
fn well_formed(xml: &str) -> Result<(), String> {
    fn legal(c: char) -> bool {
        matches!(c, '\t' | '\n' | '\r' | ' '..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
    }
    fn name_char(c: char) -> bool {
        c.is_alphanumeric() || matches!(c, '_' | ':' | '-' | '.')
    }
    /// Checks the references in character data or an attribute value.
    fn refs(text: &str, at: usize) -> Result<(), String> {
        let mut rest = text;
        while let Some(i) = rest.find('&') {
            let tail = &rest[i + 1..];
            let end = tail
                .find(';')
                .ok_or(format!("unterminated reference at {at}"))?;
            let r = &tail[..end];
            let ok = match r.strip_prefix('#') {
                Some(n) => {
                    let code = match n.strip_prefix('x') {
                        Some(h) => u32::from_str_radix(h, 16).ok(),
                        None => n.parse().ok(),
                    };
                    code.and_then(char::from_u32).is_some_and(legal)
                }
                None => matches!(r, "amp" | "lt" | "gt" | "quot" | "apos"),
            };
            if !ok {
                return Err(format!("bad reference &{r}; at {at}"));
            }
            rest = &tail[end + 1..];
        }
        Ok(())
    }
    if let Some((i, c)) = xml.char_indices().find(|(_, c)| !legal(*c)) {
        return Err(format!("illegal character {c:?} at byte {i}"));
    }
    let mut stack: Vec<&str> = Vec::new();
    let mut roots = 0;
    let mut i = 0;
    let b = xml.as_bytes();
    while i < xml.len() {
        if b[i] != b'<' {
            let end = xml[i..].find('<').map_or(xml.len(), |n| i + n);
            let text = &xml[i..end];
            if text.contains('>') && text.contains("]]>") {
                return Err(format!("]]> in text at {i}"));
            }
            if stack.is_empty() && !text.trim().is_empty() {
                return Err(format!("text outside the root at {i}"));
            }
            refs(text, i)?;
            i = end;
            continue;
        }
        let rest = &xml[i..];
        if let Some(r) = rest.strip_prefix("<?") {
            i += 2 + r.find("?>").ok_or("unterminated <?")? + 2;
            continue;
        }
        if let Some(r) = rest.strip_prefix("<!--") {
            i += 4 + r.find("-->").ok_or("unterminated comment")? + 3;
            continue;
        }
        if let Some(r) = rest.strip_prefix("</") {
            let end = r.find('>').ok_or("unterminated end tag")?;
            let name = r[..end].trim_end();
            match stack.pop() {
                Some(open) if open == name => {}
                other => return Err(format!("</{name}> closes {other:?} at {i}")),
            }
            i += 2 + end + 1;
            continue;
        }
        // A start tag: a name, then name="value" pairs, then > or />.
        let mut j = i + 1;
        let name_end = xml[j..]
            .find(|c: char| !name_char(c))
            .map_or(xml.len(), |n| j + n);
        let name = &xml[j..name_end];
        if name.is_empty() {
            return Err(format!("a tag without a name at {i}"));
        }
        j = name_end;
        let mut seen: Vec<&str> = Vec::new();
        let self_closing = loop {
            let ws = xml[j..].len() - xml[j..].trim_start().len();
            j += ws;
            let r = &xml[j..];
            if r.starts_with("/>") {
                j += 2;
                break true;
            }
            if r.starts_with('>') {
                j += 1;
                break false;
            }
            if ws == 0 {
                return Err(format!("no space before an attribute at {j}"));
            }
            let an_end = r.find(|c: char| !name_char(c)).unwrap_or(r.len());
            let an = &r[..an_end];
            if an.is_empty() || seen.contains(&an) {
                return Err(format!("bad or repeated attribute {an:?} at {j}"));
            }
            seen.push(an);
            let after = &r[an_end..];
            let q = after
                .strip_prefix('=')
                .and_then(|v| v.chars().next())
                .filter(|q| *q == '"' || *q == '\'')
                .ok_or(format!("attribute {an} not quoted at {j}"))?;
            let value_start = j + an_end + 2;
            let len = xml[value_start..]
                .find(q)
                .ok_or(format!("unterminated value of {an}"))?;
            let value = &xml[value_start..value_start + len];
            if value.contains('<') {
                return Err(format!("< in the value of {an} at {j}"));
            }
            refs(value, value_start)?;
            j = value_start + len + 1;
        };
        if stack.is_empty() {
            roots += 1;
        }
        if !self_closing {
            stack.push(name);
        }
        i = j;
    }
    match (stack.last(), roots) {
        (Some(open), _) => Err(format!("<{open}> never closed")),
        (None, 1) => Ok(()),
        (None, n) => Err(format!("{n} root elements")),
    }
}
