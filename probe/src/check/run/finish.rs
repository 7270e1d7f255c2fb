//! The end of a check: the drain report read (from its file or the service's stderr), the
//! contracts judged, and the check's report.

use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::check::contracts::{self, ReportFacts};
use crate::check::{process, CheckArgs, CheckReport, ExpectReadiness, Observed, MAX_REPORT_FILE};

/// Reads the report file: a regular file of at most [`MAX_REPORT_FILE`] bytes. Opened
/// without blocking, so a FIFO with no writer (or a device) is refused, not waited on.
fn read_report_file(path: &Path) -> Result<String, String> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // The opened file, not the path: it cannot be swapped between the look and the read.
    let meta = file
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!(
            "{} is not a regular file (a FIFO, a device or a directory): not read",
            path.display()
        ));
    }
    let mut text = String::new();
    file.take(MAX_REPORT_FILE + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if text.len() as u64 > MAX_REPORT_FILE {
        return Err(format!(
            "{} is larger than {MAX_REPORT_FILE} bytes: not read",
            path.display()
        ));
    }
    Ok(text)
}

pub(super) fn finish(
    args: &CheckArgs,
    started_unix_ms: f64,
    mut observed: Observed,
    output: &Arc<Mutex<process::Output>>,
    prestop: Option<String>,
    left_behind: &[String],
) -> CheckReport {
    let (report_line, stderr_tail) = {
        let out = output.lock().expect("output lock");
        (out.report_line(), out.tail())
    };
    let from_file = args
        .report_file
        .as_ref()
        .and_then(|path| match read_report_file(path) {
            Ok(text) => ReportFacts::parse(&text, &path.display().to_string()),
            Err(why) => {
                observed.report_unread = Some(why);
                None
            }
        });
    observed.report =
        from_file.or_else(|| report_line.and_then(|l| ReportFacts::parse(&l, "stderr")));
    if observed.report_expected.is_none() && observed.records.iter().any(|r| r.phase.is_some()) {
        observed.report_expected =
            Some("the answers carried x-lameduck-phase, a lameduck service's header".to_owned());
    }
    let mut notes = Vec::new();
    let expect_serving = args.expect_readiness == ExpectReadiness::Serving;
    let report = contracts::report(&observed);
    if report.is_none() {
        notes.push(
            "report: left out: no lameduck drain report on stderr, and none expected (no \
             --report-file, --expect-report or x-lameduck-phase header); a service without \
             lameduck writes none"
                .to_owned(),
        );
    }
    if let Some(note) = observed.report.as_ref().and_then(ReportFacts::young_note) {
        notes.push(note);
    }
    if !left_behind.is_empty() {
        notes.push(format!(
            "killed {} process(es) the service left running outside its process group (a \
             daemon, setsid): {}",
            left_behind.len(),
            left_behind.join(", ")
        ));
    }
    let contracts = vec![
        contracts::startup(&observed),
        contracts::readiness(&observed, expect_serving),
        contracts::liveness(&observed),
        contracts::stop_signal(&observed),
        contracts::listener_open(&observed),
        contracts::in_flight(&observed),
        contracts::keepalive_close(&observed),
        contracts::exit(&observed),
    ]
    .into_iter()
    .chain(report)
    .collect();
    CheckReport {
        command: args.command.clone(),
        pid_namespace: args.pid_namespace,
        started_unix_ms,
        stop_unix_ms: observed.t0,
        prestop,
        signal_unix_ms: observed.signal_at,
        exit: observed.exit,
        exit_unix_ms: observed.exited_at,
        contracts,
        strict: args.strict,
        notes,
        requests: observed.records.len(),
        stderr_tail,
    }
}
