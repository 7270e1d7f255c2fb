//! Run with `cargo run --example grpc --features grpc`, then, in other terminals:
//!
//! ```text
//! cargo run --example grpc --features grpc -- client   # one 300 ms call every 500 ms
//! curl 'localhost:9090/drain?wait=none'                # what a preStop hook does
//! ```
//!
//! Once drained, the server waits for the SIGTERM that follows a `preStop` hook: press Ctrl-C.
//!
//! A gRPC service (`slow.Slow`, one unary RPC that sleeps) and the standard health service
//! behind the drain layer, served by `lameduck::serve`. When the drain starts, the health
//! service answers `NOT_SERVING`, the client's connection gets a GOAWAY, its in-flight call
//! finishes, and its next call reconnects — still served while the listener accepts. The client
//! prints which server-side connection carried each call and what the health service says.
//!
//! Ports: `GRPC_ADDR` (default `127.0.0.1:50051`), `ADMIN_ADDR` (default `127.0.0.1:9090`).

#[path = "support/slow.rs"]
mod slow;

use std::net::SocketAddr;
use std::time::Duration;

use lameduck::AdminBuilder;
use lameduck::{Drain, Propagation};
use slow::{SlowClient, SlowServer};
use tonic::service::Routes;
use tonic::transport::Endpoint;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

fn addr(var: &str, default: &str) -> SocketAddr {
    std::env::var(var)
        .unwrap_or_else(|_| default.to_owned())
        .parse()
        .unwrap_or_else(|e| panic!("{var}: {e}"))
}

/// Returns the drain report's exit code in `serve` mode (after destructors ran).
#[tokio::main]
async fn main() -> Result<std::process::ExitCode, Box<dyn std::error::Error>> {
    let grpc_addr = addr("GRPC_ADDR", "127.0.0.1:50051");
    match std::env::args().nth(1).as_deref() {
        None | Some("serve") => serve(grpc_addr).await,
        Some("client") => client(grpc_addr)
            .await
            .map(|()| std::process::ExitCode::SUCCESS),
        Some(other) => Err(format!("unknown mode {other:?}: use `serve` or `client`").into()),
    }
}

async fn serve(
    grpc_addr: SocketAddr,
) -> Result<std::process::ExitCode, Box<dyn std::error::Error>> {
    let drain = Drain::builder()
        .grace_period(Duration::from_secs(20))
        .propagation(Propagation::quiet(Duration::from_secs(2)).min(Duration::from_secs(3)))
        .build()?;

    // The health service follows the drain: NOT_SERVING from the trigger on.
    let (_reporter, health) = lameduck::grpc::health(&drain, [slow::SERVICE]);
    let app = Routes::new(health)
        .add_service(SlowServer)
        .prepare()
        .into_axum_router()
        .layer(drain.layer());

    let admin = tokio::net::TcpListener::bind(addr("ADMIN_ADDR", "127.0.0.1:9090")).await?;
    tokio::spawn(AdminBuilder::new(&drain).serve(admin));

    let listener = tokio::net::TcpListener::bind(grpc_addr).await?;
    println!("gRPC on {grpc_addr}; Ctrl-C or GET /drain on the admin port starts the drain");
    // The slow service reports the connection of each call, from `ConnMeta`.
    let server = tokio::spawn(lameduck::serve(listener, app, &drain).conn_meta_on_every_request());

    let report = drain.run().await;
    server.await?;
    println!("{}", report.summary());
    Ok(std::process::ExitCode::from(&report))
}

async fn client(grpc_addr: SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    // Lazy: the channel (re)connects on demand, which is what lets it follow a GOAWAY.
    let channel = Endpoint::from_shared(format!("http://{grpc_addr}"))?.connect_lazy();
    let mut slow = SlowClient::new(channel.clone());
    let mut health = HealthClient::new(channel);
    for i in 0..40 {
        let status = match health
            .check(HealthCheckRequest {
                service: slow::SERVICE.to_owned(),
            })
            .await
        {
            Ok(r) => format!("{:?}", r.into_inner().status()),
            Err(e) => format!("error {}", e.code()),
        };
        match slow.sleep(300).await {
            Ok(reply) => println!(
                "call {i:2}: slept {} ms on server connection {}; health {status}",
                reply.slept_millis, reply.connection
            ),
            Err(e) => println!(
                "call {i:2}: {} ({}); health {status}",
                e.code(),
                e.message()
            ),
        }
        if status == format!("{:?}", ServingStatus::NotServing) {
            println!("          the server is draining: a real client would now go elsewhere");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}
