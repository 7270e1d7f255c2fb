//! The control-plane model that runs in the node namespace: Pods (real service processes in
//! their own namespaces), kubelet (readiness probes, `preStop`, stop signal, SIGKILL at the
//! grace period), the EndpointSlice (published `slice_delay` after each Pod change) and
//! kube-proxy (syncs `sync_delay` ± jitter after each slice change). Every step is recorded
//! with its unix time in milliseconds.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{watch, Notify};

use crate::net::{NetError, Netns, ADMIN_PORT, POD_PORT};
use crate::proxy::{self, Backend, Endpoint, Proxy};

mod kubelet;
mod proxies;

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The `preStop` hook kubelet runs before the stop signal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PreStop {
    /// No hook.
    None,
    /// `httpGet` on the admin port, this path (e.g. `/drain?wait=drained`).
    HttpGet(String),
    /// `exec`: the service binary's `prestop --admin ADDR` inside the Pod's namespace.
    Exec,
    /// `sleep` for this long (the fixed-sleep recipe).
    Sleep(Duration),
}

/// kubelet settings.
#[derive(Debug, Clone)]
pub struct Kubelet {
    /// Readiness probe period.
    pub period: Duration,
    /// Readiness probe timeout.
    pub timeout: Duration,
    /// Consecutive failures that make the Pod not Ready.
    pub failure_threshold: u32,
    /// Consecutive successes that make it Ready.
    pub success_threshold: u32,
    /// The hook.
    pub pre_stop: PreStop,
    /// From the Pod's creation (its IP) to its process starting.
    pub start_delay: Duration,
    /// The stop signal (default SIGTERM).
    pub stop_signal: nix::sys::signal::Signal,
    /// `terminationGracePeriodSeconds`, counted from the deletion, hook included.
    pub grace: Duration,
}

/// The service process: binary and the mode flags after `--listen/--admin/--instance`.
#[derive(Debug, Clone)]
pub struct ServerCmd {
    /// The example service binary (`examples/baseline` for the baselines).
    pub bin: PathBuf,
    /// Extra flags (`--naive`, `--fixed-sleep 0`, `--grace-period 15s`, ...).
    pub flags: Vec<String>,
}

/// One node's kube-proxy timing in the model.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct NodeSync {
    /// From a slice change to the rules that apply it (`sync_delay`).
    pub delay: Duration,
    /// Its syncs take `delay` (the rules of thousands of Services): it writes the slice it
    /// read when the sync began.
    pub slow: bool,
}

/// Timing of the EndpointSlice and kube-proxy models.
#[derive(Debug, Clone, Serialize)]
pub struct ControlPlane {
    /// From a Pod change to the slice that shows it.
    pub slice_delay: Duration,
    /// Per node (node 1 first, one per node of the namespaces): its kube-proxy's timing.
    pub nodes: Vec<NodeSync>,
    /// Jitter on `sync_delay`, ± this fraction (0.2 = ±20 %).
    pub sync_jitter: f64,
    /// `true`: `sync_delay` is kube-proxy's `minSyncPeriod` as its sync runner applies it
    /// since 1.36 (at least that long from the end of one sync to the start of the next,
    /// changes in between coalesced; a change after a quiet spell syncs at once), no jitter.
    /// `false`: each change is applied `sync_delay` ± jitter after it.
    pub min_sync_period: bool,
    /// `publishNotReadyAddresses`: `ready` stays true.
    pub publish_not_ready: bool,
    /// Rule backend.
    pub backend: Backend,
}

/// One recorded step.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// Unix time, ms.
    pub unix_ms: u64,
    /// `created`, `ready`, `not_ready`, `deleted`, `prestop_returned`, `signal`, `killed`,
    /// `exit`, `slice`, `sync`.
    pub what: String,
    /// The Pod it is about, when one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The node whose kube-proxy synced (`node1`, `node2`, …), on `sync` events of a cell with
    /// more than one node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Details: the slice's endpoints, the rules' endpoints, the exit status.
    pub detail: String,
}

#[derive(Debug)]
struct PodState {
    name: String,
    ip: Ipv4Addr,
    /// The readiness probe's verdict.
    ready: bool,
    deleted_ms: Option<u64>,
    exited_ms: Option<u64>,
    pid: Option<u32>,
}

/// The shared state of one cell's cluster.
#[derive(Debug)]
pub struct Cluster {
    state: Mutex<Vec<PodState>>,
    events: Mutex<Vec<Event>>,
    pod_changed: Notify,
    slice: watch::Sender<Vec<Endpoint>>,
    /// Per node (index 0 is node 1): what its rules route to.
    applied: Vec<watch::Sender<Vec<Ipv4Addr>>>,
    /// Settings.
    pub plane: ControlPlane,
    /// kubelet settings.
    pub kubelet: Kubelet,
    server: ServerCmd,
    dir: PathBuf,
    netns: Mutex<Netns>,
    next_pod: Mutex<u8>,
    rng: Mutex<u64>,
    deleters: Mutex<Vec<(String, watch::Sender<bool>)>>,
}

impl Cluster {
    /// A cluster over `netns`, writing Pod logs and reports under `dir`.
    pub fn new(
        netns: Netns,
        plane: ControlPlane,
        kubelet: Kubelet,
        server: ServerCmd,
        dir: PathBuf,
    ) -> Arc<Cluster> {
        let nodes = netns.nodes();
        Arc::new(Cluster {
            state: Mutex::new(Vec::new()),
            events: Mutex::new(Vec::new()),
            pod_changed: Notify::new(),
            slice: watch::channel(Vec::new()).0,
            applied: (0..nodes).map(|_| watch::channel(Vec::new()).0).collect(),
            plane,
            kubelet,
            server,
            dir,
            netns: Mutex::new(netns),
            next_pod: Mutex::new(1),
            rng: Mutex::new(unix_ms() | 1),
            deleters: Mutex::new(Vec::new()),
        })
    }

    /// Deletes every node's conntrack entries towards the Service that were never DNATed
    /// ([`crate::net::forget_unrouted`]: the first endpoint's switch-over can leave some), and
    /// records how many: the clients' requests count from here on.
    pub fn forget_unrouted(&self) -> Result<(), NetError> {
        let n = self.netns.lock().unwrap().forget_unrouted()?;
        self.record(
            "unrouted_forgotten",
            None,
            format!("{n} conntrack entries towards the VIP that were never DNATed"),
        );
        Ok(())
    }

    /// Records a step.
    pub fn record(&self, what: &str, pod: Option<&str>, detail: impl Into<String>) {
        self.events.lock().unwrap().push(Event {
            unix_ms: unix_ms(),
            what: what.to_owned(),
            pod: pod.map(str::to_owned),
            node: None,
            detail: detail.into(),
        });
    }

    /// How many nodes (each with its kube-proxy).
    pub fn nodes(&self) -> usize {
        self.applied.len()
    }

    /// Every step recorded so far.
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }

    /// Where the cell writes its files.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    fn jitter(&self) -> f64 {
        let mut x = self.rng.lock().unwrap();
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        (*x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }

    fn endpoints(&self) -> Vec<Endpoint> {
        let pnr = self.plane.publish_not_ready;
        self.state
            .lock()
            .unwrap()
            .iter()
            .filter(|p| p.exited_ms.is_none())
            .map(|p| {
                let terminating = p.deleted_ms.is_some();
                Endpoint {
                    pod: p.name.clone(),
                    ip: p.ip,
                    ready: pnr || (p.ready && !terminating),
                    serving: p.ready,
                    terminating,
                }
            })
            .collect()
    }

    /// `true` when Pod `name` passed its readiness probe and is not being deleted.
    pub fn available(&self, name: &str) -> bool {
        self.state
            .lock()
            .unwrap()
            .iter()
            .any(|p| p.name == name && p.ready && p.deleted_ms.is_none())
    }

    /// `true` when Pod `name` has exited.
    pub fn exited(&self, name: &str) -> bool {
        self.state
            .lock()
            .unwrap()
            .iter()
            .any(|p| p.name == name && p.exited_ms.is_some())
    }
}

impl crate::rollout::Stack for Arc<Cluster> {
    const SETTLE: Duration = Duration::from_secs(30);
    const TAIL: Duration = Duration::from_secs(5);

    /// New Pods each get a new IP; their names come from the cluster's own count.
    fn pods(&self, _first_new: usize) -> impl crate::rollout::Pods + '_ {
        Arc::clone(self)
    }

    fn gone(&self, name: &str) -> bool {
        self.exited(name)
    }

    async fn wait_applied(&self, pods: &[String]) {
        Cluster::wait_applied(self, pods).await
    }

    fn forget_unrouted(&self) -> Result<(), NetError> {
        Cluster::forget_unrouted(self)
    }

    fn record(&self, what: &str, pod: Option<&str>, detail: &str) {
        Cluster::record(self, what, pod, detail)
    }

    fn logs_hint(&self) -> String {
        "see the pod logs".to_owned()
    }
}

impl crate::rollout::Pods for Arc<Cluster> {
    fn available(&self, name: &str) -> bool {
        Cluster::available(self, name)
    }

    async fn create(&self, _index: usize) -> Result<String, NetError> {
        self.create_pod()
    }

    async fn delete(&self, name: &str) -> Result<(), NetError> {
        Cluster::delete(self, name);
        Ok(())
    }

    async fn changed(&self) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `GET path` with kubelet's `User-Agent`, status code back.
pub async fn http_get(addr: SocketAddr, path: &str, timeout: Duration) -> Result<u16, String> {
    http_get_as(addr, path, timeout, "kube-probe/1.31").await
}

/// `GET path` with `User-Agent: user_agent`, status code back.
pub async fn http_get_as(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
    user_agent: &str,
) -> Result<u16, String> {
    let work = async {
        let mut s = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: {user_agent}\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        s.write_all(req.as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut buf = Vec::with_capacity(512);
        let mut chunk = [0u8; 512];
        while !buf.windows(2).any(|w| w == b"\r\n") && buf.len() < 4096 {
            let n = s.read(&mut chunk).await.map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        let line = String::from_utf8_lossy(&buf);
        line.split_whitespace()
            .nth(1)
            .and_then(|c| c.parse::<u16>().ok())
            .ok_or_else(|| format!("no status line in {:?}", line.lines().next().unwrap_or("")))
    };
    tokio::time::timeout(timeout, work)
        .await
        .unwrap_or_else(|_| Err(format!("timeout after {timeout:?}")))
}
