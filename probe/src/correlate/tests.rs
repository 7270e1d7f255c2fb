//! Unit tests of the failure classes and report parsing.

use std::collections::BTreeMap;

use super::*;

fn record(json: &str) -> Record {
    serde_json::from_str(json).unwrap()
}

fn failed(id: &str, failure: &str, reused: bool, status: &str, instance: &str, at: f64) -> Record {
    let instance = if instance.is_empty() {
        String::new()
    } else {
        format!(r#","instance":"{instance}""#)
    };
    record(&format!(
        r#"{{"id":"{id}","kind":"slow","label":"l","mode":"keepalive","start_ms":0.0,"end_ms":10.0,
           "status":{status},"outcome":"failed","failure":"{failure}","error":"e","reused":{reused},
           "conn":1,"bytes":0,"start_unix_ms":{}{instance}}}"#,
        at - 10.0
    ))
}

fn report() -> ReportView {
    ReportView::parse(
        r#"{"timeline":[{"event":"drain_started","at_ms":0,"unix_ms":1000},
            {"event":"stopped_accepting","at_ms":1000,"unix_ms":2000},
            {"event":"deadline_exceeded","at_ms":5000,"unix_ms":6000},
            {"event":"done","at_ms":5100,"unix_ms":6100}],
            "exit_code":1,"outcome":"deadline_exceeded"}"#,
        Some("web-1"),
        "a.json",
    )
    .unwrap()
}

#[test]
fn each_failure_gets_the_class_its_cause_says() {
    let records = vec![
        // Body cut 50 ms after the quiesce deadline: exit timeout.
        failed("cut", "body", true, "200", "web-1", 6050.0),
        // Reset on a new connection after stopped_accepting: routing switch.
        failed("switch", "request", false, "null", "", 2500.0),
        // Reset on a new connection before anything stopped: unknown.
        failed("early", "connect", false, "null", "", 1500.0),
        // 5xx: processing.
        failed("5xx", "status", true, "503", "web-1", 3000.0),
        // Reused connection cut mid-flight, far from the deadline: processing.
        failed("inflight", "request", true, "null", "web-1", 3500.0),
        // 404: unknown.
        failed("404", "status", true, "404", "web-1", 3600.0),
    ];
    let c = correlate(&records, &[report()], &[]);
    let class: BTreeMap<&str, FailureClass> = c
        .failures
        .iter()
        .map(|f| (f.id.as_str(), f.class))
        .collect();
    assert_eq!(class["cut"], FailureClass::ExitTimeout);
    assert_eq!(class["switch"], FailureClass::RoutingSwitch);
    assert_eq!(class["early"], FailureClass::Unknown);
    assert_eq!(class["5xx"], FailureClass::Processing);
    assert_eq!(class["inflight"], FailureClass::Processing);
    assert_eq!(class["404"], FailureClass::Unknown);
    let table = c.table();
    assert!(table.contains("quiesce deadline"), "{table}");
    assert!(table.contains("drain done, exit code 1"), "{table}");
    assert!(table.contains("deletion"), "{table}");
    assert!(table.contains("not known (pass --events)"), "{table}");
}

#[test]
fn a_new_connection_refused_after_an_exit_is_a_routing_switch() {
    // No report (a naive server), only the exit seen from outside.
    let exit = ExternalEvent {
        unix_ms: 2000.0,
        instance: "naive-1".into(),
        event: "exit".into(),
    };
    let records = vec![
        failed("late", "connect", false, "null", "", 2600.0),
        failed("old", "connect", false, "null", "", 1500.0),
    ];
    let c = correlate(&records, &[], &[exit]);
    let class: BTreeMap<&str, FailureClass> = c
        .failures
        .iter()
        .map(|f| (f.id.as_str(), f.class))
        .collect();
    assert_eq!(class["late"], FailureClass::RoutingSwitch);
    assert_eq!(class["old"], FailureClass::Unknown);
    let late = c.failures.iter().find(|f| f.id == "late").unwrap();
    assert_eq!(late.instance.as_deref(), Some("naive-1"));
}

#[test]
fn reports_are_read_from_a_captured_stderr_and_named() {
    let text = "starting\n{\"level\":\"info\"}\n{\"timeline\":[],\"pod\":{\"name\":\"web-2\"}}\n";
    assert_eq!(
        ReportView::parse(text, None, "x.log").unwrap().instance,
        "web-2"
    );
    let bare = r#"{"timeline":[]}"#;
    assert_eq!(
        ReportView::parse(bare, None, "dir/web-3.json")
            .unwrap()
            .instance,
        "web-3"
    );
    let err = ReportView::parse("{}", None, "b.json")
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("b.json: not a drain report"), "{err}");
    let err = parse_events("{\"unix_ms\":1}\n", "ev.jsonl")
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("ev.jsonl line 1:"), "{err}");
}
