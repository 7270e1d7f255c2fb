//! Propagation by evidence over real sockets on 127.0.0.1: the arrival rate measured by
//! `lameduck::serve` and by `ConnMeta` under `axum::serve`, and readiness by caller.
#![cfg(feature = "admin")]

mod common;

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use common::{bind, h1, secs, send1, text, within};
use http::{Request, StatusCode};
use http_body_util::Empty;
use lameduck::report::{EvidenceKind, MaxReason, WeakEvidence};
use lameduck::AdminBuilder;
use lameduck::{
    CommitReason, ConnMeta, Drain, EventKind, Phase, Propagation, ReadinessWhileDraining, Trigger,
};
use tokio::sync::{Mutex, MutexGuard};
use tokio::task::JoinHandle;

/// `ConnMeta` under `axum::serve` counts toward the coordinator built last (axum's hook cannot
/// name one), so the tests of this file build and run their coordinators one at a time.
async fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::const_new(());
    SERIAL.lock().await
}

/// `n` fresh connections, one request each, one every `every`. Bounded by `n`.
async fn fresh(addr: SocketAddr, n: u32, every: Duration) {
    for _ in 0..n {
        let (mut sender, conn) = h1(addr).await;
        let (status, _, _) = text(send1(&mut sender, "/").await).await;
        assert_eq!(status, StatusCode::OK);
        drop(sender);
        let _ = within("the connection to close", conn).await;
        tokio::time::sleep(every).await;
    }
}

fn app(drain: &Drain) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(drain.layer())
}

/// [`app`] under `lameduck::serve` on 127.0.0.1.
async fn serve_app(drain: &Drain) -> (SocketAddr, JoinHandle<()>) {
    let (listener, addr) = bind().await;
    (
        addr,
        tokio::spawn(lameduck::serve(listener, app(drain), drain)),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_serve_steady_fresh_connections_commit_soon_after_they_stop() {
    let _serial = serial().await;
    let drain = common::drain(secs(60), Propagation::default().max(secs(40)));
    let (addr, server) = serve_app(&drain).await;
    // 16 s and more of a fresh connection every 50 ms (the estimator reads no window shorter
    // than 15 s), then the trigger, then 1 s more (the proxies catching up), then none.
    fresh(addr, 320, Duration::from_millis(50)).await;
    assert!(drain.start(Trigger::Api));
    fresh(addr, 20, Duration::from_millis(50)).await;
    let report = within("the drain", drain.drained()).await;
    common::assert_figures_fit(&report);
    let ev = report.propagation.evidence.clone().expect("evidence");
    assert_eq!(ev.kind, EvidenceKind::Confidence, "{}", report.to_json());
    assert!(ev.slots_observed >= 60, "{ev:?}");
    assert!(ev.empty_slots < ev.slots_observed / 2, "{ev:?}");
    let stop = report.event(EventKind::StoppedAccepting).unwrap();
    assert_eq!(stop.reason, Some(CommitReason::Quiet));
    let last = report
        .after_flip
        .last_new_connection_ms
        .expect("new connections after the trigger");
    assert!(report.after_flip.new_connections >= 20);
    // Not before the quiet window (500 ms) and T_conf after the last new connection.
    let t_conf = ev.t_conf_ms.unwrap();
    assert!(stop.at_ms >= last + t_conf.max(500), "{}", report.to_json());
    assert!(report
        .advice
        .iter()
        .any(|a| a.rule.as_str() == "confidence"));
    one_line_each(&report);
    within("serve to return", server).await.unwrap();
}

/// A pooling client: one keep-alive connection, `n` requests on it, one every `every`, while
/// the server keeps it open. Returns how many were answered on it.
async fn pooled(addr: SocketAddr, n: u32, every: Duration) -> u32 {
    let (mut sender, conn) = h1(addr).await;
    let mut answered = 0;
    for _ in 0..n {
        if sender.ready().await.is_err() {
            break;
        }
        let (status, _, _) = text(send1(&mut sender, "/").await).await;
        assert_eq!(status, StatusCode::OK);
        answered += 1;
        tokio::time::sleep(every).await;
    }
    drop(sender);
    let _ = within("the pooled connection to close", conn).await;
    answered
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_serve_a_kept_connection_is_counted_and_holds_the_drain() {
    let _serial = serial().await;
    let drain = common::drain(secs(60), Propagation::default().max(secs(6)));
    let (addr, server) = serve_app(&drain).await;
    pooled_then_fresh(&drain, addr).await;
    within("serve to return", server).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_axum_serve_a_kept_connection_is_counted_and_holds_the_drain() {
    let _serial = serial().await;
    let drain = common::drain(secs(60), Propagation::default().max(secs(6)));
    let (listener, addr) = bind().await;
    let server = tokio::spawn(lameduck::axum_serve(listener, app(&drain), &drain));
    pooled_then_fresh(&drain, addr).await;
    within("axum_serve to return", server).await.unwrap();
}

/// A pool before and across the trigger, then 1 s of fresh connections from the same peer.
/// Its requests are counted (every slot of the window busy), and its connection, kept alive
/// for 320 requests, is seen as kept: whether this peer is a proxy that routes each request
/// or a client pool whose demand will open a connection here again whenever it needs one,
/// nothing local can tell, so the drain waits to `max` and says why (`kept_connections`).
async fn pooled_then_fresh(drain: &Drain, addr: SocketAddr) {
    // Like a proxy that keeps its backend connection: 16 s of requests every 50 ms on one
    // connection.
    let started = std::time::Instant::now();
    assert_eq!(pooled(addr, 320, Duration::from_millis(50)).await, 320);
    let client_rate = 320.0 / started.elapsed().as_secs_f64();
    // The pool goes on across the trigger: its next response says `Connection: close`, and
    // its next requests come on fresh connections for 1 s, then stop.
    let pool = tokio::spawn(pooled(addr, 100, Duration::from_millis(50)));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(drain.start(Trigger::Api));
    assert!(
        within("the pool to be told to close", pool).await.unwrap() < 100,
        "the pooled connection closes once draining"
    );
    fresh(addr, 20, Duration::from_millis(50)).await;
    let report = within("the drain", drain.drained()).await;
    common::assert_figures_fit(&report);
    let ev = report.propagation.evidence.clone().expect("evidence");
    assert!(ev.requests_seen, "{ev:?}");
    assert!(ev.slots_observed >= 60, "{ev:?}");
    assert!(ev.empty_slots * 10 < ev.slots_observed, "{ev:?}");
    assert_eq!(ev.kind, EvidenceKind::Max, "{}", report.to_json());
    assert_eq!(
        ev.weak,
        Some(WeakEvidence::KeptConnections),
        "{}",
        report.to_json()
    );
    assert_eq!(ev.paths.len(), 1, "{}", report.to_json());
    assert_eq!(ev.paths[0].kept_alive, 1, "{}", report.to_json());
    // Its requests were counted, not only the busy slots: the rate it sent at, within 10 %.
    let counted = ev.requests_per_1000s.expect("requests counted") as f64 / 1000.0;
    assert!(
        (counted - client_rate).abs() <= client_rate * 0.1,
        "counted {counted:.2}/s, sent {client_rate:.2}/s: {}",
        report.to_json()
    );
    let stop = report.event(EventKind::StoppedAccepting).unwrap();
    assert!(stop.at_ms >= 6000, "{}", report.to_json());
    assert!(
        report
            .advice
            .iter()
            .any(|a| a.message.contains("kept connections alive")),
        "{}",
        report.to_json()
    );
    one_line_each(&report);
}

/// Advice reads as prose: no line breaks or runs of spaces left by the source's line wrapping.
fn one_line_each(report: &lameduck::DrainReport) {
    for a in &report.advice {
        assert!(
            !a.message.contains("  ") && !a.message.contains('\n'),
            "advice `{}` is not one clean line: {:?}",
            a.rule,
            a.message
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_serve_sparse_arrivals_wait_to_max() {
    let _serial = serial().await;
    let drain = common::drain(secs(30), Propagation::default().max(secs(4)));
    let (addr, server) = serve_app(&drain).await;
    // One fresh connection every 2 s for 16 s: a rate, but far too low for 4 s to prove
    // anything.
    fresh(addr, 8, Duration::from_secs(2)).await;
    assert!(drain.start(Trigger::Api));
    let report = within("the drain", drain.drained()).await;
    common::assert_figures_fit(&report);
    let ev = report.propagation.evidence.clone().expect("evidence");
    assert_eq!(ev.kind, EvidenceKind::Max, "{}", report.to_json());
    assert_eq!(ev.max_reason, Some(MaxReason::NotEnoughEvidence));
    assert_eq!(ev.weak, Some(WeakEvidence::TooSparse), "{ev:?}");
    assert!(ev.t_conf_ms.is_none_or(|t| t > 4000), "{ev:?}");
    let stop = report.event(EventKind::StoppedAccepting).unwrap();
    assert_eq!(stop.reason, Some(CommitReason::Max));
    assert!(stop.at_ms >= 4000);
    let advice = report
        .advice
        .iter()
        .find(|a| a.rule.as_str() == "weak_evidence")
        .expect("weak evidence is explained");
    assert!(
        advice.message.contains("is not evidence"),
        "{}",
        advice.message
    );
    assert!(
        advice.message.contains("quiet_suffices_after"),
        "{}",
        advice.message
    );
    one_line_each(&report);
    within("serve to return", server).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_axum_serve_conn_meta_counts_the_rate() {
    let _serial = serial().await;
    let drain = common::drain(secs(60), Propagation::default().max(secs(40)));
    let (listener, addr) = bind().await;
    let server = tokio::spawn(lameduck::axum_serve(listener, app(&drain), &drain));
    fresh(addr, 320, Duration::from_millis(50)).await;
    assert!(drain.start(Trigger::Api));
    fresh(addr, 10, Duration::from_millis(50)).await;
    let report = within("the drain", drain.drained()).await;
    common::assert_figures_fit(&report);
    let ev = report.propagation.evidence.clone().expect("evidence");
    assert_eq!(ev.kind, EvidenceKind::Confidence, "{}", report.to_json());
    assert_eq!(ev.weak, None);
    assert!(report.after_flip.new_connections >= 10);
    within("axum_serve to return", server).await.unwrap();
}

/// Raw `axum::serve` with `ConnectInfo<ConnMeta>`: axum's hook cannot name a coordinator, so
/// its connections count in no arrival rate (the axum guide says so); the layer still counts
/// new connections after the trigger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_raw_axum_serve_no_rate_is_counted() {
    let _serial = serial().await;
    let drain = common::drain(secs(60), Propagation::default().max(secs(40)));
    drain.readiness().mark_serving();
    let (listener, addr) = bind().await;
    let stop = drain.moments().stopped_accepting();
    let server = tokio::spawn(
        axum::serve(
            listener,
            app(&drain).into_make_service_with_connect_info::<ConnMeta>(),
        )
        .with_graceful_shutdown(stop.cancelled_owned())
        .into_future(),
    );
    fresh(addr, 20, Duration::from_millis(50)).await;
    assert!(drain.start(Trigger::Api));
    fresh(addr, 3, Duration::from_millis(10)).await;
    let ev = drain.status().evidence.expect("evidence while draining");
    assert_eq!(ev.weak, Some(WeakEvidence::NoConnectionData));
    assert!(drain.force());
    let report = within("the drain", drain.drained()).await;
    common::assert_figures_fit(&report);
    assert_eq!(report.after_flip.new_connections, 3);
    within("axum::serve to return", server)
        .await
        .unwrap()
        .unwrap();
}

async fn readyz(addr: SocketAddr, user_agent: Option<&str>) -> (StatusCode, String) {
    let (mut sender, _conn) = h1(addr).await;
    let mut req = Request::builder()
        .uri("/readyz?verbose")
        .header("host", "admin");
    if let Some(ua) = user_agent {
        req = req.header("user-agent", ua);
    }
    sender.ready().await.unwrap();
    let res = sender
        .send_request(req.body(Empty::new()).unwrap())
        .await
        .unwrap();
    let (status, _, body) = text(res).await;
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_auto_keeps_kubelet_ready_until_stop_and_flips_everyone_else_at_once() {
    let _serial = serial().await;
    let drain = common::drain(secs(30), Propagation::fixed(secs(2)));
    assert_eq!(drain.readiness().policy(), ReadinessWhileDraining::Auto);
    drain.readiness().mark_serving();
    let (listener, addr) = bind().await;
    let admin = AdminBuilder::new(&drain).without_token().router();
    tokio::spawn(async move { axum::serve(listener, admin).await.unwrap() });

    let kubelet = Some("kube-probe/1.31");
    assert_eq!(readyz(addr, kubelet).await.0, StatusCode::OK);
    assert_eq!(readyz(addr, None).await.0, StatusCode::OK);

    assert!(drain.start(Trigger::Api));
    let (status, body) = readyz(addr, kubelet).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("policy auto, kubelet's probe"), "{body}");
    assert!(body.contains("[i]propagation fixed"), "{body}");
    for other in [None, Some("HAProxy"), Some("GoogleHC/1.0")] {
        let (status, body) = readyz(addr, other).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{other:?}: {body}");
        if other == Some("GoogleHC/1.0") {
            assert!(body.contains("a load balancer's checker"), "{body}");
        } else {
            assert!(body.contains("not kubelet's probe"), "{body}");
        }
        assert!(body.contains("readyz check failed: draining"), "{body}");
    }
    assert_eq!(
        drain.phase(),
        Phase::Draining,
        "the checks ran before the commit"
    );

    within(
        "stopped_accepting",
        drain.moments().reached(Phase::StoppedAccepting),
    )
    .await;
    let (status, body) = readyz(addr, kubelet).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    within("the drain", drain.drained()).await;
}

/// `GET path` on the admin router with `headers`; status and body.
async fn get_with(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> (StatusCode, String) {
    let (mut sender, _conn) = h1(addr).await;
    let mut req = Request::builder().uri(path).header("host", "admin");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    sender.ready().await.unwrap();
    let res = sender
        .send_request(req.body(Empty::new()).unwrap())
        .await
        .unwrap();
    let (status, _, body) = text(res).await;
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_auto_knows_kubelet_by_probe_header_when_a_mesh_rewrites_its_user_agent() {
    let _serial = serial().await;
    let drain = common::drain(secs(30), Propagation::fixed(secs(2)));
    drain.readiness().mark_serving();
    let (listener, addr) = bind().await;
    let admin = AdminBuilder::new(&drain).without_token().router();
    tokio::spawn(async move { axum::serve(listener, admin).await.unwrap() });
    // What a mesh's agent forwards: kubelet's probe with its own User-Agent, and the probe's
    // `httpHeaders`.
    let rewritten = ("user-agent", "Go-http-client/1.1");
    let knative = [rewritten, ("k-kubelet-probe", "queue")];
    let own = [rewritten, ("x-lameduck-probe", "kubelet")];
    assert_eq!(get_with(addr, "/readyz", &knative).await.0, StatusCode::OK);

    assert!(drain.start(Trigger::Api));
    for headers in [&knative[..], &own[..]] {
        let (status, body) = get_with(addr, "/readyz?verbose", headers).await;
        assert_eq!(status, StatusCode::OK, "{headers:?}: {body}");
        assert!(
            body.contains("policy auto, kubelet's probe (header"),
            "{body}"
        );
    }
    // The same rewritten User-Agent without the header is not kubelet: 503 from the trigger.
    let (status, body) = get_with(addr, "/readyz?verbose", &[rewritten]).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let (status, body) = get_with(
        addr,
        "/readyz?verbose",
        &[("user-agent", "ELB-HealthChecker/2.0")],
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("a load balancer's checker"), "{body}");

    // `/status` says who asked and how each was classified.
    let (status, body) = get_with(addr, "/status", &[]).await;
    assert_eq!(status, StatusCode::OK);
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    let rows = json["probe_sources"]["sources"].as_array().expect(&body);
    let row = |header: Option<&str>, agent: &str| {
        rows.iter()
            .find(|r| r["user_agent"] == agent && r["header"].as_str() == header)
            .unwrap_or_else(|| panic!("no row {header:?} {agent}: {body}"))
    };
    let k = row(Some("K-Kubelet-Probe"), "Go-http-client/1.1");
    assert_eq!(k["classified_as"], "kubelet");
    assert_eq!(
        (k["requests"].as_u64(), k["while_draining"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(
        row(Some("X-Lameduck-Probe: kubelet"), "Go-http-client/1.1")["classified_as"],
        "kubelet"
    );
    assert_eq!(row(None, "Go-http-client/1.1")["classified_as"], "other");
    assert_eq!(
        row(None, "ELB-HealthChecker/2.0")["classified_as"],
        "load_balancer"
    );

    within(
        "stopped_accepting",
        drain.moments().reached(Phase::StoppedAccepting),
    )
    .await;
    assert_eq!(
        get_with(addr, "/readyz", &knative).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let report = within("the drain", drain.drained()).await;
    common::assert_figures_fit(&report);
    let kubelet_rows: Vec<_> = report
        .probe_sources
        .sources
        .iter()
        .filter(|s| s.classified_as == lameduck::report::ProbeClass::Kubelet)
        .collect();
    assert_eq!(kubelet_rows.len(), 2, "{}", report.to_json());
}

#[test]
fn readiness_policies_parse_from_flags() {
    assert_eq!(
        "serving-until-stop"
            .parse::<ReadinessWhileDraining>()
            .unwrap(),
        ReadinessWhileDraining::ServingUntilStop
    );
    assert_eq!(
        "not_ready".parse::<ReadinessWhileDraining>().unwrap(),
        ReadinessWhileDraining::NotReady
    );
    let e = "sometimes".parse::<ReadinessWhileDraining>().unwrap_err();
    assert!(
        e.to_string()
            .contains("auto, not-ready or serving-until-stop"),
        "{e}"
    );
}

/// An HTTP/1.1 connection to `addr` from the loopback address `from` (a peer of its own).
async fn h1_from(
    from: [u8; 4],
    addr: SocketAddr,
) -> (
    hyper::client::conn::http1::SendRequest<Empty<bytes::Bytes>>,
    JoinHandle<hyper::Result<()>>,
) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from((from, 0))).unwrap();
    let stream = socket.connect(addr).await.unwrap();
    let io = hyper_util::rt::TokioIo::new(stream);
    let (sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
    (sender, tokio::spawn(conn))
}

/// A keep-alive pool of `conns` connections from `from`, a request on each every `every`,
/// `n` requests a connection at most. A connection told to close is not replaced: the pool
/// has moved to another endpoint, as a client behind kube-proxy does once it reconnects
/// elsewhere. Returns the requests answered.
async fn pool_that_moves_away(
    from: [u8; 4],
    addr: SocketAddr,
    conns: u32,
    n: u32,
    every: Duration,
) -> u32 {
    let mut tasks = Vec::new();
    for _ in 0..conns {
        tasks.push(tokio::spawn(async move {
            let (mut sender, conn) = h1_from(from, addr).await;
            let mut answered = 0;
            for _ in 0..n {
                if sender.ready().await.is_err() {
                    break;
                }
                let req = Request::get("/").body(Empty::new()).unwrap();
                let Ok(res) = sender.send_request(req).await else {
                    break;
                };
                let close = common::connection_close(res.headers());
                let (status, _, _) = text(res).await;
                assert_eq!(status, StatusCode::OK);
                answered += 1;
                if close {
                    break;
                }
                tokio::time::sleep(every).await;
            }
            drop(sender);
            let _ = conn.await;
            answered
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total
}

/// `n` fresh connections from `from`, one request each, one every `every`; returns how many
/// were refused or failed (a retry-free client's losses).
async fn trickle_from(from: [u8; 4], addr: SocketAddr, n: u32, every: Duration) -> u32 {
    let mut lost = 0;
    for _ in 0..n {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::from((from, 0))).unwrap();
        match socket.connect(addr).await {
            Err(_) => lost += 1,
            Ok(stream) => {
                let io = hyper_util::rt::TokioIo::new(stream);
                match hyper::client::conn::http1::handshake(io).await {
                    Err(_) => lost += 1,
                    Ok((mut sender, conn)) => {
                        let conn = tokio::spawn(conn);
                        let req = Request::get("/")
                            .body(Empty::<bytes::Bytes>::new())
                            .unwrap();
                        match sender.send_request(req).await {
                            Ok(res) if res.status() == StatusCode::OK => {
                                let _ = text(res).await;
                            }
                            _ => lost += 1,
                        }
                        drop(sender);
                        let _ = conn.await;
                    }
                }
            }
        }
        tokio::time::sleep(every).await;
    }
    lost
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_that_moves_away_does_not_prove_a_trickle_from_another_peer() {
    // Two peers behind two proxies: 127.0.0.2 a keep-alive pool, dense with requests, that
    // moves to another endpoint once told to close; 127.0.0.3 a fresh connection every
    // 250 ms, whose proxy goes on routing here for 3 s after the trigger. The pool's requests
    // made every slot busy and a short silence after its last connection looked like proof
    // (the estimator before paths committed at about 1 s and refused the trickle): each path
    // is judged by its own arrivals. And the pool's own path proves nothing either: once its
    // connections are closed, the client opens new ones when its demand needs them, however
    // late, so it holds the drain to `max` (`kept_connections`).
    let _serial = serial().await;
    let drain = common::drain(secs(60), Propagation::default().max(secs(8)));
    let (addr, server) = serve_app(&drain).await;
    let pool = tokio::spawn(pool_that_moves_away(
        [127, 0, 0, 2],
        addr,
        8,
        400,
        Duration::from_millis(80),
    ));
    // 16 s of both (the evidence reads no window shorter than 15 s).
    let lost_before = trickle_from([127, 0, 0, 3], addr, 64, Duration::from_millis(250)).await;
    assert_eq!(lost_before, 0);
    assert!(drain.start(Trigger::Api));
    let lost_after = trickle_from([127, 0, 0, 3], addr, 12, Duration::from_millis(250)).await;
    let answered = within("the pool to move away", pool).await.unwrap();
    assert!(
        answered < 8 * 400,
        "the pool's connections were told to close"
    );
    let report = within("the drain", drain.drained()).await;
    common::assert_figures_fit(&report);
    assert_eq!(lost_after, 0, "{}", report.to_json());
    let ev = report.propagation.evidence.clone().expect("evidence");
    let path = |peer: &str| {
        ev.paths
            .iter()
            .find(|p| p.peer == peer)
            .unwrap_or_else(|| panic!("no path {peer}: {}", report.to_json()))
    };
    assert_eq!(
        path("127.0.0.2").routing,
        lameduck::report::PathRouting::Pool,
        "{}",
        report.to_json()
    );
    assert_eq!(
        path("127.0.0.3").routing,
        lameduck::report::PathRouting::Connections,
        "{}",
        report.to_json()
    );
    assert_eq!(
        ev.held_by.as_deref(),
        Some("127.0.0.2"),
        "{}",
        report.to_json()
    );
    assert_eq!(ev.kind, EvidenceKind::Max, "{}", report.to_json());
    assert_eq!(
        ev.weak,
        Some(WeakEvidence::KeptConnections),
        "{}",
        report.to_json()
    );
    assert!(path("127.0.0.2").kept_alive > 0, "{}", report.to_json());
    assert_eq!(path("127.0.0.3").kept_alive, 0, "{}", report.to_json());
    let stop = report.event(EventKind::StoppedAccepting).unwrap();
    let last = report.after_flip.last_new_connection_ms.unwrap();
    assert!(stop.at_ms > last, "{}", report.to_json());
    within("serve to return", server).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_off_peers_beyond_the_table_never_let_a_dense_peer_prove_a_sparse_one() {
    // 70 peers (127.0.1.x) that each sent one request — more than the table's 63 live rows —
    // then a dense peer (127.0.0.2, a fresh connection every 50 ms) whose proxy converges at
    // the trigger and a sparse one (127.0.0.3, one every 2 s) whose proxy still routes here:
    // the two share the last row with the one-offs beyond the table. Judged as one path, the
    // dense peer's silence proved the row quiet in about a second and the sparse peer's next
    // connections were refused (with a table of 16, 15 one-offs did it). The shared row
    // proves no silence: the drain waits to `max` and the sparse peer loses nothing.
    let _serial = serial().await;
    let drain = common::drain(secs(60), Propagation::default().max(secs(6)));
    let (addr, server) = serve_app(&drain).await;
    for i in 1..=70u8 {
        assert_eq!(
            trickle_from([127, 0, 1, i], addr, 1, Duration::ZERO).await,
            0
        );
    }
    let sparse = tokio::spawn(trickle_from([127, 0, 0, 3], addr, 8, secs(2)));
    // 16 s and more of the dense peer (the evidence reads no window shorter than 15 s).
    let lost_dense = trickle_from([127, 0, 0, 2], addr, 320, Duration::from_millis(50)).await;
    assert_eq!(lost_dense, 0);
    assert_eq!(within("the sparse peer", sparse).await.unwrap(), 0);
    assert!(drain.start(Trigger::Api));
    // The sparse peer's proxy has not caught up: +0.5, +2.5, +4.5 s.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let lost = trickle_from([127, 0, 0, 3], addr, 3, secs(2)).await;
    // Served past `max` (6 s) while the shared row's last connection (+4.5 s) is recent for
    // it: up to 10 s of silence, so up to ~15 s from here.
    let report = tokio::time::timeout(secs(30), drain.drained())
        .await
        .expect("the drain within 30 s");
    common::assert_figures_fit(&report);
    assert_eq!(lost, 0, "{}", report.to_json());
    let ev = report.propagation.evidence.clone().expect("evidence");
    assert_eq!(ev.kind, EvidenceKind::Max, "{}", report.to_json());
    assert!(ev.past_max_ms.is_some(), "{}", report.to_json());
    assert_eq!(
        ev.weak,
        Some(WeakEvidence::TooManyPeers),
        "{}",
        report.to_json()
    );
    assert_eq!(ev.held_by.as_deref(), Some("other"), "{}", report.to_json());
    assert!(
        report
            .advice
            .iter()
            .any(|a| a.rule.as_str() == "weak_evidence" && a.message.contains("peers")),
        "{}",
        report.to_json()
    );
    within("serve to return", server).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooling_router_declared_per_request_commits_on_its_silence() {
    // 127.0.0.2 keeps 8 connections alive, a request on each every 80 ms: a client pool by
    // what this process sees, which holds the drain to `max` (`kept_connections`). Declared
    // as a router that chooses per request (HAProxy, nginx with upstream keep-alive), it is
    // judged by the silence of its requests: it moves away once told to close, as a router
    // that dropped this Pod does, and the drain commits on that silence long before `max`.
    let _serial = serial().await;
    let drain = common::drain(
        secs(60),
        Propagation::default()
            .max(secs(20))
            .per_request_peers(["127.0.0.2"]),
    );
    let (addr, server) = serve_app(&drain).await;
    let pool = tokio::spawn(pool_that_moves_away(
        [127, 0, 0, 2],
        addr,
        8,
        400,
        Duration::from_millis(80),
    ));
    // 16 s of it (the evidence reads no window shorter than 15 s).
    tokio::time::sleep(secs(16)).await;
    assert!(drain.start(Trigger::Api));
    within("the pool to move away", pool).await.unwrap();
    let report = within("the drain", drain.drained()).await;
    common::assert_figures_fit(&report);
    let ev = report.propagation.evidence.clone().expect("evidence");
    assert_eq!(ev.kind, EvidenceKind::Confidence, "{}", report.to_json());
    assert_eq!(ev.per_request_peers, ["127.0.0.2"]);
    let path = ev.paths.iter().find(|p| p.peer == "127.0.0.2").unwrap();
    assert!(path.declared_per_request, "{}", report.to_json());
    assert_eq!(path.routing, lameduck::report::PathRouting::PerRequest);
    assert!(path.kept_alive > 0, "{}", report.to_json());
    let stop = report.event(EventKind::StoppedAccepting).unwrap();
    assert!(stop.at_ms < 10_000, "{}", report.to_json());
    within("serve to return", server).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_still_routed_at_max_is_served_past_it() {
    // A fresh connection every 500 ms from 127.0.0.4, before the trigger and for 7 s after it:
    // its proxy is slower than `max` (4 s). The report itself sees the connections arriving at
    // `max`; leaving then refused them (the estimator judged how long to guess, not whether
    // the path was still routed). The drain serves past `max` until they stop, and loses none.
    let _serial = serial().await;
    let drain = common::drain(secs(30), Propagation::default().max(secs(4)));
    let (addr, server) = serve_app(&drain).await;
    assert_eq!(
        trickle_from([127, 0, 0, 4], addr, 32, Duration::from_millis(500)).await,
        0
    );
    assert!(drain.start(Trigger::Api));
    let lost = trickle_from([127, 0, 0, 4], addr, 14, Duration::from_millis(500)).await;
    let report = within("the drain", drain.drained()).await;
    common::assert_figures_fit(&report);
    assert_eq!(lost, 0, "{}", report.to_json());
    let ev = report.propagation.evidence.clone().expect("evidence");
    assert_eq!(ev.kind, EvidenceKind::Max, "{}", report.to_json());
    let past = ev.past_max_ms.expect("served past max");
    assert!(past >= 2_500, "{}", report.to_json());
    assert!(!ev.still_routed_at_cap, "{}", report.to_json());
    let stop = report.event(EventKind::StoppedAccepting).unwrap();
    let last = report.after_flip.last_new_connection_ms.unwrap();
    assert!(stop.at_ms > last, "{}", report.to_json());
    assert!(
        report
            .to_json()
            .contains("past max while new connections kept arriving"),
        "{}",
        report.to_json()
    );
    within("serve to return", server).await.unwrap();
}
