//! The lifecycle, from the first trigger to Done: the budget's origin and deadlines, the
//! propagation wait, stopping, the wait for zero, stragglers, closing, and the report.
//!
//! # Invariants
//!
//! * The first trigger wins: it fixes the budget's origin under the `state` lock, sets the
//!   counter's draining flag, and spawns the one driver task. Later triggers only raise the
//!   count of one `signal_received` event per trigger kind, so the timeline stays bounded
//!   whatever the number of triggers; once the Done event is in, the timeline is final.
//! * Every lifecycle event and every phase change goes through one funnel
//!   ([`Driver::push`], [`Driver::set_phase`]): one log line per event, and the observers
//!   (metrics) see each of them.
//! * The final report is written by exactly one of the driver and the watchdog thread: each
//!   claims the `emission` flag with a compare-exchange before writing.
//! * The `state` mutex is never held across an `.await`, never taken on the request path,
//!   and never held while another part's lock is taken, so it cannot deadlock.
//! * Phases only move forward; each transition is published on a `watch` channel.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::budget::Budget;
use crate::closers::{CloserResult, Closers};
use crate::evidence::{Evidence, EvidenceKind, EvidenceReport};
use crate::guard::Core;
use crate::phase::{unix_ms_now, CommitReason, Event, EventKind, Phase, Trigger};
use crate::propagation::Policy;
use crate::readiness::ReadinessWhileDraining;
use crate::report::{DrainReport, Outcome, ServerReport, Sinks, Straggler};
use crate::tasks::{TaskContext, Tasks};

mod assemble;
mod exit;
mod status;

pub use status::{Status, STATUS_TIMELINE_LIMIT};

/// What the observers (metrics) are shown at each lifecycle event and phase change.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))] // read by the metrics observer
pub(crate) struct Sample {
    pub(crate) phase: Phase,
    pub(crate) in_flight: usize,
    pub(crate) connections: usize,
    pub(crate) tasks: usize,
    pub(crate) requests_on_new: u64,
    pub(crate) requests_on_reused: u64,
}

/// What an observer sees: a sample at each event and phase change, and the report once, just
/// before the phase turns Done.
#[derive(Debug)]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))] // read by the metrics observer
pub(crate) enum Observed<'a> {
    Moment(Sample),
    Done(&'a DrainReport),
}

pub(crate) type Observer = Box<dyn Fn(Observed<'_>) + Send + Sync>;

/// The settings the builder validated, for the driver.
pub(crate) struct Settings {
    pub(crate) budget: Budget,
    pub(crate) policy: Policy,
    pub(crate) readiness: ReadinessWhileDraining,
    pub(crate) sinks: Sinks,
    pub(crate) hurry_lead: Duration,
    pub(crate) proxy_label: Option<String>,
}

#[derive(Clone, Copy)]
struct Origin {
    at: Instant,
    unix_ms: u64,
}

/// The driver's state, behind its one lock.
#[derive(Default)]
struct Lifecycle {
    origin: Option<Origin>,
    trigger: Option<Trigger>,
    timeline: Vec<Event>,
    /// A signal arrived (any kind): after a `preStop` drain, `run` may return.
    stop_seen: bool,
    signals_installed: bool,
    /// `run` owns the process: the stderr line is written once, at exit, with the exit event.
    owned_by_run: bool,
    /// The timeline is final (the Done event is in); later signals go to `late_signals`.
    frozen: bool,
    /// Signals received after Done, one event per trigger kind, added to the report at exit.
    late_signals: Vec<Event>,
    /// Receipt of the signal that started the drain, and when the driver first ran (unix ms).
    receipt: Option<u64>,
    noticed: Option<u64>,
    report: Option<DrainReport>,
    /// The arrival-rate evidence taken at the trigger.
    evidence: Option<Evidence>,
    /// What the propagation commit went on, once it committed.
    committed: Option<EvidenceReport>,
    /// The accept loop's timeouts, when `serve` runs the accept loop.
    server: Option<ServerReport>,
}

/// The tokens the drain fires, in this order.
#[derive(Debug, Default)]
pub(crate) struct Tokens {
    /// The drain started: stop taking new work.
    pub(crate) drain: CancellationToken,
    /// `stopped_accepting`: listeners close, streams end.
    pub(crate) stop: CancellationToken,
    /// `hurry_lead` before the quiesce deadline.
    pub(crate) hurry: CancellationToken,
    /// The quiesce deadline (or forced): force-close what is left.
    pub(crate) deadline: CancellationToken,
    /// Exit now.
    pub(crate) force: CancellationToken,
}

// Who writes the final report: the driver and the watchdog must not both write it.
const EMIT_NONE: u8 = 0;
const EMIT_DRIVER: u8 = 1;
const EMIT_WATCHDOG: u8 = 2;

/// The lifecycle engine behind a [`Drain`](crate::Drain).
pub(crate) struct Driver {
    pub(crate) core: &'static Core,
    pub(crate) budget: Budget,
    policy: Policy,
    readiness: ReadinessWhileDraining,
    sinks: Sinks,
    hurry_lead: Duration,
    proxy_label: Option<String>,
    phase: watch::Sender<Phase>,
    state: Mutex<Lifecycle>,
    pub(crate) tokens: Tokens,
    /// The quiesce deadline, set once at the trigger (what [`TaskContext::deadline`] reads).
    quiesce_at: Arc<OnceLock<Instant>>,
    forced: AtomicBool,
    /// `EMIT_*`: who writes the final report (the loser of the swap backs off).
    emission: AtomicU8,
    terminate_seen: Notify,
    pub(crate) tasks: Tasks,
    pub(crate) closers: Closers,
    observers: Vec<Observer>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("phase", &*self.phase.borrow())
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl Driver {
    pub(crate) fn new(core: &'static Core, settings: Settings, observers: Vec<Observer>) -> Self {
        let Settings {
            budget,
            policy,
            readiness,
            sinks,
            hurry_lead,
            proxy_label,
        } = settings;
        Self {
            core,
            budget,
            policy,
            readiness,
            sinks,
            hurry_lead,
            proxy_label,
            phase: watch::channel(Phase::Starting).0,
            state: Mutex::new(Lifecycle::default()),
            tokens: Tokens::default(),
            quiesce_at: Arc::default(),
            forced: AtomicBool::new(false),
            emission: AtomicU8::new(EMIT_NONE),
            terminate_seen: Notify::new(),
            tasks: Tasks::default(),
            closers: Closers::default(),
            observers,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Lifecycle> {
        // A panic while holding the lock leaves the state consistent (every write is a single
        // push/assignment), so poisoning is ignored rather than spread.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    // ---- phase and the one funnel ----

    pub(crate) fn phase(&self) -> Phase {
        *self.phase.borrow()
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<Phase> {
        self.phase.subscribe()
    }

    /// Moves to `phase` and shows the observers.
    fn set_phase(&self, phase: Phase) {
        self.phase.send_modify(|p| *p = phase);
        self.observe();
    }

    /// What the observers would see now.
    pub(crate) fn sample(&self) -> Sample {
        let af = &self.core.after_flip;
        Sample {
            phase: self.phase(),
            in_flight: self.core.counter.count(),
            connections: self.connections(),
            tasks: self.tasks.len(),
            // Relaxed: plain statistics for a gauge.
            requests_on_new: af.requests_on_new.load(Ordering::Relaxed),
            requests_on_reused: af.requests_on_reused.load(Ordering::Relaxed),
        }
    }

    /// Shows the observers a sample (metrics are sampled at lifecycle events, never per
    /// request).
    pub(crate) fn observe(&self) {
        if self.observers.is_empty() {
            return;
        }
        let sample = self.sample();
        for o in &self.observers {
            o(Observed::Moment(sample));
        }
    }

    pub(crate) fn connections(&self) -> usize {
        self.core.connections.load(Ordering::Relaxed)
    }

    /// An event of `kind`, now, timed from the origin.
    fn event(&self, kind: EventKind) -> Event {
        let o = self
            .lock()
            .origin
            .expect("events are recorded after the origin is set");
        let at = Instant::now().saturating_duration_since(o.at);
        Event::new(kind, at, o.unix_ms + at.as_millis() as u64)
    }

    /// Logs `e`, appends it to the timeline (until it is final) and shows the observers.
    fn push(&self, e: Event) {
        // One INFO line per lifecycle event (a production log tells the drain in a handful of
        // lines); counts ride along so each line stands on its own.
        tracing::info!(
            event = e.event.as_str(),
            at_ms = e.at_ms,
            in_flight = self.core.counter.count(),
            connections = self.connections(),
            tasks = self.tasks.len(),
            reason = e.reason.map(CommitReason::as_str),
            name = e.name.as_deref(),
            detail = e.detail.as_deref(),
            "lameduck: {}",
            e.event
        );
        {
            let mut st = self.lock();
            // Nothing is appended once the timeline is final (the report is built from it).
            if !st.frozen {
                st.timeline.push(e);
            }
        }
        self.observe();
    }

    /// An event of `kind` with a detail, through the funnel.
    fn push_detail(&self, kind: EventKind, detail: impl Into<String>) {
        let mut e = self.event(kind);
        e.detail = Some(detail.into());
        self.push(e);
    }

    // ---- before the trigger ----

    /// Starting → Serving (once).
    pub(crate) fn mark_serving(&self) {
        let moved = self.phase.send_if_modified(|p| {
            if *p == Phase::Starting {
                *p = Phase::Serving;
                true
            } else {
                false
            }
        });
        if moved {
            self.core.mark_serving();
            tracing::info!("lameduck: serving");
            self.observe();
        }
    }

    /// Records the accept loop's timeouts for the report (`server`).
    #[cfg_attr(not(feature = "http"), allow(dead_code))] // called by `serve` of the `http` feature
    pub(crate) fn note_server(&self, server: ServerReport) {
        self.lock().server = Some(server);
    }

    /// The handlers are installed: the first trigger arms the watchdog. Returns `false` if
    /// they already were.
    pub(crate) fn note_signals_installed(&self) -> bool {
        !std::mem::replace(&mut self.lock().signals_installed, true)
    }

    pub(crate) fn note_owned_by_run(&self) {
        self.lock().owned_by_run = true;
    }

    pub(crate) fn task_context(&self) -> TaskContext {
        TaskContext {
            stop: self.tokens.drain.clone(),
            hurry: self.tokens.hurry.clone(),
            deadline: self.tokens.deadline.clone(),
            quiesce_at: Arc::clone(&self.quiesce_at),
        }
    }

    // ---- triggers ----

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
        let watchdog = {
            let mut st = self.lock();
            if let Some(origin) = st.origin {
                record_repeat(&mut st, origin, trigger, now, unix_ms);
                return false;
            }
            st.origin = Some(Origin { at: now, unix_ms });
            st.trigger = Some(trigger);
            st.receipt = from_signal.then_some(unix_ms);
            let mut e = Event::new(EventKind::DrainStarted, Duration::ZERO, unix_ms);
            e.trigger = Some(trigger);
            st.timeline.push(e);
            if self.readiness.flips_at_trigger() {
                let mut e = Event::new(EventKind::ReadinessFlipped, Duration::ZERO, unix_ms);
                if self.readiness == ReadinessWhileDraining::Auto {
                    e.detail = Some("for callers other than kubelet's probe".to_owned());
                }
                st.timeline.push(e);
            }
            st.evidence = Some(self.policy.evidence_at(self.core, now));
            st.signals_installed
        };
        if let Some(quiesce) = now.checked_add(self.budget.quiesce_deadline()) {
            let _ = self.quiesce_at.set(quiesce);
        }
        if watchdog {
            // Only a process that installed the handlers owns its exit.
            exit::arm_watchdog(
                Arc::clone(self),
                now.into_std(),
                self.budget.watchdog_deadline(),
            );
        }
        tracing::info!(
            event = "drain_started",
            trigger = trigger.as_str(),
            in_flight = self.core.counter.count(),
            grace_ms = self.budget.grace_period.as_millis() as u64,
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
        self.core.start_draining();
        self.set_phase(Phase::Draining);
        self.tokens.drain.cancel();
        let driver = Arc::clone(self);
        let span = tracing::info_span!(
            "lameduck_drain",
            trigger = trigger.as_str(),
            grace_ms = self.budget.grace_period.as_millis() as u64
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
        self.lock().stop_seen = true;
        self.terminate_seen.notify_waiters();
        if force {
            self.force();
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

    pub(crate) fn is_forced(&self) -> bool {
        self.forced.load(Ordering::Acquire)
    }

    // ---- what is known ----

    fn origin(&self) -> Option<Origin> {
        self.lock().origin
    }

    /// `origin + offset`, once the drain has started.
    fn after_origin(&self, offset: Duration) -> Option<Instant> {
        self.origin().and_then(|o| o.at.checked_add(offset))
    }

    pub(crate) fn quiesce_deadline(&self) -> Option<Instant> {
        self.after_origin(self.budget.quiesce_deadline())
    }

    pub(crate) fn hard_deadline(&self) -> Option<Instant> {
        self.after_origin(self.budget.hard_deadline())
    }

    pub(crate) fn timeline(&self) -> Vec<Event> {
        self.lock().timeline.clone()
    }

    pub(crate) fn report(&self) -> Option<DrainReport> {
        self.lock().report.clone()
    }

    /// The committed evidence, or while draining the evidence the policy waits on.
    pub(crate) fn evidence_now(&self) -> Option<EvidenceReport> {
        let (evidence, committed, origin) = {
            let st = self.lock();
            (st.evidence, st.committed.clone(), st.origin)
        };
        if committed.is_some() {
            return committed;
        }
        let (evidence, origin) = (evidence?, origin?);
        let kind = self.policy.waiting_on(&evidence);
        Some(evidence.report(kind, crate::propagation::silence(self.core, origin.at)))
    }

    // ---- the drive, step by step ----

    async fn drive(self: Arc<Self>, origin: Instant) {
        let budget = self.budget;
        // `build` proved `now + grace` representable; should the clock still refuse, the
        // deadline is now (the drain ends early, named) rather than a panic in the driver.
        let quiesce = origin
            .checked_add(budget.quiesce_deadline())
            .unwrap_or(origin);
        let hard = origin.checked_add(budget.hard_deadline()).unwrap_or(origin);
        self.arm_hurry(origin, quiesce);
        let reason = self.propagate(origin).await;
        self.stop_accepting(reason);
        let (stragglers, deadline_hit) = self.wait_for_zero(origin, quiesce, hard).await;
        self.set_phase(Phase::Closing);
        let closers = self.close(hard).await;
        let outcome = if self.is_forced() {
            Outcome::Forced
        } else if deadline_hit {
            Outcome::DeadlineExceeded
        } else if closers.iter().any(|c| !c.is_ok()) {
            Outcome::CloserFailed
        } else {
            Outcome::Clean
        };
        self.done(origin, outcome, stragglers, closers).await;
    }

    /// Fires the hurry token `hurry_lead` before the quiesce deadline (or with the deadline).
    fn arm_hurry(&self, origin: Instant, quiesce: Instant) {
        let hurry_at = quiesce
            .checked_sub(self.hurry_lead)
            .unwrap_or(origin)
            .max(origin);
        let hurry = self.tokens.hurry.clone();
        let deadline = self.tokens.deadline.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = tokio::time::sleep_until(hurry_at) => hurry.cancel(),
                () = deadline.cancelled() => hurry.cancel(),
            }
        });
    }

    /// Step 1: waits for the propagation policy (or the force), records what it went on.
    async fn propagate(&self, origin: Instant) -> CommitReason {
        let evidence = self
            .lock()
            .evidence
            .expect("the evidence is taken with the origin");
        let (reason, kind) = tokio::select! {
            r = self.policy.commit(self.core, origin, evidence) => r,
            () = self.tokens.force.cancelled() => (CommitReason::Forced, EvidenceKind::Cut),
        };
        let committed = evidence.report(kind, crate::propagation::silence(self.core, origin));
        let mut e = self.event(EventKind::PropagationDone);
        e.reason = Some(reason);
        // The evidence rides on its event's log line and in the timeline.
        e.detail = Some(committed.describe());
        self.lock().committed = Some(committed);
        self.push(e);
        reason
    }

    /// Step 2: `stopped_accepting`, the late readiness flip, the stop token.
    fn stop_accepting(&self, reason: CommitReason) {
        let mut e = self.event(EventKind::StoppedAccepting);
        e.reason = Some(reason);
        self.push(e);
        match self.readiness {
            ReadinessWhileDraining::ServingUntilStop => {
                self.push(self.event(EventKind::ReadinessFlipped));
            }
            ReadinessWhileDraining::Auto => {
                self.push_detail(EventKind::ReadinessFlipped, "for kubelet's probe");
            }
            _ => {}
        }
        self.set_phase(Phase::StoppedAccepting);
        self.tokens.stop.cancel();
        self.tasks.tracker.close();
    }

    /// Step 3: waits for zero (requests and tasks), or the quiesce deadline, where what is
    /// left is named and cut. Returns the stragglers and whether the deadline hit.
    async fn wait_for_zero(
        &self,
        origin: Instant,
        quiesce: Instant,
        hard: Instant,
    ) -> (Vec<Straggler>, bool) {
        let mut stragglers = Vec::new();
        let mut deadline_hit = false;
        if !self.is_forced() {
            let requests = async {
                self.core.wait_zero().await;
                self.push(self.event(EventKind::InFlightZero));
            };
            let tasks = async {
                self.tasks.tracker.wait().await;
                self.push(self.event(EventKind::TasksDone));
            };
            let both = async { tokio::join!(requests, tasks) };
            tokio::select! {
                _ = both => {}
                () = tokio::time::sleep_until(quiesce) => deadline_hit = true,
                () = self.tokens.force.cancelled() => {}
            }
        }
        if deadline_hit {
            stragglers = self.collect_stragglers(quiesce, origin);
            self.push_detail(
                EventKind::DeadlineExceeded,
                format!("{} stragglers", stragglers.len()),
            );
            self.tokens.deadline.cancel();
            for (name, result) in self.tasks.recover_and_abort(hard).await {
                if let Some(s) = stragglers.iter_mut().find(|s| {
                    s.kind == crate::report::StragglerKind::Task
                        && s.name == name
                        && s.recovery.is_none()
                }) {
                    s.recovery = Some(result);
                }
            }
        }
        if self.is_forced() {
            self.tokens.deadline.cancel();
            self.tasks.abort_all();
        }
        (stragglers, deadline_hit)
    }

    /// Step 4: the closers, in reverse order (none when forced).
    async fn close(&self, hard: Instant) -> Vec<CloserResult> {
        self.closers
            .run(hard, self.is_forced(), |r: &CloserResult| {
                let mut e = self.event(EventKind::ResourceClosed);
                e.name = Some(r.name.clone());
                e.detail = Some(r.result.to_string());
                self.push(e);
            })
            .await
    }

    /// Step 5: the Done event, the report, its emission, then the phase.
    async fn done(
        &self,
        origin: Instant,
        outcome: Outcome,
        stragglers: Vec<Straggler>,
        closers: Vec<CloserResult>,
    ) {
        self.push_detail(EventKind::Done, outcome.as_str());
        let owned_by_run = {
            let mut st = self.lock();
            st.frozen = true;
            st.owned_by_run
        };
        let mut report = self.build_report(origin, outcome, stragglers, closers);
        // AcqRel: pairs with the watchdog's claim; only one of them writes the report.
        if self
            .emission
            .compare_exchange(EMIT_NONE, EMIT_DRIVER, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            // The watchdog took over: it writes the report and exits the process.
            return;
        }
        // Under `run`, the stderr line waits for the exit, so it is written once and complete.
        let emitted = self.emit_off_runtime(&report, !owned_by_run).await;
        emitted.apply_to(&mut report);
        // Before the phase turns Done, so whoever awaits Done finds the histograms recorded.
        for o in &self.observers {
            o(Observed::Done(&report));
        }
        self.lock().report = Some(report);
        self.set_phase(Phase::Done);
    }
}

/// Records a trigger after the first: collapsed into the first event of its kind (a count),
/// or a new `signal_received` event; into the late signals once the timeline is final.
fn record_repeat(st: &mut Lifecycle, origin: Origin, trigger: Trigger, now: Instant, unix_ms: u64) {
    let timeline = if st.frozen {
        &mut st.late_signals
    } else {
        &mut st.timeline
    };
    if let Some(e) = timeline
        .iter_mut()
        .find(|e| e.event == EventKind::SignalReceived && e.trigger == Some(trigger))
    {
        e.count = Some(e.count.unwrap_or(1).saturating_add(1));
        return;
    }
    let mut e = Event::new(
        EventKind::SignalReceived,
        now.saturating_duration_since(origin.at),
        unix_ms,
    );
    e.trigger = Some(trigger);
    tracing::info!(
        event = "signal_received",
        trigger = trigger.as_str(),
        at_ms = e.at_ms,
        "lameduck: trigger received while draining"
    );
    timeline.push(e);
}
