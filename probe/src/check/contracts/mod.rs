//! The judge: one function per contract, each from what was observed, each with its evidence.
//!
//! Times in evidence are `t+N ms` from the stop (the moment a Pod deletion would start the
//! `preStop` hook, or send the stop signal when there is none); `t-N ms` before it.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::config::ConnectionMode;
use crate::record::{Failure, Outcome, Record};

mod connections;
mod exit;
mod lifecycle;
mod signal;

pub(super) use connections::{in_flight, keepalive_close, listener_open};
pub(super) use exit::{exit, report, ReportFacts};
pub(super) use lifecycle::{liveness, readiness, startup};
pub(super) use signal::{prestop, stop_signal};

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
    /// Its name: `startup`, `readiness`, `liveness`, `prestop` (with an httpGet or exec
    /// hook), `stop_signal`, `listener_open`,
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
