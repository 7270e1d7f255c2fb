//! Run with `cargo run --example service -- --listen 127.0.0.1:8080 --admin 127.0.0.1:9901`.
//!
//! The production-style setup a service author copies: an axum app behind `drain.layer()`,
//! served by `lameduck::serve`, a separate admin listener for probes and the `preStop` hook, a
//! startup gate, a cancel-on-drain task, a must-finish task, a resource closer, and the report.
//! The process exits with the report's exit code.
//!
//! ```text
//! service [--listen ADDR] [--admin ADDR] [--instance NAME] [--grace-period DUR]
//!         [--quiet DUR] [--min DUR] [--max DUR] [--quiet-suffices-after DUR]
//!         [--report-file PATH]
//!         [--stuck-task] [--startup-delay DUR] [--naive] [--fixed-sleep DUR]
//!         [--readiness-policy auto|not-ready|serving-until-stop]
//! service prestop [--admin ADDR]      # the preStop exec hook, for images without curl
//! ```
//!
//! Routes on `--listen`: `GET /` → `ok`; `GET /slow?ms=N` → `ok` after N ms;
//! `GET /stream?ms=N` → a chunked body streaming for N ms. Every response carries `x-instance`
//! and echoes `x-request-id`. `--naive` turns lameduck off entirely (no drain: exit at once on
//! SIGTERM) for comparisons. `--fixed-sleep DUR` is the other baseline, without lameduck: on
//! SIGTERM `/readyz` answers 503, the service keeps serving unchanged for DUR (no
//! `Connection: close`), then stops with axum's `with_graceful_shutdown`; `--fixed-sleep 0` is
//! axum's documented graceful shutdown, and behind a `preStop` `sleep 5` it is the usual
//! "sleep, then stop gracefully" recipe.
//!
//! On stdout it prints one line once both listeners are bound:
//! `READY listen=127.0.0.1:8080 admin=127.0.0.1:9901`.

use std::net::SocketAddr;
use std::time::Duration;

use axum::http::HeaderName;
use axum::routing::get;
use axum::Router;
use lameduck::{parse_duration, Drain, Propagation};

#[path = "common/app.rs"]
mod app;
use app::app;

struct Args {
    listen: SocketAddr,
    admin: SocketAddr,
    instance: String,
    grace_period: Option<Duration>,
    quiet: Option<Duration>,
    min: Option<Duration>,
    max: Option<Duration>,
    quiet_suffices_after: Option<Duration>,
    report_file: Option<String>,
    stuck_task: bool,
    startup_delay: Duration,
    naive: bool,
    fixed_sleep: Option<Duration>,
    readiness_policy: Option<lameduck::ReadinessWhileDraining>,
}

fn usage(msg: &str) -> ! {
    complain(format!("service: {msg}"));
    complain(
        "usage: service [--listen ADDR] [--admin ADDR] [--instance NAME] [--grace-period DUR] \
         [--quiet DUR] [--min DUR] [--max DUR] [--quiet-suffices-after DUR] \
         [--report-file PATH] [--stuck-task] \
         [--startup-delay DUR] [--naive] [--fixed-sleep DUR] \
         [--readiness-policy auto|not-ready|serving-until-stop]\n       service prestop [--admin ADDR]",
    );
    flush_log();
    std::process::exit(2)
}

fn parse_args(mut it: impl Iterator<Item = String>) -> Args {
    let mut a = Args {
        listen: "127.0.0.1:8080".parse().unwrap(),
        admin: "127.0.0.1:9901".parse().unwrap(),
        instance: "service".to_owned(),
        grace_period: None,
        quiet: None,
        min: None,
        max: None,
        quiet_suffices_after: None,
        report_file: None,
        stuck_task: false,
        startup_delay: Duration::ZERO,
        naive: false,
        fixed_sleep: None,
        readiness_policy: None,
    };
    while let Some(flag) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .unwrap_or_else(|| usage(&format!("{name} needs a value")))
        };
        let dur = |name: &str, v: String| {
            parse_duration(&v).unwrap_or_else(|e| usage(&format!("{name}: {e}")))
        };
        let addr = |name: &str, v: String| {
            v.parse::<SocketAddr>()
                .unwrap_or_else(|e| usage(&format!("{name} {v:?}: {e}")))
        };
        match flag.as_str() {
            "--listen" => a.listen = addr("--listen", value("--listen")),
            "--admin" => a.admin = addr("--admin", value("--admin")),
            "--instance" => a.instance = value("--instance"),
            "--grace-period" => {
                a.grace_period = Some(dur("--grace-period", value("--grace-period")))
            }
            "--quiet" => a.quiet = Some(dur("--quiet", value("--quiet"))),
            "--min" => a.min = Some(dur("--min", value("--min"))),
            "--max" => a.max = Some(dur("--max", value("--max"))),
            "--quiet-suffices-after" => {
                a.quiet_suffices_after = Some(dur(
                    "--quiet-suffices-after",
                    value("--quiet-suffices-after"),
                ))
            }
            // The old name read like a floor; it never was one (`--min` is).
            "--assume-converged-after" => {
                complain(
                    "service: --assume-converged-after is now --quiet-suffices-after (a fallback, \
                     not a floor; the floor is --min)",
                );
                a.quiet_suffices_after = Some(dur(
                    "--assume-converged-after",
                    value("--assume-converged-after"),
                ))
            }
            "--report-file" => a.report_file = Some(value("--report-file")),
            "--stuck-task" => a.stuck_task = true,
            "--startup-delay" => a.startup_delay = dur("--startup-delay", value("--startup-delay")),
            "--naive" => a.naive = true,
            "--fixed-sleep" => a.fixed_sleep = Some(dur("--fixed-sleep", value("--fixed-sleep"))),
            "--readiness-policy" => {
                let v = value("--readiness-policy");
                a.readiness_policy = Some(
                    v.parse()
                        .unwrap_or_else(|e| usage(&format!("--readiness-policy: {e}"))),
                )
            }
            "-h" | "--help" => usage("help"),
            other => usage(&format!("unknown flag {other:?}")),
        }
    }
    a
}

fn main() {
    let mut argv = std::env::args().skip(1).peekable();
    if argv.peek().map(String::as_str) == Some("prestop") {
        argv.next();
        let args = parse_args(argv);
        // The preStop exec hook: ask our own admin port to drain, exit 0/1.
        match lameduck::prestop_blocking(args.admin, lameduck::PrestopOptions::from_env()) {
            Ok(status) => {
                say(&format!("drained: phase {}", status.phase));
                std::process::exit(0)
            }
            Err(e) => {
                complain(format!("prestop: {e}"));
                flush_log();
                std::process::exit(1)
            }
        }
    }
    let args = parse_args(argv);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let code = rt.block_on(async move {
        if args.naive {
            naive(args).await
        } else if let Some(sleep) = args.fixed_sleep {
            fixed_sleep(args, sleep).await
        } else {
            run(args).await
        }
    });
    flush_log();
    std::process::exit(code)
}

async fn run(args: Args) -> i32 {
    let mut builder = Drain::builder();
    if let Some(g) = args.grace_period {
        builder = builder.grace_period(g);
    }
    // The defaults, with whatever the flags change.
    let mut p = args
        .quiet
        .map_or_else(Propagation::default, Propagation::quiet);
    if let Some(m) = args.min {
        p = p.min(m);
    }
    if let Some(m) = args.max {
        p = p.max(m);
    }
    if let Some(f) = args.quiet_suffices_after {
        p = p.quiet_suffices_after(f);
    }
    builder = builder.propagation(p);
    if let Some(f) = &args.report_file {
        builder = builder.report_file(f);
    }
    if let Some(r) = args.readiness_policy {
        builder = builder.readiness_while_draining(r);
    }
    let drain = match builder.build() {
        Ok(d) => d,
        Err(e) => {
            complain(format!("service: {e}"));
            return 2;
        }
    };

    // With the `kube` feature, in a Pod: the EndpointSlice is the authoritative propagation
    // step and the deletion's grace the real budget (examples/k8s/role.yaml grants the reads).
    // Outside a Pod (POD_NAME unset) the report says why it was not used.
    #[cfg(feature = "kube")]
    if let Err(e) = lameduck::EndpointWatch::from_env().start(&drain) {
        complain(format!("service: no EndpointSlice evidence: {e}"));
    }

    // Startup gate: not ready until the warm-up is done.
    let warmup = drain.startup_gate("warmup");
    let delay = args.startup_delay;
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        warmup.open();
    });

    // A poller that stops taking new work when the drain starts.
    drain.spawn_cancellable("poller", |ctx| async move {
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                () = ctx.drain_started().cancelled() => return,
                _ = tick.tick() => {}
            }
        }
    });
    // A buffer that must be flushed before exit.
    let stop = drain.stopped_accepting();
    drain.spawn("flush-buffer", async move {
        stop.cancelled().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    });
    if args.stuck_task {
        drain.spawn("stuck-task", std::future::pending::<()>());
    }
    // Closed after the requests and tasks that use it.
    drain.on_close_with(
        "db-pool",
        lameduck::CloseOptions::new().timeout(Duration::from_secs(2)),
        || async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok::<_, std::io::Error>(())
        },
    );

    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            complain(format!("service: cannot listen on {}: {e}", args.listen));
            return 2;
        }
    };
    let admin = match tokio::net::TcpListener::bind(args.admin).await {
        Ok(l) => l,
        Err(e) => {
            complain(format!(
                "service: cannot listen on {} (admin): {e}",
                args.admin
            ));
            return 2;
        }
    };
    // Before READY: a SIGTERM right after it must drain, not kill (`run` would install them
    // only later).
    drain.install_signals();
    ready(&listener, &admin);
    // The admin listener is not behind the drain layer and lives until the process exits;
    // `run` returns only once every `/drain` caller has its answer.
    tokio::spawn(drain.admin().serve(admin));
    let app = app(&args.instance).layer(
        drain
            .layer()
            .phase_header(HeaderName::from_static("x-lameduck-phase")),
    );
    // `with_state(())` prepares the routes once instead of per request. The header-read
    // timeout bounds clients that never finish a request head (and idle keep-alive
    // connections): 75 s, above the 60 s for which proxies commonly pool idle connections.
    // The connection bound defaults to the descriptor limit less a reserve, which keeps
    // descriptors for the admin port above whatever arrives here.
    let server = tokio::spawn(
        lameduck::serve(listener, app.with_state(()), &drain)
            .header_read_timeout(lameduck::server::SUGGESTED_HEADER_READ_TIMEOUT),
    );
    let report = drain.run().await;
    let _ = tokio::time::timeout(Duration::from_secs(1), server).await;
    report.exit_code
}

/// No lameduck at all: serve until SIGTERM, then exit at once (what many services do).
async fn naive(args: Args) -> i32 {
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .expect("listen");
    let admin = tokio::net::TcpListener::bind(args.admin)
        .await
        .expect("admin");
    ready(&listener, &admin);
    let probes = Router::new()
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }));
    tokio::spawn(async move {
        let _ = axum::serve(admin, probes).await;
    });
    tokio::spawn(async move {
        let _ = axum::serve(listener, app(&args.instance)).await;
    });
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("signal handler");
    term.recv().await;
    0
}

/// No lameduck: on SIGTERM answer 503 on `/readyz`, keep serving unchanged for `sleep`, then
/// stop with axum's `with_graceful_shutdown` (idle connections closed, in-flight ones finished).
async fn fixed_sleep(args: Args, sleep: Duration) -> i32 {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .expect("listen");
    let admin = tokio::net::TcpListener::bind(args.admin)
        .await
        .expect("admin");
    ready(&listener, &admin);
    let stopping = Arc::new(AtomicBool::new(false));
    let flag = stopping.clone();
    let probes = Router::new().route("/livez", get(|| async { "ok" })).route(
        "/readyz",
        get(move || {
            let stopping = flag.load(Ordering::SeqCst);
            async move {
                if stopping {
                    (axum::http::StatusCode::SERVICE_UNAVAILABLE, "stopping")
                } else {
                    (axum::http::StatusCode::OK, "ok")
                }
            }
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(admin, probes).await;
    });
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(listener, app(&args.instance))
            .with_graceful_shutdown(async move {
                let _ = stop_rx.await;
            })
            .await
    });
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("signal handler");
    term.recv().await;
    stopping.store(true, Ordering::SeqCst);
    tokio::time::sleep(sleep).await;
    let _ = stop_tx.send(());
    match server.await {
        Ok(Ok(())) => 0,
        _ => 1,
    }
}

/// The READY line the tests and scripts wait for.
fn ready(listener: &tokio::net::TcpListener, admin: &tokio::net::TcpListener) {
    let addr = |l: &tokio::net::TcpListener| {
        l.local_addr()
            .map_or_else(|e| format!("? ({e})"), |a| a.to_string())
    };
    say(&format!(
        "READY listen={} admin={}",
        addr(listener),
        addr(admin)
    ));
}

/// A line on stdout. A closed stdout (the log pipe went away) is not a reason to stop
/// serving: `println!` would panic there, this ignores it.
fn say(line: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

enum LogLine {
    Line(String),
    Flush(std::sync::mpsc::Sender<()>),
}

/// Lines for stderr, written by a thread of their own on its own descriptor (not through
/// `std::io::stderr`'s lock, which the drain report also takes): a log reader that stalls
/// blocks that thread only, and one that went away (EPIPE) costs the line, not the process —
/// `eprintln!` would block the service before READY, or panic.
fn log_sender() -> Option<&'static std::sync::mpsc::SyncSender<LogLine>> {
    static LOG: std::sync::OnceLock<Option<std::sync::mpsc::SyncSender<LogLine>>> =
        std::sync::OnceLock::new();
    LOG.get_or_init(|| {
        use std::os::fd::AsFd;
        let fd = std::io::stderr().as_fd().try_clone_to_owned().ok()?;
        let mut err = std::fs::File::from(fd);
        // Bounded: a stalled reader makes later lines drop, never pile up.
        let (tx, rx) = std::sync::mpsc::sync_channel::<LogLine>(256);
        std::thread::Builder::new()
            .name("stderr-log".to_owned())
            .spawn(move || {
                use std::io::Write as _;
                for m in rx {
                    match m {
                        LogLine::Line(l) => {
                            let _ = writeln!(err, "{l}");
                        }
                        LogLine::Flush(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            })
            .ok()?;
        Some(tx)
    })
    .as_ref()
}

/// A line on stderr, if its reader keeps up; never blocks, never panics.
fn complain(line: impl Into<String>) {
    if let Some(log) = log_sender() {
        let _ = log.try_send(LogLine::Line(line.into()));
    }
}

/// Before exiting: waits (at most half a second) for the lines sent so far to be written.
fn flush_log() {
    let Some(log) = log_sender() else { return };
    let (done, written) = std::sync::mpsc::channel();
    if log.try_send(LogLine::Flush(done)).is_ok() {
        let _ = written.recv_timeout(Duration::from_millis(500));
    }
}
