//! `/livez`, `/readyz` and `/status` through the whole lifecycle, and the router over HTTP/2.

use std::time::Duration;

use http::{Method, Request, StatusCode};
use http_body_util::Empty;
use lameduck::{EventKind, Phase, Propagation, ReadinessWhileDraining, Status, Trigger};

use crate::common::{h2, text, within};
use crate::{
    builder, empty, get, request, send, serve_open, serve_with_token, serving, Answer, TOKEN,
};

#[tokio::test]
async fn livez_answers_ok_through_the_whole_lifecycle() {
    let drain = builder().build().unwrap();
    let gate = drain.readiness().startup_gate("cache-warmup");
    let addr = serve_open(&drain).await;

    let mut seen = Vec::new();
    let check = |a: Answer| {
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.body, "ok");
    };
    check(get(addr, "/livez").await);
    seen.push(drain.phase());
    gate.open();
    check(get(addr, "/livez").await);
    seen.push(drain.phase());

    let guard = drain.enter();
    drain.start(Trigger::Api);
    check(get(addr, "/livez").await);
    drain.moments().reached(Phase::StoppedAccepting).await;
    check(get(addr, "/livez").await);
    seen.push(drain.phase());
    drop(guard);
    drain.drained().await;
    check(get(addr, "/livez").await);
    seen.push(drain.phase());
    assert_eq!(
        seen,
        [
            Phase::Starting,
            Phase::Serving,
            Phase::StoppedAccepting,
            Phase::Done
        ]
    );

    let head = send(
        addr,
        request(Method::HEAD, addr, "/livez").body(empty()).unwrap(),
    )
    .await;
    assert_eq!(head.status, StatusCode::OK);
    assert_eq!(head.body, "");
    let verbose = get(addr, "/livez?verbose").await;
    assert_eq!(verbose.status, StatusCode::OK);
    assert_eq!(verbose.body, "[+]ping ok\nlivez check passed\n");
    assert_eq!(verbose.headers["cache-control"], "no-store");
}

#[tokio::test]
async fn readyz_follows_starting_serving_draining() {
    let drain = builder().build().unwrap();
    let gate = drain.readiness().startup_gate("cache-warmup");
    let addr = serve_open(&drain).await;

    let a = get(addr, "/readyz").await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(a.body, "starting: waiting for cache-warmup");
    let a = get(addr, "/readyz?verbose").await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        a.body.contains("[-]gate cache-warmup waiting\n"),
        "{}",
        a.body
    );
    assert!(
        a.body
            .ends_with("readyz check failed: starting: waiting for cache-warmup\n"),
        "{}",
        a.body
    );

    gate.open();
    let a = get(addr, "/readyz").await;
    assert_eq!((a.status, a.body.as_str()), (StatusCode::OK, "ok"));
    let a = get(addr, "/readyz?verbose=1").await;
    assert_eq!(a.status, StatusCode::OK);
    let lines: Vec<&str> = a.body.lines().collect();
    assert_eq!(
        lines,
        [
            "[+]gate cache-warmup ok",
            "[+]drain ok",
            "readyz check passed"
        ]
    );
    let head = send(
        addr,
        request(Method::HEAD, addr, "/readyz")
            .body(empty())
            .unwrap(),
    )
    .await;
    assert_eq!(head.status, StatusCode::OK);

    let guard = drain.enter();
    drain.start(Trigger::Api);
    let a = get(addr, "/readyz").await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(a.body, "draining");
    let a = get(addr, "/readyz?verbose").await;
    assert!(a.body.contains("[-]drain "), "{}", a.body);
    assert!(
        a.body.ends_with("readyz check failed: draining\n"),
        "{}",
        a.body
    );
    drop(guard);
    drain.drained().await;
    assert_eq!(
        get(addr, "/readyz").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
}

#[tokio::test]
async fn readyz_stays_ready_until_stop_under_serving_until_stop() {
    let drain = builder()
        .propagation(Propagation::fixed(Duration::from_secs(2)))
        .readiness_while_draining(ReadinessWhileDraining::ServingUntilStop)
        .build()
        .unwrap();
    drain.readiness().mark_serving();
    let addr = serve_open(&drain).await;
    let guard = drain.enter();
    drain.start(Trigger::Api);
    let a = get(addr, "/readyz").await;
    // Only meaningful if the answer came before the fixed propagation delay ran out.
    if drain.phase() == Phase::Draining {
        assert_eq!((a.status, a.body.as_str()), (StatusCode::OK, "ok"));
    }
    drain.moments().reached(Phase::StoppedAccepting).await;
    let a = get(addr, "/readyz").await;
    assert_eq!(
        (a.status, a.body.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "draining")
    );
    drop(guard);
    drain.drained().await;
}

#[tokio::test]
async fn readyz_reports_a_failing_check() {
    let drain = serving();
    drain
        .readiness()
        .check("local-disk", || Err("full".to_owned()));
    let addr = serve_open(&drain).await;
    let a = get(addr, "/readyz").await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(a.body, "check local-disk failed: full");
    let a = get(addr, "/readyz?verbose").await;
    assert!(
        a.body.contains("[-]local-disk failed: full\n"),
        "{}",
        a.body
    );
}

#[tokio::test]
async fn status_reports_phase_counts_and_timeline() {
    let drain = serving();
    let addr = serve_open(&drain).await;
    let guard = drain.enter();
    let a = get(addr, "/status").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.headers["content-type"], "application/json");
    let s = a.json();
    assert_eq!(s.phase, Phase::Serving);
    assert!(s.ready);
    assert_eq!(s.in_flight, 1);
    assert_eq!(s.budget.grace_ms, 20_000);
    assert!(s.timeline.is_empty());
    let head = send(
        addr,
        request(Method::HEAD, addr, "/status")
            .body(empty())
            .unwrap(),
    )
    .await;
    assert_eq!((head.status, head.body.as_str()), (StatusCode::OK, ""));

    drain.start(Trigger::Api);
    drain.moments().reached(Phase::StoppedAccepting).await;
    let s = get(addr, "/status").await.json();
    assert_eq!(s.phase, Phase::StoppedAccepting);
    assert_eq!(s.trigger, Some(Trigger::Api));
    assert!(!s.ready);
    let events: Vec<EventKind> = s.timeline.iter().map(|e| e.event).collect();
    assert!(events.starts_with(&[EventKind::DrainStarted]), "{events:?}");
    assert!(events.contains(&EventKind::StoppedAccepting), "{events:?}");
    drop(guard);
    drain.drained().await;
}

#[tokio::test]
async fn admin_answers_over_http2() {
    let drain = serving();
    let addr = serve_with_token(&drain).await;
    let (mut tx, _conn) = h2(addr).await;
    let mut call = |target: &str, auth: bool| {
        let mut req = Request::builder()
            .uri(format!("http://{addr}{target}"))
            .version(http::Version::HTTP_2);
        if auth {
            req = req.header("authorization", format!("Bearer {TOKEN}"));
        }
        let fut = tx.send_request(req.body(Empty::new()).unwrap());
        async move {
            let (status, _, body) = text(within("an HTTP/2 answer", fut).await.unwrap()).await;
            (status, body)
        }
    };
    assert_eq!(
        call("/livez", false).await,
        (StatusCode::OK, "ok".to_owned())
    );
    assert_eq!(call("/drain", false).await.0, StatusCode::UNAUTHORIZED);
    let (status, body) = call("/drain?wait=drained&timeout=15s", true).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let s: Status = serde_json::from_str(&body).unwrap();
    assert_eq!(s.phase, Phase::Done);
    assert_eq!(
        call("/readyz", false).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
}

/// `GET /readyz` with `User-Agent: ua`.
async fn readyz_as(addr: std::net::SocketAddr, ua: &str) {
    let req = crate::request(http::Method::GET, addr, "/readyz")
        .header(http::header::USER_AGENT, ua)
        .body(crate::empty())
        .unwrap();
    crate::send(addr, req).await;
}

#[tokio::test]
async fn kubelet_and_load_balancers_keep_their_rows_in_a_table_squatted_by_other_agents() {
    let drain = crate::serving();
    let addr = crate::serve_open(&drain).await;
    // Twenty distinct agents first, each more often than kubelet will call.
    for i in 0..20 {
        for _ in 0..3 {
            readyz_as(addr, &format!("squatter-{i}/1.0")).await;
        }
    }
    readyz_as(addr, "kube-probe/1.34").await;
    readyz_as(addr, "GoogleHC/1.0").await;
    // And more squatters after them: they must not push kubelet or GoogleHC out.
    for i in 20..40 {
        readyz_as(addr, &format!("squatter-{i}/1.0")).await;
    }
    let status = crate::get(addr, "/status").await.json();
    let rows = &status.probe_sources.sources;
    let find = |ua: &str| rows.iter().find(|s| s.user_agent == ua);
    let kubelet =
        find("kube-probe/1.34").unwrap_or_else(|| panic!("kubelet's row is missing: {rows:#?}"));
    assert_eq!(kubelet.classified_as, lameduck::report::ProbeClass::Kubelet);
    assert_eq!(kubelet.requests, 1);
    assert!(
        find("GoogleHC/1.0").is_some(),
        "GoogleHC's row is missing: {rows:#?}"
    );
    assert!(rows.len() <= 16, "{} rows", rows.len());
    // Every call is counted once: in a row or as unlisted.
    let counted: u64 =
        rows.iter().map(|s| s.requests).sum::<u64>() + status.probe_sources.unlisted_requests;
    assert_eq!(counted, 20 * 3 + 2 + 20);
}
