//! Run with `cargo run --example websocket` (two replicas and eight clients in one process).
//!
//! WebSockets never end by themselves. Each socket holds an in-flight guard, so the drain waits
//! for it; at `stopped_accepting` the server sends every socket a Close frame with code 1001
//! ("going away"), spread over a window so the clients do not all reconnect in the same
//! millisecond; the clients reconnect to the replica that still accepts. The output shows each
//! client's move and the draining replica's report.

#[path = "support/ws.rs"]
mod ws;

use std::net::SocketAddr;
use std::time::Duration;

use lameduck::{Drain, Phase, Propagation, Signals, Trigger};
use ws::{follow, End};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut replicas: Vec<(Drain, SocketAddr)> = Vec::new();
    for _ in 0..2 {
        let drain = Drain::builder()
            .grace_period(Duration::from_secs(10))
            // Open sockets count as in flight, so a quiet window would wait for `max`.
            .propagation(Propagation::fixed(Duration::from_secs(1)))
            .signals(Signals::none())
            .report_to_stderr(false)
            .termination_log(None)
            .build()?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = ws::router(&drain, Duration::from_millis(100), Duration::from_secs(1));
        tokio::spawn(lameduck::serve(listener, app, &drain));
        replicas.push((drain, addr));
    }
    let (a, a_addr) = replicas[0].clone();
    let (_, b_addr) = replicas[1];

    let mut clients = Vec::new();
    for i in 0..8 {
        clients.push(tokio::spawn(async move {
            let first = follow(a_addr, 1_000).await?;
            println!(
                "client {i}: {} ticks from {}, then {:?}",
                first.ticks, first.server, first.end
            );
            if first.end == End::Closed(ws::GOING_AWAY) {
                let second = follow(b_addr, 5).await?;
                println!(
                    "client {i}: reconnected to {}, {} ticks",
                    second.server, second.ticks
                );
            }
            Ok::<_, std::io::Error>(())
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    println!("-- draining replica A ({a_addr})");
    a.start(Trigger::Api);
    a.moments().reached(Phase::StoppedAccepting).await;
    println!("-- replica A stopped accepting; its sockets are being closed");
    for c in clients {
        c.await??;
    }
    let report = a.drained().await;
    println!(
        "-- replica A: {}",
        report.summary().lines().next().unwrap_or("")
    );
    Ok(())
}
