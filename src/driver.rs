//! The lifecycle, from the first trigger to Done and the exit: [`Driver`] runs the phases in
//! order — trigger, propagation wait, stop accepting, wait for zero, stragglers, closing,
//! Done — each a short method over the parts it owns, each part a type with private fields
//! in its own file:
//!
//! * `Lifecycle` (`lifecycle.rs`): the origin, the trigger, the timeline (`timeline.rs`),
//!   what the commit went on and the report, behind the driver's one lock;
//! * `Deadlines` (`deadlines.rs`): the budget, the link, `max`, the hurry lead and the
//!   quiesce instant the tasks read — every deadline, computed there only;
//! * `Commitment` (`commit.rs`): the propagation policy, its evidence and its wait;
//! * `Exit` (`exit.rs`): the sinks, the emission claim, the watchdog, the stop signal's
//!   arrival and the exit holds — the one place a report is written;
//! * `Tokens` (`tokens.rs`), the stragglers (`stragglers.rs`), the Kubernetes events
//!   (`endpoints.rs`), `/status` (`status.rs`), the observer (`observer.rs`).
//!
//! # Invariants
//!
//! * The first trigger wins: it fixes the budget's origin under the lifecycle's lock
//!   (`Lifecycle::begin`), sets the counter's draining flag, and spawns the one driver task.
//!   Later triggers only raise the count of one `signal_received` event per trigger kind, so
//!   the timeline stays bounded whatever the number of triggers; once the Done event is in,
//!   the timeline is final.
//! * Every event is appended through one funnel, `Timeline::push` (`timeline.rs`), which
//!   drops it once the timeline is final. Events after the start go through [`Driver::push`]
//!   (one log line each, and the observer — the metrics, feature `metrics` — told), phase
//!   changes through [`Driver::set_phase`]. Three appends log on their own or not at all: the
//!   start's events, pushed under the same lock that fixes the origin (a concurrent trigger
//!   must see both); the Kubernetes events seen before the trigger, added at 0 ms; and the
//!   watchdog's Done, which must not log to the stderr that may be stalled.
//! * The final report is written by exactly one of the driver and the watchdog thread, at
//!   one site (`Exit::write`); under `run` the watchdog stays armed until the report's last
//!   write (after Done) is over, so no sink can hold the exit past it (`exit.rs`).
//! * No part's lock is held while another part's is taken, the lifecycle's is never held
//!   across an `.await` nor taken on the request path, so they cannot deadlock.
//! * Phases only move forward; each transition is published on a `watch` channel.
//! * The deadlines only tighten: they are the budget's, moved earlier by a Pod deletion with a
//!   shorter grace (the link, feature `kube`), and every wait re-reads them when the link
//!   changes. The driver reads the link; only the watch writes it, through the handle.
//! * The lifecycle calls no add-on (it tells an [`Observer`]) and does not reach up into the
//!   signal source: signals arrive through [`Driver::on_signal`], the stop signal by name.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::budget::Budget;
use crate::closers::{CloserResult, Closers};
use crate::guard::{Core, Site};
use crate::phase::{unix_ms_now, CommitReason, Event, EventKind, Phase, Trigger};
use crate::propagation::Policy;
use crate::readiness::{ReadinessWhileDraining, SourceTable};
use crate::report::{AfterFlipReport, BudgetReport, DrainReport, EvidenceReport, Outcome};
use crate::report::{PodInfo, ServerReport, Sinks, Straggler, StragglerKind};
use crate::tasks::{TaskContext, Tasks};

mod commit;
mod deadlines;
mod endpoints;
mod exit;
mod lifecycle;
mod observer;
mod status;
mod stragglers;
mod timeline;
mod tokens;

use commit::Commitment;
use deadlines::Deadlines;
use exit::Exit;
#[cfg(feature = "admin")]
pub(crate) use exit::ExitHolds;
use lifecycle::{Begin, Lifecycle};
pub(crate) use observer::{Observer, Sample};
pub use status::{Status, STATUS_TIMELINE_LIMIT};
pub(crate) use tokens::Tokens;

/// The settings the builder validated, for the driver.
pub(crate) struct Settings {
    pub(crate) budget: Budget,
    pub(crate) policy: Policy,
    pub(crate) readiness: ReadinessWhileDraining,
    pub(crate) probe_sources: SourceTable,
    pub(crate) sinks: Sinks,
    pub(crate) hurry_lead: Duration,
    pub(crate) proxy_label: Option<String>,
    /// An add-on that follows the lifecycle (the metrics), if one is built in.
    pub(crate) observer: Option<Box<dyn Observer>>,
}

/// The lifecycle engine behind a [`Drain`](crate::Drain).
pub(crate) struct Driver {
    pub(crate) core: &'static Core,
    /// `core`'s plain site, at hand for `Drain::enter` (one load fewer than `Core::plain`).
    pub(crate) plain: &'static Site,
    deadlines: Deadlines,
    commitment: Commitment,
    readiness: ReadinessWhileDraining,
    /// Who called `/readyz` and how each was classified (the readiness part writes it).
    probe_sources: SourceTable,
    proxy_label: Option<String>,
    observer: Option<Box<dyn Observer>>,
    phase: watch::Sender<Phase>,
    state: Lifecycle,
    pub(crate) tokens: Tokens,
    forced: AtomicBool,
    exit: Exit,
    pub(crate) tasks: Tasks,
    pub(crate) closers: Closers,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("phase", &*self.phase.borrow())
            .field("deadlines", &self.deadlines)
            .finish_non_exhaustive()
    }
}

impl Driver {
    pub(crate) fn new(core: &'static Core, s: Settings) -> Self {
        let commitment = Commitment::new(s.policy);
        Self {
            core,
            plain: core.plain(),
            deadlines: Deadlines::new(s.budget, commitment.max(), s.hurry_lead),
            commitment,
            readiness: s.readiness,
            probe_sources: s.probe_sources,
            proxy_label: s.proxy_label,
            observer: s.observer,
            phase: watch::channel(Phase::Starting).0,
            state: Lifecycle::default(),
            tokens: Tokens::default(),
            forced: AtomicBool::new(false),
            exit: Exit::new(s.sinks),
            tasks: Tasks::default(),
            closers: Closers::default(),
        }
    }

    // ---- the phase, the counts and the one funnel ----

    pub(crate) fn phase(&self) -> Phase {
        self.core.phase()
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<Phase> {
        self.phase.subscribe()
    }

    /// Moves to `phase` and samples the metrics.
    fn set_phase(&self, phase: Phase) {
        // The mirror first: whoever the channel wakes reads the new phase from either.
        self.core.set_phase(phase);
        self.phase.send_modify(|p| *p = phase);
        self.observe();
    }

    /// The lifecycle's counts now: what an observer is told.
    pub(crate) fn sample(&self) -> Sample {
        let af = self.core.observed().after_flip();
        Sample {
            phase: self.phase(),
            in_flight: self.core.counter.count(),
            connections: self.connections(),
            tasks: self.tasks.len(),
            requests_on_new: af.requests_on_new,
            requests_on_reused: af.requests_on_reused,
        }
    }

    /// Tells the observer (the metrics, feature `metrics`) the counts now: at lifecycle
    /// events, never per request.
    pub(crate) fn observe(&self) {
        if let Some(o) = &self.observer {
            o.sampled(&self.sample());
        }
    }

    pub(crate) fn connections(&self) -> usize {
        self.core.observed().connections()
    }

    /// Logs `e`, appends it to the timeline (until it is final) and samples the metrics.
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
        self.state.push(e);
        self.observe();
    }

    /// An event of `kind` now, with `detail` if any, through the funnel.
    fn push_now(&self, kind: EventKind, detail: Option<String>) {
        let mut e = self.state.event(kind);
        e.detail = detail;
        self.push(e);
    }

    // ---- before the trigger, and what the handle reads ----

    /// A startup gate was created: Starting now means "not ready yet", not "nobody said".
    pub(crate) fn note_startup_gate(&self) {
        self.state.note_gate();
    }

    /// Starting → Serving (once).
    pub(crate) fn mark_serving(&self) {
        let moved = self.phase.send_if_modified(|p| {
            let moved = *p == Phase::Starting;
            if moved {
                self.core.set_phase(Phase::Serving);
                *p = Phase::Serving;
            }
            moved
        });
        if moved {
            self.core.observed().mark_serving();
            tracing::info!("lameduck: serving");
            self.observe();
        }
    }

    /// Records the accept loop's timeouts for the report (`server`).
    #[cfg(feature = "http")]
    pub(crate) fn note_server(&self, server: ServerReport) {
        self.state.note_server(server);
    }

    /// The handlers are installed: the first trigger arms the watchdog. Returns `false` if
    /// they already were.
    pub(crate) fn note_signals_installed(&self) -> bool {
        self.exit.watch()
    }

    pub(crate) fn note_owned_by_run(&self) {
        self.exit.own();
    }

    pub(crate) fn task_context(&self) -> TaskContext {
        self.tokens.task_context(self.deadlines.task_deadline())
    }

    pub(crate) fn is_forced(&self) -> bool {
        self.forced.load(Ordering::Acquire)
    }

    pub(crate) fn budget(&self) -> Budget {
        self.deadlines.budget()
    }

    fn origin(&self) -> Option<Instant> {
        self.state.origin().map(|o| o.at)
    }

    /// The quiesce deadline, once the drain has started (a shorter deletion grace moves it).
    pub(crate) fn quiesce_deadline(&self) -> Option<Instant> {
        self.origin().map(|o| self.deadlines.quiesce(o))
    }

    /// The hard deadline, once the drain has started (a shorter deletion grace moves it).
    pub(crate) fn hard_deadline(&self) -> Option<Instant> {
        self.origin().map(|o| self.deadlines.hard(o))
    }

    pub(crate) fn timeline(&self) -> Vec<Event> {
        self.state.events()
    }

    pub(crate) fn report(&self) -> Option<DrainReport> {
        self.state.report()
    }

    /// The committed evidence, or while draining the evidence the policy waits on.
    pub(crate) fn evidence_now(&self) -> Option<EvidenceReport> {
        let (evidence, committed, origin) = self.state.evidence_now();
        let now = (evidence, committed, origin.map(|o| o.at));
        self.commitment
            .evidence_now(self.core, self.deadlines.link(), now)
    }

    /// The snapshot, with `ready` and `ready_for_kubelet` as the readiness part says.
    pub(crate) fn status(&self, phase: Phase, ready: bool, ready_for_kubelet: bool) -> Status {
        let (trigger, timeline, timeline_omitted, origin) =
            self.state.bounded(STATUS_TIMELINE_LIMIT);
        let used = origin.map_or(Duration::ZERO, |o| o.at.elapsed());
        Status {
            phase,
            ready,
            ready_for_kubelet,
            trigger,
            in_flight: self.core.counter.count(),
            connections: self.connections(),
            tasks: self.tasks.len(),
            readiness_policy: self.readiness,
            budget: BudgetReport {
                deletion: origin.and_then(|o| self.deadlines.deletion(o.at)),
                ..BudgetReport::new(&self.budget(), used)
            },
            timeline,
            timeline_omitted,
            evidence: self.evidence_now(),
            probe_sources: self.probe_sources.snapshot(),
        }
    }

    // ---- what the add-ons reach (admin, http, kube) ----

    /// The table of `/readyz` callers, which the admin router writes.
    #[cfg(feature = "admin")]
    pub(crate) fn probe_sources(&self) -> &SourceTable {
        &self.probe_sources
    }

    /// The propagation policy's settings, as the report gives them (for `/drain`).
    #[cfg(feature = "admin")]
    pub(crate) fn policy_report(&self) -> crate::report::PolicyReport {
        self.commitment.report()
    }

    /// Answers owed to admin callers before the process exits.
    #[cfg(feature = "admin")]
    pub(crate) fn exit_holds(&self) -> &ExitHolds {
        self.exit.holds()
    }

    /// The link the Kubernetes watch writes (and the accept loop, for the startup measurement).
    #[cfg(any(feature = "http", feature = "kube"))]
    pub(crate) fn link(&self) -> &crate::link::Link {
        self.deadlines.link()
    }

    /// Records the deletion's kill time; `true` if it tightened the budget.
    #[cfg(feature = "kube")]
    pub(crate) fn tighten(&self, kill: crate::link::Kill) -> bool {
        self.deadlines.tighten(kill, self.origin())
    }

    /// Records an event the API reported (an endpoint condition change, the deletion's
    /// budget) at `at`: in the timeline once the drain started, kept for its start before.
    #[cfg(feature = "kube")]
    pub(crate) fn record_external(
        &self,
        kind: EventKind,
        name: Option<String>,
        detail: String,
        at: Instant,
        unix_ms: u64,
    ) {
        let (link, what) = (self.deadlines.link(), (kind, name, detail));
        if let Some(e) = endpoints::external(link, self.origin(), what, at, unix_ms) {
            self.push(e);
        }
    }

    // ---- the trigger ----

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
        // the lifecycle's lock: that lock is never held while another part's is taken.
        let was_starting = self.phase() == Phase::Starting;
        let begin = Begin {
            trigger,
            at: now,
            unix_ms,
            from_signal,
            was_starting,
            events: self.start_events(trigger, unix_ms),
            evidence: || self.commitment.evidence_at(self.core, now),
        };
        if let Err(new_event) = self.state.begin(begin) {
            if let Some(at_ms) = new_event {
                let trigger = trigger.as_str();
                tracing::info!(
                    event = "signal_received",
                    trigger,
                    at_ms,
                    "lameduck: trigger received while draining"
                );
            }
            return false;
        }
        self.deadlines.started(now);
        if self.exit.is_watched() {
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
        let grace_ms = self.budget().grace_period.as_millis() as u64;
        let span = tracing::info_span!("lameduck_drain", trigger = trigger.as_str(), grace_ms);
        let drive = async move {
            // The runtime's notice, against the signal's receipt.
            driver.state.note_noticed(unix_ms_now());
            driver.drive(now).await
        };
        tokio::spawn(tracing::Instrument::instrument(drive, span));
        true
    }

    /// The start's events at 0 ms: `drain_started`, and `readiness_flipped` when the policy
    /// flips at the trigger.
    fn start_events(&self, trigger: Trigger, unix_ms: u64) -> Vec<Event> {
        let mut started = Event::new(EventKind::DrainStarted, Duration::ZERO, unix_ms);
        started.trigger = Some(trigger);
        let mut events = vec![started];
        if self.readiness.flips_at_trigger() {
            let mut e = Event::new(EventKind::ReadinessFlipped, Duration::ZERO, unix_ms);
            if self.readiness == ReadinessWhileDraining::Auto {
                e.detail = Some("for callers other than kubelet's probe".to_owned());
            }
            events.push(e);
        }
        events
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
            let policy = self.readiness.as_str();
            tracing::info!(
                event = "readiness_flipped",
                at_ms = 0u64,
                policy,
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
        self.state.ignored_signal(name, at, unix_ms);
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

    // ---- the drive: the phases in order ----

    /// The one driver task, spawned by the first trigger with its origin: each phase below in
    /// turn, then the report.
    ///
    /// The deadlines are re-read at each step (`Deadlines`): a Pod deletion with a shorter
    /// grace (feature `kube`) moves them earlier, also mid-drain. `build` proved
    /// `now + grace` representable; should the clock still refuse, a deadline is now (the
    /// drain ends early, named) rather than a panic in the driver.
    async fn drive(self: Arc<Self>, origin: Instant) {
        // Events the Kubernetes watch saw before the trigger (feature `kube`): they logged
        // when seen, so they skip the funnel's line.
        self.state
            .append(endpoints::early_events(self.deadlines.link(), origin));
        self.arm_hurry(origin);
        let reason = self.propagate(origin).await;
        self.stop_accepting(reason);
        let (stragglers, deadline_hit) = self.wait_for_zero(origin).await;
        self.set_phase(Phase::Closing);
        let closers = self.close(self.deadlines.hard(origin)).await;
        let outcome = if self.is_forced() {
            Outcome::Forced
        } else if deadline_hit {
            // Exit 1 even if every cut task's recovery worked: a drain that needs a salvage at
            // the deadline did not fit its budget, and alerting should see that (a task that
            // returns on `hurry` keeps it clean).
            Outcome::DeadlineExceeded
        } else if closers.iter().any(|c| !c.is_ok()) {
            Outcome::CloserFailed
        } else {
            Outcome::Clean
        };
        self.done(origin, outcome, stragglers, closers).await;
    }

    /// Fires the hurry token `hurry_lead` before the quiesce deadline (or with the deadline).
    fn arm_hurry(self: &Arc<Self>, origin: Instant) {
        let driver = Arc::clone(self);
        tokio::spawn(async move {
            let (hurry, deadline) = (&driver.tokens.hurry, &driver.tokens.deadline);
            let mut phase = driver.subscribe();
            tokio::select! {
                () = driver.deadlines.until_hurry(origin) => hurry.cancel(),
                () = deadline.cancelled() => hurry.cancel(),
                // Holds the driver (to re-read the deadlines): not past the end of the drain.
                _ = phase.wait_for(|p| *p == Phase::Done) => {}
            }
        });
    }

    /// Step 1: waits for the propagation policy (or the force), records what it went on.
    async fn propagate(&self, origin: Instant) -> CommitReason {
        let evidence = self.state.evidence();
        let max_at = || self.deadlines.max_at(origin);
        let (link, force) = (self.deadlines.link(), &self.tokens.force);
        let wait = self
            .commitment
            .wait(self.core, origin, evidence, link, max_at, force);
        let (reason, committed) = wait.await;
        let mut e = self.state.event(EventKind::PropagationDone);
        e.reason = Some(reason);
        // The evidence rides on its event's log line and in the timeline.
        e.detail = Some(committed.describe());
        self.state.committed(committed);
        self.push(e);
        reason
    }

    /// Step 2: `stopped_accepting`, the late readiness flip, the stop token.
    fn stop_accepting(&self, reason: CommitReason) {
        let mut e = self.state.event(EventKind::StoppedAccepting);
        e.reason = Some(reason);
        self.push(e);
        match self.readiness {
            ReadinessWhileDraining::ServingUntilStop => {
                self.push_now(EventKind::ReadinessFlipped, None);
            }
            ReadinessWhileDraining::Auto => {
                let detail = "for kubelet's probe".to_owned();
                self.push_now(EventKind::ReadinessFlipped, Some(detail));
            }
            _ => {}
        }
        self.set_phase(Phase::StoppedAccepting);
        self.tokens.stop.cancel();
        self.tasks.tracker.close();
    }

    /// Step 3: waits for zero (requests and tasks), or the quiesce deadline, where what is
    /// left is named and cut. Returns the stragglers and whether the deadline hit.
    async fn wait_for_zero(&self, origin: Instant) -> (Vec<Straggler>, bool) {
        let mut deadline_hit = false;
        if !self.is_forced() {
            let requests = async {
                self.core.wait_zero().await;
                self.push_now(EventKind::InFlightZero, None);
            };
            let tasks = async {
                self.tasks.tracker.wait().await;
                self.push_now(EventKind::TasksDone, None);
            };
            let both = async { tokio::join!(requests, tasks) };
            tokio::select! {
                _ = both => {}
                () = self.deadlines.until_quiesce(origin) => deadline_hit = true,
                () = self.tokens.force.cancelled() => {}
            }
        }
        let mut stragglers = Vec::new();
        if deadline_hit {
            stragglers = self.cut_at_deadline(origin).await;
        }
        if self.is_forced() {
            // What the force cuts is named, as at the deadline (unless the deadline came first).
            if !deadline_hit {
                stragglers = stragglers::collect(self.core, &self.tasks, Instant::now(), origin);
            }
            self.tokens.deadline.cancel();
            self.tasks.abort_all();
        }
        (stragglers, deadline_hit)
    }

    /// The quiesce deadline: names what is left, fires the deadline token, and lets the tasks
    /// recover (by the hard deadline) before they are aborted.
    async fn cut_at_deadline(&self, origin: Instant) -> Vec<Straggler> {
        let at = self.deadlines.quiesce(origin);
        let mut stragglers = stragglers::collect(self.core, &self.tasks, at, origin);
        let detail = format!("{} stragglers", stragglers.len());
        self.push_now(EventKind::DeadlineExceeded, Some(detail));
        self.tokens.deadline.cancel();
        let hard = self.deadlines.hard(origin);
        for (name, result) in self.tasks.recover_and_abort(hard).await {
            let task = |s: &&mut Straggler| {
                s.kind == StragglerKind::Task && s.name == name && s.recovery.is_none()
            };
            if let Some(s) = stragglers.iter_mut().find(task) {
                s.recovery = Some(result);
            }
        }
        stragglers
    }

    /// Step 4: the closers, in reverse order (recorded `skipped` once forced).
    async fn close(&self, hard: Instant) -> Vec<CloserResult> {
        let closed = |r: &CloserResult| {
            let mut e = self.state.event(EventKind::ResourceClosed);
            e.name = Some(r.name.clone());
            e.detail = Some(r.result.to_string());
            self.push(e);
        };
        self.closers.run(hard, &self.tokens.force, closed).await
    }

    /// Step 5: the Done event, the report, its emission, then the phase.
    async fn done(
        &self,
        origin: Instant,
        outcome: Outcome,
        stragglers: Vec<Straggler>,
        closers: Vec<CloserResult>,
    ) {
        self.push_now(EventKind::Done, Some(outcome.as_str().to_owned()));
        self.state.freeze();
        let mut report = self.build_report(origin, outcome, stragglers, closers);
        // Under `run`, the stderr line waits for the exit, so it is written once and complete.
        let stderr = !self.exit.is_owned();
        if !self
            .exit
            .emit(&mut report, stderr, self.sink_deadline())
            .await
        {
            // The watchdog took over: it writes the report and exits the process.
            return;
        }
        // Before the phase turns Done, so whoever awaits Done finds the histograms recorded.
        if let Some(o) = &self.observer {
            o.done(&report);
        }
        self.state.set_report(report);
        self.set_phase(Phase::Done);
        // The report holds them now; the core block is leaked, its growth must not be.
        self.core.release_drain_state();
    }

    /// The report of a drain that started at `origin`, with its advice.
    fn build_report(
        &self,
        origin: Instant,
        outcome: Outcome,
        stragglers: Vec<Straggler>,
        closers: Vec<CloserResult>,
    ) -> DrainReport {
        let after_flip = AfterFlipReport::from_core(self.core, origin);
        let used = origin.elapsed();
        let record = self.state.record();
        let mut propagation = self.commitment.report();
        propagation.evidence = record.committed;
        let mut report = DrainReport {
            outcome,
            trigger: record.trigger,
            exit_code: outcome.exit_code(),
            readiness_policy: self.readiness,
            budget: BudgetReport::new(&self.budget(), used),
            propagation,
            timeline: record.timeline,
            after_flip,
            stragglers,
            tasks: self.tasks.ended(),
            closers,
            pod: PodInfo::from_env(),
            advice: Vec::new(),
            cause: None,
            signal_receipt: record.signal_receipt,
            stop_signal_wait: None,
            sink_errors: Vec::new(),
            proxy_label: self.proxy_label.clone(),
            server: record.server,
            probe_sources: self.probe_sources.snapshot(),
        };
        report.budget.deletion = self.deadlines.deletion(origin);
        report.advice = crate::advice::advise(&report);
        report
    }

    // ---- the exit ----

    /// The exit under `run`, once Done: after a drain a `preStop` call started, the wait for
    /// the stop signal named `stop` (when a signal source is installed); the answers owed to
    /// admin callers; the report's last write.
    pub(crate) async fn exit(&self, mut report: DrainReport, stop: Option<&str>) -> DrainReport {
        let after_prestop = self.state.trigger() == Some(Trigger::PreStop);
        if let Some(stop) = stop.filter(|_| after_prestop && !self.is_forced()) {
            let (hard, force) = (self.hard_deadline(), &self.tokens.force);
            self.exit
                .wait_for_stop_signal(&mut report, stop, hard, force)
                .await;
        }
        let (hard, cap) = (self.hard_deadline(), self.settle_cap());
        self.exit.settle(&mut report, hard, cap).await;
        self.finish(report).await
    }

    /// Completes the report for the exit (signals received after Done, the `exit` event) and
    /// writes it to every sink for the last time.
    async fn finish(&self, mut report: DrainReport) -> DrainReport {
        report.timeline.extend(self.state.late_signals());
        let mut e = match self.state.origin() {
            Some(o) => o.event_at(EventKind::Exit, Instant::now()),
            None => Event::new(EventKind::Exit, Duration::ZERO, unix_ms_now()),
        };
        e.code = Some(report.exit_code);
        report.timeline.push(e);
        // The driver's claim, taken at Done, still holds: the watchdog cannot have this one.
        self.exit
            .emit(&mut report, true, self.sink_deadline())
            .await;
        self.state.set_report(report.clone());
        self.exit.release();
        report
    }

    /// How long `run` may wait for admin answers, when the watchdog watches this process.
    fn settle_cap(&self) -> Option<Instant> {
        let origin = self.origin().filter(|_| self.exit.is_watched())?;
        Some(self.deadlines.settle_cap(origin))
    }

    /// When the sinks must be done, on the real clock (see `Deadlines::sink_deadline`).
    fn sink_deadline(&self) -> std::time::Instant {
        let watched = self.origin().filter(|_| self.exit.is_watched());
        self.deadlines.sink_deadline(watched)
    }

    /// Called on the watchdog thread once the hard deadline (plus half the safety margin) has
    /// passed, with `until` for its own writes (a quarter of the margin later, still before
    /// SIGKILL). If the drain is not Done, the runtime is starved: writes a `forced` report
    /// with what is known and exits the process with code 1. If it is Done but `run` has not
    /// finished its last write (a sink or the runtime is stuck), exits with the drain's code.
    fn watchdog_fire(&self, until: std::time::Instant) {
        let done = self.phase() == Phase::Done;
        if !self
            .exit
            .watchdog_claims(done, self.state.exit_code(), until)
        {
            return;
        }
        let Some(origin) = self.state.origin() else {
            return;
        };
        let now = Instant::now();
        let stragglers = stragglers::collect(self.core, &self.tasks, now, origin.at);
        let mut e = origin.event_at(EventKind::Done, now);
        e.detail = Some("forced: runtime starved".to_owned());
        // Not through `push`: its log line may go to the very stderr that stalls.
        self.state.push_last(e);
        self.forced.store(true, Ordering::Release);
        // Those not yet taken by the driver never ran.
        let closers = self.closers.skipped_by_force();
        let mut report = self.build_report(origin.at, Outcome::Forced, stragglers, closers);
        report.cause = Some(format!(
            "runtime starved: the drain had not finished {} ms after the trigger (hard deadline \
             {} ms); something blocks the runtime's worker threads",
            now.saturating_duration_since(origin.at).as_millis(),
            self.budget().hard_deadline().as_millis()
        ));
        let mut e = origin.event_at(EventKind::Exit, now);
        e.code = Some(1);
        report.timeline.push(e);
        self.exit.write_and_exit(&report, until, 1);
    }
}
