//! WebSockets over real sockets: each socket counts as in flight while open, gets a Close frame
//! with code 1001 at `stopped_accepting` (spread over a window), and its client reconnects to
//! another replica; the drain ends clean only after every socket closed.

mod common;
#[path = "../examples/support/ws.rs"]
mod ws;

use std::time::{Duration, Instant};

use common::{bind, drain, eventually, ms, secs, within};
use lameduck::report::Outcome;
use lameduck::{Drain, EventKind, Phase, Propagation, Trigger};
use ws::{follow, End, GOING_AWAY};

async fn replica(spread: Duration) -> (Drain, std::net::SocketAddr) {
    let drain = drain(secs(30), Propagation::fixed(ms(500)));
    let (listener, addr) = bind().await;
    let app = ws::router(&drain, Duration::from_millis(20), spread);
    tokio::spawn(lameduck::serve(listener, app, &drain));
    within(
        "the replica to serve",
        drain.moments().reached(Phase::Serving),
    )
    .await;
    (drain, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sockets_get_going_away_at_stopped_accepting_and_reconnect_elsewhere() {
    let spread = Duration::from_millis(600);
    let (a, a_addr) = replica(spread).await;
    let (_b, b_addr) = replica(spread).await;

    const CLIENTS: usize = 10;
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(tokio::spawn(async move {
            let first = follow(a_addr, 100_000).await.expect("connect to A");
            let closed_at = Instant::now();
            let second = follow(b_addr, 3).await.expect("reconnect to B");
            (first, closed_at, second)
        }));
    }
    // Every socket counts as in flight while open.
    eventually("all sockets open on A", || {
        a.counts().in_flight() == CLIENTS
    })
    .await;

    let triggered = Instant::now();
    assert!(a.start(Trigger::Api));
    within(
        "A stops accepting",
        a.moments().reached(Phase::StoppedAccepting),
    )
    .await;
    let stopped = Instant::now();
    // Sockets keep the drain from in-flight zero until they are closed.
    assert!(
        a.counts().in_flight() > 0,
        "sockets were not counted as in flight"
    );

    let mut closes = Vec::new();
    for c in clients {
        let (first, closed_at, second) = within("a client", c).await.unwrap();
        assert_eq!(first.server, a_addr);
        assert_eq!(
            first.end,
            End::Closed(GOING_AWAY),
            "a socket on the draining replica ended without a Close frame"
        );
        assert!(first.ticks > 0, "the socket carried ticks before the drain");
        assert!(
            closed_at >= stopped
                || closed_at.duration_since(triggered) >= Duration::from_millis(500),
            "a socket was closed before stopped_accepting"
        );
        closes.push(closed_at);
        assert_eq!(second.server, b_addr);
        assert_eq!(second.end, End::Enough, "the reconnected socket on B works");
    }

    let report = within("A's drain", a.drained()).await;
    assert_eq!(report.outcome, Outcome::Clean);
    assert!(report.event(EventKind::InFlightZero).is_some());
    assert!(report.stragglers.is_empty());
    // Spread: the closes are not all in the same instant.
    let first = closes.iter().min().unwrap();
    let last = closes.iter().max().unwrap();
    assert!(
        last.duration_since(*first) >= spread / 4,
        "closes were not spread: {:?}",
        last.duration_since(*first)
    );
}
