//! Run with `cargo run --example service -- --listen 127.0.0.1:8080 --admin 127.0.0.1:9901`.
//!
//! The production-style setup a service author copies: an axum app behind `drain.layer()`,
//! served by `lameduck::serve`, a separate admin listener for probes and the `preStop` hook, a
//! startup gate, a must-finish task, a resource closer, and the report. `main` returns the
//! report's exit code (so destructors run).
//!
//! ```text
//! service [--listen ADDR] [--admin ADDR] [--instance NAME] [--grace-period DUR]
//!         [--quiet DUR] [--min DUR] [--max DUR] [--quiet-suffices-after DUR]
//!         [--per-request-peers ADDR|CIDR,…] [--node-agents HOST:PORT,…]
//!         [--report-file PATH]
//!         [--stuck-task] [--startup-delay DUR]
//!         [--readiness-policy auto|not-ready|serving-until-stop]
//! service prestop [--admin ADDR]      # the preStop exec hook, for images without curl
//! ```
//!
//! Routes on `--listen`: `GET /` → `ok`; `GET /slow?ms=N` → `ok` after N ms;
//! `GET /stream?ms=N` → a chunked body streaming for N ms. Every response carries `x-instance`
//! and echoes `x-request-id`. The shutdowns lameduck is compared against (exit at once, a fixed
//! sleep) are `examples/baseline.rs`, with the same routes.
//!
//! On stdout it prints one line once both listeners are bound:
//! `READY listen=127.0.0.1:8080 admin=127.0.0.1:9901`.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use axum::http::HeaderName;
use lameduck::{parse_duration, Drain, Propagation};

#[path = "common/app.rs"]
mod app;
use app::app;
use lameduck::AdminBuilder;

struct Args {
    listen: SocketAddr,
    admin: SocketAddr,
    instance: String,
    grace_period: Option<Duration>,
    quiet: Option<Duration>,
    min: Option<Duration>,
    max: Option<Duration>,
    quiet_suffices_after: Option<Duration>,
    per_request_peers: Option<String>,
    node_agents: Option<String>,
    report_file: Option<String>,
    stuck_task: bool,
    startup_delay: Duration,
    readiness_policy: Option<lameduck::ReadinessWhileDraining>,
    shortest_grace: Option<Duration>,
    node_shutdown_grace: Option<Duration>,
    eviction_grace: Option<Duration>,
}

const USAGE: &str = "usage: service [--listen ADDR] [--admin ADDR] [--instance NAME] \
                     [--grace-period DUR] [--quiet DUR] [--min DUR] [--max DUR] \
                     [--quiet-suffices-after DUR] [--per-request-peers ADDR|CIDR,…] \
                     [--node-agents HOST:PORT,…] \
                     [--report-file PATH] [--stuck-task] \
                     [--startup-delay DUR] [--readiness-policy auto|not-ready|serving-until-stop] \
                     [--shortest-grace DUR] [--node-shutdown-grace DUR] [--eviction-grace DUR]\n       \
                     service prestop [--admin ADDR]";

fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        listen: ([127, 0, 0, 1], 8080).into(),
        admin: ([127, 0, 0, 1], 9901).into(),
        instance: "service".to_owned(),
        grace_period: None,
        quiet: None,
        min: None,
        max: None,
        quiet_suffices_after: None,
        per_request_peers: None,
        node_agents: None,
        report_file: None,
        stuck_task: false,
        startup_delay: Duration::ZERO,
        readiness_policy: None,
        shortest_grace: None,
        node_shutdown_grace: None,
        eviction_grace: None,
    };
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let dur = |v: String| parse_duration(&v).map_err(|e| format!("{flag}: {e}"));
        let addr = |v: String| {
            v.parse::<SocketAddr>()
                .map_err(|e| format!("{flag} {v:?}: {e}"))
        };
        match flag.as_str() {
            "--listen" => a.listen = addr(value()?)?,
            "--admin" => a.admin = addr(value()?)?,
            "--instance" => a.instance = value()?,
            "--grace-period" => a.grace_period = Some(dur(value()?)?),
            "--quiet" => a.quiet = Some(dur(value()?)?),
            "--min" => a.min = Some(dur(value()?)?),
            "--max" => a.max = Some(dur(value()?)?),
            "--quiet-suffices-after" => a.quiet_suffices_after = Some(dur(value()?)?),
            // The old name read like a floor; it never was one (`--min` is).
            "--assume-converged-after" => {
                complain(
                    "service: --assume-converged-after is now --quiet-suffices-after (a fallback, \
                     not a floor; the floor is --min)",
                );
                a.quiet_suffices_after = Some(dur(value()?)?);
            }
            "--per-request-peers" => a.per_request_peers = Some(value()?),
            "--node-agents" => a.node_agents = Some(value()?),
            "--report-file" => a.report_file = Some(value()?),
            "--stuck-task" => a.stuck_task = true,
            "--startup-delay" => a.startup_delay = dur(value()?)?,
            // Else `LAMEDUCK_SHORTEST_GRACE`, which the builder reads.
            "--shortest-grace" => a.shortest_grace = Some(dur(value()?)?),
            // The budgets of the kubelet's own terminations, read by the EndpointWatch.
            "--node-shutdown-grace" | "--eviction-grace" if !cfg!(feature = "kube") => {
                return Err(format!(
                    "{flag} needs the `kube` feature (the watch that sees the kubelet's \
                     terminations); without it, use --shortest-grace"
                ))
            }
            "--node-shutdown-grace" => a.node_shutdown_grace = Some(dur(value()?)?),
            "--eviction-grace" => a.eviction_grace = Some(dur(value()?)?),
            "--readiness-policy" => {
                a.readiness_policy = Some(
                    value()?
                        .parse()
                        .map_err(|e| format!("--readiness-policy: {e}"))?,
                )
            }
            "--naive" | "--fixed-sleep" => {
                return Err(format!(
                    "{flag} is a baseline without lameduck: run examples/baseline"
                ))
            }
            "-h" | "--help" => return Err("help".to_owned()),
            other => return Err(format!("unknown flag {other:?}")),
        }
    }
    Ok(a)
}

fn main() -> ExitCode {
    let mut argv = std::env::args().skip(1).peekable();
    let prestop = argv.peek().map(String::as_str) == Some("prestop");
    if prestop {
        argv.next();
    }
    let args = match parse_args(argv) {
        Ok(a) => a,
        Err(e) => {
            complain(format!("service: {e}"));
            complain(USAGE);
            flush_log();
            return ExitCode::from(2);
        }
    };
    let code = if prestop {
        // The preStop exec hook: ask our own admin port to drain, exit 0/1.
        match lameduck::prestop_blocking(args.admin, lameduck::PrestopOptions::from_env()) {
            Ok(status) => {
                say(&format!("drained: phase {}", status.phase));
                ExitCode::SUCCESS
            }
            Err(e) => {
                complain(format!("prestop: {e}"));
                ExitCode::FAILURE
            }
        }
    } else {
        match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
        {
            Ok(rt) => {
                let code = rt.block_on(run(args));
                // Bounded: a blocking task stuck in the kernel must not hold the exit.
                rt.shutdown_timeout(Duration::from_secs(1));
                code
            }
            Err(e) => {
                complain(format!("service: cannot start the runtime: {e}"));
                ExitCode::from(2)
            }
        }
    };
    flush_log();
    code
}

async fn run(args: Args) -> ExitCode {
    let mut builder = Drain::builder();
    if let Some(g) = args.grace_period {
        builder = builder.grace_period(g);
    }
    if let Some(g) = args.shortest_grace {
        builder = builder.shortest_grace(g);
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
    // Else `LAMEDUCK_PER_REQUEST_PEERS`, which the builder reads; a bad item fails the build.
    if let Some(peers) = &args.per_request_peers {
        p = p.per_request_peers(peers.split(','));
    }
    // Else `LAMEDUCK_NODE_AGENTS`.
    if let Some(agents) = &args.node_agents {
        p = p.node_agents(agents.split(','));
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
            return ExitCode::from(2);
        }
    };

    // With the `kube` feature, in a Pod: the EndpointSlice is the authoritative propagation
    // step and the deletion's grace the real budget (examples/k8s/role.yaml grants the reads).
    // Outside a Pod (POD_NAME unset) the report says why it was not used.
    #[cfg(feature = "kube")]
    {
        let mut watch = lameduck::EndpointWatch::from_env();
        if let Some(g) = args.node_shutdown_grace {
            watch = watch.node_shutdown_grace(g);
        }
        if let Some(g) = args.eviction_grace {
            watch = watch.eviction_grace(g);
        }
        if let Err(e) = watch.start(&drain) {
            complain(format!("service: no EndpointSlice evidence: {e}"));
        }
    }
    #[cfg(not(feature = "kube"))]
    let _ = (args.node_shutdown_grace, args.eviction_grace);

    // Startup gate: not ready until the warm-up is done.
    let warmup = drain.readiness().startup_gate("warmup");
    let delay = args.startup_delay;
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        warmup.open();
    });

    // A buffer that must be flushed before exit: counted until it returns (the sleep stands
    // for the write).
    let stop = drain.moments().stopped_accepting();
    drain.work().spawn("flush-buffer", async move {
        stop.cancelled().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    });
    if args.stuck_task {
        drain
            .work()
            .spawn("stuck-task", std::future::pending::<()>());
    }
    // Closed after the requests and tasks that use it (the sleep stands for the pool's close).
    drain.work().on_close_with(
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
            return ExitCode::from(2);
        }
    };
    let admin = match tokio::net::TcpListener::bind(args.admin).await {
        Ok(l) => l,
        Err(e) => {
            complain(format!(
                "service: cannot listen on {} (admin): {e}",
                args.admin
            ));
            return ExitCode::from(2);
        }
    };
    // Before READY: a SIGTERM right after it must drain, not kill (`run` would install them
    // only later).
    drain.install_signals();
    ready(&listener, &admin);
    // The admin listener is not behind the drain layer and lives until the process exits;
    // `run` returns only once every `/drain` caller has its answer.
    tokio::spawn(AdminBuilder::new(&drain).serve(admin));
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
    ExitCode::from(&report)
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
