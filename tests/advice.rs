//! The advice rules, fed with recorded (synthetic) drains.

use lameduck::__private::advise;
use lameduck::report::{AdviceLevel, Outcome, PeerCount};
use lameduck::{CommitReason, DrainReport, Event, EventKind};

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
    // The report types are `#[non_exhaustive]`: a recorded drain is built from its JSON.
    let mut r: DrainReport = from_json(serde_json::json!({
        "outcome": "clean",
        "trigger": "sigterm",
        "exit_code": 0,
        "readiness_policy": "not_ready",
        "budget": {
            "grace_ms": 30_000, "used_ms": 3_200, "remaining_ms": 26_800,
            "quiesce_ms": 24_000, "close_budget_ms": 5_000
        },
        "propagation": { "kind": "quiet", "quiet_ms": 2_000, "min_ms": 2_000, "max_ms": 15_000 },
        "timeline": [],
        "after_flip": {
            "new_connections": 4,
            "requests_on_new_connections": 4,
            "requests_on_reused_connections": 30,
            "last_new_connection_ms": 900,
            "peers": [
                { "peer": "10.0.0.1", "new_connections": 2 },
                { "peer": "10.0.0.2", "new_connections": 2 }
            ]
        },
        "stragglers": [],
        "tasks": [],
        "closers": [],
        "pod": {}
    }));
    r.timeline = vec![
        ev(EventKind::DrainStarted, 0),
        ev(EventKind::StoppedAccepting, 3_000),
        ev(EventKind::InFlightZero, 3_100),
        ev(EventKind::Done, 3_200),
    ];
    r
}

fn from_json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap()
}

fn rules(r: &DrainReport) -> Vec<String> {
    advise(r)
        .into_iter()
        .map(|a| a.rule.as_str().to_owned())
        .collect()
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
    r.after_flip.new_connections = 1;
    r.after_flip.requests_on_new_connections = 1;
    r.after_flip.requests_on_reused_connections = 2;
    r.after_flip.last_new_connection_ms = Some(5_000);
    r.after_flip.peers = vec![];
    let a = advise(&r);
    assert_eq!(a[0].rule.as_str(), "not_enough_traffic");
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
    assert_eq!(a[0].rule.as_str(), "propagation_after_min");
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
    assert_eq!(a[0].rule.as_str(), "quiet_window_never_held");
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
    let one = a.iter().find(|a| a.rule.as_str() == "one_peer").unwrap();
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
    r.stragglers = from_json(serde_json::json!([
        { "kind": "request", "name": "GET /export", "age_ms": 26_000 },
        { "kind": "task", "name": "upload", "age_ms": 60_000 }
    ]));
    let a = advise(&r);
    assert_eq!(a[0].rule.as_str(), "requests_cut");
    assert_eq!(a[0].observed, 26_000);
    assert_eq!(a[1].rule.as_str(), "tasks_cut");
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
    let late = a
        .iter()
        .find(|a| a.rule.as_str() == "in_flight_late")
        .unwrap();
    assert_eq!(late.observed, 20_000);
    assert!(late.message.contains("83%"));
}

#[test]
fn little_grace_left_is_a_warning() {
    let mut r = base();
    r.budget.used_ms = 28_500;
    r.budget.remaining_ms = 1_500;
    let a = advise(&r);
    let g = a
        .iter()
        .find(|a| a.rule.as_str() == "grace_headroom")
        .unwrap();
    assert_eq!(g.level, AdviceLevel::Warn);
    assert_eq!(g.observed, 1_500);
}

#[test]
fn panicked_tasks_and_skipped_or_failed_closers_are_named() {
    let mut r = base();
    r.tasks = from_json(serde_json::json!([
        { "name": "exporter", "result": "panicked", "ran_ms": 40 }
    ]));
    r.closers = from_json(serde_json::json!([
        { "name": "cache", "took_ms": 900, "result": "timed_out" },
        { "name": "db-pool", "took_ms": 0, "result": "skipped" }
    ]));
    let a = advise(&r);
    let by_rule = |rule: &str| a.iter().find(|x| x.rule.as_str() == rule).unwrap();
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
    use lameduck::report::ServerReport;
    let mut r = base();
    let with_timeout = |ms: u64| {
        let mut s = ServerReport::default();
        s.header_read_timeout_ms = Some(ms);
        s
    };
    r.server = Some(with_timeout(30_000));
    let a = advise(&r);
    let short = a
        .iter()
        .find(|a| a.rule.as_str() == "server_idle_timeout_short")
        .expect("advice for a 30 s idle timeout");
    assert_eq!(short.level, AdviceLevel::Warn);
    assert_eq!(short.observed, 30_000);
    assert!(short.message.contains("30.0 s"), "{}", short.message);
    // Above the usual proxy idle timeouts, or unbounded, or not `serve`: nothing to say.
    for server in [
        Some(with_timeout(75_000)),
        Some(ServerReport::default()),
        None,
    ] {
        r.server = server;
        assert!(!rules(&r).contains(&"server_idle_timeout_short".to_owned()));
    }
}

/// Evidence that could not decide, so the wait ran to `max`.
fn weak_at_max(weak: &str) -> lameduck::report::EvidenceReport {
    from_json(serde_json::json!({
        "kind": "max", "max_reason": "not_enough_evidence", "weak": weak,
        "slot_ms": 250, "slots_observed": 120, "empty_slots": 118,
        "epsilon_ppm": 1000, "silence_ms": 0
    }))
}

fn messages(r: &DrainReport) -> Vec<String> {
    advise(r).into_iter().map(|a| a.message).collect()
}

/// New connections kept coming until `max` cut the wait: neither "min ≥ <max>" (a min at max)
/// nor "the proxies converge faster, set a floor or lower max" (they had not converged).
#[test]
fn traffic_cut_off_by_max_gets_neither_a_min_at_max_nor_a_shorter_wait() {
    let mut r = base();
    r.propagation.max_ms = 15_000;
    r.propagation.evidence = Some(weak_at_max("too_sparse"));
    r.timeline[1].reason = Some(CommitReason::Max);
    r.timeline[1].at_ms = 15_000;
    r.after_flip.last_new_connection_ms = Some(14_998);
    let msgs = messages(&r);
    assert!(
        msgs.iter().all(|m| !m.contains("consider min")),
        "{msgs:#?}"
    );
    assert!(
        msgs.iter()
            .all(|m| !m.contains("quiet_suffices_after") && !m.contains("lower max")),
        "{msgs:#?}"
    );
    let a = advise(&r);
    let after_min = a
        .iter()
        .find(|a| a.rule.as_str() == "propagation_after_min")
        .expect("the late connections are named");
    assert_eq!(after_min.observed, 14_998);
    assert!(
        after_min.message.contains("max (15000 ms) cut the wait"),
        "{}",
        after_min.message
    );
    // Said once: the quiet-window rule does not repeat it.
    assert!(!rules(&r).contains(&"quiet_window_never_held".to_owned()));

    // The same weak evidence without late connections still gets the fallback advice.
    r.after_flip.last_new_connection_ms = Some(900);
    assert!(messages(&r)
        .iter()
        .any(|m| m.contains("quiet_suffices_after")));
}

/// A task cut at the deadline whose recovery reported `ok` already used `spawn_with_recovery`:
/// the advice says why the exit code is still 1 and what is left to do (return on hurry).
#[test]
fn tasks_cut_with_a_recovery_that_worked_are_not_told_to_add_one() {
    let mut r = base();
    r.outcome = Outcome::DeadlineExceeded;
    r.exit_code = 1;
    r.stragglers = vec![from_json(serde_json::json!({
        "kind": "task", "name": "orders-consumer", "age_ms": 24_000, "recovery": "ok"
    }))];
    let a = advise(&r);
    let cut = a.iter().find(|a| a.rule.as_str() == "tasks_cut").unwrap();
    assert!(
        !cut.message.contains("spawn_with_recovery"),
        "{}",
        cut.message
    );
    assert!(cut.message.contains("reported ok"), "{}", cut.message);
    assert!(
        cut.message.contains("exit 1") && cut.message.contains("hurry"),
        "{}",
        cut.message
    );

    // Without a recovery action the advice still points at one.
    r.stragglers = vec![from_json(serde_json::json!({
        "kind": "task", "name": "orders-consumer", "age_ms": 24_000
    }))];
    let a = advise(&r);
    let cut = a.iter().find(|a| a.rule.as_str() == "tasks_cut").unwrap();
    assert!(
        cut.message.contains("spawn_with_recovery"),
        "{}",
        cut.message
    );
}

/// No connection data on an idle process (nothing arrived) is information, not a wiring
/// warning; with requests arriving but no connection counted it is a wiring warning.
#[test]
fn no_connection_data_names_a_wiring_gap_only_when_requests_came() {
    let mut r = base();
    r.after_flip = from_json(serde_json::json!({
        "new_connections": 0, "requests_on_new_connections": 0,
        "requests_on_reused_connections": 0, "last_new_connection_ms": null, "peers": []
    }));
    r.propagation.evidence = Some(weak_at_max("no_connection_data"));
    r.timeline[1].reason = Some(CommitReason::Max);
    r.timeline[1].at_ms = 15_000;
    let a = advise(&r);
    let idle = a
        .iter()
        .find(|a| a.rule.as_str() == "no_connection_data")
        .expect("the long wait is explained");
    assert_eq!(idle.level, AdviceLevel::Info);
    assert!(
        idle.message.starts_with("nothing arrived"),
        "{}",
        idle.message
    );
    assert!(
        !idle.message.contains("lameduck::serve"),
        "{}",
        idle.message
    );

    // Requests came (on connections nobody counted): that is the wiring gap.
    r.after_flip.requests_on_reused_connections = 12;
    let a = advise(&r);
    let gap = a
        .iter()
        .find(|a| a.rule.as_str() == "no_connection_data")
        .unwrap();
    assert_eq!(gap.level, AdviceLevel::Warn);
    assert!(gap.message.contains("lameduck::serve"), "{}", gap.message);
}

/// A fixed policy's report leaves out the evidence it did not read.
#[test]
fn a_fixed_policy_report_omits_what_it_did_not_measure() {
    let mut r = base();
    r.propagation = from_json(serde_json::json!({
        "kind": "fixed", "min_ms": 0, "max_ms": 0,
        "evidence": {
            "kind": "fixed", "weak": "no_connection_data", "slot_ms": 250,
            "slots_observed": 0, "empty_slots": 0, "epsilon_ppm": 1000, "silence_ms": 7
        }
    }));
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(
        json["propagation"]["evidence"],
        serde_json::json!({ "kind": "fixed", "silence_ms": 7 })
    );
    // And it reads back.
    let back: DrainReport = serde_json::from_value(json).unwrap();
    assert_eq!(back.propagation.evidence.unwrap().silence_ms, 7);
}

/// A drain given less than its grace (here a node shutdown's 15 s): `budget_shortened` names
/// the source and the deadlines; nothing cut, it is information, and `grace_used` counts the
/// shorter budget.
#[test]
fn a_shortened_budget_is_named_and_grace_used_counts_it() {
    let mut r = base();
    r.budget.deletion = Some(from_json(serde_json::json!({
        "deletion_grace_ms": 15_000, "kill_at_ms": 15_000, "hard_ms": 14_500,
        "quiesce_ms": 12_000, "max_ms": 7_500, "source": "node_shutdown"
    })));
    r.budget.remaining_ms = 11_800;
    let a = advise(&r);
    let s = a
        .iter()
        .find(|a| a.rule.as_str() == "budget_shortened")
        .unwrap_or_else(|| panic!("{a:?}"));
    assert_eq!(s.level, AdviceLevel::Info, "{}", s.message);
    assert_eq!(s.observed, 15_000);
    assert!(
        s.message
            .starts_with("the kubelet's node shutdown gave 15000 ms (node_shutdown)")
            && s.message.ends_with("nothing was cut short"),
        "{}",
        s.message
    );
    let g = a.iter().find(|a| a.rule.as_str() == "grace_used").unwrap();
    assert!(
        g.message
            .contains("21% of the 15000 ms node_shutdown budget"),
        "{}",
        g.message
    );
}

/// What the shorter budget cut: a `max` commit, work at the quiesce deadline, a closer, and a
/// `min` that could not fit — one warning that lists each with its number.
#[test]
fn what_a_shortened_budget_cut_is_a_warning_with_each_figure() {
    let mut r = base();
    r.budget.deletion = Some(from_json(serde_json::json!({
        "deletion_grace_ms": 2_000, "kill_at_ms": 1_250, "hard_ms": 1_210,
        "quiesce_ms": 1_000, "max_ms": 625, "source": "node_pressure_eviction"
    })));
    r.budget.used_ms = 1_150;
    r.budget.remaining_ms = 100;
    let mut stop = ev(EventKind::StoppedAccepting, 840);
    stop.reason = Some(lameduck::CommitReason::Max);
    r.timeline = vec![
        ev(EventKind::DrainStarted, 0),
        stop,
        ev(EventKind::Done, 1_100),
    ];
    r.straggler_counts.requests = 2;
    r.closers = vec![from_json(
        serde_json::json!({"name": "db-pool", "took_ms": 100, "result": "timed_out"}),
    )];
    let a = advise(&r);
    let s = a
        .iter()
        .find(|a| a.rule.as_str() == "budget_shortened")
        .unwrap_or_else(|| panic!("{a:?}"));
    assert_eq!(s.level, AdviceLevel::Warn);
    for part in [
        "node-pressure eviction gave 2000 ms",
        "propagation committed on max at 840 ms (max shortened to 625 ms)",
        "propagation min (2000 ms) did not fit before the shortened quiesce deadline (1000 ms)",
        "2 request(s) and 0 task(s) still running at the quiesce deadline (1000 ms)",
        "closer(s) `db-pool` timed_out",
    ] {
        assert!(s.message.contains(part), "{part:?} in {}", s.message);
    }
    // Headroom is judged against the shorter budget's own close time (210 ms), not 5 s.
    let g = a
        .iter()
        .find(|a| a.rule.as_str() == "grace_headroom")
        .unwrap();
    assert_eq!(g.observed, 100);
    assert!(
        g.message
            .contains("only 100 ms of the 1250 ms node_pressure_eviction budget"),
        "{}",
        g.message
    );
}
