//! The stop signal: does it reach the process, and does the process react.

use super::{at, Contract, Judge};
use crate::check::process::Disposition;
use crate::check::{HookEnd, Observed};
use crate::config::ConnectionMode;

pub(crate) fn stop_signal(o: &Observed) -> Contract {
    const NAME: &str = "stop_signal";
    const TITLE: &str = "the stop signal reaches the process and it reacts";
    let judge = Judge::new(NAME, TITLE);
    let sig = &o.signal_name;
    let (Some(t0), Some(sent)) = (o.t0, o.signal_at) else {
        return judge.not_measured("no stop signal was sent");
    };
    let mut evidence = vec![format!(
        "{sig} sent to pid {} at {}",
        o.target_pid,
        at(sent, t0)
    )];
    let reaction = Reaction::after(o, t0, sent);
    let d: &Disposition = match &o.disposition {
        Ok(d) => d,
        Err(why) => {
            evidence.push(format!("disposition not readable: {why}"));
            evidence.extend(reaction.changes.iter().cloned());
            return if reaction.reacted() && !reaction.killed {
                judge.pass(format!(
                    "the process reacted: {}",
                    reaction.changes.join(", ")
                ))
            } else {
                judge.fail(format!("no reaction to {sig}{}", reaction.kill_note))
            }
            .with(evidence);
        }
    };
    evidence.push(disposition_line(d, sig));
    if d.blocked {
        evidence.push(format!("{sig} is blocked (SigBlk) by the main thread"));
    }
    evidence.extend(reaction.changes.iter().cloned());
    signal_verdict(&judge, o, d, &reaction).with(evidence)
}

/// What the process did after the stop signal.
struct Reaction {
    /// What changed after the signal, beside a kill at the grace period.
    changes: Vec<String>,
    /// Still running at the grace period, so it was SIGKILLed.
    killed: bool,
    /// `; still running at the grace period, SIGKILLed at …` when killed, else empty.
    kill_note: String,
}

impl Reaction {
    fn after(o: &Observed, t0: f64, sent: f64) -> Self {
        let mut changes = Vec::new();
        if let (Some(e), Some(exit)) = (o.exited_at, o.exit) {
            if !exit.killed_at_grace {
                changes.push(format!("exited at {}", at(e, t0)));
            }
        }
        if let Some(p) = o
            .ready_polls
            .iter()
            .find(|p| p.start >= sent && p.status.is_some_and(|s| s != 200))
        {
            changes.push(format!("readiness {} at {}", p.answer(), at(p.start, t0)));
        }
        if let Some(rec) = o.records.iter().find(|r| {
            // A fresh connection's answer says close because the request asked for it.
            r.start_unix_ms.is_some_and(|s| s >= sent)
                && ((r.mode == ConnectionMode::KeepAlive && r.connection_close)
                    || r.served_by_draining())
        }) {
            changes.push(format!(
                "answers changed from {} (Connection: close on kept connections, or a draining phase)",
                at(rec.start_unix_ms.unwrap_or(sent), t0)
            ));
        }
        let killed = o.exit.is_some_and(|e| e.killed_at_grace);
        let kill_note = if killed {
            format!(
                "; still running at the {}, SIGKILLed at {}",
                o.kill_name,
                at(t0 + o.grace_ms, t0)
            )
        } else {
            String::new()
        };
        Reaction {
            changes,
            killed,
            kill_note,
        }
    }

    fn reacted(&self) -> bool {
        !self.changes.is_empty()
    }
}

/// `service (pid 7, PID 1 of its PID namespace): SIGTERM caught (SigCgt)`.
fn disposition_line(d: &Disposition, sig: &str) -> String {
    format!(
        "{} (pid {}{}): {sig} {}",
        d.name,
        d.pid,
        if d.pid1 {
            ", PID 1 of its PID namespace"
        } else {
            ""
        },
        if d.caught {
            "caught (SigCgt)"
        } else if d.ignored {
            "ignored (SigIgn)"
        } else {
            "default action (neither SigCgt nor SigIgn)"
        }
    )
}

/// The verdict from how the process handles the signal and what it did.
fn signal_verdict(judge: &Judge<'_>, o: &Observed, d: &Disposition, r: &Reaction) -> Contract {
    let sig = &o.signal_name;
    let kill_note = &r.kill_note;
    let changes = r.changes.join(", ");
    if d.ignored {
        judge.fail(format!("{} ignores {sig} (SigIgn){kill_note}", d.name))
    } else if !d.caught && d.pid1 {
        judge.fail(format!(
            "dropped by the kernel: {} is PID 1 of its PID namespace with no {sig} handler, so \
             the signal never arrives{kill_note}. Shell form runs the service under /bin/sh: \
             use the exec form (CMD [\"service\"]), `exec service` in a script, or an init \
             (tini, docker run --init)",
            d.name
        ))
    } else if !d.caught {
        if o.exit.is_some_and(|e| e.signal == Some(o.signal_number)) {
            judge.warn(format!(
                "reaches {} without a handler: the default action ended it at once, nothing \
                 drained",
                d.name
            ))
        } else if r.reacted() && !r.killed {
            judge.pass(format!("the process reacted: {changes}"))
        } else {
            judge.fail(format!("no handler and no reaction to {sig}{kill_note}"))
        }
    } else if r.reacted() && !r.killed {
        judge.pass(format!("caught by {}; {changes}", d.name))
    } else if r.reacted() {
        judge.warn(format!(
            "caught by {} and it reacted ({changes}){kill_note}",
            d.name
        ))
    } else {
        judge.fail(format!(
            "caught by {} but nothing changed{kill_note}: the handler does not start a \
             shutdown",
            d.name
        ))
    }
}

/// The `preStop` hook (httpGet or exec): did it reach the service. kubelet ignores an httpGet
/// hook's status and only records an exec hook's failure as an event, so a hook that does
/// nothing (a token the service refuses, a wrong path) is seen nowhere else.
pub(crate) fn prestop(o: &Observed) -> Option<Contract> {
    const NAME: &str = "prestop";
    const TITLE: &str = "the preStop hook reaches the service";
    let judge = Judge::new(NAME, TITLE);
    let hook = o.hook.as_ref()?;
    let t0 = o.t0?;
    let evidence = vec![format!("{} hook ended at {}", hook.kind, at(hook.at, t0))];
    let sig = &o.signal_name;
    let contract = match &hook.ended {
        HookEnd::Answered(s) if (200..300).contains(s) => {
            judge.pass(format!("the hook's GET was answered {s}"))
        }
        HookEnd::Answered(s @ 500..) => judge.warn(format!(
            "the hook's GET was answered {s}: the service took the call and failed it (504 is \
             lameduck's answer when `?timeout=` passes with the drain going on)"
        )),
        HookEnd::Answered(s @ (401 | 403)) => judge.fail(format!(
            "the hook's GET was refused ({s}): the token it sends is not the service's \
             (LAMEDUCK_ADMIN_TOKEN, and the hook's httpHeaders or `--token`); the service \
             learned of the stop only from {sig}, after the hook, and kubelet ignores a \
             hook's status, so nothing else reports it"
        )),
        HookEnd::Answered(404) => judge.fail(format!(
            "the hook's GET was answered 404: the service has no such path (lameduck's admin \
             endpoint is /drain, on the admin port); the service learned of the stop only \
             from {sig}"
        )),
        HookEnd::Answered(s) => judge.fail(format!(
            "the hook's GET was answered {s}: the service did not take it; it learned of the \
             stop only from {sig}"
        )),
        HookEnd::NoAnswer(e) => judge.fail(format!(
            "the hook got no answer ({e}): the service learned of the stop only from {sig}"
        )),
        HookEnd::Exited(Some(0)) => judge.pass("the hook's command exited 0"),
        HookEnd::Exited(code) => judge.warn(format!(
            "the hook's command {}: kubelet records FailedPreStopHook and sends {sig}; \
             whether it told the service first, the other contracts say",
            code.map_or_else(
                || "was killed by a signal".to_owned(),
                |c| format!("exited {c}")
            )
        )),
        HookEnd::OutOfTime => judge.fail(
            "the hook was still running when the grace period ended: the service got no time \
             after it",
        ),
    };
    Some(contract.with(evidence))
}
