//! The probe against a real server on 127.0.0.1: counts, the reuse flag, HTTP/2, failures,
//! unfinished requests, an unreachable target, stopping.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{closed_port, server};
use lameduck_probe::{
    ConnectionMode, Failure, HttpVersion, Kind, OnOff, Outcome, Probe, ProbeConfig, ProbeResult,
    Record, Window,
};

/// Upper bound for one probe run in these tests; only hit when something is broken.
const LIMIT: Duration = Duration::from_secs(30);

fn config(addr: std::net::SocketAddr) -> ProbeConfig {
    let mut c = ProbeConfig::new(addr.to_string());
    c.short_rate = 40.0;
    c.slow_rate = 8.0;
    c.slow = Duration::from_millis(150);
    c.duration = Duration::from_millis(700);
    c.drain_wait = Duration::from_secs(5);
    c.label = "test-path".into();
    c
}

async fn run(config: ProbeConfig) -> ProbeResult {
    let probe = Probe::new(config).unwrap();
    tokio::time::timeout(LIMIT, probe.run())
        .await
        .expect("probe run within the limit")
        .expect("probe run")
}

/// Every record is in the server's log under its id and vice versa, with the same label.
fn assert_counts_match(result: &ProbeResult, seen: &HashMap<String, common::Seen>) {
    assert_eq!(
        result.records.len(),
        seen.len(),
        "{}",
        result.summary.table()
    );
    for r in &result.records {
        let s = seen
            .get(&r.id)
            .unwrap_or_else(|| panic!("server never saw {}", r.id));
        assert_eq!(s.label, "test-path");
        assert_eq!(r.label, "test-path");
    }
    let ids: HashSet<&str> = result.records.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids.len(), result.records.len(), "request ids are unique");
}

/// The probe's `reused` equals "index on its server connection > 0", and probe connection ids
/// map one-to-one onto server connections.
fn assert_reuse_matches_server(records: &[Record], seen: &HashMap<String, common::Seen>) {
    let mut probe_to_server = HashMap::new();
    let mut server_to_probe = HashMap::new();
    for r in records {
        let s = &seen[&r.id];
        assert_eq!(r.reused, s.index > 0, "record {r:?} vs server {s:?}");
        let conn = r.conn.expect("every request got a connection");
        assert_eq!(*probe_to_server.entry(conn).or_insert(s.conn), s.conn);
        assert_eq!(*server_to_probe.entry(s.conn).or_insert(conn), conn);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_counts_match_the_server_and_reuse_is_exact() {
    let srv = server("a").await;
    let result = run(config(srv.addr)).await;
    let seen = srv.state.seen_by_id();

    assert_counts_match(&result, &seen);
    assert_reuse_matches_server(&result.records, &seen);
    let s = &result.summary;
    assert!(s.is_clean(), "{}", s.table());
    assert!(s.short.total >= 10 && s.slow.total >= 2, "{}", s.table());
    assert_eq!(s.all.succeeded, result.records.len() as u64);
    assert!(
        s.on_reused_connection.total > 0,
        "keep-alive reuses: {}",
        s.table()
    );
    // A keep-alive pool needs few connections: at most one per concurrently running request.
    let conns: HashSet<u64> = result.records.iter().filter_map(|r| r.conn).collect();
    assert_eq!(conns.len() as u64, s.connections_opened);
    assert!(s.connections_opened < s.all.total / 2, "{}", s.table());
    for r in &result.records {
        assert_eq!(r.outcome, Outcome::Ok);
        assert_eq!(r.status, Some(200));
        assert_eq!(r.instance.as_deref(), Some("a"));
        assert_eq!(r.mode, ConnectionMode::KeepAlive);
        assert!(r.end_ms.unwrap() >= r.start_ms);
        assert!(r.bytes > 0);
        if r.kind == Kind::Slow {
            assert_eq!(seen[&r.id].path, "/slow");
        }
    }
    assert_eq!(s.instances.len(), 1);
    assert_eq!(s.instances[0].requests, s.all.total);
    assert!(s.first_failure.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_connections_are_new_for_every_request() {
    let srv = server("a").await;
    let mut c = config(srv.addr);
    c.connections = ConnectionMode::Fresh;
    let result = run(c).await;
    let seen = srv.state.seen_by_id();

    assert_counts_match(&result, &seen);
    assert_reuse_matches_server(&result.records, &seen);
    assert!(result.summary.is_clean(), "{}", result.summary.table());
    assert!(result
        .records
        .iter()
        .all(|r| !r.reused && r.mode == ConnectionMode::Fresh));
    assert!(seen
        .values()
        .all(|s| s.index == 0 && s.connection_close_requested));
    assert_eq!(
        result.summary.connections_opened,
        result.records.len() as u64
    );
    assert_eq!(result.summary.on_reused_connection.total, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_off_sends_only_in_its_on_phases_on_fresh_connections() {
    let srv = server("a").await;
    let mut c = config(srv.addr);
    c.connections = ConnectionMode::Fresh;
    c.short_rate = 100.0;
    c.slow_rate = 0.0;
    c.duration = Duration::from_millis(1900);
    // Bursts: 100 ms of sending every 600 ms, so 4 bursts of about 10 in 1.9 s.
    c.on_off = Some(OnOff {
        on: Duration::from_millis(100),
        off: Duration::from_millis(500),
    });
    let result = run(c).await;
    let seen = srv.state.seen_by_id();

    assert_counts_match(&result, &seen);
    assert!(result.summary.is_clean(), "{}", result.summary.table());
    let n = result.records.len();
    assert!((30..=50).contains(&n), "{n} requests in 4 bursts of ~10");
    let mut phases = HashSet::new();
    for r in &result.records {
        // Scheduled in an on phase; a busy machine may start one a little late.
        let in_period = r.start_ms % 600.0;
        assert!(
            in_period < 100.0 + 200.0,
            "sent at {} ms, in a pause",
            r.start_ms
        );
        phases.insert((r.start_ms / 600.0) as u64);
    }
    assert_eq!(phases.len(), 4, "every burst sent: {phases:?}");
    assert_eq!(result.summary.connections_opened, n as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_mode_uses_both_and_records_which() {
    let srv = server("a").await;
    let mut c = config(srv.addr);
    c.connections = ConnectionMode::Mixed;
    let result = run(c).await;
    let seen = srv.state.seen_by_id();

    assert_counts_match(&result, &seen);
    assert_reuse_matches_server(&result.records, &seen);
    assert!(result.summary.is_clean(), "{}", result.summary.table());
    let fresh: Vec<&Record> = result
        .records
        .iter()
        .filter(|r| r.mode == ConnectionMode::Fresh)
        .collect();
    assert!(!fresh.is_empty() && fresh.len() < result.records.len());
    assert!(fresh.iter().all(|r| !r.reused));
    assert!(result.records.iter().any(|r| r.reused));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_multiplexes_on_one_connection_and_reads_streams_to_the_end() {
    let srv = server("h2").await;
    let mut c = config(srv.addr);
    c.http = HttpVersion::Http2;
    c.stream_rate = 4.0;
    c.stream = Duration::from_millis(200);
    let result = run(c).await;
    let seen = srv.state.seen_by_id();

    assert_counts_match(&result, &seen);
    assert_reuse_matches_server(&result.records, &seen);
    let s = &result.summary;
    assert!(s.is_clean(), "{}", s.table());
    assert!(seen.values().all(|s| s.http2));
    assert_eq!(s.connections_opened, 1, "{}", s.table());
    assert_eq!(s.on_new_connection.total, 1);
    assert!(s.stream.total >= 1 && s.stream.succeeded == s.stream.total);
    for r in result.records.iter().filter(|r| r.kind == Kind::Stream) {
        // Several 20 ms chunks and the final "end\n": the body was read to its end.
        assert!(r.bytes >= 10, "{r:?}");
        assert!(r.elapsed_ms().unwrap() >= 150.0, "{r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_close_moves_requests_to_new_connections_without_failures() {
    let srv = server("closing").await;
    srv.state.close.store(true, Ordering::SeqCst);
    srv.state.set_phase(Some("draining"));
    let result = run(config(srv.addr)).await;
    let seen = srv.state.seen_by_id();

    assert_counts_match(&result, &seen);
    assert_reuse_matches_server(&result.records, &seen);
    let s = &result.summary;
    assert!(s.is_clean(), "{}", s.table());
    // The server closed after every response, so no request found a connection to reuse.
    assert_eq!(s.on_reused_connection.total, 0, "{}", s.table());
    assert_eq!(s.draining_new, s.all.total);
    assert_eq!(s.draining_reused, 0);
    assert_eq!(s.instances[0].draining, s.all.total);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_answers_are_counted_by_reused_and_new_connection() {
    let srv = server("d").await;
    let mut c = config(srv.addr);
    c.duration = Duration::from_millis(1200);
    let probe = Probe::new(c).unwrap();
    let handle = probe.handle();
    let state = srv.state.clone();
    let flip = tokio::spawn(async move {
        // Flip once some requests went through, as a server starting its drain would.
        let start = Instant::now();
        while handle.progress().succeeded < 5 && start.elapsed() < LIMIT {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        state.set_phase(Some("draining"));
    });
    let result = tokio::time::timeout(LIMIT, probe.run())
        .await
        .unwrap()
        .unwrap();
    flip.await.unwrap();
    let s = &result.summary;
    assert!(s.is_clean(), "{}", s.table());

    let draining: Vec<&Record> = result
        .records
        .iter()
        .filter(|r| r.served_by_draining())
        .collect();
    assert!(!draining.is_empty(), "{}", s.table());
    assert!(result.records.iter().any(|r| r.phase.is_none()));
    let reused = draining.iter().filter(|r| r.reused).count() as u64;
    assert_eq!(s.draining_reused, reused);
    assert_eq!(s.draining_new, draining.len() as u64 - reused);
    assert!(
        s.draining_reused > 0,
        "keep-alive connections carry on: {}",
        s.table()
    );
    assert!(s.table().contains("served while draining"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_2xx_answers_are_failures_and_the_first_one_is_reported() {
    let srv = server("e").await;
    let mut c = config(srv.addr);
    c.duration = Duration::from_millis(1000);
    let probe = Probe::new(c).unwrap();
    let handle = probe.handle();
    let state = srv.state.clone();
    let flip = tokio::spawn(async move {
        let start = Instant::now();
        while handle.progress().succeeded < 5 && start.elapsed() < LIMIT {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        state.status.store(503, Ordering::SeqCst);
    });
    let result = tokio::time::timeout(LIMIT, probe.run())
        .await
        .unwrap()
        .unwrap();
    flip.await.unwrap();
    let seen = srv.state.seen_by_id();
    assert_counts_match(&result, &seen);

    let s = &result.summary;
    let server_503 = seen.values().filter(|s| s.status == 503).count() as u64;
    assert!(server_503 > 0);
    assert_eq!(s.all.failed, server_503, "{}", s.table());
    assert_eq!(s.all.succeeded + s.all.failed, s.all.total);
    for r in &result.records {
        let answered_503 = seen[&r.id].status == 503;
        assert_eq!(r.outcome == Outcome::Failed, answered_503, "{r:?}");
        if answered_503 {
            assert_eq!(r.failure, Some(Failure::Status));
            assert_eq!(r.status, Some(503));
            assert!(r.error.as_deref().unwrap().contains("503"));
        }
    }
    let first = s.first_failure.as_ref().expect("a first failure");
    let earliest = result
        .records
        .iter()
        .filter(|r| r.outcome == Outcome::Failed)
        .map(|r| r.end_ms.unwrap())
        .fold(f64::INFINITY, f64::min);
    assert_eq!(first.at_ms, earliest);
    let first_record = result.records.iter().find(|r| r.id == first.id).unwrap();
    assert_eq!(first_record.outcome, Outcome::Failed);
    assert!(first.error.contains("503"));
    let table = s.table();
    assert!(table.contains(&format!("request {}", first.id)), "{table}");
    assert!(!s.is_clean());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_connections_are_failures_with_the_reset_in_the_error() {
    let srv = server("r").await;
    srv.state.reset.store(true, Ordering::SeqCst);
    let mut c = config(srv.addr);
    c.slow_rate = 0.0;
    c.short_rate = 20.0;
    c.duration = Duration::from_millis(400);
    let result = run(c).await;
    let seen = srv.state.seen_by_id();

    let s = &result.summary;
    assert!(s.all.total > 0);
    assert_eq!(s.all.failed, s.all.total, "{}", s.table());
    assert_eq!(
        seen.len() as u64,
        s.all.total,
        "each request reached the server once"
    );
    for r in &result.records {
        assert_eq!(r.failure, Some(Failure::Request), "{r:?}");
        assert_eq!(r.status, None);
        assert!(r.conn.is_some());
    }
    let first = s.first_failure.as_ref().unwrap();
    assert!(
        first.error.to_lowercase().contains("reset"),
        "{}",
        first.error
    );
    assert_eq!(first.id, result.records[0].id);
    let table = s.table();
    let line = table
        .lines()
        .find(|l| l.starts_with("first failure"))
        .unwrap();
    assert!(
        line.contains(&first.id) && line.contains("new connection #"),
        "{table}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_hanging_past_drain_wait_are_unfinished() {
    let srv = server("h").await;
    srv.state.hang.store(true, Ordering::SeqCst);
    let mut c = config(srv.addr);
    c.duration = Duration::from_millis(500);
    c.drain_wait = Duration::from_millis(300);
    let started = Instant::now();
    let result = run(c).await;
    let elapsed = started.elapsed();
    let seen = srv.state.seen_by_id();

    assert_counts_match(&result, &seen);
    let s = &result.summary;
    assert!(s.slow.total > 0);
    assert_eq!(s.slow.unfinished, s.slow.total, "{}", s.table());
    assert_eq!(s.short.succeeded, s.short.total, "{}", s.table());
    assert_eq!(s.all.unfinished, s.slow.total);
    assert!(!s.is_clean());
    for r in result.records.iter().filter(|r| r.kind == Kind::Slow) {
        assert_eq!(r.outcome, Outcome::Unfinished);
        assert_eq!(r.end_ms, None);
        assert!(r.conn.is_some());
        assert!(r.error.as_deref().unwrap().contains("no response yet"));
    }
    // It stopped waiting: far below the limit the hung requests would otherwise reach.
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
}

#[tokio::test]
async fn unreachable_target_fails_fast_with_a_clear_message() {
    let addr = closed_port().await;
    let probe = Probe::new(config(addr)).unwrap();
    let started = Instant::now();
    let err = tokio::time::timeout(LIMIT, probe.run())
        .await
        .unwrap()
        .unwrap_err();
    assert!(err.is_unreachable());
    let text = err.to_string();
    assert!(text.contains(&addr.to_string()), "{text}");
    assert!(text.contains("unreachable"), "{text}");
    assert!(text.to_lowercase().contains("refused"), "{text}");
    assert!(text.contains("--allow-unreachable-start"), "{text}");
    // Refused is immediate; the bound only guards against a hang.
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_unreachable_start_records_connect_failures() {
    let addr = closed_port().await;
    let mut c = config(addr);
    c.allow_unreachable_start = true;
    c.duration = Duration::from_millis(300);
    let result = run(c).await;
    let s = &result.summary;
    assert!(s.all.total > 0);
    assert_eq!(s.all.failed, s.all.total);
    assert!(result
        .records
        .iter()
        .all(|r| r.failure == Some(Failure::Connect) && r.conn.is_none()));
    assert_eq!(s.connections_opened, 0);
    let first = s.first_failure.as_ref().unwrap();
    assert!(first.error.starts_with("connect to "), "{}", first.error);
    assert!(
        s.failures.keys().all(|k| k.starts_with("connect: ")),
        "{:?}",
        s.failures
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_ends_sending_early_and_abort_counts_the_rest_unfinished() {
    let srv = server("s").await;
    srv.state.hang.store(true, Ordering::SeqCst);
    let mut c = config(srv.addr);
    c.duration = Duration::from_secs(60);
    c.drain_wait = Duration::from_secs(60);
    let probe = Probe::new(c).unwrap();
    let handle = probe.handle();
    let control = tokio::spawn(async move {
        let start = Instant::now();
        while handle.progress().in_flight < 2 && start.elapsed() < LIMIT {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        handle.stop();
        // Sending has stopped; the hung slow requests would wait the full drain_wait.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let before = handle.progress().sent;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(handle.progress().sent, before, "nothing sent after stop");
        assert!(handle.progress().sending_done);
        handle.abort();
    });
    let result = tokio::time::timeout(LIMIT, probe.run())
        .await
        .unwrap()
        .unwrap();
    control.await.unwrap();
    let s = &result.summary;
    assert!(s.stopped_early);
    assert!(s.slow.unfinished > 0, "{}", s.table());
    assert_eq!(s.slow.unfinished, s.slow.total);
    assert!(s.table().contains("(stopped early)"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_goaway_moves_new_requests_to_a_new_connection_without_failures() {
    let srv = server("g").await;
    let mut c = config(srv.addr);
    c.http = HttpVersion::Http2;
    c.short_rate = 60.0;
    c.duration = Duration::from_millis(1200);
    let probe = Probe::new(c).unwrap();
    let handle = probe.handle();
    let state = srv.state.clone();
    let goaways = tokio::spawn(async move {
        // Three graceful GOAWAYs while the load runs, each after some progress.
        for round in 1..=3u64 {
            let start = Instant::now();
            while handle.progress().succeeded < round * 15 && start.elapsed() < LIMIT {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            state.goaway();
        }
    });
    let result = tokio::time::timeout(LIMIT, probe.run())
        .await
        .unwrap()
        .unwrap();
    goaways.await.unwrap();
    let seen = srv.state.seen_by_id();

    let s = &result.summary;
    assert!(
        s.is_clean(),
        "a graceful GOAWAY loses nothing: {}",
        s.table()
    );
    assert_counts_match(&result, &seen);
    assert_reuse_matches_server(&result.records, &seen);
    assert!(s.connections_opened >= 2, "{}", s.table());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_in_flight_caps_running_requests_and_counts_the_rest_not_sent() {
    let srv = server("m").await;
    srv.state.hang.store(true, Ordering::SeqCst);
    let mut c = config(srv.addr);
    c.short_rate = 0.0;
    c.slow_rate = 50.0;
    c.max_in_flight = 3;
    c.duration = Duration::from_millis(300);
    c.drain_wait = Duration::from_millis(100);
    let result = run(c).await;
    let s = &result.summary;
    assert_eq!(s.all.total, 3, "{}", s.table());
    assert!(s.not_sent > 0);
    assert!(s.table().contains("max in-flight reached"));
}

// On a current-thread runtime too, as a `#[tokio::test]` in an app's test suite would run it.
#[tokio::test]
async fn json_lines_round_trip_and_carry_every_field() {
    let srv = server("j").await;
    srv.state.set_phase(Some("serving"));
    let mut c = config(srv.addr);
    c.duration = Duration::from_millis(300);
    c.proxy_label = Some("kube-proxy iptables 1.31".into());
    let result = run(c).await;
    let mut buf = Vec::new();
    result.write_json_lines(&mut buf).unwrap();
    let text = String::from_utf8(buf).unwrap();
    let back: Vec<Record> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(back, result.records);
    let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    for key in [
        "id", "kind", "label", "mode", "start_ms", "end_ms", "status", "outcome", "reused", "conn",
        "instance", "phase", "bytes",
    ] {
        assert!(first.get(key).is_some(), "missing {key} in {first}");
    }
    assert_eq!(first["outcome"], "ok");
    assert!(first["latency_us"].is_u64(), "{first}");
    assert!(result
        .records
        .iter()
        .all(|r| r.proxy_label.as_deref() == Some("kube-proxy iptables 1.31")));
    assert_eq!(
        result.summary.proxy_label.as_deref(),
        Some("kube-proxy iptables 1.31")
    );
    assert!(result
        .summary
        .table()
        .contains("through kube-proxy iptables 1.31"));
    assert_eq!(first["phase"], "serving");
    // "serving" is not draining.
    assert_eq!(
        result.summary.draining_new + result.summary.draining_reused,
        0
    );
    // Records are in start order.
    assert!(result
        .records
        .windows(2)
        .all(|w| w[0].start_ms <= w[1].start_ms));
}

#[tokio::test]
async fn invalid_config_is_refused_before_anything_is_sent() {
    let mut c = ProbeConfig::new("127.0.0.1:1");
    c.short_rate = -1.0;
    let err = Probe::new(c).unwrap_err();
    assert_eq!(err.flag(), "--rate");
    assert_eq!(err.field(), "short_rate");
    assert!(err.to_string().contains("≥ 0"), "{err}");

    let mut c = ProbeConfig::new("127.0.0.1:1");
    c.short_rate = 0.0;
    c.slow_rate = 0.0;
    assert!(Probe::new(c)
        .unwrap_err()
        .to_string()
        .contains("nothing would be sent"));

    let mut c = ProbeConfig::new("127.0.0.1:1");
    c.short_rate = 100_000.0;
    c.duration = Duration::from_secs(3600);
    assert!(Probe::new(c).unwrap_err().to_string().contains("in memory"));

    let mut c = ProbeConfig::new("127.0.0.1:1");
    c.max_in_flight = 0;
    assert_eq!(Probe::new(c).unwrap_err().flag(), "--max-in-flight");

    let mut c = ProbeConfig::new("127.0.0.1:1");
    c.label = "two words".into();
    assert_eq!(Probe::new(c).unwrap_err().flag(), "--label");

    let mut c = ProbeConfig::new("127.0.0.1:1");
    c.slow_path = "slow".into();
    assert_eq!(Probe::new(c).unwrap_err().flag(), "--slow-path");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_a_stop_future_over_fresh_http2_connections() {
    let srv = server("f2").await;
    let mut c = config(srv.addr);
    c.http = HttpVersion::Http2;
    c.connections = ConnectionMode::Fresh;
    c.duration = Duration::from_secs(60);
    let stop = tokio::time::sleep(Duration::from_millis(400));
    let result = tokio::time::timeout(LIMIT, lameduck_probe::run(c, stop))
        .await
        .unwrap()
        .unwrap();
    let seen = srv.state.seen_by_id();

    let s = &result.summary;
    assert!(s.stopped_early);
    assert!(s.is_clean(), "{}", s.table());
    assert_counts_match(&result, &seen);
    assert_reuse_matches_server(&result.records, &seen);
    assert!(seen.values().all(|s| s.http2 && s.index == 0));
    assert_eq!(s.connections_opened, s.all.total);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_is_split_before_during_and_after_the_drain() {
    let srv = server("lat").await;
    srv.state.set_phase(Some("serving"));
    let mut c = config(srv.addr);
    c.duration = Duration::from_millis(1500);
    let probe = Probe::new(c).unwrap();
    let handle = probe.handle();
    let state = srv.state.clone();
    let flip = tokio::spawn(async move {
        // serving → draining → serving again, as when the next instance takes over.
        for (after_ok, phase) in [(8, "draining"), (30, "serving")] {
            let start = Instant::now();
            while handle.progress().succeeded < after_ok && start.elapsed() < LIMIT {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            state.set_phase(Some(phase));
        }
    });
    let result = run_probe(probe).await;
    flip.await.unwrap();
    let s = &result.summary;
    assert!(s.is_clean(), "{}", s.table());

    let span = s.drain_span_ms.expect("a draining answer was seen");
    for r in &result.records {
        let end = r.end_ms.unwrap();
        assert_eq!(
            r.latency_us,
            Some(((end - r.start_ms) * 1000.0).round() as u64)
        );
        let want = if r.served_by_draining() || (r.start_ms >= span[0] && r.start_ms <= span[1]) {
            Window::During
        } else if r.start_ms < span[0] {
            Window::Before
        } else {
            Window::After
        };
        assert_eq!(r.window, Some(want), "{r:?}");
        assert_eq!(r.start_unix_ms, Some(s.started_unix_ms as f64 + r.start_ms));
    }
    for window in Window::ALL {
        assert!(
            result.records.iter().any(|r| r.window == Some(window)),
            "no {window} record: {}",
            s.table()
        );
    }
    // Each row counts exactly the ok records of its kind and window, and is ordered.
    for row in &s.latency {
        let mine: Vec<u64> = result
            .records
            .iter()
            .filter(|r| r.kind == row.kind && r.window == Some(row.window))
            .filter_map(|r| r.latency_us)
            .collect();
        assert_eq!(row.count, mine.len() as u64, "{row:?}");
        assert!(
            row.p50_us <= row.p99_us && row.p99_us <= row.max_us,
            "{row:?}"
        );
        // HDR keeps three significant digits: the max is the largest value to within 0.1%.
        let max = *mine.iter().max().unwrap();
        assert!(
            row.max_us.abs_diff(max) <= max / 1000 + 1,
            "{row:?} vs {max}"
        );
        if row.kind == Kind::Slow {
            assert!(row.p50_us >= 150_000, "slow requests wait 150 ms: {row:?}");
        }
    }
    assert!(s
        .latency
        .iter()
        .any(|r| r.kind == Kind::Short && r.window == Window::During));
    let table = s.table();
    assert!(
        table.contains("latency of ok requests (draining answers from"),
        "{table}"
    );
    assert!(table.contains("p99"), "{table}");
}

async fn run_probe(probe: Probe) -> ProbeResult {
    tokio::time::timeout(LIMIT, probe.run())
        .await
        .expect("probe run within the limit")
        .expect("probe run")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_keep_the_first_failure_and_are_counted_apart() {
    let srv = server("retry").await;
    // Requests on reused connections get 503; a retry on a new connection gets 200.
    srv.state.fail_reused.store(true, Ordering::SeqCst);
    let mut c = config(srv.addr);
    c.retry_idempotent = true;
    let result = run(c).await;
    let s = &result.summary;
    let seen = srv.state.seen_by_id();

    let failed: Vec<&Record> = result
        .records
        .iter()
        .filter(|r| r.outcome == Outcome::Failed)
        .collect();
    assert!(!failed.is_empty(), "{}", s.table());
    for r in &result.records {
        match r.outcome {
            Outcome::Failed => {
                // The first attempt's failure stays in the record.
                assert!(r.reused, "{r:?}");
                assert_eq!(r.status, Some(503));
                assert_eq!(r.failure, Some(Failure::Status));
                let retry = r.retry.as_ref().expect("a failed request was retried");
                assert_eq!(retry.id, format!("{}-retry", r.id));
                assert_eq!(retry.outcome, Outcome::Ok, "{r:?}");
                assert_eq!(retry.status, Some(200));
                assert!(retry.start_ms >= r.end_ms.unwrap());
                // On a new connection: the server saw it first on its connection.
                let on_server = &seen[&retry.id];
                assert_eq!(on_server.index, 0, "{on_server:?}");
                assert_ne!(retry.conn, r.conn);
            }
            Outcome::Ok => assert!(r.retry.is_none() && !r.reused, "{r:?}"),
            Outcome::Unfinished => panic!("nothing hangs here: {r:?}"),
        }
    }
    // Both attempts reached the server.
    assert_eq!(seen.len(), result.records.len() + failed.len());
    assert_eq!(
        s.all.failed,
        failed.len() as u64,
        "retried requests stay failed"
    );
    assert_eq!(s.retried, failed.len() as u64);
    assert_eq!(s.retry_succeeded, failed.len() as u64);
    assert_eq!(s.retry_failed, 0);
    assert!(!s.is_clean());
    assert!(
        s.table().contains(&format!(
            "{} failed, then succeeded on retry; 0 failed again",
            failed.len()
        )),
        "{}",
        s.table()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_retries_nothing_is_sent_twice() {
    let srv = server("noretry").await;
    srv.state.fail_reused.store(true, Ordering::SeqCst);
    let result = run(config(srv.addr)).await;
    let s = &result.summary;
    assert!(s.all.failed > 0, "{}", s.table());
    assert!(result.records.iter().all(|r| r.retry.is_none()));
    assert_eq!(srv.state.seen().len(), result.records.len());
    assert_eq!(s.retried, 0);
    assert!(!s.table().contains("retried once"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_that_fails_again_is_counted_as_such() {
    let srv = server("retry503").await;
    srv.state.status.store(503, Ordering::SeqCst);
    let mut c = config(srv.addr);
    c.retry_idempotent = true;
    let result = run(c).await;
    let s = &result.summary;
    assert_eq!(s.all.failed, s.all.total, "{}", s.table());
    assert_eq!(s.retried, s.all.total);
    assert_eq!(s.retry_failed, s.all.total);
    assert_eq!(s.retry_succeeded, 0);
    for r in &result.records {
        let retry = r.retry.as_ref().unwrap();
        assert_eq!((retry.outcome, retry.status), (Outcome::Failed, Some(503)));
    }
}
