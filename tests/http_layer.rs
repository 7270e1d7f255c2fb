//! The drain layer: in-flight accounting that follows the response body, `Connection: close`
//! while draining, the phase header, and ending streams at `stopped_accepting` — with real
//! sockets on 127.0.0.1 and real hyper clients.
#![cfg(feature = "admin")] // the test app is an axum Router

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{HeaderName, HeaderValue, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use lameduck::report::Outcome;
use lameduck::StreamStop;
use lameduck::{EventKind, Phase, Propagation, Trigger};

#[tokio::test]
async fn reused_connection_gets_connection_close_while_draining_and_next_request_uses_a_new_one() {
    let drain = drain(secs(6), Propagation::fixed(ms(1500)));
    let (addr, server) = start_serve(&drain, Probe::default()).await;

    // A raw connection: the server closes it after the response that carried the header.
    let (mut raw, raw_conn) = h1(addr).await;
    let (_, headers, _) = text(send1(&mut raw, "/conn").await).await;
    let raw_id = conn_header(&headers);
    assert!(!connection_close(&headers));

    // A pooling client, as real callers use.
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let url = format!("http://{addr}/conn");
    let res = client.get(url.parse().unwrap()).await.unwrap();
    let pooled_id = conn_header(res.headers());
    res.into_body().collect().await.unwrap();

    assert!(drain.start(Trigger::Api));

    reused_then_closed(&mut raw, raw_conn, raw_id, "/conn").await;
    assert!(raw.is_closed());

    let first = client.get(url.parse().unwrap()).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert!(connection_close(first.headers()));
    let first_id = conn_header(first.headers());
    first.into_body().collect().await.unwrap();
    let second = client.get(url.parse().unwrap()).await.unwrap();
    assert_eq!(second.status(), StatusCode::OK);
    let second_id = conn_header(second.headers());
    second.into_body().collect().await.unwrap();
    assert_ne!(
        second_id, first_id,
        "the next request went on a new connection"
    );
    assert_ne!(second_id, pooled_id);
    assert!(
        is_phase(&drain, Phase::Draining),
        "test window: still draining"
    );
    drop(client);

    let report = within("drain done", drain.drained()).await;
    assert_eq!(report.outcome, Outcome::Clean);
    assert!(report.after_flip.requests_on_reused_connections >= 1);
    assert!(report.after_flip.requests_on_new_connections >= 1);
    within("serve returns", server).await.unwrap();
}

#[tokio::test]
async fn slow_streaming_request_completes_and_in_flight_zero_follows_its_last_byte() {
    let probe = Probe::default();
    let drain = drain(secs(8), Propagation::fixed(ms(500)));
    let (addr, server) = start_serve(&drain, probe.clone()).await;

    let (mut c, _c_conn) = h1(addr).await;
    // 8 chunks, one every 300 ms: about 2.4 s of body, started before the trigger.
    let res = send1(&mut c, "/stream/8/300").await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        drain.counts().in_flight(),
        1,
        "headers sent, body pending: still in flight"
    );
    assert!(drain.start(Trigger::Api));

    let mut body = res.into_body();
    let mut got = Vec::new();
    while let Some(chunk) = within("next chunk", next_chunk(&mut body)).await {
        if got.len() == 2 {
            // Past stopped_accepting (0.5 s) the stream still counts.
            assert_eq!(
                drain.counts().in_flight(),
                1,
                "a streaming body stays in flight"
            );
        }
        got.push(chunk);
    }
    assert_eq!(got.len(), 8, "the whole body arrived");

    let last = probe.get().expect("the stream reached its last chunk");
    assert_eq!(last.in_flight, 1);
    assert!(
        !last.in_flight_zero_recorded,
        "in_flight_zero before the last chunk was sent"
    );

    let report = within("drain done", drain.drained()).await;
    assert_eq!(report.outcome, Outcome::Clean);
    let pos = |k: EventKind| report.timeline.iter().position(|e| e.event == k).unwrap();
    assert!(pos(EventKind::StoppedAccepting) < pos(EventKind::InFlightZero));
    within("serve returns", server).await.unwrap();
}

#[tokio::test]
async fn slow_request_started_before_the_trigger_completes() {
    let drain = drain(secs(8), Propagation::fixed(ms(300)));
    let (addr, server) = start_serve(&drain, Probe::default()).await;

    let slow = slow_request(&drain, addr, 2500).await;
    assert!(drain.start(Trigger::Api));

    let (status, headers, body) = within("slow request", slow).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, "slow done");
    assert!(connection_close(&headers), "answered while draining");
    let report = drained_clean(&drain, server).await;
    assert!(report.stragglers.is_empty());
}

#[tokio::test]
async fn client_disconnect_mid_body_releases_the_guard() {
    let drain = drain(secs(6), Propagation::fixed(ms(300)));
    let (addr, _server) = start_serve(&drain, Probe::default()).await;

    let (mut c, c_conn) = h1(addr).await;
    let res = send1(&mut c, "/forever").await;
    let mut body = res.into_body();
    assert!(next_chunk(&mut body).await.is_some());
    assert_eq!(drain.counts().in_flight(), 1);

    // The client goes away mid-body.
    drop(body);
    drop(c);
    c_conn.abort();
    eventually("guard released after disconnect", || {
        drain.counts().in_flight() == 0
    })
    .await;

    // Nothing is left to wait for: the drain is clean.
    assert!(drain.start(Trigger::Api));
    let report = within("drain done", drain.drained()).await;
    assert_eq!(report.outcome, Outcome::Clean);
}

#[tokio::test]
async fn phase_and_instance_headers_mark_responses_while_draining() {
    let drain = drain(secs(6), Propagation::fixed(ms(1500)));
    let (listener, addr) = bind().await;
    let layer = drain
        .layer()
        .phase_header(HeaderName::from_static("x-lameduck-phase"))
        .instance_header(
            HeaderName::from_static("x-lameduck-instance"),
            HeaderValue::from_static("pod-a"),
        );
    let app = app(&drain, Probe::default()).layer(layer);
    // The test app reports each request's connection id, from `ConnMeta`.
    let server = tokio::spawn(lameduck::serve(listener, app, &drain).conn_meta_on_every_request());

    let (mut c, _c_conn) = h2(addr).await;
    let res = send2(&mut c, "/conn").await.unwrap();
    assert!(
        !res.headers().contains_key("x-lameduck-phase"),
        "no header while Serving"
    );

    assert!(drain.start(Trigger::Api));
    let (mut d, _d_conn) = h2(addr).await;
    let res = send2(&mut d, "/conn").await.unwrap();
    assert_eq!(res.headers().get("x-lameduck-phase").unwrap(), "draining");
    assert_eq!(res.headers().get("x-lameduck-instance").unwrap(), "pod-a");
    assert!(
        !res.headers().contains_key(http::header::CONNECTION),
        "never on HTTP/2"
    );

    within("drain done", drain.drained()).await;
    within("serve returns", server).await.unwrap();
}

#[tokio::test]
async fn stream_stop_ends_streams_cleanly_at_stopped_accepting() {
    let drain = drain(secs(6), Propagation::fixed(ms(800)));
    let (addr, server) = start_serve(&drain, Probe::default()).await;

    let mut readers = Vec::new();
    for _ in 0..2 {
        let (mut c, _c_conn) = h1(addr).await;
        let res = send1(&mut c, "/events").await;
        assert_eq!(res.status(), StatusCode::OK);
        readers.push(tokio::spawn(async move {
            let _keep = (c, _c_conn);
            let (_, body) = res.into_parts();
            // Collecting succeeds only if the body ended cleanly.
            body.collect().await.map(|b| b.to_bytes().len())
        }));
    }
    let (mut h2c, _h2_conn) = h2(addr).await;
    let res = send2(&mut h2c, "/events").await.unwrap();
    readers.push(tokio::spawn(async move {
        let _keep = h2c;
        res.into_body().collect().await.map(|b| b.to_bytes().len())
    }));
    eventually("three streams in flight", || {
        drain.counts().in_flight() == 3
    })
    .await;

    assert!(drain.start(Trigger::Api));
    for r in readers {
        let len = within("stream ends", r).await.unwrap().expect("clean end");
        assert!(len > 0);
        assert!(
            has_event(&drain, EventKind::StoppedAccepting),
            "a stream ended before stopped_accepting"
        );
    }
    let report = drained_clean(&drain, server).await;
    assert!(report.stragglers.is_empty());
}

#[tokio::test]
async fn spread_stream_stops_fire_within_the_window() {
    let drain = drain(secs(6), Propagation::fixed(ms(200)));
    drain.readiness().mark_serving();
    let window = Duration::from_millis(600);
    let stops: Vec<_> = (0..5)
        .map(|_| StreamStop::new(&drain).spread(window))
        .collect();
    let mut offsets: Vec<_> = stops.iter().map(|s| s.offset()).collect();
    assert!(offsets.iter().all(|o| *o < window));
    offsets.sort();
    offsets.dedup();
    assert_eq!(offsets.len(), 5, "each stream gets its own offset");

    let before = StreamStop::new(&drain);
    assert!(drain.start(Trigger::Api));
    within("unspread stop", before).await;
    assert!(drain.phase() >= Phase::StoppedAccepting);
    for s in stops {
        within("spread stop", s).await;
    }
    within("drain done", drain.drained()).await;
}

/// A hand-written accept loop as the hyper guide writes it (`ConnMeta::accepted` per
/// connection, `for_request` on each request, the drain layer): 4 kept-alive hyper clients at
/// about 130 requests a second for 16 s. The evidence counts their requests, as under
/// `lameduck::serve` — before, only the 4 connections were arrivals, so the report read a rate
/// of about 0.03 a second and blamed a sparse client (`too_sparse`, `new_path`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_accept_loop_with_for_request_gives_the_evidence_its_requests() {
    use hyper_util::server::conn::auto;
    use hyper_util::service::TowerToHyperService;
    use lameduck::report::WeakEvidence;
    use lameduck::ConnMeta;
    use tower_layer::Layer as _;
    use tower_service::Service;

    #[derive(Clone)]
    struct WithConnMeta<S> {
        conn: ConnMeta,
        inner: S,
    }
    impl<S: Service<http::Request<hyper::body::Incoming>>>
        Service<http::Request<hyper::body::Incoming>> for WithConnMeta<S>
    {
        type Response = S::Response;
        type Error = S::Error;
        type Future = S::Future;
        fn poll_ready(
            &mut self,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), S::Error>> {
            self.inner.poll_ready(cx)
        }
        fn call(&mut self, mut req: http::Request<hyper::body::Incoming>) -> S::Future {
            req.extensions_mut().insert(self.conn.for_request());
            self.inner.call(req)
        }
    }

    let drain = drain(secs(30), Propagation::default());
    #[derive(Clone)]
    struct Hello;
    impl Service<http::Request<hyper::body::Incoming>> for Hello {
        type Response = http::Response<http_body_util::Full<Bytes>>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Self::Response, Self::Error>>;
        fn poll_ready(
            &mut self,
            _cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), Self::Error>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn call(&mut self, _req: http::Request<hyper::body::Incoming>) -> Self::Future {
            std::future::ready(Ok(http::Response::new(http_body_util::Full::new(
                Bytes::from_static(b"hello"),
            ))))
        }
    }
    let hello = Hello;
    let service = drain.layer().layer(hello);
    let (listener, addr) = bind().await;
    drain.readiness().mark_serving();
    let (stop, counted) = (drain.moments().stopped_accepting(), drain.clone());
    let server = tokio::spawn(async move {
        let builder = auto::Builder::new(TokioExecutor::new());
        loop {
            let (stream, peer) = tokio::select! {
                () = stop.cancelled() => break,
                accepted = listener.accept() => accepted.unwrap(),
            };
            let per_connection = WithConnMeta {
                conn: ConnMeta::accepted(&counted, Some(peer)),
                inner: service.clone(),
            };
            let conn = builder
                .serve_connection(
                    hyper_util::rt::TokioIo::new(stream),
                    TowerToHyperService::new(per_connection),
                )
                .into_owned();
            tokio::spawn(conn);
        }
    });
    // 4 kept connections, one request each every 30 ms: about 133 a second, for 16.5 s, then
    // the drain; each client stops at the answer that tells its connection to close.
    let triggered = Arc::new(AtomicBool::new(false));
    let started = std::time::Instant::now();
    let mut clients = Vec::new();
    for _ in 0..4 {
        let triggered = Arc::clone(&triggered);
        clients.push(tokio::spawn(async move {
            let (mut sender, _conn) = h1(addr).await;
            let until = std::time::Instant::now() + ms(25_000);
            let (mut before, mut sent) = (0u32, 0u32);
            while std::time::Instant::now() < until && sent < 1_000 {
                if sender.ready().await.is_err() {
                    break; // closed after the drain's `Connection: close`
                }
                let Ok(res) = sender.send_request(get("/")).await else {
                    break;
                };
                res.into_body().collect().await.unwrap();
                sent += 1;
                if !triggered.load(Ordering::SeqCst) {
                    before += 1;
                }
                tokio::time::sleep(ms(30)).await;
            }
            before
        }));
    }
    tokio::time::sleep(ms(16_500)).await;
    triggered.store(true, Ordering::SeqCst);
    let elapsed = started.elapsed().as_secs_f64();
    assert!(drain.start(Trigger::Api));
    let mut sent = 0;
    for c in clients {
        sent += within("client", c).await.unwrap();
    }
    let client_rate = f64::from(sent) / elapsed;
    // The requests per second the report counted, once every connection handed in its last
    // second (at its close, after the drain's `Connection: close`).
    let ev = within("evidence", async {
        loop {
            if let Some(ev) = drain.status().evidence.filter(|ev| {
                ev.requests_per_1000s
                    .is_some_and(|r| r as f64 / 1000.0 >= client_rate * 0.9)
            }) {
                return ev;
            }
            tokio::time::sleep(ms(50)).await;
        }
    })
    .await;
    let counted = ev.requests_per_1000s.unwrap() as f64 / 1000.0;
    assert!(
        (counted - client_rate).abs() <= client_rate * 0.1,
        "counted {counted:.1}/s over {:?} s, the clients sent {client_rate:.1}/s ({sent} in {elapsed:.1} s): {ev:?}",
        ev.counted_seconds
    );
    assert!(ev.requests_seen, "{ev:?}");
    // Every 250 ms slot held requests: the rate is bounded by the slots, not 0.03.
    let rate = ev.rate_per_s().unwrap_or(0.0);
    assert!(rate > 4.0, "{rate} a second from {sent} requests: {ev:?}");
    assert!(
        !matches!(
            ev.weak,
            Some(WeakEvidence::TooSparse | WeakEvidence::NewPath)
        ),
        "{ev:?}"
    );
    drain.force();
    let _ = drain.drained().await;
    server.abort();
}
