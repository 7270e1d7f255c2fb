//! `use lameduck::*;` beside the crates a service also names — `axum`, `http`, `hyper`,
//! `metrics`, `kube`: none of the crate's public names shadows theirs (E0659 "`axum` is
//! ambiguous" when it had public modules `axum` and `http`). Compiling this file is the test.
#![cfg(feature = "admin")] // the app is an axum Router

use lameduck::*;

use axum::{routing::get, Router};
use http::{HeaderName, StatusCode};
#[cfg(feature = "kube")]
#[allow(unused_imports)] // the name resolving is the test
use kube::Client as _;
#[cfg(feature = "metrics")]
use metrics::gauge;

#[tokio::test]
async fn a_glob_import_leaves_axum_http_and_metrics_alone() {
    let drain = Drain::builder()
        .propagation(Propagation::fixed(std::time::Duration::ZERO))
        .signals(Signals::none())
        .report_to_stderr(false)
        .termination_log(None)
        .build()
        .unwrap();
    let layer: DrainLayer = drain
        .layer()
        .phase_header(HeaderName::from_static("x-phase"));
    let app: Router = Router::new()
        .route("/", get(|| async { StatusCode::OK }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    // Both serve functions and their futures, by their public names.
    let serve: server::Serve<Router> = lameduck::serve(listener, app.clone(), &drain);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let axum_serve: server::AxumServe = lameduck::axum_serve(listener, app, &drain);
    #[cfg(feature = "metrics")]
    gauge!(drain_metrics::IN_FLIGHT_REQUESTS).set(0.0);
    drain.start(Trigger::Api);
    let ((), ()) = tokio::join!(serve, axum_serve);
    assert_eq!(drain.drained().await.outcome, report::Outcome::Clean);
}
