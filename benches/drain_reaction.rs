//! Drain reaction times, over many drains: how quickly the coordinator notices the last
//! in-flight guard going away and moves on to the closers, and how quickly `/readyz` turns 503
//! after a trigger, over real HTTP to the admin router on 127.0.0.1.
//!
//! Run with `cargo bench --bench drain_reaction` (a few seconds); `-- <drains>` sets the number
//! of drains (default 200). Prints a table of median, p99, min and max.
//!
//! Per drain: a fresh `Drain` (fixed propagation of zero, so it reaches the wait-for-zero phase
//! at once) with one closer that records `Instant::now()` when it starts; its admin router
//! served on an ephemeral port; one guard held across the trigger. The guard is dropped from a
//! task on a runtime worker, as a request's guard is, after the driver is parked waiting for
//! zero; `in_flight_zero` is timed by a tracing layer that notes the instant the coordinator
//! emits the event.

use std::future::IntoFuture;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Empty;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use lameduck::AdminBuilder;
use lameduck::{Drain, Phase, Propagation, Signals, Trigger};
use tokio::net::{TcpListener, TcpStream};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// When the coordinator last emitted `in_flight_zero`.
static IN_FLIGHT_ZERO: Mutex<Option<Instant>> = Mutex::new(None);

/// Notes the instant of each `in_flight_zero` event; ignores everything else.
struct ZeroClock;

impl<S: tracing::Subscriber> Layer<S> for ZeroClock {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let now = Instant::now();
        struct IsZero(bool);
        impl Visit for IsZero {
            fn record_str(&mut self, field: &Field, value: &str) {
                self.0 |= field.name() == "event" && value == "in_flight_zero";
            }
            fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
        }
        let mut v = IsZero(false);
        event.record(&mut v);
        if v.0 {
            *IN_FLIGHT_ZERO.lock().unwrap() = Some(now);
        }
    }
}

/// One drain's measurements.
struct Sample {
    zero_event: Duration,
    closer_start: Duration,
    start_call: Duration,
    readyz_503: Duration,
    readyz_200: Duration,
}

type Client = SendRequest<Empty<Bytes>>;

/// One row of the table: a name and how to read it from a sample.
type Metric = fn(&Sample) -> Duration;

/// `GET path` on the connection; returns the status when the response head has arrived.
async fn get(client: &mut Client, path: &'static str) -> u16 {
    client.ready().await.unwrap();
    let req = http::Request::get(path)
        .header(http::header::HOST, "127.0.0.1")
        .body(Empty::new())
        .unwrap();
    let res = client.send_request(req).await.unwrap();
    let status = res.status().as_u16();
    // Read the (short) body so the connection stays usable.
    http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap();
    status
}

async fn one_drain() -> Sample {
    let drain = Drain::builder()
        .grace_period(Duration::from_secs(30))
        .propagation(Propagation::fixed(Duration::ZERO))
        .signals(Signals::none())
        .report_to_stderr(false)
        .termination_log(None)
        .build()
        .unwrap();
    drain.readiness().mark_serving();
    let closer_at = Arc::new(Mutex::new(None));
    let slot = closer_at.clone();
    drain.work().on_close("probe", move || {
        *slot.lock().unwrap() = Some(Instant::now());
        async { Ok::<_, std::io::Error>(()) }
    });

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server =
        tokio::spawn(axum::serve(listener, AdminBuilder::new(&drain).router()).into_future());
    let stream = TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (mut client, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);

    // Warm the connection, then time a 200 on it: the HTTP round trip alone.
    assert_eq!(get(&mut client, "/readyz").await, 200);
    let t = Instant::now();
    assert_eq!(get(&mut client, "/readyz").await, 200);
    let readyz_200 = t.elapsed();

    let guard = drain.enter();
    let trigger = Instant::now();
    assert!(drain.start(Trigger::Api));
    let start_call = trigger.elapsed();
    assert_eq!(get(&mut client, "/readyz").await, 503);
    let readyz_503 = trigger.elapsed();

    drain.moments().reached(Phase::StoppedAccepting).await;
    // Let the driver park in its wait for zero, so the drop below is what wakes it.
    tokio::time::sleep(Duration::from_millis(1)).await;
    *IN_FLIGHT_ZERO.lock().unwrap() = None;
    let dropped = Instant::now();
    drop(guard);
    let report = drain.drained().await;
    assert_eq!(report.exit_code, 0, "{}", report.summary());

    let zero = IN_FLIGHT_ZERO
        .lock()
        .unwrap()
        .take()
        .expect("in_flight_zero seen");
    let closer = closer_at.lock().unwrap().take().expect("closer ran");
    drop(client);
    conn.abort();
    server.abort();
    Sample {
        zero_event: zero - dropped,
        closer_start: closer - dropped,
        start_call,
        readyz_503,
        readyz_200,
    }
}

/// Nearest-rank percentile of sorted values.
fn pct(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn main() {
    // `cargo bench` passes `--bench`; the first numeric argument, if any, is the drain count.
    let drains = std::env::args()
        .skip(1)
        .find_map(|a| a.parse::<usize>().ok())
        .unwrap_or(200);
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(ZeroClock))
        .unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let workers = rt.metrics().num_workers();
    // On a worker, like a request handler: block_on's own thread is not one.
    let samples = rt
        .block_on(async move {
            tokio::spawn(async move {
                // Two warm-up drains (first-use costs), not counted.
                for _ in 0..2 {
                    one_drain().await;
                }
                let mut out = Vec::with_capacity(drains);
                for _ in 0..drains {
                    out.push(one_drain().await);
                }
                out
            })
            .await
        })
        .unwrap();

    let rows: [(&str, Metric); 5] = [
        ("last guard drop → in_flight_zero event", |s| s.zero_event),
        ("last guard drop → first closer starts", |s| {
            s.closer_start
        }),
        ("trigger → Drain::start returns (503 from now on)", |s| {
            s.start_call
        }),
        ("trigger → /readyz 503 received over HTTP", |s| {
            s.readyz_503
        }),
        ("(reference) /readyz 200 round trip, same connection", |s| {
            s.readyz_200
        }),
    ];
    println!("drain reaction: {drains} drains, tokio multi-thread runtime, {workers} workers");
    println!();
    println!("| step | median | p99 | min | max |");
    println!("|---|---:|---:|---:|---:|");
    for (name, f) in rows {
        let mut v: Vec<Duration> = samples.iter().map(f).collect();
        v.sort();
        println!(
            "| {name} | {} | {} | {} | {} |",
            us(pct(&v, 50.0)),
            us(pct(&v, 99.0)),
            us(v[0]),
            us(v[v.len() - 1])
        );
    }
}
