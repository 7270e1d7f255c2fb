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

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};

use clap::Parser;
use serde::{Deserialize, Serialize};

use crate::cli::{clap_outcome, CliError, Command};
use crate::record::{Failure, Outcome, Record};

/// How many failures the table lists one by one; the counts per class cover them all.
const TABLE_FAILURES: usize = 200;

/// How close to a deadline or exit a cut must be to count as an exit timeout, in ms.
pub const CUT_TOLERANCE_MS: f64 = 250.0;

/// The `correlate` command's inputs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CorrelateArgs {
    /// `--probe FILE`: the probe's JSON lines.
    pub probe: PathBuf,
    /// `--report [NAME=]FILE`, in order; `None` takes the name from the report.
    pub reports: Vec<(Option<String>, PathBuf)>,
    /// `--events FILE`: external events, JSON lines.
    pub events: Option<PathBuf>,
    /// `--svg FILE`: where to draw the picture.
    pub svg: Option<PathBuf>,
}

#[derive(Debug, Parser)]
#[command(
    name = "lameduck-probe correlate",
    about = "Join the probe's records with drain reports (and external events): print a diagnosis\nper instance and a class for every failure, optionally draw it as SVG.",
    help_template = "{about}\n\nUSAGE:\n    {usage}\n\n{all-args}{after-help}",
    after_help = "Instances: a report belongs to NAME when given, else to its pod.name, else to its file\nname; records belong to their x-instance answer.\nEvents file lines: {\"unix_ms\": 1764556801203, \"instance\": \"web-1\", \"event\": \"endpoint_removed\"}.\nExit status: 0 printed, 2 bad flags, 3 a file unreadable or not what it should be.\n"
)]
struct CorrelateFlags {
    /// The probe's records (lameduck-probe --out FILE)
    #[arg(long, value_name = "FILE")]
    probe: PathBuf,
    /// A drain report, named after its instance or not (once per instance)
    #[arg(long, value_name = "[NAME=]FILE", required = true)]
    report: Vec<String>,
    /// External events as JSON lines {unix_ms, instance, event}
    #[arg(long, value_name = "FILE")]
    events: Option<PathBuf>,
    /// Also draw the rollout as an SVG picture
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
}

/// The `correlate --help` text.
pub fn correlate_usage() -> String {
    use clap::CommandFactory;
    CorrelateFlags::command().render_help().to_string()
}

pub(crate) fn parse_correlate(args: &[String]) -> Result<Command, CliError> {
    let argv = std::iter::once("correlate".to_owned()).chain(args.iter().cloned());
    let flags = match CorrelateFlags::try_parse_from(argv) {
        Ok(flags) => flags,
        Err(e) => {
            return match clap_outcome(e)? {
                Command::Help => Ok(Command::CorrelateHelp),
                other => Ok(other),
            }
        }
    };
    let reports = flags
        .report
        .iter()
        .map(|r| match r.split_once('=') {
            Some((name, path)) if !name.contains('/') && !name.is_empty() => {
                (Some(name.to_owned()), PathBuf::from(path))
            }
            _ => (None, PathBuf::from(r)),
        })
        .collect();
    Ok(Command::Correlate(Box::new(CorrelateArgs {
        probe: flags.probe,
        reports,
        events: flags.events,
        svg: flags.svg,
    })))
}

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

/// The latest wall-clock time accepted, in ms since the Unix epoch (the year 2286): anything
/// later is a broken clock or a hostile file, and would make every scale meaningless.
pub const MAX_UNIX_MS: f64 = 1e13;

/// The longest offset accepted inside one probe run (`start_ms`, `end_ms`), in ms: 115 days.
pub const MAX_RUN_MS: f64 = 1e10;

/// `Err` with what is wrong when `value` is not a time in `0..=max` ms.
fn plausible(field: &str, value: f64, max: f64) -> Result<(), String> {
    if value.is_finite() && (0.0..=max).contains(&value) {
        Ok(())
    } else {
        Err(format!(
            "{field} {value:e} is not a plausible time (finite milliseconds, 0 to {max:e})"
        ))
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

/// One event on the shared clock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimedEvent {
    /// Wall-clock time, ms since the Unix epoch.
    pub unix_ms: f64,
    /// The event's name as written (`stopped_accepting`, `endpoint_removed`, ...).
    pub event: String,
    /// Reason, name or detail the report gave, joined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// `true` for an event from `--events`, `false` for one from a drain report.
    pub external: bool,
}

/// A drain report as `correlate` reads it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReportView {
    /// The instance it belongs to.
    pub instance: String,
    /// Where it was read from.
    pub source: String,
    /// Its outcome (`clean`, `deadline_exceeded`, ...), when given.
    pub outcome: Option<String>,
    /// Its exit code, when given.
    pub exit_code: Option<i64>,
    /// Its timeline on the shared clock.
    pub timeline: Vec<TimedEvent>,
}

#[derive(Deserialize)]
struct ReportMirror {
    timeline: Vec<EventMirror>,
    #[serde(default)]
    pod: PodMirror,
    #[serde(default)]
    outcome: Option<String>,
    #[serde(default)]
    exit_code: Option<i64>,
}

#[derive(Deserialize, Default)]
struct PodMirror {
    #[serde(default)]
    name: Option<String>,
}

#[derive(Deserialize)]
struct EventMirror {
    event: String,
    unix_ms: u64,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    trigger: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    detail: Option<String>,
}

#[derive(Deserialize)]
struct ExternalMirror {
    unix_ms: f64,
    instance: String,
    event: String,
}

impl ReportView {
    /// Reads a report from JSON text: one object, or JSON lines of which the last with a
    /// `timeline` is used. `name` overrides the instance name; `source` names the file.
    ///
    /// # Errors
    ///
    /// No JSON object with a `timeline` in the text.
    pub fn parse(text: &str, name: Option<&str>, source: &str) -> Result<Self, CorrelateError> {
        let mirror: ReportMirror = match serde_json::from_str(text) {
            Ok(m) => m,
            Err(whole) => text
                .lines()
                .rev()
                .filter(|l| l.contains("\"timeline\""))
                .find_map(|l| serde_json::from_str(l.trim()).ok())
                .ok_or_else(|| {
                    CorrelateError::new(format!(
                        "{source}: not a drain report ({whole}); give the JSON the service wrote (its report file or stderr line)"
                    ))
                })?,
        };
        let instance = match (name, mirror.pod.name) {
            (Some(n), _) => n.to_owned(),
            (None, Some(pod)) if !pod.is_empty() => pod,
            _ => Path::new(source)
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| source.to_owned()),
        };
        for e in &mirror.timeline {
            plausible("unix_ms", e.unix_ms as f64, MAX_UNIX_MS).map_err(|why| {
                CorrelateError::new(format!("{source}: event {}: {why}", e.event))
            })?;
        }
        let timeline = mirror
            .timeline
            .into_iter()
            .map(|e| {
                let parts: Vec<String> = [e.trigger, e.reason, e.name, e.detail]
                    .into_iter()
                    .flatten()
                    .collect();
                TimedEvent {
                    unix_ms: e.unix_ms as f64,
                    event: e.event,
                    detail: (!parts.is_empty()).then(|| parts.join(", ")),
                    external: false,
                }
            })
            .collect();
        Ok(ReportView {
            instance,
            source: source.to_owned(),
            outcome: mirror.outcome,
            exit_code: mirror.exit_code,
            timeline,
        })
    }

    fn first(&self, name: &str) -> Option<&TimedEvent> {
        self.timeline.iter().find(|e| e.event == name)
    }
}

/// An event from `--events`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExternalEvent {
    /// Wall-clock time, ms since the Unix epoch.
    pub unix_ms: f64,
    /// The instance it concerns.
    pub instance: String,
    /// What happened (`deleted`, `endpoint_removed`, `proxy_updated`, `signal`, `exit`, ...).
    pub event: String,
}

/// Reads external events, one JSON object per line; blank lines are skipped.
///
/// # Errors
///
/// A line that is not `{"unix_ms": .., "instance": "..", "event": ".."}`, naming its number.
pub fn parse_events(text: &str, source: &str) -> Result<Vec<ExternalEvent>, CorrelateError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let m = serde_json::from_str::<ExternalMirror>(l).map_err(|e| {
                CorrelateError::new(format!(
                    "{source} line {}: {e}; each line must be {{\"unix_ms\": <ms>, \"instance\": \"<name>\", \"event\": \"<what>\"}}",
                    i + 1
                ))
            })?;
            plausible("unix_ms", m.unix_ms, MAX_UNIX_MS)
                .map_err(|why| CorrelateError::new(format!("{source} line {}: {why}", i + 1)))?;
            Ok(ExternalEvent {
                unix_ms: m.unix_ms,
                instance: m.instance,
                event: m.event,
            })
        })
        .collect()
}

/// Reads the probe's JSON lines.
///
/// # Errors
///
/// A line that is not a record, or records without `start_unix_ms` (written by an older
/// probe), naming the line.
pub fn parse_records(text: &str, source: &str) -> Result<Vec<Record>, CorrelateError> {
    let mut records = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let r: Record = serde_json::from_str(line).map_err(|e| {
            CorrelateError::new(format!(
                "{source} line {}: not a probe record ({e}); give the file written by lameduck-probe --out",
                i + 1
            ))
        })?;
        if r.start_unix_ms.is_none() {
            return Err(CorrelateError::new(format!(
                "{source} line {}: the record has no start_unix_ms; it was written by an older probe, run the probe again",
                i + 1
            )));
        }
        let times = [
            ("start_unix_ms", r.start_unix_ms, MAX_UNIX_MS),
            ("start_ms", Some(r.start_ms), MAX_RUN_MS),
            ("end_ms", r.end_ms, MAX_RUN_MS),
        ];
        for (field, value, max) in times {
            if let Some(v) = value {
                plausible(field, v, max).map_err(|why| {
                    CorrelateError::new(format!("{source} line {}: {why}", i + 1))
                })?;
            }
        }
        records.push(r);
    }
    Ok(records)
}

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
    let mut names: Vec<String> = reports.iter().map(|r| r.instance.clone()).collect();
    let mut add_name = |n: &str| {
        if !names.iter().any(|x| x == n) {
            names.push(n.to_owned());
        }
    };
    for r in records {
        if let Some(i) = &r.instance {
            add_name(i);
        }
    }
    for e in external {
        add_name(&e.instance);
    }

    // Deadlines and exits, for exit-timeout cuts; stops, for routing switches.
    let mut cut_points: Vec<(f64, String, &'static str)> = Vec::new();
    let mut stops: Vec<(f64, String)> = Vec::new();
    for rep in reports {
        for e in &rep.timeline {
            match e.event.as_str() {
                "deadline_exceeded" => {
                    cut_points.push((e.unix_ms, rep.instance.clone(), "quiesce deadline"))
                }
                "exit" => cut_points.push((e.unix_ms, rep.instance.clone(), "exit")),
                "stopped_accepting" => stops.push((e.unix_ms, rep.instance.clone())),
                _ => {}
            }
        }
    }
    for e in external {
        if category(&e.event) == Some("exit") {
            cut_points.push((e.unix_ms, e.instance.clone(), "exit"));
            // A process that exited has stopped accepting too: a naive server has no report.
            stops.push((e.unix_ms, e.instance.clone()));
        }
    }

    let mut failures = Vec::new();
    for r in records.iter().filter(|r| r.outcome == Outcome::Failed) {
        let at = end_unix(r);
        let error = r.error.clone().unwrap_or_default();
        let cut = matches!(r.failure, Some(Failure::Request | Failure::Body));
        let new_conn = !r.reused;
        let before_answer = matches!(r.failure, Some(Failure::Connect | Failure::Request));
        let at_cut = cut_points.iter().find(|(t, inst, _)| {
            (at - t).abs() <= CUT_TOLERANCE_MS && r.instance.as_ref().is_none_or(|i| i == inst)
        });
        let stopped_before = stops
            .iter()
            .filter(|(t, inst)| *t <= at && r.instance.as_ref().is_none_or(|i| i == inst))
            .max_by(|a, b| a.0.total_cmp(&b.0));
        let (class, instance, why) = if let (true, Some((t, inst, what))) = (cut, at_cut) {
            (
                FailureClass::ExitTimeout,
                Some(inst.clone()),
                format!("cut {:+.0} ms from {inst}'s {what}", at - t),
            )
        } else if let (true, true, Some((t, inst))) = (before_answer, new_conn, stopped_before) {
            (
                FailureClass::RoutingSwitch,
                Some(inst.clone()),
                format!(
                    "no answer on a new connection {:.0} ms after {inst} stopped accepting",
                    at - t
                ),
            )
        } else if r.status.is_some_and(|s| s >= 500) {
            (
                FailureClass::Processing,
                r.instance.clone(),
                format!("answered {}", r.status.unwrap_or_default()),
            )
        } else if cut && (r.reused || r.failure == Some(Failure::Body)) {
            (
                FailureClass::Processing,
                r.instance.clone(),
                "cut while in flight".to_owned(),
            )
        } else {
            (
                FailureClass::Unknown,
                r.instance.clone(),
                "no event explains it".to_owned(),
            )
        };
        failures.push(ClassifiedFailure {
            id: r.id.clone(),
            unix_ms: at,
            class,
            instance,
            why,
            error,
        });
    }
    failures.sort_by(|a, b| a.unix_ms.total_cmp(&b.unix_ms));

    let mut instances = Vec::new();
    for name in &names {
        let report = reports.iter().find(|r| &r.instance == name).cloned();
        let mut ext: Vec<TimedEvent> = external
            .iter()
            .filter(|e| &e.instance == name)
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
            .filter(|r| r.instance.as_deref() == Some(name.as_str()))
            .collect();
        let rows = diagnosis_rows(report.as_ref(), &ext, &mine);
        instances.push(InstanceDiagnosis {
            instance: name.clone(),
            answered: mine.len() as u64,
            draining: mine.iter().filter(|r| r.served_by_draining()).count() as u64,
            failed: failures
                .iter()
                .filter(|f| f.instance.as_deref() == Some(name.as_str()))
                .count() as u64,
            report,
            external: ext,
            rows,
        });
    }

    let origin_unix_ms = records
        .iter()
        .filter_map(|r| r.start_unix_ms)
        .chain(
            reports
                .iter()
                .flat_map(|r| r.timeline.iter().map(|e| e.unix_ms)),
        )
        .chain(external.iter().map(|e| e.unix_ms))
        .fold(f64::INFINITY, f64::min);
    Correlation {
        instances,
        failures,
        origin_unix_ms: if origin_unix_ms.is_finite() {
            origin_unix_ms
        } else {
            0.0
        },
        proxy_label: records.iter().find_map(|r| r.proxy_label.clone()),
    }
}

fn diagnosis_rows(
    report: Option<&ReportView>,
    ext: &[TimedEvent],
    mine: &[&Record],
) -> Vec<DiagnosisRow> {
    let mut rows = Vec::new();
    let from_ext = |cat: &str| ext.iter().find(|e| category(&e.event) == Some(cat));
    let push_ext = |rows: &mut Vec<DiagnosisRow>, what: &str, cat: &str| {
        rows.push(match from_ext(cat) {
            Some(e) => DiagnosisRow {
                what: what.to_owned(),
                unix_ms: Some(e.unix_ms),
                note: format!("events: {}", e.event),
            },
            None => DiagnosisRow {
                what: what.to_owned(),
                unix_ms: None,
                note: "not known (pass --events)".to_owned(),
            },
        });
    };
    let from_report = |rows: &mut Vec<DiagnosisRow>, what: &str, event: &str| {
        let row = match report {
            None => DiagnosisRow {
                what: what.to_owned(),
                unix_ms: None,
                note: "not known (no report)".to_owned(),
            },
            Some(rep) => match rep.first(event) {
                Some(e) => DiagnosisRow {
                    what: what.to_owned(),
                    unix_ms: Some(e.unix_ms),
                    note: match &e.detail {
                        Some(d) => format!("report: {d}"),
                        None => "report".to_owned(),
                    },
                },
                None => DiagnosisRow {
                    what: what.to_owned(),
                    unix_ms: None,
                    note: format!("not in the report (no {event} event)"),
                },
            },
        };
        rows.push(row);
    };
    push_ext(&mut rows, "deletion", "deletion");
    // The signal: from the report when it recorded one (or the drain was started by one),
    // else from the events.
    let signal_started = report
        .and_then(|r| r.first("drain_started"))
        .filter(|e| e.detail.as_deref().is_some_and(|d| d.starts_with("sig")));
    match (
        report.and_then(|r| r.first("signal_received")),
        signal_started,
    ) {
        (Some(e), _) => rows.push(DiagnosisRow {
            what: "signal".to_owned(),
            unix_ms: Some(e.unix_ms),
            note: format!(
                "report: {}",
                e.detail.as_deref().unwrap_or("signal_received")
            ),
        }),
        (None, Some(e)) => rows.push(DiagnosisRow {
            what: "signal".to_owned(),
            unix_ms: Some(e.unix_ms),
            note: format!(
                "report: {} started the drain",
                e.detail.as_deref().unwrap_or_default()
            ),
        }),
        (None, None) => push_ext(&mut rows, "signal", "signal"),
    }
    from_report(&mut rows, "drain started", "drain_started");
    from_report(&mut rows, "readiness flipped", "readiness_flipped");
    push_ext(&mut rows, "endpoint change", "endpoint change");
    push_ext(&mut rows, "proxy update", "proxy update");
    from_report(&mut rows, "stopped accepting", "stopped_accepting");
    let draining = mine.iter().filter(|r| r.served_by_draining());
    if let Some(last) = draining.max_by(|a, b| a.start_ms.total_cmp(&b.start_ms)) {
        rows.push(DiagnosisRow {
            what: "last draining answer".to_owned(),
            unix_ms: last.start_unix_ms,
            note: format!("probe: {} (request start)", last.id),
        });
    }
    if let Some(last) = mine.iter().max_by(|a, b| a.start_ms.total_cmp(&b.start_ms)) {
        rows.push(DiagnosisRow {
            what: "last answer".to_owned(),
            unix_ms: last.start_unix_ms,
            note: format!("probe: {} (request start)", last.id),
        });
    }
    if let Some(e) = report.and_then(|r| r.first("deadline_exceeded")) {
        rows.push(DiagnosisRow {
            what: "quiesce deadline".to_owned(),
            unix_ms: Some(e.unix_ms),
            note: "report: work was cut".to_owned(),
        });
    }
    // The exit: the report's exit event, else the events file, else the report's end.
    let code = report
        .and_then(|r| r.exit_code)
        .map(|c| format!(", exit code {c}"))
        .unwrap_or_default();
    if let Some(e) = report.and_then(|r| r.first("exit")) {
        rows.push(DiagnosisRow {
            what: "exit".to_owned(),
            unix_ms: Some(e.unix_ms),
            note: format!("report{code}"),
        });
    } else if let Some(e) = from_ext("exit") {
        rows.push(DiagnosisRow {
            what: "exit".to_owned(),
            unix_ms: Some(e.unix_ms),
            note: format!("events: {}{code}", e.event),
        });
    } else if let Some(e) = report.and_then(|r| r.first("done")) {
        rows.push(DiagnosisRow {
            what: "exit".to_owned(),
            unix_ms: Some(e.unix_ms),
            note: format!("report: drain done{code} (the exit itself is not recorded)"),
        });
    } else {
        rows.push(DiagnosisRow {
            what: "exit".to_owned(),
            unix_ms: None,
            note: "not known".to_owned(),
        });
    }
    for e in ext.iter().filter(|e| category(&e.event).is_none()) {
        rows.push(DiagnosisRow {
            what: e.event.clone(),
            unix_ms: Some(e.unix_ms),
            note: "events".to_owned(),
        });
    }
    rows
}

impl Correlation {
    /// The diagnosis as plain text: per instance its rows with offsets in ms from
    /// [`origin_unix_ms`](Self::origin_unix_ms), then every failure with its class.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "correlate: {} instance(s), {} failure(s); offsets in ms from {} (unix ms){}",
            self.instances.len(),
            self.failures.len(),
            self.origin_unix_ms as u64,
            self.proxy_label
                .as_deref()
                .map(|p| format!(", through {}", printable(p)))
                .unwrap_or_default()
        );
        let off = |t: f64| format!("{:>9.0}", t - self.origin_unix_ms);
        for inst in &self.instances {
            let _ = writeln!(out);
            let source = inst
                .report
                .as_ref()
                .map(|r| format!("report {}", printable(&r.source)))
                .unwrap_or_else(|| "no report".to_owned());
            let _ = writeln!(
                out,
                "{} ({source}): answered {}, {} while draining, {} failure(s) put down to it",
                printable(&inst.instance),
                inst.answered,
                inst.draining,
                inst.failed
            );
            for row in &inst.rows {
                let at = row
                    .unix_ms
                    .map(off)
                    .unwrap_or_else(|| format!("{:>9}", "-"));
                let _ = writeln!(
                    out,
                    "  {:<22}{at}  {}",
                    printable(&row.what),
                    printable(&row.note)
                );
            }
        }
        let _ = writeln!(out);
        if self.failures.is_empty() {
            let _ = writeln!(out, "failures: none");
            return out;
        }
        let mut by_class: BTreeMap<FailureClass, u64> = BTreeMap::new();
        for f in &self.failures {
            *by_class.entry(f.class).or_default() += 1;
        }
        let counts: Vec<String> = by_class.iter().map(|(c, n)| format!("{n} {c}")).collect();
        let _ = writeln!(out, "failures: {}", counts.join(", "));
        for f in self.failures.iter().take(TABLE_FAILURES) {
            let _ = writeln!(
                out,
                "  {} {:<15} {:<24} {} ({}): {}",
                off(f.unix_ms),
                f.class.as_str(),
                printable(&f.id),
                printable(f.instance.as_deref().unwrap_or("-")),
                printable(&f.why),
                printable(&f.error)
            );
        }
        if self.failures.len() > TABLE_FAILURES {
            let _ = writeln!(
                out,
                "  ... {} more (the library's `Correlation::failures` has them all)",
                self.failures.len() - TABLE_FAILURES
            );
        }
        out
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

#[cfg(test)]
mod tests {
    use super::*;

    fn record(json: &str) -> Record {
        serde_json::from_str(json).unwrap()
    }

    fn failed(
        id: &str,
        failure: &str,
        reused: bool,
        status: &str,
        instance: &str,
        at: f64,
    ) -> Record {
        let instance = if instance.is_empty() {
            String::new()
        } else {
            format!(r#","instance":"{instance}""#)
        };
        record(&format!(
            r#"{{"id":"{id}","kind":"slow","label":"l","mode":"keepalive","start_ms":0.0,"end_ms":10.0,
               "status":{status},"outcome":"failed","failure":"{failure}","error":"e","reused":{reused},
               "conn":1,"bytes":0,"start_unix_ms":{}{instance}}}"#,
            at - 10.0
        ))
    }

    fn report() -> ReportView {
        ReportView::parse(
            r#"{"timeline":[{"event":"drain_started","at_ms":0,"unix_ms":1000},
                {"event":"stopped_accepting","at_ms":1000,"unix_ms":2000},
                {"event":"deadline_exceeded","at_ms":5000,"unix_ms":6000},
                {"event":"done","at_ms":5100,"unix_ms":6100}],
                "exit_code":1,"outcome":"deadline_exceeded"}"#,
            Some("web-1"),
            "a.json",
        )
        .unwrap()
    }

    #[test]
    fn each_failure_gets_the_class_its_cause_says() {
        let records = vec![
            // Body cut 50 ms after the quiesce deadline: exit timeout.
            failed("cut", "body", true, "200", "web-1", 6050.0),
            // Reset on a new connection after stopped_accepting: routing switch.
            failed("switch", "request", false, "null", "", 2500.0),
            // Reset on a new connection before anything stopped: unknown.
            failed("early", "connect", false, "null", "", 1500.0),
            // 5xx: processing.
            failed("5xx", "status", true, "503", "web-1", 3000.0),
            // Reused connection cut mid-flight, far from the deadline: processing.
            failed("inflight", "request", true, "null", "web-1", 3500.0),
            // 404: unknown.
            failed("404", "status", true, "404", "web-1", 3600.0),
        ];
        let c = correlate(&records, &[report()], &[]);
        let class: BTreeMap<&str, FailureClass> = c
            .failures
            .iter()
            .map(|f| (f.id.as_str(), f.class))
            .collect();
        assert_eq!(class["cut"], FailureClass::ExitTimeout);
        assert_eq!(class["switch"], FailureClass::RoutingSwitch);
        assert_eq!(class["early"], FailureClass::Unknown);
        assert_eq!(class["5xx"], FailureClass::Processing);
        assert_eq!(class["inflight"], FailureClass::Processing);
        assert_eq!(class["404"], FailureClass::Unknown);
        let table = c.table();
        assert!(table.contains("quiesce deadline"), "{table}");
        assert!(table.contains("drain done, exit code 1"), "{table}");
        assert!(table.contains("deletion"), "{table}");
        assert!(table.contains("not known (pass --events)"), "{table}");
    }

    #[test]
    fn a_new_connection_refused_after_an_exit_is_a_routing_switch() {
        // No report (a naive server), only the exit seen from outside.
        let exit = ExternalEvent {
            unix_ms: 2000.0,
            instance: "naive-1".into(),
            event: "exit".into(),
        };
        let records = vec![
            failed("late", "connect", false, "null", "", 2600.0),
            failed("old", "connect", false, "null", "", 1500.0),
        ];
        let c = correlate(&records, &[], &[exit]);
        let class: BTreeMap<&str, FailureClass> = c
            .failures
            .iter()
            .map(|f| (f.id.as_str(), f.class))
            .collect();
        assert_eq!(class["late"], FailureClass::RoutingSwitch);
        assert_eq!(class["old"], FailureClass::Unknown);
        let late = c.failures.iter().find(|f| f.id == "late").unwrap();
        assert_eq!(late.instance.as_deref(), Some("naive-1"));
    }

    #[test]
    fn reports_are_read_from_a_captured_stderr_and_named() {
        let text =
            "starting\n{\"level\":\"info\"}\n{\"timeline\":[],\"pod\":{\"name\":\"web-2\"}}\n";
        assert_eq!(
            ReportView::parse(text, None, "x.log").unwrap().instance,
            "web-2"
        );
        let bare = r#"{"timeline":[]}"#;
        assert_eq!(
            ReportView::parse(bare, None, "dir/web-3.json")
                .unwrap()
                .instance,
            "web-3"
        );
        let err = ReportView::parse("{}", None, "b.json")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("b.json: not a drain report"), "{err}");
        let err = parse_events("{\"unix_ms\":1}\n", "ev.jsonl")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("ev.jsonl line 1:"), "{err}");
    }
}
