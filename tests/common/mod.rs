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
