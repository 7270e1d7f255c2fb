//! Run with `cargo run --release --example bench_server -- <variant> [addr]`.
//!
//! The hello-world server of the load benchmark (`benches/load.sh`): `GET /` answers `hello`.
//! Variants:
//!
//! * `plain`: the bare router under `axum::serve`;
//! * `plain-lserve`: the bare router under `lameduck::serve` (the accept loop alone);
//! * `lameduck-lserve`: `Router::layer(drain.layer())` under `lameduck::serve`;
//! * every `-outer` variant (`lameduck-outer`, `floor-outer`, …): the middleware around the
//!   whole router, under `lameduck::serve` (`axum::serve` takes only services whose body is
//!   axum's `Body`);
//! * any other name from `benches/support/variants.rs` (`lameduck`, `noop`, `floor`,
//!   `floor-body`, `from_fn`, `tasktracker`, `semaphore`, `graceful`, `inflight`, …): that
//!   router under `axum::serve`.
//!
//! The runtime is Tokio's multi-threaded one with its default worker count, which follows the
//! CPU affinity: one worker under `taskset -c 0`. Stop it with SIGTERM (the drain is never
//! started; no signal handler is installed).

use std::net::SocketAddr;

#[path = "../benches/support/variants.rs"]
mod variants;

use variants::drain;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let variant = args.next().unwrap_or_else(|| "plain".to_owned());
    let addr: SocketAddr = args
        .next()
        .unwrap_or_else(|| "127.0.0.1:18080".to_owned())
        .parse()?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let drain = drain();
    eprintln!("bench_server: {variant} on {addr}");

    Ok(variants::serve(variant, listener, drain).await?)
}
