//! The deadlines of one drain: the configured budget, tightened by the Pod's deletion when
//! its grace is shorter (feature `kube`, `kubectl delete --grace-period`). Every wait of the
//! driver re-reads them when the link changes; without the feature they are the budget's.
//!
//! # Invariants
//!
//! * [`Deadlines`] is the one place a deadline is computed: the driver, the exit, the handle
//!   and [`TaskContext`](crate::TaskContext) ask it and never add offsets of their own.
//! * The origin is set once, by the first trigger ([`Deadlines::started`], right after the
//!   lifecycle fixed the same instant and before the counter says draining); before it, the
//!   deadlines are `None` and the budget report says nothing used.
//! * The deadlines only tighten: the link's kill time only moves earlier (its writer, the
//!   watch, goes through [`Deadlines::tighten`]), and the quiesce instant handed to tasks is
//!   the earliest one known.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::propagation::link::{Kill, Link};
use crate::report::{BudgetReport, DeletionBudget};
use crate::vocab::budget::Budget;
use crate::vocab::phase::Phase;
use crate::vocab::sync::MutexExt;

/// The deadlines of one drain: the budget, the propagation `max` it was built with, the
/// hurry lead, the link (the deletion's kill time), and the quiesce instant the tasks read.
pub(crate) struct Deadlines {
    budget: Budget,
    /// The propagation policy's `max` (or its fixed delay), given when built.
    max: Duration,
    /// How long before the quiesce deadline the hurry token fires.
    hurry_lead: Duration,
    /// The shortest grace the Pod may be given (node shutdown, eviction), when configured:
    /// every drain is planned to fit it, as if a deletion had given that much.
    shortest: Option<Duration>,
    /// What the Kubernetes API says (feature `kube`): the slices' hold, the deletion's kill
    /// time. The driver reads it; the watch writes it.
    link: Link,
    /// The drain's origin, set once by the first trigger.
    origin: OnceLock<Instant>,
    /// The quiesce deadline, set at the trigger and moved earlier by a shorter deletion grace
    /// (what [`TaskContext::deadline`](crate::TaskContext::deadline) reads).
    quiesce_at: Arc<Mutex<Option<Instant>>>,
}

impl std::fmt::Debug for Deadlines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deadlines")
            .field("budget", &self.budget)
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

impl Deadlines {
    pub(crate) fn new(
        budget: Budget,
        max: Duration,
        hurry_lead: Duration,
        shortest: Option<Duration>,
    ) -> Self {
        Self {
            budget,
            max,
            hurry_lead,
            shortest,
            link: Link::new(),
            origin: OnceLock::new(),
            quiesce_at: Arc::default(),
        }
    }

    /// The validated budget.
    pub(crate) fn budget(&self) -> Budget {
        self.budget
    }

    /// The link the Kubernetes watch writes (and the driver reads).
    pub(crate) fn link(&self) -> &Link {
        &self.link
    }

    /// The deadlines from `origin`: the budget's, tightened by the earliest kill known — the
    /// link's (what the API said), or the configured shortest grace counted from the origin.
    fn at(&self, origin: Instant) -> (Instants, Option<DeletionBudget>) {
        let shortest = self.shortest.map(|grace| Kill {
            at: origin.checked_add(grace).unwrap_or(origin),
            grace,
            source: crate::report::BudgetSource::ShortestGrace,
        });
        let kill = match (self.link.kill(), shortest) {
            (Some(k), Some(s)) => Some(if k.at <= s.at { k } else { s }),
            (k, s) => k.or(s),
        };
        Instants::at(&self.budget, self.max, origin, kill)
    }

    /// `max_at`, and the cap on serving past it while the process is visibly still routed.
    pub(crate) fn limits(&self, origin: Instant) -> crate::propagation::Limits {
        let (i, _) = self.at(origin);
        crate::propagation::Limits::new(i.max_at, i.quiesce)
    }

    /// The quiesce deadline: what is still running is cut.
    pub(crate) fn quiesce(&self, origin: Instant) -> Instant {
        self.at(origin).0.quiesce
    }

    /// The hard deadline: the process must be gone.
    pub(crate) fn hard(&self, origin: Instant) -> Instant {
        self.at(origin).0.hard
    }

    /// When the hurry token fires: `hurry_lead` before the quiesce deadline, not before the
    /// origin.
    fn hurry_at(&self, origin: Instant) -> Instant {
        let quiesce = self.quiesce(origin);
        quiesce
            .checked_sub(self.hurry_lead)
            .unwrap_or(origin)
            .max(origin)
    }

    /// This deletion's budget for the report, when it tightened the configured one.
    fn deletion(&self, origin: Instant) -> Option<DeletionBudget> {
        self.at(origin).1
    }

    /// The quiesce deadline, once the drain has started.
    pub(crate) fn quiesce_deadline(&self) -> Option<Instant> {
        self.origin.get().map(|&o| self.quiesce(o))
    }

    /// The hard deadline (grace period minus safety margin), once the drain has started.
    pub(crate) fn hard_deadline(&self) -> Option<Instant> {
        self.origin.get().map(|&o| self.hard(o))
    }

    /// The budget as the report and `/status` give it: used since the origin (none before the
    /// drain starts), and this deletion's, when it tightened the configured one.
    pub(crate) fn report(&self) -> BudgetReport {
        let origin = self.origin.get().copied();
        let used = origin.map_or(Duration::ZERO, |o| o.elapsed());
        let grace = self.budget.grace_period;
        let deletion = origin.and_then(|o| self.deletion(o));
        // Counted to the kill the drain planned for: a shorter budget's, else the grace's.
        let until_kill = deletion
            .as_ref()
            .map_or(grace, |d| Duration::from_millis(d.kill_at_ms));
        BudgetReport {
            grace_ms: grace.as_millis() as u64,
            used_ms: used.as_millis() as u64,
            remaining_ms: until_kill.saturating_sub(used).as_millis() as u64,
            quiesce_ms: self.budget.quiesce_deadline().as_millis() as u64,
            close_budget_ms: self.budget.close_budget.as_millis() as u64,
            deletion,
        }
    }

    /// Sleeps until the quiesce deadline, re-read when the link changes.
    pub(crate) async fn until_quiesce(&self, origin: Instant) {
        self.link.sleep_until(|| self.quiesce(origin)).await;
    }

    /// Fires `hurry` `hurry_lead` before the quiesce deadline (re-read when the link
    /// changes), or with `deadline`; returns without firing when the drain is Done first.
    pub(crate) async fn hurry(
        &self,
        origin: Instant,
        (hurry, deadline): (&CancellationToken, &CancellationToken),
        mut phase: watch::Receiver<Phase>,
    ) {
        tokio::select! {
            () = self.link.sleep_until(|| self.hurry_at(origin)) => hurry.cancel(),
            () = deadline.cancelled() => hurry.cancel(),
            _ = phase.wait_for(|p| *p == Phase::Done) => {}
        }
    }

    /// The drain started at `origin` (the first trigger's, once): tasks see its quiesce
    /// deadline from now on.
    pub(crate) fn started(&self, origin: Instant) {
        let origin = *self.origin.get_or_init(|| origin);
        self.note_quiesce(self.quiesce(origin));
    }

    /// Records the deletion's kill time; `true` if it tightened the budget. A drain already
    /// under way hands its tasks the earlier quiesce deadline.
    #[cfg(feature = "kube")]
    pub(crate) fn tighten(&self, kill: Kill) -> bool {
        let tightened = self.link.tighten(kill);
        if let Some(&origin) = self.origin.get().filter(|_| tightened) {
            self.started(origin);
        }
        tightened
    }

    /// The earliest quiesce deadline known (they only tighten), shared with every
    /// [`TaskContext`](crate::TaskContext).
    pub(crate) fn task_deadline(&self) -> Arc<Mutex<Option<Instant>>> {
        Arc::clone(&self.quiesce_at)
    }

    fn note_quiesce(&self, at: Instant) {
        let mut q = self.quiesce_at.locked();
        *q = Some(q.map_or(at, |old| old.min(at)));
    }

    /// When the watchdog acts, from the origin (half the safety margin past the hard
    /// deadline), and how long its own writes may take (a quarter of the margin more: the
    /// process is gone a quarter of the margin before SIGKILL).
    pub(crate) fn watchdog(&self) -> (Duration, Duration) {
        (
            self.budget.watchdog_deadline(),
            self.budget.safety_margin / 4,
        )
    }

    /// How long `run` may wait for admin answers when the watchdog watches this process: a
    /// quarter of the safety margin past the hard deadline, leaving a quarter for the report's
    /// last write.
    /// How long an admin answer still owed at the exit may take to reach its peer before its
    /// connection is cut: a fifteenth of the grace period, between 100 ms and 2 s (a peer that
    /// reads takes its answer in milliseconds; one that does not must not hold a short
    /// budget's exit until the kill).
    pub(crate) fn delivery_wait(&self) -> Duration {
        (self.budget.grace_period / 15).clamp(Duration::from_millis(100), Duration::from_secs(2))
    }

    pub(crate) fn settle_cap(&self) -> Option<Instant> {
        Some(self.hard_deadline()? + self.budget.safety_margin / 4)
    }

    /// When the sinks must be done, on the real clock: half the safety margin past the hard
    /// deadline (where the watchdog acts) when the watchdog watches (`watched`) a drain that
    /// started; otherwise only each sink's own bound applies.
    pub(crate) fn sink_deadline(&self, watched: bool) -> std::time::Instant {
        let now = std::time::Instant::now();
        match self.hard_deadline().filter(|_| watched) {
            Some(hard) => {
                let at = hard + self.budget.safety_margin / 2;
                now + at.saturating_duration_since(Instant::now())
            }
            None => now + Duration::from_secs(3600),
        }
    }
}

/// The deadlines of one drain as instants: the configured budget, tightened by the deletion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Instants {
    pub(crate) max_at: Instant,
    pub(crate) quiesce: Instant,
    pub(crate) hard: Instant,
}

impl Instants {
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
                source: kill.source,
            }),
        )
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
            source: crate::report::BudgetSource::Deletion,
        };
        let (d, report) = Instants::at(&budget(), Duration::from_secs(15), origin, Some(kill));
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
            source: crate::report::BudgetSource::Deletion,
        };
        let (d, report) = Instants::at(&budget(), Duration::from_secs(15), origin, Some(kill));
        assert!(report.is_none());
        assert_eq!(d.hard - origin, Duration::from_secs(29));
    }

    #[test]
    fn the_shortest_grace_counts_from_the_origin_and_an_earlier_deletion_wins() {
        let d = Deadlines::new(
            budget(),
            Duration::from_secs(15),
            Duration::from_secs(1),
            Some(Duration::from_secs(15)),
        );
        let origin = Instant::now();
        let (i, report) = d.at(origin);
        let report = report.unwrap();
        assert_eq!(report.source, crate::report::BudgetSource::ShortestGrace);
        assert_eq!(report.kill_at_ms, 15_000);
        // Half of the 1 s margin, the 5 s close budget and the 15 s max.
        assert_eq!(report.hard_ms, 14_500);
        assert_eq!(report.quiesce_ms, 12_000);
        assert_eq!(report.max_ms, 7_500);
        assert_eq!(i.quiesce - origin, Duration::from_millis(12_000));
        // A deletion that leaves less is the budget, and the report names it.
        #[cfg(feature = "kube")]
        {
            let kill = Kill {
                at: origin + Duration::from_secs(5),
                grace: Duration::from_secs(5),
                source: crate::report::BudgetSource::Deletion,
            };
            d.link().tighten(kill);
            let (_, report) = d.at(origin);
            let report = report.unwrap();
            assert_eq!(report.source, crate::report::BudgetSource::Deletion);
            assert_eq!(report.kill_at_ms, 5_000);
        }
    }
}
