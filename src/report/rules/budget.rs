//! Time: how late in-flight work reached zero in the quiesce window, `serve`'s idle timeout
//! against the proxies', and the grace period's headroom.

use super::{advice, secs, Ctx};
use crate::report::AdviceLevel::{Info, Warn};
use crate::report::{ActionResult, Advice, AdviceRule, BudgetSource};
use crate::vocab::phase::{CommitReason, EventKind};

/// The idle timeout proxies commonly keep pooled upstream connections for (nginx's upstream
/// `keepalive_timeout`, common cloud load-balancer defaults): a server idle timeout below it
/// invites resets on reused connections.
const PROXY_IDLE_TIMEOUT_MS: u64 = 60_000;

/// `in_flight_late`: in-flight requests reached zero in the last fifth of the quiesce window.
pub(super) fn in_flight_late(cx: &Ctx<'_>) -> Option<Advice> {
    let zero = cx.r.event(EventKind::InFlightZero)?;
    let q = cx.r.budget.quiesce_ms;
    (q > 0 && zero.at_ms * 10 >= q * 8).then(|| {
        advice(
            Warn,
            AdviceRule::InFlightLate,
            zero.at_ms,
            format!(
                "in-flight requests reached zero at {} ms, {}% of the quiesce window ({q} ms): little headroom",
                zero.at_ms,
                zero.at_ms * 100 / q
            ),
        )
    })
}

/// `server_idle_timeout_short`: the one layer of the timeout chain this process can see, its
/// own idle timeout, is shorter than common proxies'.
pub(super) fn server_idle_timeout_short(cx: &Ctx<'_>) -> Option<Advice> {
    let t = cx.r.server.as_ref()?.header_read_timeout_ms?;
    (t < PROXY_IDLE_TIMEOUT_MS).then(|| {
        advice(
            Warn,
            AdviceRule::ServerIdleTimeoutShort,
            t,
            format!(
                "serve closes a keep-alive connection after {} without a request (header_read_timeout), \
                 shorter than the {} idle timeout many proxies keep upstream connections for: \
                 a proxy that keeps one longer than this server gets a reset or a 502 on its next request over it. \
                 Set it above every proxy's idle timeout (SUGGESTED_HEADER_READ_TIMEOUT is 75 s) \
                 or lower the proxies' below it",
                secs(t),
                secs(PROXY_IDLE_TIMEOUT_MS)
            ),
        )
    })
}

/// `grace_headroom` when little of the budget was left at the end, else `grace_used`: of the
/// grace period, or of the shorter budget the drain was given (`budget.deletion`).
pub(super) fn grace(cx: &Ctx<'_>) -> Option<Advice> {
    let b = &cx.r.budget;
    let (total, what) = match &b.deletion {
        Some(d) => (d.kill_at_ms, format!("{} budget", d.source)),
        None => (b.grace_ms, "grace period".to_owned()),
    };
    let pct = (b.used_ms * 100).checked_div(total)?;
    let close = match &b.deletion {
        // The close budget shrank with the grace (`DeletionBudget::hard_ms − quiesce_ms`).
        Some(d) => d.hard_ms.saturating_sub(d.quiesce_ms),
        None => b.close_budget_ms,
    };
    Some(if b.remaining_ms < close / 2 {
        advice(
            Warn,
            AdviceRule::GraceHeadroom,
            b.remaining_ms,
            format!(
                "only {} ms of the {total} ms {what} were left at the end",
                b.remaining_ms
            ),
        )
    } else {
        advice(
            Info,
            AdviceRule::GraceUsed,
            pct,
            format!(
                "this drain used {} ms, {pct}% of the {total} ms {what}",
                b.used_ms
            ),
        )
    })
}

/// `budget_shortened`: the drain was given less than its grace period; what gave it, the
/// deadlines it kept, and what it had to cut short because of them (a `max` commit, work cut
/// at the quiesce deadline, closers cut or skipped). A warning when something was cut.
pub(super) fn shortened(cx: &Ctx<'_>) -> Option<Advice> {
    let r = cx.r;
    let d = r.budget.deletion.as_ref()?;
    let why = match d.source {
        BudgetSource::Deletion => "the Pod's deletion gave",
        BudgetSource::ShortestGrace => {
            "the configured shortest grace (LAMEDUCK_SHORTEST_GRACE) gave"
        }
        BudgetSource::NodeShutdown => "the kubelet's node shutdown gave",
        BudgetSource::NodePressureEviction => "the kubelet's node-pressure eviction gave",
    };
    let mut cut = Vec::new();
    if let Some(e) = cx.stopped.filter(|e| e.reason == Some(CommitReason::Max)) {
        cut.push(format!(
            "propagation committed on max at {} ms (max shortened to {} ms)",
            e.at_ms, d.max_ms
        ));
    }
    let min = r.propagation.min_ms;
    if min > d.quiesce_ms {
        cut.push(format!(
            "propagation min ({min} ms) did not fit before the shortened quiesce deadline ({} ms): \
             lower min, or plan for this budget",
            d.quiesce_ms
        ));
    }
    let c = &r.straggler_counts;
    if c.requests + c.tasks > 0 {
        cut.push(format!(
            "{} request(s) and {} task(s) still running at the quiesce deadline ({} ms)",
            c.requests, c.tasks, d.quiesce_ms
        ));
    }
    let closers = r
        .closers
        .iter()
        .filter(|c| {
            matches!(
                c.result,
                ActionResult::TimedOut | ActionResult::Skipped | ActionResult::Aborted
            )
        })
        .map(|c| format!("`{}` {}", c.name, c.result))
        .collect::<Vec<_>>();
    if !closers.is_empty() {
        cut.push(format!("closer(s) {}", closers.join(", ")));
    }
    let deadlines = format!(
        "{why} {} ms ({}), not the {} ms grace period: the kill could come {} ms after the \
         trigger, so max became {} ms, the quiesce deadline {} ms and the hard deadline {} ms",
        d.deletion_grace_ms,
        d.source,
        r.budget.grace_ms,
        d.kill_at_ms,
        d.max_ms,
        d.quiesce_ms,
        d.hard_ms
    );
    Some(if cut.is_empty() {
        advice(
            Info,
            AdviceRule::BudgetShortened,
            d.kill_at_ms,
            format!("{deadlines}; nothing was cut short"),
        )
    } else {
        advice(
            Warn,
            AdviceRule::BudgetShortened,
            d.kill_at_ms,
            format!("{deadlines}; cut short: {}", cut.join("; ")),
        )
    })
}
