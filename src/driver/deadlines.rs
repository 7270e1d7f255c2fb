//! The deadlines of one drain: the configured budget, tightened by the Pod's deletion when
//! its grace is shorter (feature `kube`, `kubectl delete --grace-period`). Every wait of the
//! driver re-reads them when the link changes; without the feature they are the budget's.

use std::time::Duration;

use tokio::time::Instant;

use super::Driver;
use crate::budget::Budget;
use crate::link::Kill;
use crate::propagation::Policy;
use crate::report::DeletionBudget;
use crate::sync::MutexExt;

/// The deadlines of one drain, as instants: the configured budget, tightened by the deletion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Deadlines {
    pub(crate) max_at: Instant,
    pub(crate) quiesce: Instant,
    pub(crate) hard: Instant,
}

impl Deadlines {
    /// The deadlines from `origin`; with a kill time earlier than the grace period allows,
    /// the effective grace is what is left until it, and the margin, the close budget and
    /// `max` shrink in its proportion (the numbers are the report's `budget.deletion`).
    pub(crate) fn at(
        budget: &Budget,
        max: Duration,
        origin: Instant,
        kill: Option<Kill>,
    ) -> (Self, Option<DeletionBudget>) {
        let quiesce_off = budget.quiesce_deadline();
        let base = Self {
            max_at: origin.checked_add(max.min(quiesce_off)).unwrap_or(origin),
            quiesce: origin.checked_add(quiesce_off).unwrap_or(origin),
            hard: origin.checked_add(budget.hard_deadline()).unwrap_or(origin),
        };
        let Some(kill) = kill else {
            return (base, None);
        };
        let grace = budget.grace_period;
        let left = kill.at.saturating_duration_since(origin);
        if left >= grace {
            return (base, None);
        }
        let ms = |d: Duration| d.as_millis() as u64;
        // Whole milliseconds, as `Budget::resolve` scales its defaults.
        let scale = |d: Duration| {
            Duration::from_millis((d.as_millis() * left.as_millis() / grace.as_millis()) as u64)
        };
        let hard_off = left.saturating_sub(scale(budget.safety_margin));
        let quiesce_off = hard_off.saturating_sub(scale(budget.close_budget));
        let max_off = scale(max).min(quiesce_off);
        let d = Self {
            max_at: origin + max_off,
            quiesce: origin + quiesce_off,
            hard: origin + hard_off,
        };
        (
            d,
            Some(DeletionBudget {
                deletion_grace_ms: ms(kill.grace),
                kill_at_ms: ms(left),
                hard_ms: ms(hard_off),
                quiesce_ms: ms(quiesce_off),
                max_ms: ms(max_off),
            }),
        )
    }
}

impl Driver {
    /// The deadlines from `origin`, tightened by this deletion's grace when it is shorter.
    pub(crate) fn deadlines(&self, origin: Instant) -> Deadlines {
        self.tightened(origin).0
    }

    /// This deletion's budget for the report, when it tightened the configured one.
    pub(super) fn deadlines_report(&self, origin: Instant) -> Option<DeletionBudget> {
        self.tightened(origin).1
    }

    fn tightened(&self, origin: Instant) -> (Deadlines, Option<DeletionBudget>) {
        let max = match self.policy {
            Policy::Quiet { max, .. } => max,
            Policy::Fixed(d) => d,
        };
        Deadlines::at(&self.budget, max, origin, self.link.kill())
    }

    /// Sleeps until the deadline `pick` chooses, re-reading the deadlines when the link
    /// changes (a deletion with a shorter grace moves them earlier).
    pub(super) async fn until_deadline(
        &self,
        origin: Instant,
        pick: impl Fn(&Deadlines) -> Instant,
    ) {
        self.link
            .sleep_until(|| pick(&self.deadlines(origin)))
            .await;
    }

    /// Records the deletion's kill time; `true` if it tightened the budget. A drain already
    /// under way hands its tasks the earlier quiesce deadline.
    #[cfg(feature = "kube")]
    pub(crate) fn tighten(&self, kill: Kill) -> bool {
        let tightened = self.link.tighten(kill);
        if tightened {
            if let Some(o) = self.origin() {
                self.note_quiesce(self.deadlines(o.at).quiesce);
            }
        }
        tightened
    }

    /// What [`TaskContext::deadline`](crate::TaskContext::deadline) reads: the earliest
    /// quiesce deadline known (they only tighten).
    pub(super) fn note_quiesce(&self, at: Instant) {
        let mut q = self.quiesce_at.locked();
        *q = Some(q.map_or(at, |old| old.min(at)));
    }
}

#[cfg(all(test, not(lameduck_loom)))]
mod tests {
    use super::*;

    fn budget() -> Budget {
        Budget::resolve(Some(Duration::from_secs(30)), None, None, None).unwrap()
    }

    #[test]
    fn a_short_deletion_grace_shrinks_every_deadline_in_proportion() {
        let origin = Instant::now();
        let kill = Kill {
            at: origin + Duration::from_secs(5),
            grace: Duration::from_secs(5),
        };
        let (d, report) = Deadlines::at(&budget(), Duration::from_secs(15), origin, Some(kill));
        let report = report.unwrap();
        // 5/30 of the 1 s margin, the 5 s close budget and the 15 s max.
        assert_eq!(report.hard_ms, 5000 - 166);
        assert_eq!(report.quiesce_ms, 5000 - 166 - 833);
        assert_eq!(report.max_ms, 2500);
        assert_eq!(d.hard - origin, Duration::from_millis(report.hard_ms));
        assert_eq!(d.max_at - origin, Duration::from_millis(2500));
    }

    #[test]
    fn a_deletion_grace_longer_than_the_budget_changes_nothing() {
        let origin = Instant::now();
        let kill = Kill {
            at: origin + Duration::from_secs(60),
            grace: Duration::from_secs(60),
        };
        let (d, report) = Deadlines::at(&budget(), Duration::from_secs(15), origin, Some(kill));
        assert!(report.is_none());
        assert_eq!(d.hard - origin, Duration::from_secs(29));
    }
}
