//! Before the stop and through it: startup, readiness and liveness.

use super::{at, Contract, Judge, EXITING_MS};
use crate::check::{Observed, Poll};

pub(crate) fn startup(o: &Observed) -> Contract {
    const NAME: &str = "startup";
    const TITLE: &str = "ready within the startup timeout";
    let judge = Judge::new(NAME, TITLE);
    match (&o.ready_after, &o.startup_error) {
        (Some(ms), _) => judge.pass(format!("{} answered 200 after {ms:.0} ms", o.ready_url)),
        (None, Some(e)) => judge.fail(e.clone()),
        (None, None) => judge.fail("never ready"),
    }
}

pub(crate) fn readiness(o: &Observed, expect_serving: bool) -> Contract {
    const NAME: &str = "readiness";
    let title = if expect_serving {
        "stable, then stays serving through the drain window"
    } else {
        "stable, then turns not-ready once the service is told to stop"
    };
    let judge = Judge::new(NAME, title);
    let Some(t0) = o.t0 else {
        return judge.not_measured("the service never started");
    };
    let mut evidence = Vec::new();
    // Stable: after the first 200, only 200 until the stop.
    let before: Vec<_> = o.ready_polls.iter().filter(|p| p.end < t0).collect();
    let flaps: Vec<_> = before.iter().filter(|p| p.status != Some(200)).collect();
    evidence.push(format!(
        "{} polls before the stop, {} not 200",
        before.len(),
        flaps.len()
    ));
    if let Some(f) = flaps.first() {
        return judge
            .fail(format!(
                "not stable: {} at {} while serving",
                f.answer(),
                at(f.start, t0)
            ))
            .with(evidence);
    }
    let told = o.told_at.unwrap_or(t0);
    let alive_until = o.exited_at.unwrap_or(f64::INFINITY);
    let after: Vec<_> = o
        .ready_polls
        .iter()
        .filter(|p| p.start >= told && p.end < alive_until)
        .collect();
    let first_not_ready = after.iter().find(|p| p.status.is_some_and(|s| s != 200));
    let last_200 = after.iter().rev().find(|p| p.status == Some(200));
    if let Some(p) = last_200 {
        evidence.push(format!("last 200 after the stop at {}", at(p.start, t0)));
    }
    if let Some(p) = first_not_ready {
        evidence.push(format!("first {} at {}", p.answer(), at(p.start, t0)));
    }
    if expect_serving {
        serving_through_window(&judge, o, t0, &after).with(evidence)
    } else {
        turns_not_ready(&judge, o, t0, &after, first_not_ready).with(evidence)
    }
}

/// Readiness for a service that should stay serving: 200 on every poll in the drain window.
fn serving_through_window(judge: &Judge<'_>, o: &Observed, t0: f64, after: &[&Poll]) -> Contract {
    let window_end = t0 + o.drain_window_ms;
    let in_window: Vec<_> = after.iter().filter(|p| p.start <= window_end).collect();
    if in_window.is_empty() {
        return judge.not_measured(
            "no readiness poll answered between the stop and the end of the drain window",
        );
    }
    match in_window.iter().find(|p| p.status != Some(200)) {
        None => judge.pass(format!(
            "200 on all {} polls through the drain window (to {})",
            in_window.len(),
            at(window_end, t0)
        )),
        Some(p) => judge.fail(format!(
            "{} at {}, inside the drain window: kubelet's probe would drop the endpoint's \
             serving condition",
            p.answer(),
            at(p.start, t0)
        )),
    }
}

/// Readiness for a service that should turn not-ready once told to stop, and stay so.
fn turns_not_ready(
    judge: &Judge<'_>,
    o: &Observed,
    t0: f64,
    after: &[&Poll],
    first_not_ready: Option<&&Poll>,
) -> Contract {
    match first_not_ready {
        Some(p) => {
            let back = after
                .iter()
                .find(|q| q.start > p.start && q.status == Some(200));
            match back {
                None => judge.pass(format!("not ready from {} until the exit", at(p.start, t0))),
                Some(q) => judge.warn(format!(
                    "not ready at {}, ready again at {}",
                    at(p.start, t0),
                    at(q.start, t0)
                )),
            }
        }
        None => {
            let gone = o.exited_at.map_or_else(
                || "until SIGKILL".to_owned(),
                |e| format!("until the exit at {}", at(e, t0)),
            );
            judge.fail(format!(
                "never answered not-ready ({} polls after the stop) {gone}: a load balancer that \
                 probes the Pod keeps sending new work",
                after.len()
            ))
        }
    }
}

pub(crate) fn liveness(o: &Observed) -> Contract {
    const NAME: &str = "liveness";
    const TITLE: &str = "stays green while draining";
    let judge = Judge::new(NAME, TITLE);
    let Some(url) = &o.live_url else {
        return judge.not_measured("no --live URL given");
    };
    let Some(t0) = o.t0 else {
        return judge.not_measured("the service never started");
    };
    // A poll that ends just before the exit may meet a listener already closing: kubelet
    // restarts only after `failureThreshold` (default 3) failures in a row, so the last
    // poll interval before the exit is not held against the service.
    let alive_until = o.exited_at.map_or(f64::INFINITY, |e| e - EXITING_MS);
    let draining: Vec<_> = o
        .live_polls
        .iter()
        .filter(|p| p.start >= t0 && p.end < alive_until)
        .collect();
    if draining.is_empty() {
        return judge.not_measured(format!(
            "no poll of {url} fell between the stop and the exit"
        ));
    }
    match draining.iter().find(|p| p.status != Some(200)) {
        None => judge.pass(format!(
            "200 on all {} polls from the stop to {}",
            draining.len(),
            o.exited_at.map_or_else(
                || "SIGKILL".to_owned(),
                |e| format!("the exit at {}", at(e, t0))
            )
        )),
        Some(p) => judge.fail(format!(
            "{} at {} while the process still ran: kubelet would restart the container and \
                 lose the work being drained",
            p.answer(),
            at(p.start, t0)
        )),
    }
}
