//! gRPC over real sockets: a tonic client against `lameduck::serve` serving tonic routes (the
//! hand-written `slow.Slow` service and the standard health service) behind the drain layer.

mod common;
#[path = "../examples/support/slow.rs"]
mod slow;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use common::{bind, drain, eventually, has_event, ms, quiet_builder, secs, within};
use hyper_util::rt::TokioIo;
use lameduck::report::Outcome;
use lameduck::{Drain, EventKind, Phase, Propagation, ReadinessWhileDraining, Trigger};
use slow::{SlowClient, SlowServer};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tonic::service::Routes;
use tonic::transport::{Channel, Endpoint};
use tonic::Streaming;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

/// Connects to one address and counts the TCP connections it opens: the client-side evidence
/// that the channel reconnected.
#[derive(Clone)]
struct CountingConnector {
    addr: SocketAddr,
    connects: Arc<AtomicUsize>,
}

impl tower_service::Service<http::Uri> for CountingConnector {
    type Response = TokioIo<TcpStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: http::Uri) -> Self::Future {
        let (addr, connects) = (self.addr, Arc::clone(&self.connects));
        Box::pin(async move {
            let stream = TcpStream::connect(addr).await?;
            connects.fetch_add(1, Ordering::SeqCst);
            Ok(TokioIo::new(stream))
        })
    }
}

/// A 200 ms quiet window with a 200 ms floor, committing at `max` at the latest.
fn quiet_window(max: Duration) -> Propagation {
    Propagation::quiet(ms(200)).min(ms(200)).max(max)
}

/// Serves the slow service and the health service, behind the layer, on 127.0.0.1.
async fn start(drain: &Drain) -> (SocketAddr, JoinHandle<()>) {
    let (listener, addr) = bind().await;
    let (_reporter, health) = lameduck::grpc::health(drain, [slow::SERVICE]);
    let app = Routes::new(health)
        .add_service(SlowServer)
        .prepare()
        .into_axum_router()
        .layer(drain.layer());
    // The service reports the connection id of each call: it reads `ConnMeta` while Serving.
    let server = tokio::spawn(lameduck::serve(listener, app, drain).conn_meta_on_every_request());
    (addr, server)
}

fn connect(addr: SocketAddr) -> (Channel, Arc<AtomicUsize>) {
    connect_as(addr, None)
}

/// A channel sending `user_agent` (tonic appends its own token, as grpc-go does for kubelet).
fn connect_as(addr: SocketAddr, user_agent: Option<&'static str>) -> (Channel, Arc<AtomicUsize>) {
    let connects = Arc::new(AtomicUsize::new(0));
    let connector = CountingConnector {
        addr,
        connects: Arc::clone(&connects),
    };
    let mut endpoint = Endpoint::from_static("http://127.0.0.1");
    if let Some(ua) = user_agent {
        endpoint = endpoint.user_agent(ua).expect("a valid user agent");
    }
    let channel = endpoint.connect_with_connector_lazy(connector);
    (channel, connects)
}

async fn status(health: &mut HealthClient<Channel>, service: &str) -> ServingStatus {
    for _ in 0..UNSENT_RETRIES {
        let request = HealthCheckRequest {
            service: service.to_owned(),
        };
        match health.check(request).await {
            Ok(reply) => return reply.into_inner().status(),
            Err(status) if never_processed(&status) => continue,
            Err(status) => panic!("health check failed: {status:?}"),
        }
    }
    panic!("health check refused {UNSENT_RETRIES} tries")
}

async fn sleep(client: &mut SlowClient, millis: u64) -> slow::SleepReply {
    for _ in 0..UNSENT_RETRIES {
        match client.sleep(millis).await {
            Ok(reply) => return reply,
            Err(status) if never_processed(&status) => continue,
            Err(status) => panic!("Sleep failed: {status:?}"),
        }
    }
    panic!("Sleep refused {UNSENT_RETRIES} tries")
}

/// An RPC the server never processed, which gRPC clients may retry without knowing whether it
/// is idempotent ("transparent retry"; tonic's channel does not do it). Two races with a
/// GOAWAY produce one:
/// * the request was queued for a connection that closed after its GOAWAY: hyper reports it
///   canceled — never sent;
/// * the request went out after the server's final GOAWAY: HTTP/2 says a stream above the
///   GOAWAY's last stream id was not processed, and h2 fails it with `GoAway(NO_ERROR)`.
fn never_processed(status: &tonic::Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        if let Some(e) = e.downcast_ref::<hyper::Error>() {
            if e.is_canceled() {
                return true;
            }
        }
        if let Some(e) = e.downcast_ref::<h2::Error>() {
            return e.is_go_away() && e.is_remote() && e.reason() == Some(h2::Reason::NO_ERROR);
        }
        source = e.source();
    }
    false
}

/// Bounds the retry loops; one retry is enough in practice.
const UNSENT_RETRIES: usize = 3;

/// Asks until the health service says `want` for `service` (its status is set by a task, so
/// the first answer may predate the phase change); bounded by the common patience.
async fn wait_status(health: &mut HealthClient<Channel>, service: &str, want: ServingStatus) {
    within(&format!("{service:?} to be {want:?}"), async {
        while status(health, service).await != want {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// Opens a `Watch` on the slow service; its first message says SERVING.
async fn watch_serving(health: &mut HealthClient<Channel>) -> Streaming<HealthCheckResponse> {
    let mut watch = health
        .watch(HealthCheckRequest {
            service: slow::SERVICE.to_owned(),
        })
        .await
        .expect("watch opened")
        .into_inner();
    let first = next_status(&mut watch, "the first watch message").await;
    assert_eq!(first, ServingStatus::Serving);
    watch
}

/// The next message of a watch: it comes, and it is not an error.
async fn next_status(watch: &mut Streaming<HealthCheckResponse>, what: &str) -> ServingStatus {
    within(what, watch.message())
        .await
        .expect("no error")
        .expect("a message")
        .status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_rpc_finishes_then_channel_reconnects_and_is_served_while_draining() {
    let drain = drain(
        secs(30),
        // The process is seconds old: too young for an arrival rate, so without a floor the
        // policy would rightly wait to max.
        quiet_window(secs(20)).quiet_suffices_after(ms(200)),
    );
    let (addr, server) = start(&drain).await;
    let (channel, connects) = connect(addr);
    let mut client = SlowClient::new(channel.clone());
    let mut health = HealthClient::new(channel);

    wait_status(&mut health, "", ServingStatus::Serving).await;
    wait_status(&mut health, slow::SERVICE, ServingStatus::Serving).await;
    let first = sleep(&mut client, 0).await;
    assert_ne!(first.connection, 0, "serve attaches ConnMeta");
    assert_eq!(connects.load(Ordering::SeqCst), 1);

    // An RPC in flight when the drain starts.
    let mut slow_client = client.clone();
    let in_flight = tokio::spawn(async move { slow_client.sleep(1500).await });
    eventually("the slow RPC to be in flight", || {
        drain.counts().in_flight() == 1
    })
    .await;
    // The quiet window never commits while something is in flight: this guard keeps the drain
    // in Draining (listener accepting) until the test has seen what it came for.
    let hold = drain.enter();
    assert!(drain.start(Trigger::Api));
    assert!(
        drain.counts().in_flight() >= 2,
        "the slow RPC was in flight at the trigger"
    );

    let reply = within("the in-flight RPC", in_flight)
        .await
        .unwrap()
        .expect("the in-flight RPC finishes OK after the trigger");
    assert_eq!(reply.slept_millis, 1500);
    assert_eq!(reply.connection, first.connection);

    // GOAWAY went out at the trigger: the connection closes once its last stream is done.
    eventually("the old connection to close", || {
        drain.counts().connections() == 0
    })
    .await;

    // The same channel reconnects, and the listener still accepts while draining.
    let after = within("an RPC after the GOAWAY", sleep(&mut client, 0)).await;
    assert_ne!(
        after.connection, first.connection,
        "served on a new connection"
    );
    assert_eq!(
        connects.load(Ordering::SeqCst),
        2,
        "the channel reconnected once"
    );
    assert_eq!(drain.phase(), Phase::Draining);

    // A client that was never connected gets through too.
    let (fresh, _) = connect(addr);
    let mut fresh = SlowClient::new(fresh);
    within("a new client while draining", sleep(&mut fresh, 0)).await;

    // Health: NOT_SERVING from the drain's start.
    wait_status(&mut health, "", ServingStatus::NotServing).await;
    wait_status(&mut health, slow::SERVICE, ServingStatus::NotServing).await;
    assert_eq!(drain.phase(), Phase::Draining);

    drop(hold);
    drop((client, health, fresh));
    let report = within("the drain", drain.drained()).await;
    assert_eq!(report.outcome, Outcome::Clean, "{}", report.to_json());
    assert!(report.stragglers.is_empty());
    assert!(report.after_flip.new_connections >= 2);
    assert!(report.after_flip.requests_on_new_connections >= 2);
    assert!(has_event(&drain, EventKind::InFlightZero));
    within("serve to return", server).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_watch_sees_not_serving_at_drain_start_and_ends_at_stopped_accepting() {
    // A fixed delay: an open Watch counts as in flight, and would hold a quiet window to `max`.
    let drain = drain(secs(30), Propagation::fixed(ms(300)));
    let (addr, server) = start(&drain).await;
    let (channel, _) = connect(addr);
    let mut health = HealthClient::new(channel);
    wait_status(&mut health, slow::SERVICE, ServingStatus::Serving).await;

    let mut watch = watch_serving(&mut health).await;

    assert!(drain.start(Trigger::Api));
    let mut after_trigger = Vec::new();
    let ended = within("the watch to end", async {
        loop {
            match watch.message().await {
                Ok(Some(m)) => after_trigger.push(m.status()),
                Ok(None) => break Ok(()),
                Err(status) => break Err(status),
            }
        }
    })
    .await;
    ended.expect("the watch ends with status OK, not an error");
    assert!(
        has_event(&drain, EventKind::StoppedAccepting),
        "the watch ended at stopped_accepting, not before"
    );
    assert!(!after_trigger.is_empty());
    assert!(
        after_trigger
            .iter()
            .all(|s| *s == ServingStatus::NotServing),
        "{after_trigger:?}"
    );

    // The watch did not hold the drain: it ends clean, nothing cut at the deadline.
    let report = within("the drain", drain.drained()).await;
    assert_eq!(report.outcome, Outcome::Clean, "{}", report.to_json());
    assert!(report.stragglers.is_empty());
    drop(health);
    within("serve to return", server).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_startup_gates_and_the_serving_until_stop_policy() {
    let drain = quiet_builder()
        .grace_period(secs(30))
        .propagation(quiet_window(secs(3)))
        .readiness_while_draining(ReadinessWhileDraining::ServingUntilStop)
        .build()
        .unwrap();
    let warmup = drain.readiness().startup_gate("warmup");
    let (addr, server) = start(&drain).await;
    let (channel, _) = connect(addr);
    let mut health = HealthClient::new(channel);

    // Starting: not serving until every gate is open.
    wait_status(&mut health, "", ServingStatus::NotServing).await;
    assert_eq!(drain.phase(), Phase::Starting);
    warmup.open();
    wait_status(&mut health, "", ServingStatus::Serving).await;

    // Draining under ServingUntilStop: still serving while the guard keeps the drain there.
    // Asked on new connections: the old one got its GOAWAY at the trigger.
    let hold = drain.enter();
    assert!(drain.start(Trigger::Api));
    let (fresh, _) = connect(addr);
    let mut fresh = HealthClient::new(fresh);
    assert_eq!(status(&mut fresh, "").await, ServingStatus::Serving);
    assert_eq!(
        status(&mut fresh, slow::SERVICE).await,
        ServingStatus::Serving
    );
    // Its own connection: a connection accepted while draining gets its GOAWAY with its first
    // request, and a watch is not retried like the checks above.
    let mut watch = watch_serving(&mut HealthClient::new(connect(addr).0)).await;
    assert_eq!(drain.phase(), Phase::Draining);

    // The open watch counts as in flight, so the quiet window commits at `max`; then the watch
    // gets its last NOT_SERVING and ends.
    drop(hold);
    let last = next_status(&mut watch, "the watch's last message").await;
    assert_eq!(last, ServingStatus::NotServing);
    assert!(has_event(&drain, EventKind::StoppedAccepting));
    let end = within("the watch to end", watch.message()).await;
    assert!(matches!(end, Ok(None)), "ends with OK: {end:?}");

    let report = within("the drain", drain.drained()).await;
    assert_eq!(report.outcome, Outcome::Clean, "{}", report.to_json());
    drop((health, fresh));
    within("serve to return", server).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_under_auto_keeps_kubelet_serving_and_tells_everyone_else_at_once() {
    let drain = drain(
        secs(30),
        quiet_window(secs(3)).quiet_suffices_after(Duration::ZERO),
    );
    assert_eq!(drain.readiness().policy(), ReadinessWhileDraining::Auto);
    let (addr, server) = start(&drain).await;
    let mut other = HealthClient::new(connect(addr).0);
    wait_status(&mut other, slow::SERVICE, ServingStatus::Serving).await;
    let mut watch = watch_serving(&mut other).await;

    let hold = drain.enter();
    assert!(drain.start(Trigger::Api));
    // A load balancer's watch hears NOT_SERVING at the trigger.
    let flip = next_status(&mut watch, "NOT_SERVING on the watch").await;
    assert_eq!(flip, ServingStatus::NotServing);
    assert_eq!(drain.phase(), Phase::Draining);

    // Checks on new connections: kubelet's probe still sees SERVING, anyone else does not.
    let mut kubelet = HealthClient::new(connect_as(addr, Some("kube-probe/1.31")).0);
    assert_eq!(status(&mut kubelet, "").await, ServingStatus::Serving);
    assert_eq!(
        status(&mut kubelet, slow::SERVICE).await,
        ServingStatus::Serving
    );
    let mut lb = HealthClient::new(connect_as(addr, Some("envoy/1.30")).0);
    assert_eq!(status(&mut lb, "").await, ServingStatus::NotServing);
    assert_eq!(drain.phase(), Phase::Draining);

    // At stopped_accepting the watch ends, without repeating itself.
    drop(hold);
    let end = within("the watch to end", watch.message()).await;
    assert!(matches!(end, Ok(None)), "ends with OK: {end:?}");
    assert!(has_event(&drain, EventKind::StoppedAccepting));
    let report = within("the drain", drain.drained()).await;
    assert_eq!(report.outcome, Outcome::Clean, "{}", report.to_json());
    drop((other, kubelet, lb));
    within("serve to return", server).await.unwrap();
}
