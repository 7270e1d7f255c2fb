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

    // ---- the controller's side -------------------------------------------------------

    /// Creates the Service (ClusterIP [`SERVICE_VIP`], port 80 → 8080), with
    /// `publishNotReadyAddresses` as given.
    pub async fn create_service(&self, publish_not_ready: bool) -> Result<(), NetError> {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": SERVICE, "namespace": NAMESPACE},
            "spec": {
                "clusterIP": SERVICE_VIP.to_string(),
                "publishNotReadyAddresses": publish_not_ready,
                "selector": {"app": APP},
                "ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": "http", "protocol": "TCP"}]
            }
        }))
        .map_err(err("service"))?;
        Api::<Service>::namespaced(self.admin.clone(), NAMESPACE)
            .create(&PostParams::default(), &svc)
            .await
            .map_err(err("create the Service"))?;
        Ok(())
    }

    /// Loads the cluster with `count` other Services, each with an EndpointSlice of two
    /// endpoints (addresses in 198.19.0.0/16 that nothing answers; no client uses them), as a
    /// cluster with thousands of Services has: every kube-proxy writes their rules on every
    /// sync. Sixteen writers at once; returns how long it took.
    pub async fn load_services(self: &Arc<Self>, count: usize) -> Result<Duration, NetError> {
        let t0 = tokio::time::Instant::now();
        let writers = 16;
        let mut tasks = Vec::new();
        for w in 0..writers {
            let me = self.clone();
            tasks.push(tokio::spawn(async move {
                let svcs = Api::<Service>::namespaced(me.admin.clone(), NAMESPACE);
                let slices = Api::<EndpointSlice>::namespaced(me.admin.clone(), NAMESPACE);
                let pp = PostParams::default();
                for i in (w..count).step_by(writers) {
                    let name = format!("load-{i:05}");
                    let svc: Service = serde_json::from_value(json!({
                        "metadata": {"name": name, "namespace": NAMESPACE},
                        "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
                    }))
                    .map_err(err("load service"))?;
                    svcs.create(&pp, &svc).await.map_err(err("create a load Service"))?;
                    let ip = |j: usize| {
                        let n = i * 2 + j;
                        format!("198.19.{}.{}", n / 250, n % 250 + 1)
                    };
                    let slice: EndpointSlice = serde_json::from_value(json!({
                        "metadata": {"name": format!("{name}-1"), "namespace": NAMESPACE,
                                     "labels": {"kubernetes.io/service-name": name,
                                                "endpointslice.kubernetes.io/managed-by": "lameduck-testbed"}},
                        "addressType": "IPv4",
                        "endpoints": [
                            {"addresses": [ip(0)], "conditions": {"ready": true}},
                            {"addresses": [ip(1)], "conditions": {"ready": true}},
                        ],
                        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
                    }))
                    .map_err(err("load slice"))?;
                    slices
                        .create(&pp, &slice)
                        .await
                        .map_err(err("create a load EndpointSlice"))?;
                }
                Ok::<(), NetError>(())
            }));
        }
        for t in tasks {
            t.await.map_err(err("load writer"))??;
        }
        let took = t0.elapsed();
        self.record(
            "services_loaded",
            None,
            format!(
                "{count} Services with 2 endpoints each in {} ms",
                took.as_millis()
            ),
        );
        Ok(took)
    }

    /// The Pod spec of template `t` (no `nodeName`).
    fn pod_spec(t: &PodTemplate) -> serde_json::Value {
        let lifecycle = match &t.pre_stop {
            PreStop::None => json!(null),
            PreStop::HttpGet(path) => {
                json!({"preStop": {"httpGet": {"path": path, "port": "admin"}}})
            }
            PreStop::Exec => {
                json!({"preStop": {"exec": {"command": ["service", "prestop", "--admin", format!("127.0.0.1:{}", net::ADMIN_PORT)]}}})
            }
            PreStop::Sleep(d) => json!({"preStop": {"sleep": {"seconds": d.as_secs()}}}),
        };
        let mut env: Vec<serde_json::Value> = t
            .env
            .iter()
            .map(|(k, v)| json!({"name": k, "value": v}))
            .collect();
        for (name, path) in [
            ("POD_NAME", "metadata.name"),
            ("POD_NAMESPACE", "metadata.namespace"),
            ("POD_UID", "metadata.uid"),
            ("POD_IP", "status.podIP"),
        ] {
            env.push(json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}));
        }
        let mut container = json!({
            "name": "service",
            "image": "lameduck-testbed/service",
            "args": t.args,
            "env": env,
            "ports": [
                {"name": "http", "containerPort": net::POD_PORT, "protocol": "TCP"},
                {"name": "admin", "containerPort": net::ADMIN_PORT, "protocol": "TCP"}
            ],
            "readinessProbe": {
                "httpGet": {"path": "/readyz", "port": "admin"},
                "periodSeconds": 2, "timeoutSeconds": 1, "failureThreshold": 1, "successThreshold": 1
            }
        });
        if !lifecycle.is_null() {
            container["lifecycle"] = lifecycle;
        }
        let mut spec = json!({
            "terminationGracePeriodSeconds": t.grace.as_secs(),
            "containers": [container],
        });
        match &t.service_account {
            Some(sa) => spec["serviceAccountName"] = json!(sa),
            None => spec["automountServiceAccountToken"] = json!(false),
        }
        spec
    }

    /// Creates the Deployment (maxSurge 1, maxUnavailable 0) of `replicas` Pods of `t`: the
    /// real Deployment and ReplicaSet controllers create and delete its Pods.
    pub async fn create_deployment(
        &self,
        replicas: usize,
        t: &PodTemplate,
    ) -> Result<(), NetError> {
        use k8s_openapi::api::apps::v1::Deployment;
        let d: Deployment = serde_json::from_value(json!({
            "metadata": {"name": SERVICE, "namespace": NAMESPACE},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": APP}},
                "strategy": {"type": "RollingUpdate",
                             "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                "template": {"metadata": {"labels": {"app": APP}}, "spec": Self::pod_spec(t)},
            }
        }))
        .map_err(err("deployment"))?;
        Api::<Deployment>::namespaced(self.admin.clone(), NAMESPACE)
            .create(&PostParams::default(), &d)
            .await
            .map_err(err("create the Deployment"))?;
        self.record("deployment_created", None, format!("{replicas} replicas"));
        Ok(())
    }

    /// Starts a rollout of the Deployment: a new template revision (an annotation).
    pub async fn roll_deployment(&self, revision: u32) -> Result<(), NetError> {
        use k8s_openapi::api::apps::v1::Deployment;
        let patch = json!({"spec": {"template": {"metadata": {"annotations":
            {"lameduck-testbed/revision": revision.to_string()}}}}});
        Api::<Deployment>::namespaced(self.admin.clone(), NAMESPACE)
            .patch(SERVICE, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(err("roll the Deployment"))?;
        self.record(
            "rollout_started",
            None,
            format!("template revision {revision}"),
        );
        Ok(())
    }

    /// Evicts Pod `name` through the Eviction API (what `kubectl drain` does).
    pub async fn evict(&self, name: &str) -> Result<(), NetError> {
        self.record("evict_requested", Some(name), "");
        Api::<Pod>::namespaced(self.admin.clone(), NAMESPACE)
            .evict(name, &kube::api::EvictParams::default())
            .await
            .map_err(err("evict"))?;
        Ok(())
    }

    /// The Pods the API shows, not being deleted and not gone, Ready or not.
    pub fn live_pods(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .pods
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, p)| !p.deleting && !p.gone)
            .map(|(n, _)| n.clone())
            .collect();
        v.sort();
        v
    }

    /// The scheduler's one decision here: every unscheduled Pod is bound to the node.
    async fn scheduler_loop(self: Arc<Self>) {
        let api = Api::<Pod>::namespaced(self.admin.clone(), NAMESPACE);
        let cfg = watcher::Config::default().fields("spec.nodeName=");
        let mut stream = watcher(api.clone(), cfg).boxed();
        while let Some(ev) = stream.next().await {
            let pod = match ev {
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => p,
                Ok(_) => continue,
                Err(e) => {
                    self.record("watch_error", None, format!("unscheduled pods: {e}"));
                    continue;
                }
            };
            if pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let name = pod.metadata.name.clone().unwrap_or_default();
            let binding = json!({
                "apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "target": {"apiVersion": "v1", "kind": "Node", "name": NODE_NAME},
            });
            let r = api
                .create_subresource::<serde_json::Value>(
                    "binding",
                    &name,
                    &PostParams::default(),
                    binding.to_string().into_bytes(),
                )
                .await;
            match r {
                Ok(_) => self.record("bound", Some(&name), NODE_NAME),
                Err(e) => self.record("bind_failed", Some(&name), e.to_string()),
            }
        }
    }

    /// Creates Pod `name` bound to the node (no scheduler involved).
    pub async fn create_pod(&self, name: &str, t: &PodTemplate) -> Result<(), NetError> {
        let mut spec = Self::pod_spec(t);
        spec["nodeName"] = json!(NODE_NAME);
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": APP}},
            "spec": spec,
        }))
        .map_err(err("pod"))?;
        let api = Api::<Pod>::namespaced(self.admin.clone(), NAMESPACE);
        // The ServiceAccount admission needs the account, which the controller-manager
        // creates a moment after the namespace appears.
        let give_up = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            match api.create(&PostParams::default(), &pod).await {
                Ok(_) => break,
                Err(kube::Error::Api(e))
                    if e.message.contains("serviceaccount")
                        && tokio::time::Instant::now() < give_up =>
                {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(NetError(format!("create Pod {name}: {e}"))),
            }
        }
        self.pods
            .lock()
            .unwrap()
            .entry(name.to_owned())
            .or_default();
        self.record("create_requested", Some(name), "");
        Ok(())
    }

    /// Applies `examples/k8s/`'s ServiceAccount, Role and RoleBinding unchanged (what the
    /// `kube` feature needs to read its Pod, the EndpointSlices and the Service).
    pub async fn apply_example_rbac(&self) -> Result<(), NetError> {
        use k8s_openapi::api::core::v1::ServiceAccount;
        use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
        let pp = PostParams::default();
        let yaml = |text: &str| -> Result<serde_json::Value, NetError> {
            serde_yaml::from_str(text).map_err(err("examples/k8s"))
        };
        let sa: ServiceAccount = serde_json::from_value(yaml(include_str!(
            "../../examples/k8s/serviceaccount.yaml"
        ))?)
        .map_err(err("serviceaccount.yaml"))?;
        Api::<ServiceAccount>::namespaced(self.admin.clone(), NAMESPACE)
            .create(&pp, &sa)
            .await
            .map_err(err("apply serviceaccount.yaml"))?;
        let role: Role =
            serde_json::from_value(yaml(include_str!("../../examples/k8s/role.yaml"))?)
                .map_err(err("role.yaml"))?;
        Api::<Role>::namespaced(self.admin.clone(), NAMESPACE)
            .create(&pp, &role)
            .await
            .map_err(err("apply role.yaml"))?;
        let rb: RoleBinding =
            serde_json::from_value(yaml(include_str!("../../examples/k8s/rolebinding.yaml"))?)
                .map_err(err("rolebinding.yaml"))?;
        Api::<RoleBinding>::namespaced(self.admin.clone(), NAMESPACE)
            .create(&pp, &rb)
            .await
            .map_err(err("apply rolebinding.yaml"))?;
        self.record(
            "rbac_applied",
            None,
            "examples/k8s/{serviceaccount,role,rolebinding}.yaml",
        );
        Ok(())
    }

    /// Deletes Pod `name` through the API (its own grace period).
    pub async fn delete_pod(&self, name: &str) -> Result<(), NetError> {
        self.record("delete_requested", Some(name), "");
        Api::<Pod>::namespaced(self.admin.clone(), NAMESPACE)
            .delete(name, &DeleteParams::default())
            .await
            .map_err(err("delete Pod"))?;
        Ok(())
    }

    /// The Deployment controller's rolling update (maxSurge, maxUnavailable) from `old` to
    /// new Pods named `pod-<first_new>`, `pod-<first_new + 1>`, …; returns the new Pods.
    pub async fn rollout(
        &self,
        old: &[String],
        template: &PodTemplate,
        first_new: usize,
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
                let name = format!("pod-{}", first_new + new.len());
                self.create_pod(&name, template).await?;
                new.push(name);
            }
            let mut available = new_ready + remaining.iter().filter(|n| self.available(n)).count();
            while !remaining.is_empty() && available + max_unavailable > replicas {
                let victim = remaining.remove(0);
                if self.available(&victim) {
                    available -= 1;
                }
                self.delete_pod(&victim).await?;
            }
            tokio::select! {
                () = self.pods_changed.notified() => {}
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
    }

    // ---- the watchers ----------------------------------------------------------------

    /// Every EndpointSlice change of the Service, as the watch delivers it.
    async fn watch_slices(self: Arc<Self>) {
        let api = Api::<EndpointSlice>::namespaced(self.admin.clone(), NAMESPACE);
        let cfg =
            watcher::Config::default().labels(&format!("kubernetes.io/service-name={SERVICE}"));
        let mut slices: BTreeMap<String, String> = BTreeMap::new();
        let mut last = String::new();
        let mut stream = watcher(api, cfg).boxed();
        while let Some(ev) = stream.next().await {
            let (slice, gone) = match ev {
                Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s)) => (s, false),
                Ok(watcher::Event::Delete(s)) => (s, true),
                Ok(_) => continue,
                Err(e) => {
                    self.record("watch_error", None, format!("endpointslices: {e}"));
                    continue;
                }
            };
            let name = slice.metadata.name.clone().unwrap_or_default();
            if gone {
                slices.remove(&name);
            } else {
                let text: Vec<String> = slice
                    .endpoints
                    .iter()
                    .map(|e| {
                        let c = e.conditions.clone().unwrap_or_default();
                        let pod = e
                            .target_ref
                            .as_ref()
                            .and_then(|r| r.name.clone())
                            .unwrap_or_else(|| e.addresses.join(","));
                        format!(
                            "{pod}({} r={} s={} t={})",
                            e.addresses.join(","),
                            c.ready.unwrap_or(false) as u8,
                            c.serving.unwrap_or(false) as u8,
                            c.terminating.unwrap_or(false) as u8
                        )
                    })
                    .collect();
                slices.insert(name, text.join(" "));
            }
            let all: Vec<&str> = slices
                .values()
                .map(String::as_str)
                .filter(|s| !s.is_empty())
                .collect();
            let now = all.join(" ");
            if now != last {
                self.record("slice", None, now.clone());
                last = now;
            }
        }
    }

    /// Node `k`'s kube-proxy's metrics every 100 ms; each new sync (its own timestamp) is
    /// recorded with the endpoints its rules DNAT to, the sync's duration and the
    /// network-programming latencies it observed.
    async fn scrape_proxy(self: Arc<Self>, k: usize) {
        let mut prev = ProxyMetrics::default();
        let mut n = 0u32;
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let metrics = k8s::proxy_metrics(k);
        let node_ns = self.node_nss[k - 1].clone();
        let node = (self.rules.len() > 1).then(|| format!("node{k}"));
        loop {
            tick.tick().await;
            let Ok(text) = k8s::http_text(&metrics, "/metrics").await else {
                continue;
            };
            let m = ProxyMetrics::parse(&text);
            if m.last_sync == prev.last_sync || m.last_sync == 0.0 {
                continue;
            }
            let (ips, rules) = match k8s::rule_endpoints(&node_ns, self.backend) {
                Ok(r) => r,
                Err(e) => {
                    self.record_node_at(
                        unix_ms(),
                        "rules_unreadable",
                        None,
                        node.clone(),
                        e.to_string(),
                    );
                    continue;
                }
            };
            n += 1;
            let file = match &node {
                Some(name) => format!("rules-{name}-{n:03}.txt"),
                None => format!("rules-{n:03}.txt"),
            };
            let _ = std::fs::write(self.dir.join(file), rules);
            let syncs = m.sync_count.saturating_sub(prev.sync_count);
            let took = if syncs > 0 {
                (m.sync_sum - prev.sync_sum) / syncs as f64 * 1000.0
            } else {
                0.0
            };
            let mut detail: Vec<String> = ips.iter().map(|ip| self.pod_ip_name(*ip)).collect();
            if detail.is_empty() {
                detail.push("no endpoints".into());
            }
            let mut detail = detail.join(" ");
            detail.push_str(&format!("; {syncs} sync(s), {took:.0} ms each"));
            let programmed = m.programming_count.saturating_sub(prev.programming_count);
            if programmed > 0 {
                let mean = (m.programming_sum - prev.programming_sum) / programmed as f64;
                detail.push_str(&format!(
                    "; network programming {:.0} ms (mean of {programmed})",
                    mean * 1000.0
                ));
            }
            self.record_node_at(
                (m.last_sync * 1000.0) as u64,
                "sync",
                None,
                node.clone(),
                detail,
            );
            self.rules[k - 1].send_replace(ips);
            prev = m;
        }
    }

    // ---- the kubelet -----------------------------------------------------------------

    /// Registers node `k`'s Node (Ready, its InternalIP the node's client-side address):
    /// node 1 as its kubelet, the others (which run no Pods here, only their kube-proxy) as
    /// the controller, since NodeRestriction lets a kubelet write only its own Node.
    async fn register_node(&self, k: usize) -> Result<(), NetError> {
        let name = k8s::node_name(k);
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        }))
        .map_err(err("node"))?;
        let api = Api::<Node>::all(if k <= 1 {
            self.kubelet.clone()
        } else {
            self.admin.clone()
        });
        api.create(&PostParams::default(), &node)
            .await
            .map_err(err("register the Node"))?;
        let now = rfc3339_now();
        let status = json!({"status": {
            "addresses": [{"type": "InternalIP", "address": net::client_link(k).0.to_string()},
                          {"type": "Hostname", "address": name}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "the lameduck testbed's kubelet",
                            "lastHeartbeatTime": now, "lastTransitionTime": now}],
            "capacity": {"cpu": "2", "memory": "8Gi", "pods": "110"},
            "allocatable": {"cpu": "2", "memory": "8Gi", "pods": "110"},
        }});
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map_err(err("the Node's status"))?;
        Ok(())
    }

    /// kubelet's Pod loop: the Pods bound to this node, as the watch delivers them.
    async fn kubelet_loop(self: Arc<Self>) {
        let api = Api::<Pod>::all(self.kubelet.clone());
        let cfg = watcher::Config::default().fields(&format!("spec.nodeName={NODE_NAME}"));
        let mut stream = watcher(api, cfg).boxed();
        while let Some(ev) = stream.next().await {
            let (pod, gone) = match ev {
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => (p, false),
                Ok(watcher::Event::Delete(p)) => (p, true),
                Ok(_) => continue,
                Err(e) => {
                    self.record("watch_error", None, format!("pods: {e}"));
                    continue;
                }
            };
            let name = pod.metadata.name.clone().unwrap_or_default();
            let deleting = pod.metadata.deletion_timestamp.is_some();
            let ready = pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                .is_some_and(|c| c.status == "True");
            let ip = pod
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.as_ref())
                .and_then(|ip| ip.parse().ok());
            let known = self.deleters.lock().unwrap().contains_key(&name);
            let (was_deleting, was_ready) = {
                let mut st = self.pods.lock().unwrap();
                let v = st.entry(name.clone()).or_default();
                let before = (v.deleting, v.ready);
                v.deleting = deleting;
                v.ready = ready;
                v.gone = gone;
                if ip.is_some() {
                    v.ip = ip;
                }
                before
            };
            if ready != was_ready && !gone {
                self.record(
                    if ready { "api_ready" } else { "api_not_ready" },
                    Some(&name),
                    "",
                );
            }
            if gone {
                self.record("removed", Some(&name), "the Pod object is gone");
            } else if deleting && !was_deleting {
                let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(30);
                let ts = pod
                    .metadata
                    .deletion_timestamp
                    .as_ref()
                    .map(|t| t.0.to_string())
                    .unwrap_or_default();
                self.record(
                    "deleted",
                    Some(&name),
                    format!("deletionTimestamp {ts}, grace {grace}s"),
                );
                let tx = self.deleters.lock().unwrap().get(&name).cloned();
                if let Some(tx) = tx {
                    tx.send_replace(Some(Duration::from_secs(grace.max(0) as u64)));
                }
            } else if !known && !deleting {
                let (tx, rx) = watch::channel(None);
                self.deleters.lock().unwrap().insert(name.clone(), tx);
                self.record("scheduled", Some(&name), "");
                let me = self.clone();
                tokio::spawn(async move {
                    if let Err(e) = me.clone().run_pod(pod, rx).await {
                        me.record("pod_failed", Some(&name), e.to_string());
                    }
                });
            }
            self.pods_changed.notify_waiters();
        }
    }

    async fn patch_pod_status(&self, name: &str, status: serde_json::Value) {
        let api = Api::<Pod>::namespaced(self.kubelet.clone(), NAMESPACE);
        if let Err(e) = api
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "status": status })),
            )
            .await
        {
            self.record("status_failed", Some(name), e.to_string());
        }
    }

    fn status_json(ip: Ipv4Addr, started: &str, ready: bool, running: bool) -> serde_json::Value {
        let now = rfc3339_now();
        let b = |v: bool| if v { "True" } else { "False" };
        json!({
            "phase": "Running",
            "hostIP": NODE_CLIENT_IP.to_string(),
            "hostIPs": [{"ip": NODE_CLIENT_IP.to_string()}],
            "podIP": ip.to_string(),
            "podIPs": [{"ip": ip.to_string()}],
            "startTime": started,
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": started},
                {"type": "Initialized", "status": "True", "lastTransitionTime": started},
                {"type": "ContainersReady", "status": b(ready), "lastTransitionTime": now},
                {"type": "Ready", "status": b(ready), "lastTransitionTime": now},
            ],
            "containerStatuses": [{
                "name": "service", "image": "lameduck-testbed/service", "imageID": "",
                "ready": ready, "started": running, "restartCount": 0,
                "state": if running { json!({"running": {"startedAt": started}}) } else { json!({"waiting": {"reason": "ContainerCreating"}}) },
            }],
        })
    }

    /// One Pod's life on this node.
    async fn run_pod(
        self: Arc<Self>,
        pod: Pod,
        mut deleted: watch::Receiver<Option<Duration>>,
    ) -> Result<(), NetError> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let spec = pod.spec.clone().unwrap_or_default();
        let container = spec
            .containers
            .first()
            .cloned()
            .ok_or_else(|| NetError("a Pod without containers".into()))?;
        // Sandbox: a network namespace and a new IP.
        let n = {
            let mut next = self.next_ip.lock().unwrap();
            let n = *next;
            *next = next.saturating_add(1);
            n
        };
        let (ns, ip) = self.netns.lock().unwrap().add_pod(n)?;
        let started = rfc3339_now();
        self.record("created", Some(&name), ip.to_string());
        self.patch_pod_status(&name, Self::status_json(ip, &started, false, false))
            .await;
        // Image pull and container start.
        tokio::time::sleep(self.start_delay).await;
        let env = self.container_env(&pod, &container, ip).await?;
        let run_dir = self.service_account_files(&pod, &container).await?;
        let report = self.dir.join(format!("{name}.report.json"));
        let log =
            std::fs::File::create(self.dir.join(format!("{name}.log"))).map_err(err("pod log"))?;
        let log2 = log.try_clone().map_err(err("pod log"))?;
        let mut cmd = tokio::process::Command::new("ip");
        cmd.args(["netns", "exec", &ns]);
        if let Some(run) = &run_dir {
            // `ip netns exec` gave the process a mount namespace of its own (mounts do not
            // propagate back): the Pod's /run holds its projected ServiceAccount volume at
            // /var/run/secrets/kubernetes.io/serviceaccount, where in-cluster clients read it.
            cmd.args(["sh", "-c", "mount --bind \"$0\" /run && exec \"$@\""])
                .arg(run);
        }
        cmd.arg(&self.service_bin)
            .args(container.args.clone().unwrap_or_default())
            .args(["--instance", &name])
            .arg("--report-file")
            .arg(&report)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env)
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log2)
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(err("start the container"))?;
        if let Some(pid) = child.id() {
            net::pid_started(pid);
        }
        self.record("started", Some(&name), "");
        self.patch_pod_status(&name, Self::status_json(ip, &started, false, true))
            .await;

        // Readiness probes until exit, each verdict change written to the Pod's status.
        let (exit_tx, exit_rx) = watch::channel(false);
        let prober = tokio::spawn(self.clone().probe_loop(
            name.clone(),
            ip,
            started.clone(),
            container.clone(),
            exit_rx,
        ));

        let grace = tokio::select! {
            g = async { deleted.wait_for(Option::is_some).await.ok().and_then(|g| *g) } => g.unwrap_or(Duration::from_secs(30)),
            status = child.wait() => {
                exit_tx.send_replace(true);
                self.record("exit", Some(&name), format!("exited before deletion: {status:?}"));
                let _ = prober.await;
                return Ok(());
            }
        };
        let deleted_at = tokio::time::Instant::now();
        let kill_at = deleted_at + grace;
        let hook = async {
            let lifecycle = container.lifecycle.as_ref()?;
            let pre = lifecycle.pre_stop.as_ref()?;
            if let Some(h) = &pre.http_get {
                let port = resolve_port(&container, &h.port);
                let path = h.path.clone().unwrap_or_else(|| "/".into());
                let addr = SocketAddr::from((ip, port));
                return Some(match http_get(addr, &path, grace).await {
                    Ok(code) => format!("httpGet {path}: {code}"),
                    Err(e) => format!("httpGet {path}: {e}"),
                });
            }
            if let Some(e) = &pre.exec {
                let cmdline = e.command.clone().unwrap_or_default();
                let mut c = tokio::process::Command::new("ip");
                c.args(["netns", "exec", &ns]);
                for (i, a) in cmdline.iter().enumerate() {
                    if i == 0 && a == "service" {
                        c.arg(&self.service_bin);
                    } else {
                        c.arg(a);
                    }
                }
                let out = c.stdin(std::process::Stdio::null()).output().await;
                return Some(match out {
                    Ok(o) => format!("exec {}: {}", cmdline.join(" "), o.status),
                    Err(e) => format!("exec: {e}"),
                });
            }
            if let Some(s) = &pre.sleep {
                tokio::time::sleep(Duration::from_secs(s.seconds.max(0) as u64)).await;
                return Some(format!("sleep {}s", s.seconds));
            }
            None
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
                nix::sys::signal::Signal::SIGTERM,
            );
            self.record("signal", Some(&name), "SIGTERM");
        }
        let status = tokio::select! {
            s = child.wait() => s,
            () = tokio::time::sleep_until(kill_at) => {
                let _ = child.start_kill();
                self.record("killed", Some(&name), "SIGKILL at the grace period");
                child.wait().await
            }
        };
        if let Some(pid) = child.id() {
            net::pid_exited(pid);
        }
        let code = status.as_ref().ok().and_then(|s| s.code());
        self.record(
            "exit",
            Some(&name),
            match &status {
                Ok(s) => match s.code() {
                    Some(c) => format!("code {c}"),
                    None => format!("{s}"),
                },
                Err(e) => e.to_string(),
            },
        );
        exit_tx.send_replace(true);
        let _ = prober.await;
        // The terminal status, then the object's removal (kubelet's status manager).
        let now = rfc3339_now();
        let code = code.unwrap_or(137);
        let mut st = Self::status_json(ip, &started, false, false);
        st["phase"] = json!(if code == 0 { "Succeeded" } else { "Failed" });
        st["containerStatuses"][0]["started"] = json!(false);
        st["containerStatuses"][0]["state"] = json!({"terminated": {
            "exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" },
            "startedAt": started, "finishedAt": now}});
        self.patch_pod_status(&name, st).await;
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        if let Err(e) = Api::<Pod>::namespaced(self.kubelet.clone(), NAMESPACE)
            .delete(&name, &dp)
            .await
        {
            self.record("remove_failed", Some(&name), e.to_string());
        }
        Ok(())
    }

    async fn probe_loop(
        self: Arc<Self>,
        name: String,
        ip: Ipv4Addr,
        started: String,
        container: Container,
        mut exit: watch::Receiver<bool>,
    ) {
        let Some(probe) = container.readiness_probe.clone() else {
            self.patch_pod_status(&name, Self::status_json(ip, &started, true, true))
                .await;
            return;
        };
        let secs = |v: Option<i32>, d: i32| Duration::from_secs(v.unwrap_or(d).max(1) as u64);
        let period = secs(probe.period_seconds, 10);
        let timeout = secs(probe.timeout_seconds, 1);
        let fail_at = probe.failure_threshold.unwrap_or(3).max(1) as u32;
        let ok_at = probe.success_threshold.unwrap_or(1).max(1) as u32;
        let (path, port) = match &probe.http_get {
            Some(h) => (
                h.path.clone().unwrap_or_else(|| "/".into()),
                resolve_port(&container, &h.port),
            ),
            None => return,
        };
        let addr = SocketAddr::from((ip, port));
        let (mut ok_run, mut fail_run, mut ready) = (0u32, 0u32, false);
        tokio::time::sleep(Duration::from_secs(
            probe.initial_delay_seconds.unwrap_or(0).max(0) as u64,
        ))
        .await;
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = exit.wait_for(|e| *e) => return,
                _ = tick.tick() => {}
            }
            let ok = matches!(http_get(addr, &path, timeout).await, Ok(200..=399));
            if ok {
                ok_run += 1;
                fail_run = 0;
            } else {
                fail_run += 1;
                ok_run = 0;
            }
            let verdict = if ok && ok_run >= ok_at {
                true
            } else if !ok && fail_run >= fail_at {
                false
            } else {
                ready
            };
            if verdict != ready && !*exit.borrow() {
                ready = verdict;
                self.record(
                    if ready { "ready" } else { "not_ready" },
                    Some(&name),
                    "probe",
                );
                self.patch_pod_status(&name, Self::status_json(ip, &started, ready, true))
                    .await;
            }
        }
    }

    /// The projected ServiceAccount volume (the one the ServiceAccount admission adds): a
    /// token requested through the API bound to this Pod, `ca.crt` from the `kube-root-ca.crt`
    /// ConfigMap, `namespace`; written under `<cell>/<pod>.run/secrets/…`, the directory that
    /// becomes the Pod's `/run`. `None` when the Pod has no such volume mounted.
    async fn service_account_files(
        &self,
        pod: &Pod,
        c: &Container,
    ) -> Result<Option<PathBuf>, NetError> {
        use k8s_openapi::api::authentication::v1::TokenRequest;
        use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
        let name = pod.metadata.name.clone().unwrap_or_default();
        let spec = pod.spec.clone().unwrap_or_default();
        let Some((vol, sources)) = spec.volumes.iter().flatten().find_map(|v| {
            let p = v.projected.as_ref()?;
            let srcs = p.sources.clone().unwrap_or_default();
            srcs.iter()
                .any(|s| s.service_account_token.is_some())
                .then(|| (v.name.clone(), srcs))
        }) else {
            return Ok(None);
        };
        let Some(mount) = c
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == vol)
            .map(|m| m.mount_path.clone())
        else {
            return Ok(None);
        };
        let rel = mount
            .strip_prefix("/var/run/")
            .or_else(|| mount.strip_prefix("/run/"))
            .ok_or_else(|| {
                NetError(format!(
                    "the testbed's kubelet mounts ServiceAccount volumes under /run only, not {mount}"
                ))
            })?;
        let run = self.dir.join(format!("{name}.run"));
        let target = run.join(rel);
        std::fs::create_dir_all(&target).map_err(err("the ServiceAccount volume"))?;
        let sa = spec
            .service_account_name
            .clone()
            .unwrap_or_else(|| "default".into());
        for src in &sources {
            if let Some(t) = &src.service_account_token {
                let req: TokenRequest = serde_json::from_value(json!({
                    "spec": {
                        "audiences": t.audience.iter().collect::<Vec<_>>(),
                        "expirationSeconds": t.expiration_seconds.unwrap_or(3607),
                        "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": name,
                                           "uid": pod.metadata.uid.clone().unwrap_or_default()},
                    }
                }))
                .map_err(err("token request"))?;
                let tr = Api::<ServiceAccount>::namespaced(self.kubelet.clone(), NAMESPACE)
                    .create_token_request(&sa, &PostParams::default(), &req)
                    .await
                    .map_err(err("request the ServiceAccount token"))?;
                let token = tr.status.map(|s| s.token).unwrap_or_default();
                write_file(&target.join(&t.path), &token)?;
            }
            if let Some(cm) = &src.config_map {
                let map = Api::<ConfigMap>::namespaced(self.kubelet.clone(), NAMESPACE)
                    .get(&cm.name)
                    .await
                    .map_err(err("read the CA ConfigMap"))?;
                let data = map.data.unwrap_or_default();
                for item in cm.items.iter().flatten() {
                    if let Some(v) = data.get(&item.key) {
                        write_file(&target.join(&item.path), v)?;
                    }
                }
            }
            if let Some(d) = &src.downward_api {
                for item in d.items.iter().flatten() {
                    if item.field_ref.as_ref().map(|f| f.field_path.as_str())
                        == Some("metadata.namespace")
                    {
                        write_file(&target.join(&item.path), NAMESPACE)?;
                    }
                }
            }
        }
        self.record(
            "volume",
            Some(&name),
            format!("{mount}: token, ca.crt, namespace"),
        );
        Ok(Some(run))
    }

    /// The container's environment as kubelet builds it: literal values, downward-API fields,
    /// the `kubernetes` Service's variables.
    async fn container_env(
        &self,
        pod: &Pod,
        c: &Container,
        ip: Ipv4Addr,
    ) -> Result<Vec<(String, String)>, NetError> {
        let meta = &pod.metadata;
        let mut env = vec![
            (
                "KUBERNETES_SERVICE_HOST".to_owned(),
                k8s::KUBERNETES_SERVICE_IP.to_string(),
            ),
            ("KUBERNETES_SERVICE_PORT".to_owned(), "443".to_owned()),
        ];
        for e in c.env.iter().flatten() {
            if let Some(v) = &e.value {
                env.push((e.name.clone(), v.clone()));
            } else if let Some(f) = e.value_from.as_ref().and_then(|v| v.field_ref.as_ref()) {
                let v = match f.field_path.as_str() {
                    "metadata.name" => meta.name.clone().unwrap_or_default(),
                    "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
                    "metadata.uid" => meta.uid.clone().unwrap_or_default(),
                    "status.podIP" => ip.to_string(),
                    "status.hostIP" => NODE_CLIENT_IP.to_string(),
                    "spec.nodeName" => NODE_NAME.to_owned(),
                    _ => String::new(),
                };
                env.push((e.name.clone(), v));
            }
        }
        Ok(env)
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
    tokio::spawn(real.clone().kubelet_loop());
    tokio::spawn(real.clone().watch_slices());
    for k in 1..=node_nss.len() {
        tokio::spawn(real.clone().scrape_proxy(k));
    }
    tokio::spawn(real.clone().scheduler_loop());
    if kube {
        real.apply_example_rbac().await?;
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
