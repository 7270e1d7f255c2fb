//! The drain's record, behind the driver's one lock: the origin and the trigger, the
//! timeline, what the propagation commit went on, and the report once it is built.
//!
//! # Invariants
//!
//! * The first trigger wins: [`Lifecycle::begin`] fixes the origin and appends the start's
//!   events under the same lock, so a concurrent trigger sees both, and counts every later
//!   trigger as a repeat instead.
//! * The lock is never held across an `.await`, never taken on the request path, and never
//!   held while another part's lock is taken (every method takes it, does a few assignments
//!   and returns), so it cannot deadlock. A panic while holding it leaves the state
//!   consistent, so poisoning is ignored rather than spread.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::timeline::Timeline;
use crate::evidence::Evidence;
use crate::phase::{Event, EventKind, Trigger};
use crate::report::{DrainReport, EvidenceReport, ServerReport, SignalReceipt};
use crate::sync::MutexExt;

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
    /// The start's events, at 0 ms.
    pub(super) events: Vec<Event>,
    /// The arrival-rate evidence at the trigger (taken only by the first).
    pub(super) evidence: E,
}

/// What the report is built from.
pub(super) struct Record {
    pub(super) trigger: Option<Trigger>,
    pub(super) timeline: Vec<Event>,
    pub(super) signal_receipt: Option<SignalReceipt>,
    pub(super) committed: Option<EvidenceReport>,
    pub(super) server: Option<ServerReport>,
}

#[derive(Debug, Default)]
struct State {
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

/// The drain's record, behind one lock.
#[derive(Debug, Default)]
pub(super) struct Lifecycle {
    state: Mutex<State>,
}

impl Lifecycle {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.locked()
    }

    /// Starts the drain (`Ok`), or records a later trigger as a `signal_received` event:
    /// `Err(Some(at_ms))` when it is a new event, `Err(None)` when it only raised a count.
    pub(super) fn begin<E>(&self, b: Begin<E>) -> Result<(), Option<u64>>
    where
        E: FnOnce() -> Evidence,
    {
        let mut st = self.lock();
        if let Some(origin) = st.origin {
            let mut e = origin.event_at(EventKind::SignalReceived, b.at);
            e.unix_ms = b.unix_ms;
            e.trigger = Some(b.trigger);
            let at_ms = e.at_ms;
            return Err(st.timeline.signal(e).then_some(at_ms));
        }
        st.origin = Some(Origin {
            at: b.at,
            unix_ms: b.unix_ms,
        });
        st.trigger = Some(b.trigger);
        st.receipt = b.from_signal.then_some(b.unix_ms);
        st.timeline.open(b.events, b.unix_ms);
        st.evidence = Some((b.evidence)());
        // Without a gate, Starting may only mean nobody called `mark_serving` (an accept
        // loop of the application's own): then the proxies' view is unknown, so wait.
        st.never_served = b.was_starting && st.gated;
        Ok(())
    }

    /// A signal that neither drains nor exits, named `name`, received at `at`: in the
    /// timeline (a count for repeats), or until the drain starts in the events it begins with.
    pub(super) fn ignored_signal(&self, name: &str, at: Instant, unix_ms: u64) {
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
    pub(super) fn note_gate(&self) {
        self.lock().gated = true;
    }

    /// The runtime ran the driver task (wall-clock ms): the notice, against the receipt.
    pub(super) fn note_noticed(&self, unix_ms: u64) {
        self.lock().noticed = Some(unix_ms);
    }

    /// Records the accept loop's timeouts for the report.
    #[cfg(feature = "http")]
    pub(super) fn note_server(&self, server: ServerReport) {
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

    pub(super) fn events(&self) -> Vec<Event> {
        self.lock().timeline.events().to_vec()
    }

    /// Signals received after the timeline became final.
    pub(super) fn late_signals(&self) -> Vec<Event> {
        self.lock().timeline.late().to_vec()
    }

    /// The trigger, at most `limit` events and how many were left out, and the origin.
    pub(super) fn bounded(
        &self,
        limit: usize,
    ) -> (Option<Trigger>, Vec<Event>, usize, Option<Origin>) {
        let st = self.lock();
        let (timeline, omitted) = st.timeline.bounded(limit);
        (st.trigger, timeline, omitted, st.origin)
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

    /// What the report is built from.
    pub(super) fn record(&self) -> Record {
        let st = self.lock();
        Record {
            trigger: st.trigger,
            timeline: st.timeline.events().to_vec(),
            signal_receipt: st.receipt.map(|received| SignalReceipt {
                received_unix_ms: received,
                noticed_unix_ms: st.noticed,
                notice_delay_ms: st.noticed.map(|n| n.saturating_sub(received)),
            }),
            committed: st.committed.clone(),
            server: st.server.clone(),
        }
    }

    pub(super) fn report(&self) -> Option<DrainReport> {
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
