//! The rollout-level edges of the budget, through a real process: a `preStop` hook that gives
//! up mid-drain, and a request that outlives the quiesce deadline.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use lameduck::report::Outcome;
use lameduck::{EventKind, Trigger};

use crate::procs::{free_port, scratch, Instance};

/// Sends one raw HTTP/1.1 GET and returns the socket (the answer is read by the caller).
fn send_get(addr: SocketAddr, path: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: e2e\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    s
}

/// Reads until the peer closes (or a read error), returning what arrived.
fn read_to_close(mut s: TcpStream) -> String {
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

#[test]
fn a_prestop_hook_that_gives_up_mid_drain_does_not_end_the_drain() {
    let dir = scratch("hook-timeout");
    let admin = free_port();
    // min 3 s: the drain is still propagating when the hook's 1 s timeout passes.
    let flags = [
        "--grace-period",
        "12s",
        "--quiet",
        "1s",
        "--min",
        "3s",
        "--max",
        "6s",
    ];
    let mut inst = Instance::start("hook", free_port(), admin, &dir, &flags);
    // Ready first (its warm-up gate open): a drain before that commits at once (never served).
    let ready_by = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !read_to_close(send_get(([127, 0, 0, 1], admin).into(), "/readyz"))
        .starts_with("HTTP/1.1 200")
    {
        assert!(std::time::Instant::now() < ready_by, "never ready");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let answer = read_to_close(send_get(
        ([127, 0, 0, 1], admin).into(),
        "/drain?timeout=1s",
    ));
    assert!(
        answer.starts_with("HTTP/1.1 504"),
        "the hook's wait should time out: {answer:?}"
    );
    // It answered while the drain was still propagating, not when it ended.
    assert!(
        answer.contains("\"phase\":\"draining\""),
        "the hook gave up during propagation: {answer:?}"
    );
    // kubelet goes on with SIGTERM after a failed hook; the drain it started goes on too.
    inst.signal("-TERM");
    let code = inst.wait_exit(Duration::from_secs(15));
    let report = inst.report();
    assert_eq!(code, 0);
    assert_eq!(report.outcome, Outcome::Clean);
    assert_eq!(report.trigger, Some(Trigger::PreStop));
    let stopped = report
        .event(EventKind::StoppedAccepting)
        .expect("stopped_accepting");
    assert!(
        stopped.at_ms >= 3000,
        "the hook's timeout ended propagation early: {} ms",
        stopped.at_ms
    );
    assert!(
        report.event(EventKind::SignalReceived).is_some(),
        "SIGTERM after the hook is recorded as a repeated trigger"
    );
}

#[test]
fn a_request_longer_than_the_quiesce_deadline_is_cut_and_named() {
    let dir = scratch("over-budget");
    let listen = free_port();
    // Grace 6 s: the defaults shrink to a 0.2 s margin and a 1 s close budget, so the quiesce
    // deadline is 4.8 s after SIGTERM — well before the 30 s request ends.
    let flags = [
        "--grace-period",
        "6s",
        "--quiet",
        "500ms",
        "--min",
        "500ms",
        "--max",
        "1s",
    ];
    let mut inst = Instance::start("over", listen, free_port(), &dir, &flags);
    let slow = send_get(([127, 0, 0, 1], listen).into(), "/slow?ms=30000");
    std::thread::sleep(Duration::from_millis(300));
    inst.signal("-TERM");
    let code = inst.wait_exit(Duration::from_secs(10));
    let answer = read_to_close(slow);
    let report = inst.report();
    assert_eq!(code, 1, "a cut request makes the exit code 1");
    assert_eq!(report.outcome, Outcome::DeadlineExceeded);
    assert!(
        !answer.starts_with("HTTP/1.1 200"),
        "the 30 s request cannot have been answered: {answer:?}"
    );
    let cut: Vec<_> = report
        .stragglers
        .iter()
        .filter(|s| format!("{:?}", s.kind).to_lowercase().contains("request"))
        .collect();
    assert_eq!(
        cut.len(),
        1,
        "one request straggler: {:?}",
        report.stragglers
    );
    assert!(
        cut[0].age_ms >= 4000,
        "the straggler's age covers the drain: {} ms",
        cut[0].age_ms
    );
    if cut[0].name != "(undescribed guard)" {
        assert!(cut[0].name.contains("/slow"), "{}", cut[0].name);
    }
    assert!(report.event(EventKind::DeadlineExceeded).is_some());
}
