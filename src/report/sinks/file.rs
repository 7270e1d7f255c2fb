//! Writing one file without blocking past a deadline: the report file replaced through an
//! exclusive temporary file (or in place), and the termination log.

use std::io::Write as _;
use std::path::{Component, Path, PathBuf};
use std::time::Instant;

use super::PIPE_RETRY;

pub(super) fn rename(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::rename(from, to)
}

/// The sinks that are links or devices by design, named in the errors that refuse the rest.
const SPECIAL: &str = "/dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N, /dev/termination-log";

/// `path` with `.`, `..` and repeated slashes resolved as text (`/dev/../etc/x` is `/etc/x`):
/// the path that is judged special or not is the path that is opened, whatever links the
/// directories on the way are.
pub(super) fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => match out.components().next_back() {
                Some(Component::Normal(_)) => {
                    out.pop();
                }
                // `/..` is `/`.
                Some(Component::RootDir | Component::Prefix(_)) => {}
                // A relative path's leading `..` stays.
                _ => out.push(".."),
            },
            other => out.push(other.as_os_str()),
        }
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

/// Whether `path` (resolved as text) is one of the sinks meant to be a link or a device:
/// the process's own output (`/dev/stdout`, `/dev/stderr`, `/dev/fd/N`, `/proc/self/fd/N`)
/// and Kubernetes' `/dev/termination-log`. Only these are followed and written whatever they
/// are. Any other path, under `/dev` or not, may be a link planted by whoever can write its
/// directory (`/dev/shm` is often an `emptyDir` shared with sidecars): it is never followed,
/// and a device there is nobody's report file.
fn special(path: &Path) -> bool {
    let Some(p) = path.to_str() else {
        return false;
    };
    let descriptor = |n: &str| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
    matches!(p, "/dev/stdout" | "/dev/stderr" | "/dev/termination-log")
        || p.strip_prefix("/dev/fd/").is_some_and(descriptor)
        || p.strip_prefix("/proc/self/fd/").is_some_and(descriptor)
}

/// Whether `path` must be written in place: a special sink that is a link or not a regular
/// file (`/dev/stderr` on a pipe or a log file), or any other path that is itself (not through
/// a link) neither a regular file nor a link (a FIFO; a device, refused when opened). A link
/// there is replaced like a regular file, never followed.
fn in_place(path: &Path) -> bool {
    if special(path) {
        let link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
        return link || std::fs::metadata(path).is_ok_and(|m| !m.is_file());
    }
    std::fs::symlink_metadata(path).is_ok_and(|m| !m.is_file() && !m.file_type().is_symlink())
}

/// Writes the report to `path`; see the [module docs](self). `rename` is
/// [`std::fs::rename`], or a stand-in for a test.
pub(super) fn write_report_file(
    path: &Path,
    contents: &str,
    until: Instant,
    rename: fn(&Path, &Path) -> std::io::Result<()>,
) -> std::io::Result<()> {
    use std::fs;
    let path = &lexical(path);
    if in_place(path) {
        return write_without_blocking(path, contents, until, Open::Append);
    }
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "the path names no file")
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let (tmp, mut f) = create_temporary(&dir, name).map_err(|e| if_a_link(path, e))?;
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

/// `e`, saying that `path` is a link that was not followed when it is one: a link to the
/// process's output written another way (`/proc/1/fd/1`) sits where no file can be created.
fn if_a_link(path: &Path, e: std::io::Error) -> std::io::Error {
    if !std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        return e;
    }
    std::io::Error::new(
        e.kind(),
        format!(
            "{e}: it is a symbolic link, replaced rather than followed (links are followed only \
             at {SPECIAL})"
        ),
    )
}

/// Creates `.<name>.<random>.tmp` in `dir`, exclusively: an existing file or symlink of that
/// name is never opened (`O_EXCL` does not follow a symlink), another name is drawn instead.
pub(super) fn create_temporary(
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

/// How [`write_without_blocking`] opens its file.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Open {
    /// Truncated first: the file holds this text only (the termination log).
    Truncate,
    /// At its end (`O_APPEND`): `/dev/stderr` or `/proc/self/fd/N` reaching a log file are
    /// a new open of that file, at offset 0 without it, over the log's first lines.
    Append,
}

/// Writes `contents` to an existing file in place without ever blocking past `until`: opened
/// with `O_NONBLOCK` (a FIFO without a reader fails at once), a full pipe retried until the
/// deadline. Unless `path` (resolved as text) is a [special](special) sink, a link is not
/// followed (`O_NOFOLLOW`, also against a link planted after the check) and only a regular
/// file or a FIFO is written: a device node there is nobody's report file.
fn write_without_blocking(
    path: &Path,
    contents: &str,
    until: Instant,
    open: Open,
) -> std::io::Result<()> {
    let system = special(path);
    let mut flags = os::NON_BLOCKING;
    if !system {
        flags |= os::NO_FOLLOW;
    }
    let mut options = std::fs::OpenOptions::new();
    match open {
        Open::Truncate => options.write(true).truncate(true),
        Open::Append => options.append(true),
    };
    let mut f = os::flags(&mut options, flags).open(path).map_err(|e| {
        if os::no_reader(&e, path) {
            std::io::Error::new(e.kind(), "no process reads the FIFO")
        } else if os::is_link(&e) {
            std::io::Error::new(
                e.kind(),
                format!(
                    "it is a symbolic link: not followed (links are followed only at {SPECIAL})"
                ),
            )
        } else {
            e
        }
    })?;
    if !system {
        let kind = f.metadata()?.file_type();
        if !kind.is_file() && !os::is_fifo(&kind) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "it is {}, not a regular file or a FIFO: not written (a device is written \
                     only at {SPECIAL}); name a file or a FIFO",
                    os::kind_name(&kind)
                ),
            ));
        }
    }
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
pub(super) mod os {
    use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};

    pub(in crate::report::sinks) const NO_FOLLOW: i32 = libc::O_NOFOLLOW;
    /// Also `O_NOCTTY`: a terminal given as the report file must not become ours.
    pub(in crate::report::sinks) const NON_BLOCKING: i32 = libc::O_NONBLOCK | libc::O_NOCTTY;

    pub(in crate::report::sinks) fn flags(
        o: &mut std::fs::OpenOptions,
        flags: i32,
    ) -> &mut std::fs::OpenOptions {
        o.custom_flags(flags)
    }

    /// Rename said the target is busy: a mount point.
    pub(in crate::report::sinks) fn is_busy(e: &std::io::Error) -> bool {
        e.raw_os_error() == Some(libc::EBUSY)
    }

    /// An `O_NOFOLLOW` open met a symbolic link.
    pub(in crate::report::sinks) fn is_link(e: &std::io::Error) -> bool {
        e.raw_os_error() == Some(libc::ELOOP)
    }

    pub(in crate::report::sinks) fn is_fifo(kind: &std::fs::FileType) -> bool {
        kind.is_fifo()
    }

    /// What a file that is neither regular nor a FIFO is, for an error message.
    pub(in crate::report::sinks) fn kind_name(kind: &std::fs::FileType) -> &'static str {
        if kind.is_block_device() {
            "a block device"
        } else if kind.is_char_device() {
            "a character device"
        } else if kind.is_socket() {
            "a socket"
        } else if kind.is_dir() {
            "a directory"
        } else {
            "neither a regular file nor a FIFO"
        }
    }

    /// A non-blocking open of a FIFO that nobody reads.
    pub(in crate::report::sinks) fn no_reader(e: &std::io::Error, path: &std::path::Path) -> bool {
        e.raw_os_error() == Some(libc::ENXIO)
            && std::fs::metadata(path).is_ok_and(|m| m.file_type().is_fifo())
    }
}

#[cfg(not(unix))]
pub(super) mod os {
    pub(in crate::report::sinks) const NO_FOLLOW: i32 = 0;
    pub(in crate::report::sinks) const NON_BLOCKING: i32 = 0;

    pub(in crate::report::sinks) fn flags(
        o: &mut std::fs::OpenOptions,
        _: i32,
    ) -> &mut std::fs::OpenOptions {
        o
    }

    pub(in crate::report::sinks) fn is_busy(e: &std::io::Error) -> bool {
        e.kind() == std::io::ErrorKind::ResourceBusy
    }

    pub(in crate::report::sinks) fn no_reader(_: &std::io::Error, _: &std::path::Path) -> bool {
        false
    }

    pub(in crate::report::sinks) fn is_link(_: &std::io::Error) -> bool {
        false
    }

    pub(in crate::report::sinks) fn is_fifo(_: &std::fs::FileType) -> bool {
        false
    }

    pub(in crate::report::sinks) fn kind_name(kind: &std::fs::FileType) -> &'static str {
        if kind.is_dir() {
            "a directory"
        } else {
            "neither a regular file nor a FIFO"
        }
    }
}

/// Writes the summary to the termination log if the path exists. Kubernetes creates
/// `/dev/termination-log` (a bind mount: written in place, it cannot be renamed over);
/// elsewhere it is missing and this is quiet.
pub(super) fn write_termination_log(
    path: &Path,
    summary: &str,
    until: Instant,
) -> std::io::Result<()> {
    match write_without_blocking(&lexical(path), summary, until, Open::Truncate) {
        // Outside Kubernetes the file is missing: nothing to write, nothing failed.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}
