//! Run with `cargo run --example sse` (two replicas and a client in one process), or by hand:
//!
//! ```text
//! ADDR=127.0.0.1:3000 ADMIN_ADDR=127.0.0.1:9090 cargo run --example sse -- serve
//! ADDR=127.0.0.1:3001 ADMIN_ADDR=127.0.0.1:9091 cargo run --example sse -- serve
//! cargo run --example sse -- client 127.0.0.1:3000 127.0.0.1:3001
//! curl 'localhost:9090/drain?wait=none'      # drain the first replica
//! ```
//!
//! A server-sent-events endpoint whose streams keep flowing while the replica drains, end
//! cleanly at `stopped_accepting` (spread over a window, so clients do not all reconnect in the
//! same millisecond), and a client that reconnects with `Last-Event-ID` to the next replica
//! that accepts — losing no event and seeing none twice.

#[path = "support/ticks.rs"]
mod ticks;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use lameduck::AdminBuilder;
use lameduck::{Drain, Propagation, Trigger};
use ticks::EventStream;

/// How often the server sends an event.
const EVERY: Duration = Duration::from_millis(250);

fn env_addr(var: &str, default: &str) -> SocketAddr {
    std::env::var(var)
        .unwrap_or_else(|_| default.to_owned())
        .parse()
        .unwrap_or_else(|e| panic!("{var}: {e}"))
}

/// Returns the drain report's exit code in `serve` mode (after destructors ran).
#[tokio::main]
async fn main() -> Result<ExitCode, Box<dyn std::error::Error + Send + Sync>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        None | Some("demo") => demo().await.map(|()| ExitCode::SUCCESS),
        Some("serve") => {
            let addr = env_addr("ADDR", "127.0.0.1:3000");
            let admin = env_addr("ADMIN_ADDR", "127.0.0.1:9090");
            serve(addr, admin).await
        }
        Some("client") => {
            let addrs = args[1..]
                .iter()
                .map(|a| a.parse())
                .collect::<Result<Vec<SocketAddr>, _>>()?;
            if addrs.is_empty() {
                return Err("client: give one or more replica addresses".into());
            }
            client(&addrs, 200).await.map(|()| ExitCode::SUCCESS)
        }
        Some(other) => Err(format!("unknown mode {other:?}: use demo, serve or client").into()),
    }
}

fn drain() -> Result<Drain, lameduck::ConfigError> {
    Drain::builder()
        .grace_period(Duration::from_secs(20))
        // Open streams count as in flight, so a quiet window would always wait for `max`.
        .propagation(Propagation::fixed(Duration::from_secs(2)))
        .build()
}

async fn serve(
    addr: SocketAddr,
    admin: SocketAddr,
) -> Result<ExitCode, Box<dyn std::error::Error + Send + Sync>> {
    let drain = drain()?;
    let admin = tokio::net::TcpListener::bind(admin).await?;
    tokio::spawn(AdminBuilder::new(&drain).serve(admin));

    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("events on http://{addr}/events; Ctrl-C or GET /drain on the admin port drains");
    let app = ticks::router(&drain, Duration::from_secs(3));
    // Each event names its server connection, from `ConnMeta`.
    let server = tokio::spawn(lameduck::serve(listener, app, &drain).conn_meta_on_every_request());
    let report = drain.run().await;
    server.await?;
    println!("{}", report.summary());
    Ok(ExitCode::from(&report))
}

/// Follows the stream across replicas: on a clean end, waits the server's retry hint and
/// reconnects with `Last-Event-ID` to the first address that accepts.
async fn client(
    addrs: &[SocketAddr],
    events: usize,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut last_id = None;
    let mut seen = 0;
    for _attempt in 0..100 {
        let mut stream = None;
        for addr in addrs {
            match EventStream::open(*addr, EVERY, last_id).await {
                Ok(s) => {
                    println!("connected to {addr} (resuming after {last_id:?})");
                    stream = Some(s);
                    break;
                }
                Err(e) => println!("{addr}: {e}"),
            }
        }
        let Some(mut stream) = stream else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        loop {
            match stream.next().await {
                Ok(Some(tick)) => {
                    println!(
                        "  event {} on server connection {}",
                        tick.id, tick.connection
                    );
                    last_id = Some(tick.id);
                    seen += 1;
                    if seen >= events {
                        return Ok(());
                    }
                }
                Ok(None) => {
                    println!("  stream ended cleanly; reconnecting");
                    break;
                }
                Err(e) => {
                    println!("  stream cut: {e}; reconnecting");
                    break;
                }
            }
        }
        tokio::time::sleep(ticks::RETRY).await;
    }
    Ok(())
}

/// Two replicas and a client in one process; the first replica drains after two seconds.
async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut replicas = Vec::new();
    let mut addrs = Vec::new();
    for _ in 0..2 {
        let drain = Drain::builder()
            .grace_period(Duration::from_secs(10))
            .propagation(Propagation::fixed(Duration::from_secs(1)))
            .signals(lameduck::Signals::none())
            .report_to_stderr(false)
            .build()?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        addrs.push(listener.local_addr()?);
        let app = ticks::router(&drain, Duration::from_millis(500));
        tokio::spawn(lameduck::serve(listener, app, &drain).conn_meta_on_every_request());
        replicas.push(drain);
    }
    let first = replicas[0].clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        println!("-- draining the first replica");
        first.start(Trigger::Api);
        first
            .moments()
            .reached(lameduck::Phase::StoppedAccepting)
            .await;
        println!("-- first replica stopped accepting");
        let report = first.drained().await;
        println!(
            "-- first replica done: {}",
            report.summary().lines().next().unwrap_or("")
        );
    });
    client(&addrs, 25).await
}
