//! Work the drain did not finish: requests and tasks still running at the quiesce deadline,
//! tasks that panicked, closers skipped or failed.

use super::{advice, Ctx};
use crate::report::ActionResult;
use crate::report::AdviceLevel::Warn;
use crate::report::TaskResult;
use crate::report::{Advice, AdviceRule, Outcome, StragglerKind};

/// `requests_cut`: requests still running at the quiesce deadline.
pub(super) fn requests_cut(cx: &Ctx<'_>) -> Option<Advice> {
    let r = cx.r;
    let requests_cut: Vec<_> = r
        .stragglers
        .iter()
        .filter(|s| s.kind == StragglerKind::Request)
        .collect();
    let oldest = requests_cut.iter().map(|s| s.age_ms).max()?;
    // Counted, not listed: the report names only the oldest few.
    let count = r.straggler_counts.requests.max(requests_cut.len() as u64);
    Some(advice(
        Warn,
        AdviceRule::RequestsCut,
        oldest,
        format!(
            "{count} requests were still running at the quiesce deadline ({} ms), the oldest {oldest} ms old: \
             bound those handlers or raise grace_period",
            r.budget.quiesce_ms
        ),
    ))
}

/// `tasks_cut`: background tasks still running at the quiesce deadline, and whether their
/// recovery actions handed their work back.
pub(super) fn tasks_cut(cx: &Ctx<'_>) -> Option<Advice> {
    let cut: Vec<_> =
        cx.r.stragglers
            .iter()
            .filter(|s| s.kind == StragglerKind::Task)
            .collect();
    if cut.is_empty() {
        return None;
    }
    let recovered = cut
        .iter()
        .filter(|s| s.recovery == Some(ActionResult::Ok))
        .count();
    let tasks_cut = (cx.r.straggler_counts.tasks as usize).max(cut.len());
    let message = if recovered == tasks_cut {
        // Each one used spawn_with_recovery and its recovery worked: recommending it
        // again would be wrong; what is left is that the task did not end by itself.
        format!(
            "{tasks_cut} background tasks were still running at the quiesce deadline and were \
             aborted; their recovery actions ran and reported ok, so their work was handed \
             back. The drain still counts as deadline_exceeded (exit 1): the tasks did not end \
             by themselves. Return on TaskContext::hurry (it fires hurry_lead before the \
             deadline), or raise grace_period"
        )
    } else {
        let with = if recovered > 0 {
            format!(" ({recovered} of them handed their work back in a recovery action)")
        } else {
            String::new()
        };
        format!(
            "{tasks_cut} background tasks were still running at the quiesce deadline{with}: a task \
             from spawn needs a way to finish sooner (or a longer grace_period); one from \
             tasks().spawn_cancellable must return once its stop signal fires — these did not \
             — or hand its work back in a recovery action (tasks().spawn_with_recovery)"
        )
    };
    Some(advice(
        Warn,
        AdviceRule::TasksCut,
        tasks_cut as u64,
        message,
    ))
}

/// `tasks_panicked`: background tasks that panicked, by name.
pub(super) fn tasks_panicked(cx: &Ctx<'_>) -> Option<Advice> {
    let panicked: Vec<&str> =
        cx.r.tasks
            .iter()
            .filter(|t| t.result == TaskResult::Panicked)
            .map(|t| t.name.as_str())
            .collect();
    if panicked.is_empty() {
        return None;
    }
    Some(advice(
        Warn,
        AdviceRule::TasksPanicked,
        panicked.len() as u64,
        format!(
            "{} background tasks panicked: {}; their work is not done \
             (DrainBuilder::drain_on_task_panic replaces such a process instead of leaving it serving)",
            panicked.len(),
            panicked.join(", ")
        ),
    ))
}

/// `closers_skipped`: closers with no time left before the hard deadline, by name.
pub(super) fn closers_skipped(cx: &Ctx<'_>) -> Option<Advice> {
    let skipped: Vec<&str> =
        cx.r.closers
            .iter()
            .filter(|c| c.result == ActionResult::Skipped)
            .map(|c| c.name.as_str())
            .collect();
    if skipped.is_empty() {
        return None;
    }
    if cx.r.outcome == Outcome::Forced {
        return Some(advice(
            Warn,
            AdviceRule::ClosersSkipped,
            skipped.len() as u64,
            format!(
                "{} closers were skipped because the exit was forced (a second signal): {}; \
                 the resources they close were left as they were",
                skipped.len(),
                skipped.join(", ")
            ),
        ));
    }
    Some(advice(
        Warn,
        AdviceRule::ClosersSkipped,
        skipped.len() as u64,
        format!(
            "{} closers were skipped, with no time left before the hard deadline: {}; \
             raise close_budget, bound the closers before them, or mark them critical \
             (tasks().on_close_with and CloseOptions::critical)",
            skipped.len(),
            skipped.join(", ")
        ),
    ))
}

/// `closers_failed`: closers that failed, panicked or timed out, with their results.
pub(super) fn closers_failed(cx: &Ctx<'_>) -> Option<Advice> {
    let failed: Vec<String> =
        cx.r.closers
            .iter()
            .filter(|c| !c.is_ok() && c.result != ActionResult::Skipped)
            .map(|c| format!("{} ({})", c.name, c.result))
            .collect();
    if failed.is_empty() {
        return None;
    }
    Some(advice(
        Warn,
        AdviceRule::ClosersFailed,
        failed.len() as u64,
        format!(
            "{} closers did not close cleanly: {}",
            failed.len(),
            failed.join(", ")
        ),
    ))
}
