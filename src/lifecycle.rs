//! The lifecycle, from the first trigger to Done and the exit. [`Driver`] runs the phases in
//! order — trigger, propagation wait, stop accepting, wait for zero, stragglers, closing,
//! Done, the exit — each a short method over parts it owns, each a type with private fields
//! in its own file: `Lifecycle` (the record: origin, trigger, timeline, report; the facts
//! the report states), `Progress` (the phase, the counts, the log line, the observer),
//! `Deadlines` (every deadline), `Commitment` (the propagation policy and its wait), `Exit`
//! (the report's one writer, the watchdog, the exit holds) and `Tokens`.
//!
//! # Invariants
//!
//! * The first trigger wins: it fixes the origin under the lifecycle's lock
//!   (`Lifecycle::begin`), sets the counter's draining flag and spawns the one driver task;
//!   later triggers only count (`timeline.rs`), so the timeline stays bounded.
//! * Events after the start go through [`Driver::push`] (one log line each, the observer
//!   told), into the timeline's one funnel, which drops them once Done is in. Three appends
//!   log on their own or not at all: the start's events (under the lock that fixes the
//!   origin), the Kubernetes events seen before the trigger (at 0 ms), and the watchdog's
//!   Done, which must not log to the stderr that may be stalled.
//! * A report is written at one site, by exactly one of the driver and the watchdog
//!   (`exit.rs`); phases only move forward (`progress.rs`); deadlines only tighten.
//! * No part's lock is held while another part's is taken, and the lifecycle's is never held
//!   across an `.await` nor taken on the request path, so they cannot deadlock.
//! * The lifecycle calls no add-on (it tells an [`Observer`]) and does not reach up into the
//!   signal source: signals arrive through [`Driver::on_signal`], the stop signal by name.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::time::Instant;

use crate::hot::guard::{Core, Site};
use crate::report::{CloserResult, DrainReport, EvidenceReport, Outcome};
use crate::vocab::phase::{unix_ms_now, CommitReason, Event, EventKind, Phase, Trigger};
use crate::work::Work;

mod after_flip;
mod commit;
mod deadlines;
mod endpoints;
mod exit;
mod observer;
mod progress;
mod record;
mod settings;
mod status;
mod stragglers;
mod timeline;
mod tokens;

use commit::Commitment;
use deadlines::Deadlines;
use exit::Exit;
#[cfg(feature = "admin")]
pub(crate) use exit::ExitHolds;
pub(crate) use observer::Observer;
#[cfg(feature = "metrics")]
pub(crate) use observer::Sample;
use progress::Progress;
use record::{Begin, Draft, Ending, Lifecycle};
pub(crate) use settings::Settings;
pub use status::{Status, STATUS_TIMELINE_LIMIT};
pub(crate) use tokens::Tokens;

/// The lifecycle engine behind a [`Drain`](crate::Drain).
#[derive(Debug)]
pub(crate) struct Driver {
    pub(crate) core: &'static Core,
    /// `core`'s plain site, at hand for `Drain::enter` (one load fewer than `Core::plain`).
    pub(crate) plain: &'static Site,
    progress: Progress,
    state: Lifecycle,
    deadlines: Deadlines,
    commitment: Commitment,
    pub(crate) tokens: Tokens,
    forced: AtomicBool,
    exit: Exit,
    /// The tasks and closers; the handle's clones share them.
    pub(crate) work: Work,
}

impl Driver {
    pub(crate) fn new(core: &'static Core, s: Settings) -> Self {
        let commitment = Commitment::new(s.policy);
        let deadlines = Deadlines::new(s.budget, commitment.max(), s.hurry_lead, s.shortest_grace);
        let tokens = Tokens::default();
        let work = Work::new(tokens.task_context(deadlines.task_deadline()));
        Self {
            core,
            plain: core.plain(),
            progress: Progress::new(core, s.observer, work.tasks().tracker.clone()),
            state: Lifecycle::new(s.readiness, s.probe_sources, s.proxy_label),
            deadlines,
            commitment,
            tokens,
            forced: AtomicBool::new(false),
            exit: Exit::new(s.sinks),
            work,
        }
    }

    /// The phase, the counts and the observer.
    pub(crate) fn progress(&self) -> &Progress {
        &self.progress
    }

    /// The drain's record (timeline, report) and the facts it states.
    pub(crate) fn record(&self) -> &Lifecycle {
        &self.state
    }

    /// Every deadline, the budget and the link.
    pub(crate) fn deadlines(&self) -> &Deadlines {
        &self.deadlines
    }

    /// The end of the process: the report's writing, the watchdog, the exit holds.
    pub(crate) fn exit(&self) -> &Exit {
        &self.exit
    }

    /// Logs `e`, appends it to the timeline (until it is final) and samples the metrics.
    fn push(&self, e: Event) {
        self.progress.log(&e);
        self.state.push(e);
        self.progress.observe();
    }

    /// An event of `kind` now, with `detail` if any, through the funnel.
    fn push_now(&self, kind: EventKind, detail: Option<&str>) {
        let mut e = self.state.event(kind);
        e.detail = detail.map(str::to_owned);
        self.push(e);
    }

    fn is_forced(&self) -> bool {
        self.forced.load(Ordering::Acquire)
    }

    /// The committed evidence, or while draining the evidence the policy waits on.
    pub(crate) fn evidence_now(&self) -> Option<EvidenceReport> {
        let link = self.deadlines.link();
        self.commitment.evidence_now(self.core, link, &self.state)
    }

    /// The snapshot, with `ready` and `ready_for_kubelet` as the readiness part says.
    pub(crate) fn status(&self, phase: Phase, ready: bool, ready_for_kubelet: bool) -> Status {
        let (sample, evidence) = (self.progress.sample(), self.evidence_now());
        let readiness = (phase, ready, ready_for_kubelet);
        self.state
            .status(readiness, sample, &self.deadlines, evidence)
    }

    /// The propagation policy's settings, as the report gives them (for `/drain`).
    #[cfg(feature = "admin")]
    pub(crate) fn policy_report(&self) -> crate::report::PolicyReport {
        self.commitment.report()
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
        if let Some(e) = link.external(self.state.origin().map(|o| o.at), what, at, unix_ms) {
            self.push(e);
        }
    }

    /// Starts the drain with its origin at `now` (a signal's receipt time), or records a later
    /// trigger (a count per trigger kind). Returns `true` only for the first trigger.
    pub(crate) fn start(
        self: &Arc<Self>,
        trigger: Trigger,
        now: Instant,
        unix_ms: u64,
        from_signal: bool,
    ) -> bool {
        // Phases only move forward, so Starting now means never Serving before. Read before
        // the lifecycle's lock: that lock is never held while another part's is taken.
        let was_starting = self.progress.phase() == Phase::Starting;
        let begin = Begin {
            trigger,
            at: now,
            unix_ms,
            from_signal,
            was_starting,
            evidence: || self.commitment.evidence_at(self.core, now),
        };
        if !self.state.begin(begin) {
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
        let grace_ms = self.deadlines.budget().grace_period.as_millis() as u64;
        let in_flight = self.core.counter.count();
        self.state.log_start(trigger, in_flight, grace_ms);
        self.core.start_draining();
        self.progress.set(Phase::Draining);
        self.tokens.drain.cancel();
        let driver = Arc::clone(self);
        let span = tracing::info_span!("lameduck_drain", trigger = trigger.as_str(), grace_ms);
        let drive = async move {
            // The runtime's notice, against the signal's receipt.
            driver.state.note_noticed(unix_ms_now());
            driver.drive(now).await
        };
        tokio::spawn(tracing::Instrument::instrument(drive, span));
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
        self.exit.stop_arrived();
        if force {
            self.force();
        }
    }

    /// Exit now: skip the remaining waits and the closers. `true` if this call forced it.
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

    /// The one driver task, spawned by the first trigger with its origin: each phase below in
    /// turn, then the report. The deadlines are re-read at each step: a Pod deletion with a
    /// shorter grace (feature `kube`) moves them earlier, also mid-drain; should the clock
    /// refuse one, it is now (the drain ends early, named) rather than a panic.
    async fn drive(self: Arc<Self>, origin: Instant) {
        // Events the Kubernetes watch saw before the trigger (feature `kube`): they logged
        // when seen, so they skip the funnel's line.
        let early = endpoints::early_events(self.deadlines.link(), origin);
        self.state.append(early);
        self.arm_hurry(origin);
        let reason = self.propagate(origin).await;
        self.stop_accepting(reason);
        let (stragglers, deadline_hit) = self.wait_for_zero(origin).await;
        self.progress.set(Phase::Closing);
        let closers = self.close(self.deadlines.hard(origin)).await;
        let outcome = record::outcome(self.is_forced(), deadline_hit, &closers);
        self.done(origin, (outcome, stragglers, closers)).await;
    }

    /// Fires the hurry token `hurry_lead` before the quiesce deadline (or with the deadline).
    fn arm_hurry(self: &Arc<Self>, origin: Instant) {
        let driver = Arc::clone(self);
        // Holds the driver (to re-read the deadlines): not past the end of the drain.
        tokio::spawn(async move {
            let (tokens, phase) = (&driver.tokens, driver.progress.subscribe());
            let hurry = driver
                .deadlines
                .hurry(origin, (&tokens.hurry, &tokens.deadline), phase);
            hurry.await;
        });
    }

    /// Step 1: waits for the propagation policy (or the force), records what it went on.
    async fn propagate(&self, origin: Instant) -> CommitReason {
        let evidence = self.state.evidence();
        let limits = || self.deadlines.limits(origin);
        let (link, force) = (self.deadlines.link(), &self.tokens.force);
        let (core, commitment) = (self.core, &self.commitment);
        let origin_unix_ms = self.state.origin().map_or(0, |o| o.unix_ms);
        let (reason, committed) = commitment
            .wait(
                core,
                (origin, origin_unix_ms),
                evidence,
                link,
                limits,
                force,
            )
            .await;
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
        if let Some(detail) = self.state.flips_at_stop() {
            self.push_now(EventKind::ReadinessFlipped, detail);
        }
        self.progress.set(Phase::StoppedAccepting);
        self.tokens.stop.cancel();
        self.work.tasks().tracker.close();
    }

    /// Step 3: waits for zero (requests and tasks), or the quiesce deadline, where what is
    /// left is named and cut. Returns the stragglers and whether the deadline hit.
    async fn wait_for_zero(&self, origin: Instant) -> (stragglers::Cut, bool) {
        let mut deadline_hit = false;
        if !self.is_forced() {
            // The events are stamped when the drain sees the work done (no earlier than the
            // stop); their detail says when it ended, where that was before the stop.
            let stopped = Instant::now();
            let none_at_stop = self.core.counter.count() == 0;
            let requests = async {
                self.core.wait_zero().await;
                let detail = none_at_stop.then_some("none in flight at stopped_accepting");
                self.push_now(EventKind::InFlightZero, detail);
            };
            let tasks = async {
                self.work.tasks().tracker.wait().await;
                let detail = work_ended(self.work.tasks().last_ended(), stopped, origin);
                self.push_now(EventKind::TasksDone, Some(&detail));
            };
            let both = async { tokio::join!(requests, tasks) };
            tokio::select! {
                _ = both => {}
                () = self.deadlines.until_quiesce(origin) => deadline_hit = true,
                () = self.tokens.force.cancelled() => {}
            }
        }
        let mut stragglers = stragglers::Cut::default();
        if deadline_hit {
            stragglers = self.cut_at_deadline(origin).await;
        }
        if self.is_forced() {
            // What the force cuts is named, as at the deadline (unless the deadline came first).
            if !deadline_hit {
                stragglers =
                    stragglers::collect(self.core, self.work.tasks(), Instant::now(), origin);
            }
            self.tokens.deadline.cancel();
            self.work.tasks().abort_all();
        }
        (stragglers, deadline_hit)
    }

    /// The quiesce deadline: names what is left, fires the deadline token, and lets the tasks
    /// recover (by the hard deadline) before they are aborted.
    async fn cut_at_deadline(&self, origin: Instant) -> stragglers::Cut {
        let at = self.deadlines.quiesce(origin);
        let mut stragglers = stragglers::collect(self.core, self.work.tasks(), at, origin);
        let detail = format!("{} stragglers", stragglers.counts.total());
        self.push_now(EventKind::DeadlineExceeded, Some(&detail));
        self.tokens.deadline.cancel();
        let hard = self.deadlines.hard(origin);
        stragglers::recover(&mut stragglers.named, self.work.tasks(), hard).await;
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
        self.work
            .closers()
            .run(hard, &self.tokens.force, closed)
            .await
    }

    /// Step 5: the Done event, the report, its emission, then the phase.
    async fn done(&self, origin: Instant, ending: Ending) {
        self.push_now(EventKind::Done, Some(ending.0.as_str()));
        self.state.freeze();
        let mut report = self.build_report(origin, ending);
        // Under `run`, the stderr line waits for the exit, so it is written once and complete.
        let (stderr, until) = (
            !self.exit.is_owned(),
            self.exit.sink_deadline(&self.deadlines),
        );
        if !self.exit.emit(&mut report, stderr, until).await {
            // The watchdog took over: it writes the report and exits the process.
            return;
        }
        self.progress.done(&report);
        self.state.set_report(report);
        self.progress.set(Phase::Done);
        // The report holds them now; the core block is leaked, its growth must not be.
        self.core.release_drain_state();
    }

    /// The report of a drain that started at `origin`, with its advice.
    fn build_report(&self, origin: Instant, (outcome, stragglers, closers): Ending) -> DrainReport {
        self.state.build_report(Draft {
            outcome,
            after_flip: after_flip::after_flip_report(self.core.observed(), origin),
            budget: self.deadlines.report(),
            propagation: self.commitment.report(),
            stragglers,
            tasks: self.work.tasks().ended(),
            closers,
        })
    }

    /// The exit under `run`, once Done (see `Exit::conclude`).
    pub(crate) async fn conclude(&self, report: DrainReport, stop: Option<&str>) -> DrainReport {
        let stop = stop.filter(|_| !self.is_forced());
        let parts = (&self.state, &self.deadlines);
        let force = &self.tokens.force;
        self.exit.conclude(report, stop, parts, force).await
    }

    /// The watchdog fired (half the safety margin past the hard deadline; its own writes are
    /// bounded by `until`): if the drain is not Done, the runtime is starved, and a `forced`
    /// report with what is known is written before the process exits (see
    /// `Exit::watchdog_claims` for the other cases).
    fn watchdog_fire(&self, until: std::time::Instant) {
        let done = self.progress.phase() == Phase::Done;
        let code = self.state.exit_code();
        if !self.exit.watchdog_claims(done, code, until) {
            return;
        }
        let Some(origin) = self.state.origin() else {
            return;
        };
        let now = Instant::now();
        let stragglers = stragglers::collect(self.core, self.work.tasks(), now, origin.at);
        let mut e = origin.event_at(EventKind::Done, now);
        e.detail = Some("forced: runtime starved".to_owned());
        // Not through `push`: its log line may go to the very stderr that stalls.
        self.state.push_last(e);
        self.forced.store(true, Ordering::Release);
        // Those not yet taken by the driver never ran.
        let closers = self.work.closers().skipped_by_force();
        let report = self.build_report(origin.at, (Outcome::Forced, stragglers, closers));
        let (used, hard) = (now - origin.at, self.deadlines.budget().hard_deadline());
        let exit = origin.event_at(EventKind::Exit, now);
        self.exit.write_starved(report, (used, hard), exit, until);
    }
}

/// The detail of `tasks_done`: which task ended last and, when that was before
/// `stopped_accepting` (at `stopped`), when — the event itself is stamped when the drain saw
/// the tasks done, which is no earlier than the stop.
fn work_ended(last: Option<(Instant, String)>, stopped: Instant, origin: Instant) -> String {
    match last {
        None => "no task ran".to_owned(),
        Some((at, name)) if at < origin => {
            format!("the last task, `{name}`, ended before the drain started")
        }
        Some((at, name)) if at < stopped => format!(
            "the last task, `{name}`, ended at +{} ms, before stopped_accepting",
            at.saturating_duration_since(origin).as_millis()
        ),
        Some((_, name)) => format!("the last task to end: `{name}`"),
    }
}
