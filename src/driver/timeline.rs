//! The drain's timeline: the one place its events are appended.
//!
//! Every event the report shows goes through [`Timeline::push`] until the timeline is final
//! ([`Timeline::freeze`], when Done is in: the report is built from it); after that, pushes
//! are dropped and repeated signals go to the late signals, which the exit adds to the last
//! report. The log line of an event is the driver's (`Driver::push`), not this type's: the
//! watchdog appends without logging, since its log line could go to the very stderr that
//! stalls.

use crate::phase::Event;

#[derive(Debug, Default)]
pub(super) struct Timeline {
    events: Vec<Event>,
    frozen: bool,
    /// Signals received after Done, one event per trigger kind.
    late: Vec<Event>,
}

impl Timeline {
    /// Appends `e`, unless the timeline is final.
    pub(super) fn push(&mut self, e: Event) {
        if !self.frozen {
            self.events.push(e);
        }
    }

    /// The timeline is final: the report is being built from it.
    pub(super) fn freeze(&mut self) {
        self.frozen = true;
    }

    /// Where a repeated signal is counted: the timeline, or once it is final, the late
    /// signals.
    pub(super) fn signals_mut(&mut self) -> &mut Vec<Event> {
        if self.frozen {
            &mut self.late
        } else {
            &mut self.events
        }
    }

    /// The events so far.
    pub(super) fn events(&self) -> &[Event] {
        &self.events
    }

    /// Signals received after the timeline became final.
    pub(super) fn late(&self) -> &[Event] {
        &self.late
    }
}
