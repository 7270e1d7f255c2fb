//! Hostile networks, over real sockets on 127.0.0.1: slow readers, slowloris connections on the
//! service and admin ports, and `/drain` callers at exit.
#![cfg(feature = "admin")]

mod common;

use std::time::Duration;

use axum::routing::get;
use common::*;
use lameduck::report::{Outcome, Straggler};
use lameduck::AdminBuilder;
use lameduck::{DrainReport, EventKind, Phase, Propagation, Trigger};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Larger than anything the kernel can queue between the two sockets (send queue at most
/// `tcp_wmem` max, 4 MiB by default, plus the client's small receive buffer).
const BIG: usize = 32 << 20;

fn big_app(drain: &lameduck::Drain) -> axum::Router {
    axum::Router::new()
        .route("/big", get(|| async { vec![b'x'; BIG] }))
        .layer(drain.layer())
}

/// A client with a 4 KiB receive buffer that asks for `/big` and reads nothing yet.
async fn slow_client(addr: std::net::SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    stream
        .write_all(b"GET /big HTTP/1.1\r\nhost: test\r\n\r\n")
        .await
        .unwrap();
    stream
}

/// Reads the response head, then body bytes until `until` of them arrived or the connection
/// ends; returns the body bytes read. Bounded by the response's size.
async fn read_body(stream: &mut TcpStream, head_done: &mut bool, until: usize) -> usize {
    let mut buf = vec![0u8; 64 * 1024];
    let mut body = 0usize;
    let mut head = Vec::new();
    while body < until {
        let n = match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if *head_done {
            body += n;
        } else {
            head.extend_from_slice(&buf[..n]);
            if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                *head_done = true;
                body += head.len() - (end + 4);
            }
        }
    }
    body
}

/// What the deadline says of a response stuck on its way out: the drain was cut, no
/// `in_flight_zero` was recorded, and the response is named as a straggler.
fn cut_response(report: &DrainReport) -> &Straggler {
    assert_eq!(report.outcome, Outcome::DeadlineExceeded);
    assert!(
        !report
            .timeline
            .iter()
            .any(|e| e.event == EventKind::InFlightZero),
        "in_flight_zero recorded while the response had not left: {:?}",
        report.timeline
    );
    report
        .stragglers
        .iter()
        .find(|s| s.kind == lameduck::report::StragglerKind::Response)
        .unwrap_or_else(|| panic!("the response is named: {:?}", report.stragglers))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_nobody_reads_is_in_flight_and_named_at_the_deadline() {
    // grace 4 s: quiesce deadline ≈ 3.2 s after the trigger.
    let drain = drain(secs(4), Propagation::fixed(ms(300)));
    let (listener, addr) = bind().await;
    let server = tokio::spawn(lameduck::serve(listener, big_app(&drain), &drain));

    let mut client = slow_client(addr).await;
    let client_addr = client.local_addr().unwrap().to_string();
    // The body was handed to hyper at once; its bytes are stuck behind the client.
    eventually("the stalled response counts as in flight", || {
        drain.counts().in_flight() == 1
    })
    .await;

    assert!(drain.start(Trigger::Api));
    let report = within("drain done", drain.drained()).await;
    // Synchronisation point: the quiesce deadline. The report taken there has no
    // in_flight_zero and names the response, so it was in flight from before the trigger
    // until the deadline while nobody read it.
    let straggler = cut_response(&report);
    assert_eq!(straggler.peer.as_deref(), Some(client_addr.as_str()));
    assert!(
        straggler.name.contains(&client_addr) && straggler.name.contains("bytes written"),
        "{}",
        straggler.name
    );
    assert!(
        !report
            .stragglers
            .iter()
            .any(|s| s.name.contains("undescribed")),
        "{:?}",
        report.stragglers
    );
    within("serve returns", server).await.unwrap();

    // The connection was cut: the client gets less than the whole body.
    let mut head_done = false;
    let got = within(
        "client sees the cut",
        read_body(&mut client, &mut head_done, BIG),
    )
    .await;
    assert!(got < BIG, "the client got the whole body ({got} bytes)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_zero_waits_until_a_slow_reader_has_the_whole_response() {
    let drain = drain(secs(30), Propagation::fixed(ms(300)));
    let (listener, addr) = bind().await;
    let server = tokio::spawn(lameduck::serve(listener, big_app(&drain), &drain));

    let mut client = slow_client(addr).await;
    eventually("the stalled response counts as in flight", || {
        drain.counts().in_flight() == 1
    })
    .await;
    assert!(drain.start(Trigger::Api));
    within(
        "stopped accepting",
        drain.moments().reached(Phase::StoppedAccepting),
    )
    .await;

    // Half the body read: more than the kernel can hold is still in the server's hands.
    let mut head_done = false;
    let first = within(
        "half the body",
        read_body(&mut client, &mut head_done, BIG / 2),
    )
    .await;
    assert!(
        first >= BIG / 2,
        "connection ended early after {first} bytes"
    );
    assert!(
        !has_event(&drain, EventKind::InFlightZero),
        "in_flight_zero before the client had the response"
    );
    assert!(drain.counts().in_flight() >= 1);

    let rest = within(
        "the rest of the body",
        read_body(&mut client, &mut head_done, BIG - first),
    )
    .await;
    assert_eq!(first + rest, BIG, "the client got the whole body");

    let report = drained_clean(&drain, server).await;
    assert!(report.stragglers.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_response_stuck_behind_flow_control_is_in_flight_and_named() {
    let drain = drain(secs(4), Propagation::fixed(ms(300)));
    let (listener, addr) = bind().await;
    let server = tokio::spawn(lameduck::serve(listener, big_app(&drain), &drain));

    // The client takes the head and never reads the body: once its stream window is full the
    // rest of the body waits in the server's HTTP/2 send queue, which the socket never sees.
    let (mut client, _client_conn) = h2(addr).await;
    let res = send2(&mut client, "/big").await.unwrap();
    assert_eq!(res.status(), http::StatusCode::OK);
    let _unread = res.into_body();

    assert!(drain.start(Trigger::Api));
    let report = within("drain done", drain.drained()).await;
    let straggler = cut_response(&report);
    assert!(straggler.name.contains("HTTP/2"), "{}", straggler.name);
    within("serve returns", server).await.unwrap();
}

/// An HTTP/2 (prior knowledge) connection that keeps every stream's flow-control window at
/// zero (`SETTINGS_INITIAL_WINDOW_SIZE = 0`) and sent `GET {path}`: the answer's head arrives,
/// its body never can. Dropping it closes the connection.
struct ZeroWindow {
    /// The client's address, as the server sees the peer.
    local: std::net::SocketAddr,
    _send: h2::client::SendRequest<bytes::Bytes>,
    _response: http::Response<h2::RecvStream>,
    conn: tokio::task::JoinHandle<Result<(), h2::Error>>,
}

impl Drop for ZeroWindow {
    fn drop(&mut self) {
        self.conn.abort();
    }
}

/// Opens a [`ZeroWindow`] connection and waits for the head of its answer (the handler ran).
async fn zero_window_get(addr: std::net::SocketAddr, path: &str) -> ZeroWindow {
    let stream = TcpStream::connect(addr).await.unwrap();
    let local = stream.local_addr().unwrap();
    let (send, conn) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, bytes::Bytes>(stream)
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let mut send = send.ready().await.unwrap();
    let req = http::Request::builder()
        .uri(format!("http://test{path}"))
        .body(())
        .unwrap();
    let (response, _) = send.send_request(req, true).unwrap();
    let response = response.await.expect("the answer's head");
    assert!(!response.body().is_end_stream(), "a body is owed");
    ZeroWindow {
        local,
        _send: send,
        _response: response,
        conn,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_request_behind_a_shut_window_is_cut_and_named_at_the_deadline() {
    let drain = drain(secs(4), Propagation::fixed(ms(300)));
    let (listener, addr) = bind().await;
    let app = axum::Router::new()
        .route("/small", get(|| async { "ok" }))
        .layer(drain.layer());
    let server = tokio::spawn(lameduck::serve(listener, app, &drain));

    let stuck = within("zero-window head", zero_window_get(addr, "/small")).await;
    eventually("the owed answer counts as in flight", || {
        drain.counts().in_flight() == 1
    })
    .await;
    assert!(drain.start(Trigger::Api));
    let report = within("drain done", drain.drained()).await;
    assert_eq!(report.outcome, Outcome::DeadlineExceeded);
    let peer = stuck.local.to_string();
    assert!(
        report
            .stragglers
            .iter()
            .any(|s| s.peer.as_deref() == Some(peer.as_str())),
        "the connection from {peer} is named: {:?}",
        report.stragglers
    );
    within("serve returns", server).await.unwrap();
}

/// One HTTP/2 (prior knowledge) connection with every stream's window at zero, `streams`
/// requests for `GET {path}` sent on it, each answered with a head and a body that can never
/// come. Returns the connection, its requests' answers (kept, so their streams stay open)
/// and the stream bound the server announced.
async fn zero_window_streams(
    addr: std::net::SocketAddr,
    path: &str,
    streams: usize,
) -> (ZeroWindow, Vec<http::Response<h2::RecvStream>>, usize) {
    let first = zero_window_get(addr, path).await;
    let bound = first._send.current_max_send_streams();
    let mut answers = Vec::with_capacity(streams);
    let mut send = first._send.clone();
    for _ in 1..streams {
        send = send.ready().await.unwrap();
        let req = http::Request::builder()
            .uri(format!("http://test{path}"))
            .body(())
            .unwrap();
        let (response, _) = send.send_request(req, true).unwrap();
        answers.push(response.await.expect("the answer's head"));
    }
    (first, answers, bound)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_stalled_http2_streams_are_counted_and_a_few_named_in_a_small_report() {
    // 20 connections × 50 streams, each answer's body held back by a zero window: every
    // stream is a request in flight at the quiesce deadline. The report named each of them
    // (and was serialised several times over): at 3,500 connections × 200 streams it did not
    // fit in the grace and no report was left. It names the oldest few and counts the rest.
    let (conns, streams) = (20, 50);
    let drain = drain(secs(4), Propagation::fixed(ms(300)));
    let (listener, addr) = bind().await;
    let app = axum::Router::new()
        .route("/small", get(|| async { "ok" }))
        .layer(drain.layer());
    let server = tokio::spawn(lameduck::serve(listener, app, &drain));
    let mut held = Vec::new();
    for _ in 0..conns {
        held.push(
            within(
                "zero-window streams",
                zero_window_streams(addr, "/small", streams),
            )
            .await,
        );
    }
    eventually("every owed answer counts as in flight", || {
        drain.counts().in_flight() >= conns * streams
    })
    .await;
    assert!(drain.start(Trigger::Api));
    let report = within("drain done", drain.drained()).await;
    assert_eq!(report.outcome, Outcome::DeadlineExceeded);
    assert!(
        report.straggler_counts.requests >= (conns * streams) as u64,
        "{:?}",
        report.straggler_counts
    );
    let named = |kind| report.stragglers.iter().filter(|s| s.kind == kind).count();
    assert!(
        named(lameduck::report::StragglerKind::Request) <= Straggler::NAMED_PER_KIND,
        "{} requests named",
        named(lameduck::report::StragglerKind::Request)
    );
    assert!(named(lameduck::report::StragglerKind::Response) <= Straggler::NAMED_PER_KIND);
    let json = report.to_json();
    assert!(json.len() < 32 << 10, "a report of {} bytes", json.len());
    assert!(report.budget.used_ms < report.budget.grace_ms, "{json}");
    assert!(
        report.advice.iter().any(|a| a
            .message
            .starts_with(&format!("{} requests", report.straggler_counts.requests))),
        "the advice counts them all: {json}"
    );
    within("serve returns", server).await.unwrap();
}

#[tokio::test]
async fn an_http2_connection_may_hold_a_bounded_number_of_streams() {
    let bounded = drain(secs(30), Propagation::fixed(ms(300)));
    let (listener, addr) = bind().await;
    let app = axum::Router::new()
        .route("/small", get(|| async { "ok" }))
        .layer(bounded.layer());
    let server =
        tokio::spawn(lameduck::serve(listener, app, &bounded).http2_max_concurrent_streams(16));
    let (_conn, _answers, bound) = within("streams", zero_window_streams(addr, "/small", 1)).await;
    assert_eq!(bound, 16, "the server announces its bound");
    drop((_conn, _answers));
    server.abort();

    let drain = drain(secs(30), Propagation::fixed(ms(300)));
    let (listener, addr) = bind().await;
    let app = axum::Router::new()
        .route("/small", get(|| async { "ok" }))
        .layer(drain.layer());
    let server = tokio::spawn(lameduck::serve(listener, app, &drain));
    let (_conn, _answers, bound) = within("streams", zero_window_streams(addr, "/small", 1)).await;
    assert_eq!(
        bound as u32,
        lameduck::server::DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS
    );
    server.abort();
}

/// Partial request heads that are never finished.
async fn slowloris(addr: std::net::SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /conn HTTP/1.1\r\nhost: test\r\nx-slow: ")
            .await
            .unwrap();
        out.push(s);
    }
    out
}

/// `true` once the server closed the connection (EOF or reset).
async fn closed_by_server(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 1024];
    loop {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return true,
            Ok(_) => {}
        }
    }
}

#[tokio::test]
async fn slowloris_connections_do_not_keep_serve_from_finishing_after_a_drain() {
    // grace 30 s: the quiesce deadline (≈ 24 s) is past PATIENCE, so only a clean end passes.
    let drain = drain(secs(30), Propagation::fixed(ms(300)));
    let (addr, server) = start_serve(&drain, Probe::default()).await;
    let mut loris = slowloris(addr, 20).await;
    let mut silent = Vec::new();
    for _ in 0..5 {
        silent.push(TcpStream::connect(addr).await.unwrap());
    }
    eventually("all connections accepted", || {
        drain.counts().connections() == 25
    })
    .await;

    assert!(drain.start(Trigger::Api));
    drained_clean(&drain, server).await;
    assert_eq!(drain.counts().connections(), 0);
    for s in loris.iter_mut().chain(silent.iter_mut()) {
        assert!(within("connection closed", closed_by_server(s)).await);
    }
}

#[tokio::test]
async fn silent_connections_close_at_stopped_accepting_and_partial_heads_once_nothing_is_in_flight()
{
    let drain = drain(secs(30), Propagation::fixed(ms(300)));
    let (addr, server) = start_serve(&drain, Probe::default()).await;
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let mut loris = slowloris(addr, 1).await.pop().unwrap();
    // A request in flight keeps the drain in StoppedAccepting for a while.
    let slow = slow_request(&drain, addr, 2500).await;

    assert!(drain.start(Trigger::Api));
    assert!(within("silent connection closed", closed_by_server(&mut silent)).await);
    assert_eq!(
        drain.phase(),
        Phase::StoppedAccepting,
        "a connection that never sent a byte closes at stopped_accepting"
    );
    assert!(within("slowloris closed", closed_by_server(&mut loris)).await);
    assert!(
        drain.phase() >= Phase::Closing,
        "a partial head is closed only once nothing is in flight"
    );
    let (status, _, body) = within("slow request", slow).await.unwrap();
    assert_eq!((status, body.as_str()), (http::StatusCode::OK, "slow done"));
    drained_clean(&drain, server).await;
}

#[tokio::test]
async fn the_header_read_timeout_closes_a_slowloris_connection_while_serving() {
    let drain = drain(secs(30), Propagation::fixed(ms(300)));
    let (listener, addr) = bind().await;
    let app = app(&drain, Probe::default()).layer(drain.layer());
    let _server = tokio::spawn(
        lameduck::serve(listener, app, &drain)
            .header_read_timeout(Duration::from_millis(500))
            // The app reads `ConnMeta` on every request.
            .conn_meta_on_every_request(),
    );
    let mut loris = slowloris(addr, 3).await;
    for s in &mut loris {
        assert!(within("slowloris connection closed", closed_by_server(s)).await);
    }
    assert_eq!(drain.phase(), Phase::Serving);
    // A well-behaved client is still served.
    let (mut c, _conn) = h1(addr).await;
    let (status, _, _) = text(send1(&mut c, "/conn").await).await;
    assert_eq!(status, http::StatusCode::OK);

    // The report carries the accept loop's idle timeout, and the advice says that 0.5 s is
    // shorter than proxies keep idle upstream connections.
    assert!(drain.start(Trigger::Api));
    let report = within("drain done", drain.drained()).await;
    let server = report.server.as_ref().expect("serve records its timeouts");
    assert_eq!(server.header_read_timeout_ms, Some(500));
    let advice = report
        .advice
        .iter()
        .find(|a| a.rule.as_str() == "server_idle_timeout_short")
        .expect("advice on the short idle timeout");
    assert_eq!(advice.observed, 500);
}

// ---- the admin port ----

/// One `GET` on a fresh connection with `Connection: close`; the raw answer (status code and
/// body), or `None` when the connection was cut before a complete response (the body shorter
/// than its `Content-Length`, or no head at all).
async fn raw_get(addr: std::net::SocketAddr, target: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).await.ok()?;
    let req = format!("GET {target} HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut raw = Vec::new();
    // Bounded by the server closing the connection (Connection: close).
    let _ = s.read_to_end(&mut raw).await;
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let code: u16 = head.split(' ').nth(1)?.parse().ok()?;
    let len: usize = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse().ok())?
    })?;
    let body = &raw[end + 4..];
    (body.len() == len).then(|| (code, String::from_utf8_lossy(body).into_owned()))
}

async fn admin_server(drain: &lameduck::Drain, cap: usize) -> std::net::SocketAddr {
    let (listener, addr) = bind().await;
    tokio::spawn(
        AdminBuilder::new(drain)
            .without_token()
            .max_connections(cap)
            // Longer than the test: only the cap's eviction can free a slot.
            .header_read_timeout(Duration::from_secs(60))
            .serve(listener),
    );
    addr
}

#[tokio::test]
async fn probes_answer_under_a_slowloris_and_busy_answers_are_not_evicted() {
    let drain = drain(secs(30), Propagation::fixed(ms(1500)));
    drain.readiness().mark_serving();
    let addr = admin_server(&drain, 8).await;

    // A preStop caller waiting for the drain: busy, never evicted.
    let waiter = tokio::spawn(async move { raw_get(addr, "/drain?wait=drained").await });
    eventually("drain started", || drain.phase().is_draining()).await;

    let mut loris = slowloris(addr, 40).await;
    let mut silent = Vec::new();
    for _ in 0..10 {
        silent.push(TcpStream::connect(addr).await.unwrap());
    }
    // Every probe gets its answer, on a port flooded far past its cap.
    for _ in 0..20 {
        let (code, body) = within("readyz answers", raw_get(addr, "/readyz"))
            .await
            .expect("a complete /readyz answer");
        assert_eq!((code, body.as_str()), (503, "draining"));
    }
    // The cap held: all but the newest few slow connections were evicted.
    let mut evicted = 0;
    for s in loris.iter_mut().chain(silent.iter_mut()) {
        let mut b = [0u8; 16];
        match tokio::time::timeout(Duration::from_millis(50), s.read(&mut b)).await {
            Ok(Ok(0)) | Ok(Err(_)) => evicted += 1,
            _ => {}
        }
    }
    assert!(
        evicted >= 50 - 8,
        "only {evicted} of 50 slow connections evicted"
    );

    let (code, body) = within("the waiter's answer", waiter)
        .await
        .unwrap()
        .expect("the waiting /drain caller got a complete answer");
    assert_eq!(code, 200);
    assert!(body.contains("\"phase\":\"done\""), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_window_http2_connections_do_not_lock_kubelet_probes_out() {
    let drain = drain(secs(30), Propagation::fixed(ms(300)));
    drain.readiness().mark_serving();
    let addr = admin_server(&drain, lameduck::admin::DEFAULT_ADMIN_MAX_CONNECTIONS).await;

    // Every slot holds an answer its peer will never take.
    let mut stuck = Vec::new();
    for _ in 0..lameduck::admin::DEFAULT_ADMIN_MAX_CONNECTIONS {
        stuck.push(within("zero-window head", zero_window_get(addr, "/livez")).await);
    }
    // kubelet's HTTP/1.1 probes, all answered.
    for path in ["/livez", "/readyz"].into_iter().cycle().take(10) {
        let (code, body) = within("probe answers", raw_get(addr, path))
            .await
            .unwrap_or_else(|| panic!("a complete {path} answer"));
        assert_eq!(code, 200, "{path}: {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_answer_behind_a_shut_http2_window_does_not_hold_the_exit_and_is_named() {
    // A hard deadline far past the test's patience: only cutting the connection lets `run`
    // return in time.
    let drain = drain(secs(60), Propagation::fixed(ms(100)));
    let addr = admin_server(&drain, lameduck::admin::DEFAULT_ADMIN_MAX_CONNECTIONS).await;
    let run = {
        let drain = drain.clone();
        tokio::spawn(async move { drain.run().await })
    };
    let stuck = within("zero-window head", zero_window_get(addr, "/livez")).await;
    assert!(drain.start(Trigger::Api));
    let report = within("run returns", run).await.unwrap();

    let peer = stuck.local.to_string();
    let cut = report
        .stragglers
        .iter()
        .find(|s| s.peer.as_deref() == Some(peer.as_str()))
        .unwrap_or_else(|| panic!("the cut connection is named: {:?}", report.stragglers));
    assert_eq!(cut.kind, lameduck::report::StragglerKind::Response);
    assert!(
        cut.name.contains("HTTP/2") && cut.name.contains("GET /livez"),
        "{}",
        cut.name
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_short_grace_an_admin_answer_nobody_reads_is_cut_soon_and_named_in_the_report() {
    // A 3 s grace: the fixed 2 s wait for the answer held the exit to the hard deadline
    // (2.9 s of 3 s, the kill at 3 s) and the report, written first, said clean with no
    // straggler. The wait scales with the grace (200 ms here), and the cut is in the report.
    let drain = drain(secs(3), Propagation::fixed(ms(100)));
    let addr = admin_server(&drain, lameduck::admin::DEFAULT_ADMIN_MAX_CONNECTIONS).await;
    let run = {
        let drain = drain.clone();
        tokio::spawn(async move { drain.run().await })
    };
    let stuck = within("zero-window head", zero_window_get(addr, "/livez")).await;
    assert!(drain.start(Trigger::Api));
    let report = within("run returns", run).await.unwrap();
    let json = report.to_json();
    let peer = stuck.local.to_string();
    let cut = report
        .stragglers
        .iter()
        .find(|s| s.peer.as_deref() == Some(peer.as_str()))
        .unwrap_or_else(|| panic!("the cut connection is named: {json}"));
    assert!(cut.name.contains("within 200 ms"), "{}", cut.name);
    assert_eq!(report.straggler_counts.responses, 1, "{json}");
    let done = report.event(EventKind::Done).unwrap().at_ms;
    let exit = report.event(EventKind::Exit).unwrap().at_ms;
    // The hard deadline is past 2.5 s; the exit comes the wait after Done, with room to spare.
    assert!(
        exit < 1_500,
        "exit at {exit} ms (done at {done} ms): {json}"
    );
}

#[tokio::test]
async fn the_admin_header_read_timeout_closes_slow_heads() {
    let drain = drain(secs(30), Propagation::fixed(ms(300)));
    let (listener, addr) = bind().await;
    tokio::spawn(
        AdminBuilder::new(&drain)
            .header_read_timeout(Duration::from_millis(300))
            .serve(listener),
    );
    let mut loris = slowloris(addr, 3).await;
    for s in &mut loris {
        assert!(within("slow head closed", closed_by_server(s)).await);
    }
    let (code, _) = raw_get(addr, "/livez").await.expect("livez answers");
    assert_eq!(code, 200);
}

// ---- /drain callers at exit, through the example service ----

struct Service(std::process::Child);

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How many `/drain` calls after the first the service's `/status` timeline counts (repeats
/// fold into `signal_received` events with a count), or `None` without an answer.
async fn prestop_repeats(admin: std::net::SocketAddr) -> Option<u64> {
    let (code, body) = raw_get(admin, "/status").await?;
    assert_eq!(code, 200, "{body}");
    let status: lameduck::Status = serde_json::from_str(&body).unwrap();
    assert_eq!(status.timeline_omitted, 0, "{body}");
    Some(
        status
            .timeline
            .iter()
            .filter(|e| e.event == EventKind::SignalReceived && e.trigger == Some(Trigger::PreStop))
            .map(|e| e.count.unwrap_or(1))
            .sum(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_waiting_drain_caller_is_answered_before_the_process_exits() {
    use std::io::BufRead;

    let mut child = std::process::Command::new(common::example_bin("service"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--grace-period",
            "10s",
            "--quiet",
            "300ms",
            "--min",
            "300ms",
            "--max",
            "2s",
        ])
        .env_remove("LAMEDUCK_ADMIN_TOKEN")
        .env_remove("LAMEDUCK_GRACE_PERIOD")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut service = Service(child);
    let mut line = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .unwrap();
    let admin: std::net::SocketAddr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("admin="))
        .unwrap_or_else(|| panic!("no READY line: {line:?}"))
        .parse()
        .unwrap();
    // Ready once the warm-up gate opened.
    within("service ready", async {
        while raw_get(admin, "/readyz").await.map(|a| a.0) != Some(200) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;

    let callers: Vec<_> = (0..50)
        .map(|_| tokio::spawn(async move { raw_get(admin, "/drain?wait=drained").await }))
        .collect();
    // Synchronisation point: the service's timeline holds the first call's drain_started
    // and the 49 others as repeated prestop signals, so every caller is in a handler.
    within("every /drain caller in a handler", async {
        while prestop_repeats(admin).await != Some(49) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let ok = std::process::Command::new("kill")
        .args(["-TERM", &service.0.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -TERM failed");

    let mut cut = 0;
    for c in callers {
        match within("a /drain caller", c).await.unwrap() {
            Some((code, body)) => {
                assert_eq!(code, 200, "{body}");
                assert!(body.contains("\"phase\":\"done\""), "{body}");
            }
            None => cut += 1,
        }
    }
    assert_eq!(
        cut, 0,
        "{cut} of 50 /drain callers were cut instead of answered"
    );
    let status = within("service exits", async {
        loop {
            if let Some(s) = service.0.try_wait().unwrap() {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(status.code(), Some(0));
}

// ---- the main port at a low descriptor limit ----

/// The example service under `ulimit -n <limit>`, stdout piped (its READY line) and its
/// addresses; `sh` sets the limit, then execs the service.
fn service_with_fd_limit(limit: u32) -> (Service, std::net::SocketAddr, std::net::SocketAddr) {
    use std::io::BufRead;

    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -n {limit} && exec \"$0\" \"$@\""))
        .arg(common::example_bin("service"))
        .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .env_remove("LAMEDUCK_ADMIN_TOKEN")
        .env_remove("LAMEDUCK_GRACE_PERIOD")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let service = Service(child);
    let mut line = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .unwrap();
    let addr = |key: &str| -> std::net::SocketAddr {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .unwrap_or_else(|| panic!("no READY line: {line:?}"))
            .parse()
            .unwrap()
    };
    let (listen, admin) = (addr("listen="), addr("admin="));
    (service, listen, admin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_heads_on_the_main_port_do_not_starve_the_admin_port_of_descriptors() {
    let (service, listen, admin) = service_with_fd_limit(1024);
    within("service ready", async {
        while raw_get(admin, "/readyz").await.map(|a| a.0) != Some(200) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;

    // More half-sent request heads than the process has descriptors (bounded: 1,100). Once
    // the service stops accepting and its accept queue is full, connecting times out: no
    // more can get in, so the flood stops there.
    let mut loris = Vec::with_capacity(1100);
    let mut queue_full = false;
    for _ in 0..1100 {
        match tokio::time::timeout(Duration::from_millis(300), TcpStream::connect(listen)).await {
            Ok(Ok(mut s)) => {
                s.write_all(b"GET / HTTP/1.1\r\nhost: test\r\nx-slow: ")
                    .await
                    .unwrap();
                loris.push(s);
            }
            Ok(Err(e)) => panic!("connect: {e}"),
            Err(_) => {
                queue_full = true;
                break;
            }
        }
    }
    // Settled: the service has taken in every connection it is going to (a request on the
    // main port queues behind the half heads, so it cannot say; the admin port can).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = loris.len();

    // kubelet's readiness probe, 1 s timeout each.
    for i in 0..5 {
        let answer = tokio::time::timeout(Duration::from_secs(1), raw_get(admin, "/readyz")).await;
        assert!(
            matches!(answer, Ok(Some((200, _)))),
            "readyz {i} with {held} half heads on the main port at a 1,024 descriptor limit \
             (accept queue full: {queue_full}): {answer:?}"
        );
    }
    drop(loris);
    drop(service);
}

// ---- the example service's stderr before READY ----

/// Starts the example service through `sh -c <prelude>; exec service …` with stderr piped,
/// and waits (bounded) for its READY line: `Ok(child)` once it printed it, `Err` with how it
/// ended (or that it never did) otherwise. The caller keeps or drops the stderr pipe.
fn service_ready_after(prelude: &str, keep_stderr: bool) -> Result<Service, String> {
    use std::io::BufRead;

    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{prelude}\nexec \"$0\" \"$@\""))
        .arg(common::example_bin("service"))
        .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        // A drain of about 2 s: no traffic to measure, so it waits to `--max`.
        .args([
            "--grace-period",
            "10s",
            "--quiet",
            "300ms",
            "--min",
            "300ms",
            "--max",
            "2s",
        ])
        .env_remove("LAMEDUCK_ADMIN_TOKEN")
        .env_remove("LAMEDUCK_GRACE_PERIOD")
        .env_remove("POD_NAME")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut service = Service(child);
    if !keep_stderr {
        // The log reader went away: every write to stderr is EPIPE.
        drop(stderr);
    } else {
        // Held, never read: once full, every write to stderr blocks.
        std::mem::forget(stderr);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    match rx.recv_timeout(PATIENCE) {
        Ok(line) if line.starts_with("READY ") => Ok(service),
        Ok(line) => Err(format!(
            "no READY line ({line:?}); exit status {:?}",
            service.0.wait().unwrap()
        )),
        Err(_) => Err(format!("no READY line within {PATIENCE:?}: blocked")),
    }
}

/// SIGTERM, then the exit status (bounded).
fn terminate(service: &mut Service) -> std::process::ExitStatus {
    let ok = std::process::Command::new("kill")
        .args(["-TERM", &service.0.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill failed");
    let until = std::time::Instant::now() + PATIENCE;
    loop {
        if let Some(s) = service.0.try_wait().unwrap() {
            return s;
        }
        assert!(
            std::time::Instant::now() < until,
            "the service did not exit"
        );
        std::thread::sleep(ms(20));
    }
}

#[test]
fn the_example_service_starts_and_drains_with_its_stderr_reader_gone() {
    let mut service = service_ready_after(":", false).unwrap_or_else(|e| panic!("{e}"));
    let status = terminate(&mut service);
    assert!(
        matches!(status.code(), Some(0 | 1)),
        "a closed stderr is no reason to panic: {status:?}"
    );
}

#[test]
fn the_example_service_starts_and_drains_with_its_stderr_closed() {
    let mut service = service_ready_after("exec 2>&-", true).unwrap_or_else(|e| panic!("{e}"));
    let status = terminate(&mut service);
    assert!(matches!(status.code(), Some(0 | 1)), "{status:?}");
}

#[test]
fn the_example_service_starts_and_drains_with_its_stderr_full() {
    // 64 KiB, a default pipe's capacity, in whole pages: the pipe is full, and nobody reads.
    let mut service =
        service_ready_after("head -c 65536 /dev/zero >&2", true).unwrap_or_else(|e| panic!("{e}"));
    let status = terminate(&mut service);
    assert!(matches!(status.code(), Some(0 | 1)), "{status:?}");
}
