//! The judge: one function per contract, each from what was observed, each with its evidence.
//!
//! Times in evidence are `t+N ms` from the stop (the moment a Pod deletion would start the
//! `preStop` hook, or send the stop signal when there is none); `t-N ms` before it.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::process::Disposition;
use super::{Observed, Poll};
use crate::config::{ConnectionMode, HttpVersion};
use crate::record::{Failure, Outcome, Record};

/// Requests listed by name in one contract's evidence; the rest are counted.
const LISTED: usize = 20;
/// Allowance for the service to notice the trigger before its answers are expected to change.
const NOTICE_MS: f64 = 100.0;
/// The last stretch before the exit, when listeners may already be closing.
const EXITING_MS: f64 = 100.0;

/// A contract's verdict.
///
/// JSON form: `"pass"`, `"fail"`, `"warn"`, `"not_measured"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Held, with evidence.
    Pass,
    /// Broken, with evidence.
    Fail,
    /// Held only in part, or held in a way that loses something elsewhere.
    Warn,
    /// The run gave no evidence either way; the summary says why.
    NotMeasured,
}

impl Verdict {
    /// As the table shows it: `PASS`, `FAIL`, `WARN`, `NOT MEASURED`.
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Warn => "WARN",
            Verdict::NotMeasured => "NOT MEASURED",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// One named contract and how the service did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Contract {
    /// Its name: `startup`, `readiness`, `liveness`, `stop_signal`, `listener_open`,
    /// `in_flight`, `keepalive_close`, `exit`, `report`.
    pub name: String,
    /// What it promises, in a few words.
    pub title: String,
    /// The verdict.
    pub verdict: Verdict,
    /// One line: the verdict's reason.
    pub summary: String,
    /// The observations behind it, with times.
    pub evidence: Vec<String>,
}

impl Contract {
    fn new(name: &str, title: &str, verdict: Verdict, summary: impl Into<String>) -> Self {
        Contract {
            name: name.to_owned(),
            title: title.to_owned(),
            verdict,
            summary: summary.into(),
            evidence: Vec::new(),
        }
    }

    fn with(mut self, evidence: Vec<String>) -> Self {
        self.evidence = evidence;
        self
    }
}

/// Gives one contract its verdicts: the contract's name and title, said once.
struct Judge<'a> {
    name: &'a str,
    title: &'a str,
}

impl<'a> Judge<'a> {
    fn new(name: &'a str, title: &'a str) -> Self {
        Judge { name, title }
    }

    fn verdict(&self, verdict: Verdict, summary: impl Into<String>) -> Contract {
        Contract::new(self.name, self.title, verdict, summary)
    }

    fn pass(&self, summary: impl Into<String>) -> Contract {
        self.verdict(Verdict::Pass, summary)
    }

    fn fail(&self, summary: impl Into<String>) -> Contract {
        self.verdict(Verdict::Fail, summary)
    }

    fn warn(&self, summary: impl Into<String>) -> Contract {
        self.verdict(Verdict::Warn, summary)
    }

    fn not_measured(&self, summary: impl Into<String>) -> Contract {
        self.verdict(Verdict::NotMeasured, summary)
    }
}

/// `t+12 ms` / `t-800 ms` for an absolute time.
pub(crate) fn at(unix_ms: f64, t0: f64) -> String {
    let d = (unix_ms - t0).round();
    if d <= -1.0 {
        format!("t-{:.0} ms", -d)
    } else {
        format!("t+{:.0} ms", d.abs())
    }
}

fn end_unix(r: &Record) -> Option<f64> {
    Some(r.start_unix_ms? + r.elapsed_ms()?)
}

/// Where a destroyed request was when it was lost.
fn lost_phase(r: &Record) -> String {
    match (r.outcome, r.failure) {
        (Outcome::Unfinished, _) if r.status.is_some() => {
            format!("reading the body ({} bytes), never ended", r.bytes)
        }
        (Outcome::Unfinished, _) => "awaiting the response, never answered".to_owned(),
        (_, Some(Failure::Body)) => format!("reading the body ({} bytes), cut", r.bytes),
        (_, Some(Failure::Status)) => format!("answered {}", r.status.unwrap_or(0)),
        (_, Some(Failure::Request)) => "sent, awaiting the response: connection lost".to_owned(),
        (_, Some(Failure::Connect)) => "connecting: refused".to_owned(),
        _ => "?".to_owned(),
    }
}

fn describe(r: &Record, t0: f64) -> String {
    let when = end_unix(r)
        .or(r.start_unix_ms)
        .map_or_else(|| "?".to_owned(), |t| at(t, t0));
    let conn = match r.conn {
        Some(c) => format!(
            "conn {c} ({})",
            if r.mode == ConnectionMode::Fresh {
                "fresh"
            } else if r.reused {
                "kept, reused"
            } else {
                "kept, new"
            }
        ),
        None => "no conn".to_owned(),
    };
    let start = r
        .start_unix_ms
        .map_or_else(|| "?".to_owned(), |t| at(t, t0));
    let error = r.error.as_deref().unwrap_or("");
    format!(
        "{} {} {conn}: started {start}, lost at {when} while {}{}{error}",
        r.id,
        r.kind,
        lost_phase(r),
        if error.is_empty() { "" } else { ": " }
    )
}

/// The first [`LISTED`] records described, and how many more there are.
fn described(records: &[&Record], t0: f64) -> Vec<String> {
    let mut lines: Vec<String> = records
        .iter()
        .take(LISTED)
        .map(|r| describe(r, t0))
        .collect();
    if records.len() > LISTED {
        lines.push(format!("… and {} more", records.len() - LISTED));
    }
    lines
}

/// Lost by the service: never finished, or failed after the connection was made.
fn lost(r: &Record) -> bool {
    r.outcome == Outcome::Unfinished
        || (r.outcome == Outcome::Failed && r.failure != Some(Failure::Connect))
}

pub(super) fn startup(o: &Observed) -> Contract {
    const NAME: &str = "startup";
    const TITLE: &str = "ready within the startup timeout";
    let judge = Judge::new(NAME, TITLE);
    match (&o.ready_after, &o.startup_error) {
        (Some(ms), _) => judge.pass(format!("{} answered 200 after {ms:.0} ms", o.ready_url)),
        (None, Some(e)) => judge.fail(e.clone()),
        (None, None) => judge.fail("never ready"),
    }
}

pub(super) fn readiness(o: &Observed, expect_serving: bool) -> Contract {
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

pub(super) fn liveness(o: &Observed) -> Contract {
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

pub(super) fn stop_signal(o: &Observed) -> Contract {
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
                "; still running at the grace period, SIGKILLed at {}",
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

pub(super) fn listener_open(o: &Observed) -> Contract {
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

pub(super) fn in_flight(o: &Observed) -> Contract {
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

pub(super) fn keepalive_close(o: &Observed) -> Contract {
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
    } else if !broken == 0 {
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

pub(super) fn exit(o: &Observed) -> Contract {
    const NAME: &str = "exit";
    const TITLE: &str = "exits 0 inside the grace period";
    let judge = Judge::new(NAME, TITLE);
    let (Some(t0), Some(exit)) = (o.t0, o.exit) else {
        return judge.not_measured("the service was never stopped");
    };
    let when = o.exited_at.map_or_else(|| "?".to_owned(), |e| at(e, t0));
    let budget = o
        .exited_at
        .map(|e| {
            format!(
                ", {:.0}% of the {:.1} s grace period",
                (e - t0) / o.grace_ms * 100.0,
                o.grace_ms / 1000.0
            )
        })
        .unwrap_or_default();
    if exit.killed_at_grace {
        return judge.fail(format!(
            "still running at the grace period ({:.1} s): SIGKILLed at {}",
            o.grace_ms / 1000.0,
            at(t0 + o.grace_ms, t0)
        ));
    }
    match (exit.code, exit.signal) {
        (Some(0), _) => judge.pass(format!("exited 0 at {when}{budget}")),
        (Some(code), _) => judge.fail(format!("exited with code {code} at {when}{budget}")),
        (None, Some(s)) if s == o.signal_number => judge.warn(format!(
            "ended by {}'s default action at {when} (exit status {} in a container)",
            o.signal_name,
            128 + s
        )),
        (None, Some(s)) => judge.fail(format!("ended by signal {s} at {when}")),
        (None, None) => judge.fail(format!("ended at {when}, status unknown")),
    }
}

/// A lameduck drain report, as far as `check` reads it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct ReportFacts {
    pub(super) source: String,
    pub(super) outcome: Option<String>,
    pub(super) exit_code: Option<i64>,
    pub(super) drain_started_unix_ms: Option<f64>,
    pub(super) after_flip_requests: Option<u64>,
    pub(super) stragglers: usize,
}

impl ReportFacts {
    pub(super) fn parse(text: &str, source: &str) -> Option<ReportFacts> {
        let value: serde_json::Value = serde_json::from_str(text.trim()).ok().or_else(|| {
            text.lines()
                .rev()
                .filter(|l| l.contains("\"timeline\""))
                .find_map(|l| serde_json::from_str(l.trim()).ok())
        })?;
        let timeline = value.get("timeline")?.as_array()?;
        let drain_started_unix_ms = timeline
            .iter()
            .find(|e| e.get("event").and_then(|v| v.as_str()) == Some("drain_started"))
            .and_then(|e| e.get("unix_ms"))
            .and_then(serde_json::Value::as_f64);
        let after_flip = value.get("after_flip");
        let count = |k: &str| {
            after_flip
                .and_then(|a| a.get(k))
                .and_then(serde_json::Value::as_u64)
        };
        let after_flip_requests = match (
            count("requests_on_new_connections"),
            count("requests_on_reused_connections"),
        ) {
            (Some(a), Some(b)) => Some(a + b),
            _ => None,
        };
        Some(ReportFacts {
            source: source.to_owned(),
            outcome: value
                .get("outcome")
                .and_then(|v| v.as_str())
                .map(str::to_owned),
            exit_code: value.get("exit_code").and_then(serde_json::Value::as_i64),
            drain_started_unix_ms,
            after_flip_requests,
            stragglers: value
                .get("stragglers")
                .and_then(|v| v.as_array())
                .map_or(0, Vec::len),
        })
    }
}

pub(super) fn report(o: &Observed) -> Contract {
    const NAME: &str = "report";
    const TITLE: &str = "the drain report agrees with what the client saw";
    let judge = Judge::new(NAME, TITLE);
    let Some(r) = &o.report else {
        return judge.not_measured(
            "no lameduck drain report (on stderr or --report-file): not a lameduck service",
        );
    };
    let Some(t0) = o.t0 else {
        return judge.not_measured("the service never started");
    };
    let evidence = vec![format!(
        "report from {}: outcome {}, exit code {}, {} stragglers",
        r.source,
        r.outcome.as_deref().unwrap_or("?"),
        r.exit_code
            .map_or_else(|| "?".to_owned(), |c| c.to_string()),
        r.stragglers
    )];
    let mut f = Findings {
        evidence,
        disagree: Vec::new(),
        partial: Vec::new(),
    };
    f.exit_code(o, r);
    f.drain_start(o, r, t0);
    f.lost_requests(o, r);
    f.after_flip(o, r);
    let Findings {
        mut evidence,
        disagree,
        partial,
    } = f;
    evidence.extend(disagree.iter().cloned());
    evidence.extend(partial.iter().cloned());
    if !disagree.is_empty() {
        judge.fail(disagree.join("; ")).with(evidence)
    } else if !partial.is_empty() {
        judge.warn(partial.join("; ")).with(evidence)
    } else {
        judge
            .pass("exit code, drain start, outcome and after-flip counts agree with the client")
            .with(evidence)
    }
}

/// What the report contract found: evidence, disagreements (fail) and partial ones (warn).
struct Findings {
    evidence: Vec<String>,
    disagree: Vec<String>,
    partial: Vec<String>,
}

impl Findings {
    /// The report's exit code against the process's.
    fn exit_code(&mut self, o: &Observed, r: &ReportFacts) {
        if let (Some(code), Some(exit)) = (r.exit_code, o.exit) {
            if let Some(seen) = exit.code {
                if i64::from(seen) != code {
                    self.disagree.push(format!(
                        "the report says exit code {code}, the process exited {seen}"
                    ));
                }
            }
        }
    }

    /// The report's drain start: between the stop and shortly after the signal.
    fn drain_start(&mut self, o: &Observed, r: &ReportFacts, t0: f64) {
        match r.drain_started_unix_ms {
            Some(started) => {
                self.evidence
                    .push(format!("drain_started at {}", at(started, t0)));
                let latest = o.signal_at.unwrap_or(t0) + 2000.0;
                if started < t0 - 50.0 || started > latest {
                    self.disagree.push(format!(
                        "drain_started at {}, but the stop began at t+0 and the signal went at {}",
                        at(started, t0),
                        o.signal_at.map_or_else(|| "?".to_owned(), |s| at(s, t0))
                    ));
                }
            }
            None => self
                .disagree
                .push("the report has no drain_started event".to_owned()),
        }
    }

    /// The report's outcome and stragglers against the requests the client lost.
    fn lost_requests(&mut self, o: &Observed, r: &ReportFacts) {
        let lost = o.records.iter().filter(|r| lost(r)).count();
        let clean = r.outcome.as_deref() == Some("clean");
        if clean && lost > 0 {
            self.disagree.push(format!(
                "the report says clean, the client lost {lost} requests"
            ));
        } else if !clean && lost == 0 && r.stragglers > 0 {
            self.partial.push(format!(
                "the report names {} stragglers, the client lost none (background work?)",
                r.stragglers
            ));
        }
    }

    /// Requests the client sent after the drain started must all be in the report's count of
    /// arrivals after the flip (it may count more: ones sent a moment before it arrived after).
    fn after_flip(&mut self, o: &Observed, r: &ReportFacts) {
        let (Some(server), Some(started)) = (r.after_flip_requests, r.drain_started_unix_ms) else {
            return;
        };
        // The report's times are whole milliseconds.
        let client_after = o
            .records
            .iter()
            .filter(|r| r.status.is_some() && r.start_unix_ms.is_some_and(|s| s >= started + 2.0))
            .count() as u64;
        self.evidence.push(format!(
            "after the flip: the report counts {server} requests arrived, the client got \
             {client_after} answers to requests sent after drain_started"
        ));
        if client_after > server {
            self.disagree.push(format!(
                "the client got {client_after} answers to requests sent after the drain started, \
                 the report counts only {server} arrivals"
            ));
        }
    }
}
