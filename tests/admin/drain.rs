//! `/drain`: each `wait`, the timeout, idempotence under concurrent calls, and `POST`.

use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::{BodyExt, Full};
use lameduck::{EventKind, Phase, Trigger};

use crate::common::{event_count, within};
use crate::{drain_call, get, request, send, serve_with_token, serving, TOKEN};

#[tokio::test]
async fn drain_wait_none_answers_202_at_once() {
    let drain = serving();
    let addr = serve_with_token(&drain).await;
    let guard = drain.enter();
    let a = drain_call(addr, "/drain?wait=none").await;
    assert_eq!(a.status, StatusCode::ACCEPTED);
    assert_eq!(a.headers["content-type"], "application/json");
    let s = a.json();
    assert!(s.phase.is_draining());
    assert_eq!(s.trigger, Some(Trigger::PreStop));
    // A guard is held, so the drain cannot be past StoppedAccepting yet.
    assert!(s.phase <= Phase::StoppedAccepting, "{:?}", s.phase);
    assert_eq!(
        drain.moments().timeline()[0].trigger,
        Some(Trigger::PreStop)
    );
    drop(guard);
    assert_eq!(drain.drained().await.exit_code, 0);
}

#[tokio::test]
async fn drain_wait_propagated_answers_after_stopped_accepting() {
    let drain = serving();
    let addr = serve_with_token(&drain).await;
    let guard = drain.enter();
    let a = drain_call(addr, "/drain?wait=propagated").await;
    assert_eq!(a.status, StatusCode::OK);
    let s = a.json();
    assert_eq!(s.phase, Phase::StoppedAccepting);
    assert!(s
        .timeline
        .iter()
        .any(|e| e.event == EventKind::StoppedAccepting));
    drop(guard);
    drain.drained().await;
}

#[tokio::test]
async fn drain_waits_for_the_whole_drain_by_default() {
    let drain = serving();
    let addr = serve_with_token(&drain).await;
    let guard = drain.enter();
    let pending = tokio::spawn(drain_call(addr, "/drain"));
    drain.moments().reached(Phase::StoppedAccepting).await;
    drop(guard);
    let a = within("the /drain answer", pending).await.unwrap();
    assert_eq!(a.status, StatusCode::OK);
    // Synchronisation point: the answer's own snapshot, taken as it was written. It says
    // done with nothing in flight, which the drain cannot reach before the guard's drop, so
    // the answer did not come at stopped_accepting (as `wait=propagated` would).
    let s = a.json();
    assert_eq!((s.phase, s.in_flight), (Phase::Done, 0));
    assert!(s
        .timeline
        .iter()
        .any(|e| e.event == EventKind::InFlightZero));
    assert!(s.timeline.iter().any(|e| e.event == EventKind::Done));
    assert_eq!(drain.report().unwrap().exit_code, 0);

    // Once done, wait=drained answers at once.
    let a = drain_call(addr, "/drain?wait=drained").await;
    assert_eq!((a.status, a.json().phase), (StatusCode::OK, Phase::Done));
}

#[tokio::test]
async fn drain_timeout_answers_504_and_the_drain_goes_on() {
    let drain = serving();
    let addr = serve_with_token(&drain).await;
    let guard = drain.enter();
    let a = drain_call(addr, "/drain?wait=drained&timeout=200ms").await;
    assert_eq!(a.status, StatusCode::GATEWAY_TIMEOUT);
    let s = a.json();
    assert!(
        s.phase.is_draining() && s.phase < Phase::Done,
        "{:?}",
        s.phase
    );
    assert_eq!(s.in_flight, 1);

    // The drain went on without the caller.
    assert_eq!(
        get(addr, "/readyz").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(get(addr, "/livez").await.status, StatusCode::OK);
    drop(guard);
    let report = within("the drain", drain.drained()).await;
    assert_eq!(report.exit_code, 0);
    assert_eq!(event_count(&drain, EventKind::DrainStarted), 1);
}

#[tokio::test]
async fn drain_is_idempotent_under_50_concurrent_calls() {
    let drain = serving();
    let addr = serve_with_token(&drain).await;
    let calls: Vec<_> = (0..50)
        .map(|i| {
            let target = if i % 2 == 0 {
                "/drain?wait=none"
            } else {
                "/drain"
            };
            tokio::spawn(drain_call(addr, target))
        })
        .collect();
    for (i, call) in calls.into_iter().enumerate() {
        let a = call.await.unwrap();
        let want = if i % 2 == 0 {
            StatusCode::ACCEPTED
        } else {
            StatusCode::OK
        };
        assert_eq!(a.status, want, "{}", a.body);
    }
    drain.drained().await;
    assert_eq!(event_count(&drain, EventKind::DrainStarted), 1);
    let repeats: Vec<_> = drain
        .moments()
        .timeline()
        .into_iter()
        .filter(|e| e.event == EventKind::SignalReceived)
        .collect();
    // The 49 repeats collapse into one event with a count.
    assert_eq!(repeats.len(), 1);
    assert_eq!(repeats[0].count, Some(49));
    assert!(repeats.iter().all(|e| e.trigger == Some(Trigger::PreStop)));
    assert_eq!(drain.report().unwrap().trigger, Some(Trigger::PreStop));
}

#[tokio::test]
async fn drain_accepts_post_and_ignores_a_small_body() {
    let drain = serving();
    let addr = serve_with_token(&drain).await;
    let req = request(Method::POST, addr, "/drain?wait=none&timeout=5s")
        .header("authorization", format!("bearer {TOKEN}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{}")).boxed())
        .unwrap();
    let a = send(addr, req).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
    drain.drained().await;
}
