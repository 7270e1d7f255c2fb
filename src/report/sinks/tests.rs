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
