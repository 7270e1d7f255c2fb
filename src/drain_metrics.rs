//! The drain as metrics, through the [`metrics`] facade: you install the exporter (Prometheus,
//! StatsD, OpenTelemetry, …), lameduck records into it.
//!
//! | Metric | Kind | Meaning |
//! |---|---|---|
//! | `lameduck_in_flight_requests` | gauge | Requests (guards) in flight. |
//! | `lameduck_open_connections` | gauge | Open connections on `lameduck::serve` listeners. |
//! | `lameduck_background_tasks` | gauge | Background tasks still running. |
//! | `lameduck_phase` | gauge | The [`Phase`], as a number (table below). |
//! | `lameduck_drain_duration_seconds{outcome}` | histogram | From the first trigger to the end of the drain, recorded once, at Done. `outcome` is the report's: `clean`, `deadline_exceeded`, `closer_failed`, `forced`. |
//! | `lameduck_observed_propagation_seconds` | histogram | From the first trigger to the last new connection accepted during the drain — how long some path kept routing here. Recorded at Done, only when such a connection came. |
//! | `lameduck_requests_after_flip_total{connection}` | counter | Requests that arrived during the drain, on a connection opened during the drain (`connection="new"`) or before it (`connection="reused"`). |
//!
//! `lameduck_phase` takes the phases in their order, so `lameduck_phase >= 2` means "draining
//! or later":
//!
//! | Value | Phase |
//! |---|---|
//! | 0 | [`starting`](Phase::Starting) |
//! | 1 | [`serving`](Phase::Serving) |
//! | 2 | [`draining`](Phase::Draining) |
//! | 3 | [`stopped_accepting`](Phase::StoppedAccepting) |
//! | 4 | [`closing`](Phase::Closing) |
//! | 5 | [`done`](Phase::Done) |
//!
//! # When values are recorded
//!
//! Never on the request path: a request costs the same with or without this feature, and no
//! request ever calls the recorder. The gauges and the counter are *sampled* from the
//! coordinator's own counters
//!
//! * when the [`Drain`](crate::Drain) is built, at every lifecycle event and at every phase change;
//! * whenever you call [`Metrics::record`](crate::Metrics::record) — from your scrape handler, right before the
//!   exporter renders, so a scrape sees that instant;
//! * every period, from [`Metrics::spawn_updater`](crate::Metrics::spawn_updater), for exporters that push.
//!
//! Between two samples a gauge keeps its last value. The counter is set to the coordinator's
//! running total each time (a monotonic [`absolute`](metrics::Counter::absolute)), so a scrape
//! during the drain sees the requests so far, and two samples never count a request twice.
//!
//! The metrics are described (help text and unit) when the [`Drain`](crate::Drain) is built, so install your
//! recorder first.
//!
//! # The last numbers
//!
//! The histograms are recorded at Done, and the process usually exits right after: a scraper
//! that pulls every 15 s will rarely see them. A push exporter flushed before exit, or a
//! `preStop` drain (after which [`Drain::run`](crate::Drain::run) keeps the process up until SIGTERM) gives it a
//! chance; the [`DrainReport`] always has the same numbers.
//!
//! # Examples
//!
//! Any exporter: sample the drain in your scrape handler, then render.
//!
//! ```
//! # fn render() -> String { String::new() }
//! # fn demo() -> Result<(), lameduck::ConfigError> {
//! let drain = lameduck::Drain::builder().build()?; // after installing the recorder
//!
//! let scrape = {
//!     let drain = drain.clone();
//!     move || {
//!         lameduck::Metrics::new(&drain).record(); // gauges reflect this instant, not the last event
//!         render() // your exporter's text
//!     }
//! };
//! # let _ = scrape;
//! # Ok(()) }
//! ```
//!
//! An exporter that pushes on its own schedule: sample as often as it pushes.
//!
//! ```
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), lameduck::ConfigError> {
//! let drain = lameduck::Drain::builder().build()?;
//! let updater = lameduck::Metrics::new(&drain).spawn_updater(Duration::from_secs(10)); // ends at Done
//! # updater.abort();
//! # Ok(()) }
//! ```
//!
//! With the `prometheus` feature, the admin router serves `GET /metrics` in Prometheus text
//! format.
#![cfg_attr(
    feature = "prometheus",
    doc = r#"
[`prometheus_builder`] sets up the recorder, and
[`AdminBuilder::prometheus`](crate::AdminBuilder::prometheus) adds the route:

```
# fn demo() -> Result<(), Box<dyn std::error::Error>> {
let handle = lameduck::drain_metrics::prometheus_builder().install_recorder()?;
let drain = lameduck::Drain::builder().build()?;
let admin: axum::Router = lameduck::AdminBuilder::new(&drain).prometheus(handle).router();
# Ok(()) }
```
"#
)]

use std::time::Duration;

use metrics::Unit;
use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};

use crate::lifecycle::{Observer, Sample};
use crate::report::DrainReport;
use crate::vocab::phase::Phase;

/// Gauge: requests (guards) in flight.
pub const IN_FLIGHT_REQUESTS: &str = "lameduck_in_flight_requests";
/// Gauge: open connections on `lameduck::serve` listeners.
pub const OPEN_CONNECTIONS: &str = "lameduck_open_connections";
/// Gauge: background tasks still running.
pub const BACKGROUND_TASKS: &str = "lameduck_background_tasks";
/// Gauge: the phase, 0 (starting) to 5 (done); see the [module docs](self).
pub const PHASE: &str = "lameduck_phase";
/// Histogram, seconds, label `outcome`: the drain's duration, recorded once at Done.
pub const DRAIN_DURATION_SECONDS: &str = "lameduck_drain_duration_seconds";
/// Histogram, seconds: from the first trigger to the last new connection of the drain.
pub const OBSERVED_PROPAGATION_SECONDS: &str = "lameduck_observed_propagation_seconds";
/// Counter, label `connection` (`new` | `reused`): requests that arrived during the drain.
pub const REQUESTS_AFTER_FLIP_TOTAL: &str = "lameduck_requests_after_flip_total";

/// Bucket bounds, in seconds, that `prometheus_builder` (feature `prometheus`) gives both
/// histograms: drains last from a second to a few minutes (`terminationGracePeriodSeconds`
/// defaults to 30).
pub const SECONDS_BUCKETS: &[f64] = &[
    0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 300.0,
];

/// The value of `lameduck_phase`: the phases in order, so comparisons keep their meaning.
fn phase_value(phase: Phase) -> f64 {
    // Exhaustive on purpose: a new phase must get its number here, and in the docs' table.
    match phase {
        Phase::Starting => 0.0,
        Phase::Serving => 1.0,
        Phase::Draining => 2.0,
        Phase::StoppedAccepting => 3.0,
        Phase::Closing => 4.0,
        Phase::Done => 5.0,
    }
}

/// Describes every metric. Called when a `Drain` is built.
fn describe() {
    describe_gauge!(
        IN_FLIGHT_REQUESTS,
        Unit::Count,
        "Requests (in-flight guards) currently counted by the drain coordinator."
    );
    describe_gauge!(
        OPEN_CONNECTIONS,
        Unit::Count,
        "Open connections on the coordinator's listeners."
    );
    describe_gauge!(
        BACKGROUND_TASKS,
        Unit::Count,
        "Background tasks still running."
    );
    describe_gauge!(
        PHASE,
        "Lifecycle phase: 0 starting, 1 serving, 2 draining, 3 stopped_accepting, 4 closing, 5 done."
    );
    describe_histogram!(
        DRAIN_DURATION_SECONDS,
        Unit::Seconds,
        "Time from the first drain trigger to the end of the drain, by outcome."
    );
    describe_histogram!(
        OBSERVED_PROPAGATION_SECONDS,
        Unit::Seconds,
        "Time from the first drain trigger to the last new connection accepted during the drain."
    );
    describe_counter!(
        REQUESTS_AFTER_FLIP_TOTAL,
        Unit::Count,
        "Requests that arrived during the drain, on a new or a reused connection."
    );
}

/// The lifecycle's observer that records the metrics: given to every drain when it is built
/// (which describes them once), told at every lifecycle event and phase change (and by
/// [`Metrics::record`](crate::Metrics::record)), and at the end.
pub(crate) struct Recorder;

/// The observer every drain is built with: the metrics are described then.
pub(crate) fn observer() -> Option<Box<dyn Observer>> {
    describe();
    Some(Box::new(Recorder))
}

impl Observer for Recorder {
    fn sampled(&self, sample: &Sample) {
        record(sample);
    }

    fn done(&self, report: &DrainReport) {
        record_done(report);
    }
}

/// Sets every gauge and the after-flip counters from `sample`.
fn record(sample: &Sample) {
    gauge!(IN_FLIGHT_REQUESTS).set(sample.in_flight as f64);
    gauge!(OPEN_CONNECTIONS).set(sample.connections as f64);
    gauge!(BACKGROUND_TASKS).set(sample.tasks as f64);
    gauge!(PHASE).set(phase_value(sample.phase));
    // `absolute` only ever raises the counter, so a stale sample at worst shows a smaller
    // total until the next one.
    counter!(REQUESTS_AFTER_FLIP_TOTAL, "connection" => "new").absolute(sample.requests_on_new);
    counter!(REQUESTS_AFTER_FLIP_TOTAL, "connection" => "reused")
        .absolute(sample.requests_on_reused);
}

/// Records the histograms of a finished drain, from its report. Called once, just before the
/// phase turns Done, so whoever awaits Done finds them recorded.
fn record_done(report: &DrainReport) {
    histogram!(DRAIN_DURATION_SECONDS, "outcome" => report.outcome.as_str())
        .record(seconds(report.budget.used_ms));
    if let Some(ms) = report.after_flip.last_new_connection_ms {
        histogram!(OBSERVED_PROPAGATION_SECONDS).record(seconds(ms));
    }
}

fn seconds(ms: u64) -> f64 {
    Duration::from_millis(ms).as_secs_f64()
}

/// A Prometheus recorder builder with bucket bounds ([`SECONDS_BUCKETS`]) for lameduck's two
/// histograms, so they render as histograms (aggregatable across Pods) rather than summaries.
///
/// Configure it further as you like, then `install_recorder()` and give the handle to
/// [`AdminBuilder::prometheus`](crate::AdminBuilder::prometheus) for `GET /metrics` on the
/// admin router. `install_recorder()` does not schedule the exporter's upkeep; the admin route
/// runs it on every scrape.
///
/// # Examples
///
/// ```
/// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let handle = lameduck::drain_metrics::prometheus_builder().install_recorder()?;
/// let drain = lameduck::Drain::builder().build()?;
/// let admin: axum::Router = lameduck::AdminBuilder::new(&drain).prometheus(handle).router();
/// # Ok(()) }
/// ```
#[cfg(feature = "prometheus")]
pub fn prometheus_builder() -> PrometheusBuilder {
    use metrics_exporter_prometheus::Matcher;
    [DRAIN_DURATION_SECONDS, OBSERVED_PROPAGATION_SECONDS]
        .into_iter()
        .fold(PrometheusBuilder::new(), |b, name| {
            b.set_buckets_for_metric(Matcher::Full(name.to_owned()), SECONDS_BUCKETS)
                .expect("SECONDS_BUCKETS is not empty, the only way this can fail")
        })
}

#[cfg(feature = "prometheus")]
pub use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phase_numbers_follow_the_phase_order() {
        let phases = [
            Phase::Starting,
            Phase::Serving,
            Phase::Draining,
            Phase::StoppedAccepting,
            Phase::Closing,
            Phase::Done,
        ];
        for (i, p) in phases.into_iter().enumerate() {
            assert_eq!(phase_value(p), i as f64, "{p}");
        }
    }
}
