//! One cell of the matrix: a server mode, a proxy backend and delay, a client shape and rate,
//! a rollout; and its result: every request counted, per deleted Pod the timeline.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use lameduck_probe::{ConnectionMode, HttpVersion, OnOff, Probe, ProbeConfig, ProbeResult};
use serde::Serialize;

use crate::cluster::{
    unix_ms, Cluster, ControlPlane, Event, Kubelet, NodeSync, PreStop, ServerCmd,
};
use crate::net::{self, NetError, Netns, SERVICE_PORT, SERVICE_VIP};
use crate::proxy::{Backend, Proxy};
use crate::real;

/// The server under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Server {
    /// The example service with its documented settings; kubelet's `preStop` is
    /// `httpGet /drain?wait=drained` on the admin port, as in `examples/k8s/deployment.yaml`.
    Lameduck,
    /// `--naive`: exits at once on SIGTERM, no hook.
    Naive,
    /// `--fixed-sleep 0` with no hook: axum's documented `with_graceful_shutdown`.
    Graceful,
    /// `preStop: sleep 5s`, then `--fixed-sleep 0`: the "sleep, then stop gracefully" recipe.
    Sleep5,
}

impl Server {
    /// The name in tables and flags.
    pub fn as_str(self) -> &'static str {
        match self {
            Server::Lameduck => "lameduck",
            Server::Naive => "naive",
            Server::Graceful => "graceful",
            Server::Sleep5 => "sleep5",
        }
    }

    /// Every server, lameduck first.
    pub const ALL: [Server; 4] = [
        Server::Lameduck,
        Server::Naive,
        Server::Graceful,
        Server::Sleep5,
    ];
}

impl std::str::FromStr for Server {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Server::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| {
                format!("server: expected lameduck, naive, graceful or sleep5, got {s:?}")
            })
    }
}

/// The client shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Shape {
    /// Keep-alive pools (HTTP/1.1: 20 short/s, 1 slow/s of 1 s, a 2 s stream every 2 s;
    /// h2c: 5 short/s; a heavier HTTP/1.1 pool: 100 short/s and 10 slow/s of 0.3 s) plus
    /// fresh connections at the cell's rate.
    Pool,
    /// Fresh connections only, at the cell's rate (short and slow).
    Fresh,
    /// Fresh connections only, short requests at the cell's rate for 5 s, then a 5 s pause,
    /// over and over: a poller or batch client whose silences come while routing is unchanged.
    OnOff,
    /// Fresh connections only, short requests at the cell's rate for 200 ms every 3 s (at
    /// 100/s, bursts of 20): a cron-like caller or a pool reconnecting in waves.
    Bursts,
}

impl Shape {
    /// `pool` or `fresh`.
    pub fn as_str(self) -> &'static str {
        match self {
            Shape::Pool => "pool",
            Shape::Fresh => "fresh",
            Shape::OnOff => "onoff",
            Shape::Bursts => "bursts",
        }
    }

    /// Send phase and pause of the dependent shapes; `None` for steady ones.
    pub fn on_off(self) -> Option<OnOff> {
        let ms = Duration::from_millis;
        match self {
            Shape::Pool | Shape::Fresh => None,
            Shape::OnOff => Some(OnOff {
                on: ms(5000),
                off: ms(5000),
            }),
            Shape::Bursts => Some(OnOff {
                on: ms(200),
                off: ms(2800),
            }),
        }
    }

    /// The new-connection rate (per second, while sending) these cells use by default.
    pub fn default_rate(self) -> f64 {
        match self {
            Shape::Pool | Shape::Fresh => 50.0,
            Shape::OnOff => 10.0,
            Shape::Bursts => 100.0,
        }
    }
}

impl std::str::FromStr for Shape {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "pool" => Ok(Shape::Pool),
            "fresh" => Ok(Shape::Fresh),
            "onoff" => Ok(Shape::OnOff),
            "bursts" => Ok(Shape::Bursts),
            _ => Err(format!(
                "shape: expected pool, fresh, onoff or bursts, got {s:?}"
            )),
        }
    }
}

/// The rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Rollout {
    /// Rolling update of `replicas` Pods, maxSurge 1, maxUnavailable 0.
    Rolling,
    /// One replica, deleted while its replacement is created at the same moment.
    Evict,
}

/// What plays Kubernetes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stack {
    /// The testbed's own model of the EndpointSlice controller, kube-proxy and kubelet (fast).
    Model,
    /// etcd, kube-apiserver, kube-controller-manager and kube-proxy built from Kubernetes'
    /// source (`testbed/k8s/build.sh`), the testbed as kubelet and Deployment controller
    /// through the real API ([`crate::real`]).
    Real,
}

impl Stack {
    /// `model` or `real`.
    pub fn as_str(self) -> &'static str {
        match self {
            Stack::Model => "model",
            Stack::Real => "real",
        }
    }
}

/// The clients behind one node: their shape and new-connection rate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ClientSpec {
    /// The shape.
    pub shape: Shape,
    /// New connections per second while sending.
    pub rate: f64,
}

impl ClientSpec {
    /// `fresh50`, `pool0.7`.
    pub fn short(&self) -> String {
        format!("{}{}", self.shape.as_str(), self.rate)
    }
}

impl std::str::FromStr for ClientSpec {
    type Err = String;
    /// `fresh`, `fresh:0.7`, `pool:5` (the rate defaults to the shape's).
    fn from_str(s: &str) -> Result<Self, String> {
        let (shape, rate) = match s.split_once(':') {
            Some((shape, rate)) => (shape, Some(rate)),
            None => (s, None),
        };
        let shape: Shape = shape.parse()?;
        let rate = match rate {
            None => shape.default_rate(),
            Some(r) => match r.trim_end_matches("/s").parse::<f64>() {
                Ok(r) if r > 0.0 && r <= 1000.0 => r,
                _ => {
                    return Err(format!(
                        "client rate {r:?}: expected per second in (0, 1000]"
                    ))
                }
            },
        };
        Ok(ClientSpec { shape, rate })
    }
}

/// One node of a cell with several: its kube-proxy's delay and the clients behind it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeSpec {
    /// Its kube-proxy's sync delay (model) or `minSyncPeriod` (real).
    pub sync_delay: Duration,
    /// Model: its syncs take `sync_delay` (a kube-proxy with thousands of Services): each
    /// writes the slice it read when it began, so a change lands one to two delays later.
    /// Real: the node's kube-proxy carries that many Services for real.
    pub slow: bool,
    /// The clients whose connections this node's kube-proxy routes; `None`: no clients.
    pub clients: Option<ClientSpec>,
}

/// Everything one cell needs.
#[derive(Debug, Clone, Serialize)]
pub struct CellConfig {
    /// The model or the real components.
    pub stack: Stack,
    /// Server under test.
    pub server: Server,
    /// Rule backend.
    pub backend: Backend,
    /// Model: kube-proxy's sync delay after each slice change, or with `min_sync_period` its
    /// `minSyncPeriod`. Real: kube-proxy's `minSyncPeriod` (its rate limit: a change after a
    /// quiet spell syncs at once).
    pub sync_delay: Duration,
    /// Model only: `sync_delay` as kube-proxy's `minSyncPeriod` (the real sync runner's
    /// timing) instead of a delay after each change.
    pub min_sync_period: bool,
    /// EndpointSlice delay.
    pub slice_delay: Duration,
    /// New connections per second (fresh).
    pub new_conn_rate: f64,
    /// Client shape.
    pub shape: Shape,
    /// Rollout kind.
    pub rollout: Rollout,
    /// Replicas (rolling).
    pub replicas: usize,
    /// `terminationGracePeriodSeconds`, also the service's `--grace-period`.
    pub grace: Duration,
    /// Client traffic before the rollout starts. The default, 20 s, lets the Pods serve past
    /// the propagation evidence's 15 s window, so their drains are judged on evidence; a
    /// younger Pod waits to `max` (`too_few_slots`) and "0 lost" would only show that `max`
    /// outlasted the proxy.
    pub warmup: Duration,
    /// `publishNotReadyAddresses`.
    pub publish_not_ready: bool,
    /// From a Pod's creation to its process starting (sandbox, image, container).
    pub start_delay: Duration,
    /// Extra flags for the lameduck server (e.g. `--readiness-policy auto`).
    pub lameduck_flags: Vec<String>,
    /// The lameduck server's hook as `exec` of `service prestop` instead of `httpGet /drain`.
    pub exec_hook: bool,
    /// Real stack only: the Pods run as `examples/k8s/`'s ServiceAccount with its RBAC, get
    /// the projected token, CA and namespace files, so a service built with the `kube`
    /// feature reads its EndpointSlices from the real API.
    pub kube: bool,
    /// Two or more nodes, each with its kube-proxy and its clients (node 1 first); empty: one
    /// node with `sync_delay`, `shape` and `new_conn_rate`.
    pub nodes: Vec<NodeSpec>,
    /// Real stack only: the rollout by the real Deployment and ReplicaSet controllers (a
    /// Deployment, maxSurge 1, maxUnavailable 0, its template changed; the eviction through
    /// the Eviction API), the testbed binding the Pods to its node as the scheduler would.
    /// Otherwise the testbed plays the Deployment controller.
    pub deployment: bool,
}

/// Real stack, a cell with a slow node: the other Services the cluster carries (each with two
/// endpoints), whose rules every kube-proxy writes.
pub const SLOW_NODE_SERVICES: usize = 2000;
/// Real stack: the share of one CPU a slow node's kube-proxy gets (a busy node).
pub const SLOW_NODE_CPU: f64 = 0.1;

/// The default warm-up: past the propagation evidence's 15 s window, with room to spare.
pub const WARM: Duration = Duration::from_secs(20);

impl CellConfig {
    /// Defaults: lameduck, iptables, 1 s sync, 0.1 s slice, 50/s fresh, pool, rolling 2,
    /// grace 15 s, warm-up 20 s (past the evidence window), Pod start 2 s.
    pub fn new(server: Server) -> Self {
        CellConfig {
            stack: Stack::Model,
            server,
            backend: Backend::Iptables,
            sync_delay: Duration::from_secs(1),
            min_sync_period: false,
            slice_delay: Duration::from_millis(100),
            new_conn_rate: 50.0,
            shape: Shape::Pool,
            rollout: Rollout::Rolling,
            replicas: 2,
            grace: Duration::from_secs(15),
            warmup: WARM,
            publish_not_ready: false,
            start_delay: Duration::from_secs(2),
            lameduck_flags: Vec::new(),
            exec_hook: false,
            kube: false,
            deployment: false,
            nodes: Vec::new(),
        }
    }

    /// The nodes: `nodes`, or the one node the single-node fields describe.
    pub fn node_specs(&self) -> Vec<NodeSpec> {
        if self.nodes.is_empty() {
            vec![NodeSpec {
                sync_delay: self.sync_delay,
                slow: false,
                clients: Some(ClientSpec {
                    shape: self.shape,
                    rate: self.new_conn_rate,
                }),
            }]
        } else {
            self.nodes.clone()
        }
    }

    /// Whether the cell means anything on its stack: the `kube` feature and `--deployment`
    /// need the real API, so on the model such a cell would only repeat its plain twin.
    pub fn runs_on_its_stack(&self) -> bool {
        self.stack == Stack::Real || !(self.kube || self.deployment)
    }

    /// A short name: `lameduck/iptables/sync1000ms/50.0ps/pool`; with several nodes
    /// `lameduck/iptables/n1:1000ms:fresh50,n2:6000ms:fresh0.7`.
    pub fn name(&self) -> String {
        let minsync = self.stack == Stack::Real || self.min_sync_period;
        let mut n = format!(
            "{}{}/{}/",
            if self.stack == Stack::Real {
                "real/"
            } else {
                ""
            },
            self.server.as_str(),
            self.backend.as_str()
        );
        if self.nodes.len() > 1 {
            let nodes: Vec<String> = self
                .nodes
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    format!(
                        "n{}:{}{}ms:{}",
                        i + 1,
                        if s.slow { "slow" } else { "" },
                        s.sync_delay.as_millis(),
                        s.clients.map_or("none".to_owned(), |c| c.short())
                    )
                })
                .collect();
            if minsync {
                n.push_str("minsync/");
            }
            n.push_str(&nodes.join(","));
        } else {
            let _ = write!(
                n,
                "{}{}ms/{}ps/{}",
                if minsync { "minsync" } else { "sync" },
                self.sync_delay.as_millis(),
                self.new_conn_rate,
                self.shape.as_str()
            );
        }
        if self.rollout == Rollout::Evict {
            n.push_str("/evict");
        }
        if self.exec_hook && self.server == Server::Lameduck {
            n.push_str("/exec");
        }
        if self.kube && self.stack == Stack::Real {
            n.push_str("/kube");
        }
        if self.deployment && self.stack == Stack::Real {
            n.push_str("/deployment");
        }
        n
    }

    fn kubelet(&self, pre_stop: PreStop) -> Kubelet {
        Kubelet {
            period: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            failure_threshold: 1,
            success_threshold: 1,
            pre_stop,
            start_delay: self.start_delay,
            stop_signal: nix::sys::signal::Signal::SIGTERM,
            grace: self.grace,
        }
    }

    fn plane(&self) -> ControlPlane {
        ControlPlane {
            slice_delay: self.slice_delay,
            nodes: self
                .node_specs()
                .iter()
                .map(|n| NodeSync {
                    delay: n.sync_delay,
                    slow: n.slow,
                })
                .collect(),
            sync_jitter: 0.2,
            min_sync_period: self.min_sync_period,
            publish_not_ready: self.publish_not_ready,
            backend: self.backend,
        }
    }

    /// The Pod template of the real mode: the same server flags and hook as the model's.
    fn pod_template(&self) -> real::PodTemplate {
        let (cmd, pre_stop) = self.server_cmd(Path::new("service"));
        let mut args: Vec<String> = vec![
            "--listen".into(),
            format!("0.0.0.0:{}", net::POD_PORT),
            "--admin".into(),
            format!("0.0.0.0:{}", net::ADMIN_PORT),
        ];
        args.extend(cmd.flags);
        real::PodTemplate {
            args,
            pre_stop,
            grace: self.grace,
            env: Vec::new(),
            service_account: self.kube.then(|| "lameduck-example".to_owned()),
        }
    }

    /// The binary this cell's server runs: the service (`service_bin`) for lameduck, the
    /// baseline next to it ([`baseline_bin`]) for the others.
    pub fn server_bin(&self, service_bin: &Path) -> PathBuf {
        match self.server {
            Server::Lameduck => service_bin.to_owned(),
            Server::Naive | Server::Graceful | Server::Sleep5 => baseline_bin(service_bin),
        }
    }

    /// The server's binary (see [`server_bin`](Self::server_bin)), flags and `preStop` hook.
    fn server_cmd(&self, service_bin: &Path) -> (ServerCmd, PreStop) {
        let grace = format!("{}ms", self.grace.as_millis());
        let (flags, hook): (Vec<String>, PreStop) = match self.server {
            Server::Lameduck => {
                let mut f = vec!["--grace-period".to_owned(), grace];
                f.extend(self.lameduck_flags.iter().cloned());
                let hook = if self.exec_hook {
                    PreStop::Exec
                } else {
                    PreStop::HttpGet("/drain?wait=drained".to_owned())
                };
                (f, hook)
            }
            Server::Naive => (vec!["--naive".to_owned()], PreStop::None),
            Server::Graceful => (vec!["--fixed-sleep".into(), "0".into()], PreStop::None),
            Server::Sleep5 => (
                vec!["--fixed-sleep".into(), "0".into()],
                PreStop::Sleep(Duration::from_secs(5)),
            ),
        };
        (
            ServerCmd {
                bin: self.server_bin(service_bin),
                flags,
            },
            hook,
        )
    }
}

/// The clients' counts.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Counts {
    /// Requests sent.
    pub requests: u64,
    /// Succeeded.
    pub ok: u64,
    /// Failed (no retries anywhere).
    pub failed: u64,
    /// Still running when the client gave up waiting.
    pub unfinished: u64,
    /// Moved to another connection before anything was sent (counted as lost too: a client
    /// without that logic would have failed them).
    pub rerouted: u64,
    /// Not sent: the client's in-flight cap was reached.
    pub not_sent: u64,
    /// The first failure, `at_unix_ms error`.
    pub first_failure: Option<String>,
}

impl Counts {
    /// Failed plus rerouted plus not sent: every request that a retry-free client lost.
    pub fn lost(&self) -> u64 {
        self.failed + self.rerouted + self.not_sent
    }
}

/// Per deleted Pod: deletion → exit, and the timeline.
#[derive(Debug, Clone, Serialize)]
pub struct PodTimeline {
    /// The Pod.
    pub pod: String,
    /// Deletion, unix ms.
    pub deleted_unix_ms: u64,
    /// Deletion → exit, ms.
    pub drain_ms: Option<u64>,
    /// The four steps, ms from the deletion: the endpoint change (the first EndpointSlice
    /// without this Pod ready), the proxy update (the first sync whose rules leave it out),
    /// the exit. On the real stack the slice comes from the API's watch and the sync time
    /// from kube-proxy's own metric.
    pub steps: Steps,
    /// Lines: `+ms  source  what  detail`.
    pub lines: Vec<String>,
    /// What the drain's commit went on, from its report (`propagation.evidence.kind`:
    /// `confidence`, `endpoint_slice`, `max`, …), when the report was read.
    pub evidence: Option<String>,
    /// The path that held the commit (`propagation.evidence.held_by`).
    pub held_by: Option<String>,
}

impl PodTimeline {
    /// The drain committed on evidence (`confidence` or `endpoint_slice`), not at `max`, a
    /// fallback or a fixed delay.
    pub fn on_evidence(&self) -> bool {
        matches!(
            self.evidence.as_deref(),
            Some("confidence" | "endpoint_slice")
        )
    }

    /// The drain waited to `max`.
    pub fn at_max(&self) -> bool {
        self.evidence.as_deref() == Some("max")
    }
}

/// A deleted Pod's steps, ms from its deletion (`None`: not seen).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Steps {
    /// The first EndpointSlice that no longer shows the Pod ready.
    pub endpoint_change_ms: Option<i64>,
    /// The first kube-proxy sync whose rules no longer send new connections to it; with
    /// several nodes, the slowest node's (`None` while any node had not updated).
    pub proxy_update_ms: Option<i64>,
    /// With several nodes: each node's first such sync (`node1`, `node2`, …).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub per_node: Vec<(String, Option<i64>)>,
    /// The process's exit.
    pub exit_ms: Option<i64>,
}

impl Steps {
    fn from_events(pod: &str, deleted: u64, events: &[Event]) -> Steps {
        let rel = |e: &Event| e.unix_ms as i64 - deleted as i64;
        let tag = format!("{pod}(");
        let mut nodes: Vec<String> = Vec::new();
        for e in events.iter().filter(|e| e.what == "sync") {
            if let Some(n) = &e.node {
                if !nodes.contains(n) {
                    nodes.push(n.clone());
                }
            }
        }
        nodes.sort();
        let mut per_node: Vec<(String, Option<i64>)> =
            nodes.iter().map(|n| (n.clone(), None)).collect();
        let after = events.iter().filter(|e| e.unix_ms >= deleted);
        let mut s = Steps::default();
        let mut single: Option<i64> = None;
        for e in after {
            match e.what.as_str() {
                "slice" if s.endpoint_change_ms.is_none() => {
                    let shown_ready = e
                        .detail
                        .split(") ")
                        .any(|ep| ep.starts_with(&tag) && ep.contains(" r=1"));
                    if !shown_ready {
                        s.endpoint_change_ms = Some(rel(e));
                    }
                }
                "sync" => {
                    let routed = e.detail.split(';').next().unwrap_or("");
                    if routed.split_whitespace().any(|w| w == pod) {
                        continue;
                    }
                    match &e.node {
                        Some(n) => {
                            if let Some(slot) = per_node.iter_mut().find(|(m, _)| m == n) {
                                slot.1.get_or_insert(rel(e));
                            }
                        }
                        None => {
                            single.get_or_insert(rel(e));
                        }
                    }
                }
                "exit" if e.pod.as_deref() == Some(pod) && s.exit_ms.is_none() => {
                    s.exit_ms = Some(rel(e));
                }
                _ => {}
            }
        }
        if per_node.is_empty() {
            s.proxy_update_ms = single;
        } else {
            s.proxy_update_ms = per_node
                .iter()
                .map(|(_, at)| *at)
                .collect::<Option<Vec<i64>>>()
                .and_then(|all| all.into_iter().max());
            s.per_node = per_node;
        }
        s
    }

    /// Exit minus the (slowest) proxy update, ms: below zero, the process was gone while a
    /// kube-proxy still sent new connections to it.
    pub fn exit_after_proxy_ms(&self) -> Option<i64> {
        Some(self.exit_ms? - self.proxy_update_ms?)
    }

    /// `deletion 0, endpoint change +120 ms, proxy update +1.1 s, exit +1.5 s`; with several
    /// nodes each node's update, and how far the exit beat or trailed the slowest.
    pub fn line(&self) -> String {
        let f = |v: Option<i64>| v.map_or("-".to_owned(), |ms| format!("+{ms} ms"));
        let proxy = if self.per_node.is_empty() {
            f(self.proxy_update_ms)
        } else {
            let each: Vec<String> = self
                .per_node
                .iter()
                .map(|(n, at)| format!("{n} {}", f(*at)))
                .collect();
            each.join(", ")
        };
        let mut line = format!(
            "deletion 0, endpoint change {}, proxy update {proxy}, exit {}",
            f(self.endpoint_change_ms),
            f(self.exit_ms)
        );
        if let (false, Some(d)) = (self.per_node.is_empty(), self.exit_after_proxy_ms()) {
            if d >= 0 {
                let _ = write!(line, " ({d} ms after the slowest proxy)");
            } else {
                let _ = write!(line, " ({} ms BEFORE the slowest proxy)", -d);
            }
        }
        line
    }
}

/// One cell's result.
#[derive(Debug, Clone, Serialize)]
pub struct CellResult {
    /// The cell.
    pub name: String,
    /// Its config.
    pub config: CellConfig,
    /// The counts.
    pub counts: Counts,
    /// Per deleted Pod.
    pub pods: Vec<PodTimeline>,
    /// Everything the model recorded.
    pub events: Vec<Event>,
    /// Where its files are.
    pub dir: PathBuf,
}

impl CellResult {
    /// `true` when no request was lost or left unfinished.
    pub fn clean(&self) -> bool {
        self.counts.lost() == 0 && self.counts.unfinished == 0
    }

    /// The per-Pod timelines as text.
    pub fn timelines(&self) -> String {
        let mut s = String::new();
        for p in &self.pods {
            let _ = writeln!(
                s,
                "  {} deleted at unix {} ms (drain {}):",
                p.pod,
                p.deleted_unix_ms,
                p.drain_ms.map_or("not exited".to_owned(), |d| format!(
                    "{:.1} s",
                    d as f64 / 1000.0
                ))
            );
            let _ = writeln!(s, "    {}", p.steps.line());
            for l in &p.lines {
                let _ = writeln!(s, "    {l}");
            }
        }
        s
    }
}

/// The table header.
pub fn table_header() -> String {
    format!(
        "{:<48} {:>8} {:>5} {:>10} {:>8} {:>8}  {}\n",
        "cell",
        "requests",
        "lost",
        "unfinished",
        "rerouted",
        "ev / max",
        "drain (deletion → exit) per Pod"
    )
}

/// One table row.
pub fn table_row(r: &CellResult) -> String {
    let drains: Vec<String> = r
        .pods
        .iter()
        .map(|p| {
            p.drain_ms
                .map_or("-".to_owned(), |d| format!("{:.1}s", d as f64 / 1000.0))
        })
        .collect();
    let evidence = r.pods.iter().filter(|p| p.on_evidence()).count();
    let max = r.pods.iter().filter(|p| p.at_max()).count();
    // A name longer than its column (several nodes) gets a line of its own.
    let name = if r.name.len() > 48 {
        format!("{}\n{:<48}", r.name, "")
    } else {
        r.name.clone()
    };
    format!(
        "{:<48} {:>8} {:>5} {:>10} {:>8} {:>8}  {}{}\n",
        name,
        r.counts.requests,
        r.counts.lost(),
        r.counts.unfinished,
        r.counts.rerouted,
        format!("{evidence} / {max}"),
        drains.join(" "),
        if r.clean() { "" } else { "   FAIL" }
    )
}

/// The baselines' binary (`examples/baseline`: `--naive`, `--fixed-sleep`), next to the
/// service's.
pub fn baseline_bin(service_bin: &Path) -> PathBuf {
    service_bin.with_file_name("baseline")
}

/// Runs one cell end to end and writes its files under `out/<cell>/`.
///
/// `service_bin` is the example service (`target/<profile>/examples/service`); the baselines
/// run `examples/baseline` next to it ([`baseline_bin`]).
pub fn run_cell(
    config: &CellConfig,
    service_bin: &Path,
    out: &Path,
) -> Result<CellResult, NetError> {
    let name = config.name();
    let dir = out.join(name.replace('/', "_"));
    std::fs::create_dir_all(&dir).map_err(|e| NetError(format!("{}: {e}", dir.display())))?;
    let specs = config.node_specs();
    let netns = Netns::create_nodes(specs.len())?;
    let node_ns = netns.node();

    // The clients wait for the go, run until the stop, then hand their results back.
    let (go_tx, go_rx) = tokio::sync::watch::channel(false);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // The Pods live until the clients are done (streams still running end on their own): the
    // node side waits until every client dropped its sender.
    let (done_tx, mut done_rx) = tokio::sync::mpsc::channel::<()>(1);
    let mut client_threads = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let Some(clients_spec) = spec.clients else {
            continue;
        };
        let prefix = if specs.len() > 1 {
            format!("node{}-", i + 1)
        } else {
            String::new()
        };
        let (go_rx, stop_rx, done_tx) = (go_rx.clone(), stop_rx.clone(), done_tx.clone());
        client_threads.push(net::spawn_in(&netns.client_of(i + 1), move || async move {
            let r = clients(clients_spec, prefix, go_rx, stop_rx).await;
            drop(done_tx);
            r
        }));
    }
    drop((done_tx, go_rx, stop_rx));
    let done = async move {
        let _ = tokio::time::timeout(Duration::from_secs(30), done_rx.recv()).await;
    };

    // Holds the model's namespaces until the results are read.
    let mut keep: Option<Arc<Cluster>> = None;
    let (control_result, events) = match config.stack {
        Stack::Model => {
            let proxies = (1..=specs.len())
                .map(|k| Proxy::install(config.backend, &netns.node_of(k)))
                .collect::<Result<Vec<Proxy>, NetError>>()?;
            let (server, pre_stop) = config.server_cmd(service_bin);
            let cluster = Cluster::new(
                netns,
                config.plane(),
                config.kubelet(pre_stop),
                server,
                dir.clone(),
            );
            let c = cluster.clone();
            let cfg = config.clone();
            let node = net::spawn_in(&node_ns, move || async move {
                let r = control(c, cfg, proxies, go_tx, stop_tx).await;
                done.await;
                r
            });
            let r = node
                .join()
                .map_err(|_| NetError("the node thread panicked".into()))?;
            let events = cluster.events();
            keep = Some(cluster);
            (r, events)
        }
        Stack::Real => {
            let cfg = config.clone();
            let bin = config.server_bin(service_bin);
            let d = dir.clone();
            let node = net::spawn_in(&node_ns, move || async move {
                let (r, events) = control_real(netns, cfg, bin, d, go_tx, stop_tx).await;
                done.await;
                (r, events)
            });
            let (r, events) = node
                .join()
                .map_err(|_| NetError("the node thread panicked".into()))??;
            (Ok(r), events)
        }
    };
    let mut client_result: Result<Vec<ProbeResult>, String> = Ok(Vec::new());
    for thread in client_threads {
        let r = thread
            .join()
            .map_err(|_| NetError("a client thread panicked".into()))??;
        client_result = match (client_result, r) {
            (Ok(mut all), Ok(more)) => {
                all.extend(more);
                Ok(all)
            }
            (Err(e), _) | (_, Err(e)) => Err(e),
        };
    }
    if let Ok(json) = serde_json::to_string_pretty(&events) {
        let _ = std::fs::write(dir.join("events.json"), json);
    }
    let deleted = control_result??;
    let results = client_result.map_err(NetError)?;

    let mut counts = Counts::default();
    for (i, r) in results.iter().enumerate() {
        let s = &r.summary;
        counts.requests += s.all.total;
        counts.ok += s.all.succeeded;
        counts.failed += s.all.failed;
        counts.unfinished += s.all.unfinished;
        counts.rerouted += s.rerouted;
        counts.not_sent += s.not_sent;
        if let Some(f) = &s.first_failure {
            let at = s.started_unix_ms as f64 + f.at_ms;
            let line = format!("{at:.0} [{}] {} {}", s.label, f.kind.as_str(), f.error);
            if counts.first_failure.as_ref().is_none_or(|old| *old > line) {
                counts.first_failure = Some(line);
            }
        }
        if let Ok(file) = std::fs::File::create(dir.join(format!("probe-{i}-{}.jsonl", s.label))) {
            let _ = r.write_json_lines(std::io::BufWriter::new(file));
        }
    }
    let pods = deleted
        .iter()
        .map(|p| pod_timeline(p, &events, &dir, config.stack.as_str()))
        .collect();
    let result = CellResult {
        name,
        config: config.clone(),
        counts,
        pods,
        events,
        dir: dir.clone(),
    };
    if let Ok(json) = serde_json::to_string_pretty(&result) {
        let _ = std::fs::write(dir.join("cell.json"), json);
    }
    // Dropping the last reference to the cluster removes the namespaces.
    drop(keep);
    Ok(result)
}

/// The node side: pods, control plane, rollout. Returns the deleted Pods.
async fn control(
    cluster: Arc<Cluster>,
    config: CellConfig,
    proxies: Vec<Proxy>,
    go: tokio::sync::watch::Sender<bool>,
    stop: tokio::sync::watch::Sender<bool>,
) -> Result<Vec<String>, NetError> {
    // Whatever happens, the client stops.
    struct StopOnDrop(tokio::sync::watch::Sender<bool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.send_replace(true);
        }
    }
    let _stop = StopOnDrop(stop);
    let slices = tokio::spawn(cluster.clone().slice_controller());
    let syncs: Vec<_> = proxies
        .into_iter()
        .enumerate()
        .map(|(i, p)| tokio::spawn(cluster.clone().proxy_loop(i + 1, p)))
        .collect();
    let result = async {
        let replicas = match config.rollout {
            Rollout::Rolling => config.replicas.max(1),
            Rollout::Evict => 1,
        };
        let mut first = Vec::new();
        for _ in 0..replicas {
            first.push(cluster.create_pod()?);
        }
        let settle = Duration::from_secs(30);
        tokio::time::timeout(settle, async {
            while !first.iter().all(|p| cluster.available(p)) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            cluster.wait_applied(&first).await;
        })
        .await
        .map_err(|_| {
            NetError(
                "the first Pods did not become ready and routed in 30 s: see the pod logs".into(),
            )
        })?;
        go.send_replace(true);
        cluster.record("client_started", None, "");
        tokio::time::sleep(config.warmup).await;
        let (surge, unavailable) = match config.rollout {
            Rollout::Rolling => (1, 0),
            Rollout::Evict => (1, 1),
        };
        let new = cluster
            .rollout(&first, surge, unavailable, config.grace * 4 + settle)
            .await?;
        // Every old Pod gone, the rules on the new ones, then a tail of traffic.
        tokio::time::timeout(config.grace + Duration::from_secs(5), async {
            while !first.iter().all(|p| cluster.exited(p)) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            cluster.wait_applied(&new).await;
        })
        .await
        .map_err(|_| NetError("old Pods did not exit, or the rules did not settle".into()))?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        cluster.record("client_stopped", None, "");
        Ok(first)
    }
    .await;
    slices.abort();
    for s in syncs {
        s.abort();
    }
    result
}

/// The node side on the real stack: control plane, kubelet, the Pods and the rollout through
/// the API. Returns the deleted Pods and every recorded step.
async fn control_real(
    netns: Netns,
    config: CellConfig,
    service_bin: PathBuf,
    dir: PathBuf,
    go: tokio::sync::watch::Sender<bool>,
    stop: tokio::sync::watch::Sender<bool>,
) -> (Result<Vec<String>, NetError>, Vec<Event>) {
    struct StopOnDrop(tokio::sync::watch::Sender<bool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.send_replace(true);
        }
    }
    let _stop = StopOnDrop(stop);
    let bins = match crate::k8s::Binaries::find(&crate::k8s::default_bin_dir()) {
        Ok(b) => b,
        Err(e) => return (Err(e), Vec::new()),
    };
    let proxies: Vec<crate::k8s::ProxySettings> = config
        .node_specs()
        .iter()
        .map(|n| crate::k8s::ProxySettings {
            backend: config.backend,
            min_sync_period: n.sync_delay,
            sync_period: Duration::from_secs(30),
            cpu_share: n.slow.then_some(SLOW_NODE_CPU),
        })
        .collect();
    let load = if proxies.iter().any(|p| p.cpu_share.is_some()) {
        SLOW_NODE_SERVICES
    } else {
        0
    };
    let options = real::StartOptions {
        proxies: &proxies,
        load_services: load,
        service_bin: &service_bin,
        start_delay: config.start_delay,
        kube: config.kube,
        publish_not_ready: config.publish_not_ready,
        dir: &dir,
    };
    let run = match real::start(netns, &bins, &options).await {
        Ok(r) => r,
        Err(e) => return (Err(e), Vec::new()),
    };
    let r = run.real.clone();
    let template = config.pod_template();
    if config.deployment {
        let result = deployment_rollout(&r, &config, &template, &dir, go).await;
        let events = r.events();
        drop(run);
        return (result, events);
    }
    let result = async {
        let replicas = match config.rollout {
            Rollout::Rolling => config.replicas.max(1),
            Rollout::Evict => 1,
        };
        let first: Vec<String> = (1..=replicas).map(|i| format!("pod-{i}")).collect();
        for p in &first {
            r.create_pod(p, &template).await?;
        }
        let settle = Duration::from_secs(60);
        tokio::time::timeout(settle, async {
            while !first.iter().all(|p| r.available(p)) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            r.wait_applied(&first).await;
        })
        .await
        .map_err(|_| {
            NetError(format!(
                "the first Pods did not become ready and routed in {settle:?}: see the logs in {}",
                dir.display()
            ))
        })?;
        go.send_replace(true);
        r.record("client_started", None, "");
        tokio::time::sleep(config.warmup).await;
        let (surge, unavailable) = match config.rollout {
            Rollout::Rolling => (1, 0),
            Rollout::Evict => (1, 1),
        };
        let new = r
            .rollout(
                &first,
                &template,
                replicas + 1,
                surge,
                unavailable,
                config.grace * 4 + settle,
            )
            .await?;
        tokio::time::timeout(config.grace + Duration::from_secs(10), async {
            while !first.iter().all(|p| r.removed(p)) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            r.wait_applied(&new).await;
        })
        .await
        .map_err(|_| NetError("old Pods were not removed, or the rules did not settle".into()))?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        r.record("client_stopped", None, "");
        Ok(first)
    }
    .await;
    let events = r.events();
    drop(run);
    (result, events)
}

/// The rollout by the real Deployment controller: the Deployment, its Pods Ready and routed,
/// the clients, then a new template revision (or the eviction of the one Pod) and the wait
/// until the old Pods are gone and the rules route to the new ones. Returns the old Pods.
async fn deployment_rollout(
    r: &Arc<real::Real>,
    config: &CellConfig,
    template: &real::PodTemplate,
    dir: &Path,
    go: tokio::sync::watch::Sender<bool>,
) -> Result<Vec<String>, NetError> {
    let replicas = match config.rollout {
        Rollout::Rolling => config.replicas.max(1),
        Rollout::Evict => 1,
    };
    r.create_deployment(replicas, template).await?;
    let settle = Duration::from_secs(60);
    let first = tokio::time::timeout(settle, async {
        loop {
            let live = r.live_pods();
            if live.len() == replicas && live.iter().all(|p| r.available(p)) {
                r.wait_applied(&live).await;
                return live;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .map_err(|_| {
        NetError(format!(
            "the Deployment's Pods did not become ready and routed in {settle:?}: see the logs in {}",
            dir.display()
        ))
    })?;
    go.send_replace(true);
    r.record("client_started", None, "");
    tokio::time::sleep(config.warmup).await;
    match config.rollout {
        Rollout::Rolling => r.roll_deployment(2).await?,
        Rollout::Evict => r.evict(&first[0]).await?,
    }
    tokio::time::timeout(config.grace * 4 + settle, async {
        loop {
            let live: Vec<String> = r
                .live_pods()
                .into_iter()
                .filter(|p| !first.contains(p))
                .collect();
            if first.iter().all(|p| r.removed(p))
                && live.len() == replicas
                && live.iter().all(|p| r.available(p))
            {
                r.wait_applied(&live).await;
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .map_err(|_| {
        NetError("the rollout did not finish: old Pods left or new ones not ready".into())
    })?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    r.record("client_stopped", None, "");
    Ok(first)
}

/// The client side behind one node: the probes, retry-free, at the VIP; their labels start
/// with `prefix`.
async fn clients(
    spec: ClientSpec,
    prefix: String,
    mut go: tokio::sync::watch::Receiver<bool>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<Vec<ProbeResult>, String> {
    if go.wait_for(|g| *g).await.is_err() {
        return Ok(Vec::new());
    }
    let target = format!("{SERVICE_VIP}:{SERVICE_PORT}");
    let base = |label: &str, mode: ConnectionMode, http: HttpVersion| {
        let mut c = ProbeConfig::new(target.clone());
        c.label = format!("{prefix}{label}");
        c.connections = mode;
        c.http = http;
        c.duration = Duration::from_secs(600);
        c.drain_wait = Duration::from_secs(5);
        c.connect_timeout = Duration::from_secs(2);
        c.slow = Duration::from_secs(1);
        c.stream = Duration::from_secs(2);
        c.short_rate = 0.0;
        c.slow_rate = 0.0;
        c
    };
    let mut configs = Vec::new();
    let mut fresh = base("fresh", ConnectionMode::Fresh, HttpVersion::Http1);
    match spec.shape {
        Shape::Pool => {
            let mut pool = base("pool-h1", ConnectionMode::KeepAlive, HttpVersion::Http1);
            pool.short_rate = 20.0;
            pool.slow_rate = 1.0;
            pool.stream_rate = 0.5;
            configs.push(pool);
            let mut h2 = base("pool-h2c", ConnectionMode::KeepAlive, HttpVersion::Http2);
            h2.short_rate = 5.0;
            configs.push(h2);
            // The heavier keep-alive load: a busy pooling client with several connections.
            let mut heavy = base("heavy-h1", ConnectionMode::KeepAlive, HttpVersion::Http1);
            heavy.short_rate = 100.0;
            heavy.slow_rate = 10.0;
            heavy.slow = Duration::from_millis(300);
            configs.push(heavy);
            fresh.short_rate = spec.rate;
        }
        Shape::Fresh => {
            fresh.short_rate = spec.rate * 0.8;
            fresh.slow_rate = spec.rate * 0.2;
        }
        Shape::OnOff | Shape::Bursts => {
            // Short requests only: every connection is one routing decision, nothing else.
            fresh.label = format!("{prefix}{}", spec.shape.as_str());
            fresh.short_rate = spec.rate;
            fresh.on_off = spec.shape.on_off();
        }
    }
    configs.push(fresh);
    let mut probes = Vec::new();
    for c in configs {
        let p = Probe::new(c).map_err(|e| format!("probe config: {e}"))?;
        probes.push((p.handle(), tokio::spawn(p.run())));
    }
    let _ = stop.wait_for(|s| *s).await;
    let mut out = Vec::new();
    for (h, _) in &probes {
        h.stop();
    }
    for (_, task) in probes {
        match task.await {
            Ok(Ok(r)) => out.push(r),
            Ok(Err(e)) => return Err(format!("probe: {e}")),
            Err(e) => return Err(format!("probe task: {e}")),
        }
    }
    Ok(out)
}

/// Lines up, for one deleted Pod, the model's events (deletion, slice, sync, hook, signal,
/// exit) and the drain report's own events, relative to the deletion.
fn pod_timeline(pod: &str, events: &[Event], dir: &Path, source: &str) -> PodTimeline {
    let deleted = events
        .iter()
        .find(|e| e.what == "deleted" && e.pod.as_deref() == Some(pod))
        .map_or(0, |e| e.unix_ms);
    let exit = events
        .iter()
        .find(|e| e.what == "exit" && e.pod.as_deref() == Some(pod))
        .map(|e| e.unix_ms);
    let end = exit.unwrap_or(u64::MAX).saturating_add(1);
    let mut rows: Vec<(u64, String, String, String)> = Vec::new();
    // Per node (None: the one node), whether its first sync after the exit is in already.
    let mut after_exit_sync: Vec<Option<String>> = Vec::new();
    for e in events {
        if e.unix_ms < deleted {
            continue;
        }
        let mine = e.pod.as_deref() == Some(pod);
        let global = matches!(e.what.as_str(), "slice" | "sync");
        let first_after = e.what == "sync" && !after_exit_sync.contains(&e.node);
        if mine || (global && e.unix_ms <= end) || first_after {
            if e.what == "sync" && e.unix_ms > end {
                after_exit_sync.push(e.node.clone());
            }
            let what = match &e.node {
                Some(n) => format!("{} {n}", e.what),
                None => e.what.clone(),
            };
            rows.push((e.unix_ms, source.into(), what, e.detail.clone()));
        }
    }
    let (mut evidence, mut held_by) = (None, None);
    if let Ok(text) = std::fs::read_to_string(dir.join(format!("{pod}.report.json"))) {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
            let ev = &v["propagation"]["evidence"];
            evidence = ev["kind"].as_str().map(str::to_owned);
            held_by = ev["held_by"].as_str().map(str::to_owned);
            for ev in v["timeline"].as_array().into_iter().flatten() {
                if let (Some(what), Some(at)) = (ev["event"].as_str(), ev["unix_ms"].as_u64()) {
                    let mut detail = String::new();
                    if let Some(obj) = ev.as_object() {
                        for (k, val) in obj {
                            if !matches!(k.as_str(), "event" | "at_ms" | "unix_ms") {
                                let _ = write!(detail, "{k}={val} ");
                            }
                        }
                    }
                    rows.push((
                        at,
                        "report".into(),
                        what.to_owned(),
                        detail.trim().to_owned(),
                    ));
                }
            }
            let kind = v["propagation"]["kind"].as_str().unwrap_or("?");
            rows.push((
                exit.unwrap_or(deleted),
                "report".into(),
                "summary".into(),
                format!(
                    "outcome={} propagation={kind} evidence={} held_by={}",
                    v["outcome"],
                    evidence.as_deref().unwrap_or("-"),
                    held_by.as_deref().unwrap_or("-")
                ),
            ));
        }
    }
    rows.sort_by_key(|r| r.0);
    let lines = rows
        .into_iter()
        .map(|(at, src, what, detail)| {
            let rel = at as i64 - deleted as i64;
            format!("{:>+7} ms  {src:<6} {what:<20} {detail}", rel)
        })
        .collect();
    PodTimeline {
        pod: pod.to_owned(),
        deleted_unix_ms: deleted,
        drain_ms: exit.map(|x| x.saturating_sub(deleted)),
        steps: Steps::from_events(pod, deleted, events),
        lines,
        evidence,
        held_by,
    }
}

/// `target/testbed/<unix-seconds>` next to the service binary's `target/`, or `./target/…`.
pub fn default_out(service_bin: &Path) -> PathBuf {
    let target = service_bin
        .ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "target"))
        .map_or_else(|| PathBuf::from("target"), Path::to_path_buf);
    target.join("testbed").join(format!("{}", unix_ms() / 1000))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lameduck runs the service; the baselines run `examples/baseline` next to it, with the
    /// flags the baseline binary takes.
    #[test]
    fn baselines_run_the_baseline_binary_next_to_the_service() {
        let service = Path::new("/t/examples/service");
        for server in Server::ALL {
            let (cmd, _) = CellConfig::new(server).server_cmd(service);
            match server {
                Server::Lameduck => {
                    assert_eq!(cmd.bin, service);
                    assert!(cmd
                        .flags
                        .iter()
                        .all(|f| f != "--naive" && f != "--fixed-sleep"));
                }
                Server::Naive => {
                    assert_eq!(cmd.bin, Path::new("/t/examples/baseline"));
                    assert_eq!(cmd.flags, ["--naive"]);
                }
                Server::Graceful | Server::Sleep5 => {
                    assert_eq!(cmd.bin, Path::new("/t/examples/baseline"));
                    assert_eq!(cmd.flags, ["--fixed-sleep", "0"]);
                }
            }
        }
    }
}
