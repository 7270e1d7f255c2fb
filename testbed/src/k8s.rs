//! The real control plane of the `real` mode, in a cell's node namespace: etcd,
//! kube-apiserver, kube-controller-manager and kube-proxy, the binaries `testbed/k8s/build.sh`
//! builds from Kubernetes' own source. Certificates, the ServiceAccount signing key, the
//! static tokens and the kubeconfigs are generated at start (openssl) in the cell's directory.
//! Dropping the [`ControlPlane`] kills every process it started.
//!
//! Who is who on the API (static tokens, RBAC and the Node authorizer on):
//!
//! | client | user | groups |
//! |---|---|---|
//! | the testbed as controller (Service, Pods, rollout) | `lameduck-testbed` | `system:masters` |
//! | the testbed as kubelet | `system:node:<node>` | `system:nodes` |
//! | kube-controller-manager | `system:kube-controller-manager` (each controller then uses its own ServiceAccount) | |
//! | kube-proxy | `system:kube-proxy` | |

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::net::{self, NetError, NODE_CLIENT_IP};
use crate::proxy::Backend;

mod cgroup;
mod observe;
mod pki;

pub use cgroup::*;
pub use observe::*;
pub use pki::*;

/// A kube client for `kubeconfig` (in the current thread's network namespace).
pub async fn client(kubeconfig: &Path) -> Result<kube::Client, NetError> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .map_err(|e| NetError(format!("kubeconfig: {e}")))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| NetError(format!("kubeconfig: {e}")))?;
    kube::Client::try_from(cfg).map_err(|e| NetError(format!("kube client: {e}")))
}

/// The (first) node's name on the API.
pub const NODE_NAME: &str = "testbed-node";

/// Node `k`'s (1-based) name on the API: `testbed-node`, `testbed-node2`, …
pub fn node_name(k: usize) -> String {
    if k <= 1 {
        NODE_NAME.to_owned()
    } else {
        format!("{NODE_NAME}{k}")
    }
}

/// Node `k`'s kube-proxy metrics address: 127.0.0.1 in node 1's namespace; the node's fabric
/// address for the others (the testbed scrapes them all from node 1).
pub fn proxy_metrics(k: usize) -> String {
    if k <= 1 {
        PROXY_METRICS.to_owned()
    } else {
        format!("{}:10249", net::Netns::fabric_ip(k))
    }
}
/// The Service IP range (`--service-cluster-ip-range`); the `kubernetes` Service gets `.1`.
pub const SERVICE_CIDR: &str = "198.18.96.0/20";
/// The `kubernetes` Service's ClusterIP (what `KUBERNETES_SERVICE_HOST` says in a Pod).
pub const KUBERNETES_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 96, 1);
/// kube-apiserver's secure port, on every address of the node namespace.
pub const API_PORT: u16 = 6443;
/// kube-proxy's metrics address in the node namespace.
pub const PROXY_METRICS: &str = "127.0.0.1:10249";
/// The ServiceAccount token issuer (also the default audience).
pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// Where the component binaries are: `LAMEDUCK_K8S_BIN`, else `/var/cache/lameduck-k8s/<v>`
/// with the version pinned in `testbed/k8s/go.mod`.
pub fn default_bin_dir() -> PathBuf {
    if let Ok(d) = std::env::var("LAMEDUCK_K8S_BIN") {
        return d.into();
    }
    PathBuf::from("/var/cache/lameduck-k8s").join(PINNED_VERSION)
}

/// The Kubernetes version `testbed/k8s/go.mod` pins (kept equal by a test).
pub const PINNED_VERSION: &str = "v1.36.3";

/// The `User-Agent` of kubelet's probes for the pinned version: `kube-probe/1.36`.
pub fn probe_user_agent() -> String {
    let minor = PINNED_VERSION
        .trim_start_matches("v1.")
        .split('.')
        .next()
        .unwrap_or("0");
    format!("kube-probe/1.{minor}")
}

/// kube-proxy's settings in the real mode.
#[derive(Debug, Clone)]
pub struct ProxySettings {
    /// `--proxy-mode`.
    pub backend: Backend,
    /// `--iptables-min-sync-period` / `--nftables-min-sync-period`: the rate limit between
    /// syncs (kube-proxy's default 1 s).
    pub min_sync_period: Duration,
    /// `--iptables-sync-period` / `--nftables-sync-period`: the periodic full resync
    /// (default 30 s).
    pub sync_period: Duration,
    /// A busy node: this share of one CPU for kube-proxy and the rule writers it runs
    /// ([`CpuLimit`]); `None`: unlimited.
    pub cpu_share: Option<f64>,
}

/// The component binaries, checked.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// The directory.
    pub dir: PathBuf,
}

impl Binaries {
    /// Checks that `dir` holds every component (`build.sh` makes them).
    pub fn find(dir: &Path) -> Result<Binaries, NetError> {
        let missing: Vec<&str> = COMPONENTS
            .iter()
            .copied()
            .filter(|b| !dir.join(b).is_file())
            .collect();
        if missing.is_empty() {
            Ok(Binaries {
                dir: dir.to_owned(),
            })
        } else {
            Err(NetError(format!(
                "no {} in {} (build them with `bash testbed/k8s/build.sh`, or set LAMEDUCK_K8S_BIN)",
                missing.join(", "),
                dir.display()
            )))
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

const COMPONENTS: [&str; 4] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-proxy",
];

/// The running control plane; dropping it kills its processes.
#[derive(Debug)]
pub struct ControlPlane {
    procs: Vec<(String, tokio::process::Child)>,
    /// The client files.
    pub creds: Credentials,
    dir: PathBuf,
    /// CPU quotas of slow nodes' kube-proxies, removed after their processes.
    limits: Vec<CpuLimit>,
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // kube-proxy first (it writes rules), the API server before its storage.
        for (_, child) in self.procs.iter_mut().rev() {
            if let Some(pid) = child.id() {
                net::pid_exited(pid);
            }
            let _ = child.start_kill();
        }
        // A cgroup can go once its processes are gone: reap them first.
        if !self.limits.is_empty() {
            for (_, child) in &mut self.procs {
                reap(child);
            }
        }
        self.limits.clear();
        // etcd's write-ahead log preallocates 64 MB and its database grows: ~120 MB a cell,
        // gigabytes over a test run, which once filled CI's disk. The cell's logs stay.
        if let Some((_, etcd)) = self.procs.iter_mut().find(|(n, _)| n == "etcd") {
            reap(etcd);
        }
        let _ = std::fs::remove_dir_all(self.dir.join("etcd"));
    }
}

/// Waits up to a second for a killed child to exit (and reaps it).
fn reap(child: &mut tokio::process::Child) {
    for _ in 0..50 {
        if !matches!(child.try_wait(), Ok(None)) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The first line of a component's log that says why it stopped: a Go panic's message or a
/// structured log entry at level panic/fatal (etcd), or a klog `F` line. A stack trace's last
/// 15 lines name only frames; this names the cause (e.g. "no space left on device").
fn first_fatal_line(log: &str) -> Option<&str> {
    log.lines().find(|l| {
        l.starts_with("panic: ")
            || l.contains("\"level\":\"panic\"")
            || l.contains("\"level\":\"fatal\"")
            || (l.starts_with('F') && l.as_bytes().get(1).is_some_and(u8::is_ascii_digit))
    })
}

impl ControlPlane {
    /// Generates the PKI and starts etcd, kube-apiserver and kube-controller-manager in
    /// namespace `node_ns`; waits until the API answers `/readyz`. kube-proxy comes later
    /// ([`ControlPlane::start_proxy`]), once the Node is registered.
    pub async fn start(bins: &Binaries, node_ns: &str, dir: &Path) -> Result<Self, NetError> {
        let (creds, pki) = pki(dir)?;
        let mut cp = ControlPlane {
            procs: Vec::new(),
            creds,
            dir: dir.to_owned(),
            limits: Vec::new(),
        };
        let p = |name: &str| pki.join(name).display().to_string();
        let etcd_dir = dir.join("etcd");
        // A cell directory used before (the same --out) must not hand its old cluster on.
        let _ = std::fs::remove_dir_all(&etcd_dir);
        cp.spawn(
            bins,
            node_ns,
            "etcd",
            &[
                "--name=testbed".into(),
                format!("--data-dir={}", etcd_dir.display()),
                "--listen-client-urls=http://127.0.0.1:2379".into(),
                "--advertise-client-urls=http://127.0.0.1:2379".into(),
                "--listen-peer-urls=http://127.0.0.1:2380".into(),
                "--initial-advertise-peer-urls=http://127.0.0.1:2380".into(),
                "--initial-cluster=testbed=http://127.0.0.1:2380".into(),
                // The data is thrown away with the cell; fsync on a shared CI disk would only
                // add noise to every write's latency.
                "--unsafe-no-fsync".into(),
                "--log-level=warn".into(),
            ],
        )?;
        cp.spawn(
            bins,
            node_ns,
            "kube-apiserver",
            &[
                "--etcd-servers=http://127.0.0.1:2379".into(),
                "--bind-address=0.0.0.0".into(),
                format!("--secure-port={API_PORT}"),
                format!("--advertise-address={NODE_CLIENT_IP}"),
                format!("--tls-cert-file={}", p("apiserver.crt")),
                format!("--tls-private-key-file={}", p("apiserver.key")),
                format!("--token-auth-file={}", p("tokens.csv")),
                "--authorization-mode=Node,RBAC".into(),
                "--enable-admission-plugins=NodeRestriction".into(),
                format!("--service-cluster-ip-range={SERVICE_CIDR}"),
                format!("--service-account-issuer={ISSUER}"),
                format!("--service-account-key-file={}", p("sa.pub")),
                format!("--service-account-signing-key-file={}", p("sa.key")),
                "--profiling=false".into(),
                "--v=1".into(),
            ],
        )?;
        let admin = client(&cp.creds.admin_kubeconfig).await?;
        cp.wait_api(&admin, Duration::from_secs(120)).await?;
        cp.spawn(
            bins,
            node_ns,
            "kube-controller-manager",
            &[
                format!("--kubeconfig={}", p("kcm.kubeconfig")),
                // The EndpointSlice controller under test; ServiceAccounts and their tokens,
                // and the CA ConfigMap, for the Pods' projected credentials; the Deployment
                // and ReplicaSet controllers for `--deployment` cells.
                "--controllers=endpointslice,serviceaccount,serviceaccount-token,root-ca-cert-publisher,deployment,replicaset".into(),
                "--use-service-account-credentials=true".into(),
                format!("--service-account-private-key-file={}", p("sa.key")),
                format!("--root-ca-file={}", p("ca.crt")),
                "--leader-elect=false".into(),
                "--secure-port=0".into(),
                "--v=1".into(),
            ],
        )?;
        Ok(cp)
    }

    /// Starts node `k`'s (1-based) kube-proxy (the real binary) in `node_ns` with
    /// `settings`, and waits until its metrics answer.
    pub async fn start_proxy(
        &mut self,
        bins: &Binaries,
        k: usize,
        node_ns: &str,
        settings: &ProxySettings,
    ) -> Result<(), NetError> {
        let limit_label = format!("kube-proxy-node{k}");
        let metrics = proxy_metrics(k);
        let config = self.proxy_config(k, settings, &metrics);
        let label = if k <= 1 {
            "kube-proxy".to_owned()
        } else {
            format!("kube-proxy-node{k}")
        };
        let path = self.dir.join(format!("{label}.config.json"));
        write(&path, &config.to_string())?;
        self.spawn_as(
            bins,
            node_ns,
            "kube-proxy",
            &label,
            &[format!("--config={}", path.display()), "--v=2".into()],
        )?;
        if let Some(share) = settings.cpu_share {
            let pid = self
                .procs
                .last()
                .and_then(|(_, c)| c.id())
                .ok_or_else(|| NetError(format!("{label} exited at once")))?;
            self.limits.push(CpuLimit::apply(pid, &limit_label, share)?);
        }
        // A slow node's first sync writes every Service's rules at its CPU share.
        let limit = Duration::from_secs(if settings.cpu_share.is_some() {
            180
        } else {
            60
        });
        let give_up = tokio::time::Instant::now() + limit;
        loop {
            if let Ok(text) = http_text(&metrics, "/metrics").await {
                if text.contains("kubeproxy_sync_proxy_rules_last_timestamp_seconds") {
                    return Ok(());
                }
            }
            self.check_alive()?;
            if tokio::time::Instant::now() > give_up {
                return Err(NetError(format!(
                    "{label}'s metrics did not answer in {limit:?}: see {}",
                    self.dir.join(format!("{label}.log")).display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Node `k`'s kube-proxy configuration (`KubeProxyConfiguration`) with `settings`,
    /// serving its metrics on `metrics`.
    fn proxy_config(&self, k: usize, settings: &ProxySettings, metrics: &str) -> serde_json::Value {
        let mode = settings.backend.as_str();
        let ms = |d: Duration| format!("{}ms", d.as_millis());
        let sync = serde_json::json!({
            "minSyncPeriod": ms(settings.min_sync_period),
            "syncPeriod": ms(settings.sync_period),
        });
        // The configuration file: the nftables mode's sync settings have no flags.
        serde_json::json!({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {
                "kubeconfig": self.dir.join("pki").join(if k <= 1 {
                    "proxy.kubeconfig"
                } else {
                    "proxy-remote.kubeconfig"
                }),
            },
            "hostnameOverride": node_name(k),
            "bindAddress": net::client_link(k).0.to_string(),
            "healthzBindAddress": "127.0.0.1:10256",
            "metricsBindAddress": metrics,
            "mode": mode,
            "iptables": sync,
            "nftables": sync,
            // Conntrack limits are host-wide: leave them alone.
            "conntrack": {"maxPerCore": 0},
        })
    }

    fn spawn(
        &mut self,
        bins: &Binaries,
        node_ns: &str,
        name: &str,
        args: &[String],
    ) -> Result<(), NetError> {
        self.spawn_as(bins, node_ns, name, name, args)
    }

    /// Starts binary `name` as `label` (its log `label.log`).
    fn spawn_as(
        &mut self,
        bins: &Binaries,
        node_ns: &str,
        name: &str,
        label: &str,
        args: &[String],
    ) -> Result<(), NetError> {
        let log_path = self.dir.join(format!("{label}.log"));
        let log = std::fs::File::create(&log_path)
            .map_err(|e| NetError(format!("{}: {e}", log_path.display())))?;
        let log2 = log
            .try_clone()
            .map_err(|e| NetError(format!("{}: {e}", log_path.display())))?;
        let child = tokio::process::Command::new("ip")
            .args(["netns", "exec", node_ns])
            .arg(bins.path(name))
            .args(args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| NetError(format!("start {name}: {e}")))?;
        if let Some(pid) = child.id() {
            net::pid_started(pid);
        }
        self.procs.push((label.to_owned(), child));
        Ok(())
    }

    /// `Err` naming the first component that exited, with the end of its log.
    pub fn check_alive(&mut self) -> Result<(), NetError> {
        for (name, child) in &mut self.procs {
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(self.dir.join(format!("{name}.log")))
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                return Err(NetError(format!(
                    "{name} exited ({status}){}; the end of its log:\n{}",
                    first_fatal_line(&log)
                        .map(|l| format!(", first fatal line: {l}"))
                        .unwrap_or_default(),
                    tail.join("\n")
                )));
            }
        }
        Ok(())
    }

    /// Waits until `/readyz` answers `ok`, through the testbed's own client (CA checked).
    async fn wait_api(&mut self, client: &kube::Client, limit: Duration) -> Result<(), NetError> {
        let give_up = tokio::time::Instant::now() + limit;
        loop {
            let req = http::Request::get("/readyz")
                .body(Vec::new())
                .map_err(|e| NetError(format!("readyz request: {e}")))?;
            if client
                .request_text(req)
                .await
                .is_ok_and(|body| body.trim() == "ok")
            {
                return Ok(());
            }
            self.check_alive()?;
            if tokio::time::Instant::now() > give_up {
                return Err(NetError(format!(
                    "kube-apiserver not ready in {limit:?}: see {}",
                    self.dir.join("kube-apiserver.log").display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

#[cfg(test)]
mod tests;
