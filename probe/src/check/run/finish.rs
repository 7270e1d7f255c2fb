//! The end of a check: the drain report read (from its file or the service's stderr), the
//! contracts judged, and the check's report.

use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::check::contracts::{self, ReportFacts};
use crate::check::{process, CheckArgs, CheckReport, ExpectReadiness, Observed, MAX_REPORT_FILE};

/// Reads the report file: a regular file of at most [`MAX_REPORT_FILE`] bytes. A FIFO or a
/// device is refused before it is opened, and the open does not block either (the path may be
/// swapped for a FIFO in between), so nothing is waited on.
fn read_report_file(path: &Path) -> Result<String, String> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let not_regular = || {
        format!(
            "{} is not a regular file (a FIFO, a device or a directory): not read",
            path.display()
        )
    };
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(not_regular());
    }
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
        return Err(not_regular());
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

/// The drain report: with `--report-file` from that file only (where the report must be: one
/// on stderr does not stand in for it), else from the stderr line. `Err` says why the file
/// gave none.
fn drain_report(
    args: &CheckArgs,
    stderr_line: Option<String>,
) -> Result<Option<ReportFacts>, String> {
    let from_stderr = stderr_line.and_then(|l| ReportFacts::parse(&l, "stderr"));
    let Some(path) = &args.report_file else {
        return Ok(from_stderr);
    };
    let from_file = read_report_file(path).and_then(|text| {
        ReportFacts::parse(&text, &path.display().to_string())
            .ok_or_else(|| format!("{} holds no lameduck drain report", path.display()))
    });
    match from_file {
        Ok(report) => Ok(Some(report)),
        Err(why) if from_stderr.is_some() => Err(format!(
            "{why} (a drain report on stderr was not used in its place)"
        )),
        Err(why) => Err(why),
    }
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
    match drain_report(args, report_line) {
        Ok(report) => observed.report = report,
        Err(why) => observed.report_unread = Some(why),
    }
    if observed.report_expected.is_none() && observed.records.iter().any(|r| r.phase.is_some()) {
        observed.report_expected =
            Some("the answers carried x-lameduck-phase, a lameduck service's header".to_owned());
    }
    // Before the contracts: they judge from when the service was told.
    let mut notes: Vec<String> = super::told::settle(&mut observed).into_iter().collect();
    let expect_serving = args.expect_readiness == ExpectReadiness::Serving;
    let report = contracts::report(&observed);
    let prestop_contract = contracts::prestop(&observed);
    notes.extend(notes_beside(&observed, report.is_none(), left_behind));
    let mut contracts = vec![
        contracts::startup(&observed),
        contracts::readiness(&observed, expect_serving),
        contracts::liveness(&observed),
    ];
    // The hook runs before the signal: its contract comes before the signal's.
    contracts.extend(prestop_contract);
    contracts.extend([
        contracts::stop_signal(&observed),
        contracts::listener_open(&observed),
        contracts::in_flight(&observed),
        contracts::keepalive_close(&observed),
        contracts::exit(&observed),
    ]);
    contracts.extend(report);
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

/// What the run noticed beside the contracts: the report contract left out, a drain that
/// waited to `max` because the process was young, processes killed after the exit.
fn notes_beside(observed: &Observed, report_left_out: bool, left_behind: &[String]) -> Vec<String> {
    let mut notes = observed.preflight.clone();
    if report_left_out {
        notes.push(
            "report: left out: no lameduck drain report on stderr, and none expected (no \
             --report-file, --expect-report or x-lameduck-phase header); a service without \
             lameduck writes none"
                .to_owned(),
        );
    }
    notes.extend(observed.report.as_ref().and_then(ReportFacts::young_note));
    if !left_behind.is_empty() {
        notes.push(format!(
            "killed {} process(es) the service left running outside its process group (a \
             daemon, setsid): {}",
            left_behind.len(),
            left_behind.join(", ")
        ));
    }
    notes
}
