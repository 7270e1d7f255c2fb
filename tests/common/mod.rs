//! Helpers shared by the integration tests: the quiet test builder, bounded waits, loopback
//! listeners, the seeded generator and, with the `http` feature, hyper clients on 127.0.0.1 and
//! the test application.
// Each test binary uses a different subset, and `pub` here only crosses the test's modules.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use lameduck::{Drain, DrainBuilder, EventKind, Phase, Propagation, Signals};
use tokio::net::TcpListener;

#[cfg(feature = "http")]
mod app;
#[cfg(feature = "http")]
mod client;
mod rng;

// Flat, as before the split: a binary that takes nothing from one of them is not a mistake.
#[cfg(feature = "http")]
#[allow(unused_imports)]
pub use app::*;
#[cfg(feature = "http")]
#[allow(unused_imports)]
pub use client::*;
#[allow(unused_imports)]
pub(crate) use rng::Rng;

/// Upper bound for anything a test waits for; generous, never a timing assertion.
pub const PATIENCE: Duration = Duration::from_secs(15);

/// The builder every in-process test starts from: no signal handlers (the test harness owns
/// the process), no report on stderr and no termination log (the tests read the report).
pub fn quiet_builder() -> DrainBuilder {
    Drain::builder()
        .signals(Signals::none())
        .report_to_stderr(false)
        .termination_log(None)
}

/// A coordinator from [`quiet_builder`] with the given budget (not started: `Starting`).
pub fn drain(grace: Duration, propagation: Propagation) -> Drain {
    quiet_builder()
        .grace_period(grace)
        .propagation(propagation)
        .build()
        .expect("valid test budget")
}

pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(PATIENCE, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

/// Polls `cond` every 10 ms, at most for [`PATIENCE`].
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    within(what, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

pub async fn bind() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (listener, addr)
}

pub fn has_event(drain: &Drain, kind: EventKind) -> bool {
    drain.moments().timeline().iter().any(|e| e.event == kind)
}

/// How many times `kind` stands in the timeline (repeats folded into one event count once).
pub fn event_count(drain: &Drain, kind: EventKind) -> usize {
    drain
        .moments()
        .timeline()
        .iter()
        .filter(|e| e.event == kind)
        .count()
}

pub fn is_phase(drain: &Drain, phase: Phase) -> bool {
    drain.phase() == phase
}

/// Every figure the report gives as a moment or a span of this drain fits inside it (issue
/// 50: "no figure larger than the drain's own length where it claims to be part of it"): the
/// timeline, the last new connection, the in-flight hold, the time served past `max`, the
/// slice change, each node's answers, a shorter budget's deadlines in their order, the budget's
/// own arithmetic, and every "at N ms" an advice line states. `slop_ms` covers the few
/// milliseconds between the report's `used_ms` and its last events.
/// The example `name`, built by `cargo test --all-features` next to the test binary.
pub fn example_bin(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(name);
    assert!(
        bin.exists(),
        "{} is missing: run `cargo test --all-features` (or `cargo build --example {name}`) first",
        bin.display()
    );
    bin
}

pub fn assert_figures_fit(r: &lameduck::DrainReport) {
    let slop = 200;
    let used = r.budget.used_ms;
    let within = |what: &str, ms: u64| {
        assert!(
            ms <= used + slop,
            "{what} = {ms} ms, past the drain's own {used} ms: {}",
            r.to_json()
        );
    };
    for e in &r.timeline {
        within(&format!("timeline {}", e.event.as_str()), e.at_ms);
    }
    if let Some(ms) = r.after_flip.last_new_connection_ms {
        within("after_flip.last_new_connection_ms", ms);
    }
    if let Some(e) = &r.propagation.evidence {
        if let Some(h) = &e.in_flight_hold {
            within(
                "in_flight_hold.since_ms + waited_ms",
                h.since_ms + h.waited_ms,
            );
        }
        if let Some(ms) = e.past_max_ms {
            within("past_max_ms", ms);
        }
        if let Some(ms) = e
            .endpoint_slice
            .as_ref()
            .and_then(|s| s.changed_at_ms)
            .filter(|&ms| ms >= 0)
        {
            within("endpoint_slice.changed_at_ms", ms as u64);
        }
        for n in &e.nodes {
            for (what, ms) in [
                ("first_asked_ms", n.first_asked_ms),
                ("last_answer_ms", n.last_answer_ms),
                ("confirmed_at_ms", n.confirmed_at_ms),
            ] {
                if let Some(ms) = ms {
                    within(&format!("nodes[{}].{what}", n.agent), ms);
                }
            }
        }
    }
    let b = &r.budget;
    match &b.deletion {
        Some(d) => {
            assert!(
                d.max_ms <= d.quiesce_ms && d.quiesce_ms <= d.hard_ms && d.hard_ms <= d.kill_at_ms,
                "a shorter budget's deadlines out of order: {d:?}"
            );
            assert!(d.kill_at_ms <= b.grace_ms, "{d:?}");
            let left = d.kill_at_ms.saturating_sub(used);
            // Each figure rounds down to its millisecond on its own.
            assert!(b.remaining_ms.abs_diff(left) <= 1, "{b:?}");
        }
        None => {
            let left = b.grace_ms.saturating_sub(used);
            assert!(b.remaining_ms.abs_diff(left) <= 1, "{b:?}");
        }
    }
    // The summary (`/dev/termination-log`, and the stderr line's headline): every "N ms" it
    // prints is a moment or a span of this drain, but the settings it quotes (the grace, the
    // budget, `max`, `min`, a fallback), wall-clock instants ("unix N ms"), a straggler's age
    // and a task's run time, which may begin before the trigger. Its first line may be the first advice's, which quotes
    // settings freely; its moments are checked with the advice below.
    let first_advice = r
        .advice
        .first()
        .map(|a| format!("{}: {}", a.level.as_str(), a.message));
    let summary: String = r
        .summary()
        .lines()
        .filter(|l| Some(*l) != first_advice.as_deref() && !l.starts_with("forced: "))
        .map(|l| format!("{l}\n"))
        .collect();
    let mut from = 0;
    while let Some(i) = summary[from..].find(" ms") {
        let end = from + i;
        from = end + 3;
        let lead = summary[..end].trim_end_matches(|c: char| c.is_ascii_digit());
        let digits = &summary[lead.len()..end];
        // A span before the trigger ("N ms before the trigger", "at -N ms") is not in it.
        if digits.is_empty() || lead.ends_with('-') || summary[from..].starts_with(" before") {
            continue;
        }
        let lead = lead.trim_end_matches([' ', '(']);
        let setting = [
            "age", "after", "of", "budget", "max", "min", "fallback", "grace", "quiet", "window",
            "unix",
        ]
        .iter()
        .any(|w| lead.ends_with(w));
        if !setting {
            let shown = lead
                .char_indices()
                .rev()
                .nth(39)
                .map_or(lead, |(i, _)| &lead[i..]);
            within(
                &format!("summary: \"{shown} {digits} ms\""),
                digits.parse().unwrap(),
            );
        }
    }
    // "at N ms" in the advice is a moment of this drain.
    for a in &r.advice {
        let mut rest = a.message.as_str();
        while let Some(i) = rest.find(" at ") {
            rest = &rest[i + 4..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            if !digits.is_empty() && rest[digits.len()..].starts_with(" ms") {
                within(
                    &format!("advice {}: \"at {digits} ms\"", a.rule),
                    digits.parse().unwrap(),
                );
            }
        }
    }
}
