//! Reading the inputs: drain reports, external events and the probe's records, each checked
//! for plausible times before anything uses them.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::CorrelateError;
use crate::record::Record;

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

    pub(super) fn first(&self, name: &str) -> Option<&TimedEvent> {
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
