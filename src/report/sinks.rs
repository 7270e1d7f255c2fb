//! Where the report goes when the drain ends: a file (atomically), the termination log, and
//! stderr from a plain thread with a bounded wait.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::DrainReport;

/// How long a stderr write may take before it is given up: a log pipe nobody reads must not
/// keep the process from exiting.
pub(crate) const STDERR_WAIT: Duration = Duration::from_secs(1);

/// Set once a stderr write was given up: later writes are skipped instead of piling up threads
/// behind the same stalled pipe.
static STDERR_STALLED: AtomicBool = AtomicBool::new(false);

/// Writes `text` to stderr from a plain thread and waits at most `wait` for it. A reader that
/// stalls the pipe leaves that thread blocked (the process exits past it), not the caller.
pub(crate) fn stderr_bounded(text: String, wait: Duration) -> Result<(), String> {
    // Relaxed: a stale `false` only costs one more bounded attempt.
    if STDERR_STALLED.load(Ordering::Relaxed) {
        return Err("stderr: skipped, an earlier write stalled".to_owned());
    }
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let spawned = std::thread::Builder::new()
        .name("lameduck-stderr".to_owned())
        .spawn(move || {
            let mut err = std::io::stderr().lock();
            let r = err.write_all(text.as_bytes()).and_then(|()| err.flush());
            let _ = tx.send(r);
        });
    if let Err(e) = spawned {
        return Err(format!("stderr: cannot start the writer thread: {e}"));
    }
    match rx.recv_timeout(wait) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("stderr: {e}")),
        Err(_) => {
            STDERR_STALLED.store(true, Ordering::Relaxed);
            Err(format!(
                "stderr: the write did not finish within {} ms (is the log reader stalled?)",
                wait.as_millis()
            ))
        }
    }
}

/// What one emission of the report achieved.
#[derive(Debug, Default)]
pub(crate) struct Emitted {
    /// The report file could not be written (its error message).
    pub(crate) file_failed: bool,
    /// Every failed sink, as `sink: why`.
    pub(crate) errors: Vec<String>,
}

impl Emitted {
    /// Records what the emission achieved in `report`: failed sinks, and exit code 1 when the
    /// report file could not be written.
    pub(crate) fn apply_to(self, report: &mut DrainReport) {
        if self.file_failed {
            report.exit_code = 1;
        }
        for e in self.errors {
            if !report.sink_errors.contains(&e) {
                report.sink_errors.push(e);
            }
        }
    }
}

/// Where the report goes when the drain ends.
///
/// Order: the file first (atomically), then the termination log, then stderr from a plain
/// thread with a bounded wait. Nothing here can block for longer than the file system takes
/// plus [`STDERR_WAIT`].
#[derive(Clone, Debug)]
pub(crate) struct Sinks {
    pub(crate) stderr: bool,
    pub(crate) file: Option<std::path::PathBuf>,
    pub(crate) termination_log: Option<std::path::PathBuf>,
}

impl Default for Sinks {
    fn default() -> Self {
        Self {
            stderr: true,
            file: None,
            termination_log: Some("/dev/termination-log".into()),
        }
    }
}

impl Sinks {
    /// Writes the report to every sink; `stderr` says whether this emission includes the
    /// stderr line (the last emission does). Failures are said on stderr (best effort,
    /// bounded) and returned.
    ///
    /// Nothing here goes through tracing: a subscriber may write synchronously to the very
    /// stderr that stalls (the driver logs the report itself, before calling this).
    pub(crate) fn emit(&self, report: &DrainReport, stderr: bool) -> Emitted {
        let json = report.to_json();
        let mut out = Emitted::default();
        if let Some(path) = &self.file {
            if let Err(e) = write_report_file(path, &format!("{json}\n")) {
                out.file_failed = true;
                out.errors.push(format!(
                    "report file {}: {e}; fix the path or the volume given to report_file",
                    path.display()
                ));
            }
        }
        if let Some(path) = &self.termination_log {
            if let Err(e) = write_termination_log(path, &report.summary()) {
                out.errors
                    .push(format!("termination log {}: {e}", path.display()));
            }
        }
        let mut text = String::new();
        if stderr && self.stderr {
            text.push_str(&json);
            text.push('\n');
        }
        for e in &out.errors {
            let _ = writeln!(text, "lameduck: cannot write the drain report: {e}");
        }
        if !text.is_empty() {
            if let Err(e) = stderr_bounded(text, STDERR_WAIT) {
                // The file is the durable sink: rewrite it so it names the stalled stderr.
                if let (Some(path), false) = (&self.file, out.file_failed) {
                    let mut r = report.clone();
                    r.sink_errors.push(e.clone());
                    let _ = write_report_file(path, &format!("{}\n", r.to_json()));
                }
                out.errors.push(e);
            }
        }
        out
    }
}

/// The report as one INFO tracing event (target `lameduck::report`).
pub(crate) fn log_report(report: &DrainReport, json: &str) {
    tracing::info!(
        target: "lameduck::report",
        outcome = report.outcome.as_str(),
        exit_code = report.exit_code,
        used_ms = report.budget.used_ms,
        report = %json,
        "lameduck: drain report"
    );
}

/// Replaces the report file atomically: a temporary file in the same directory is written,
/// synced and renamed over the target, then the directory is synced. A crash at any moment
/// leaves the previous report or the new one, never a truncated file.
///
/// A target that exists and is not a regular file (`/dev/stdout`, a FIFO, `/dev/full`) is
/// written in place: renaming over a device would replace it.
fn write_report_file(path: &Path, contents: &str) -> std::io::Result<()> {
    use std::fs;
    if let Ok(meta) = fs::metadata(path) {
        if !meta.is_file() {
            let mut f = fs::OpenOptions::new().write(true).open(path)?;
            f.write_all(contents.as_bytes())?;
            return f.flush();
        }
    }
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "the path names no file")
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = dir.join(tmp_name);
    let written = (|| {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        f.write_all(contents.as_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    // The rename is durable once the directory is synced; some file systems cannot sync a
    // directory, and the report is in place either way.
    if let Ok(d) = fs::File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Writes the summary to the termination log if the path exists. Kubernetes creates
/// `/dev/termination-log` (a bind mount: written in place, it cannot be renamed over);
/// elsewhere it is missing and this is quiet.
fn write_termination_log(path: &Path, summary: &str) -> std::io::Result<()> {
    let open = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path);
    match open {
        Ok(mut f) => f.write_all(summary.as_bytes()),
        // Outside Kubernetes the file is missing: nothing to write, nothing failed.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_file_is_replaced_whole_and_leaves_no_temporary_file() {
        let dir = std::env::temp_dir().join(format!("lameduck-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("report.json");
        std::fs::write(&path, "previous\n").unwrap();
        write_report_file(&path, "new\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new\n");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [std::ffi::OsString::from("report.json")]);
        let err = write_report_file(&dir.join("missing").join("r.json"), "x").unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
