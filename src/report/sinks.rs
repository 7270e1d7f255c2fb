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
//! * A file that is not a regular file (a FIFO, `/dev/stderr`, a device), a link under `/dev`
//!   and anything under `/proc` are written in place and without blocking: opened with `O_NONBLOCK` (a
//!   FIFO with no reader fails at once instead of waiting for one), then written until the
//!   deadline.
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
use crate::phase::EventKind;
use crate::sync::MutexExt;

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
struct Pending(std::sync::mpsc::Receiver<std::io::Result<()>>, Instant);

impl Pending {
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
    let pending = Pending::start("lameduck-stderr", move || {
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
    pub(crate) fn emit(&self, report: &DrainReport, stderr: bool, until: Instant) -> Emitted {
        let mut out = Emitted::default();
        // The file and the termination log at the same time: one stalled does not starve the
        // other. Their threads give up by the same deadline the caller waits for.
        let first = step_deadline(until, SINK_WAIT);
        let file = self.file.as_ref().map(|path| {
            let text = format!("{}\n", report.to_json());
            (path, self.start_file(path, text, first))
        });
        let log = self.termination_log.as_ref().map(|path| {
            let started = if self.state.log_stalled.load(Ordering::Relaxed) {
                Err(Failure::Failed(
                    "skipped, an earlier write stalled".to_owned(),
                ))
            } else {
                let (p, text) = (path.clone(), report.summary());
                Pending::start("lameduck-termlog", move || {
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
        let mut text = String::new();
        if stderr && self.stderr {
            // The line says what the file and the log achieved: the exit code and the
            // errors it carries are the ones the process exits with.
            let mut r = report.clone();
            out.apply_to(&mut r);
            text.push_str(&r.to_json());
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
        out
    }

    /// Starts writing the report file, unless it stalled before.
    fn start_file(&self, path: &Path, text: String, deadline: Instant) -> Result<Pending, Failure> {
        if self.state.file_stalled.load(Ordering::Relaxed) {
            return Err(Failure::Failed(
                "skipped, an earlier write stalled".to_owned(),
            ));
        }
        let path = path.to_owned();
        Pending::start("lameduck-report", move || {
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
        report = %json,
        "lameduck: drain report"
    );
}

fn rename(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::rename(from, to)
}

/// Whether `path` must be written in place: it exists and is not a regular file (a FIFO, a
/// device, `/dev/stderr` on a pipe), or it is a link under `/dev` (`/dev/stdout` to a file)
/// or anything under `/proc`, where renaming over the link would replace it.
fn in_place(path: &Path) -> bool {
    let link_in_dev = path.starts_with("/dev")
        && std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    link_in_dev || path.starts_with("/proc") || std::fs::metadata(path).is_ok_and(|m| !m.is_file())
}

/// Writes the report to `path`; see the [module docs](self). `rename` is
/// [`std::fs::rename`], or a stand-in for a test.
fn write_report_file(
    path: &Path,
    contents: &str,
    until: Instant,
    rename: fn(&Path, &Path) -> std::io::Result<()>,
) -> std::io::Result<()> {
    use std::fs;
    if in_place(path) {
        return write_without_blocking(path, contents, until, false);
    }
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "the path names no file")
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let (tmp, mut f) = create_temporary(&dir, name)?;
    let written = f
        .write_all(contents.as_bytes())
        .and_then(|()| f.sync_all())
        .and_then(|()| rename(&tmp, path));
    drop(f);
    match written {
        Ok(()) => {}
        // A bind mount (a Kubernetes `subPath` file mount) cannot be renamed over: write it
        // in place. Not atomic, but the only way the report reaches that volume.
        Err(e) if os::is_busy(&e) => {
            let _ = fs::remove_file(&tmp);
            let mut f = os::flags(
                fs::OpenOptions::new().write(true).truncate(true),
                os::NO_FOLLOW | os::NON_BLOCKING,
            )
            .open(path)?;
            f.write_all(contents.as_bytes())?;
            return f.sync_all();
        }
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
    }
    // The rename is durable once the directory is synced; some file systems cannot sync a
    // directory, and the report is in place either way.
    if let Ok(d) = fs::File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Creates `.<name>.<random>.tmp` in `dir`, exclusively: an existing file or symlink of that
/// name is never opened (`O_EXCL` does not follow a symlink), another name is drawn instead.
fn create_temporary(
    dir: &Path,
    name: &std::ffi::OsStr,
) -> std::io::Result<(PathBuf, std::fs::File)> {
    use std::hash::BuildHasher as _;
    let mut last = None;
    for attempt in 0u32..8 {
        // A hasher with the process's random keys over the time and the attempt: nobody
        // outside can predict the name (the process id alone is 1 in a container).
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let random = std::hash::RandomState::new().hash_one((nanos, attempt, std::process::id()));
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".{random:016x}.tmp"));
        let tmp = dir.join(tmp_name);
        match os::flags(
            std::fs::OpenOptions::new().write(true).create_new(true),
            os::NO_FOLLOW,
        )
        .open(&tmp)
        {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no temporary name was free")))
}

/// Writes `contents` to an existing file in place without ever blocking past `until`: opened
/// with `O_NONBLOCK` (a FIFO without a reader fails at once), a full pipe retried until the
/// deadline.
fn write_without_blocking(
    path: &Path,
    contents: &str,
    until: Instant,
    truncate: bool,
) -> std::io::Result<()> {
    let mut f = os::flags(
        std::fs::OpenOptions::new().write(true).truncate(truncate),
        os::NON_BLOCKING,
    )
    .open(path)
    .map_err(|e| {
        if os::no_reader(&e, path) {
            std::io::Error::new(e.kind(), "no process reads the FIFO")
        } else {
            e
        }
    })?;
    let mut rest = contents.as_bytes();
    while !rest.is_empty() {
        match f.write(rest) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= until {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                            "the reader did not take the report in time ({} of {} bytes written; is it stalled?)",
                            contents.len() - rest.len(),
                            contents.len()
                        ),
                    ));
                }
                std::thread::sleep(PIPE_RETRY);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Open flags, where the platform has them.
#[cfg(unix)]
mod os {
    use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};

    pub(super) const NO_FOLLOW: i32 = libc::O_NOFOLLOW;
    /// Also `O_NOCTTY`: a terminal given as the report file must not become ours.
    pub(super) const NON_BLOCKING: i32 = libc::O_NONBLOCK | libc::O_NOCTTY;

    pub(super) fn flags(o: &mut std::fs::OpenOptions, flags: i32) -> &mut std::fs::OpenOptions {
        o.custom_flags(flags)
    }

    /// Rename said the target is busy: a mount point.
    pub(super) fn is_busy(e: &std::io::Error) -> bool {
        e.raw_os_error() == Some(libc::EBUSY)
    }

    /// A non-blocking open of a FIFO that nobody reads.
    pub(super) fn no_reader(e: &std::io::Error, path: &std::path::Path) -> bool {
        e.raw_os_error() == Some(libc::ENXIO)
            && std::fs::metadata(path).is_ok_and(|m| m.file_type().is_fifo())
    }
}

#[cfg(not(unix))]
mod os {
    pub(super) const NO_FOLLOW: i32 = 0;
    pub(super) const NON_BLOCKING: i32 = 0;

    pub(super) fn flags(o: &mut std::fs::OpenOptions, _: i32) -> &mut std::fs::OpenOptions {
        o
    }

    pub(super) fn is_busy(e: &std::io::Error) -> bool {
        e.kind() == std::io::ErrorKind::ResourceBusy
    }

    pub(super) fn no_reader(_: &std::io::Error, _: &std::path::Path) -> bool {
        false
    }
}

/// Writes the summary to the termination log if the path exists. Kubernetes creates
/// `/dev/termination-log` (a bind mount: written in place, it cannot be renamed over);
/// elsewhere it is missing and this is quiet.
fn write_termination_log(path: &Path, summary: &str, until: Instant) -> std::io::Result<()> {
    match write_without_blocking(path, summary, until, true) {
        // Outside Kubernetes the file is missing: nothing to write, nothing failed.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("lameduck-report-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    fn names(dir: &Path) -> Vec<std::ffi::OsString> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn the_report_file_is_replaced_whole_and_leaves_no_temporary_file() {
        let dir = scratch("whole");
        let path = dir.join("report.json");
        std::fs::write(&path, "previous\n").unwrap();
        write_report_file(&path, "new\n", soon(), rename).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new\n");
        assert_eq!(names(&dir), [std::ffi::OsString::from("report.json")]);
        let missing = dir.join("missing").join("r.json");
        let err = write_report_file(&missing, "x", soon(), rename).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_temporary_file_is_never_opened_through_a_symlink() {
        let dir = scratch("symlink");
        let victim = dir.join("victim");
        std::fs::write(&victim, "precious\n").unwrap();
        // Whatever name is drawn, an existing entry (here a symlink) is refused, not followed.
        let link = dir.join(".report.json.planted.tmp");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let err = os::flags(
            std::fs::OpenOptions::new().write(true).create_new(true),
            os::NO_FOLLOW,
        )
        .open(&link)
        .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists);
        // Two draws give two names: nobody can plant one ahead.
        let (a, fa) = create_temporary(&dir, "report.json".as_ref()).unwrap();
        let (b, fb) = create_temporary(&dir, "report.json".as_ref()).unwrap();
        assert_ne!(a, b);
        drop((fa, fb));
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_target_that_cannot_be_renamed_over_is_written_in_place() {
        let dir = scratch("busy");
        let path = dir.join("report.json");
        std::fs::write(&path, "a much longer previous report\n").unwrap();
        // What rename says when the target is a mount point (a `subPath` file mount).
        fn busy(_: &Path, _: &Path) -> std::io::Result<()> {
            Err(std::io::Error::from_raw_os_error(libc::EBUSY))
        }
        write_report_file(&path, "new\n", soon(), busy).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new\n");
        assert_eq!(names(&dir), [std::ffi::OsString::from("report.json")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_fifo_without_a_reader_fails_at_once() {
        let dir = scratch("fifo");
        let path = dir.join("report.fifo");
        assert!(std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .unwrap()
            .success());
        let start = Instant::now();
        let err = write_report_file(&path, "x\n", soon(), rename).unwrap_err();
        assert!(start.elapsed() < SINK_WAIT, "{:?}", start.elapsed());
        assert_eq!(err.to_string(), "no process reads the FIFO");
        // Still the FIFO: written in place, never renamed over.
        use std::os::unix::fs::FileTypeExt as _;
        assert!(std::fs::metadata(&path).unwrap().file_type().is_fifo());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
