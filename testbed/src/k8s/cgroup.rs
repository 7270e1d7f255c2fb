//! CPU limits through cgroups: the slow node's kube-proxy gets a tenth of a CPU.

use super::*;

/// A CPU quota on one process and the processes it starts (cgroup v2 `cpu.max`, or v1
/// `cpu.cfs_quota_us` where the `cpu` controller is mounted on its own): a busy node, for a
/// slow node's kube-proxy and the `iptables-restore` / `nft` it runs. The cgroup is removed
/// when this is dropped (once the process exited); [`sweep_cgroups`] removes those of killed
/// runs.
#[derive(Debug)]
pub struct CpuLimit {
    pub(super) dir: PathBuf,
}

/// Where the testbed's cgroups go: the v2 root when it has the `cpu` controller, else the v1
/// `cpu` hierarchy; with the file that sets a quota.
pub(super) fn cgroup_root() -> Result<(PathBuf, bool), NetError> {
    let v2 = Path::new("/sys/fs/cgroup");
    if std::fs::read_to_string(v2.join("cgroup.controllers")).is_ok_and(|c| c.contains("cpu")) {
        // Children get the controller only when the parent hands it down.
        let _ = std::fs::write(v2.join("cgroup.subtree_control"), "+cpu");
        return Ok((v2.to_owned(), true));
    }
    let v1 = Path::new("/sys/fs/cgroup/cpu");
    if v1.join("cpu.cfs_quota_us").is_file() {
        return Ok((v1.to_owned(), false));
    }
    Err(NetError(
        "a slow node needs the cgroup cpu controller (v2 cpu.max or v1 cpu.cfs_quota_us) and          neither is mounted"
            .into(),
    ))
}

impl CpuLimit {
    /// Puts `pid` in a new cgroup `ldtb<our pid>-<label>` with `share` of one CPU.
    pub fn apply(pid: u32, label: &str, share: f64) -> Result<CpuLimit, NetError> {
        let (root, v2) = cgroup_root()?;
        let dir = root.join(format!("{}{}-{label}", net::PREFIX, std::process::id()));
        let io = |what: &str, e: std::io::Error| NetError(format!("cgroup {what}: {e}"));
        std::fs::create_dir(&dir).map_err(|e| io(&dir.display().to_string(), e))?;
        let limit = CpuLimit { dir };
        let period = 100_000u64;
        let quota = ((share.clamp(0.01, 1.0) * period as f64) as u64).max(1000);
        if v2 {
            std::fs::write(limit.dir.join("cpu.max"), format!("{quota} {period}"))
                .map_err(|e| io("cpu.max", e))?;
        } else {
            std::fs::write(limit.dir.join("cpu.cfs_period_us"), period.to_string())
                .map_err(|e| io("cpu.cfs_period_us", e))?;
            std::fs::write(limit.dir.join("cpu.cfs_quota_us"), quota.to_string())
                .map_err(|e| io("cpu.cfs_quota_us", e))?;
        }
        std::fs::write(limit.dir.join("cgroup.procs"), pid.to_string())
            .map_err(|e| io("cgroup.procs", e))?;
        Ok(limit)
    }
}

impl Drop for CpuLimit {
    fn drop(&mut self) {
        for _ in 0..20 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

/// Removes the testbed's cgroups left by runs that were killed (their pid is gone).
pub fn sweep_cgroups() {
    let Ok((root, _)) = cgroup_root() else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(&root) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(net::PREFIX) else {
            continue;
        };
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if digits.parse::<u32>().is_ok_and(|pid| {
            pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists()
        }) {
            let _ = std::fs::remove_dir(e.path());
        }
    }
}
