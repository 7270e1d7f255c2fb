//! The failure classes of the [module docs](super): what each failed request is put down to.

use super::CUT_TOLERANCE_MS;
use super::{category, end_unix, ClassifiedFailure, ExternalEvent, FailureClass, ReportView};
use crate::record::{Failure, Record};

/// The moments that explain failures: deadlines and exits (for exit-timeout cuts) and the
/// moments instances stopped accepting (for routing switches).
pub(super) struct Landmarks {
    /// When, which instance, and what it was (`quiesce deadline`, `exit`).
    cut_points: Vec<(f64, String, &'static str)>,
    /// When an instance stopped accepting, and which.
    stops: Vec<(f64, String)>,
}

impl Landmarks {
    pub(super) fn new(reports: &[ReportView], external: &[ExternalEvent]) -> Self {
        let mut cut_points = Vec::new();
        let mut stops = Vec::new();
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
        Landmarks { cut_points, stops }
    }

    /// The class of one failed record, checked in the order the module docs give.
    pub(super) fn classify(&self, r: &Record) -> ClassifiedFailure {
        let at = end_unix(r);
        let cut = matches!(r.failure, Some(Failure::Request | Failure::Body));
        let new_conn = !r.reused;
        let before_answer = matches!(r.failure, Some(Failure::Connect | Failure::Request));
        let (class, instance, why) =
            if let (true, Some((t, inst, what))) = (cut, self.cut_at(r, at)) {
                (
                    FailureClass::ExitTimeout,
                    Some(inst.clone()),
                    format!("cut {:+.0} ms from {inst}'s {what}", at - t),
                )
            } else if let (true, true, Some((t, inst))) =
                (before_answer, new_conn, self.stopped_before(r, at))
            {
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
        ClassifiedFailure {
            id: r.id.clone(),
            unix_ms: at,
            class,
            instance,
            why,
            error: r.error.clone().unwrap_or_default(),
        }
    }

    /// A deadline or exit of the record's instance (or any, when none answered) within
    /// [`CUT_TOLERANCE_MS`] of `at`.
    fn cut_at(&self, r: &Record, at: f64) -> Option<&(f64, String, &'static str)> {
        self.cut_points.iter().find(|(t, inst, _)| {
            (at - t).abs() <= CUT_TOLERANCE_MS && r.instance.as_ref().is_none_or(|i| i == inst)
        })
    }

    /// The last stop of the record's instance (or any, when none answered) at or before `at`.
    fn stopped_before(&self, r: &Record, at: f64) -> Option<&(f64, String)> {
        self.stops
            .iter()
            .filter(|(t, inst)| *t <= at && r.instance.as_ref().is_none_or(|i| i == inst))
            .max_by(|a, b| a.0.total_cmp(&b.0))
    }
}
