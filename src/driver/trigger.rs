//! Triggers: the first one starts the drain and fixes the origin; later ones are recorded.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Driver, Lifecycle, Origin};
use crate::phase::{unix_ms_now, Event, EventKind, Phase, Trigger};
use crate::readiness::ReadinessWhileDraining;

impl Driver {
    /// Starts the drain with its origin at `now` (a signal's receipt time), or records a later
    /// trigger: one `signal_received` event per trigger kind, a count for repeats, nothing
    /// appended to the timeline once it is final. Returns `true` only for the first trigger.
    pub(crate) fn start(
        self: &Arc<Self>,
        trigger: Trigger,
        now: Instant,
        unix_ms: u64,
        from_signal: bool,
    ) -> bool {
        // Phases only move forward, so Starting now means never Serving before. Read before
        // the state lock: that lock is never held while another part's is taken.
        let was_starting = self.phase() == Phase::Starting;
        let watchdog = {
            let mut st = self.lock();
            if let Some(origin) = st.origin {
                record_repeat(&mut st, origin, trigger, now, unix_ms);
                return false;
            }
            st.origin = Some(Origin { at: now, unix_ms });
            st.trigger = Some(trigger);
            st.receipt = from_signal.then_some(unix_ms);
            let mut started = Event::new(EventKind::DrainStarted, Duration::ZERO, unix_ms);
            started.trigger = Some(trigger);
            let flipped = self.readiness.flips_at_trigger().then(|| {
                let mut e = Event::new(EventKind::ReadinessFlipped, Duration::ZERO, unix_ms);
                if self.readiness == ReadinessWhileDraining::Auto {
                    e.detail = Some("for callers other than kubelet's probe".to_owned());
                }
                e
            });
            st.timeline.open([Some(started), flipped].into_iter().flatten(), unix_ms);
            st.evidence = Some(self.policy.evidence_at(self.core, now));
            // Without a gate, Starting may only mean nobody called `mark_serving` (an accept
            // loop of the application's own): then the proxies' view is unknown, so wait.
            st.never_served = was_starting && st.gated;
            self.exit.is_watched()
        };
        self.deadlines.started(now);
        if watchdog {
            // Only a process that installed the handlers owns its exit.
            let (at, writes) = self.deadlines.watchdog();
            let driver = Arc::clone(self);
            let fire = move |until| driver.watchdog_fire(until);
            self.exit.arm_watchdog(now.into_std(), at, writes, fire);
        }
        self.log_start(trigger);
        self.core.start_draining();
        self.set_phase(Phase::Draining);
        self.tokens.drain.cancel();
        let driver = Arc::clone(self);
        let span = tracing::info_span!(
            "lameduck_drain",
            trigger = trigger.as_str(),
            grace_ms = self.budget().grace_period.as_millis() as u64
        );
        tokio::spawn(tracing::Instrument::instrument(
            async move {
                // The runtime's notice, against the signal's receipt.
                driver.lock().noticed = Some(unix_ms_now());
                driver.drive(now).await
            },
            span,
        ));
        true
    }

    /// The log lines of the drain's start (the timeline has the same events).
    fn log_start(&self, trigger: Trigger) {
        tracing::info!(
            event = "drain_started",
            trigger = trigger.as_str(),
            in_flight = self.core.counter.count(),
            grace_ms = self.budget().grace_period.as_millis() as u64,
            "lameduck: drain_started"
        );
        if self.readiness.flips_at_trigger() {
            tracing::info!(
                event = "readiness_flipped",
                at_ms = 0u64,
                policy = self.readiness.as_str(),
                "lameduck: readiness_flipped"
            );
        }
    }

    /// A signal arrived (on the signal thread; `at` and `unix_ms` are its receipt): start the
    /// drain from the receipt (or record it), let `run` return after a `preStop` drain, and
    /// force the exit when the signal table says so.
    pub(crate) fn on_signal(
        self: &Arc<Self>,
        trigger: Trigger,
        at: Instant,
        unix_ms: u64,
        force: bool,
    ) {
        // Recorded before `run` is woken, so the report it completes holds this signal.
        self.start(trigger, at, unix_ms, true);
        self.exit.stop_arrived();
        if force {
            self.force();
        }
    }

    /// A signal that neither drains nor exits (SIGHUP, SIGUSR1) arrived, on the signal thread:
    /// recorded as `signal_received` with its name (a count for repeats), in the timeline, or
    /// until the drain starts in the events it will begin with.
    pub(crate) fn on_ignored_signal(&self, name: &'static str, at: Instant, unix_ms: u64) {
        tracing::warn!(
            signal = name,
            "lameduck: {name} received and ignored: it neither starts a drain nor exits (its \
             default action would have killed the process without a report)"
        );
        let mut st = self.lock();
        let mut e = Event::new(EventKind::SignalReceived, Duration::ZERO, unix_ms);
        e.name = Some(name.to_owned());
        match st.origin {
            Some(origin) => {
                e.at_ms = at.saturating_duration_since(origin.at).as_millis() as u64;
                e.detail = Some("ignored: neither drains nor exits".to_owned());
                st.timeline.signal(e);
            }
            None => st.timeline.signal_before_start(e),
        }
    }

    /// Exit now: skip the remaining waits and the closers. Returns `true` if this call forced
    /// it.
    pub(crate) fn force(self: &Arc<Self>) -> bool {
        if self.forced.swap(true, Ordering::AcqRel) {
            return false;
        }
        if !self.core.counter.is_draining() {
            self.start(Trigger::Api, Instant::now(), unix_ms_now(), false);
        }
        tracing::warn!("lameduck: drain forced, exiting now");
        self.tokens.force.cancel();
        true
    }
}

/// Records a trigger after the first: a count on the first event of its kind, or a new
/// `signal_received` event (logged); into the late signals once the timeline is final.
fn record_repeat(st: &mut Lifecycle, origin: Origin, trigger: Trigger, now: Instant, unix_ms: u64) {
    let mut e = Event::new(
        EventKind::SignalReceived,
        now.saturating_duration_since(origin.at),
        unix_ms,
    );
    e.trigger = Some(trigger);
    let at_ms = e.at_ms;
    if st.timeline.signal(e) {
        tracing::info!(
            event = "signal_received",
            trigger = trigger.as_str(),
            at_ms,
            "lameduck: trigger received while draining"
        );
    }
}
