//! The drain as metrics: gauges sampled at every phase, histograms at Done, nothing per
//! request, the periodic updater, and (feature `prometheus`) `GET /metrics` over real HTTP.
//!
//! Each test installs its own recorder for its thread and runs a current-thread runtime on
//! that thread, so the drain's driver records into it and tests cannot see each other.
#![cfg(feature = "metrics")]

mod common;

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::quiet_builder;
use lameduck::drain_metrics::{
    BACKGROUND_TASKS, DRAIN_DURATION_SECONDS, IN_FLIGHT_REQUESTS, OBSERVED_PROPAGATION_SECONDS,
    OPEN_CONNECTIONS, PHASE, REQUESTS_AFTER_FLIP_TOTAL,
};
use lameduck::AdminBuilder;
use lameduck::Metrics;
use lameduck::{DrainBuilder, Phase, Propagation, Trigger};
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::{CompositeKey, MetricKind};

/// Upper bound for waits; generous, never a timing assertion.
const BOUND: Duration = Duration::from_secs(60);

/// A debugging recorder that also counts every call made to it, to prove what does *not*
/// reach the recorder.
struct Counting {
    inner: DebuggingRecorder,
    calls: AtomicUsize,
}

impl Counting {
    fn new() -> Self {
        Counting {
            inner: DebuggingRecorder::new(),
            calls: AtomicUsize::new(0),
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn tick(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
    }
}

impl Recorder for Counting {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.tick();
        self.inner.describe_counter(key, unit, description);
    }
    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.tick();
        self.inner.describe_gauge(key, unit, description);
    }
    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.tick();
        self.inner.describe_histogram(key, unit, description);
    }
    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        self.tick();
        self.inner.register_counter(key, metadata)
    }
    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        self.tick();
        self.inner.register_gauge(key, metadata)
    }
    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        self.tick();
        self.inner.register_histogram(key, metadata)
    }
}

type Entry = (CompositeKey, Option<Unit>, Option<SharedString>, DebugValue);

/// One reading of the recorder. The debugging recorder resets what it reports (gauges and
/// counters to zero, histograms emptied), so a test takes one reading per checkpoint.
struct Reading(Vec<Entry>);

impl Reading {
    fn take(snap: &Snapshotter) -> Self {
        Reading(snap.snapshot().into_vec())
    }

    fn entry(&self, kind: MetricKind, name: &str, label: Option<(&str, &str)>) -> Option<&Entry> {
        self.0.iter().find(|(k, _, _, _)| {
            k.kind() == kind
                && k.key().name() == name
                && label
                    .is_none_or(|(l, v)| k.key().labels().any(|x| x.key() == l && x.value() == v))
        })
    }

    fn gauge(&self, name: &str) -> f64 {
        match self.entry(MetricKind::Gauge, name, None) {
            Some((_, _, _, DebugValue::Gauge(v))) => v.into_inner(),
            other => panic!("gauge {name}: {other:?}"),
        }
    }

    fn counter(&self, name: &str, label: (&str, &str)) -> u64 {
        match self.entry(MetricKind::Counter, name, Some(label)) {
            Some((_, _, _, DebugValue::Counter(v))) => *v,
            other => panic!("counter {name}: {other:?}"),
        }
    }

    /// The samples of a histogram; `None` when it was never recorded.
    fn histogram(&self, name: &str, label: Option<(&str, &str)>) -> Option<Vec<f64>> {
        match self.entry(MetricKind::Histogram, name, label) {
            Some((_, _, _, DebugValue::Histogram(v))) => {
                Some(v.iter().map(|x| x.into_inner()).collect())
            }
            None => None,
            other => panic!("histogram {name}: {other:?}"),
        }
    }

    /// Phase, in-flight, tasks, connections.
    fn gauges(&self) -> (f64, f64, f64, f64) {
        (
            self.gauge(PHASE),
            self.gauge(IN_FLIGHT_REQUESTS),
            self.gauge(BACKGROUND_TASKS),
            self.gauge(OPEN_CONNECTIONS),
        )
    }
}

/// Runs `test` on a paused current-thread runtime, with `recorder` as this thread's recorder:
/// the drain's driver is a task of that runtime, so it records there too.
fn paused<F: Future>(recorder: &dyn Recorder, test: F) -> F::Output {
    let _local = metrics::set_default_local_recorder(recorder);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
        .block_on(test)
}

/// Grace 30 s, a fixed 1 s propagation delay.
fn builder() -> DrainBuilder {
    quiet_builder()
        .grace_period(Duration::from_secs(30))
        .propagation(Propagation::fixed(Duration::from_secs(1)))
}

async fn bounded<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(BOUND, f)
        .await
        .unwrap_or_else(|_| panic!("{what} within the bound"))
}

#[test]
fn gauges_follow_every_phase_of_a_drain() {
    let recorder = Counting::new();
    let snap = recorder.inner.snapshotter();
    paused(&recorder, async {
        let drain = builder().build().unwrap();
        let gate = drain.readiness().startup_gate("warmup");

        // Built: described and sampled once.
        let r = Reading::take(&snap);
        assert_eq!(r.gauges(), (0.0, 0.0, 0.0, 0.0), "starting");
        for name in [
            IN_FLIGHT_REQUESTS,
            OPEN_CONNECTIONS,
            BACKGROUND_TASKS,
            PHASE,
        ] {
            let (_, unit, description, _) = r.entry(MetricKind::Gauge, name, None).unwrap();
            assert!(description.is_some(), "{name} is described");
            if name != PHASE {
                assert_eq!(*unit, Some(Unit::Count), "{name}");
            }
        }
        assert_eq!(
            r.counter(REQUESTS_AFTER_FLIP_TOTAL, ("connection", "new")),
            0
        );
        assert_eq!(
            r.counter(REQUESTS_AFTER_FLIP_TOTAL, ("connection", "reused")),
            0
        );

        gate.open();
        assert_eq!(Reading::take(&snap).gauge(PHASE), 1.0, "serving");

        let (finish_task, task_may_end) = tokio::sync::oneshot::channel::<()>();
        drain.work().spawn("flush", async {
            let _ = task_may_end.await;
        });
        let (finish_closer, closer_may_end) = tokio::sync::oneshot::channel::<()>();
        drain.work().on_close("db", || async {
            let _ = closer_may_end.await;
            Ok::<_, std::io::Error>(())
        });
        let first = drain.enter();
        let second = drain.enter();

        assert!(drain.start(Trigger::Api));
        let r = Reading::take(&snap);
        assert_eq!(r.gauges(), (2.0, 2.0, 1.0, 0.0), "draining");

        bounded(
            "stopped_accepting",
            drain.moments().reached(Phase::StoppedAccepting),
        )
        .await;
        let r = Reading::take(&snap);
        assert_eq!(r.gauges(), (3.0, 2.0, 1.0, 0.0), "stopped_accepting");

        drop(first);
        drop(second);
        finish_task.send(()).unwrap();
        bounded("closing", drain.moments().reached(Phase::Closing)).await;
        let r = Reading::take(&snap);
        assert_eq!(r.gauges(), (4.0, 0.0, 0.0, 0.0), "closing");
        assert_eq!(
            r.histogram(DRAIN_DURATION_SECONDS, None),
            None,
            "the duration is recorded at Done, not before"
        );

        finish_closer.send(()).unwrap();
        let report = bounded("done", drain.drained()).await;
        let r = Reading::take(&snap);
        assert_eq!(r.gauges(), (5.0, 0.0, 0.0, 0.0), "done");

        let duration = r
            .histogram(DRAIN_DURATION_SECONDS, Some(("outcome", "clean")))
            .expect("the drain's duration, at Done");
        assert_eq!(duration.len(), 1, "recorded once");
        assert!(
            duration[0] >= 1.0,
            "at least the 1 s propagation: {duration:?}"
        );
        assert_eq!(duration[0], report.budget.used_ms as f64 / 1000.0);
        let (_, unit, description, _) = r
            .entry(MetricKind::Histogram, DRAIN_DURATION_SECONDS, None)
            .unwrap();
        assert_eq!(*unit, Some(Unit::Seconds));
        assert!(description.is_some());

        // No connection came during the drain (no HTTP layer here): nothing to observe.
        assert_eq!(r.histogram(OBSERVED_PROPAGATION_SECONDS, None), None);
        assert_eq!(
            r.counter(REQUESTS_AFTER_FLIP_TOTAL, ("connection", "new")),
            0
        );
        assert_eq!(
            r.counter(REQUESTS_AFTER_FLIP_TOTAL, ("connection", "reused")),
            0
        );
    });
}

#[test]
fn requests_never_reach_the_recorder() {
    let recorder = Counting::new();
    paused(&recorder, async {
        let drain = builder().build().unwrap();
        drain.readiness().mark_serving();

        let before = recorder.calls();
        for _ in 0..1_000 {
            drop(drain.enter());
        }
        let held: Vec<_> = (0..100).map(|_| drain.enter()).collect();
        drop(held);
        assert_eq!(
            recorder.calls(),
            before,
            "serving: no recorder call per request"
        );

        drain.start(Trigger::Api);
        let started = recorder.calls();
        assert!(started > before, "the drain start is sampled");
        // Nothing yields here, so no lifecycle event runs in between: only the requests.
        let held: Vec<_> = (0..100).map(|_| drain.enter()).collect();
        for _ in 0..1_000 {
            drop(drain.enter());
        }
        drop(held);
        assert_eq!(
            recorder.calls(),
            started,
            "draining: no recorder call per request"
        );

        bounded("done", drain.drained()).await;
    });
}

#[test]
fn metrics_record_samples_the_counters_now() {
    let recorder = Counting::new();
    let snap = recorder.inner.snapshotter();
    paused(&recorder, async {
        let drain = builder().build().unwrap();
        drain.readiness().mark_serving();
        let _ = Reading::take(&snap);

        let guards: Vec<_> = (0..3).map(|_| drain.enter()).collect();
        drain
            .work()
            .spawn("sleeper", tokio::time::sleep(Duration::from_secs(3600)));
        // No event since: the gauges were not touched.
        assert_eq!(Reading::take(&snap).gauge(IN_FLIGHT_REQUESTS), 0.0);

        Metrics::new(&drain).record();
        let r = Reading::take(&snap);
        assert_eq!(r.gauges(), (1.0, 3.0, 1.0, 0.0));
        assert_eq!(
            r.counter(REQUESTS_AFTER_FLIP_TOTAL, ("connection", "new")),
            0
        );

        drop(guards);
        Metrics::new(&drain).record();
        assert_eq!(Reading::take(&snap).gauge(IN_FLIGHT_REQUESTS), 0.0);
    });
}

#[test]
fn the_updater_samples_periodically_and_ends_at_done() {
    let recorder = Counting::new();
    let snap = recorder.inner.snapshotter();
    paused(&recorder, async {
        let drain = builder().build().unwrap();
        drain.readiness().mark_serving();
        let updater = Metrics::new(&drain).spawn_updater(Duration::from_secs(1));
        let guard = drain.enter();
        let _ = Reading::take(&snap);

        // No lifecycle event in these 1.5 s: only the updater can have sampled the guard.
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let r = Reading::take(&snap);
        assert_eq!(r.gauge(IN_FLIGHT_REQUESTS), 1.0);
        assert_eq!(r.gauge(PHASE), 1.0);

        drain.start(Trigger::Api);
        drop(guard);
        bounded("done", drain.drained()).await;
        bounded("the updater's end", updater)
            .await
            .expect("the updater ends by itself at Done");
        assert_eq!(Reading::take(&snap).gauge(PHASE), 5.0);
    });
}

#[test]
fn a_drain_cut_by_the_deadline_is_labelled_with_its_outcome() {
    let recorder = Counting::new();
    let snap = recorder.inner.snapshotter();
    paused(&recorder, async {
        let drain = builder()
            .grace_period(Duration::from_secs(10))
            .build()
            .unwrap();
        let stuck = drain.enter();
        drain.start(Trigger::Sigterm);
        let report = bounded("done", drain.drained()).await;
        let r = Reading::take(&snap);
        let duration = r
            .histogram(
                DRAIN_DURATION_SECONDS,
                Some(("outcome", "deadline_exceeded")),
            )
            .expect("recorded under the deadline outcome");
        assert_eq!(duration, vec![report.budget.used_ms as f64 / 1000.0]);
        assert_eq!(
            r.histogram(DRAIN_DURATION_SECONDS, Some(("outcome", "clean"))),
            None
        );
        // The straggler's guard is still alive, and the gauge says so.
        assert_eq!(r.gauges(), (5.0, 1.0, 0.0, 0.0));
        drop(stuck);
    });
}

#[cfg(feature = "prometheus")]
mod prometheus {
    //! `GET /metrics` on the admin router, over real HTTP on 127.0.0.1 (real time: sockets).

    use std::net::SocketAddr;

    use axum::Router;
    use bytes::Bytes;
    use http::{Method, Request, StatusCode};
    use http_body_util::{BodyExt, Empty};
    use hyper_util::rt::TokioIo;
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    async fn serve(router: Router) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        addr
    }

    async fn call(addr: SocketAddr, method: Method, target: &str) -> (StatusCode, String, String) {
        bounded("an admin answer", async {
            let stream = TcpStream::connect(addr).await.unwrap();
            let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .unwrap();
            tokio::spawn(conn);
            let req = Request::builder()
                .method(method)
                .uri(format!("http://{addr}{target}"))
                .header(http::header::HOST, addr.to_string())
                .body(Empty::<Bytes>::new())
                .unwrap();
            let res = tx.send_request(req).await.unwrap();
            let status = res.status();
            let content_type = res
                .headers()
                .get(http::header::CONTENT_TYPE)
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default();
            let body = res.into_body().collect().await.unwrap().to_bytes();
            (
                status,
                content_type,
                String::from_utf8(body.to_vec()).unwrap(),
            )
        })
        .await
    }

    fn has_line(body: &str, line: &str) -> bool {
        body.lines().any(|l| l == line)
    }

    #[test]
    fn scraping_metrics_over_http_samples_the_drain() {
        let recorder = lameduck::drain_metrics::prometheus_builder().build_recorder();
        let handle = recorder.handle();
        let _local = metrics::set_default_local_recorder(&recorder);
        // Real sockets, so real time.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let drain = builder()
                .propagation(Propagation::fixed(Duration::from_millis(50)))
                .build()
                .unwrap();
            drain.readiness().mark_serving();
            let addr = serve(
                AdminBuilder::new(&drain)
                    .without_token()
                    .prometheus(handle)
                    .router(),
            )
            .await;

            // Two requests in flight and no event since: the scrape itself samples them.
            let guards = [drain.enter(), drain.enter()];
            let (status, content_type, body) = call(addr, Method::GET, "/metrics").await;
            assert_eq!(status, StatusCode::OK, "{body}");
            assert!(
                content_type.starts_with("text/plain; version=0.0.4"),
                "{content_type}"
            );
            assert!(has_line(&body, "# TYPE lameduck_phase gauge"), "{body}");
            assert!(has_line(&body, "lameduck_phase 1"), "{body}");
            assert!(has_line(&body, "lameduck_in_flight_requests 2"), "{body}");
            assert!(has_line(&body, "lameduck_background_tasks 0"), "{body}");
            assert!(
                body.lines()
                    .any(|l| l.starts_with("# HELP lameduck_in_flight_requests ")),
                "{body}"
            );
            assert!(
                has_line(
                    &body,
                    "lameduck_requests_after_flip_total{connection=\"new\"} 0"
                ),
                "{body}"
            );
            assert!(
                !body.contains(DRAIN_DURATION_SECONDS),
                "nothing at Done yet: {body}"
            );

            drop(guards);
            drain.start(Trigger::Api);
            bounded("done", drain.drained()).await;
            let (status, _, body) = call(addr, Method::GET, "/metrics").await;
            assert_eq!(status, StatusCode::OK);
            assert!(has_line(&body, "lameduck_phase 5"), "{body}");
            assert!(has_line(&body, "lameduck_in_flight_requests 0"), "{body}");
            // Rendered with buckets (a histogram), once, under its outcome.
            assert!(
                has_line(&body, "# TYPE lameduck_drain_duration_seconds histogram"),
                "{body}"
            );
            assert!(
                has_line(
                    &body,
                    "lameduck_drain_duration_seconds_count{outcome=\"clean\"} 1"
                ),
                "{body}"
            );
            assert!(
                has_line(
                    &body,
                    "lameduck_drain_duration_seconds_bucket{outcome=\"clean\",le=\"+Inf\"} 1"
                ),
                "{body}"
            );

            // Same input rules as the other admin routes; HEAD answers without a body.
            let (status, _, _) = call(addr, Method::POST, "/metrics").await;
            assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
            let (status, _, body) = call(addr, Method::GET, "/metrics?format=json").await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
            let (status, _, body) = call(addr, Method::HEAD, "/metrics").await;
            assert_eq!((status, body.as_str()), (StatusCode::OK, ""));
        });
    }

    #[test]
    fn without_a_handle_there_is_no_metrics_route() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let drain = builder().build().unwrap();
            let addr = serve(AdminBuilder::new(&drain).without_token().router()).await;
            let (status, _, _) = call(addr, Method::GET, "/metrics").await;
            assert_eq!(status, StatusCode::NOT_FOUND);
            let (status, _, _) = call(addr, Method::GET, "/livez").await;
            assert_eq!(status, StatusCode::OK);
        });
    }
}
