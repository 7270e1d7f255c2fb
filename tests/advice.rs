//! The advice rules, fed with recorded (synthetic) drains.

use lameduck::{
    advise, AdviceLevel, AfterFlipReport, BudgetReport, CloserResult, CommitReason, DrainReport,
    Event, EventKind, Outcome, PeerCount, PodInfo, PolicyReport, ReadinessWhileDraining, Straggler,
    TaskEnd, Trigger,
};

fn ev(kind: EventKind, at_ms: u64) -> Event {
    let mut e: Event = serde_json::from_value(serde_json::json!({
        "event": kind, "at_ms": at_ms, "unix_ms": 1_764_000_000_000u64 + at_ms
    }))
    .unwrap();
    if kind == EventKind::StoppedAccepting {
        e.reason = Some(CommitReason::Quiet);
    }
    e
}

/// A clean 30 s drain: quiet policy (quiet 2 s, min 2 s, max 15 s), stopped at 3 s, zero at 3.1 s.
fn base() -> DrainReport {
    DrainReport {
        outcome: Outcome::Clean,
        trigger: Some(Trigger::Sigterm),
        exit_code: 0,
        readiness_policy: ReadinessWhileDraining::NotReady,
        budget: BudgetReport {
            grace_ms: 30_000,
            used_ms: 3_200,
            remaining_ms: 26_800,
            quiesce_ms: 24_000,
            close_budget_ms: 5_000,
            deletion: None,
        },
        propagation: PolicyReport {
            kind: "quiet".into(),
            quiet_ms: Some(2_000),
            min_ms: 2_000,
            max_ms: 15_000,
            evidence: None,
        },
        timeline: vec![
            ev(EventKind::DrainStarted, 0),
            ev(EventKind::StoppedAccepting, 3_000),
            ev(EventKind::InFlightZero, 3_100),
            ev(EventKind::Done, 3_200),
        ],
        after_flip: AfterFlipReport {
            new_connections: 4,
            requests_on_new_connections: 4,
            requests_on_reused_connections: 30,
            last_new_connection_ms: Some(900),
            peers: vec![
                PeerCount {
                    peer: "10.0.0.1".into(),
                    new_connections: 2,
                },
                PeerCount {
                    peer: "10.0.0.2".into(),
                    new_connections: 2,
                },
            ],
            paths: vec![],
        },
        stragglers: vec![],
        tasks: vec![],
        closers: vec![],
        pod: PodInfo::default(),
        advice: vec![],
        cause: None,
        signal_receipt: None,
        stop_signal_wait: None,
        sink_errors: vec![],
        proxy_label: None,
        server: None,
    }
}

fn rules(r: &DrainReport) -> Vec<String> {
    advise(r).into_iter().map(|a| a.rule).collect()
}

#[test]
fn a_clean_drain_gets_only_information() {
    let a = advise(&base());
    assert!(a.iter().all(|a| a.level == AdviceLevel::Info), "{a:?}");
    assert_eq!(rules(&base()), ["propagation_observed", "grace_used"]);
    assert_eq!(a[0].observed, 900);
    assert_eq!(a[1].observed, 10); // 3.2 s of 30 s
}

#[test]
fn too_little_traffic_is_said_not_guessed() {
    let mut r = base();
    r.after_flip = AfterFlipReport {
        new_connections: 1,
        requests_on_new_connections: 1,
        requests_on_reused_connections: 2,
        last_new_connection_ms: Some(5_000),
        peers: vec![],
        paths: vec![],
    };
    let a = advise(&r);
    assert_eq!(a[0].rule, "not_enough_traffic");
    assert!(a[0]
        .message
        .starts_with("not enough traffic after the flip to measure propagation"));
    // No propagation claim from 3 requests, even though the one connection came late.
    assert!(!rules(&r).contains(&"propagation_after_min".to_owned()));
}

#[test]
fn late_new_connections_past_min_are_a_warning_with_the_number() {
    let mut r = base();
    r.after_flip.last_new_connection_ms = Some(7_400);
    let a = advise(&r);
    assert_eq!(a[0].rule, "propagation_after_min");
    assert_eq!(a[0].level, AdviceLevel::Warn);
    assert_eq!(a[0].observed, 7_400);
    assert!(a[0].message.contains("7400 ms") && a[0].message.contains("min (2000 ms)"));
}

#[test]
fn only_reused_connections_means_no_new_connection_observed() {
    let mut r = base();
    r.after_flip.new_connections = 0;
    r.after_flip.requests_on_new_connections = 0;
    r.after_flip.last_new_connection_ms = None;
    r.after_flip.peers.clear();
    assert_eq!(rules(&r)[0], "no_new_connections");
}

#[test]
fn a_commit_at_max_says_the_quiet_window_never_held() {
    let mut r = base();
    r.timeline[1].reason = Some(CommitReason::Max);
    r.timeline[1].at_ms = 15_000;
    r.after_flip.last_new_connection_ms = Some(1_000);
    let a = advise(&r);
    assert_eq!(a[0].rule, "quiet_window_never_held");
    assert_eq!(a[0].observed, 15_000);
}

#[test]
fn one_peer_dominating_new_connections_is_named() {
    let mut r = base();
    r.after_flip.new_connections = 10;
    r.after_flip.peers = vec![
        PeerCount {
            peer: "10.9.8.7".into(),
            new_connections: 9,
        },
        PeerCount {
            peer: "10.0.0.1".into(),
            new_connections: 1,
        },
    ];
    let a = advise(&r);
    let one = a.iter().find(|a| a.rule == "one_peer").unwrap();
    assert_eq!(one.observed, 90);
    assert!(one.message.contains("10.9.8.7") && one.message.contains("9 of 10"));
    // Below 5 new connections the rule stays silent.
    let mut r = base();
    r.after_flip.peers = vec![PeerCount {
        peer: "10.9.8.7".into(),
        new_connections: 4,
    }];
    assert!(!rules(&r).contains(&"one_peer".to_owned()));
}

#[test]
fn requests_and_tasks_cut_at_the_deadline_lead_the_advice() {
    let mut r = base();
    r.outcome = Outcome::DeadlineExceeded;
    r.stragglers = vec![
        Straggler {
            kind: "request".into(),
            name: "GET /export".into(),
            age_ms: 26_000,
            peer: None,
            recovery: None,
        },
        Straggler {
            kind: "task".into(),
            name: "upload".into(),
            age_ms: 60_000,
            peer: None,
            recovery: None,
        },
    ];
    let a = advise(&r);
    assert_eq!(a[0].rule, "requests_cut");
    assert_eq!(a[0].observed, 26_000);
    assert_eq!(a[1].rule, "tasks_cut");
    // The human summary leads with the most important line.
    r.advice = a;
    assert!(r
        .summary()
        .starts_with("warn: 1 requests were still running at the quiesce deadline"));
}

#[test]
fn in_flight_reaching_zero_late_in_the_window_is_flagged() {
    let mut r = base();
    r.timeline[2].at_ms = 20_000; // 83 % of 24 s
    r.budget.used_ms = 20_100;
    r.budget.remaining_ms = 9_900;
    let a = advise(&r);
    let late = a.iter().find(|a| a.rule == "in_flight_late").unwrap();
    assert_eq!(late.observed, 20_000);
    assert!(late.message.contains("83%"));
}

#[test]
fn little_grace_left_is_a_warning() {
    let mut r = base();
    r.budget.used_ms = 28_500;
    r.budget.remaining_ms = 1_500;
    let a = advise(&r);
    let g = a.iter().find(|a| a.rule == "grace_headroom").unwrap();
    assert_eq!(g.level, AdviceLevel::Warn);
    assert_eq!(g.observed, 1_500);
}

#[test]
fn panicked_tasks_and_skipped_or_failed_closers_are_named() {
    let mut r = base();
    r.tasks = vec![TaskEnd {
        name: "exporter".into(),
        result: "panicked".into(),
        ran_ms: 40,
    }];
    r.closers = vec![
        CloserResult {
            name: "cache".into(),
            took_ms: 900,
            result: "timed_out".into(),
        },
        CloserResult {
            name: "db-pool".into(),
            took_ms: 0,
            result: "skipped".into(),
        },
    ];
    let a = advise(&r);
    let by_rule = |rule: &str| a.iter().find(|x| x.rule == rule).unwrap();
    assert!(by_rule("tasks_panicked").message.contains("exporter"));
    let skipped = by_rule("closers_skipped");
    assert_eq!(skipped.level, AdviceLevel::Warn);
    assert!(skipped.message.contains("db-pool") && skipped.message.contains("critical"));
    assert!(by_rule("closers_failed")
        .message
        .contains("cache (timed_out)"));
}

#[test]
fn a_server_idle_timeout_below_common_proxy_idle_timeouts_is_a_warning() {
    use lameduck::ServerReport;
    let mut r = base();
    r.server = Some(ServerReport {
        header_read_timeout_ms: Some(30_000),
    });
    let a = advise(&r);
    let short = a
        .iter()
        .find(|a| a.rule == "server_idle_timeout_short")
        .expect("advice for a 30 s idle timeout");
    assert_eq!(short.level, AdviceLevel::Warn);
    assert_eq!(short.observed, 30_000);
    assert!(short.message.contains("30.0 s"), "{}", short.message);
    // Above the usual proxy idle timeouts, or unbounded, or not `serve`: nothing to say.
    for server in [
        Some(ServerReport {
            header_read_timeout_ms: Some(75_000),
        }),
        Some(ServerReport::default()),
        None,
    ] {
        r.server = server;
        assert!(!rules(&r).contains(&"server_idle_timeout_short".to_owned()));
    }
}
