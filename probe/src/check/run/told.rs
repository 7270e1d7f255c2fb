//! When an exec `preStop` hook told the service to stop — if it did.
//!
//! An httpGet hook reaches the service at `t+0`, a sleep hook never does; an exec hook may do
//! either (`service prestop` or `curl …/drain` calls the admin port, `sleep 5` tells it
//! nothing), and when it does, its call arrives once the command has started. So an exec hook
//! is judged from when the service shows it was told, and as a sleep hook is (from the signal)
//! when it shows nothing before the signal:
//!
//! 1. a lameduck drain report names its trigger: `prestop` or `api` (the hook reached the
//!    admin port or the application) was the hook, told at the report's `drain_started`; a
//!    signal (`sigterm`…) was not;
//! 2. without a trigger, the first answer sent after `t+0` and complete before the signal that
//!    shows a drain, told by its end: readiness not 200, `Connection: close` on a kept
//!    connection (where none said it before `t+0`), or a draining `x-lameduck-phase`.

use crate::check::contracts::at;
use crate::check::Observed;
use crate::config::ConnectionMode;
use crate::record::Record;

/// Settles [`Observed::told_at`] after an exec hook; the note that says how it was judged.
pub(super) fn settle(o: &mut Observed) -> Option<String> {
    if !o.exec_hook {
        return None;
    }
    let t0 = o.t0?;
    let Some(signal_at) = o.signal_at else {
        // Gone before any signal: the hook is all the service was told by.
        o.told_at = Some(t0);
        return None;
    };
    let told = match o.report.as_ref().filter(|r| r.trigger.is_some()) {
        Some(r) => {
            let trigger = r.trigger.as_deref().unwrap_or_default();
            let why = format!("the drain report's trigger is {trigger}");
            if matches!(trigger, "sigterm" | "sigint" | "sigquit") {
                Err(why)
            } else {
                let when = r.drain_started_unix_ms.unwrap_or(t0).max(t0);
                Ok((when, format!("{why}, drain_started at {}", at(when, t0))))
            }
        }
        None => change_before(o, t0, signal_at).ok_or_else(|| {
            "nothing the service answered between the hook's start and the signal showed a \
             drain (readiness, Connection: close, x-lameduck-phase)"
                .to_owned()
        }),
    };
    Some(match told {
        Ok((when, why)) => {
            o.told_at = Some(when);
            format!(
                "preStop exec: it told the service, which is judged from {}: {why}",
                at(when, t0)
            )
        }
        Err(why) => {
            o.told_at = Some(signal_at);
            format!(
                "preStop exec: judged from {} at {}, as a sleep hook is: it did not tell the \
                 service ({why})",
                o.signal_name,
                at(signal_at, t0)
            )
        }
    })
}

/// The first sign, after `t0` and before `signal_at`, that the service had been told to stop,
/// and when: an answer sent after `t0` and complete before the signal (one that spans the
/// signal may have been changed by it). The time is the answer's end: what it said was
/// decided somewhere between its start and its end, so the end is the one time the service
/// surely knew by.
fn change_before(o: &Observed, t0: f64, signal_at: f64) -> Option<(f64, String)> {
    let not_ready = o
        .ready_polls
        .iter()
        .find(|p| p.start >= t0 && p.end < signal_at && p.status.is_some_and(|s| s != 200))
        .map(|p| (p.end, format!("readiness {}", p.answer())));
    // (start, end) of the answers that ended, with what they said.
    let answers = || {
        o.records.iter().filter_map(|r| {
            let start = r.start_unix_ms?;
            Some((r, start, start + r.elapsed_ms()?))
        })
    };
    let between = |start: f64, end: f64| start >= t0 && end < signal_at;
    let close = |r: &Record| r.mode == ConnectionMode::KeepAlive && r.connection_close;
    // A server that closes kept connections now and then (a request cap) says nothing new.
    let closed_before = answers().any(|(r, _, end)| close(r) && end < t0);
    let closed = answers()
        .filter(|(r, start, end)| !closed_before && close(r) && between(*start, *end))
        .map(|(_, _, end)| (end, "Connection: close on a kept connection".to_owned()));
    let draining = answers()
        .filter(|(r, start, end)| r.served_by_draining() && between(*start, *end))
        .map(|(_, _, end)| (end, "x-lameduck-phase draining".to_owned()));
    not_ready
        .into_iter()
        .chain(closed)
        .chain(draining)
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(end, what)| (end, format!("{what} answered at {}", at(end, t0))))
}
