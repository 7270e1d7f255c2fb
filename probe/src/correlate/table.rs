//! [`Correlation::table`]: the diagnosis as plain text.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::{printable, ClassifiedFailure, Correlation, FailureClass, InstanceDiagnosis};

/// How many failures the table lists one by one; the counts per class cover them all.
const TABLE_FAILURES: usize = 200;

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
        for inst in &self.instances {
            self.instance_section(&mut out, inst);
        }
        let _ = writeln!(out);
        self.failures_section(&mut out);
        out
    }

    /// A time as an offset from the origin, right-aligned.
    fn offset(&self, t: f64) -> String {
        format!("{:>9.0}", t - self.origin_unix_ms)
    }

    /// One instance: what it answered, then its rows.
    fn instance_section(&self, out: &mut String, inst: &InstanceDiagnosis) {
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
                .map(|t| self.offset(t))
                .unwrap_or_else(|| format!("{:>9}", "-"));
            let _ = writeln!(
                out,
                "  {:<22}{at}  {}",
                printable(&row.what),
                printable(&row.note)
            );
        }
    }

    /// The counts per class, then the first [`TABLE_FAILURES`] failures one by one.
    fn failures_section(&self, out: &mut String) {
        if self.failures.is_empty() {
            let _ = writeln!(out, "failures: none");
            return;
        }
        let mut by_class: BTreeMap<FailureClass, u64> = BTreeMap::new();
        for f in &self.failures {
            *by_class.entry(f.class).or_default() += 1;
        }
        let counts: Vec<String> = by_class.iter().map(|(c, n)| format!("{n} {c}")).collect();
        let _ = writeln!(out, "failures: {}", counts.join(", "));
        for f in self.failures.iter().take(TABLE_FAILURES) {
            self.failure_line(out, f);
        }
        if self.failures.len() > TABLE_FAILURES {
            let _ = writeln!(
                out,
                "  ... {} more (the library's `Correlation::failures` has them all)",
                self.failures.len() - TABLE_FAILURES
            );
        }
    }

    fn failure_line(&self, out: &mut String, f: &ClassifiedFailure) {
        let _ = writeln!(
            out,
            "  {} {:<15} {:<24} {} ({}): {}",
            self.offset(f.unix_ms),
            f.class.as_str(),
            printable(&f.id),
            printable(f.instance.as_deref().unwrap_or("-")),
            printable(&f.why),
            printable(&f.error)
        );
    }
}
