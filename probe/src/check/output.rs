//! The verdict as a terminal table, JSON and JUnit XML.
//!
//! The table prints what the service controls (its process name, its report's fields, its
//! stderr) with control characters escaped (`\u{1b}`), so nothing it wrote can drive the
//! terminal; the JUnit file and the exit code count the same failures
//! ([`CheckReport::fails`]).

use std::borrow::Cow;
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
            printable(&self.command.join(" ")),
            if self.pid_namespace {
                "  (PID 1 of a new PID namespace)"
            } else {
                ""
            }
        );
        if let Some(p) = &self.prestop {
            let _ = writeln!(out, "preStop: {}", printable(p));
        }
        let _ = writeln!(
            out,
            "times are from t+0, the stop (preStop start, else the stop signal)\n"
        );
        let _ = writeln!(out, "{:<17}{:<14}why", "contract", "verdict");
        for c in &self.contracts {
            let _ = writeln!(
                out,
                "{:<17}{:<14}{}",
                c.name,
                c.verdict.label(),
                printable(&c.summary)
            );
        }
        for note in &self.notes {
            let _ = writeln!(out, "\nnote: {}", printable(note));
        }
        for c in &self.contracts {
            if c.verdict == Verdict::Pass || c.evidence.is_empty() {
                continue;
            }
            let _ = writeln!(out, "\n{} ({}): {}", c.name, c.verdict.label(), c.title);
            for e in &c.evidence {
                let _ = writeln!(out, "  - {}", printable(e));
            }
        }
        if self
            .contract("startup")
            .is_some_and(|c| c.verdict != Verdict::Pass)
            && !self.stderr_tail.is_empty()
        {
            let _ = writeln!(out, "\nthe service's last stderr lines:");
            for line in &self.stderr_tail {
                let _ = writeln!(out, "  | {}", printable(line));
            }
        }
        let count = |v: Verdict| self.contracts.iter().filter(|c| c.verdict == v).count();
        let _ = writeln!(
            out,
            "\n{}: {} passed, {} failed, {} warnings, {} not measured{}",
            if self.passed() { "PASS" } else { "FAIL" },
            count(Verdict::Pass),
            count(Verdict::Fail),
            count(Verdict::Warn),
            count(Verdict::NotMeasured),
            if self.strict {
                " (--strict: not measured fails)"
            } else {
                ""
            }
        );
        out
    }

    /// The whole result as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("the check report has only plain values")
    }

    /// JUnit XML: one test case per contract. A verdict that fails the run (FAIL, WARN, and
    /// NOT MEASURED with `--strict`) is a `<failure>`, so the file is red exactly when the exit
    /// code is not 0; NOT MEASURED otherwise is `<skipped>`. The evidence goes in
    /// `<system-out>`, the notes in properties.
    pub fn junit(&self) -> String {
        let failures = self
            .contracts
            .iter()
            .filter(|c| self.fails(c.verdict))
            .count();
        let skipped = self
            .contracts
            .iter()
            .filter(|c| c.verdict == Verdict::NotMeasured && !self.fails(c.verdict))
            .count();
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
            "    <properties>\n      <property name=\"command\" value=\"{}\"/>\n      <property name=\"pid_namespace\" value=\"{}\"/>\n      <property name=\"strict\" value=\"{}\"/>",
            escape(&self.command.join(" ")),
            self.pid_namespace,
            self.strict
        );
        for note in &self.notes {
            let _ = writeln!(
                x,
                "      <property name=\"note\" value=\"{}\"/>",
                escape(note)
            );
        }
        x.push_str("    </properties>\n");
        for c in &self.contracts {
            let _ = writeln!(
                x,
                "    <testcase classname=\"lameduck.check\" name=\"{}\">",
                escape(&c.name)
            );
            match c.verdict {
                Verdict::Pass => {}
                v if self.fails(v) => {
                    let _ = writeln!(
                        x,
                        "      <failure type=\"{}\" message=\"{}\">{}</failure>",
                        c.verdict.label(),
                        escape(&c.summary),
                        escape(&c.evidence.join("\n"))
                    );
                }
                _ => {
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

/// The JUnit file of a check that could not run at all (`error`): one test case in error, so
/// the file is red as the exit code (3) is not 0, and no file of an earlier run is left.
pub fn junit_error(command: &[String], error: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
         <testsuites name=\"lameduck-probe check\" tests=\"1\" failures=\"0\" errors=\"1\" skipped=\"0\">\n\
         \x20 <testsuite name=\"shutdown contracts\" tests=\"1\" failures=\"0\" errors=\"1\" skipped=\"0\">\n\
         \x20   <properties>\n      <property name=\"command\" value=\"{}\"/>\n    </properties>\n\
         \x20   <testcase classname=\"lameduck.check\" name=\"check\">\n\
         \x20     <error type=\"check\" message=\"{}\"/>\n\
         \x20   </testcase>\n\
         \x20 </testsuite>\n</testsuites>\n",
        escape(&command.join(" ")),
        escape(error)
    )
}

/// `text` with every control character (C0, DEL, C1) and bidirectional override escaped as
/// `\u{..}`: what a service wrote cannot move the cursor, recolour or retitle the terminal.
pub(crate) fn printable(text: &str) -> Cow<'_, str> {
    let unsafe_char = |c: char| {
        c.is_control()
            || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            let _ = write!(out, "{}", c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
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
    use super::{escape, printable};

    #[test]
    fn escapes_markup_and_drops_control_characters() {
        assert_eq!(escape("a<b & \"c\"\u{1}"), "a&lt;b &amp; &quot;c&quot;?");
    }

    #[test]
    fn terminal_escapes_are_printed_as_text() {
        assert_eq!(printable("plain name"), "plain name");
        assert_eq!(
            printable("evil\u{1b}]0;owned\u{7}\u{9b}2J\u{202e}x"),
            "evil\\u{1b}]0;owned\\u{7}\\u{9b}2J\\u{202e}x"
        );
    }
}
