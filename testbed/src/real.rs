//! The `real` mode: one cell on Kubernetes' own components ([`crate::k8s`]) with the testbed
//! playing the two parts that have no runtime here, both through the real API:
//!
//! - **kubelet** (identity `system:node:testbed-node`): registers the Node, watches the Pods
//!   bound to it, gives each its own network namespace and a new IP, starts the container's
//!   process (the example service) with the Pod's environment (downward API fields,
//!   `KUBERNETES_SERVICE_HOST/PORT`) and its projected ServiceAccount volume (token requested
//!   through the API, `ca.crt` from `kube-root-ca.crt`, `namespace`), runs the Pod's readiness
//!   probe as kubelet sends it (`User-Agent: kube-probe/<major>.<minor>`) and reports `podIP`
//!   and the `Ready` condition in the Pod's status. On a deletion: the `preStop` hook from the
//!   Pod's spec (httpGet, exec, sleep), SIGTERM, SIGKILL at the deletion's grace period, the
//!   terminal status, and the Pod object's removal once the process has exited.
//! - **Deployment controller** (identity `system:masters`): creates the replacement Pods and
//!   deletes the old ones through the API with maxSurge 1, maxUnavailable 0, reading
//!   availability from the API.
//!
//! What the table shows comes from the API's watch (the deletion, every EndpointSlice change)
//! and kube-proxy's own metrics (`kubeproxy_sync_proxy_rules_last_timestamp_seconds` and the
//! network-programming latency), each sync checked against the rules kube-proxy wrote.

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Container, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::watcher;
use serde_json::json;
use tokio::sync::{watch, Notify};

use crate::cluster::{unix_ms, Event, PreStop};
use crate::k8s::{self, client, Binaries, ControlPlane, ProxyMetrics, ProxySettings, NODE_NAME};
use crate::net::{self, NetError, Netns, NODE_CLIENT_IP, SERVICE_PORT, SERVICE_VIP};
use crate::proxy::Backend;

mod controller;

pub(crate) use controller::RealStack;
mod kubelet;
mod watchers;

/// The namespace of the cell's Service and Pods.
pub const NAMESPACE: &str = "default";
/// The Service's name.
pub const SERVICE: &str = "lameduck-testbed";
/// The label that selects the Pods.
pub const APP: &str = "lameduck-testbed";

fn err<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> NetError + '_ {
    move |e| NetError(format!("{what}: {e}"))
}

/// What the Pod's spec says, as the controller writes it.
#[derive(Debug, Clone)]
pub struct PodTemplate {
    /// Container args (the example service's flags).
    pub args: Vec<String>,
    /// The `preStop` hook.
    pub pre_stop: PreStop,
    /// `terminationGracePeriodSeconds`.
    pub grace: Duration,
    /// The environment (literal values).
    pub env: Vec<(String, String)>,
    /// The ServiceAccount (the `kube` cells use `examples/k8s/`'s).
    pub service_account: Option<String>,
}

/// The API's view of one Pod, from the watch.
#[derive(Debug, Clone, Default)]
struct PodView {
    ip: Option<Ipv4Addr>,
    ready: bool,
    deleting: bool,
    gone: bool,
}

/// One cell's real cluster: the testbed's kubelet and controller, the watchers, the events.
pub struct Real {
    events: Mutex<Vec<Event>>,
    pods: Mutex<HashMap<String, PodView>>,
    pods_changed: Notify,
    /// Per node (index 0 is node 1): the Pod IPs its kube-proxy's rules DNAT to.
    rules: Vec<watch::Sender<Vec<Ipv4Addr>>>,
    /// Per node, its namespace.
    node_nss: Vec<String>,
    netns: Mutex<Netns>,
    next_ip: Mutex<u8>,
    dir: PathBuf,
    service_bin: PathBuf,
    backend: Backend,
    start_delay: Duration,
    deleters: Mutex<HashMap<String, watch::Sender<Option<Duration>>>>,
    /// Pods the kubelet terminates on its own, with the condition it wrote (kept in every
    /// later status write) and the status it last wrote for each Pod.
    kubelet_stops: Mutex<HashMap<String, (crate::rollout::KubeletStop, String)>>,
    last_status: Mutex<HashMap<String, serde_json::Value>>,
    admin: kube::Client,
    kubelet: kube::Client,
}

impl std::fmt::Debug for Real {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Real")
            .field("nodes", &self.node_nss)
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

impl Real {
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
        self.record_at(unix_ms(), what, pod, detail);
    }

    fn record_at(&self, at: u64, what: &str, pod: Option<&str>, detail: impl Into<String>) {
        self.record_node_at(at, what, pod, None, detail);
    }

    fn record_node_at(
        &self,
        at: u64,
        what: &str,
        pod: Option<&str>,
        node: Option<String>,
        detail: impl Into<String>,
    ) {
        self.events.lock().unwrap().push(Event {
            unix_ms: at,
            what: what.to_owned(),
            pod: pod.map(str::to_owned),
            node,
            detail: detail.into(),
        });
    }

    /// Every step recorded so far, in time order.
    pub fn events(&self) -> Vec<Event> {
        let mut e = self.events.lock().unwrap().clone();
        e.sort_by_key(|e| e.unix_ms);
        e
    }

    fn pod_ip_name(&self, ip: Ipv4Addr) -> String {
        self.pods
            .lock()
            .unwrap()
            .iter()
            .find(|(_, v)| v.ip == Some(ip))
            .map_or_else(|| ip.to_string(), |(n, _)| n.clone())
    }

    /// `true` when the API shows Pod `name` Ready and not being deleted.
    pub fn available(&self, name: &str) -> bool {
        self.pods
            .lock()
            .unwrap()
            .get(name)
            .is_some_and(|p| p.ready && !p.deleting && !p.gone)
    }

    /// `true` when Pod `name`'s object is gone from the API.
    pub fn removed(&self, name: &str) -> bool {
        self.pods.lock().unwrap().get(name).is_some_and(|p| p.gone)
    }

    /// Waits until every node's kube-proxy's rules route to exactly `pods`.
    pub async fn wait_applied(&self, pods: &[String]) {
        for rules in &self.rules {
            self.wait_applied_on(rules, pods).await;
        }
    }

    async fn wait_applied_on(&self, rules: &watch::Sender<Vec<Ipv4Addr>>, pods: &[String]) {
        let mut rx = rules.subscribe();
        loop {
            let ips: Option<Vec<Ipv4Addr>> = {
                let st = self.pods.lock().unwrap();
                pods.iter().map(|n| st.get(n).and_then(|p| p.ip)).collect()
            };
            if let Some(mut ips) = ips {
                ips.sort();
                if *rx.borrow_and_update() == ips {
                    return;
                }
            }
            tokio::select! {
                _ = rx.changed() => {}
                () = self.pods_changed.notified() => {}
                () = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
    }
}

fn write_file(path: &Path, text: &str) -> Result<(), NetError> {
    std::fs::write(path, text).map_err(|e| NetError(format!("{}: {e}", path.display())))
}

/// A named or numbered container port.
fn resolve_port(
    c: &Container,
    port: &k8s_openapi::apimachinery::pkg::util::intstr::IntOrString,
) -> u16 {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    match port {
        IntOrString::Int(p) => *p as u16,
        IntOrString::String(name) => c
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name))
            .map_or(0, |p| p.container_port as u16),
    }
}

/// `GET path` as kubelet's prober sends it (`User-Agent: kube-probe/<major>.<minor>`).
async fn http_get(addr: SocketAddr, path: &str, timeout: Duration) -> Result<u16, String> {
    crate::cluster::http_get_as(addr, path, timeout, &k8s::probe_user_agent()).await
}

/// Now as RFC 3339 (seconds), as Kubernetes writes times.
fn rfc3339_now() -> String {
    let secs = unix_ms() / 1000;
    let days = secs / 86_400;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// A started real cluster: the testbed's side and the components. Dropping it stops the
/// components (the Pods' processes end with the node thread's runtime).
pub struct RealRun {
    /// The cluster.
    pub real: Arc<Real>,
    /// The control plane (dropped last: it kills the components).
    pub plane: ControlPlane,
}

impl std::fmt::Debug for RealRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealRun").finish_non_exhaustive()
    }
}

/// What [`start`] sets up besides the namespaces and the binaries.
#[derive(Debug, Clone, Copy)]
pub struct StartOptions<'a> {
    /// Per node, its kube-proxy's settings.
    pub proxies: &'a [ProxySettings],
    /// Other Services to load the cluster with ([`Real::load_services`]).
    pub load_services: usize,
    /// The example service.
    pub service_bin: &'a Path,
    /// From a Pod's sandbox to its process.
    pub start_delay: Duration,
    /// Apply `examples/k8s/`'s RBAC (the `kube` cells).
    pub kube: bool,
    /// The Service's `publishNotReadyAddresses`.
    pub publish_not_ready: bool,
    /// The cell's directory.
    pub dir: &'a Path,
}

/// One kube-proxy per node, each with its settings, each start recorded.
async fn start_proxies(
    real: &Real,
    plane: &mut ControlPlane,
    bins: &Binaries,
    node_nss: &[String],
    proxies: &[k8s::ProxySettings],
) -> Result<(), NetError> {
    for (i, (ns, proxy)) in node_nss.iter().zip(proxies).enumerate() {
        let k = i + 1;
        plane.start_proxy(bins, k, ns, proxy).await?;
        real.record(
            "proxy_started",
            None,
            format!(
                "{} kube-proxy {} mode, minSyncPeriod {} ms{}",
                k8s::node_name(k),
                proxy.backend.as_str(),
                proxy.min_sync_period.as_millis(),
                proxy
                    .cpu_share
                    .map_or(String::new(), |s| format!(", {:.0} % of a CPU", s * 100.0))
            ),
        );
    }
    Ok(())
}

/// Starts the control plane and the testbed's kubelet, scheduler binding and watchers in
/// `netns`'s node namespace (call from a thread inside it): registers the Node, starts
/// kube-proxy, creates the Service, and with `kube` applies `examples/k8s/`'s RBAC.
pub async fn start(
    netns: Netns,
    bins: &Binaries,
    o: &StartOptions<'_>,
) -> Result<RealRun, NetError> {
    let StartOptions {
        proxies,
        load_services,
        service_bin,
        start_delay,
        kube,
        publish_not_ready,
        dir,
    } = *o;
    let node_ns = netns.node();
    let node_nss: Vec<String> = (1..=netns.nodes()).map(|k| netns.node_of(k)).collect();
    if proxies.len() != node_nss.len() {
        return Err(NetError(format!(
            "{} kube-proxy settings for {} nodes",
            proxies.len(),
            node_nss.len()
        )));
    }
    let backend = proxies[0].backend;
    // Kubeconfigs name files by absolute path (relative ones are read from the kubeconfig's
    // directory).
    let dir = &std::fs::canonicalize(dir).map_err(err("the cell directory"))?;
    let t0 = unix_ms();
    let mut plane = ControlPlane::start(bins, &node_ns, dir).await?;
    let admin = client(&plane.creds.admin_kubeconfig).await?;
    let kubelet = client(&plane.creds.kubelet_kubeconfig).await?;
    let real = Arc::new(Real {
        events: Mutex::new(Vec::new()),
        pods: Mutex::new(HashMap::new()),
        pods_changed: Notify::new(),
        rules: node_nss
            .iter()
            .map(|_| watch::channel(Vec::new()).0)
            .collect(),
        node_nss: node_nss.clone(),
        netns: Mutex::new(netns),
        next_ip: Mutex::new(1),
        dir: dir.to_owned(),
        service_bin: service_bin.to_owned(),
        backend,
        start_delay,
        deleters: Mutex::new(HashMap::new()),
        kubelet_stops: Mutex::new(HashMap::new()),
        last_status: Mutex::new(HashMap::new()),
        admin,
        kubelet,
    });
    real.record(
        "api_ready",
        None,
        format!("kube-apiserver ready {} ms after the start", unix_ms() - t0),
    );
    for k in 1..=node_nss.len() {
        real.register_node(k).await?;
    }
    // The Service first: its ClusterIP is fixed, the load's are allocated.
    real.create_service(publish_not_ready).await?;
    if load_services > 0 {
        real.load_services(load_services).await?;
    }
    start_proxies(&real, &mut plane, bins, &node_nss, proxies).await?;
    tokio::spawn(real.clone().kubelet_loop());
    tokio::spawn(real.clone().watch_slices());
    for k in 1..=node_nss.len() {
        tokio::spawn(real.clone().scrape_proxy(k));
    }
    tokio::spawn(real.clone().scheduler_loop());
    if kube {
        real.check_example_manifests(false).await?;
        real.apply_example_rbac().await?;
        real.check_example_manifests(true).await?;
    }
    Ok(RealRun { real, plane })
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339() {
        let s = super::rfc3339_now();
        assert_eq!(s.len(), 20, "{s}");
        assert!(s.starts_with("20") && s.ends_with('Z'), "{s}");
    }
}
