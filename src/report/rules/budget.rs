//! Time: how late in-flight work reached zero in the quiesce window, `serve`'s idle timeout
//! against the proxies', and the grace period's headroom.

use super::{advice, secs, Ctx};
use crate::report::AdviceLevel::{Info, Warn};
use crate::report::{Advice, AdviceRule};
use crate::vocab::phase::EventKind;

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

/// `grace_headroom` when little of the grace period was left at the end, else `grace_used`.
pub(super) fn grace(cx: &Ctx<'_>) -> Option<Advice> {
    let b = &cx.r.budget;
    let pct = (b.used_ms * 100).checked_div(b.grace_ms)?;
    Some(if b.remaining_ms < b.close_budget_ms / 2 {
        advice(
            Warn,
            AdviceRule::GraceHeadroom,
            b.remaining_ms,
            format!(
                "only {} ms of the {} ms grace period were left at the end",
                b.remaining_ms, b.grace_ms
            ),
        )
    } else {
        advice(
            Info,
            AdviceRule::GraceUsed,
            pct,
            format!(
                "this drain used {} ms, {pct}% of the {} ms grace period",
                b.used_ms, b.grace_ms
            ),
        )
    })
}
