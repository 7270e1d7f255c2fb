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

    /// The EndpointSlice controller: after each Pod change, waits `slice_delay`, then
    /// publishes the endpoints when they differ from the last published.
    pub async fn slice_controller(self: Arc<Self>) {
        loop {
            self.pod_changed.notified().await;
            tokio::time::sleep(self.plane.slice_delay).await;
            let eps = self.endpoints();
            if *self.slice.borrow() != eps {
                let text: Vec<String> = eps
                    .iter()
                    .map(|e| {
                        format!(
                            "{}({} r={} s={} t={})",
                            e.pod, e.ip, e.ready as u8, e.serving as u8, e.terminating as u8
                        )
                    })
                    .collect();
                self.record("slice", None, text.join(" "));
                self.slice.send_replace(eps);
            }
        }
    }

    /// Node `k`'s (1-based) kube-proxy: after each slice change, waits its `sync_delay` ±
    /// jitter, then applies the latest slice in one atomic write. A node whose syncs are slow
    /// ([`NodeSync::slow`]) reads the slice when it begins and writes it `sync_delay` later: a
    /// change during a sync waits for the next one (between one and two `sync_delay`s).
    pub async fn proxy_loop(self: Arc<Self>, k: usize, mut proxy: Proxy) {
        let mut rx = self.slice.subscribe();
        let mut n = 0u32;
        let mut last_done: Option<tokio::time::Instant> = None;
        let NodeSync {
            delay: sync_delay,
            slow,
        } = self.plane.nodes[k - 1];
        let applied = &self.applied[k - 1];
        let node = (self.nodes() > 1).then(|| format!("node{k}"));
        while rx.changed().await.is_ok() {
            let read_first = slow.then(|| rx.borrow_and_update().clone());
            if self.plane.min_sync_period {
                if let Some(done) = last_done {
                    tokio::time::sleep_until(done + sync_delay).await;
                }
            } else {
                let base = sync_delay.as_secs_f64();
                let delay = (base * (1.0 + self.plane.sync_jitter * self.jitter())).max(0.0);
                tokio::time::sleep(Duration::from_secs_f64(delay)).await;
            }
            let eps = match read_first {
                Some(eps) => eps,
                None => rx.borrow_and_update().clone(),
            };
            let chosen = proxy::choose(&eps);
            let ips: Vec<Ipv4Addr> = chosen.iter().map(|e| e.ip).collect();
            // kube-proxy syncs on every slice change, also one that leaves its rules as they
            // are; that sync counts for the rate limit too.
            last_done = Some(tokio::time::Instant::now());
            if *applied.borrow() == ips && n > 0 {
                continue;
            }
            n += 1;
            match proxy.apply(&chosen) {
                Ok(rules) => {
                    let names: Vec<&str> = chosen.iter().map(|e| e.pod.as_str()).collect();
                    let mut detail = if names.is_empty() {
                        "no endpoints: reject".to_owned()
                    } else {
                        names.join(" ")
                    };
                    // Flows conntrack keeps on endpoints that just left the rules.
                    for e in eps.iter().filter(|e| !ips.contains(&e.ip)) {
                        if let Some(n) = self.pinned_flows(k, e.ip) {
                            detail.push_str(&format!("; {} keeps {n} tracked flows", e.pod));
                        }
                    }
                    self.record_node("sync", node.as_deref(), detail);
                    last_done = Some(tokio::time::Instant::now());
                    let file = match &node {
                        Some(name) => format!("rules-{name}-{n:03}.txt"),
                        None => format!("rules-{n:03}.txt"),
                    };
                    let _ = std::fs::write(self.dir.join(file), rules);
                    applied.send_replace(ips);
                }
                Err(e) => self.record_node("sync_failed", node.as_deref(), e.to_string()),
            }
        }
    }

    fn record_node(&self, what: &str, node: Option<&str>, detail: String) {
        self.events.lock().unwrap().push(Event {
            unix_ms: unix_ms(),
            what: what.to_owned(),
            pod: None,
            node: node.map(str::to_owned),
            detail,
        });
    }

    /// Established TCP flows conntrack holds towards `ip` in node `k`'s namespace.
    fn pinned_flows(&self, k: usize, ip: Ipv4Addr) -> Option<usize> {
        let node = self.netns.lock().unwrap().node_of(k);
        let out = crate::net::run_in(
            &node,
            &[
                "conntrack",
                "-L",
                "-p",
                "tcp",
                "--state",
                "ESTABLISHED",
                "--reply-src",
                &ip.to_string(),
            ],
            None,
        )
        .ok()?;
        Some(out.lines().filter(|l| l.starts_with("tcp")).count())
    }

    /// Waits until every node's applied rules route to exactly `pods` (by name).
    pub async fn wait_applied(&self, pods: &[String]) {
        let ips: Vec<Ipv4Addr> = {
            let st = self.state.lock().unwrap();
            pods.iter()
                .filter_map(|n| st.iter().find(|p| &p.name == n).map(|p| p.ip))
                .collect()
        };
        for applied in &self.applied {
            let mut rx = applied.subscribe();
            let _ = rx
                .wait_for(|applied| {
                    applied.len() == ips.len() && ips.iter().all(|ip| applied.contains(ip))
                })
                .await;
        }
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

    /// Creates a Pod: a new namespace with a new IP, the service process in it, and its
    /// kubelet (probes now, termination on [`Cluster::delete`]). Returns its name.
    pub fn create_pod(self: &Arc<Self>) -> Result<String, NetError> {
        let n = {
            let mut next = self.next_pod.lock().unwrap();
            let n = *next;
            *next = next.saturating_add(1);
            n
        };
        // The scheduler's one decision: the nodes in turn.
        let host = (usize::from(n) - 1) % self.nodes() + 1;
        let (ns, ip) = self.netns.lock().unwrap().add_pod_on(n, host)?;
        let name = format!("pod-{n}");
        self.state.lock().unwrap().push(PodState {
            name: name.clone(),
            ip,
            ready: false,
            deleted_ms: None,
            exited_ms: None,
            pid: None,
        });
        let placed = if self.nodes() > 1 {
            format!("{ip} on node{host}")
        } else {
            ip.to_string()
        };
        self.record("created", Some(&name), placed);
        self.pod_changed.notify_one();
        let (del_tx, del_rx) = watch::channel(false);
        self.deleters.lock().unwrap().push((name.clone(), del_tx));
        let me = self.clone();
        let pod = name.clone();
        tokio::spawn(async move {
            // Sandbox, image, container start: the process comes up a while after the Pod
            // got its IP.
            tokio::time::sleep(me.kubelet.start_delay).await;
            match me.start_process(&pod, &ns) {
                Ok(child) => me.kubelet_pod(pod, ns, ip, child, del_rx).await,
                Err(e) => {
                    let (tx, _) = watch::channel(false);
                    me.finish(&pod, &format!("start failed: {e}"), &tx);
                }
            }
        });
        Ok(name)
    }

    fn start_process(&self, name: &str, ns: &str) -> Result<tokio::process::Child, NetError> {
        let report = self.dir.join(format!("{name}.report.json"));
        let log = std::fs::File::create(self.dir.join(format!("{name}.log")))
            .map_err(|e| NetError(format!("pod log: {e}")))?;
        let log2 = log
            .try_clone()
            .map_err(|e| NetError(format!("pod log: {e}")))?;
        let mut cmd = tokio::process::Command::new("ip");
        cmd.args(["netns", "exec", ns])
            .arg(&self.server.bin)
            .args(["--listen", &format!("0.0.0.0:{POD_PORT}")])
            .args(["--admin", &format!("0.0.0.0:{ADMIN_PORT}")])
            .args(["--instance", name])
            .arg("--report-file")
            .arg(&report)
            .args(&self.server.flags)
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log2)
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .map_err(|e| NetError(format!("start {}: {e}", self.server.bin.display())))?;
        if let Some(pid) = child.id() {
            crate::net::pid_started(pid);
            if let Some(p) = self
                .state
                .lock()
                .unwrap()
                .iter_mut()
                .find(|p| p.name == name)
            {
                p.pid = Some(pid);
            }
        }
        self.record("started", Some(name), "");
        Ok(child)
    }

    /// Deletes Pod `name`: kubelet starts its termination.
    pub fn delete(&self, name: &str) {
        if let Some((_, tx)) = self
            .deleters
            .lock()
            .unwrap()
            .iter()
            .find(|(n, _)| n == name)
        {
            tx.send_replace(true);
        }
    }

    fn set_ready(&self, name: &str, ready: bool) {
        let mut st = self.state.lock().unwrap();
        if let Some(p) = st.iter_mut().find(|p| p.name == name) {
            if p.ready != ready && p.exited_ms.is_none() {
                p.ready = ready;
                drop(st);
                self.record(if ready { "ready" } else { "not_ready" }, Some(name), "");
                self.pod_changed.notify_one();
            }
        }
    }

    /// kubelet for one Pod: readiness probes until the process exits; on deletion the hook,
    /// the stop signal, and SIGKILL at the grace period.
    async fn kubelet_pod(
        self: Arc<Self>,
        name: String,
        ns: String,
        ip: Ipv4Addr,
        mut child: tokio::process::Child,
        mut deleted: watch::Receiver<bool>,
    ) {
        let admin = SocketAddr::from((ip, ADMIN_PORT));
        let (exit_tx, exit_rx) = watch::channel(false);
        // Readiness probes, until exit.
        let prober = {
            let me = self.clone();
            let name = name.clone();
            let mut exit_rx = exit_rx.clone();
            tokio::spawn(async move {
                let k = &me.kubelet;
                let (mut ok_run, mut fail_run) = (0u32, 0u32);
                let mut tick = tokio::time::interval(k.period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                // The first probe comes a moment after the start, like kubelet's.
                tokio::time::sleep(Duration::from_millis(200)).await;
                loop {
                    tokio::select! {
                        _ = async { let _ = exit_rx.wait_for(|e| *e).await; } => return,
                        _ = tick.tick() => {}
                    }
                    let ok = matches!(http_get(admin, "/readyz", k.timeout).await, Ok(200));
                    if ok {
                        ok_run += 1;
                        fail_run = 0;
                        if ok_run >= k.success_threshold {
                            me.set_ready(&name, true);
                        }
                    } else {
                        fail_run += 1;
                        ok_run = 0;
                        if fail_run >= k.failure_threshold {
                            me.set_ready(&name, false);
                        }
                    }
                }
            })
        };
        // Deletion, or an exit on its own.
        let deleted_at = tokio::select! {
            _ = async { let _ = deleted.wait_for(|d| *d).await; } => Some(tokio::time::Instant::now()),
            status = child.wait() => {
                self.finish(&name, &format!("exited before deletion: {status:?}"), &exit_tx);
                let _ = prober.await;
                return;
            }
        };
        let deleted_at = deleted_at.expect("deleted");
        let kill_at = deleted_at + self.kubelet.grace;
        let now = unix_ms();
        if let Some(p) = self
            .state
            .lock()
            .unwrap()
            .iter_mut()
            .find(|p| p.name == name)
        {
            p.deleted_ms = Some(now);
        }
        self.record("deleted", Some(&name), "");
        self.pod_changed.notify_one();

        let hook = async {
            match &self.kubelet.pre_stop {
                PreStop::None => None,
                PreStop::HttpGet(path) => {
                    Some(match http_get(admin, path, self.kubelet.grace).await {
                        Ok(code) => format!("httpGet {path}: {code}"),
                        Err(e) => format!("httpGet {path}: {e}"),
                    })
                }
                PreStop::Exec => {
                    let out = tokio::process::Command::new("ip")
                        .args(["netns", "exec", &ns])
                        .arg(&self.server.bin)
                        .args(["prestop", "--admin", &admin.to_string()])
                        .stdin(std::process::Stdio::null())
                        .output()
                        .await;
                    Some(match out {
                        Ok(o) => format!("exec prestop: {}", o.status),
                        Err(e) => format!("exec prestop: {e}"),
                    })
                }
                PreStop::Sleep(d) => {
                    tokio::time::sleep(*d).await;
                    Some(format!("sleep {}ms", d.as_millis()))
                }
            }
        };
        let hook_result = tokio::select! {
            r = hook => r,
            () = tokio::time::sleep_until(kill_at) => Some("hook cut at the grace period".to_owned()),
        };
        if let Some(r) = hook_result {
            self.record("prestop_returned", Some(&name), r);
        }
        if let Some(pid) = child.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                self.kubelet.stop_signal,
            );
            self.record("signal", Some(&name), self.kubelet.stop_signal.as_str());
        }
        let status = tokio::select! {
            s = child.wait() => s,
            () = tokio::time::sleep_until(kill_at) => {
                let _ = child.start_kill();
                self.record("killed", Some(&name), "SIGKILL at the grace period");
                child.wait().await
            }
        };
        let detail = match status {
            Ok(s) => match s.code() {
                Some(c) => format!("code {c}"),
                None => format!("{s}"),
            },
            Err(e) => e.to_string(),
        };
        self.finish(&name, &detail, &exit_tx);
        let _ = prober.await;
    }

    fn finish(&self, name: &str, detail: &str, exit_tx: &watch::Sender<bool>) {
        if let Some(p) = self
            .state
            .lock()
            .unwrap()
            .iter_mut()
            .find(|p| p.name == name)
        {
            if let Some(pid) = p.pid {
                crate::net::pid_exited(pid);
            }
            p.exited_ms = Some(unix_ms());
            p.ready = false;
            p.pid = None;
        }
        self.record("exit", Some(name), detail);
        exit_tx.send_replace(true);
        self.pod_changed.notify_one();
    }

    /// A Deployment-like rolling update from `old` to as many new Pods: creates replacements
    /// (each on a new IP) while at most `max_surge` above `old.len()`, deletes old Pods while at
    /// least `replicas - max_unavailable` stay available, until every old Pod is deleted and the
    /// new ones are Ready. Returns the new Pods' names.
    pub async fn rollout(
        self: &Arc<Self>,
        old: &[String],
        max_surge: usize,
        max_unavailable: usize,
        deadline: Duration,
    ) -> Result<Vec<String>, NetError> {
        let replicas = old.len();
        let mut remaining: Vec<String> = old.to_vec();
        let mut new: Vec<String> = Vec::new();
        let give_up = tokio::time::Instant::now() + deadline;
        loop {
            let new_ready = new.iter().filter(|n| self.available(n)).count();
            if remaining.is_empty() && new_ready == replicas {
                return Ok(new);
            }
            if tokio::time::Instant::now() > give_up {
                return Err(NetError(format!(
                    "rollout did not finish in {deadline:?}: {new_ready} of {replicas} new Pods ready"
                )));
            }
            while new.len() < replicas && new.len() + remaining.len() < replicas + max_surge {
                new.push(self.create_pod()?);
            }
            let mut available = new_ready + remaining.iter().filter(|n| self.available(n)).count();
            while !remaining.is_empty() && available + max_unavailable > replicas {
                let victim = remaining.remove(0);
                if self.available(&victim) {
                    available -= 1;
                }
                self.delete(&victim);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
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
