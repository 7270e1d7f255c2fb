//! The short human summary of a report, for `/dev/termination-log`.

use std::fmt::Write as _;

use super::{DrainReport, TERMINATION_LOG_LIMIT};
use super::{EvidenceKind, MaxReason, WeakEvidence};
use crate::vocab::phase::Trigger;

impl DrainReport {
    /// A short human summary, at most [`TERMINATION_LOG_LIMIT`] bytes, for
    /// `/dev/termination-log` (`kubectl describe pod` shows it).
    pub fn summary(&self) -> String {
        let mut s = String::new();
        if let Some(c) = &self.cause {
            let _ = writeln!(s, "forced: {c}");
        }
        if let Some(a) = self.advice.first() {
            let _ = writeln!(s, "{}: {}", a.level.as_str(), a.message);
        }
        let _ = writeln!(s, "{}", self.headline());
        if let Some(p) = &self.proxy_label {
            let _ = writeln!(s, "measured through: {p}");
        }
        let af = &self.after_flip;
        let _ = writeln!(
            s,
            "after drain start: {} new connections (last at {}), {} requests on new, {} on reused connections",
            af.new_connections,
            af.last_new_connection_ms
                .map_or_else(|| "-".to_owned(), |ms| format!("{ms} ms")),
            af.requests_on_new_connections,
            af.requests_on_reused_connections
        );
        for e in &self.timeline {
            let mut line = format!("{:>7} ms {}", e.at_ms, e.event);
            if let Some(t) = e.trigger {
                let _ = write!(line, " trigger={t}");
            }
            if let Some(r) = e.reason {
                let _ = write!(line, " reason={}", r.as_str());
            }
            if let Some(n) = &e.name {
                let _ = write!(line, " name={n}");
            }
            if let Some(d) = &e.detail {
                let _ = write!(line, " {d}");
            }
            if let Some(n) = e.count {
                let _ = write!(line, " count={n}");
            }
            if let Some(c) = e.code {
                let _ = write!(line, " code={c}");
            }
            let _ = writeln!(s, "{line}");
        }
        for st in &self.stragglers {
            let _ = writeln!(
                s,
                "straggler {} {} age {} ms",
                st.kind.as_str(),
                st.name,
                st.age_ms
            );
        }
        let unnamed = self
            .straggler_counts
            .total()
            .saturating_sub(self.stragglers.len() as u64);
        if unnamed > 0 {
            let c = &self.straggler_counts;
            let _ = writeln!(
                s,
                "stragglers in all: {} requests, {} responses, {} tasks ({unnamed} not named)",
                c.requests, c.responses, c.tasks
            );
        }
        for c in &self.closers {
            let _ = writeln!(s, "closer {} {} in {} ms", c.name, c.result, c.took_ms);
        }
        for t in &self.tasks {
            let _ = writeln!(s, "task {} {} after {} ms", t.name, t.result, t.ran_ms);
        }
        truncate_utf8(s, TERMINATION_LOG_LIMIT)
    }
}

impl DrainReport {
    /// The report in one line, for stderr at the exit and the summary: the outcome, the
    /// budget used and, when the propagation commit did not go on evidence, why — a process
    /// too young to measure its traffic waits to `max`, and says so here.
    pub(crate) fn headline(&self) -> String {
        let mut line = format!(
            "lameduck drain {} (exit {}), trigger {}, {} ms of {} ms grace used",
            self.outcome.as_str(),
            self.exit_code,
            self.trigger.map_or("none", Trigger::as_str),
            self.budget.used_ms,
            self.budget.grace_ms
        );
        if let Some(d) = &self.budget.deletion {
            let _ = write!(line, " (budget {} ms: {})", d.kill_at_ms, d.source.as_str());
        }
        if let Some(why) = self.wait_reason() {
            let _ = write!(line, "; {why}");
        }
        line
    }

    /// Why the commit came when it did, when that was not the evidence: `max`, the fallback,
    /// in-flight work.
    fn wait_reason(&self) -> Option<String> {
        let e = self.propagation.evidence.as_ref()?;
        let young = || {
            format!(
                "the process had seen only {:.1} s of traffic before the drain, under the 15 s the \
                 evidence needs (too_few_slots)",
                (e.slots_observed * e.slot_ms) as f64 / 1000.0
            )
        };
        let weak = |w: WeakEvidence| match w {
            WeakEvidence::TooFewSlots => young(),
            w => format!("not enough evidence ({})", w.as_str()),
        };
        let max = self.propagation.max_ms;
        let mut why = match (e.kind, e.max_reason, e.weak) {
            (EvidenceKind::Max, _, _) if e.past_max_ms.is_some() => format!(
                "served {} ms past max ({max} ms) while new connections kept arriving{}",
                e.past_max_ms.unwrap_or(0),
                if e.still_routed_at_cap {
                    ", and stopped accepting at the cap before their silence showed they had \
                     stopped"
                } else {
                    ""
                }
            ),
            (EvidenceKind::Max, Some(MaxReason::NotEnoughEvidence), Some(w)) => {
                format!("waited to max ({max} ms): {}", weak(w))
            }
            (EvidenceKind::Max, Some(MaxReason::EndpointSliceStillRouting), _) => {
                format!("waited to max ({max} ms): the EndpointSlice still routed here")
            }
            (EvidenceKind::Max, _, _) => {
                format!("waited to max ({max} ms): traffic or in-flight work never went quiet")
            }
            (EvidenceKind::Confirmed, _, _) => format!(
                "committed when every node agent ({}) said its rules no longer route here{}",
                e.nodes.len(),
                e.past_max_ms
                    .map_or(String::new(), |ms| format!(", {ms} ms past max ({max} ms)"))
            ),
            (EvidenceKind::Fallback, _, Some(w)) => format!(
                "committed on the quiet_suffices_after fallback ({} ms): {}",
                e.fallback_ms.unwrap_or(0),
                weak(w)
            ),
            _ => String::new(),
        };
        if let Some(h) = &e.in_flight_hold {
            if !why.is_empty() {
                why.push_str("; ");
            }
            let _ = write!(
                why,
                "held {} ms by in-flight work ({} in flight when the window held)",
                h.waited_ms, h.in_flight
            );
        }
        (!why.is_empty()).then_some(why)
    }
}

/// Cuts `s` to at most `limit` bytes on a character boundary, marking the cut.
pub(crate) fn truncate_utf8(mut s: String, limit: usize) -> String {
    if s.len() <= limit {
        return s;
    }
    const MARK: &str = "\n…(truncated)\n";
    let mut cut = limit - MARK.len();
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s.truncate(cut);
    s.push_str(MARK);
    s
}
