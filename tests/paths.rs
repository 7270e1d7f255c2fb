//! Per-route accounting over real sockets: while draining, the layer splits the after-drain
//! counts by the `x-traffic-path` request header, bounded to the 16 most frequent labels plus
//! `other`.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;

use axum::routing::get;
use axum::Router;
use common::{bind, drain, secs, within};
use lameduck::{Phase, Propagation, Trigger};

/// One HTTP/1.1 request on `s` (kept open), its status line back; the body is read by length.
fn get_on(s: &mut TcpStream, path: Option<&str>) -> String {
    let header = path.map_or(String::new(), |p| format!("x-traffic-path: {p}\r\n"));
    write!(s, "GET / HTTP/1.1\r\nHost: t\r\n{header}\r\n").unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut status = String::new();
    r.read_line(&mut status).unwrap();
    let mut len = 0;
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).unwrap();
    status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_drain_counts_are_split_by_traffic_path() {
    let drain = drain(secs(30), Propagation::fixed(secs(3)));
    let (listener, addr) = bind().await;
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(drain.layer());
    let server = tokio::spawn(lameduck::serve(listener, app.with_state(()), &drain));
    within("serving", drain.moments().reached(Phase::Serving)).await;

    let counts = tokio::task::spawn_blocking({
        let drain = drain.clone();
        move || {
            // A pooled connection opened before the drain.
            let mut pooled = TcpStream::connect(addr).unwrap();
            assert!(get_on(&mut pooled, Some("ingress")).contains("200"));
            drain.start(Trigger::Api);
            // Reused connection, labelled: counts as `ingress`, reused.
            assert!(get_on(&mut pooled, Some("ingress")).contains("200"));
            // New connections by two routes, one unlabelled.
            for path in [Some("service"), Some("service"), Some("pod-ip"), None] {
                let mut fresh = TcpStream::connect(addr).unwrap();
                assert!(get_on(&mut fresh, path).contains("200"));
            }
            // Thirteen more distinct labels, once each: 16 in all, each kept.
            for i in 0..13 {
                let mut fresh = TcpStream::connect(addr).unwrap();
                let label = format!("route-{i}");
                assert!(get_on(&mut fresh, Some(&label)).contains("200"));
            }
        }
    })
    .await;
    counts.unwrap();
    let report = within("the drain", drain.drained()).await;
    within("serve returns", server).await.unwrap();
    let paths = &report.after_flip.paths;
    let find = |p: &str| {
        paths
            .iter()
            .find(|c| c.path == p)
            .unwrap_or_else(|| panic!("{p} in {paths:?}"))
    };
    assert_eq!(find("ingress").requests_on_reused_connections, 1);
    assert_eq!(find("ingress").requests_on_new_connections, 0);
    assert_eq!(find("service").requests_on_new_connections, 2);
    assert_eq!(find("pod-ip").requests_on_new_connections, 1);
    assert_eq!(paths.iter().filter(|c| c.path != "other").count(), 16);
    assert!(paths.iter().all(|c| c.path != "other"), "{paths:?}");
    // The unlabelled request is in the totals only.
    let labelled: u64 = paths
        .iter()
        .map(|c| c.requests_on_new_connections + c.requests_on_reused_connections)
        .sum();
    let total = report.after_flip.requests_on_new_connections
        + report.after_flip.requests_on_reused_connections;
    assert_eq!(labelled + 1, total);
}

/// Sends one request with `label` on a new connection to `addr`.
fn once(addr: std::net::SocketAddr, label: &str) {
    let mut fresh = TcpStream::connect(addr).unwrap();
    assert!(get_on(&mut fresh, Some(label)).contains("200"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn junk_labels_sent_first_do_not_push_the_real_routes_into_other() {
    let drain = drain(secs(30), Propagation::fixed(secs(3)));
    let (listener, addr) = bind().await;
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(drain.layer());
    let server = tokio::spawn(lameduck::serve(listener, app.with_state(()), &drain));
    within("serving", drain.moments().reached(Phase::Serving)).await;
    drain.start(Trigger::Api);

    let sent = tokio::task::spawn_blocking(move || {
        // A client squats the table: 16 junk labels before any real route.
        for i in 0..16 {
            once(addr, &format!("junk-{i}"));
        }
        // The real routes, three requests each.
        for _ in 0..3 {
            for route in ["ingress", "service", "pod-ip"] {
                once(addr, route);
            }
        }
        // And it keeps churning: twenty more junk labels, once each.
        for i in 16..36 {
            once(addr, &format!("junk-{i}"));
        }
    })
    .await;
    sent.unwrap();
    let report = within("the drain", drain.drained()).await;
    within("serve returns", server).await.unwrap();
    let paths = &report.after_flip.paths;
    for route in ["ingress", "service", "pod-ip"] {
        let c = paths
            .iter()
            .find(|c| c.path == route)
            .unwrap_or_else(|| panic!("{route} squatted out of {paths:?}"));
        assert_eq!(c.requests_on_new_connections, 3, "{c:?}");
    }
    // Still bounded, and nothing lost: every labelled request is in a label or in `other`.
    assert!(paths.iter().filter(|c| c.path != "other").count() <= 16);
    let labelled: u64 = paths.iter().map(|c| c.requests_on_new_connections).sum();
    assert_eq!(labelled, 16 + 9 + 20);
    // The most frequent first.
    assert!(
        paths[..3]
            .iter()
            .all(|c| c.requests_on_new_connections == 3),
        "{paths:?}"
    );
}
