use super::file::{create_temporary, os};
use super::*;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lameduck-report-{name}-{}", std::process::id()));
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

/// A FIFO at `path` and its read end, open without blocking (the writer's open needs a reader).
fn fifo_with_reader(path: &Path) -> std::fs::File {
    use std::os::unix::fs::OpenOptionsExt as _;
    assert!(std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap()
        .success());
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .unwrap()
}

#[test]
fn a_symlink_at_the_report_path_to_a_fifo_or_a_device_is_replaced_not_followed() {
    use std::io::Read as _;
    let dir = scratch("planted-link");
    // What an attacker with write access to the directory plants: links to a FIFO somebody
    // reads, and to a device.
    let fifo = dir.join("elsewhere.fifo");
    let mut reader = fifo_with_reader(&fifo);
    for target in [fifo.as_path(), Path::new("/dev/null")] {
        let path = dir.join("report.json");
        let _ = std::fs::remove_file(&path);
        std::os::unix::fs::symlink(target, &path).unwrap();
        write_report_file(&path, "report\n", soon(), rename).unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(
            meta.is_file(),
            "{target:?}: the link was followed: {meta:?}"
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "report\n");
    }
    let mut got = Vec::new();
    match reader.read_to_end(&mut got) {
        Ok(_) => {}
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}"),
    }
    assert!(
        got.is_empty(),
        "the FIFO got {:?}",
        String::from_utf8_lossy(&got)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_report_through_a_link_to_a_log_file_is_appended_not_written_over_its_start() {
    use std::io::Write as _;
    use std::os::fd::AsRawFd as _;
    let dir = scratch("append");
    let log_path = dir.join("service.log");
    // The process's stderr appended to a log file (`2>>service.log`), many lines already.
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .unwrap();
    let mut before = String::new();
    for i in 0..200 {
        before.push_str(&format!("log line {i}\n"));
    }
    log.write_all(before.as_bytes()).unwrap();
    // `/dev/stderr` is `/proc/self/fd/2`: the same road to the same file.
    let path = PathBuf::from(format!("/proc/self/fd/{}", log.as_raw_fd()));
    write_report_file(&path, "{\"outcome\":\"clean\"}\n", soon(), rename).unwrap();
    let after = std::fs::read_to_string(&log_path).unwrap();
    assert_eq!(after, format!("{before}{{\"outcome\":\"clean\"}}\n"));
    drop(log);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A directory under `/dev/shm` (world-writable, often an `emptyDir` shared with sidecars), or
/// `None` where there is none (said on stderr; the `/dev/..` test below runs everywhere).
fn dev_shm_scratch(name: &str) -> Option<PathBuf> {
    let dir = Path::new("/dev/shm").join(format!("lameduck-report-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    match std::fs::create_dir_all(&dir) {
        Ok(()) => Some(dir),
        Err(e) => {
            eprintln!("SKIPPED the /dev/shm case: {e}");
            None
        }
    }
}

#[test]
fn a_link_planted_under_dev_or_reached_through_dev_dotdot_is_not_followed() {
    let dir = scratch("dev-link");
    let victim = dir.join("victim");
    let mut cases = Vec::new();
    let shm = dev_shm_scratch("link");
    if let Some(shm) = &shm {
        cases.push((shm.join("report.json"), shm.join("report.json")));
    }
    // Written `/dev/../<dir>/report.json`: `/dev` as text, the scratch directory in fact.
    let relative_to_root = dir.strip_prefix("/").unwrap();
    cases.push((
        Path::new("/dev/..")
            .join(relative_to_root)
            .join("report.json"),
        dir.join("report.json"),
    ));
    for (path, real) in cases {
        std::fs::write(&victim, "precious\n").unwrap();
        let _ = std::fs::remove_file(&real);
        // Planted by whoever can write the directory: a link to a file of theirs choosing.
        std::os::unix::fs::symlink(&victim, &real).unwrap();
        write_report_file(&path, "report\n", soon(), rename).unwrap();
        assert_eq!(
            std::fs::read_to_string(&victim).unwrap(),
            "precious\n",
            "{path:?}: the link was followed"
        );
        let meta = std::fs::symlink_metadata(&real).unwrap();
        assert!(
            meta.is_file(),
            "{path:?}: the link is still there: {meta:?}"
        );
        assert_eq!(std::fs::read_to_string(&real).unwrap(), "report\n");
    }
    if let Some(shm) = shm {
        std::fs::remove_dir_all(shm).unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_device_is_written_only_as_one_of_the_special_sinks() {
    // `/dev/null` stands for any device (a block device would be written at offset 0): not a
    // report file, written to or not. Nothing is written, and the error says why.
    for path in ["/dev/null", "/dev/./null", "/dev/shm/../null"] {
        let err = write_report_file(Path::new(path), "report\n", soon(), rename).unwrap_err();
        let why = err.to_string();
        assert!(
            why.contains("a character device") && why.contains("/dev/stderr"),
            "{path}: {why}"
        );
        let meta = std::fs::symlink_metadata("/dev/null").unwrap();
        assert!(!meta.is_file(), "/dev/null was replaced: {meta:?}");
    }
    // The special sinks are followed and written in place: `/dev/fd/N` is `/proc/self/fd/N`.
    let dir = scratch("special");
    let log_path = dir.join("service.log");
    let log = std::fs::File::create(&log_path).unwrap();
    use std::os::fd::AsRawFd as _;
    for path in [
        format!("/dev/fd/{}", log.as_raw_fd()),
        format!("/dev/../proc/self/fd/{}", log.as_raw_fd()),
    ] {
        write_report_file(Path::new(&path), "line\n", soon(), rename).unwrap();
    }
    assert_eq!(std::fs::read_to_string(&log_path).unwrap(), "line\nline\n");
    // The same descriptor named another way is not one of them: not followed, and said so.
    let other = format!("/proc/{}/fd/{}", std::process::id(), log.as_raw_fd());
    let why = write_report_file(Path::new(&other), "line\n", soon(), rename)
        .unwrap_err()
        .to_string();
    assert!(
        why.contains("symbolic link") && why.contains("/proc/self/fd/N"),
        "{why}"
    );
    assert_eq!(std::fs::read_to_string(&log_path).unwrap(), "line\nline\n");
    drop(log);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_path_is_resolved_as_text_before_it_is_judged() {
    use super::file::lexical;
    for (given, judged) in [
        ("/dev/../etc/x", "/etc/x"),
        ("/dev/./stderr", "/dev/stderr"),
        ("//dev//stderr", "/dev/stderr"),
        ("/../dev/stdout", "/dev/stdout"),
        ("/dev/shm/a/../../../proc/self/fd/2", "/proc/self/fd/2"),
        ("/dev/shm/../stderr", "/dev/stderr"),
        ("report.json", "report.json"),
        ("./a/../report.json", "report.json"),
        ("../report.json", "../report.json"),
    ] {
        assert_eq!(lexical(Path::new(given)), Path::new(judged), "{given}");
    }
}
