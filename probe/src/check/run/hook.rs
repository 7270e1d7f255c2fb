//! The `preStop` hook: httpGet, exec or sleep, bounded by the grace period.
//!
//! An exec hook runs `sh -c` in a process group of its own, with the service's parent-death
//! signal: what it starts in the background lives on while the service does (as in a
//! container, whose end takes an exec's processes with it), and its group is SIGKILLed when
//! the [`Ran`] is dropped — at the end of the stop, or when the check is interrupted.

use std::process::Stdio;

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

use crate::check::http::{self, Url};
use crate::check::{process, PreStop};

/// What a hook did.
#[derive(Debug)]
pub(super) struct Ran {
    text: String,
    informs: bool,
    /// An exec hook's process group, held only to be SIGKILLed when this is dropped.
    _group: Option<HookGroup>,
}

impl Ran {
    fn new(text: String, informs: bool) -> Self {
        Ran {
            text,
            informs,
            _group: None,
        }
    }

    /// How it ended.
    pub(super) fn text(&self) -> &str {
        &self.text
    }

    /// Whether it can have told the service (httpGet and exec can, sleep cannot).
    pub(super) fn informs(&self) -> bool {
        self.informs
    }
}

/// The process group of an exec hook: everything the hook started, unless it left the group.
/// Not `Clone`: the group is killed once, by its one owner.
#[derive(Debug)]
struct HookGroup(Pid);

impl Drop for HookGroup {
    fn drop(&mut self) {
        let _ = signal::killpg(self.0, Signal::SIGKILL);
    }
}

/// The hook's kind as Kubernetes names it.
pub(super) fn name(hook: &PreStop) -> &'static str {
    match hook {
        PreStop::Http(_) => "httpGet",
        PreStop::Exec(_) => "exec",
        PreStop::Sleep(_) => "sleep",
    }
}

/// Runs the hook until it ends or the grace period is over.
pub(super) async fn run(hook: &PreStop, url: Option<&Url>, kill_at: tokio::time::Instant) -> Ran {
    let left = kill_at.saturating_duration_since(tokio::time::Instant::now());
    match hook {
        PreStop::Sleep(d) => {
            tokio::time::sleep((*d).min(left)).await;
            Ran::new(format!("slept {d:?}"), false)
        }
        PreStop::Http(text) => {
            let url = url.expect("parsed with the args");
            match http::get(url, &[], left).await {
                Ok(status) => Ran::new(format!("GET {text}: {status}"), true),
                Err(e) => Ran::new(format!("GET {text}: {e}"), true),
            }
        }
        PreStop::Exec(cmd) => exec(cmd, left).await,
    }
}

async fn exec(cmd: &str, left: std::time::Duration) -> Ran {
    let mut command = tokio::process::Command::new("sh");
    command
        .args(["-c", cmd])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(true);
    process::die_with_check(&mut command);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => return Ran::new(format!("sh -c {cmd:?}: {e}"), true),
    };
    // Taken before the wait: the group outlives its leader.
    let group = child.id().map(|pid| HookGroup(Pid::from_raw(pid as i32)));
    let text = match tokio::time::timeout(left, child.wait()).await {
        Ok(Ok(status)) => format!("sh -c {cmd:?}: {status}"),
        Ok(Err(e)) => format!("sh -c {cmd:?}: {e}"),
        Err(_) => format!("sh -c {cmd:?}: still running at the grace period"),
    };
    Ran {
        text,
        informs: true,
        _group: group,
    }
}
