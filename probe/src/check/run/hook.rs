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
use crate::check::{process, HookEnd, PreStop};

/// Whether a hook can have told the service to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reach {
    /// httpGet: kubelet GETs the Pod, so the service saw it.
    Told,
    /// exec: a command that may call the service (a preStop client, `curl`) or tell it nothing
    /// (`sleep 5`); what the service did settles which ([`super::told`]).
    Unknown,
    /// sleep: the service is told nothing.
    Nothing,
}

/// What a hook did.
#[derive(Debug)]
pub(super) struct Ran {
    text: String,
    reach: Reach,
    /// How it ended, for the `prestop` contract (`None` for a sleep: nothing to judge).
    ended: Option<HookEnd>,
    /// An exec hook's process group, held only to be SIGKILLed when this is dropped.
    _group: Option<HookGroup>,
}

impl Ran {
    fn new(text: String, reach: Reach) -> Self {
        Ran {
            text,
            reach,
            ended: None,
            _group: None,
        }
    }

    /// How it ended, for the judge.
    pub(super) fn ended(&self) -> Option<HookEnd> {
        self.ended.clone()
    }

    /// How it ended.
    pub(super) fn text(&self) -> &str {
        &self.text
    }

    /// Whether it can have told the service.
    pub(super) fn reach(&self) -> Reach {
        self.reach
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
            Ran::new(format!("slept {d:?}"), Reach::Nothing)
        }
        PreStop::Http(text) => {
            let url = url.expect("parsed with the args");
            let (said, ended) = match http::get(url, &[], left).await {
                Ok(status) => (status.to_string(), HookEnd::Answered(status)),
                Err(e) => (e.clone(), HookEnd::NoAnswer(e)),
            };
            // A refused call (401, 404) or none at all told the service nothing: it learns
            // of the stop from the signal. A 5xx (lameduck's 504 when `?timeout=` passes
            // with the drain going on) was taken.
            let reach = match ended {
                HookEnd::Answered(s) if (200..300).contains(&s) || s >= 500 => Reach::Told,
                _ => Reach::Nothing,
            };
            let mut ran = Ran::new(format!("GET {text}: {said}"), reach);
            ran.ended = Some(ended);
            ran
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
        Err(e) => {
            let mut ran = Ran::new(format!("sh -c {cmd:?}: {e}"), Reach::Nothing);
            ran.ended = Some(HookEnd::NoAnswer(e.to_string()));
            return ran;
        }
    };
    // Taken before the wait: the group outlives its leader.
    let group = child.id().map(|pid| HookGroup(Pid::from_raw(pid as i32)));
    let (text, ended) = match tokio::time::timeout(left, child.wait()).await {
        Ok(Ok(status)) => (
            format!("sh -c {cmd:?}: {status}"),
            HookEnd::Exited(status.code()),
        ),
        Ok(Err(e)) => (
            format!("sh -c {cmd:?}: {e}"),
            HookEnd::NoAnswer(e.to_string()),
        ),
        Err(_) => (
            format!("sh -c {cmd:?}: still running at the grace period"),
            HookEnd::OutOfTime,
        ),
    };
    Ran {
        text,
        reach: Reach::Unknown,
        ended: Some(ended),
        _group: group,
    }
}
