//! The end: the exit status, and the drain report against what the client saw.

use super::{at, lost, Contract, Judge};
use crate::check::Observed;

pub(crate) fn exit(o: &Observed) -> Contract {
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
                ", {:.0}% of the {:.1} s {}",
                (e - t0) / o.grace_ms * 100.0,
                o.grace_ms / 1000.0,
                o.kill_name
            )
        })
        .unwrap_or_default();
    if exit.killed_at_grace {
        return judge.fail(format!(
            "still running at the {} ({:.1} s): SIGKILLed at {}",
            o.kill_name,
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
pub(crate) struct ReportFacts {
    pub(crate) source: String,
    pub(crate) outcome: Option<String>,
    pub(crate) exit_code: Option<i64>,
    pub(crate) drain_started_unix_ms: Option<f64>,
    /// What started the drain: `prestop`, `api`, `sigterm`…
    pub(crate) trigger: Option<String>,
    pub(crate) after_flip_requests: Option<u64>,
    pub(crate) stragglers: usize,
    /// The drain waited to `max` because the process was young (`too_few_slots`): `max`
    /// in ms after the trigger, and how long the process had served before it.
    pub(crate) young_wait: Option<(u64, u64)>,
}

impl ReportFacts {
    pub(crate) fn parse(text: &str, source: &str) -> Option<ReportFacts> {
        let value: serde_json::Value = serde_json::from_str(text.trim()).ok().or_else(|| {
            text.lines()
                .rev()
                .filter(|l| l.contains("\"timeline\""))
                .find_map(|l| serde_json::from_str(l.trim()).ok())
        })?;
        let timeline = value.get("timeline")?.as_array()?;
        let drain_started = timeline
            .iter()
            .find(|e| e.get("event").and_then(|v| v.as_str()) == Some("drain_started"));
        let drain_started_unix_ms = drain_started
            .and_then(|e| e.get("unix_ms"))
            .and_then(serde_json::Value::as_f64);
        let trigger = [Some(&value), drain_started]
            .into_iter()
            .flatten()
            .find_map(|v| v.get("trigger").and_then(|t| t.as_str()))
            .map(str::to_owned);
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
        let evidence = value.get("propagation").and_then(|p| p.get("evidence"));
        let field = |k: &str| evidence.and_then(|e| e.get(k));
        let young_wait = (field("kind").and_then(|v| v.as_str()) == Some("max")
            && field("weak").and_then(|v| v.as_str()) == Some("too_few_slots"))
        .then(|| {
            let max = value
                .get("propagation")
                .and_then(|p| p.get("max_ms"))
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0);
            let num = |k: &str| field(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
            (max, num("slots_observed") * num("slot_ms"))
        });
        Some(ReportFacts {
            source: source.to_owned(),
            outcome: value
                .get("outcome")
                .and_then(|v| v.as_str())
                .map(str::to_owned),
            exit_code: value.get("exit_code").and_then(serde_json::Value::as_i64),
            drain_started_unix_ms,
            trigger,
            after_flip_requests,
            stragglers: value
                .get("stragglers")
                .and_then(|v| v.as_array())
                .map_or(0, Vec::len),
            young_wait,
        })
    }

    /// The note for a drain that waited to `max` because the process was young.
    pub(crate) fn young_note(&self) -> Option<String> {
        let (max, served) = self.young_wait?;
        Some(format!(
            "the drain waited to max ({max} ms after the trigger) because the process had \
             observed only {:.1} s of traffic before it: lameduck judges its traffic by evidence only after 15 s of serving \
             (too_few_slots), so a younger Pod waits to max by design. A Pod that served longer \
             commits on evidence: run with --warmup 16s (the default) to see that drain",
            served as f64 / 1000.0
        ))
    }
}

/// The `report` contract, where a lameduck drain report is expected (one was found, or
/// [`Observed::report_expected`] says why one should be); `None` elsewhere: a service that
/// does not use lameduck writes none, and that is no fault.
pub(crate) fn report(o: &Observed) -> Option<Contract> {
    const NAME: &str = "report";
    const TITLE: &str = "the drain report agrees with what the client saw";
    let judge = Judge::new(NAME, TITLE);
    let Some(r) = &o.report else {
        let why = o.report_expected.as_deref()?;
        if o.t0.is_none() {
            return Some(judge.not_measured("the service was never stopped"));
        }
        if let Some(unread) = &o.report_unread {
            return Some(judge.fail(format!("no drain report from --report-file: {unread}")));
        }
        return Some(judge.fail(format!(
            "no lameduck drain report on stderr, though one is expected: {why}"
        )));
    };
    let Some(t0) = o.t0 else {
        return Some(judge.not_measured("the service never started"));
    };
    let mut evidence = vec![format!(
        "report from {}: outcome {}, exit code {}, {} stragglers",
        r.source,
        r.outcome.as_deref().unwrap_or("?"),
        r.exit_code
            .map_or_else(|| "?".to_owned(), |c| c.to_string()),
        r.stragglers
    )];
    evidence.extend(r.young_note());
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
    Some(if !disagree.is_empty() {
        judge.fail(disagree.join("; ")).with(evidence)
    } else if !partial.is_empty() {
        judge.warn(partial.join("; ")).with(evidence)
    } else {
        judge
            .pass("exit code, drain start, outcome and after-flip counts agree with the client")
            .with(evidence)
    })
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
