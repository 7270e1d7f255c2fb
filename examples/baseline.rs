//! Run with `cargo run --example baseline -- --naive --listen 127.0.0.1:8080 --admin 127.0.0.1:9901`.
//!
//! What lameduck is compared against: the example application served *without* lameduck, in
//! the two ways services commonly stop. The end-to-end tests, `lameduck-probe check`'s tests
//! and the datapath testbed run it beside `examples/service.rs`, which is the template to copy.
//!
//! ```text
//! baseline (--naive | --fixed-sleep DUR) [--listen ADDR] [--admin ADDR] [--instance NAME]
//!          [--report-file PATH]
//! ```
//!
//! * `--naive`: no readiness awareness, no drain: `/readyz` is "the port answers", and the
//!   process exits at once on SIGTERM.
//! * `--fixed-sleep DUR`: on SIGTERM `/readyz` answers 503, the service keeps serving unchanged
//!   for DUR (no `Connection: close`), then stops with axum's `with_graceful_shutdown`.
//!   `--fixed-sleep 0` is axum's documented graceful shutdown; behind a `preStop` `sleep 5` it
//!   is the usual "sleep, then stop gracefully" recipe.
//!
//! The routes on `--listen` are the service example's (`GET /`, `/slow?ms=N`, `/stream?ms=N`,
//! with `x-instance` and the echoed `x-request-id`). `--report-file` is accepted so the same
//! command lines work for both binaries; a baseline writes no report. On stdout it prints
//! `READY listen=… admin=…` once both listeners are bound, as the service does.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

#[path = "common/app.rs"]
mod app;
use app::app;

enum Mode {
    Naive,
    FixedSleep(Duration),
}

struct Args {
    mode: Mode,
    listen: SocketAddr,
    admin: SocketAddr,
    instance: String,
}

const USAGE: &str = "usage: baseline (--naive | --fixed-sleep DUR) [--listen ADDR] [--admin ADDR] \
                     [--instance NAME] [--report-file PATH]";

fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut mode = None;
    let mut listen: SocketAddr = ([127, 0, 0, 1], 8080).into();
    let mut admin: SocketAddr = ([127, 0, 0, 1], 9901).into();
    let mut instance = "baseline".to_owned();
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let addr = |v: String| {
            v.parse::<SocketAddr>()
                .map_err(|e| format!("{flag} {v:?}: {e}"))
        };
        match flag.as_str() {
            "--naive" => mode = Some(Mode::Naive),
            "--fixed-sleep" => {
                let d = lameduck::parse_duration(&value()?)
                    .map_err(|e| format!("--fixed-sleep: {e}"))?;
                mode = Some(Mode::FixedSleep(d));
            }
            "--listen" => listen = addr(value()?)?,
            "--admin" => admin = addr(value()?)?,
            "--instance" => instance = value()?,
            // Accepted for drop-in use with the service's command lines; nothing is written.
            "--report-file" => {
                value()?;
            }
            other => return Err(format!("unknown flag {other:?}")),
        }
    }
    let mode = mode.ok_or("--naive or --fixed-sleep DUR is needed")?;
    Ok(Args {
        mode,
        listen,
        admin,
        instance,
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("baseline: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let (listener, admin) = match bind(&args).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("baseline: {e}");
            return ExitCode::from(2);
        }
    };
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("baseline: no SIGTERM handler: {e}");
            return ExitCode::from(2);
        }
    };
    ready(&listener, &admin);
    match args.mode {
        Mode::Naive => naive(listener, admin, &args.instance, &mut term).await,
        Mode::FixedSleep(sleep) => {
            fixed_sleep(listener, admin, &args.instance, sleep, &mut term).await
        }
    }
}

async fn bind(args: &Args) -> Result<(TcpListener, TcpListener), String> {
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let admin = TcpListener::bind(args.admin)
        .await
        .map_err(|e| format!("cannot listen on {} (admin): {e}", args.admin))?;
    Ok((listener, admin))
}

/// The READY line the tests and scripts wait for. A closed stdout is not a reason to stop
/// serving: `println!` would panic there, this ignores it.
fn ready(listener: &TcpListener, admin: &TcpListener) {
    use std::io::Write as _;
    let addr = |l: &TcpListener| {
        l.local_addr()
            .map_or_else(|e| format!("? ({e})"), |a| a.to_string())
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "READY listen={} admin={}", addr(listener), addr(admin))
        .and_then(|()| out.flush());
}

/// Serve until SIGTERM, then exit at once (what many services do).
async fn naive(
    listener: TcpListener,
    admin: TcpListener,
    instance: &str,
    term: &mut tokio::signal::unix::Signal,
) -> ExitCode {
    let probes = Router::new()
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }));
    tokio::spawn(async move {
        let _ = axum::serve(admin, probes).await;
    });
    let app = app(instance);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    term.recv().await;
    // Returning ends the runtime: every connection is dropped where it stands.
    ExitCode::SUCCESS
}

/// On SIGTERM answer 503 on `/readyz`, keep serving unchanged for `sleep`, then stop with
/// axum's `with_graceful_shutdown` (idle connections closed, in-flight ones finished).
async fn fixed_sleep(
    listener: TcpListener,
    admin: TcpListener,
    instance: &str,
    sleep: Duration,
    term: &mut tokio::signal::unix::Signal,
) -> ExitCode {
    let stopping = Arc::new(AtomicBool::new(false));
    let flag = stopping.clone();
    let probes = Router::new().route("/livez", get(|| async { "ok" })).route(
        "/readyz",
        get(move || {
            // Relaxed: a probe that reads the flag one request late is what a real one does.
            let stopping = flag.load(Ordering::Relaxed);
            async move {
                if stopping {
                    (StatusCode::SERVICE_UNAVAILABLE, "stopping")
                } else {
                    (StatusCode::OK, "ok")
                }
            }
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(admin, probes).await;
    });
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let app = app(instance);
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stop_rx.await;
            })
            .await
    });
    term.recv().await;
    stopping.store(true, Ordering::Relaxed);
    tokio::time::sleep(sleep).await;
    let _ = stop_tx.send(());
    match server.await {
        Ok(Ok(())) => ExitCode::SUCCESS,
        _ => ExitCode::FAILURE,
    }
}
