//! End to end through real proxies: HAProxy with active health checks and nginx as a pooling
//! proxy in front of real service processes, real signals, and the rollout probe as the client.
//! Neither proxy retries or redispatches a request (HAProxy `retries 0`, nginx
//! `proxy_next_upstream off`), so a request the server refused or cut reaches the client as a
//! failure: the verdict is the server's, not the proxy's.
//!
//! Needs `haproxy` and `nginx` (`apt-get install -y haproxy nginx-light`); without them these
//! tests say so loudly and pass, unless `LAMEDUCK_E2E=require` (set by `.ci/run`).

mod hooks;
mod procs;
mod routers;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lameduck::report::{EvidenceKind, Outcome, WeakEvidence};
use lameduck::EventKind;
use lameduck_probe::correlate::{correlate, ReportView};
use lameduck_probe::{ConnectionMode, Probe, ProbeConfig, ProbeResult};
use procs::{free_port, haproxy, nginx, nginx_reload, require, scratch, wait_haproxy, Instance};

/// Service flags for the proxied runs. Each instance serves only a few seconds before it is
/// drained — too short to measure an arrival rate — so the drain is told what these proxies
/// are known to need: HAProxy notices `/readyz` within ~0.6 s (`inter 300ms fall 2`), nginx
/// reloads 1 s after the drain starts. Without that fallback it would wait to `max`.
const SERVICE_FLAGS: &[&str] = &[
    "--grace-period",
    "12s",
    "--quiet",
    "1s",
    "--min",
    "1500ms",
    "--max",
    "6s",
    "--quiet-suffices-after",
    "2s",
];

fn probe_config(frontend: u16, label: &str, duration: Duration) -> ProbeConfig {
    let mut c = ProbeConfig::new(format!("127.0.0.1:{frontend}"));
    c.label = label.to_owned();
    c.connections = ConnectionMode::Mixed;
    c.short_rate = 40.0;
    c.slow_rate = 6.0;
    c.slow = Duration::from_millis(1200);
    c.stream_rate = 1.0;
    c.stream = Duration::from_millis(2500);
    c.duration = duration;
    c.drain_wait = Duration::from_secs(10);
    c
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Starts the probe on its own runtime thread; join it for the result.
fn start_probe(config: ProbeConfig) -> std::thread::JoinHandle<ProbeResult> {
    std::thread::spawn(move || {
        runtime().block_on(async move {
            Probe::new(config)
                .expect("valid probe config")
                .run()
                .await
                .expect("probe run")
        })
    })
}

/// `GET /drain` on the instance's admin port, as the `preStop` hook does.
fn prestop(inst: &Instance) {
    // kubelet runs the hook at the Pod's deletion.
    inst.note("deleted");
    let status = lameduck::prestop_blocking(inst.admin, lameduck::PrestopOptions::default())
        .unwrap_or_else(|e| panic!("preStop /drain on {}: {e}", inst.name));
    assert_eq!(status.phase, lameduck::Phase::Done);
}

/// Lines the probe's records up with the drained instances' reports and with what the test did
/// to the processes (`lameduck-probe correlate`'s diagnosis), writes it to
/// `<run>/diagnosis.txt` and the picture to `<run>/rollout.svg`, and checks each report's
/// after-drain counters against what the probe saw.
fn diagnose(dir: &Path, result: &ProbeResult, drained: &[(Instance, i32)]) {
    diagnose_but(dir, result, drained, &[]);
}

/// As [`diagnose`], where the requests `set_aside` (ids) failed for the proxy's own reload:
/// correlate may list those, and only those.
fn diagnose_but(
    dir: &Path,
    result: &ProbeResult,
    drained: &[(Instance, i32)],
    set_aside: &[String],
) {
    let mut views = Vec::new();
    let mut events = Vec::new();
    for (inst, _) in drained {
        let raw = std::fs::read_to_string(&inst.report_file).expect("report file");
        let source = inst.report_file.display().to_string();
        views.push(
            ReportView::parse(&raw, Some(&inst.name), &source)
                .expect("the report parses as correlate reads it"),
        );
        events.extend(inst.events.lock().unwrap().iter().cloned());
    }
    let diagnosis = correlate(&result.records, &views, &events);
    let table = diagnosis.table();
    std::fs::write(dir.join("diagnosis.txt"), &table).unwrap();
    std::fs::write(dir.join("rollout.svg"), diagnosis.svg(&result.records)).unwrap();
    eprintln!("{table}");
    for f in &diagnosis.failures {
        eprintln!("correlate: {} {:?}: {}", f.id, f.class, f.why);
    }
    assert!(
        diagnosis.failures.iter().all(|f| set_aside.contains(&f.id)),
        "correlate found failures the summary did not: {:?}",
        diagnosis.failures
    );
    for (inst, _) in drained {
        let report = inst.report();
        let draining = result
            .records
            .iter()
            .filter(|r| r.instance.as_deref() == Some(&inst.name) && r.served_by_draining())
            .count() as u64;
        let row = diagnosis
            .instances
            .iter()
            .find(|d| d.instance == inst.name)
            .expect("the drained instance is in the diagnosis");
        assert_eq!(row.draining, draining, "correlate vs the probe's records");
        // The report counts requests that *arrived* after the drain started; the probe marks
        // every answer that *left* a draining instance (slow requests from before the trigger
        // too). The probe is the only client (health checks use the admin port), so: every
        // request sent after the drain started was counted by the report, and every request
        // the report counted left with the phase header.
        let after = report.after_flip.requests_on_new_connections
            + report.after_flip.requests_on_reused_connections;
        let started = report
            .event(EventKind::DrainStarted)
            .expect("drain_started")
            .unix_ms as f64;
        let sent_after = result
            .records
            .iter()
            .filter(|r| {
                r.instance.as_deref() == Some(&inst.name)
                    && r.served_by_draining()
                    && r.start_unix_ms.is_some_and(|t| t >= started + 1.0)
            })
            .count() as u64;
        assert!(
            sent_after <= after && after <= draining,
            "{}: probe vs report after-drain counts: {sent_after} sent after the drain started \
             ≤ {after} counted by the report ≤ {draining} answered while draining",
            inst.name
        );
    }
}

/// Prints each drain's time, deletion (the `preStop` call) → exit, with the rule its report
/// says committed propagation, then the median: the rollout's speed beside its 0 lost.
fn print_drain_times(proxy: &str, drained: &[(Instance, i32)]) -> f64 {
    let mut times = Vec::new();
    for (inst, _) in drained {
        let events = inst.events.lock().unwrap().clone();
        let at = |what: &str| {
            events
                .iter()
                .find(|e| e.event.starts_with(what))
                .map(|e| e.unix_ms)
        };
        let (Some(deleted), Some(exit)) = (at("deleted"), at("exit")) else {
            panic!("{}: no deletion or exit noted: {events:?}", inst.name);
        };
        let drain_ms = exit - deleted;
        times.push(drain_ms);
        let report = inst.report();
        let rule = report
            .event(EventKind::PropagationDone)
            .and_then(|e| e.detail.clone())
            .unwrap_or_else(|| "no propagation_done".to_owned());
        eprintln!(
            "drain {proxy} {}: {:.1} s deletion → exit; {rule}",
            inst.name,
            drain_ms / 1000.0
        );
    }
    times.sort_by(f64::total_cmp);
    let median = match times.len() {
        0 => 0.0,
        n if n % 2 == 1 => times[n / 2],
        n => (times[n / 2 - 1] + times[n / 2]) / 2.0,
    };
    eprintln!(
        "drain {proxy}: median {:.1} s over {} drains",
        median / 1000.0,
        times.len()
    );
    median
}

fn assert_clean(result: &ProbeResult) {
    assert_clean_but(result, 0);
}

/// As [`assert_clean`], with `set_aside` failures that the proxy's own reload explains (each
/// printed by whoever set it aside; see `routers::caddy_reload_drops`).
fn assert_clean_but(result: &ProbeResult, set_aside: u64) {
    let s = &result.summary;
    eprintln!("{}", s.table());
    assert!(
        s.all.total > 100,
        "the probe sent too little: {}",
        s.all.total
    );
    assert_eq!(
        (s.all.failed, s.all.unfinished),
        (set_aside, 0),
        "lost requests ({set_aside} set aside as the proxy's reload)"
    );
    assert!(s.slow.succeeded > 0 && s.stream.succeeded > 0);
}

/// Two live instances on three HAProxy slots (one free for a replacement, maxSurge 1), all
/// marked UP by HAProxy's health checks.
struct Fleet {
    dir: PathBuf,
    slots: Vec<(u16, u16)>,
    frontend: u16,
    flags: &'static [&'static str],
    /// (slot, instance), oldest first.
    live: Vec<(usize, Instance)>,
    _proxy: procs::Proxy,
}

impl Fleet {
    fn start(run: &str, prefix: &str, flags: &'static [&'static str]) -> Fleet {
        let dir = scratch(run);
        let slots: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
        let frontend = free_port();
        let live: Vec<(usize, Instance)> = (0..2)
            .map(|i| {
                let name = format!("{prefix}0-s{i}");
                (
                    i,
                    Instance::start(&name, slots[i].0, slots[i].1, &dir, flags),
                )
            })
            .collect();
        let proxy = haproxy(&dir, frontend, &slots);
        for (i, _) in &live {
            wait_haproxy(&dir, *i, "UP");
        }
        // HAProxy starts every server UP; the free slot has nothing listening yet and must be
        // seen DOWN before traffic starts (nothing retries a request sent to it).
        wait_haproxy(&dir, 2, "DOWN");
        Fleet {
            dir,
            slots,
            frontend,
            flags,
            live,
            _proxy: proxy,
        }
    }

    /// One rolling-update step: the replacement comes up on the free slot first; then the
    /// oldest instance is handed to `stop` and leaves the fleet.
    fn roll(&mut self, name: &str, stop: impl FnOnce(&mut Instance) -> i32) -> (Instance, i32) {
        let free = (0..3)
            .find(|s| self.live.iter().all(|(l, _)| l != s))
            .unwrap();
        let (port, admin) = self.slots[free];
        let new = Instance::start(name, port, admin, &self.dir, self.flags);
        wait_haproxy(&self.dir, free, "UP");
        let (slot, mut old) = self.live.remove(0);
        let code = stop(&mut old);
        wait_haproxy(&self.dir, slot, "DOWN");
        self.live.push((free, new));
        (old, code)
    }
}

#[test]
fn haproxy_rolling_update_loses_nothing() {
    if require("haproxy").is_none() {
        return;
    }
    let mut fleet = Fleet::start("haproxy-rolling", "v", SERVICE_FLAGS);
    let probe = start_probe(probe_config(
        fleet.frontend,
        "haproxy",
        Duration::from_secs(20),
    ));
    std::thread::sleep(Duration::from_millis(1500));

    let started = Instant::now();
    let mut drained = Vec::new();
    for round in 1..=3 {
        // The oldest goes as kubelet does it: preStop /drain, then SIGTERM.
        drained.push(fleet.roll(&format!("v{round}"), |old| {
            prestop(old);
            old.signal("-TERM");
            old.wait_exit(Duration::from_secs(15))
        }));
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "rounds take too long"
        );
    }
    let result = probe.join().expect("probe thread");
    print_drain_times("haproxy", &drained);
    assert_clean(&result);
    for (inst, code) in &drained {
        let report = inst.report();
        assert_eq!(*code, 0, "{} exit code", inst.name);
        assert_eq!(report.outcome, Outcome::Clean);
        assert!(report.event(EventKind::InFlightZero).is_some());
    }
    diagnose(&fleet.dir, &result, &drained);
}

/// The service's default propagation policy (ε = 10⁻³, `quiet` 500 ms, `min` 1 s, `max` half
/// the grace period): only the grace period is set. Each instance serves long enough before
/// its drain (≥ 16 s; the estimator reads no window shorter than 15 s) for the estimator to see
/// a window of arrivals.
const DEFAULT_POLICY_FLAGS: &[&str] = &["--grace-period", "30s"];

/// How long each instance serves before it is drained in the default-policy rollout.
const SERVE_BEFORE_DRAIN: Duration = Duration::from_secs(16);

/// The rolling update behind HAProxy with the default policy, no fallback and no floor but
/// `min`. HAProxy keeps pooled upstream connections (`http-reuse always`) and, after the
/// drain's `Connection: close`, comes back on its other idle ones rather than on new
/// connections, so its path looks like a client pool's: kept-alive connections, whose client
/// may connect again whenever its demand needs it. No silence bounds that, so each drain waits
/// to `max` (`kept_connections`) — the reason named in its report. Prints each drain's time
/// and what it committed on; 0 lost.
#[test]
fn haproxy_rolling_update_default_policy_loses_nothing() {
    if require("haproxy").is_none() {
        return;
    }
    let mut fleet = Fleet::start("haproxy-default", "d", DEFAULT_POLICY_FLAGS);
    // Three rounds of 16 s of serving and a drain to `max` (15 s).
    let probe = start_probe(probe_config(
        fleet.frontend,
        "haproxy-default",
        Duration::from_secs(110),
    ));
    let started = Instant::now();
    let mut drained = Vec::new();
    for round in 1..=3 {
        std::thread::sleep(SERVE_BEFORE_DRAIN);
        drained.push(fleet.roll(&format!("d{round}"), |old| {
            prestop(old);
            old.signal("-TERM");
            old.wait_exit(Duration::from_secs(35))
        }));
        assert!(
            started.elapsed() < Duration::from_secs(130),
            "rounds take too long"
        );
    }
    let result = probe.join().expect("probe thread");
    print_drain_times("haproxy (default policy)", &drained);
    assert_clean(&result);
    for (inst, code) in &drained {
        let report = inst.report();
        assert_eq!(*code, 0, "{} exit code", inst.name);
        assert_eq!(report.outcome, Outcome::Clean);
        let ev = report.propagation.evidence.as_ref().expect("evidence");
        // Kept-alive upstream connections: the wait to `max` names them, or HAProxy showed it
        // routes per request (more new connections than a reconnect wave) and the silence
        // decided.
        assert!(
            ev.weak == Some(WeakEvidence::KeptConnections) || ev.kind == EvidenceKind::Confidence,
            "{}: {}",
            inst.name,
            report.to_json()
        );
        if ev.weak == Some(WeakEvidence::KeptConnections) {
            // The way out is named, with the peer to declare.
            assert!(
                report
                    .advice
                    .iter()
                    .any(|a| a.message.contains("per_request_peers([\"127.0.0.1\"])")),
                "{}: {}",
                inst.name,
                report.to_json()
            );
        }
    }
    diagnose(&fleet.dir, &result, &drained);
}

/// How long nginx learns of an endpoint change after the drain started, like an ingress
/// controller that reloads a moment after the EndpointSlice changed.
const NGINX_RELOAD_LAG: Duration = Duration::from_millis(1000);

#[test]
fn nginx_pooling_proxy_rolling_update_loses_nothing() {
    if require("nginx").is_none() {
        return;
    }
    let dir = scratch("nginx-pool");
    let slots: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    let frontend = free_port();
    // (slot, instance), oldest first.
    let mut live: Vec<(usize, Instance)> = (0..2)
        .map(|i| {
            let name = format!("v0-s{i}");
            (
                i,
                Instance::start(&name, slots[i].0, slots[i].1, &dir, SERVICE_FLAGS),
            )
        })
        .collect();
    let upstreams = |live: &[(usize, Instance)]| -> Vec<u16> {
        live.iter().map(|(s, _)| slots[*s].0).collect()
    };
    let proxy = nginx(&dir, frontend, &upstreams(&live));
    let probe = start_probe(probe_config(frontend, "nginx", Duration::from_secs(20)));
    std::thread::sleep(Duration::from_millis(1500));
    let mut drained = Vec::new();
    // A rolling update behind a pooling proxy with no health checks and no retries: the
    // replacement starts on a free slot, the oldest instance is drained (preStop, then SIGTERM)
    // and nginx drops it from its upstreams only `NGINX_RELOAD_LAG` later. Until then nginx
    // keeps sending it requests on pooled and new connections; `Connection: close` and serving
    // through the quiet window are all that protect them.
    for round in 1..=2 {
        let free = (0..3).find(|s| live.iter().all(|(l, _)| l != s)).unwrap();
        let new = Instance::start(
            &format!("v{round}-s{free}"),
            slots[free].0,
            slots[free].1,
            &dir,
            SERVICE_FLAGS,
        );
        let (_, mut old) = live.remove(0);
        live.push((free, new));
        let next = upstreams(&live);
        std::thread::scope(|s| {
            let hook = s.spawn(|| prestop(&old));
            std::thread::sleep(NGINX_RELOAD_LAG);
            nginx_reload(&proxy, &dir, frontend, &next);
            old.note("proxy_updated (nginx reload)");
            hook.join().expect("preStop thread");
        });
        old.signal("-TERM");
        let code = old.wait_exit(Duration::from_secs(15));
        drained.push((old, code));
        std::thread::sleep(Duration::from_millis(1500));
    }
    let result = probe.join().expect("probe thread");
    print_drain_times("nginx", &drained);
    assert_clean(&result);
    for (inst, code) in &drained {
        let report = inst.report();
        assert_eq!(*code, 0, "{} exit code", inst.name);
        assert!(
            report.after_flip.requests_on_new_connections
                + report.after_flip.requests_on_reused_connections
                > 0,
            "{}: nginx sent nothing during the reload lag, so the test proves nothing",
            inst.name
        );
    }
    diagnose(&dir, &result, &drained);
}

#[test]
fn haproxy_with_a_naive_server_loses_requests() {
    if require("haproxy").is_none() {
        return;
    }
    let mut fleet = Fleet::start("haproxy-naive", "naive", &["--naive"]);
    let probe = start_probe(probe_config(
        fleet.frontend,
        "naive",
        Duration::from_secs(8),
    ));
    std::thread::sleep(Duration::from_millis(1500));
    for round in 1..=2 {
        // No preStop, no drain: SIGTERM and the process exits at once.
        fleet.roll(&format!("naive{round}"), |old| {
            old.signal("-TERM");
            old.wait_exit(Duration::from_secs(15))
        });
        std::thread::sleep(Duration::from_millis(1500));
    }
    let result = probe.join().expect("probe thread");
    eprintln!("{}", result.summary.table());
    let s = &result.summary;
    assert!(
        s.all.failed + s.all.unfinished > 0,
        "a naive shutdown lost nothing: the test could not fail"
    );
}

/// Whoever started the service closed its stdout before the READY line (a log pipe gone): the
/// line is a message, not a reason to die, and the service still drains on SIGTERM.
#[test]
fn the_example_keeps_serving_when_its_stdout_is_closed() {
    use std::io::{Read as _, Write as _};
    use std::process::{Command, Stdio};
    let dir = scratch("closed-stdout");
    let (listen, admin) = (free_port(), free_port());
    let report = dir.join("report.json");
    // A socket whose peer is already gone: every write to it fails with EPIPE.
    let (stdout, peer) = std::os::unix::net::UnixStream::pair().unwrap();
    drop(peer);
    let mut child = Command::new(procs::service_bin())
        .args(["--listen", &format!("127.0.0.1:{listen}")])
        .args(["--admin", &format!("127.0.0.1:{admin}")])
        .args(["--report-file", report.to_str().unwrap()])
        .stdout(Stdio::from(std::os::fd::OwnedFd::from(stdout)))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let readyz = || -> Option<String> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", admin)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        s.write_all(b"GET /readyz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            .ok()?;
        let mut answer = String::new();
        s.read_to_string(&mut answer).ok()?;
        Some(answer)
    };
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            let _ = child.stderr.take().unwrap().read_to_string(&mut err);
            panic!("the service exited ({status}) with its stdout closed: {err}");
        }
        if readyz().is_some_and(|a| a.starts_with("HTTP/1.1 200")) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "never ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(40) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the service did not exit after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0));
    let text = std::fs::read_to_string(&report).unwrap();
    let report: lameduck::DrainReport = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(report.outcome, Outcome::Clean);
}
