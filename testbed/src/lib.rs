//! `lameduck-testbed`: the Kubernetes Pod termination path on the real kernel datapath.
//!
//! Network namespaces for a client, a node and every Pod (each replacement on a new IP); the
//! Service as kube-proxy writes it (iptables `statistic` ladder or nftables `numgen` map, DNAT,
//! applied atomically, a sync delay late); an EndpointSlice model with `ready` / `serving` /
//! `terminating` and the KEP-1669 fallback; kubelet's readiness probes, `preStop` hook, stop
//! signal and SIGKILL; rolling updates; retry-free clients from `lameduck-probe`. Conntrack
//! keeps established flows on their Pod, as on a real node. The example service runs as the
//! real server, in lameduck mode and as the baselines (`--naive`, `--fixed-sleep`).
//!
//! See the crate's README for what it models and what it does not, and `run.sh` for the one
//! command. Needs root, `ip`, `iptables-restore`, `nft` and `conntrack`.

#![forbid(unsafe_code)]

pub mod cell;
pub mod cluster;
pub mod k8s;
pub mod matrix;
pub mod net;
pub mod proxy;
pub mod real;
mod rollout;

pub use cell::{run_cell, CellConfig, CellResult, Rollout, Server, Shape, Stack};
pub use proxy::Backend;

/// For the test targets: the example service next to the running test binary
/// (`target/<profile>/examples/service`), built first with the workspace's own cargo
/// (`cargo build --workspace --examples --all-features`, the features `.ci/run` tests with,
/// a no-op after its `cargo test --workspace --all-features`), so `cargo test -p lameduck-testbed --test real` alone runs. `Err`
/// says why it could not be built.
pub fn test_service_bin() -> Result<std::path::PathBuf, String> {
    use std::sync::OnceLock;
    static BUILT: OnceLock<Result<std::path::PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            if let Ok(p) = std::env::var("LAMEDUCK_TESTBED_SERVICE") {
                return Ok(p.into());
            }
            // target/<profile>/deps/<test>-… → target/<profile>
            let exe = std::env::current_exe().map_err(|e| format!("test binary path: {e}"))?;
            let profile_dir = exe
                .parent()
                .and_then(std::path::Path::parent)
                .ok_or("the test binary is not under target/<profile>/deps")?;
            let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
                Some("debug") => "dev".to_owned(),
                Some(other) => other.to_owned(),
                None => return Err("no profile directory".into()),
            };
            let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .ok_or("no workspace above the testbed")?;
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let status = std::process::Command::new(&cargo)
                .current_dir(workspace)
                // `--workspace`: the feature unification of `cargo test --workspace
                // --all-features`, so that after it this is a no-op.
                .args([
                    "build",
                    "--quiet",
                    "--workspace",
                    "--examples",
                    "--bins",
                    "--all-features",
                ])
                .args(["--profile", &profile])
                .status()
                .map_err(|e| format!("`{cargo} build --examples`: {e}"))?;
            if !status.success() {
                return Err(format!("`{cargo} build --examples` failed ({status})"));
            }
            let bin = profile_dir.join("examples").join("service");
            if bin.is_file() {
                Ok(bin)
            } else {
                Err(format!(
                    "no service binary at {} after the build",
                    bin.display()
                ))
            }
        })
        .clone()
}
