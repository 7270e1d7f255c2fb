//! The path for apps that keep `axum::serve(...).with_graceful_shutdown(...)`: the layer plus
//! `ConnectInfo<ConnMeta>`, the stop token as the shutdown future, the deadline as the bound.
#![cfg(feature = "admin")] // the test app is an axum Router

mod common;

use std::future::IntoFuture;
use std::net::SocketAddr;

use common::*;
use http::StatusCode;
use http_body_util::BodyExt;
use lameduck::report::{AfterFlipReport, Outcome};
use lameduck::{ConnMeta, Drain, DrainReport, EventKind, Phase, Propagation, Trigger};
use tokio::task::JoinHandle;

/// Runs the app under `axum::serve`, as the guide says: graceful shutdown at
/// `stopped_accepting`, bounded by the quiesce deadline. The handle says whether the server
/// finished by itself (`true`) or was cut at the deadline (`false`).
async fn start_axum(drain: &Drain, probe: Probe) -> (SocketAddr, JoinHandle<bool>) {
    serve_axum(drain, app(drain, probe).layer(drain.layer())).await
}

/// [`start_axum`] with an app that already has its layer.
async fn serve_axum(drain: &Drain, app: axum::Router) -> (SocketAddr, JoinHandle<bool>) {
    let (listener, addr) = bind().await;
    let server = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<ConnMeta>(),
    )
    .with_graceful_shutdown(drain.moments().stopped_accepting().cancelled_owned())
    .into_future();
    let deadline = drain.moments().deadline_exceeded();
    drain.readiness().mark_serving();
    let handle = tokio::spawn(async move {
        tokio::select! {
            r = server => { r.unwrap(); true }
            () = deadline.cancelled_owned() => false,
        }
    });
    (addr, handle)
}

/// The counts after one request on the reused connection and one on each of two new ones
/// (HTTP/1.1 and HTTP/2), from one peer.
fn one_reused_two_new(af: &AfterFlipReport) {
    assert_eq!(af.requests_on_reused_connections, 1);
    assert_eq!(af.requests_on_new_connections, 2);
    // Under axum::serve the layer counts a new connection on its first request.
    assert_eq!(af.new_connections, 2);
    assert_eq!(af.peers.len(), 1);
    assert_eq!(af.peers[0].new_connections, 2);
}

#[tokio::test]
async fn keep_alive_reuse_new_connections_and_counters_under_axum_serve() {
    let drain = drain(secs(6), Propagation::fixed(ms(1500)));
    let (addr, server) = start_axum(&drain, Probe::default()).await;

    let (mut a, a_conn) = h1(addr).await;
    let (status, headers, _) = text(send1(&mut a, "/conn").await).await;
    assert_eq!(status, StatusCode::OK);
    let a_id = conn_header(&headers);
    assert!(!connection_close(&headers));

    assert!(drain.start(Trigger::Api));

    // Reused connection: served, told to close, closed.
    reused_then_closed(&mut a, a_conn, a_id, "/conn").await;

    // New connections while draining: axum keeps accepting until stopped_accepting.
    let (mut b, _b_conn) = h1(addr).await;
    let (status, headers, _) = text(send1(&mut b, "/conn").await).await;
    assert_eq!(status, StatusCode::OK);
    assert_ne!(conn_header(&headers), a_id);
    let (mut c, _c_conn) = h2(addr).await;
    assert_eq!(
        send2(&mut c, "/conn").await.unwrap().status(),
        StatusCode::OK
    );
    assert!(
        is_phase(&drain, Phase::Draining),
        "test window: still draining"
    );

    let report = within("drain done", drain.drained()).await;
    assert_eq!(report.outcome, Outcome::Clean);
    one_reused_two_new(&report.after_flip);
    drop((b, c));
    assert!(within("axum::serve returns", server).await.unwrap());
}

#[tokio::test]
async fn streaming_request_completes_and_is_counted_under_axum_serve() {
    let probe = Probe::default();
    let drain = drain(secs(8), Propagation::fixed(ms(500)));
    let (addr, server) = start_axum(&drain, probe.clone()).await;

    let (mut c, _c_conn) = h1(addr).await;
    let res = send1(&mut c, "/stream/6/300").await;
    assert_eq!(res.status(), StatusCode::OK);
    assert!(drain.start(Trigger::Api));
    let body = within("full body", res.into_body().collect())
        .await
        .unwrap();
    assert_eq!(body.to_bytes().iter().filter(|b| **b == b'\n').count(), 6);

    let last = probe.get().expect("last chunk reached");
    assert_eq!(last.in_flight, 1);
    assert!(!last.in_flight_zero_recorded);
    let report = within("drain done", drain.drained()).await;
    assert_eq!(report.outcome, Outcome::Clean);
    assert!(report
        .timeline
        .iter()
        .any(|e| e.event == EventKind::InFlightZero));
    drop(c);
    assert!(within("axum::serve returns", server).await.unwrap());
}

#[tokio::test]
async fn deadline_bounds_axum_serve_and_names_the_never_ending_stream() {
    // grace 4s → quiesce deadline ≈ 3.2s after the trigger.
    let drain = drain(secs(4), Propagation::fixed(ms(500)));
    // Naming a request that started before the trigger is opt-in.
    let app = app(&drain, Probe::default()).layer(drain.layer().describe_requests());
    let (addr, server) = serve_axum(&drain, app).await;

    let reader = endless_stream_then_trigger(&drain, addr).await;

    // axum alone would wait for the stream forever; the deadline bounds it.
    assert!(!within("axum::serve bounded by the deadline", server)
        .await
        .unwrap());
    names_the_endless_stream(&within("drain done", drain.drained()).await);
    // axum's connection tasks outlive its serve future; in an app they end with the process.
    reader.abort();
}

/// Opens `/forever` on a new connection and, once its first chunk arrived, starts the drain;
/// the task reads the rest (and holds the connection) until aborted.
async fn endless_stream_then_trigger(drain: &Drain, addr: SocketAddr) -> JoinHandle<()> {
    let (mut c, _c_conn) = h1(addr).await;
    let mut body = send1(&mut c, "/forever").await.into_body();
    assert!(next_chunk(&mut body).await.is_some());
    assert!(drain.start(Trigger::Api));
    tokio::spawn(async move {
        let _connection = c;
        while next_chunk(&mut body).await.is_some() {}
    })
}

/// The drain was cut at the deadline and names the `/forever` request as a straggler.
fn names_the_endless_stream(report: &DrainReport) {
    assert_eq!(report.outcome, Outcome::DeadlineExceeded);
    assert!(report
        .stragglers
        .iter()
        .any(|s| s.kind == lameduck::report::StragglerKind::Request && s.name == "GET /forever"));
}

/// The test app plus two routes that extract `ConnectInfo` the two ways handlers do.
fn connect_info_app(drain: &Drain) -> axum::Router {
    use axum::extract::ConnectInfo;
    use axum::routing::get as route;

    async fn peer(ConnectInfo(addr): ConnectInfo<SocketAddr>) -> String {
        addr.to_string()
    }
    async fn meta(ConnectInfo(conn): ConnectInfo<ConnMeta>) -> String {
        format!(
            "{} {} {:?}",
            conn.id(),
            conn.peer().expect("peer known"),
            conn.request_index()
        )
    }
    app(drain, Probe::default())
        .route("/peer", route(peer))
        .route("/meta", route(meta))
        .layer(drain.layer())
}

#[tokio::test]
async fn one_call_serve_gives_both_connect_infos_counts_new_and_reused_and_ends_after_stop() {
    let drain = drain(secs(6), Propagation::fixed(ms(1500)));
    let (listener, addr) = bind().await;
    let server = tokio::spawn(lameduck::axum_serve(
        listener,
        connect_info_app(&drain),
        &drain,
    ));

    // Serving: both extractors work on one connection, and the ConnMeta is the connection's.
    let (mut a, a_conn) = h1(addr).await;
    let (status, _, peer) = text(send1(&mut a, "/peer").await).await;
    assert_eq!(status, StatusCode::OK);
    let local: SocketAddr = peer.parse().expect("a socket address");
    assert_eq!(local.ip(), addr.ip());
    let (status, _, meta) = text(send1(&mut a, "/meta").await).await;
    assert_eq!(status, StatusCode::OK);
    let fields: Vec<&str> = meta.split(' ').collect();
    assert_eq!(
        fields[1], peer,
        "ConnMeta's peer is the ConnectInfo<SocketAddr>"
    );
    assert_eq!(fields[2], "Some(1)", "second request on the connection");
    let a_id: u64 = fields[0].parse().unwrap();
    assert!(
        is_phase(&drain, Phase::Serving),
        "serve marked startup done"
    );

    assert!(drain.start(Trigger::Api));

    // Reused connection: served, told to close, closed.
    reused_then_closed(&mut a, a_conn, a_id, "/conn").await;

    // New connections while draining: still accepted, both extractors still work.
    let (mut b, _b_conn) = h1(addr).await;
    let (status, _, peer_b) = text(send1(&mut b, "/peer").await).await;
    assert_eq!(status, StatusCode::OK);
    assert_ne!(peer_b, peer, "a new client port");
    let (mut c, _c_conn) = h2(addr).await;
    let res = send2(&mut c, "/meta").await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let (_, _, meta_c) = text(res).await;
    assert_ne!(meta_c.split(' ').next().unwrap(), a_id.to_string());
    assert!(
        is_phase(&drain, Phase::Draining),
        "test window: still draining"
    );

    // The server future ends only after stopped_accepting.
    assert!(!server.is_finished());
    drop((b, c));
    within("lameduck::axum_serve returns", server)
        .await
        .unwrap();
    assert!(drain.phase() >= Phase::StoppedAccepting);
    assert!(has_event(&drain, EventKind::StoppedAccepting));

    let report = within("drain done", drain.drained()).await;
    assert_eq!(report.outcome, Outcome::Clean);
    one_reused_two_new(&report.after_flip);
    // The listener is closed: a new connection is refused.
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn one_call_serve_is_bounded_by_the_deadline() {
    // grace 4s → quiesce deadline ≈ 3.2s after the trigger.
    let drain = drain(secs(4), Propagation::fixed(ms(500)));
    let (listener, addr) = bind().await;
    // Naming a request that started before the trigger is opt-in.
    let app = app(&drain, Probe::default()).layer(drain.layer().describe_requests());
    let server = tokio::spawn(lameduck::axum_serve(listener, app, &drain));

    let reader = endless_stream_then_trigger(&drain, addr).await;

    within("lameduck::axum_serve bounded by the deadline", server)
        .await
        .unwrap();
    assert!(has_event(&drain, EventKind::DeadlineExceeded));
    names_the_endless_stream(&within("drain done", drain.drained()).await);
    reader.abort();
}

/// `lameduck::serve` with `connect_info()` gives handlers what `axum_serve` gives them — the same
/// two `ConnectInfo`s — and without it those extractors answer 500, as under `axum::serve`
/// without `into_make_service_with_connect_info`.
#[tokio::test]
async fn serve_with_connect_info_answers_the_same_extractors_as_axum_serve() {
    let drain = drain(secs(6), Propagation::fixed(ms(300)));
    let (listener, with_addr) = bind().await;
    let with =
        tokio::spawn(lameduck::serve(listener, connect_info_app(&drain), &drain).connect_info());
    let (listener, without_addr) = bind().await;
    let without = tokio::spawn(lameduck::serve(listener, connect_info_app(&drain), &drain));

    let (mut a, _a_conn) = h1(with_addr).await;
    let (status, _, peer) = text(send1(&mut a, "/peer").await).await;
    assert_eq!(status, StatusCode::OK);
    let peer: SocketAddr = peer.parse().expect("a socket address");
    assert_eq!(peer.ip(), with_addr.ip());
    let (status, _, meta) = text(send1(&mut a, "/meta").await).await;
    assert_eq!(status, StatusCode::OK);
    // id, peer, and the request's index on its connection (the second request).
    assert!(meta.ends_with(&format!("{peer} Some(1)")), "{meta}");

    let (mut b, _b_conn) = h1(without_addr).await;
    for path in ["/peer", "/meta"] {
        let (status, _, body) = text(send1(&mut b, path).await).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{path}");
        assert!(body.contains("Missing request extension"), "{body}");
    }
    drop((a, b));

    // Both resolve to `()`, like `axum_serve`'s future.
    assert!(drain.start(Trigger::Api));
    let ((), ()) = within("both servers end", async {
        (with.await.unwrap(), without.await.unwrap())
    })
    .await;
}

/// Two coordinators in one process each count only their own connections, built in either
/// order: the arrival rate (the propagation evidence) of `axum_serve`'s connections goes to the
/// coordinator that server was given, and each layer's options are its own coordinator's.
#[tokio::test]
async fn two_coordinators_in_one_process_count_only_their_own_connections() {
    use http::HeaderName;

    let quiet = || Propagation::quiet(ms(200)).max(secs(2));
    let first = drain(secs(10), quiet());
    let second = drain(secs(10), quiet()); // built last: once the process-wide target
    let phase_a = HeaderName::from_static("x-first-phase");
    let phase_b = HeaderName::from_static("x-second-phase");
    let app_a = app(&first, Probe::default()).layer(first.layer().phase_header(phase_a.clone()));
    let app_b = app(&second, Probe::default()).layer(second.layer().phase_header(phase_b.clone()));
    let (listener, addr_a) = bind().await;
    let server_a = tokio::spawn(lameduck::axum_serve(listener, app_a, &first));
    let (listener, addr_b) = bind().await;
    let server_b = tokio::spawn(lameduck::axum_serve(listener, app_b, &second));

    // Three connections to the first, each in its own 250 ms slot; none to the second.
    tokio::time::sleep(ms(300)).await;
    for _ in 0..3 {
        let (mut c, _conn) = h1(addr_a).await;
        assert_eq!(send1(&mut c, "/conn").await.status(), StatusCode::OK);
        tokio::time::sleep(ms(300)).await;
    }

    assert!(first.start(Trigger::Api));
    assert!(second.start(Trigger::Api));
    let busy = |d: &Drain| {
        let e = d.status().evidence.expect("evidence while draining");
        (e.slots_observed, e.slots_observed - e.empty_slots)
    };
    let (observed_a, busy_a) = busy(&first);
    let (observed_b, busy_b) = busy(&second);
    assert!(
        observed_a >= 3 && observed_b >= 3,
        "{observed_a} {observed_b}"
    );
    assert!(
        busy_a >= 2,
        "the first saw its connections: {busy_a} busy slots"
    );
    assert_eq!(busy_b, 0, "the second saw none of the first's connections");

    // Each layer names its own coordinator's phase, and only its own header.
    for (addr, mine, other) in [(addr_a, &phase_a, &phase_b), (addr_b, &phase_b, &phase_a)] {
        let (mut c, _conn) = h1(addr).await;
        let res = send1(&mut c, "/conn").await;
        assert_eq!(res.headers()[mine], "draining");
        assert!(!res.headers().contains_key(other));
    }

    for (d, server) in [(&first, server_a), (&second, server_b)] {
        let report = within("drain done", d.drained()).await;
        assert_eq!(report.outcome, Outcome::Clean);
        within("server ends", server).await.unwrap();
    }
    // After the drain: the first saw one new connection, the second one too (the header check).
    assert_eq!(first.report().unwrap().after_flip.new_connections, 1);
    assert_eq!(second.report().unwrap().after_flip.new_connections, 1);
}
