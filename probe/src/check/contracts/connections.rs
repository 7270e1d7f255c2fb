//! Connections through the drain: new ones accepted, running requests finished, kept ones
//! told to close.

use super::{at, described, end_unix, lost, Contract, Judge, Verdict, NOTICE_MS};
use crate::check::Observed;
use crate::config::{ConnectionMode, HttpVersion};
use crate::record::{Failure, Outcome, Record};

pub(crate) fn listener_open(o: &Observed) -> Contract {
    const NAME: &str = "listener_open";
    const TITLE: &str = "keeps accepting new connections through the drain window";
    let judge = Judge::new(NAME, TITLE);
    let Some(t0) = o.t0 else {
        return judge.not_measured("the service never started");
    };
    let end = t0 + o.drain_window_ms;
    let window = format!("drain window t+0 … {}", at(end, t0));
    let fresh: Vec<&Record> = o
        .records
        .iter()
        .filter(|r| {
            r.mode == ConnectionMode::Fresh && r.start_unix_ms.is_some_and(|s| s >= t0 && s <= end)
        })
        .collect();
    let refused: Vec<&Record> = fresh
        .iter()
        .copied()
        .filter(|r| r.failure == Some(Failure::Connect))
        .collect();
    let mut evidence = vec![format!(
        "{} requests on new connections in the {window}, {} refused",
        fresh.len(),
        refused.len()
    )];
    if let (Some(e), Some(exit)) = (o.exited_at, o.exit) {
        if e < end && !exit.killed_at_grace {
            evidence.push(format!(
                "the process exited at {}, inside the window",
                at(e, t0)
            ));
        }
    }
    if !refused.is_empty() {
        evidence.extend(described(&refused, t0));
        let first = refused[0].start_unix_ms.unwrap_or(t0);
        return judge
            .fail(format!(
                "{} of {} new connections refused from {}: proxies that have not caught up \
                 yet get errors",
                refused.len(),
                fresh.len(),
                at(first, t0)
            ))
            .with(evidence);
    }
    if fresh.is_empty() {
        return judge.not_measured("no request opened a new connection in the drain window (use --connections fresh or mixed)",
        )
        .with(evidence);
    }
    judge
        .pass(format!(
            "all {} new connections in the {window} accepted",
            fresh.len()
        ))
        .with(evidence)
}

pub(crate) fn in_flight(o: &Observed) -> Contract {
    const NAME: &str = "in_flight";
    const TITLE: &str = "requests in flight complete";
    let judge = Judge::new(NAME, TITLE);
    let (Some(t0), Some(_)) = (o.t0, o.signal_at) else {
        return judge.not_measured("the service was never stopped");
    };
    let sent = o.signal_at.unwrap_or(t0);
    let destroyed: Vec<&Record> = o.records.iter().filter(|r| lost(r)).collect();
    // Running when the stop began (t+0) or when the signal went (after a preStop hook).
    let running_at = |when: f64| {
        o.records
            .iter()
            .filter(|r| {
                r.start_unix_ms.is_some_and(|s| s < when) && end_unix(r).is_none_or(|e| e > when)
            })
            .count()
    };
    let (at_stop, at_signal) = (running_at(t0), running_at(sent));
    let running = at_stop.max(at_signal);
    let mut evidence = vec![format!(
        "{} requests sent, {at_stop} running at t+0, {at_signal} when {} was sent, {} lost",
        o.records.len(),
        o.signal_name,
        destroyed.len()
    )];
    if !destroyed.is_empty() {
        evidence.extend(described(&destroyed, t0));
        return judge
            .fail(format!(
                "{} requests lost (listed by id, with where each was and when)",
                destroyed.len()
            ))
            .with(evidence);
    }
    if running == 0 {
        return judge.not_measured("nothing was in flight at the stop or the stop signal (raise --slow-rate or --slow)",
        )
        .with(evidence);
    }
    judge
        .pass(format!(
            "all {running} requests running at the stop completed, none lost"
        ))
        .with(evidence)
}

pub(crate) fn keepalive_close(o: &Observed) -> Contract {
    const NAME: &str = "keepalive_close";
    const TITLE: &str = "keep-alive clients are told to close (Connection: close / GOAWAY)";
    let judge = Judge::new(NAME, TITLE);
    let Some(t0) = o.t0 else {
        return judge.not_measured("the service never started");
    };
    let told = o.told_at.unwrap_or(t0) + NOTICE_MS;
    let kept: Vec<&Record> = o
        .records
        .iter()
        .filter(|r| {
            r.mode == ConnectionMode::KeepAlive && r.start_unix_ms.is_some_and(|s| s >= told)
        })
        .collect();
    let answered: Vec<&&Record> = kept.iter().filter(|r| r.outcome == Outcome::Ok).collect();
    // Lost on a kept connection after the service knew, whenever it started: the connection
    // was closed under the client instead of the client being told.
    let broken: Vec<&Record> = o
        .records
        .iter()
        .filter(|r| {
            r.mode == ConnectionMode::KeepAlive
                && (r.outcome == Outcome::Unfinished
                    || (r.outcome == Outcome::Failed
                        && matches!(r.failure, Some(Failure::Request | Failure::Body))))
                && end_unix(r).is_none_or(|e| e >= told - NOTICE_MS)
        })
        .collect();
    let from = at(told, t0);
    if o.http == HttpVersion::Http2 {
        return keepalive_http2(&judge, o, t0, kept.len(), &broken, &from);
    }
    let said: Vec<&&&Record> = answered.iter().filter(|r| r.connection_close).collect();
    let mut evidence = vec![format!(
        "{} keep-alive responses from {from} (the service told to stop, plus {NOTICE_MS:.0} ms), \
         {} with Connection: close; {} keep-alive requests lost",
        answered.len(),
        said.len(),
        broken.len()
    )];
    if let Some(first) = answered.iter().find(|r| !r.connection_close) {
        evidence.push(format!(
            "first without it: {} sent at {}",
            first.id,
            at(first.start_unix_ms.unwrap_or(t0), t0)
        ));
    }
    let first_told = said
        .first()
        .map(|r| {
            format!(
                " (the first with it sent at {})",
                at(r.start_unix_ms.unwrap_or(t0), t0)
            )
        })
        .unwrap_or_default();
    if !broken.is_empty() {
        evidence.extend(described(&broken, t0));
    }
    let (verdict, summary) = close_verdict(answered.len(), said.len(), broken.len(), &first_told);
    judge.verdict(verdict, summary).with(evidence)
}

/// Keep-alive over HTTP/2: one shared connection. A graceful GOAWAY to the one open when the
/// service was told shows as later requests moved to another connection (before anything was
/// sent, or at their lease), with nothing lost on the old one. Connections opened during the
/// drain may stay open until the service stops accepting.
fn keepalive_http2(
    judge: &Judge<'_>,
    o: &Observed,
    t0: f64,
    kept: usize,
    broken: &[&Record],
    from: &str,
) -> Contract {
    let told_exact = o.told_at.unwrap_or(t0);
    let open_at_told = o
        .records
        .iter()
        .filter(|r| {
            r.mode == ConnectionMode::KeepAlive && r.start_unix_ms.is_some_and(|s| s < told_exact)
        })
        .filter_map(|r| r.conn)
        .next_back();
    let moved = o.records.iter().any(|r| {
        r.mode == ConnectionMode::KeepAlive
            && r.start_unix_ms.is_some_and(|s| s >= told_exact)
            && (r.rerouted > 0 || (r.conn.is_some() && r.conn != open_at_told))
    });
    let mut evidence = vec![format!(
        "{} requests on the shared HTTP/2 connection from {from}, {} lost",
        kept,
        broken.len()
    )];
    if !broken.is_empty() {
        evidence.extend(described(broken, t0));
        return judge
            .fail("the shared connection was closed under running requests (no graceful GOAWAY)")
            .with(evidence);
    }
    if moved {
        judge
            .pass("the client moved to a new connection with nothing lost (graceful GOAWAY)")
            .with(evidence)
    } else {
        judge
            .not_measured("the shared connection was never replaced while the client still sent")
            .with(evidence)
    }
}

/// The verdict on HTTP/1.1 keep-alive: how many answers after the stop said
/// `Connection: close` (`said` of `answered`), and how many requests were `broken`.
fn close_verdict(
    answered: usize,
    said: usize,
    broken: usize,
    first_told: &str,
) -> (Verdict, String) {
    if answered == 0 && broken == 0 {
        (
            Verdict::NotMeasured,
            "no keep-alive request after the service was told to stop (raise --drain-window)"
                .to_owned(),
        )
    } else if broken != 0 {
        (
            Verdict::Fail,
            format!(
                "{} requests on kept connections lost: the connections were closed without notice",
                broken
            ),
        )
    } else if said == 0 {
        (
            Verdict::Fail,
            format!(
                "none of {} keep-alive responses after the stop said Connection: close: pooled \
                 clients keep the connection until it breaks",
                answered
            ),
        )
    } else if said * 2 < answered {
        (
            Verdict::Fail,
            format!(
                "{} of {} keep-alive responses after the stop had no Connection: close{first_told}: \
                 pooled clients keep sending here until the listener closes",
                answered - said,
                answered
            ),
        )
    } else if said < answered {
        (
            Verdict::Warn,
            format!(
                "{} of {} keep-alive responses after the stop said Connection: close{first_told}",
                said, answered
            ),
        )
    } else {
        (
            Verdict::Pass,
            format!(
                "all {} keep-alive responses after the stop said Connection: close",
                answered
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_keep_alive_requests_fail_even_when_every_answer_said_close() {
        let (verdict, summary) = close_verdict(37, 37, 14, "");
        assert_eq!(verdict, Verdict::Fail, "{summary}");
        assert!(summary.starts_with("14 requests"), "{summary}");
    }

    #[test]
    fn every_answer_saying_close_and_nothing_lost_passes() {
        let (verdict, summary) = close_verdict(37, 37, 0, "");
        assert_eq!(verdict, Verdict::Pass, "{summary}");
    }
}
