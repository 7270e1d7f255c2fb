//! Commands on the host and in namespaces, the preflight, and the registry of what the
//! testbed created (namespaces, processes) so that it is removed also on failure.

use super::*;

/// Runs a program to completion; the error carries its stderr.
pub fn run(program: &str, args: &[&str]) -> Result<String, NetError> {
    run_stdin(program, args, None)
}

/// Runs a program with `stdin` as its input.
pub fn run_stdin(program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, NetError> {
    use std::io::Write;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .stdin(if stdin.is_some() {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        });
    let mut child = cmd
        .spawn()
        .map_err(|e| NetError(format!("cannot run {program}: {e}")))?;
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("piped stdin");
        pipe.write_all(input.as_bytes())
            .map_err(|e| NetError(format!("{program}: writing its input: {e}")))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| NetError(format!("{program}: {e}")))?;
    if !out.status.success() {
        return Err(NetError(format!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `args` inside namespace `ns` (`ip netns exec`).
pub fn run_in(ns: &str, args: &[&str], stdin: Option<&str>) -> Result<String, NetError> {
    let mut all = vec!["netns", "exec", ns];
    all.extend_from_slice(args);
    run_stdin("ip", &all, stdin)
}

/// Deletes, in namespace `ns`, conntrack's entries for TCP flows to `vip` that were not
/// DNATed (their answer would come from the VIP itself); returns how many.
///
/// A Service going from no endpoint to its first is written by kube-proxy in one
/// `iptables-restore` whose tables commit one after the other: a SYN sent between the filter
/// table's commit (the REJECT gone) and the nat table's (the DNAT there) leaves un-NATed
/// towards the VIP, answered by nobody, and conntrack keeps its entry (`SYN_SENT`,
/// `[UNREPLIED]`) for 120 s. A later connection whose source port wraps around to that entry's
/// matches it and is never DNATed: a connect timeout that has nothing to do with any drain
/// (seen on the testbed with clients that run from before the first Pod is ready: the ports
/// wrapped in about 35 s).
pub fn forget_unrouted(ns: &str, vip: std::net::Ipv4Addr) -> Result<u64, NetError> {
    let vip = vip.to_string();
    let args = [
        "netns",
        "exec",
        ns,
        "conntrack",
        "-D",
        "-p",
        "tcp",
        "--orig-dst",
        &vip,
        "--reply-src",
        &vip,
    ];
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| NetError(format!("cannot run ip: {e}")))?;
    // Exit status 1 with "0 flow entries have been deleted" when there were none.
    let text = String::from_utf8_lossy(&out.stderr);
    let deleted = text
        .split_whitespace()
        .zip(text.split_whitespace().skip(1))
        .find(|(_, next)| *next == "flow")
        .and_then(|(n, _)| n.parse::<u64>().ok());
    match deleted {
        Some(n) if text.contains("have been deleted") => Ok(n),
        _ => Err(NetError(format!(
            "`ip {}` failed ({}): {}",
            args.join(" "),
            out.status,
            text.trim()
        ))),
    }
}

/// What the testbed needs on this machine: root, `ip`, `iptables-restore`, `nft`, `conntrack`.
/// `Err` names what is missing.
pub fn preflight() -> Result<(), NetError> {
    if !nix::unistd::geteuid().is_root() {
        return Err(NetError(
            "the testbed needs root (network namespaces, iptables, nft): run it as root".into(),
        ));
    }
    let mut missing = Vec::new();
    for (tool, args) in [
        ("ip", &["-V"][..]),
        ("iptables-restore", &["--version"][..]),
        ("nft", &["--version"][..]),
        ("conntrack", &["--version"][..]),
    ] {
        if run(tool, args).is_err() {
            missing.push(tool);
        }
    }
    if !missing.is_empty() {
        return Err(NetError(format!(
            "missing tools: {} (install iproute2, iptables, nftables, conntrack)",
            missing.join(", ")
        )));
    }
    Ok(())
}

/// Every namespace this process created and has not removed yet, for the signal handler.
pub(super) static LIVE: Mutex<Vec<String>> = Mutex::new(Vec::new());
pub(super) static NEXT_SET: AtomicU32 = AtomicU32::new(1);
/// Every Pod process still running, for the signal handler.
pub(super) static PIDS: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// Registers a running Pod process (so a signal handler can kill it).
pub fn pid_started(pid: u32) {
    PIDS.lock().unwrap_or_else(|e| e.into_inner()).push(pid);
}

/// Forgets a Pod process that exited.
pub fn pid_exited(pid: u32) {
    PIDS.lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|p| *p != pid);
}

/// Kills every Pod process still running and removes every namespace this process created
/// and still holds (for a signal handler).
pub fn remove_all_live() {
    let pids: Vec<u32> = std::mem::take(&mut *PIDS.lock().unwrap_or_else(|e| e.into_inner()));
    for pid in pids {
        if let Ok(pid) = i32::try_from(pid) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    let names: Vec<String> = std::mem::take(&mut *LIVE.lock().unwrap_or_else(|e| e.into_inner()));
    for name in names {
        let _ = run("ip", &["netns", "delete", &name]);
    }
}

/// Removes namespaces named `ldtb<pid>-…` whose process no longer exists (left by a run that
/// was killed). Returns the names removed.
pub fn sweep_stale() -> Vec<String> {
    let Ok(list) = run("ip", &["netns", "list"]) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for line in list.lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let Ok(pid) = digits.parse::<u32>() else {
            continue;
        };
        if pid != std::process::id()
            && !std::path::Path::new(&format!("/proc/{pid}")).exists()
            && run("ip", &["netns", "delete", name]).is_ok()
        {
            removed.push(name.to_owned());
        }
    }
    removed
}
