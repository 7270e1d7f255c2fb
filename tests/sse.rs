//! Server-sent events over real sockets: streams keep flowing while draining, end cleanly at
//! `stopped_accepting`, and the client's reconnection lands on another replica — on a new
//! connection, resuming where it left off — while the draining process is still up.

mod common;
#[path = "../examples/support/ticks.rs"]
mod ticks;

use std::time::Duration;

use common::{bind, drain, has_event, within};
use lameduck::report::Outcome;
use lameduck::{Drain, EventKind, Phase, Propagation, Trigger};
use ticks::EventStream;
use tokio::sync::oneshot;

const EVERY: Duration = Duration::from_millis(20);

/// A replica: the example's `/events` router behind `lameduck::serve` on 127.0.0.1.
async fn replica(propagation: Propagation, window: Duration) -> (Drain, std::net::SocketAddr) {
    let drain = drain(Duration::from_secs(30), propagation);
    let (listener, addr) = bind().await;
    // Each event names its server connection, from `ConnMeta`.
    tokio::spawn(
        lameduck::serve(listener, ticks::router(&drain, window), &drain)
            .conn_meta_on_every_request(),
    );
    // `serve` marks the replica started when it first runs; until then it is not ready.
    within(
        "the replica to serve",
        drain.moments().reached(Phase::Serving),
    )
    .await;
    (drain, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_ends_cleanly_at_stopped_accepting_and_resumes_on_another_replica() {
    // A fixed delay: an open stream counts as in flight, so a quiet window would wait for `max`.
    let (a, a_addr) = replica(Propagation::fixed(Duration::from_secs(2)), Duration::ZERO).await;
    let (b, b_addr) = replica(Propagation::fixed(Duration::from_secs(2)), Duration::ZERO).await;
    // Stands in for the EndpointSlice controller: new connections go to a ready replica.
    let pick = |a: &Drain| {
        if a.readiness().is_ready() {
            a_addr
        } else {
            b_addr
        }
    };

    // A must-finish task keeps replica A up after its stream ends, as a process with other work
    // would be; released at the end.
    let (release, held) = oneshot::channel::<()>();
    a.work().spawn("other-work", async move {
        let _ = held.await;
    });

    let to = pick(&a);
    assert_eq!(to, a_addr);
    let mut stream = EventStream::open(to, EVERY, None).await.unwrap();
    assert_eq!(a.counts().connections(), 1);
    let mut last = None;
    for _ in 0..3 {
        let tick = within("a tick", stream.next())
            .await
            .unwrap()
            .expect("a tick");
        last = Some(tick);
    }
    let first_connection = last.as_ref().unwrap().connection;

    assert!(a.start(Trigger::Api));
    let mut while_draining = 0;
    let end = within("the stream to end", async {
        loop {
            match stream.next().await {
                Ok(Some(tick)) => {
                    assert_eq!(tick.id, last.as_ref().unwrap().id + 1, "no gap, no repeat");
                    assert_eq!(tick.connection, first_connection);
                    if a.phase() == Phase::Draining {
                        while_draining += 1;
                    }
                    last = Some(tick);
                }
                other => break other,
            }
        }
    })
    .await;
    assert!(
        matches!(end, Ok(None)),
        "the stream ends cleanly, without an error: {end:?}"
    );
    assert!(
        has_event(&a, EventKind::StoppedAccepting),
        "the stream ended at stopped_accepting, not before"
    );
    assert!(while_draining > 0, "events kept flowing while draining");
    // The server closes the connection after the stream: the client reconnects.
    within("the old connection to close", stream.connection)
        .await
        .unwrap()
        .expect("the connection closed cleanly");

    // Reconnect as a browser's EventSource would: after the retry hint, with Last-Event-ID.
    tokio::time::sleep(ticks::RETRY).await;
    let to = pick(&a);
    assert_eq!(to, b_addr, "A is not ready: the reconnection goes to B");
    let last_id = last.as_ref().unwrap().id;
    let mut stream = EventStream::open(to, EVERY, Some(last_id)).await.unwrap();
    let resumed = within("a tick from B", stream.next())
        .await
        .unwrap()
        .expect("a tick");
    assert_eq!(resumed.id, last_id + 1, "resumed where it left off");
    assert_ne!(resumed.connection, first_connection, "on a new connection");
    assert_eq!(b.counts().connections(), 1);
    assert_eq!(
        a.phase(),
        Phase::StoppedAccepting,
        "the draining process is still up"
    );

    release.send(()).unwrap();
    let report = within("A's drain", a.drained()).await;
    assert_eq!(report.outcome, Outcome::Clean, "{}", report.to_json());
    assert!(report.stragglers.is_empty());
    assert!(has_event(&a, EventKind::InFlightZero));
    assert_eq!(b.phase(), Phase::Serving);
    drop(stream);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spread_streams_all_end_cleanly_after_stopped_accepting() {
    let (a, addr) = replica(
        Propagation::fixed(Duration::from_millis(300)),
        Duration::from_millis(300),
    )
    .await;
    let mut streams = Vec::new();
    for _ in 0..4 {
        let mut s = EventStream::open(addr, EVERY, None).await.unwrap();
        within("a first tick", s.next())
            .await
            .unwrap()
            .expect("a tick");
        streams.push(s);
    }
    assert_eq!(a.counts().in_flight(), 4);
    assert!(a.start(Trigger::Api));

    let ends = streams.into_iter().map(|mut s| {
        let a = a.clone();
        tokio::spawn(async move {
            let end = loop {
                match s.next().await {
                    Ok(Some(_)) => continue,
                    other => break other,
                }
            };
            (
                end.map(|_| ()),
                a.phase(),
                has_event(&a, EventKind::StoppedAccepting),
            )
        })
    });
    for end in ends {
        let (end, phase, stopped) = within("a stream to end", end).await.unwrap();
        end.expect("ended cleanly");
        assert!(stopped && phase >= Phase::StoppedAccepting, "{phase}");
    }
    let report = within("the drain", a.drained()).await;
    assert_eq!(report.outcome, Outcome::Clean, "{}", report.to_json());
    assert!(report.stragglers.is_empty());
}
