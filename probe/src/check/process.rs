//! The service under check: started (optionally as PID 1 of a new PID namespace), its output
//! kept (bounded), its signal disposition read from `/proc`, signalled and reaped.
//!
//! Invariants: the command runs in a process group of its own, and the group is SIGKILLed
//! when the [`Service`] is dropped, so nothing it started outlives the check. A check that
//! ends without a drop (SIGKILL) takes the command with it: its parent-death signal is
//! SIGKILL ([`die_with_check`]). In a PID
//! namespace, `unshare --kill-child` also takes the namespace down with `unshare`. A process
//! that leaves the group (`setsid`, a double fork) still carries the environment cookie
//! [`COOKIE`]`=<checker pid>-<n>` the command was started with: [`Service::kill`] and the drop
//! SIGKILL every process of ours whose `/proc/<pid>/environ` holds it (what Jenkins does with
//! `BUILD_ID`). Only a process that re-executes itself with a scrubbed environment escapes.
//!
//! Output is read in bounded pieces and kept bounded in bytes after its conversion to text
//! ([`lines`]).

use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};

mod lines;

pub(crate) use lines::Output;
/// The environment variable that marks every process a check started.
pub(crate) const COOKIE: &str = "LAMEDUCK_PROBE_CHECK";
/// Rounds of the cookie sweep: a process that forks while it is swept is found in the next.
const SWEEPS: usize = 5;

/// How the signalled process treats the stop signal, from `/proc/<pid>/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Disposition {
    /// The process's name (`Name:`).
    pub name: String,
    /// Its pid as the checker sees it.
    pub pid: u32,
    /// `true` when it is PID 1 of its PID namespace (last `NSpid:` field).
    pub pid1: bool,
    /// The signal is in `SigCgt`: a handler is installed.
    pub caught: bool,
    /// The signal is in `SigIgn`.
    pub ignored: bool,
    /// The signal is in `SigBlk` (blocked by the main thread).
    pub blocked: bool,
}

/// How the service ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitView {
    /// Its exit code, when it exited.
    pub code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// `true` when the checker SIGKILLed it at the grace period.
    pub killed_at_grace: bool,
}

/// A started service.
#[derive(Debug)]
pub(crate) struct Service {
    child: Child,
    /// The process the stop signal goes to: the command itself, or PID 1 of the namespace.
    target: u32,
    pgid: Pid,
    output: Arc<Mutex<Output>>,
    /// `COOKIE=value` as it appears in `/proc/<pid>/environ`.
    cookie: String,
}

impl Service {
    /// Starts `command`; with `pid_namespace` as PID 1 of a new PID namespace (`unshare --pid
    /// --fork`: root, or unprivileged user namespaces, which are then used).
    pub(crate) async fn spawn(command: &[String], pid_namespace: bool) -> Result<Service, String> {
        let (program, args) = command
            .split_first()
            .ok_or_else(|| "no command given after --".to_owned())?;
        let mut cmd = if pid_namespace {
            let mut c = Command::new("unshare");
            if !nix::unistd::geteuid().is_root() {
                // Without root a PID namespace needs a user namespace of its own.
                c.args(["--user", "--map-root-user"]);
            }
            c.args(["--pid", "--fork", "--kill-child", "--"])
                .arg(program);
            c
        } else {
            Command::new(program)
        };
        // Unique per run in this process: two checks in one test binary sweep only their own.
        static RUNS: AtomicU64 = AtomicU64::new(0);
        let value = format!(
            "{}-{}",
            std::process::id(),
            RUNS.fetch_add(1, Ordering::Relaxed)
        );
        cmd.env(COOKIE, &value);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        die_with_check(&mut cmd);
        let mut child = cmd.spawn().map_err(|e| {
            if pid_namespace {
                format!("cannot start unshare (util-linux) for --pid-namespace: {e}")
            } else {
                format!("cannot start {program:?}: {e}")
            }
        })?;
        let pid = child
            .id()
            .ok_or_else(|| "the command exited at once".to_owned())?;
        let output = Arc::new(Mutex::new(Output::default()));
        if let Some(out) = child.stdout.take() {
            tokio::spawn(lines::keep_lines(out, None));
        }
        if let Some(err) = child.stderr.take() {
            tokio::spawn(lines::keep_lines(err, Some(output.clone())));
        }
        let target = if pid_namespace {
            namespace_init(pid).await.ok_or_else(|| {
                "unshare did not start the command in a new PID namespace (it needs root or \
                 unprivileged user namespaces)"
                    .to_owned()
            })?
        } else {
            pid
        };
        Ok(Service {
            child,
            target,
            pgid: Pid::from_raw(pid as i32),
            output,
            cookie: format!("{COOKIE}={value}"),
        })
    }

    /// The pid the stop signal goes to.
    pub(crate) fn target(&self) -> u32 {
        self.target
    }

    pub(crate) fn output(&self) -> Arc<Mutex<Output>> {
        self.output.clone()
    }

    /// `Some` once the command has exited.
    pub(crate) fn try_exit(&mut self) -> Option<ExitView> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(view(status, false)),
            _ => None,
        }
    }

    /// Waits for the exit until `deadline`; then SIGKILLs the process (and its group) and
    /// reaps it.
    pub(crate) async fn wait_or_kill(&mut self, deadline: tokio::time::Instant) -> ExitView {
        match tokio::time::timeout_at(deadline, self.child.wait()).await {
            Ok(Ok(status)) => view(status, false),
            Ok(Err(_)) | Err(_) => {
                self.kill();
                let status = self.child.wait().await;
                match status {
                    Ok(status) => view(status, true),
                    Err(_) => ExitView {
                        code: None,
                        signal: Some(Signal::SIGKILL as i32),
                        killed_at_grace: true,
                    },
                }
            }
        }
    }

    /// Sends `sig` to the target process.
    pub(crate) fn signal(&self, sig: Signal) -> Result<(), String> {
        signal::kill(Pid::from_raw(self.target as i32), sig)
            .map_err(|e| format!("kill -{} {}: {e}", sig.as_str(), self.target))
    }

    /// SIGKILL to the target, the whole process group and every process that carries the
    /// run's cookie. Returns the processes found outside the group (`pid N (name)`): what
    /// the service left running.
    pub(crate) fn kill(&self) -> Vec<String> {
        let _ = signal::kill(Pid::from_raw(self.target as i32), Signal::SIGKILL);
        let _ = signal::killpg(self.pgid, Signal::SIGKILL);
        sweep(&self.cookie, self.pgid)
    }
}

/// Makes the process `cmd` starts get SIGKILL when the thread that starts it ends: the check
/// killed by SIGKILL, or by a signal it does not handle, runs no drop, and a CI timeout must
/// not leave the service holding its ports. That thread is the one that runs the check to its
/// end (`block_on` in the binary).
// `pre_exec` is the crate's one unsafe call (lib.rs denies the rest): no dependency sets a
// parent-death signal on a child; nix's safe `set_pdeathsig` must run in the child itself.
#[allow(unsafe_code)]
pub(crate) fn die_with_check(cmd: &mut Command) {
    let check = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child before exec, where only async-signal-safe
    // calls may be made: prctl and getppid are plain system calls, and the errors are built
    // from an errno without allocating.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            // The check may have died before the prctl: no signal would come then.
            if nix::unistd::getppid() != check {
                return Err(std::io::Error::from_raw_os_error(nix::libc::ESRCH));
            }
            Ok(())
        });
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        // Whatever the command started (a shell's children, a daemon) goes with it, also when
        // the check itself fails.
        let _ = signal::killpg(self.pgid, Signal::SIGKILL);
        sweep(&self.cookie, self.pgid);
    }
}

/// SIGKILLs every process whose environment holds `cookie` (`NAME=value`), round after round
/// until a round finds none. Returns those that were not in process group `pgid`.
fn sweep(cookie: &str, pgid: Pid) -> Vec<String> {
    let me = std::process::id();
    let mut outside = Vec::new();
    for _ in 0..SWEEPS {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            break;
        };
        let mut found = false;
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if pid == me || !carries(pid, cookie) {
                continue;
            }
            let p = Pid::from_raw(pid as i32);
            // A zombie still shows its environment until reaped: killing it again is harmless,
            // but it is not "left running".
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            if field(&status, "State:").is_some_and(|s| s.starts_with('Z')) {
                continue;
            }
            found = true;
            let outside_group = pgrp(pid).is_some_and(|g| g != pgid.as_raw());
            let _ = signal::kill(p, Signal::SIGKILL);
            if outside_group {
                let name = field(&status, "Name:").unwrap_or("?");
                let line = format!("pid {pid} ({name})");
                if !outside.contains(&line) {
                    outside.push(line);
                }
            }
        }
        if !found {
            break;
        }
    }
    outside
}

/// The process group of `pid`, from `/proc/<pid>/stat` (the field after the state; the name
/// before it may hold spaces and parentheses, so it is skipped to its last `)`).
fn pgrp(pid: u32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(2)?.parse().ok()
}

/// `true` when `/proc/<pid>/environ` holds `cookie` as one whole entry. Another user's
/// process is unreadable, so never ours.
fn carries(pid: u32, cookie: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/environ"))
        .is_ok_and(|env| env.split(|&b| b == 0).any(|e| e == cookie.as_bytes()))
}

fn view(status: std::process::ExitStatus, killed: bool) -> ExitView {
    ExitView {
        code: status.code(),
        signal: status.signal(),
        killed_at_grace: killed,
    }
}

/// PID 1 of the namespace `unshare` (pid `parent`) created: its only child.
async fn namespace_init(parent: u32) -> Option<u32> {
    for _ in 0..100 {
        if let Some(pid) = first_child(parent) {
            return Some(pid);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

fn first_child(parent: u32) -> Option<u32> {
    let path = format!("/proc/{parent}/task/{parent}/children");
    if let Ok(text) = std::fs::read_to_string(path) {
        return text.split_whitespace().next()?.parse().ok();
    }
    // Kernels without the children file: scan for the parent pid.
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
        if field(&status, "PPid:") == Some(parent.to_string().as_str()) {
            return Some(pid);
        }
    }
    None
}

fn field<'a>(status: &'a str, name: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .map(str::trim)
}

/// Reads how process `pid` treats `sig` (Linux `/proc`); `Err` says why it could not.
pub(crate) fn disposition(pid: u32, sig: Signal) -> Result<Disposition, String> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {path}: {e}"))?;
    parse_disposition(&status, pid, sig as i32)
}

pub(crate) fn parse_disposition(status: &str, pid: u32, sig: i32) -> Result<Disposition, String> {
    let bit = |name: &str| -> Result<bool, String> {
        let hex = field(status, name).ok_or_else(|| format!("no {name} line"))?;
        let mask = u64::from_str_radix(hex, 16).map_err(|e| format!("{name} {hex:?}: {e}"))?;
        Ok(mask >> (sig - 1) & 1 == 1)
    };
    Ok(Disposition {
        name: field(status, "Name:").unwrap_or("?").to_owned(),
        pid,
        pid1: field(status, "NSpid:")
            .and_then(|l| l.split_whitespace().last())
            .is_some_and(|p| p == "1"),
        caught: bit("SigCgt:")?,
        ignored: bit("SigIgn:")?,
        blocked: bit("SigBlk:")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_sigterm_from_the_masks() {
        let status = "Name:\tsh\nNSpid:\t4242\t1\nSigBlk:\t0000000000000000\n\
                      SigIgn:\t0000000000000004\nSigCgt:\t0000000000010002\n";
        let d = parse_disposition(status, 4242, 15).unwrap();
        assert!(!d.caught && !d.ignored && d.pid1, "{d:?}");
        let d = parse_disposition(status, 4242, 2).unwrap();
        assert!(d.caught, "SIGINT is bit 1 of SigCgt: {d:?}");
        let d = parse_disposition(status, 4242, 3).unwrap();
        assert!(d.ignored, "SIGQUIT is bit 2 of SigIgn: {d:?}");
        let d = parse_disposition(status, 4242, 17).unwrap();
        assert!(d.caught, "SIGCHLD is bit 16: {d:?}");
    }
}
