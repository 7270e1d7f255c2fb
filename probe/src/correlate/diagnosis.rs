//! An instance's diagnosis rows, in the fixed order [`InstanceDiagnosis::rows`] documents.
//!
//! [`InstanceDiagnosis::rows`]: super::InstanceDiagnosis::rows

use super::{category, DiagnosisRow, ReportView, TimedEvent};
use crate::record::Record;

/// What is known about one instance: its report, if any, and its external events.
struct Sources<'a> {
    report: Option<&'a ReportView>,
    ext: &'a [TimedEvent],
}

fn row(what: &str, unix_ms: Option<f64>, note: String) -> DiagnosisRow {
    DiagnosisRow {
        what: what.to_owned(),
        unix_ms,
        note,
    }
}

pub(super) fn diagnosis_rows(
    report: Option<&ReportView>,
    ext: &[TimedEvent],
    mine: &[&Record],
) -> Vec<DiagnosisRow> {
    let s = Sources { report, ext };
    let mut rows = vec![s.external_row("deletion", "deletion"), s.signal_row()];
    rows.push(s.report_row("drain started", "drain_started"));
    rows.push(s.report_row("readiness flipped", "readiness_flipped"));
    rows.push(s.external_row("endpoint change", "endpoint change"));
    rows.push(s.external_row("proxy update", "proxy update"));
    rows.push(s.report_row("stopped accepting", "stopped_accepting"));
    rows.extend(last_answer_rows(mine));
    if let Some(e) = s.report_event("deadline_exceeded") {
        rows.push(row(
            "quiesce deadline",
            Some(e.unix_ms),
            "report: work was cut".to_owned(),
        ));
    }
    rows.push(s.exit_row());
    for e in ext.iter().filter(|e| category(&e.event).is_none()) {
        rows.push(row(&e.event, Some(e.unix_ms), "events".to_owned()));
    }
    rows
}

/// The last answer while draining and the last answer at all, when there were any.
fn last_answer_rows(mine: &[&Record]) -> impl Iterator<Item = DiagnosisRow> {
    let latest = |it: &mut dyn Iterator<Item = &&Record>| {
        it.max_by(|a, b| a.start_ms.total_cmp(&b.start_ms))
            .map(|r| (r.start_unix_ms, format!("probe: {} (request start)", r.id)))
    };
    let draining = latest(&mut mine.iter().filter(|r| r.served_by_draining()));
    let any = latest(&mut mine.iter());
    let draining = draining.map(|(t, note)| row("last draining answer", t, note));
    let any = any.map(|(t, note)| row("last answer", t, note));
    draining.into_iter().chain(any)
}

impl Sources<'_> {
    fn report_event(&self, event: &str) -> Option<&TimedEvent> {
        self.report.and_then(|r| r.first(event))
    }

    fn external_event(&self, cat: &str) -> Option<&TimedEvent> {
        self.ext.iter().find(|e| category(&e.event) == Some(cat))
    }

    /// The first external event of category `cat`, or a row saying it is not known.
    fn external_row(&self, what: &str, cat: &str) -> DiagnosisRow {
        match self.external_event(cat) {
            Some(e) => row(what, Some(e.unix_ms), format!("events: {}", e.event)),
            None => row(what, None, "not known (pass --events)".to_owned()),
        }
    }

    /// The report's first `event`, or a row saying why it is not known.
    fn report_row(&self, what: &str, event: &str) -> DiagnosisRow {
        let Some(rep) = self.report else {
            return row(what, None, "not known (no report)".to_owned());
        };
        match rep.first(event) {
            Some(e) => {
                let note = match &e.detail {
                    Some(d) => format!("report: {d}"),
                    None => "report".to_owned(),
                };
                row(what, Some(e.unix_ms), note)
            }
            None => row(what, None, format!("not in the report (no {event} event)")),
        }
    }

    /// The signal: from the report when it recorded one (or the drain was started by one),
    /// else from the events.
    fn signal_row(&self) -> DiagnosisRow {
        let signal_started = self
            .report_event("drain_started")
            .filter(|e| e.detail.as_deref().is_some_and(|d| d.starts_with("sig")));
        match (self.report_event("signal_received"), signal_started) {
            (Some(e), _) => row(
                "signal",
                Some(e.unix_ms),
                format!(
                    "report: {}",
                    e.detail.as_deref().unwrap_or("signal_received")
                ),
            ),
            (None, Some(e)) => row(
                "signal",
                Some(e.unix_ms),
                format!(
                    "report: {} started the drain",
                    e.detail.as_deref().unwrap_or_default()
                ),
            ),
            (None, None) => self.external_row("signal", "signal"),
        }
    }

    /// The exit: the report's exit event, else the events file, else the report's end.
    fn exit_row(&self) -> DiagnosisRow {
        let code = self
            .report
            .and_then(|r| r.exit_code)
            .map(|c| format!(", exit code {c}"))
            .unwrap_or_default();
        if let Some(e) = self.report_event("exit") {
            row("exit", Some(e.unix_ms), format!("report{code}"))
        } else if let Some(e) = self.external_event("exit") {
            row(
                "exit",
                Some(e.unix_ms),
                format!("events: {}{code}", e.event),
            )
        } else if let Some(e) = self.report_event("done") {
            row(
                "exit",
                Some(e.unix_ms),
                format!("report: drain done{code} (the exit itself is not recorded)"),
            )
        } else {
            row("exit", None, "not known".to_owned())
        }
    }
}
