//! The lifecycle, from the first trigger to Done: the budget's origin and deadlines, the
//! propagation wait, stopping, the wait for zero, stragglers, closing, and the report.
//!
//! # Invariants
//!
//! * The first trigger wins: it fixes the budget's origin under the `state` lock, sets the
//!   counter's draining flag, and spawns the one driver task. Later triggers only raise the
//!   count of one `signal_received` event per trigger kind, so the timeline stays bounded
//!   whatever the number of triggers; once the Done event is in, the timeline is final.
//! * Every event is appended through one funnel, `Timeline::push` (`timeline.rs`), which
//!   drops it once the timeline is final. Events after the start go through [`Driver::push`]
//!   (one log line each, and the observer — the metrics, feature `metrics` — told), phase changes through
//!   [`Driver::set_phase`]. Three appends log on their own or not at all: the start's events,
//!   pushed under the same lock that fixes the origin (a concurrent trigger must see both);
//!   the Kubernetes events seen before the trigger, added at 0 ms; and the watchdog's Done,
//!   which must not log to the stderr that may be stalled.
//! * The final report is written by exactly one of the driver and the watchdog thread: each
//!   claims the `emission` flag with a compare-exchange before writing. Under `run` the
//!   watchdog stays armed until the report's last write (after Done) is over, so no sink can
//!   hold the exit past it.
//! * The `state` mutex is never held across an `.await`, never taken on the request path,
//!   and never held while another part's lock is taken, so it cannot deadlock.
//! * Phases only move forward; each transition is published on a `watch` channel.
//! * The deadlines only tighten: they are the budget's, moved earlier by a Pod deletion with a
//!   shorter grace (the link, feature `kube`), and every wait re-reads them when the link
//!   changes. The driver reads the link; only the watch writes it, through the handle.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::budget::Budget;
use crate::closers::Closers;
use crate::evidence::Evidence;
use crate::guard::{Core, Site};
use crate::phase::{unix_ms_now, CommitReason, Event, EventKind, Phase, Trigger};
use crate::propagation::Policy;
use crate::readiness::{ReadinessWhileDraining, SourceTable};
use crate::report::EvidenceReport;
use crate::report::{DrainReport, Outcome, ServerReport, Sinks};
use crate::sync::MutexExt;
use crate::tasks::{TaskContext, Tasks};

mod assemble;
mod deadlines;

use deadlines::Deadlines;
mod endpoints;
mod exit;
mod observer;
mod status;
mod steps;
mod timeline;
mod trigger;

use exit::Exit;
pub(crate) use exit::ExitHolds;
pub(crate) use observer::{Observer, Sample};

pub use status::{Status, STATUS_TIMELINE_LIMIT};

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
    /// Every event of the drain, appended only through its `push`.
    timeline: timeline::Timeline,
    /// Receipt of the signal that started the drain, and when the driver first ran (unix ms).
    receipt: Option<u64>,
    noticed: Option<u64>,
    report: Option<DrainReport>,
    /// The arrival-rate evidence taken at the trigger.
    evidence: Option<Evidence>,
    /// A startup gate exists: while Starting, the process says it is not ready.
    gated: bool,
    /// The first trigger came while a startup gate held the process in Starting: it was
    /// never ready.
    never_served: bool,
    /// What the propagation commit went on, once it committed.
    committed: Option<EvidenceReport>,
    /// The accept loop's timeouts, when `serve` runs the accept loop.
    server: Option<ServerReport>,
}

/// The tokens the drain fires as it goes.
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

/// The lifecycle engine behind a [`Drain`](crate::Drain).
pub(crate) struct Driver {
    pub(crate) core: &'static Core,
    /// `core`'s plain site, at hand for `Drain::enter` (one load fewer than `Core::plain`).
    pub(crate) plain: &'static Site,
    deadlines: Deadlines,
    policy: Policy,
    readiness: ReadinessWhileDraining,
    /// Who called `/readyz` and how each was classified (the readiness part writes it).
    probe_sources: SourceTable,
    proxy_label: Option<String>,
    observer: Option<Box<dyn Observer>>,
    phase: watch::Sender<Phase>,
    state: Mutex<Lifecycle>,
    pub(crate) tokens: Tokens,
    forced: AtomicBool,
    /// The end of the process: the report's writing, the watchdog, the exit holds.
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
    pub(crate) fn new(core: &'static Core, settings: Settings) -> Self {
        let Settings {
            budget,
            policy,
            readiness,
            probe_sources,
            sinks,
            hurry_lead,
            proxy_label,
            observer,
        } = settings;
        let max = match policy {
            Policy::Quiet { max, .. } => max,
            Policy::Fixed(d) => d,
        };
        Self {
            core,
            plain: core.plain(),
            deadlines: Deadlines::new(budget, max, hurry_lead),
            policy,
            readiness,
            probe_sources,
            proxy_label,
            observer,
            phase: watch::channel(Phase::Starting).0,
            state: Mutex::new(Lifecycle::default()),
            tokens: Tokens::default(),
            forced: AtomicBool::new(false),
            exit: Exit::new(sinks),
            tasks: Tasks::default(),
            closers: Closers::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Lifecycle> {
        // A panic while holding the lock leaves the state consistent (every write is a single
        // push/assignment), so poisoning is ignored rather than spread.
        self.state.locked()
    }

    // ---- phase and the one funnel ----

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

    /// The table of `/readyz` callers, which the admin router writes.
    #[cfg(feature = "admin")]
    pub(crate) fn probe_sources(&self) -> &SourceTable {
        &self.probe_sources
    }

    pub(crate) fn connections(&self) -> usize {
        self.core.observed().connections()
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
        {
            let mut st = self.lock();
            // Nothing is appended once the timeline is final (the report is built from it).
            st.timeline.push(e);
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

    /// A startup gate was created: Starting now means "not ready yet", not "nobody said".
    pub(crate) fn note_startup_gate(&self) {
        self.lock().gated = true;
    }

    /// Starting → Serving (once).
    pub(crate) fn mark_serving(&self) {
        let moved = self.phase.send_if_modified(|p| {
            if *p == Phase::Starting {
                self.core.set_phase(Phase::Serving);
                *p = Phase::Serving;
                true
            } else {
                false
            }
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
        self.lock().server = Some(server);
    }

    /// The handlers are installed: the first trigger arms the watchdog. Returns `false` if
    /// they already were.
    pub(crate) fn note_signals_installed(&self) -> bool {
        self.exit.watch()
    }

    pub(crate) fn note_owned_by_run(&self) {
        self.exit.own()
    }

    pub(crate) fn task_context(&self) -> TaskContext {
        TaskContext {
            drain: self.tokens.drain.clone(),
            stop: self.tokens.stop.clone(),
            hurry: self.tokens.hurry.clone(),
            deadline: self.tokens.deadline.clone(),
            quiesce_at: self.deadlines.task_deadline(),
        }
    }

    pub(crate) fn is_forced(&self) -> bool {
        self.forced.load(Ordering::Acquire)
    }

    // ---- what is known ----

    fn origin(&self) -> Option<Origin> {
        self.lock().origin
    }

    /// The quiesce deadline, once the drain has started (a shorter deletion grace moves it).
    pub(crate) fn quiesce_deadline(&self) -> Option<Instant> {
        self.origin().map(|o| self.deadlines.quiesce(o.at))
    }

    /// The hard deadline, once the drain has started (a shorter deletion grace moves it).
    pub(crate) fn hard_deadline(&self) -> Option<Instant> {
        self.origin().map(|o| self.deadlines.hard(o.at))
    }

    /// The validated budget.
    pub(crate) fn budget(&self) -> Budget {
        self.deadlines.budget()
    }

    /// Records the deletion's kill time; `true` if it tightened the budget.
    #[cfg(feature = "kube")]
    pub(crate) fn tighten(&self, kill: crate::link::Kill) -> bool {
        self.deadlines.tighten(kill, self.origin().map(|o| o.at))
    }

    pub(crate) fn timeline(&self) -> Vec<Event> {
        self.lock().timeline.events().to_vec()
    }

    pub(crate) fn report(&self) -> Option<DrainReport> {
        self.lock().report.clone()
    }

    /// The committed evidence, or while draining the evidence the policy waits on.
    /// The propagation policy's settings, as the report gives them.
    #[cfg(feature = "admin")] // read by the admin router's /drain
    pub(crate) fn policy_report(&self) -> crate::report::PolicyReport {
        self.policy.report()
    }

    pub(crate) fn evidence_now(&self) -> Option<EvidenceReport> {
        let (evidence, committed, origin) = {
            let st = self.lock();
            (st.evidence.clone(), st.committed.clone(), st.origin)
        };
        if committed.is_some() {
            return committed;
        }
        let (mut evidence, origin) = (evidence?, origin?);
        crate::propagation::Policy::refit(self.core, origin.at, &mut evidence);
        let kind = self.policy.waiting_on(&evidence, self.deadlines.link().hold());
        let mut report = evidence.report(kind, crate::propagation::silence(self.core, origin.at));
        self.endpoint_evidence(&mut report, origin.at);
        Some(crate::report::evidence_json::fixed_only(report))
    }

    /// Answers owed to admin callers before the process exits.
    #[cfg(feature = "admin")]
    pub(crate) fn exit_holds(&self) -> &ExitHolds {
        self.exit.holds()
    }

    /// How long `run` may wait for admin answers, when the watchdog watches this process.
    fn settle_cap(&self) -> Option<Instant> {
        let o = self.origin().filter(|_| self.exit.is_watched())?;
        Some(self.deadlines.settle_cap(o.at))
    }

    /// When the sinks must be done, on the real clock (see [`Deadlines::sink_deadline`]).
    fn sink_deadline(&self) -> std::time::Instant {
        let watched = self.origin().filter(|_| self.exit.is_watched());
        self.deadlines.sink_deadline(watched.map(|o| o.at))
    }

    // ---- the exit ----

    /// The exit under `run`, once Done: after a drain a `preStop` call started, the wait for
    /// the stop signal named `stop` (when a signal source is installed); the answers owed to
    /// admin callers; the report's last write.
    pub(crate) async fn exit(&self, mut report: DrainReport, stop: Option<&str>) -> DrainReport {
        let after_prestop = self.lock().trigger == Some(Trigger::PreStop);
        if let Some(stop) = stop.filter(|_| after_prestop && !self.is_forced()) {
            let (hard, force) = (self.hard_deadline(), &self.tokens.force);
            self.exit.wait_for_stop_signal(&mut report, stop, hard, force).await;
        }
        let (hard, cap) = (self.hard_deadline(), self.settle_cap());
        self.exit.settle(&mut report, hard, cap).await;
        self.finish(report).await
    }

    /// Completes the report for the exit (signals received after Done, the `exit` event) and
    /// writes it to every sink for the last time.
    async fn finish(&self, mut report: DrainReport) -> DrainReport {
        let (late, origin) = {
            let st = self.lock();
            (st.timeline.late().to_vec(), st.origin)
        };
        report.timeline.extend(late);
        let at = origin.map_or(Duration::ZERO, |o| o.at.elapsed());
        let unix_ms = origin.map_or_else(unix_ms_now, |o| o.unix_ms + at.as_millis() as u64);
        let mut e = Event::new(EventKind::Exit, at, unix_ms);
        e.code = Some(report.exit_code);
        report.timeline.push(e);
        // The driver's claim, taken at Done, still holds: the watchdog cannot have this one.
        self.exit.emit(&mut report, true, self.sink_deadline()).await;
        self.lock().report = Some(report.clone());
        self.exit.release();
        report
    }

    /// Called on the watchdog thread once the hard deadline (plus half the safety margin) has
    /// passed, with `until` for its own writes (a quarter of the margin later, still before
    /// SIGKILL). If the drain is not Done, the runtime is starved: writes a `forced` report
    /// with what is known and exits the process with code 1. If it is Done but `run` has not
    /// finished its last write (a sink or the runtime is stuck), exits with the drain's code.
    fn watchdog_fire(&self, until: std::time::Instant) {
        let done = self.phase() == Phase::Done;
        let code = self.lock().report.as_ref().map(|r| r.exit_code);
        if !self.exit.watchdog_claims(done, code, until) {
            return;
        }
        let Some(origin) = self.origin() else {
            return;
        };
        let now = Instant::now();
        let stragglers = self.collect_stragglers(now, origin.at);
        let used = now.saturating_duration_since(origin.at);
        let unix_ms = origin.unix_ms + used.as_millis() as u64;
        {
            // Not through `push`: its log line may go to the very stderr that stalls.
            let mut st = self.lock();
            let mut e = Event::new(EventKind::Done, used, unix_ms);
            e.detail = Some("forced: runtime starved".to_owned());
            st.timeline.push(e);
            st.timeline.freeze();
        }
        self.forced.store(true, Ordering::Release);
        // Those not yet taken by the driver never ran.
        let closers = self.closers.skipped_by_force();
        let mut report = self.build_report(origin.at, Outcome::Forced, stragglers, closers);
        report.cause = Some(format!(
            "runtime starved: the drain had not finished {} ms after the trigger (hard deadline \
             {} ms); something blocks the runtime's worker threads",
            used.as_millis(),
            self.budget().hard_deadline().as_millis()
        ));
        let mut e = Event::new(EventKind::Exit, used, unix_ms);
        e.code = Some(1);
        report.timeline.push(e);
        self.exit.write_and_exit(&report, until, 1);
    }
}
