//! Run with `cargo run --release --example demo`.
//!
//! The whole story in one process, with no external software: two instances of the example
//! service behind a small round-robin TCP balancer that — like kube-proxy or a cloud load
//! balancer — learns about `/readyz` only after a delay; a load of short, slow and streaming
//! requests with request ids over keep-alive and fresh connections; one instance drained through
//! its `/drain` endpoint (what a `preStop` hook does). Then the same run again with a naive
//! shutdown (stop at once on the signal, no drain) for comparison. The settings it changes
//! from the defaults, and why, are printed first (`SETTINGS`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::http::HeaderName;
use axum::routing::get;
use axum::Router;
use lameduck::AdminBuilder;
use lameduck::{Drain, DrainReport, Propagation, Signals};
use lameduck_probe::correlate::{correlate, ExternalEvent, ReportView};
use lameduck_probe::{ConnectionMode, Probe, ProbeConfig, ProbeResult};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

#[path = "common/app.rs"]
mod app;

/// How long the balancer takes to act on what its health checks saw (endpoint propagation).
const NOTICE_DELAY: Duration = Duration::from_millis(1000);
const HEALTH_INTERVAL: Duration = Duration::from_millis(250);
/// When the first instance is taken out.
const DRAIN_AT: Duration = Duration::from_millis(2500);
const LOAD_FOR: Duration = Duration::from_secs(9);

// The settings the demo changes from lameduck's defaults; `SETTINGS` says why, on screen.
const GRACE: Duration = Duration::from_secs(12);
const MIN: Duration = Duration::from_millis(1500);
const QUIET_SUFFICES_AFTER: Duration = Duration::from_millis(1500);
const SETTINGS: &str = "\
settings changed from lameduck's defaults, and why:
  grace_period 12 s           default 30 s; the propagation max follows it (half): 6 s, not 15 s
  min 1.5 s                   default 1 s: this balancer drops a backend up to 1.5 s after its
                              /readyz turns 503 (two failed checks 250 ms apart, acted on 1 s late)
  quiet_suffices_after 1.5 s  default none: the instances serve only 2.5 s before the drain,
                              under the 15 s of traffic the evidence needs (too_few_slots), so
                              the default would wait to max; the balancer's delay is known, so
                              the quiet window suffices after it. A Pod that served past 15 s
                              needs neither: its own traffic says when the proxies moved on.
";

struct Backend {
    name: &'static str,
    addr: SocketAddr,
    admin: SocketAddr,
    drain: Option<Drain>,
    tasks: Vec<JoinHandle<()>>,
}

async fn start_backend(name: &'static str, naive: bool) -> Backend {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (addr, admin_addr) = (listener.local_addr().unwrap(), admin.local_addr().unwrap());
    let mut tasks = Vec::new();
    if naive {
        // No readiness awareness, no drain: `/readyz` is "the port answers".
        let probes = Router::new()
            .route("/livez", get(|| async { "ok" }))
            .route("/readyz", get(|| async { "ok" }));
        tasks.push(tokio::spawn(async move {
            let _ = axum::serve(admin, probes).await;
        }));
        tasks.push(tokio::spawn(async move {
            let _ = axum::serve(listener, app::app(name)).await;
        }));
        return Backend {
            name,
            addr,
            admin: admin_addr,
            drain: None,
            tasks,
        };
    }
    let drain = Drain::builder()
        .grace_period(GRACE)
        .propagation(
            Propagation::default()
                .min(MIN)
                .quiet_suffices_after(QUIET_SUFFICES_AFTER),
        )
        .signals(Signals::none())
        .report_to_stderr(false)
        .termination_log(None)
        .build()
        .expect("valid settings");
    let admin_server = AdminBuilder::new(&drain).serve(admin);
    tasks.push(tokio::spawn(async move {
        let _ = admin_server.await;
    }));
    let app = app::app(name).layer(
        drain
            .layer()
            .phase_header(HeaderName::from_static("x-lameduck-phase")),
    );
    let serve = lameduck::serve(listener, app, &drain);
    tasks.push(tokio::spawn(async move {
        let _ = serve.await;
    }));
    Backend {
        name,
        addr,
        admin: admin_addr,
        drain: Some(drain),
        tasks,
    }
}

impl Backend {
    /// The process exits: everything it runs stops at once.
    fn exit(&self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// What happened to the instances on the wall clock, for `correlate`: deletion, signal and exit
/// as the demo caused them, and the balancer's own changes of mind.
type Events = Arc<Mutex<Vec<ExternalEvent>>>;

fn note(events: &Events, instance: &str, event: &str) {
    let unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0);
    events.lock().unwrap().push(ExternalEvent {
        unix_ms,
        instance: instance.to_owned(),
        event: event.to_owned(),
    });
}

/// A round-robin TCP balancer whose view of each backend's readiness lags by `NOTICE_DELAY`.
struct Balancer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

async fn start_balancer(
    backends: Vec<(&'static str, SocketAddr, SocketAddr)>,
    events: Events,
) -> Balancer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let healthy: Arc<Vec<AtomicBool>> =
        Arc::new(backends.iter().map(|_| AtomicBool::new(true)).collect());
    for (i, (name, _, admin)) in backends.iter().copied().enumerate() {
        let (healthy, stop, events) = (healthy.clone(), stop.clone(), events.clone());
        tokio::spawn(async move {
            let mut fails = 0;
            while !stop.load(Ordering::Relaxed) {
                let ok = check(admin).await;
                fails = if ok { 0 } else { fails + 1 };
                let up = fails < 2; // `fall 2`
                let (healthy, events) = (healthy.clone(), events.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(NOTICE_DELAY).await;
                    if healthy[i].swap(up, Ordering::Relaxed) && !up {
                        note(&events, name, "proxy_updated (balancer: down)");
                    }
                });
                tokio::time::sleep(HEALTH_INTERVAL).await;
            }
        });
    }
    let next = Arc::new(AtomicUsize::new(0));
    let stop2 = stop.clone();
    tokio::spawn(async move {
        while !stop2.load(Ordering::Relaxed) {
            let Ok((client, _)) = listener.accept().await else {
                continue;
            };
            let n = backends.len();
            let start = next.fetch_add(1, Ordering::Relaxed);
            let pick = (0..n)
                .map(|k| (start + k) % n)
                .find(|&i| healthy[i].load(Ordering::Relaxed));
            let Some(i) = pick else { continue }; // nothing healthy: the client's connection drops
            let backend = backends[i].1;
            tokio::spawn(async move {
                // A refused backend connection drops the client's: what an L4 balancer does.
                if let Ok(mut server) = TcpStream::connect(backend).await {
                    let mut client = client;
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    Balancer { addr, stop }
}

/// One health check: `GET /readyz` must answer 200.
async fn check(admin: SocketAddr) -> bool {
    let attempt = async {
        let mut s = TcpStream::connect(admin).await.ok()?;
        s.write_all(b"GET /readyz HTTP/1.0\r\nHost: health\r\n\r\n")
            .await
            .ok()?;
        let mut buf = [0u8; 12];
        s.read_exact(&mut buf).await.ok()?;
        Some(buf.starts_with(b"HTTP/1.0 200") || buf.starts_with(b"HTTP/1.1 200"))
    };
    matches!(
        tokio::time::timeout(Duration::from_millis(500), attempt).await,
        Ok(Some(true))
    )
}

struct Run {
    result: ProbeResult,
    report: Option<DrainReport>,
    events: Vec<ExternalEvent>,
}

async fn scenario(naive: bool) -> Run {
    let label = if naive { "naive" } else { "lameduck" };
    let a = start_backend("instance-a", naive).await;
    let b = start_backend("instance-b", naive).await;
    let events: Events = Arc::default();
    let balancer = start_balancer(
        vec![(a.name, a.addr, a.admin), (b.name, b.addr, b.admin)],
        events.clone(),
    )
    .await;

    let mut config = ProbeConfig::new(balancer.addr.to_string());
    config.label = label.to_owned();
    config.connections = ConnectionMode::Mixed;
    config.short_rate = 120.0;
    config.slow_rate = 8.0;
    config.slow = Duration::from_millis(1500);
    config.stream_rate = 1.0;
    config.stream = Duration::from_secs(2);
    config.duration = LOAD_FOR;
    config.drain_wait = Duration::from_secs(8);
    let probe = Probe::new(config).expect("valid probe settings");
    let handle = probe.handle();
    let load = tokio::spawn(probe.run());

    let started = Instant::now();
    let mut drained: Option<JoinHandle<()>> = None;
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    ticker.tick().await;
    let mut drain_sent = false;
    while !load.is_finished() {
        tokio::select! {
            _ = ticker.tick() => {
                println!("  [{label}] {}", handle.progress().line());
            }
            () = tokio::time::sleep(DRAIN_AT.saturating_sub(started.elapsed())), if !drain_sent => {
                drain_sent = true;
                note(&events, a.name, "deleted");
                if naive {
                    println!("  [{label}] {:>4.1}s SIGTERM to {}: it exits at once", started.elapsed().as_secs_f64(), a.name);
                    note(&events, a.name, "signal TERM");
                    a.exit();
                    note(&events, a.name, "exit");
                } else {
                    println!("  [{label}] {:>4.1}s preStop: GET {}/drain on {}", started.elapsed().as_secs_f64(), a.admin, a.name);
                    let admin = a.admin;
                    drained = Some(tokio::spawn(async move {
                        let opts = lameduck::PrestopOptions::default(); // wait=drained
                        match lameduck::prestop(admin, opts).await {
                            Ok(_) => println!("  [lameduck] /drain answered: drained; kubelet now sends SIGTERM and the process exits"),
                            Err(e) => println!("  [lameduck] /drain failed: {e}"),
                        }
                    }));
                }
            }
        }
    }
    let result = load.await.expect("probe task").expect("probe run");
    if let Some(d) = drained {
        let _ = d.await;
    }
    let report = a.drain.as_ref().and_then(Drain::report);
    balancer.stop.store(true, Ordering::Relaxed);
    a.exit();
    b.exit();
    let events = events.lock().unwrap().clone();
    Run {
        result,
        report,
        events,
    }
}

fn table(title: &str, run: &Run) {
    let s = &run.result.summary;
    println!("\n{title}");
    println!("  {:<34}{:>8}", "requests sent", s.all.total);
    println!("  {:<34}{:>8}", "succeeded", s.all.succeeded);
    println!("  {:<34}{:>8}", "failed", s.all.failed);
    println!("  {:<34}{:>8}", "unfinished", s.all.unfinished);
    println!(
        "  {:<34}{:>8}",
        "served while draining, reused conn", s.draining_reused
    );
    println!(
        "  {:<34}{:>8}",
        "served while draining, new conn", s.draining_new
    );
    for (kind, c) in [
        ("short", &s.short),
        ("slow", &s.slow),
        ("stream", &s.stream),
    ] {
        println!(
            "  {:<34}{:>8}",
            format!("{kind}: ok / failed / unfinished"),
            format!("{}/{}/{}", c.succeeded, c.failed, c.unfinished)
        );
    }
    if let Some(f) = run
        .result
        .records
        .iter()
        .find(|r| r.outcome == lameduck_probe::Outcome::Failed)
    {
        println!(
            "  first failure: {} {} at {:.0} ms: {}",
            f.kind,
            f.id,
            f.start_ms,
            f.error.as_deref().unwrap_or("?")
        );
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> std::process::ExitCode {
    println!(
        "lameduck demo: 2 instances behind a balancer that notices /readyz {} ms late;",
        NOTICE_DELAY.as_millis()
    );
    println!(
        "instance-a is taken out {:.1} s into a {} s load.\n",
        DRAIN_AT.as_secs_f64(),
        LOAD_FOR.as_secs()
    );
    println!("{SETTINGS}");
    println!("run 1: lameduck (preStop /drain → quiet window → stop accepting → zero → close)");
    let good = scenario(false).await;
    println!("\nrun 2: naive shutdown (exit at once on the signal, no drain)");
    let naive = scenario(true).await;

    if let Some(report) = &good.report {
        println!("\n(a) timeline of instance-a's drain (lameduck)\n");
        for line in report.summary().lines() {
            println!("  {line}");
        }
        // The report whose summary this is, for `tests/demo.rs` to check every figure against.
        let dir = std::path::Path::new("target").join("demo");
        if std::fs::create_dir_all(&dir).is_ok() {
            let _ = std::fs::write(dir.join("report-lameduck.json"), report.to_json());
        }
    }
    table("(b) client's view, lameduck", &good);
    table("(c) client's view, naive shutdown", &naive);
    let ok = good.result.summary.all.failed == 0 && good.result.summary.all.unfinished == 0;
    println!(
        "\nlameduck: {} failed, {} unfinished; naive: {} failed, {} unfinished.",
        good.result.summary.all.failed,
        good.result.summary.all.unfinished,
        naive.result.summary.all.failed,
        naive.result.summary.all.unfinished
    );
    diagnose("(d) correlate's diagnosis, lameduck", "lameduck", &good);
    diagnose("(e) correlate's diagnosis, naive shutdown", "naive", &naive);
    if ok {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}

/// `lameduck-probe correlate` over one run: the diagnosis rows of the instance taken out, each
/// failure classified, and the picture written next to the build.
fn diagnose(title: &str, label: &str, run: &Run) {
    let reports: Vec<ReportView> = run
        .report
        .iter()
        .filter_map(|r| {
            let json = serde_json::to_string(r).ok()?;
            ReportView::parse(&json, Some("instance-a"), "drain report").ok()
        })
        .collect();
    let c = correlate(&run.result.records, &reports, &run.events);
    println!("\n{title}\n");
    let table = c.table();
    // instance-a's rows and the failures; instance-b was never taken out.
    let (mut show, mut failures_shown) = (true, None::<usize>);
    for line in table.lines() {
        if line.starts_with("instance-b") {
            show = false;
        } else if !line.starts_with(' ') && !line.is_empty() {
            show = true;
        }
        if line.starts_with("failures:") {
            failures_shown = Some(0);
        } else if let Some(n) = failures_shown.as_mut() {
            // The first few failures tell the story; the count is on the line above.
            *n += 1;
            if *n == 6 {
                println!("  {:>13}", "…");
            }
            if *n > 5 {
                continue;
            }
        }
        if show {
            println!("  {line}");
        }
    }
    let dir = std::path::Path::new("target").join("demo");
    let path = dir.join(format!("rollout-{label}.svg"));
    if std::fs::create_dir_all(&dir).is_ok()
        && std::fs::write(&path, c.svg(&run.result.records)).is_ok()
    {
        println!("  picture: {}", path.display());
    }
}
