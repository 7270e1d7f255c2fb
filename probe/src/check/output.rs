//! The verdict as a terminal table, JSON and JUnit XML.

use std::fmt::Write as _;

use super::{CheckReport, Verdict};

impl CheckReport {
    /// The terminal table: one row per contract, then the evidence of every contract that did
    /// not pass.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "lameduck-probe check: {}{}",
            self.command.join(" "),
            if self.pid_namespace {
                "  (PID 1 of a new PID namespace)"
            } else {
                ""
            }
        );
        if let Some(p) = &self.prestop {
            let _ = writeln!(out, "preStop: {p}");
        }
        let _ = writeln!(
            out,
            "times are from t+0, the stop (preStop start, else the stop signal)\n"
        );
        let _ = writeln!(out, "{:<17}{:<14}why", "contract", "verdict");
        for c in &self.contracts {
            let _ = writeln!(out, "{:<17}{:<14}{}", c.name, c.verdict.label(), c.summary);
        }
        for c in &self.contracts {
            if c.verdict == Verdict::Pass || c.evidence.is_empty() {
                continue;
            }
            let _ = writeln!(out, "\n{} ({}): {}", c.name, c.verdict.label(), c.title);
            for e in &c.evidence {
                let _ = writeln!(out, "  - {e}");
            }
        }
        if self
            .contract("startup")
            .is_some_and(|c| c.verdict != Verdict::Pass)
            && !self.stderr_tail.is_empty()
        {
            let _ = writeln!(out, "\nthe service's last stderr lines:");
            for line in &self.stderr_tail {
                let _ = writeln!(out, "  | {line}");
            }
        }
        let count = |v: Verdict| self.contracts.iter().filter(|c| c.verdict == v).count();
        let _ = writeln!(
            out,
            "\n{}: {} passed, {} failed, {} warnings, {} not measured",
            if self.passed() { "PASS" } else { "FAIL" },
            count(Verdict::Pass),
            count(Verdict::Fail),
            count(Verdict::Warn),
            count(Verdict::NotMeasured)
        );
        out
    }

    /// The whole result as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("the check report has only plain values")
    }

    /// JUnit XML: one test case per contract. FAIL and WARN are `<failure>` (the run's exit
    /// code is not 0 for either), NOT MEASURED is `<skipped>`; the evidence goes in
    /// `<system-out>`.
    pub fn junit(&self) -> String {
        let count = |v: Verdict| self.contracts.iter().filter(|c| c.verdict == v).count();
        let failures = count(Verdict::Fail) + count(Verdict::Warn);
        let skipped = count(Verdict::NotMeasured);
        let total = self.contracts.len();
        let seconds = self
            .exit_unix_ms
            .map_or(0.0, |e| (e - self.started_unix_ms).max(0.0) / 1000.0);
        let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        let _ = writeln!(
            x,
            "<testsuites name=\"lameduck-probe check\" tests=\"{total}\" failures=\"{failures}\" errors=\"0\" skipped=\"{skipped}\" time=\"{seconds:.3}\">"
        );
        let _ = writeln!(
            x,
            "  <testsuite name=\"shutdown contracts\" tests=\"{total}\" failures=\"{failures}\" errors=\"0\" skipped=\"{skipped}\" time=\"{seconds:.3}\">"
        );
        let _ = writeln!(
            x,
            "    <properties>\n      <property name=\"command\" value=\"{}\"/>\n      <property name=\"pid_namespace\" value=\"{}\"/>\n    </properties>",
            escape(&self.command.join(" ")),
            self.pid_namespace
        );
        for c in &self.contracts {
            let _ = writeln!(
                x,
                "    <testcase classname=\"lameduck.check\" name=\"{}\">",
                escape(&c.name)
            );
            match c.verdict {
                Verdict::Pass => {}
                Verdict::Fail | Verdict::Warn => {
                    let _ = writeln!(
                        x,
                        "      <failure type=\"{}\" message=\"{}\">{}</failure>",
                        c.verdict.label(),
                        escape(&c.summary),
                        escape(&c.evidence.join("\n"))
                    );
                }
                Verdict::NotMeasured => {
                    let _ = writeln!(
                        x,
                        "      <skipped message=\"not measured: {}\"/>",
                        escape(&c.summary)
                    );
                }
            }
            let mut text = format!("{}: {}: {}", c.title, c.verdict.label(), c.summary);
            for e in &c.evidence {
                text.push_str("\n- ");
                text.push_str(e);
            }
            let _ = writeln!(x, "      <system-out>{}</system-out>", escape(&text));
            let _ = writeln!(x, "    </testcase>");
        }
        x.push_str("  </testsuite>\n</testsuites>\n");
        x
    }
}

/// XML text and attribute escaping; characters XML 1.0 cannot hold become `?`.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' | '\t' => out.push(c),
            '\r' => out.push_str("&#13;"),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn escapes_markup_and_drops_control_characters() {
        assert_eq!(escape("a<b & \"c\"\u{1}"), "a&lt;b &amp; &quot;c&quot;?");
    }
}
