//! The drain's timeline: the one place its events are appended.
//!
//! Every event the report shows goes through [`Timeline::push`] until the timeline is final
//! ([`Timeline::freeze`], when Done is in: the report is built from it); after that, pushes
//! are dropped and repeated signals go to the late signals, which the exit adds to the last
//! report. A signal that arrives more than once is one event with a count
//! ([`Timeline::signal`]), so the timeline stays bounded whatever the number of signals;
//! signals that neither drain nor exit, received before the drain, wait in
//! [`Timeline::signal_before_start`] and enter with its first events ([`Timeline::open`]).
//! The log line of an event is not this type's: the driver's funnel (`Driver::push`) logs
//! each event and the lifecycle a repeated trigger's first event, while the watchdog appends
//! without logging, since its log line could go to the very stderr that stalls.

use std::time::Duration;

use crate::vocab::phase::{Event, EventKind};

#[derive(Debug, Default)]
pub(super) struct Timeline {
    events: Vec<Event>,
    frozen: bool,
    /// Signals received after Done, one event per trigger kind.
    late: Vec<Event>,
    /// Signals that neither drain nor exit (SIGHUP, SIGUSR1) received before the drain.
    before: Vec<Event>,
}

impl Timeline {
    /// Appends `e`, unless the timeline is final.
    pub(super) fn push(&mut self, e: Event) {
        if !self.frozen {
            self.events.push(e);
        }
    }

    /// The drain's first events (at `unix_ms`), then the signals ignored before it, each
    /// saying how long before it came.
    pub(super) fn open(&mut self, first: impl IntoIterator<Item = Event>, unix_ms: u64) {
        for e in first {
            self.push(e);
        }
        for mut e in std::mem::take(&mut self.before) {
            let before = Duration::from_millis(unix_ms.saturating_sub(e.unix_ms));
            e.detail = Some(format!(
                "ignored ({} ms before the drain): neither drains nor exits",
                before.as_millis()
            ));
            self.push(e);
        }
    }

    /// The timeline is final: the report is being built from it.
    pub(super) fn freeze(&mut self) {
        self.frozen = true;
    }

    /// A `signal_received` event `e` after the start: a count on the event of the same
    /// trigger or signal name, or a new event — in the timeline, or once it is final, in the
    /// late signals. Returns `true` when it is a new event.
    pub(super) fn signal(&mut self, e: Event) -> bool {
        let events = if self.frozen {
            &mut self.late
        } else {
            &mut self.events
        };
        count_or_push(events, e)
    }

    /// A signal that neither drains nor exits, received before the drain started.
    pub(super) fn signal_before_start(&mut self, e: Event) {
        count_or_push(&mut self.before, e);
    }

    /// The events so far.
    pub(super) fn events(&self) -> &[Event] {
        &self.events
    }

    /// At most `limit` events, the first and the last halves when longer (the start and the
    /// end say the most), and how many were left out.
    pub(super) fn bounded(&self, limit: usize) -> (Vec<Event>, usize) {
        let all = &self.events;
        if all.len() <= limit {
            return (all.clone(), 0);
        }
        let half = limit / 2;
        let mut kept = all[..half].to_vec();
        kept.extend_from_slice(&all[all.len() - half..]);
        (kept, all.len() - limit)
    }

    /// Signals received after the timeline became final.
    pub(super) fn late(&self) -> &[Event] {
        &self.late
    }
}

/// Counts `e` on the `signal_received` event of its trigger (or its signal's name) in
/// `events`, or appends it. Returns `true` when appended.
fn count_or_push(events: &mut Vec<Event>, e: Event) -> bool {
    let same = |x: &Event| {
        x.event == EventKind::SignalReceived && x.trigger == e.trigger && x.name == e.name
    };
    if let Some(x) = events.iter_mut().find(|x| same(x)) {
        x.count = Some(x.count.unwrap_or(1).saturating_add(1));
        return false;
    }
    events.push(e);
    true
}
