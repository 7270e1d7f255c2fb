//! `lameduck-probe correlate`: the probe's records joined with the services' drain reports
//! and, optionally, events only the platform knows, into one diagnosis per instance and a
//! class for every failure.
//!
//! # Joining
//!
//! Everything is put on one clock, wall-clock milliseconds since the Unix epoch: a record's
//! `start_unix_ms` (written by the probe), a report event's `unix_ms`, an external event's
//! `unix_ms`. Records belong to the instance named by their `x-instance` answer. A report
//! belongs to the instance named on the command line (`--report web-1=a.json`), or else to its
//! `pod.name` (`POD_NAME`), or else to its file name without extension: name the service's
//! `x-instance` the same way (the examples use the Pod name) and the join is exact.
//!
//! Reports are read as JSON without depending on `lameduck`: only `timeline` (events with
//! `event`, `at_ms`, `unix_ms`, `reason`, `name`, `detail`), `pod.name`, `outcome` and
//! `exit_code` are used; unknown fields and event names are kept as they are. A file holding
//! several JSON lines (a captured stderr) uses the last line that has a `timeline`.
//!
//! Times must be plausible: finite milliseconds since the epoch up to [`MAX_UNIX_MS`], offsets
//! inside a run up to [`MAX_RUN_MS`]; anything else is refused with the file and line before
//! anything is drawn. Names are printed with their control characters escaped
//! ([`printable`]).
//!
//! External events (`--events FILE`) are JSON lines `{"unix_ms": .., "instance": "..",
//! "event": ".."}` for what no report can know: the Pod's deletion (`deleted`), its endpoint
//! leaving the Service (`endpoint_removed`), a proxy reloading its upstreams (`proxy_updated`),
//! a signal seen from outside (`signal`), the process exit (`exit`). Names are matched by
//! what they contain (`delet`, `endpoint`, `proxy`, `signal`/`sig`, `exit`); any other name is
//! listed under its own name.
//!
//! # Failure classes
//!
//! Each failed request gets one class, checked in this order:
//!
//! 1. **exit timeout**: cut (broken before or during the response) within
//!    [`CUT_TOLERANCE_MS`] of an instance's quiesce deadline or exit: the drain ran out of time.
//! 2. **routing switch**: refused, reset or closed before any answer on a *new* connection,
//!    after some instance stopped accepting: traffic was still routed to an instance that no
//!    longer accepted. Attributed to the instance that stopped accepting last before it.
//! 3. **processing**: a 5xx answer, or a body or connection cut while the request was in
//!    flight on a reused connection: the service failed the request it had.
//! 4. **unknown**: the rest (a 4xx, a connect failure with no instance stopping, ...).

use std::fmt::{self, Write as _};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::record::{Outcome, Record};

mod args;
mod classify;
mod diagnosis;
mod input;
mod table;
#[cfg(test)]
mod tests;

pub(crate) use args::parse_correlate;
pub use args::{correlate_usage, CorrelateArgs};
use classify::Landmarks;
use diagnosis::diagnosis_rows;
pub use input::{
    parse_events, parse_records, ExternalEvent, ReportView, TimedEvent, MAX_RUN_MS, MAX_UNIX_MS,
};

/// How close to a deadline or exit a cut must be to count as an exit timeout, in ms.
pub const CUT_TOLERANCE_MS: f64 = 250.0;

/// A file `correlate` could not use, with what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorrelateError {
    message: String,
}

impl CorrelateError {
    /// The message may quote the input (a serde error names an unknown value): it is printed
    /// with its control characters escaped.
    fn new(message: String) -> Self {
        CorrelateError {
            message: printable(&message).into_owned(),
        }
    }
}

/// `text` with its control characters (C0, DEL, C1) and bidirectional overrides written as
/// `\xHH` / `\u{HHHH}`, so a hostile name cannot drive the terminal (OSC, CSI) or break a
/// line. Borrowed when there is nothing to escape.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    fn hostile(c: char) -> bool {
        c.is_control() || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
    }
    if !text.chars().any(hostile) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            c if hostile(c) && (c as u32) < 0x100 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if hostile(c) => {
                let _ = write!(out, "\\u{{{:04x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

impl fmt::Display for CorrelateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CorrelateError {}

/// What a failure is put down to; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureClass {
    /// Refused, reset or closed on a new connection after an instance stopped accepting.
    RoutingSwitch,
    /// A 5xx, or a request cut while in flight on a reused connection.
    Processing,
    /// Cut at an instance's quiesce deadline or exit.
    ExitTimeout,
    /// None of the above.
    Unknown,
}

impl FailureClass {
    /// The class as the table prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureClass::RoutingSwitch => "routing switch",
            FailureClass::Processing => "processing",
            FailureClass::ExitTimeout => "exit timeout",
            FailureClass::Unknown => "unknown",
        }
    }
}

impl fmt::Display for FailureClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One failed request with its class.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassifiedFailure {
    /// The request id.
    pub id: String,
    /// When it failed, ms since the Unix epoch.
    pub unix_ms: f64,
    /// The class.
    pub class: FailureClass,
    /// The instance it is put down to: the one that answered, or the one whose event explains
    /// it; `None` when nothing does.
    pub instance: Option<String>,
    /// Why this class, in words.
    pub why: String,
    /// The record's error.
    pub error: String,
}

/// One row of an instance's diagnosis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiagnosisRow {
    /// What the row is about (`deletion`, `drain started`, `endpoint change`, ...).
    pub what: String,
    /// When, ms since the Unix epoch; `None` when no input knows.
    pub unix_ms: Option<f64>,
    /// Where it came from and any detail (`report: prestop`, `events`, `probe: <id>`).
    pub note: String,
}

/// One instance: its report, the probe's view of it and the diagnosis rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceDiagnosis {
    /// The instance name.
    pub instance: String,
    /// Its report, when one was given.
    pub report: Option<ReportView>,
    /// External events about it, in time order.
    pub external: Vec<TimedEvent>,
    /// The rows, in a fixed order: deletion, signal, drain started, readiness flipped,
    /// endpoint change, proxy update, stopped accepting, last draining answer, last answer,
    /// deadline, exit; then any other external event.
    pub rows: Vec<DiagnosisRow>,
    /// Requests it answered.
    pub answered: u64,
    /// Of those, while draining.
    pub draining: u64,
    /// Failures put down to it.
    pub failed: u64,
}

/// The whole diagnosis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Correlation {
    /// Per instance: those with a report first (in `--report` order), then those only seen in
    /// records or events.
    pub instances: Vec<InstanceDiagnosis>,
    /// Every failed request, in time order.
    pub failures: Vec<ClassifiedFailure>,
    /// The earliest time in any input, ms since the Unix epoch: the table's offsets count from
    /// it.
    pub origin_unix_ms: f64,
    /// The proxy label the records carry, if any.
    pub proxy_label: Option<String>,
}

fn category(event: &str) -> Option<&'static str> {
    let e = event.to_ascii_lowercase();
    if e.contains("delet") {
        Some("deletion")
    } else if e.contains("endpoint") {
        Some("endpoint change")
    } else if e.contains("proxy") {
        Some("proxy update")
    } else if e.contains("exit") {
        Some("exit")
    } else if e.contains("signal") || e.starts_with("sig") {
        Some("signal")
    } else {
        None
    }
}

fn end_unix(r: &Record) -> f64 {
    r.start_unix_ms.unwrap_or(0.0) + (r.end_ms.unwrap_or(r.start_ms) - r.start_ms)
}

/// Joins records, reports and external events.
///
/// # Examples
///
/// ```
/// use lameduck_probe::correlate::{correlate, FailureClass, ReportView};
///
/// let report = ReportView::parse(
///     r#"{"timeline":[{"event":"drain_started","at_ms":0,"unix_ms":1000},
///                     {"event":"stopped_accepting","at_ms":500,"unix_ms":1500}],
///         "pod":{"name":"web-1"},"exit_code":0}"#,
///     None,
///     "a.json",
/// )
/// .unwrap();
/// let refused = r#"{"id":"r1","kind":"short","label":"default","mode":"fresh","start_ms":600.0,
///     "end_ms":601.0,"status":null,"outcome":"failed","failure":"connect",
///     "error":"connect: Connection refused","reused":false,"conn":null,"bytes":0,
///     "start_unix_ms":1600.0}"#;
/// let records = vec![serde_json::from_str(refused).unwrap()];
/// let c = correlate(&records, &[report], &[]);
/// assert_eq!(c.failures[0].class, FailureClass::RoutingSwitch);
/// assert_eq!(c.failures[0].instance.as_deref(), Some("web-1"));
/// assert!(c.table().contains("stopped accepting"));
/// ```
pub fn correlate(
    records: &[Record],
    reports: &[ReportView],
    external: &[ExternalEvent],
) -> Correlation {
    let landmarks = Landmarks::new(reports, external);
    let mut failures: Vec<ClassifiedFailure> = records
        .iter()
        .filter(|r| r.outcome == Outcome::Failed)
        .map(|r| landmarks.classify(r))
        .collect();
    failures.sort_by(|a, b| a.unix_ms.total_cmp(&b.unix_ms));
    let instances = instance_names(records, reports, external)
        .iter()
        .map(|name| diagnose(name, records, reports, external, &failures))
        .collect();
    Correlation {
        instances,
        failures,
        origin_unix_ms: origin_unix_ms(records, reports, external),
        proxy_label: records.iter().find_map(|r| r.proxy_label.clone()),
    }
}

/// Instances with a report first (in `--report` order), then those only seen in records or
/// events, each once.
fn instance_names(
    records: &[Record],
    reports: &[ReportView],
    external: &[ExternalEvent],
) -> Vec<String> {
    let mut names: Vec<String> = reports.iter().map(|r| r.instance.clone()).collect();
    let seen = records
        .iter()
        .filter_map(|r| r.instance.as_deref())
        .chain(external.iter().map(|e| e.instance.as_str()));
    for n in seen {
        if !names.iter().any(|x| x == n) {
            names.push(n.to_owned());
        }
    }
    names
}

/// One instance's diagnosis: its report, its external events in time order, what it
/// answered and the failures put down to it.
fn diagnose(
    name: &str,
    records: &[Record],
    reports: &[ReportView],
    external: &[ExternalEvent],
    failures: &[ClassifiedFailure],
) -> InstanceDiagnosis {
    let report = reports.iter().find(|r| r.instance == name).cloned();
    let mut ext: Vec<TimedEvent> = external
        .iter()
        .filter(|e| e.instance == name)
        .map(|e| TimedEvent {
            unix_ms: e.unix_ms,
            event: e.event.clone(),
            detail: None,
            external: true,
        })
        .collect();
    ext.sort_by(|a, b| a.unix_ms.total_cmp(&b.unix_ms));
    let mine: Vec<&Record> = records
        .iter()
        .filter(|r| r.instance.as_deref() == Some(name))
        .collect();
    let rows = diagnosis_rows(report.as_ref(), &ext, &mine);
    InstanceDiagnosis {
        instance: name.to_owned(),
        answered: mine.len() as u64,
        draining: mine.iter().filter(|r| r.served_by_draining()).count() as u64,
        failed: failures
            .iter()
            .filter(|f| f.instance.as_deref() == Some(name))
            .count() as u64,
        report,
        external: ext,
        rows,
    }
}

/// The earliest time in any input, or 0 when there is none.
fn origin_unix_ms(records: &[Record], reports: &[ReportView], external: &[ExternalEvent]) -> f64 {
    let earliest = records
        .iter()
        .filter_map(|r| r.start_unix_ms)
        .chain(
            reports
                .iter()
                .flat_map(|r| r.timeline.iter().map(|e| e.unix_ms)),
        )
        .chain(external.iter().map(|e| e.unix_ms))
        .fold(f64::INFINITY, f64::min);
    if earliest.is_finite() {
        earliest
    } else {
        0.0
    }
}

/// Reads the inputs named by `args` and correlates them.
///
/// # Errors
///
/// A file that cannot be read or is not what it should be; the message names it.
pub fn run_correlate(args: &CorrelateArgs) -> Result<(Correlation, Vec<Record>), CorrelateError> {
    let read = |p: &Path| {
        std::fs::read_to_string(p)
            .map_err(|e| CorrelateError::new(format!("cannot read {}: {e}", p.display())))
    };
    let records = parse_records(&read(&args.probe)?, &args.probe.display().to_string())?;
    let mut reports = Vec::new();
    for (name, path) in &args.reports {
        let report = ReportView::parse(&read(path)?, name.as_deref(), &path.display().to_string())?;
        if reports
            .iter()
            .any(|r: &ReportView| r.instance == report.instance)
        {
            return Err(CorrelateError::new(format!(
                "two reports belong to instance {:?}; name them with --report NAME=FILE",
                report.instance
            )));
        }
        reports.push(report);
    }
    let external = match &args.events {
        Some(path) => parse_events(&read(path)?, &path.display().to_string())?,
        None => Vec::new(),
    };
    Ok((correlate(&records, &reports, &external), records))
}
