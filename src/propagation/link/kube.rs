//! What the watch (`src/kube/`, feature `kube`) writes into the link; the link's readers are
//! in every build.

use std::time::Duration;

use tokio::time::Instant;

use super::{Early, Kill, Link, Routing, Source, Startup};
use crate::vocab::phase::{Event, EventKind};

/// At most this many events from before the trigger are kept (the latest ones).
const EARLY_LIMIT: usize = 16;

impl Link {
    fn bump(&self) {
        self.generation.send_modify(|g| *g = g.wrapping_add(1));
    }

    pub(crate) fn set_source(&self, source: Source) {
        self.lock().source = source;
        self.bump();
    }

    /// The proxy allowance: `configured` by the user, or the default used when nothing is
    /// measured at startup (measuring starts now).
    pub(crate) fn set_allowance(&self, allowance: Duration, configured: bool) {
        {
            let mut st = self.lock();
            st.allowance = allowance;
            st.configured = configured;
        }
        self.startup.arm();
        self.bump();
    }

    /// The startup measurement of this Pod's proxy delay (feature `kube`).
    pub(crate) fn startup(&self) -> &Startup {
        &self.startup
    }

    pub(crate) fn set_routing(&self, routing: Routing) {
        let changed = {
            let mut st = self.lock();
            let changed = st.routing != routing;
            st.routing = routing;
            changed
        };
        if changed {
            self.bump();
        }
    }

    /// Records the deletion's kill time; `true` if it tightened the budget.
    pub(crate) fn tighten(&self, kill: Kill) -> bool {
        let tightened = {
            let mut st = self.lock();
            match st.kill {
                Some(k) if k.at <= kill.at => false,
                _ => {
                    st.kill = Some(kill);
                    true
                }
            }
        };
        if tightened {
            self.bump();
        }
        tightened
    }

    pub(crate) fn push_early(&self, e: Early) {
        let mut st = self.lock();
        if st.early.len() == EARLY_LIMIT {
            st.early.remove(0);
        }
        st.early.push(e);
    }

    /// An event the API reported (an endpoint condition change, the deletion's budget) at
    /// `at`: the event for the timeline once the drain started at `origin`; before, logged and
    /// kept here for the drain's start.
    pub(crate) fn external(
        &self,
        origin: Option<Instant>,
        (kind, name, detail): (EventKind, Option<String>, String),
        at: Instant,
        unix_ms: u64,
    ) -> Option<Event> {
        let Some(origin) = origin else {
            tracing::info!(event = kind.as_str(), name = name.as_deref(), detail = %detail, "lameduck: {kind}");
            let early = Early {
                kind,
                at,
                unix_ms,
                name,
                detail,
            };
            self.push_early(early);
            return None;
        };
        let mut e = Event::new(kind, at.saturating_duration_since(origin), unix_ms);
        e.name = name;
        e.detail = Some(detail);
        Some(e)
    }
}

#[cfg(all(test, not(lameduck_loom)))]
mod tests {
    use tokio::time::Instant;

    use super::*;

    #[test]
    fn the_budget_only_tightens() {
        let link = Link::new();
        let now = Instant::now();
        let k = |s| Kill {
            at: now + Duration::from_secs(s),
            grace: Duration::from_secs(s),
            source: crate::report::BudgetSource::Deletion,
        };
        assert!(link.tighten(k(10)));
        assert!(!link.tighten(k(20)));
        assert!(link.tighten(k(3)));
        assert_eq!(link.kill().unwrap().grace, Duration::from_secs(3));
    }
}
