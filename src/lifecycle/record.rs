//! The drain's record: behind the driver's one lock, the origin and the trigger, the
//! timeline, what the propagation commit went on and the report once it is built; beside it,
//! the facts the report and `/status` state (the readiness policy, the `/readyz` callers, the
//! proxy label). The report and `/status` are put together here, from the record and what
//! the driver measured.
//!
//! # Invariants
//!
//! * The first trigger wins: [`Lifecycle::begin`] fixes the origin and appends the start's
//!   events under the same lock, so a concurrent trigger sees both, and counts every later
//!   trigger as a repeat instead.
//! * The lock is never held across an `.await`, never taken on the request path, and never
//!   held while another part's lock is taken (every method takes it, does its few reads and
//!   writes, and returns; the report and `/status` read the other parts after releasing it),
//!   so it cannot deadlock. A panic while holding it leaves the state consistent (every write
//!   is a single push or assignment), so poisoning is ignored rather than spread.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::deadlines::Deadlines;
use super::observer::Sample;
use super::status::{Status, STATUS_TIMELINE_LIMIT};
use super::timeline::Timeline;
use crate::propagation::evidence::Evidence;
use crate::readiness::SourceTable;
use crate::report::CloserResult;
use crate::report::TaskEnd;
use crate::report::{AfterFlipReport, BudgetReport, DrainReport, EvidenceReport, Outcome};
use crate::report::{PodInfo, PolicyReport, ServerReport, SignalReceipt};
use crate::vocab::phase::ReadinessWhileDraining;
use crate::vocab::phase::{Event, EventKind, Phase, Trigger};
use crate::vocab::sync::MutexExt;

/// When the drain started: the first trigger's instant and its wall-clock time.
#[derive(Clone, Copy, Debug)]
pub(super) struct Origin {
    pub(super) at: Instant,
    pub(super) unix_ms: u64,
}

impl Origin {
    /// An event of `kind` at `at`, timed from the origin.
    pub(super) fn event_at(&self, kind: EventKind, at: Instant) -> Event {
        let since = at.saturating_duration_since(self.at);
        Event::new(kind, since, self.unix_ms + since.as_millis() as u64)
    }
}

/// The first trigger, as [`Lifecycle::begin`] records it.
pub(super) struct Begin<E> {
    pub(super) trigger: Trigger,
    pub(super) at: Instant,
    pub(super) unix_ms: u64,
    /// Started by a signal: its receipt time is the report's `signal_receipt`.
    pub(super) from_signal: bool,
    /// The phase was Starting (never Serving).
    pub(super) was_starting: bool,
    /// The arrival-rate evidence at the trigger (taken only by the first).
    pub(super) evidence: E,
}

/// How a drain ended: forced, cut at the deadline, a closer failed, or clean.
pub(super) fn outcome(forced: bool, deadline_hit: bool, closers: &[CloserResult]) -> Outcome {
    if forced {
        Outcome::Forced
    } else if deadline_hit {
        // Exit 1 even if every cut task's recovery worked: a drain that needs a salvage at the
        // deadline did not fit its budget, and alerting should see that (a task that returns
        // on `hurry` keeps it clean).
        Outcome::DeadlineExceeded
    } else if closers.iter().any(|c| !c.is_ok()) {
        Outcome::CloserFailed
    } else {
        Outcome::Clean
    }
}

/// What the drive ended with: the outcome, the stragglers and the closers' results.
pub(super) type Ending = (Outcome, super::stragglers::Cut, Vec<CloserResult>);

/// What the driver measured for the report; the rest is the record's.
pub(super) struct Draft {
    pub(super) outcome: Outcome,
    pub(super) budget: BudgetReport,
    pub(super) propagation: PolicyReport,
    pub(super) after_flip: AfterFlipReport,
    pub(super) stragglers: super::stragglers::Cut,
    pub(super) tasks: Vec<TaskEnd>,
    pub(super) closers: Vec<CloserResult>,
}

#[derive(Debug, Default)]
struct RecordState {
    origin: Option<Origin>,
    trigger: Option<Trigger>,
    /// Every event of the drain, appended only through its `push`.
    timeline: Timeline,
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

/// The drain's record, behind one lock, and the facts its report states.
#[derive(Debug)]
pub(crate) struct Lifecycle {
    state: Mutex<RecordState>,
    readiness: ReadinessWhileDraining,
    /// Who called `/readyz` and how each was classified (the readiness part writes it).
    probe_sources: SourceTable,
    proxy_label: Option<String>,
}

impl Lifecycle {
    pub(super) fn new(
        readiness: ReadinessWhileDraining,
        probe_sources: SourceTable,
        proxy_label: Option<String>,
    ) -> Self {
        Self {
            state: Mutex::default(),
            readiness,
            probe_sources,
            proxy_label,
        }
    }

    /// Whether readiness flips when accepting stops (`Some`, with the event's detail).
    pub(super) fn flips_at_stop(&self) -> Option<Option<&'static str>> {
        match self.readiness {
            ReadinessWhileDraining::ServingUntilStop => Some(None),
            ReadinessWhileDraining::Auto => Some(Some("for kubelet's probe")),
            _ => None,
        }
    }

    /// The table of `/readyz` callers, which the admin router writes.
    #[cfg(feature = "admin")]
    pub(crate) fn probe_sources(&self) -> &SourceTable {
        &self.probe_sources
    }

    fn lock(&self) -> MutexGuard<'_, RecordState> {
        self.state.locked()
    }

    /// Starts the drain (`true`), or records a later trigger as a `signal_received` event (a
    /// new one is logged; a repeat only raises its count).
    pub(super) fn begin<E>(&self, b: Begin<E>) -> bool
    where
        E: FnOnce() -> Evidence,
    {
        let mut st = self.lock();
        if let Some(origin) = st.origin {
            let mut e = origin.event_at(EventKind::SignalReceived, b.at);
            e.unix_ms = b.unix_ms;
            e.trigger = Some(b.trigger);
            let at_ms = e.at_ms;
            if st.timeline.signal(e) {
                let trigger = b.trigger.as_str();
                tracing::info!(
                    event = "signal_received",
                    trigger,
                    at_ms,
                    "lameduck: trigger received while draining"
                );
            }
            return false;
        }
        st.origin = Some(Origin {
            at: b.at,
            unix_ms: b.unix_ms,
        });
        st.trigger = Some(b.trigger);
        st.receipt = b.from_signal.then_some(b.unix_ms);
        st.timeline
            .open(self.start_events(b.trigger, b.unix_ms), b.unix_ms);
        st.evidence = Some((b.evidence)());
        // Without a gate, Starting may only mean nobody called `mark_serving` (an accept
        // loop of the application's own): then the proxies' view is unknown, so wait.
        st.never_served = b.was_starting && st.gated;
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

    /// The log lines of the drain's start (the timeline has the same events), with the
    /// requests in flight and the grace period.
    pub(super) fn log_start(&self, trigger: Trigger, in_flight: usize, grace_ms: u64) {
        tracing::info!(
            event = "drain_started",
            trigger = trigger.as_str(),
            in_flight,
            grace_ms,
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

    /// A signal that neither drains nor exits, named `name`, received at `at`: in the
    /// timeline (a count for repeats), or until the drain starts in the events it begins with.
    pub(crate) fn ignored_signal(&self, name: &str, at: Instant, unix_ms: u64) {
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

    pub(super) fn origin(&self) -> Option<Origin> {
        self.lock().origin
    }

    pub(super) fn trigger(&self) -> Option<Trigger> {
        self.lock().trigger
    }

    /// A startup gate was created.
    pub(crate) fn note_gate(&self) {
        self.lock().gated = true;
    }

    /// The runtime ran the driver task (wall-clock ms): the notice, against the receipt.
    pub(super) fn note_noticed(&self, unix_ms: u64) {
        self.lock().noticed = Some(unix_ms);
    }

    /// Records the accept loop's timeouts for the report.
    #[cfg(feature = "http")]
    pub(crate) fn note_server(&self, server: ServerReport) {
        self.lock().server = Some(server);
    }

    /// An event of `kind`, now, timed from the origin.
    pub(super) fn event(&self, kind: EventKind) -> Event {
        self.origin()
            .expect("events are recorded after the origin is set")
            .event_at(kind, Instant::now())
    }

    /// Appends `e` to the timeline, unless it is final.
    pub(super) fn push(&self, e: Event) {
        self.lock().timeline.push(e);
    }

    /// Appends `events`, unless the timeline is final.
    pub(super) fn append(&self, events: Vec<Event>) {
        let mut st = self.lock();
        for e in events {
            st.timeline.push(e);
        }
    }

    /// Appends `e` as the last event: the timeline is final.
    pub(super) fn push_last(&self, e: Event) {
        let mut st = self.lock();
        st.timeline.push(e);
        st.timeline.freeze();
    }

    /// The timeline is final: the report is being built from it.
    pub(super) fn freeze(&self) {
        self.lock().timeline.freeze();
    }

    /// The timeline so far.
    pub(crate) fn timeline(&self) -> Vec<Event> {
        self.lock().timeline.events().to_vec()
    }

    /// Signals received after the timeline became final.
    pub(super) fn late_signals(&self) -> Vec<Event> {
        self.lock().timeline.late().to_vec()
    }

    /// The `/status` snapshot: the record's part, with `phase`, `ready` and
    /// `ready_for_kubelet` as the readiness part says, the counts `now`, the budget and the
    /// `evidence` now.
    pub(super) fn status(
        &self,
        (phase, ready, ready_for_kubelet): (Phase, bool, bool),
        now: Sample,
        deadlines: &Deadlines,
        evidence: Option<EvidenceReport>,
    ) -> Status {
        let (trigger, (timeline, timeline_omitted)) = {
            let st = self.lock();
            (st.trigger, st.timeline.bounded(STATUS_TIMELINE_LIMIT))
        };
        Status {
            phase,
            ready,
            ready_for_kubelet,
            trigger,
            in_flight: now.in_flight,
            connections: now.connections,
            tasks: now.tasks,
            readiness_policy: self.readiness,
            budget: deadlines.report(),
            timeline,
            timeline_omitted,
            evidence,
            probe_sources: self.probe_sources.snapshot(),
        }
    }

    /// The evidence taken at the trigger, and whether the process never served.
    pub(super) fn evidence(&self) -> (Evidence, bool) {
        let st = self.lock();
        let evidence = st
            .evidence
            .clone()
            .expect("the evidence is taken with the origin");
        (evidence, st.never_served)
    }

    /// The evidence at the trigger, what the commit went on (once it committed), the origin.
    pub(super) fn evidence_now(
        &self,
    ) -> (Option<Evidence>, Option<EvidenceReport>, Option<Origin>) {
        let st = self.lock();
        (st.evidence.clone(), st.committed.clone(), st.origin)
    }

    /// What the propagation commit went on.
    pub(super) fn committed(&self, committed: EvidenceReport) {
        self.lock().committed = Some(committed);
    }

    /// The report: the record, the facts, what the driver measured (`d`), and the advice.
    pub(super) fn build_report(&self, d: Draft) -> DrainReport {
        let (trigger, timeline, signal_receipt, committed, server) = {
            let st = self.lock();
            let receipt = st.receipt.map(|received| SignalReceipt {
                received_unix_ms: received,
                noticed_unix_ms: st.noticed,
                notice_delay_ms: st.noticed.map(|n| n.saturating_sub(received)),
            });
            let timeline = st.timeline.events().to_vec();
            (
                st.trigger,
                timeline,
                receipt,
                st.committed.clone(),
                st.server.clone(),
            )
        };
        let mut report = DrainReport {
            outcome: d.outcome,
            trigger,
            exit_code: d.outcome.exit_code(),
            readiness_policy: self.readiness,
            budget: d.budget,
            propagation: PolicyReport {
                evidence: committed,
                ..d.propagation
            },
            timeline,
            after_flip: d.after_flip,
            stragglers: d.stragglers.named,
            straggler_counts: d.stragglers.counts,
            tasks: d.tasks,
            closers: d.closers,
            pod: PodInfo::from_env(),
            advice: Vec::new(),
            cause: None,
            signal_receipt,
            stop_signal_wait: None,
            sink_errors: Vec::new(),
            proxy_label: self.proxy_label.clone(),
            server,
            probe_sources: self.probe_sources.snapshot(),
        };
        report.advice = crate::report::rules::advise(&report);
        report
    }

    pub(crate) fn report(&self) -> Option<DrainReport> {
        self.lock().report.clone()
    }

    /// The report's exit code, once it is built.
    pub(super) fn exit_code(&self) -> Option<i32> {
        self.lock().report.as_ref().map(|r| r.exit_code)
    }

    pub(super) fn set_report(&self, report: DrainReport) {
        self.lock().report = Some(report);
    }
}
