//! Where the report goes when the drain ends: a file, the termination log, and stderr — each
//! written from a plain thread that the caller waits for with a deadline.
//!
//! # Invariants
//!
//! * No sink blocks its caller past the emission's deadline: the file and the termination log
//!   are written at the same time on their own threads, then stderr; each wait is bounded by
//!   [`SINK_WAIT`] and by the deadline. A thread stuck in the kernel (a pipe nobody reads, a
//!   hung network file system) is left behind, and the process exits past it; a sink that
//!   stalled once is skipped afterwards instead of piling up threads behind it.
//! * A path is judged as text first: `.`, `..` and repeated slashes resolved (`/dev/../etc/x`
//!   is `/etc/x`), and that path is the one opened.
//! * Links are followed, and a device or a pipe written, only at the *special* sinks:
//!   `/dev/stdout`, `/dev/stderr`, `/dev/fd/N`, `/proc/self/fd/N` and `/dev/termination-log`.
//!   A FIFO anywhere, and a special sink that is a link or not a regular file, are written in
//!   place and without blocking: opened with `O_NONBLOCK` (a FIFO with no reader fails at once
//!   instead of waiting for one) and `O_APPEND` (a link to a log file is written at its end,
//!   not over its start), then written until the deadline.
//! * At any other path, under `/dev` or not, a symbolic link is never followed (whoever can
//!   write the directory could plant one: `/dev/shm` is often an `emptyDir` shared with
//!   sidecars): it is replaced like a regular file, and the in-place open adds `O_NOFOLLOW`
//!   and writes only a regular file or a FIFO; a device, a socket or a directory there is
//!   refused, and the error names what it is.
//! * A regular file is replaced through a temporary file created exclusively (`O_EXCL`, so
//!   never through a planted symlink) under an unpredictable name in the target's directory;
//!   when the target cannot be renamed over (`EBUSY`: it is a bind mount, as a Kubernetes
//!   `subPath` file mount is) it is written in place.
//! * Each sink error is said on stderr once per coordinator, however many times the report is
//!   written.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::DrainReport;
use crate::vocab::phase::EventKind;
use crate::vocab::sync::MutexExt;

mod file;

use file::{rename, write_report_file, write_termination_log};

/// How long one sink may take: a log pipe nobody reads, a FIFO, a hung file system must not
/// keep the process from exiting.
pub(crate) const SINK_WAIT: Duration = Duration::from_secs(1);

/// How long a stderr line outside the report may take (the same bound as a sink).
pub(crate) const STDERR_WAIT: Duration = SINK_WAIT;

/// The least wait a sink gets when its deadline has already passed: one try, no more.
const LATE_SINK_WAIT: Duration = Duration::from_millis(20);

/// How often a non-blocking write to a full pipe is retried until its deadline.
const PIPE_RETRY: Duration = Duration::from_millis(5);

/// Set once a stderr write was given up: later writes are skipped instead of piling up threads
/// behind the same stalled pipe. Process-wide because stderr is.
static STDERR_STALLED: AtomicBool = AtomicBool::new(false);

/// The deadline for a step that may take `cap`: at most `cap` from now, at most `until`, and
/// at least a last try.
fn step_deadline(until: Instant, cap: Duration) -> Instant {
    let now = Instant::now();
    (now + cap).min(until).max(now + LATE_SINK_WAIT)
}

/// A write running on its own thread, and when it started.
struct PendingWrite(std::sync::mpsc::Receiver<std::io::Result<()>>, Instant);

impl PendingWrite {
    /// Starts `write` on a plain thread named `name`.
    fn start(
        name: &str,
        write: impl FnOnce() -> std::io::Result<()> + Send + 'static,
    ) -> Result<Self, String> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let started = Instant::now();
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                let _ = tx.send(write());
            })
            .map_err(|e| format!("cannot start the writer thread: {e}"))?;
        Ok(Self(rx, started))
    }

    /// Its result, or a timeout error once `deadline` has passed.
    fn wait(self, deadline: Instant) -> Result<(), Failure> {
        let wait = deadline.saturating_duration_since(Instant::now());
        match self.0.recv_timeout(wait) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(Failure::Failed(e.to_string())),
            Err(_) => Err(Failure::Stalled(format!(
                "the write did not finish within {} ms (is the reader stalled?)",
                deadline.saturating_duration_since(self.1).as_millis()
            ))),
        }
    }
}

/// Why a sink failed.
enum Failure {
    Failed(String),
    /// It did not finish in time: its thread may still be blocked.
    Stalled(String),
}

impl Failure {
    fn message(&self) -> &str {
        match self {
            Failure::Failed(m) | Failure::Stalled(m) => m,
        }
    }
}

/// Writes `text` to stderr from a plain thread and waits at most `wait` for it. A reader that
/// stalls the pipe leaves that thread blocked (the process exits past it), not the caller.
pub(crate) fn stderr_bounded(text: String, wait: Duration) -> Result<(), String> {
    // Relaxed: a stale `false` only costs one more bounded attempt.
    if STDERR_STALLED.load(Ordering::Relaxed) {
        return Err("stderr: skipped, an earlier write stalled".to_owned());
    }
    let pending = PendingWrite::start("lameduck-stderr", move || {
        let mut err = std::io::stderr().lock();
        err.write_all(text.as_bytes()).and_then(|()| err.flush())
    })
    .map_err(|e| format!("stderr: {e}"))?;
    match pending.wait(Instant::now() + wait) {
        Ok(()) => Ok(()),
        Err(Failure::Failed(e)) => Err(format!("stderr: {e}")),
        Err(Failure::Stalled(e)) => {
            STDERR_STALLED.store(true, Ordering::Relaxed);
            Err(format!("stderr: {e}"))
        }
    }
}

/// What one emission of the report achieved.
#[derive(Debug, Default)]
pub(crate) struct Emitted {
    /// The report file could not be written.
    pub(crate) file_failed: bool,
    /// Every failed sink, as `sink: why`.
    pub(crate) errors: Vec<String>,
}

impl Emitted {
    /// Records what the emission achieved in `report`: failed sinks, and exit code 1 (also in
    /// the `exit` event, if there is one) when the report file could not be written.
    pub(crate) fn apply_to(&self, report: &mut DrainReport) {
        if self.file_failed {
            report.exit_code = 1;
            if let Some(exit) = report
                .timeline
                .last_mut()
                .filter(|e| e.event == EventKind::Exit)
            {
                exit.code = Some(1);
            }
        }
        for e in &self.errors {
            if !report.sink_errors.contains(e) {
                report.sink_errors.push(e.clone());
            }
        }
    }
}

/// What the sinks remember between emissions.
#[derive(Debug, Default)]
struct SinkState {
    /// Errors already said on stderr.
    said: Mutex<Vec<String>>,
    /// The file (or the termination log) stalled once: later writes are skipped.
    file_stalled: AtomicBool,
    log_stalled: AtomicBool,
}

/// Where the report goes when the drain ends; see the [module docs](self).
#[derive(Clone, Debug)]
pub(crate) struct Sinks {
    pub(crate) stderr: bool,
    pub(crate) file: Option<PathBuf>,
    pub(crate) termination_log: Option<PathBuf>,
    state: Arc<SinkState>,
}

impl Default for Sinks {
    fn default() -> Self {
        Self {
            stderr: true,
            file: None,
            termination_log: Some("/dev/termination-log".into()),
            state: Arc::default(),
        }
    }
}

impl Sinks {
    /// Writes the report to every sink, by `until` (plus a last try for a sink whose turn
    /// comes later); `stderr` says whether this emission includes the stderr line (the last
    /// emission does). Failures are said on stderr, each once, and returned.
    ///
    /// Nothing here goes through tracing: a subscriber may write synchronously to the very
    /// stderr that stalls (the driver logs the report itself, before calling this).
    ///
    /// `json` is the report serialised once, for the log, the file and the stderr line (the
    /// stderr line serialises it again only when it must carry a failure of this write).
    pub(crate) fn emit(
        &self,
        report: &DrainReport,
        json: &str,
        stderr: bool,
        until: Instant,
    ) -> Emitted {
        let mut out = self.write_durable(report, json, until);
        self.write_stderr(report, json, stderr, until, &mut out);
        out
    }

    /// The file and the termination log, by `until` (or [`SINK_WAIT`]).
    fn write_durable(&self, report: &DrainReport, json: &str, until: Instant) -> Emitted {
        let mut out = Emitted::default();
        // The file and the termination log at the same time: one stalled does not starve the
        // other. Their threads give up by the same deadline the caller waits for.
        let first = step_deadline(until, SINK_WAIT);
        let file = self.file.as_ref().map(|path| {
            let text = format!("{json}\n");
            (path, self.start_file(path, text, first))
        });
        let log = self.termination_log.as_ref().map(|path| {
            let started = if self.state.log_stalled.load(Ordering::Relaxed) {
                Err(Failure::Failed(
                    "skipped, an earlier write stalled".to_owned(),
                ))
            } else {
                let (p, text) = (path.clone(), report.summary());
                PendingWrite::start("lameduck-termlog", move || {
                    write_termination_log(&p, &text, first)
                })
                .map_err(Failure::Failed)
            };
            (path, started)
        });
        if let Some((path, started)) = file {
            if let Err(e) = started.and_then(|p| p.wait(first)) {
                if matches!(e, Failure::Stalled(_)) {
                    self.state.file_stalled.store(true, Ordering::Relaxed);
                }
                out.file_failed = true;
                out.errors.push(format!(
                    "report file {}: {}; fix the path or the volume given to report_file",
                    path.display(),
                    e.message()
                ));
            }
        }
        if let Some((path, started)) = log {
            if let Err(e) = started.and_then(|p| p.wait(first)) {
                if matches!(e, Failure::Stalled(_)) {
                    self.state.log_stalled.store(true, Ordering::Relaxed);
                }
                out.errors.push(format!(
                    "termination log {}: {}",
                    path.display(),
                    e.message()
                ));
            }
        }
        out
    }

    /// The stderr line (when `stderr`) and each error not said before; a stalled stderr is
    /// named in a rewrite of the file, time permitting.
    fn write_stderr(
        &self,
        report: &DrainReport,
        json: &str,
        stderr: bool,
        until: Instant,
        out: &mut Emitted,
    ) {
        let mut text = String::new();
        if stderr && self.stderr {
            // The line says what the file and the log achieved: the exit code and the
            // errors it carries are the ones the process exits with.
            let mut r = report.clone();
            out.apply_to(&mut r);
            // One line for people reading the log, then one for tools.
            text.push_str(&r.headline());
            text.push('\n');
            if r == *report {
                text.push_str(json);
            } else {
                text.push_str(&r.to_json());
            }
            text.push('\n');
        }
        {
            let mut said = self.state.said.locked();
            for e in &out.errors {
                if !said.contains(e) {
                    let _ = writeln!(text, "lameduck: cannot write the drain report: {e}");
                    said.push(e.clone());
                }
            }
        }
        if !text.is_empty() {
            let wait = step_deadline(until, STDERR_WAIT).saturating_duration_since(Instant::now());
            if let Err(e) = stderr_bounded(text, wait) {
                // The file is the durable sink: rewrite it so it names the stalled stderr, if
                // there is time left (a rewrite cut halfway would only leave a temporary file).
                let time_left = Instant::now() + LATE_SINK_WAIT < until;
                if let (Some(path), false, true) = (&self.file, out.file_failed, time_left) {
                    let mut r = report.clone();
                    out.apply_to(&mut r);
                    r.sink_errors.push(e.clone());
                    let last = step_deadline(until, SINK_WAIT);
                    if let Ok(p) = self.start_file(path, format!("{}\n", r.to_json()), last) {
                        let _ = p.wait(last);
                    }
                }
                out.errors.push(e);
            }
        }
    }

    /// Starts writing the report file, unless it stalled before.
    fn start_file(
        &self,
        path: &Path,
        text: String,
        deadline: Instant,
    ) -> Result<PendingWrite, Failure> {
        if self.state.file_stalled.load(Ordering::Relaxed) {
            return Err(Failure::Failed(
                "skipped, an earlier write stalled".to_owned(),
            ));
        }
        let path = path.to_owned();
        PendingWrite::start("lameduck-report", move || {
            write_report_file(&path, &text, deadline, rename)
        })
        .map_err(Failure::Failed)
    }
}

/// The report as one INFO tracing event (target `lameduck::report`).
pub(crate) fn log_report(report: &DrainReport, json: &str) {
    tracing::info!(
        target: "lameduck::report",
        outcome = report.outcome.as_str(),
        exit_code = report.exit_code,
        used_ms = report.budget.used_ms,
        summary = %report.headline(),
        report = %json,
        "lameduck: drain report"
    );
}

#[cfg(all(test, unix))]
mod tests;
