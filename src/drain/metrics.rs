//! The drain's metrics handle (feature `metrics`); the metrics themselves are in
//! [`crate::drain_metrics`].

use std::time::Duration;

use std::sync::Arc;

use super::Drain;
use crate::lifecycle::Driver;
use crate::lifecycle::Observer;
use crate::vocab::phase::Phase;

/// The drain's metrics (feature `metrics`): [`record`](Self::record) samples them now,
/// [`spawn_updater`](Self::spawn_updater) on a period. The metrics themselves are listed in
/// [`drain_metrics`](crate::drain_metrics).
///
/// Built with [`Metrics::new`]: a cheap clone, `'static`, that owns what it samples.
///
/// # Examples
///
/// ```
/// # fn demo() -> Result<(), lameduck::ConfigError> {
/// let drain = lameduck::Drain::builder().build()?;
/// lameduck::Metrics::new(&drain).record(); // every gauge, from the counters now
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Metrics {
    driver: Arc<Driver>,
}

impl Metrics {
    /// The metrics of `drain`.
    pub fn new(drain: &Drain) -> Self {
        Self {
            driver: Arc::clone(&drain.inner.driver),
        }
    }

    /// Sets every gauge (`lameduck_in_flight_requests`, `lameduck_open_connections`,
    /// `lameduck_background_tasks`, `lameduck_phase`) and the
    /// `lameduck_requests_after_flip_total` counters from the coordinator's counters now.
    ///
    /// Call it from your scrape handler before the exporter renders: requests never touch the
    /// recorder, so between lifecycle events the gauges hold their last sample. It reads a few
    /// atomics and takes the task registry's lock (never taken by requests); calling it often
    /// is fine, calling it per request is pointless. It records into the recorder current on
    /// the calling thread (normally the global one). See the [`metrics`](crate::drain_metrics)
    /// module for the metrics.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn demo() -> Result<(), lameduck::ConfigError> {
    /// let drain = lameduck::Drain::builder().build()?;
    /// let _guard = drain.enter();
    /// lameduck::Metrics::new(&drain).record(); // lameduck_in_flight_requests = 1
    /// # Ok(()) }
    /// ```
    pub fn record(&self) {
        crate::drain_metrics::Recorder.sampled(&self.driver.progress().sample());
    }

    /// Spawns a task that calls [`record`](Self::record) every `period`, for
    /// exporters that push on their own schedule rather than being scraped. It samples once
    /// more at Done and ends there; abort the returned handle to stop it earlier.
    ///
    /// The task is not one of the drain's background tasks: the drain does not wait for it.
    /// It records into the global recorder; a thread-local recorder applies only when the
    /// runtime is a current-thread one driven from that thread.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), lameduck::ConfigError> {
    /// let drain = lameduck::Drain::builder()
    ///     # .signals(lameduck::Signals::none()).report_to_stderr(false)
    ///     .build()?;
    /// let updater = lameduck::Metrics::new(&drain).spawn_updater(Duration::from_secs(5));
    ///
    /// drain.start(lameduck::Trigger::Api);
    /// drain.drained().await;
    /// updater.await.unwrap(); // it ended at Done
    /// # Ok(()) }
    /// ```
    ///
    /// # Panics
    ///
    /// If `period` is zero, or if called outside a Tokio runtime.
    pub fn spawn_updater(&self, period: Duration) -> tokio::task::JoinHandle<()> {
        assert!(
            !period.is_zero(),
            "the metrics updater's period must not be zero"
        );
        let metrics = self.clone();
        let done = super::Moments::new(Arc::clone(&self.driver)).reached(Phase::Done);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            // After a stall, one sample is enough: a burst of catch-up samples says nothing new.
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tokio::pin!(done);
            loop {
                tokio::select! {
                    _ = tick.tick() => metrics.record(),
                    () = &mut done => {
                        metrics.record();
                        return;
                    }
                }
            }
        })
    }
}

#[cfg(all(test, not(lameduck_loom)))]
mod tests {
    //! The after-flip hooks are crate-internal (the HTTP layer calls them), so what depends on
    //! them is tested here.
    use std::time::Duration;

    use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
    use metrics_util::MetricKind;

    use crate::drain::signal::Signals;
    use crate::drain::Drain;
    use crate::drain_metrics::{
        DRAIN_DURATION_SECONDS, OBSERVED_PROPAGATION_SECONDS, REQUESTS_AFTER_FLIP_TOTAL,
    };
    use crate::propagation::Propagation;
    use crate::vocab::phase::Trigger;

    /// One reading of the recorder. The debugging recorder resets what it reports, so a test
    /// takes one reading per checkpoint and looks everything up in it.
    struct Reading(Vec<(metrics_util::CompositeKey, DebugValue)>);

    impl Reading {
        fn take(snap: &Snapshotter) -> Self {
            Reading(
                snap.snapshot()
                    .into_vec()
                    .into_iter()
                    .map(|(k, _, _, v)| (k, v))
                    .collect(),
            )
        }

        fn get(
            &self,
            kind: MetricKind,
            name: &str,
            label: Option<(&str, &str)>,
        ) -> Option<&DebugValue> {
            self.0
                .iter()
                .find(|(k, _)| {
                    k.kind() == kind
                        && k.key().name() == name
                        && label.is_none_or(|(l, v)| {
                            k.key().labels().any(|x| x.key() == l && x.value() == v)
                        })
                })
                .map(|(_, v)| v)
        }
    }

    #[test]
    fn after_flip_counters_and_observed_propagation() {
        let recorder = DebuggingRecorder::new();
        let snap = recorder.snapshotter();
        let _local = metrics::set_default_local_recorder(&recorder);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let drain = Drain::builder()
                .signals(Signals::none())
                .report_to_stderr(false)
                .termination_log(None)
                .propagation(Propagation::fixed(Duration::from_secs(2)))
                .build()
                .unwrap();
            drain.readiness().mark_serving();
            let core = drain.core();
            drain.start(Trigger::Sigterm);

            tokio::time::sleep(Duration::from_millis(700)).await;
            // A request on a connection from before the drain, then a new connection with two.
            core.observed().note_request(false);
            assert!(
                crate::drain::ServeSeam::new(&drain)
                    .note_connection(Some("10.0.0.7:40000".parse().unwrap()))
                    .0
            );
            core.observed().note_request(true);
            core.observed().note_request(true);

            // Mid-drain sample: the totals so far, without any per-request recording.
            crate::Metrics::new(&drain).record();
            let r = Reading::take(&snap);
            let new = r.get(
                MetricKind::Counter,
                REQUESTS_AFTER_FLIP_TOTAL,
                Some(("connection", "new")),
            );
            let reused = r.get(
                MetricKind::Counter,
                REQUESTS_AFTER_FLIP_TOTAL,
                Some(("connection", "reused")),
            );
            assert_eq!(new, Some(&DebugValue::Counter(2)));
            assert_eq!(reused, Some(&DebugValue::Counter(1)));

            let report = drain.drained().await;
            assert_eq!(report.after_flip.requests_on_new_connections, 2);
            assert_eq!(report.after_flip.last_new_connection_ms, Some(700));

            // The debugging recorder resets counters when read; the sample at Done sets them
            // back to the totals, which did not move.
            let r = Reading::take(&snap);
            let new = r.get(
                MetricKind::Counter,
                REQUESTS_AFTER_FLIP_TOTAL,
                Some(("connection", "new")),
            );
            assert_eq!(new, Some(&DebugValue::Counter(2)));
            let propagation = r.get(MetricKind::Histogram, OBSERVED_PROPAGATION_SECONDS, None);
            assert_eq!(propagation, Some(&DebugValue::Histogram(vec![0.7.into()])));
        });
    }

    #[test]
    fn no_new_connection_means_no_propagation_sample() {
        let recorder = DebuggingRecorder::new();
        let snap = recorder.snapshotter();
        let _local = metrics::set_default_local_recorder(&recorder);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let drain = Drain::builder()
                .signals(Signals::none())
                .report_to_stderr(false)
                .termination_log(None)
                .propagation(Propagation::fixed(Duration::from_millis(100)))
                .build()
                .unwrap();
            drain.start(Trigger::Api);
            drain.core().observed().note_request(false);
            drain.drained().await;
        });
        let r = Reading::take(&snap);
        assert_eq!(
            r.get(MetricKind::Histogram, OBSERVED_PROPAGATION_SECONDS, None),
            None
        );
        let duration = r.get(
            MetricKind::Histogram,
            DRAIN_DURATION_SECONDS,
            Some(("outcome", "clean")),
        );
        assert_eq!(duration, Some(&DebugValue::Histogram(vec![0.1.into()])));
    }
}
