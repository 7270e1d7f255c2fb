//! [`EndpointWatch`]: this Pod and the EndpointSlices that list it, watched through kube's
//! `runtime::watcher`.
//!
//! The watcher, not raw `Api::watch`: it already keeps the resourceVersion from events and
//! bookmarks, pages the initial list, and re-lists on 410 Gone — the parts of the watch
//! protocol that are easy to get subtly wrong by hand. What is left here is the model: which
//! endpoints are this Pod's, what changed, and what that means for the drain.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ::kube::runtime::watcher::{self, Event as WatchEvent};
use ::kube::runtime::WatchStreamExt;
use ::kube::{Api, Client};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use tokio::time::Instant;

use super::link::{Kill, Routing, Source};
use crate::drain::unix_ms_now;
use crate::{Drain, EventKind, Phase, ReadinessWhileDraining};

/// The default proxy allowance: time granted to proxies after the EndpointSlice shows this
/// endpoint not ready, before propagation may commit.
///
/// 2 s: kube-proxy applies a slice change at most once per `minSyncPeriod` (1 s by default,
/// iptables and nftables modes) and its rule write takes well under a second on a cluster of
/// moderate size; the second second covers that write and the informer's delivery. Ingress
/// controllers that reload, meshes and cloud load balancers can take longer: measure yours
/// (the report's `after_flip.last_new_connection_ms`) and set
/// [`EndpointWatch::proxy_allowance`].
pub const DEFAULT_PROXY_ALLOWANCE: Duration = Duration::from_secs(2);

/// How long the first list may take before the report calls the API unreachable (the watch
/// goes on trying; a later answer still counts).
const DEFAULT_API_TIMEOUT: Duration = Duration::from_secs(5);

/// The label that names an EndpointSlice's Service.
const LABEL_SERVICE: &str = "kubernetes.io/service-name";

/// Why an [`EndpointWatch`] could not start.
#[derive(Debug)]
pub struct KubeError {
    message: String,
}

impl std::fmt::Display for KubeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for KubeError {}

/// Watches this Pod and every EndpointSlice that lists its addresses (all Services, IPv4 and
/// IPv6), so that the drain goes on the source of truth (feature `kube`).
///
/// * Each change of this endpoint's conditions (`ready`, `serving`, `terminating`, per slice)
///   is an [`EventKind::EndpointChanged`] event in the timeline.
/// * Propagation does not commit before every slice shows the endpoint not ready (an endpoint
///   removed from its slice counts), plus the [proxy allowance](Self::proxy_allowance), and
///   the quiet window still holds. The report's
///   [`EvidenceReport::endpoint_slice`](crate::EvidenceReport::endpoint_slice) has the numbers.
/// * The Pod's `deletionTimestamp` and `deletionGracePeriodSeconds` are this deletion's real
///   budget: `kubectl delete --grace-period=5` shrinks the hard and quiesce deadlines and
///   `max` ([`EventKind::BudgetTightened`], the report's `budget.deletion`).
/// * A Service selecting the Pod with `publishNotReadyAddresses: true` keeps it `ready` in
///   its slices; it is not waited on, and the report advises about it.
///
/// When the API refuses (RBAC), cannot be reached, or no slice lists the Pod, the drain works
/// as without the feature and the report's
/// [`endpoint_slice_unused`](crate::EvidenceReport::endpoint_slice_unused) says why. The
/// service account needs `get`, `list`, `watch` on its own Pod, `list`, `watch` on
/// EndpointSlices and `get` on Services (`examples/k8s/role.yaml`).
///
/// # Examples
///
/// ```no_run
/// use lameduck::{Drain, EndpointWatch};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let drain = Drain::builder().build()?;
/// // POD_NAME and POD_NAMESPACE from the downward API; the in-cluster service account.
/// EndpointWatch::from_env().start(&drain)?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct EndpointWatch {
    pod: Option<String>,
    namespace: Option<String>,
    client: Option<Client>,
    allowance: Duration,
    api_timeout: Duration,
}

impl std::fmt::Debug for EndpointWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointWatch")
            .field("pod", &self.pod)
            .field("namespace", &self.namespace)
            .field("client", &self.client.as_ref().map(|_| "Client"))
            .field("allowance", &self.allowance)
            .field("api_timeout", &self.api_timeout)
            .finish()
    }
}

impl EndpointWatch {
    /// The Pod named by `POD_NAME` in `POD_NAMESPACE` (the downward API), through the default
    /// client (in-cluster service account, else the kubeconfig).
    pub fn from_env() -> Self {
        let var = |k: &str| {
            std::env::var(k)
                .ok()
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        Self {
            pod: var("POD_NAME"),
            namespace: var("POD_NAMESPACE"),
            client: None,
            allowance: DEFAULT_PROXY_ALLOWANCE,
            api_timeout: DEFAULT_API_TIMEOUT,
        }
    }

    /// The Pod's name, instead of `POD_NAME`.
    pub fn pod(mut self, name: impl Into<String>) -> Self {
        self.pod = Some(name.into());
        self
    }

    /// The Pod's namespace, instead of `POD_NAMESPACE`.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// The client to watch with, instead of `Client::try_default()`.
    pub fn client(mut self, client: Client) -> Self {
        self.client = Some(client);
        self
    }

    /// Time granted to the proxies after the slices show the endpoint not ready, before the
    /// drain may commit (default [`DEFAULT_PROXY_ALLOWANCE`], 2 s).
    pub fn proxy_allowance(mut self, d: Duration) -> Self {
        self.allowance = d;
        self
    }

    /// How long the first list may take before the report calls the API unreachable and the
    /// drain goes on the arrival evidence (default 5 s). The watch keeps trying.
    pub fn api_timeout(mut self, d: Duration) -> Self {
        self.api_timeout = d;
        self
    }

    /// Starts watching, on a task of the current runtime that ends when the drain is done.
    ///
    /// # Errors
    ///
    /// When the Pod's name or namespace is unknown (`POD_NAME`, `POD_NAMESPACE` unset and not
    /// given). The drain's report then says so, and works as without the feature.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn start(self, drain: &Drain) -> Result<(), KubeError> {
        let link = drain.link();
        let (pod, namespace) = match (self.pod.clone(), self.namespace.clone()) {
            (Some(p), Some(n)) => (p, n),
            (p, _) => {
                let missing = if p.is_none() {
                    "POD_NAME"
                } else {
                    "POD_NAMESPACE"
                };
                let message = format!(
                    "{missing} is not set: set it from the downward API (fieldRef metadata.{}) \
                     or give it to EndpointWatch",
                    if p.is_none() { "name" } else { "namespace" }
                );
                link.set_source(Source::Unavailable(message.clone()), None);
                return Err(KubeError { message });
            }
        };
        link.set_source(Source::Connecting, Some(self.allowance));
        let drain = drain.clone();
        tokio::spawn(async move {
            let done = drain.reached(Phase::Done);
            tokio::select! {
                () = self.run(&drain, pod, namespace) => {}
                () = done => {}
            }
        });
        Ok(())
    }

    async fn run(self, drain: &Drain, pod: String, namespace: String) {
        let link = drain.link();
        let client = match self.client {
            Some(c) => c,
            None => match tokio::time::timeout(self.api_timeout, Client::try_default()).await {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => {
                    link.set_source(
                        Source::Unavailable(format!("no Kubernetes client: {e}")),
                        None,
                    );
                    return;
                }
                Err(_) => {
                    link.set_source(
                        Source::Unavailable(
                            "no Kubernetes client: its config timed out".to_owned(),
                        ),
                        None,
                    );
                    return;
                }
            },
        };
        let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &namespace);
        let services: Api<Service> = Api::namespaced(client, &namespace);
        let pod_events = watcher::watcher(
            pods,
            watcher::Config::default().fields(&format!("metadata.name={pod}")),
        )
        .default_backoff();
        let slice_events = watcher::watcher(slices, watcher::Config::default()).default_backoff();
        tokio::pin!(pod_events, slice_events);

        let mut model = Model::new(pod, drain.readiness_policy());
        let api_deadline = tokio::time::sleep(self.api_timeout);
        tokio::pin!(api_deadline);
        let mut timed_out = false;
        loop {
            tokio::select! {
                e = pod_events.next() => match e {
                    Some(Ok(e)) => model.on_pod(drain, e),
                    Some(Err(e)) => {
                        model.on_error(drain, "pods", &e);
                        continue;
                    }
                    None => return,
                },
                e = slice_events.next() => match e {
                    Some(Ok(e)) => model.on_slice(e),
                    Some(Err(e)) => {
                        model.on_error(drain, "endpointslices", &e);
                        continue;
                    }
                    None => return,
                },
                () = &mut api_deadline, if !timed_out => {
                    timed_out = true;
                    if !model.synced() && model.failures.is_empty() {
                        link.set_source(
                            Source::Unavailable(format!(
                                "unreachable: the Kubernetes API did not answer within {} ms",
                                self.api_timeout.as_millis()
                            )),
                            None,
                        );
                    }
                    continue;
                }
            }
            model.lookup_services(&services).await;
            model.publish(drain);
        }
    }
}

/// This endpoint's conditions in one slice, nil values read as the API defines them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Conditions {
    ready: bool,
    serving: bool,
    terminating: bool,
}

impl Conditions {
    fn describe(self) -> String {
        format!(
            "ready {}, serving {}, terminating {}",
            self.ready, self.serving, self.terminating
        )
    }

    fn describe_change(from: Self, to: Self) -> String {
        let one = |name: &str, a: bool, b: bool| {
            if a == b {
                format!("{name} {b}")
            } else {
                format!("{name} {a}→{b}")
            }
        };
        format!(
            "{}, {}, {}",
            one("ready", from.ready, to.ready),
            one("serving", from.serving, to.serving),
            one("terminating", from.terminating, to.terminating)
        )
    }
}

/// One slice, reduced to what matters here.
#[derive(Clone, Debug)]
struct Slice {
    service: Option<String>,
    endpoints: Vec<Endpoint>,
}

#[derive(Clone, Debug)]
struct Endpoint {
    addresses: Vec<String>,
    target_pod: Option<String>,
    conditions: Conditions,
}

impl Slice {
    fn from_api(s: &EndpointSlice) -> (String, Self) {
        let name = s.metadata.name.clone().unwrap_or_default();
        let service = s
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_SERVICE))
            .cloned();
        let endpoints = s
            .endpoints
            .iter()
            .map(|e| {
                let c = e.conditions.as_ref();
                // nil ready means ready; nil serving follows ready; nil terminating is false.
                let ready = c.and_then(|c| c.ready).unwrap_or(true);
                Endpoint {
                    addresses: e.addresses.clone(),
                    target_pod: e
                        .target_ref
                        .as_ref()
                        .filter(|r| r.kind.as_deref().is_none_or(|k| k == "Pod"))
                        .and_then(|r| r.name.clone()),
                    conditions: Conditions {
                        ready,
                        serving: c.and_then(|c| c.serving).unwrap_or(ready),
                        terminating: c.and_then(|c| c.terminating).unwrap_or(false),
                    },
                }
            })
            .collect();
        (name, Slice { service, endpoints })
    }
}

struct Model {
    pod: String,
    accepts_terminating: bool,
    ips: Vec<String>,
    pod_synced: bool,
    slices_synced: bool,
    /// Slices being listed (between `Init` and `InitDone`).
    listing: Option<BTreeMap<String, Slice>>,
    pods_listing: bool,
    slices: BTreeMap<String, Slice>,
    /// Per slice, this endpoint's conditions as last published (`None`: not listed).
    mine: BTreeMap<String, Option<Conditions>>,
    /// Slices that listed this Pod at some point: leaving one counts as not routed.
    ever: BTreeMap<String, Option<String>>,
    /// `publishNotReadyAddresses` per Service, once read.
    services: BTreeMap<String, bool>,
    unrouted_since: Option<(Instant, u64)>,
    /// Per watched kind, why its last list failed (cleared by its next complete list).
    failures: BTreeMap<&'static str, String>,
    first_sync_done: bool,
}

impl Model {
    fn new(pod: String, readiness: ReadinessWhileDraining) -> Self {
        Self {
            pod,
            // Under ServingUntilStop, kubelet's probe stays green to the end, so only the
            // deletion (`terminating`) moves the slice: that is the policy's own condition.
            accepts_terminating: readiness == ReadinessWhileDraining::ServingUntilStop,
            ips: Vec::new(),
            pod_synced: false,
            slices_synced: false,
            listing: None,
            pods_listing: false,
            slices: BTreeMap::new(),
            mine: BTreeMap::new(),
            ever: BTreeMap::new(),
            services: BTreeMap::new(),
            unrouted_since: None,
            failures: BTreeMap::new(),
            first_sync_done: false,
        }
    }

    fn synced(&self) -> bool {
        self.pod_synced && self.slices_synced
    }

    fn on_pod(&mut self, drain: &Drain, e: WatchEvent<Pod>) {
        match e {
            WatchEvent::Init => self.pods_listing = true,
            WatchEvent::InitDone => {
                self.pods_listing = false;
                self.pod_synced = true;
                self.failures.remove("pods");
            }
            WatchEvent::InitApply(p) | WatchEvent::Apply(p) => self.apply_pod(drain, &p),
            WatchEvent::Delete(_) => {}
        }
    }

    fn apply_pod(&mut self, drain: &Drain, p: &Pod) {
        if p.metadata.name.as_deref() != Some(self.pod.as_str()) {
            return;
        }
        if let Some(status) = &p.status {
            let mut ips: Vec<String> = status
                .pod_ips
                .iter()
                .flatten()
                .map(|ip| ip.ip.clone())
                .collect();
            if let Some(ip) = &status.pod_ip {
                if !ips.contains(ip) {
                    ips.push(ip.clone());
                }
            }
            if !ips.is_empty() {
                self.ips = ips;
            }
        }
        if let (Some(ts), Some(grace)) = (
            &p.metadata.deletion_timestamp,
            p.metadata.deletion_grace_period_seconds,
        ) {
            let now = Instant::now();
            let now_unix = unix_ms_now() as i64;
            let kill_unix = ts.0.timestamp_millis();
            let grace = Duration::from_secs(grace.max(0) as u64);
            // The API server's clock, mapped onto ours; never later than the grace counted
            // from now, in case the clocks disagree.
            let by_clock = now + Duration::from_millis((kill_unix - now_unix).max(0) as u64);
            let at = by_clock.min(now + grace);
            if drain.link().tighten(Kill { at, grace }) {
                drain.record_external(
                    EventKind::BudgetTightened,
                    None,
                    format!(
                        "deletionGracePeriodSeconds {}: kubelet may kill at unix {} ms; deadlines \
                         shrink to fit (report budget.deletion)",
                        grace.as_secs(),
                        kill_unix
                    ),
                    now,
                    now_unix as u64,
                );
            }
        }
    }

    fn on_slice(&mut self, e: WatchEvent<EndpointSlice>) {
        match e {
            WatchEvent::Init => self.listing = Some(BTreeMap::new()),
            WatchEvent::InitApply(s) => {
                let (name, slice) = Slice::from_api(&s);
                self.listing
                    .get_or_insert_with(BTreeMap::new)
                    .insert(name, slice);
            }
            WatchEvent::InitDone => {
                // A re-list (after 410 Gone) replaces the whole set: slices deleted meanwhile
                // are gone from it.
                self.slices = self.listing.take().unwrap_or_default();
                self.slices_synced = true;
                self.failures.remove("endpointslices");
            }
            WatchEvent::Apply(s) => {
                let (name, slice) = Slice::from_api(&s);
                self.slices.insert(name, slice);
            }
            WatchEvent::Delete(s) => {
                let name = s.metadata.name.clone().unwrap_or_default();
                self.slices.remove(&name);
            }
        }
    }

    fn on_error(&mut self, drain: &Drain, what: &'static str, e: &watcher::Error) {
        use watcher::Error as E;
        let api = |err: &::kube::Error| {
            match err {
            ::kube::Error::Api(r) if r.code == 403 => format!(
                "forbidden: the service account may not list/watch {what} ({}); see examples/k8s/role.yaml",
                r.message
            ),
            ::kube::Error::Api(r) if r.code == 401 => format!("unauthorized: {}", r.message),
            ::kube::Error::Api(r) => format!("the API answered {} to {what}: {}", r.code, r.message),
            other => format!("unreachable: {other}"),
        }
        };
        let reason = match e {
            E::InitialListFailed(err) | E::WatchStartFailed(err) => api(err),
            // 410 Gone: the watcher re-lists by itself; nothing is lost.
            E::WatchError(r) if r.code == 410 => {
                tracing::debug!(what, "lameduck: watch expired (410), re-listing");
                return;
            }
            E::WatchError(r) if r.code == 403 => api(&::kube::Error::Api(r.clone())),
            other => {
                tracing::debug!(what, error = %other, "lameduck: watch interrupted, resuming");
                return;
            }
        };
        tracing::warn!(what, reason = %reason, "lameduck: the Kubernetes API is not usable as evidence");
        self.failures.insert(what, reason.clone());
        drain.link().set_source(Source::Unavailable(reason), None);
    }

    fn conditions_in(&self, slice: &Slice) -> Option<Conditions> {
        slice
            .endpoints
            .iter()
            .find(|e| {
                e.target_pod.as_deref() == Some(self.pod.as_str())
                    || e.addresses.iter().any(|a| self.ips.contains(a))
            })
            .map(|e| e.conditions)
    }

    /// Reads `publishNotReadyAddresses` of each Service whose slice lists this Pod, once.
    async fn lookup_services(&mut self, api: &Api<Service>) {
        let wanted: BTreeSet<String> = self
            .slices
            .values()
            .filter(|s| self.conditions_in(s).is_some())
            .filter_map(|s| s.service.clone())
            .filter(|svc| !self.services.contains_key(svc))
            .collect();
        for svc in wanted {
            let pnra = match api.get(&svc).await {
                Ok(s) => s
                    .spec
                    .and_then(|s| s.publish_not_ready_addresses)
                    .unwrap_or(false),
                Err(e) => {
                    tracing::debug!(service = %svc, error = %e, "lameduck: cannot read the Service");
                    false
                }
            };
            self.services.insert(svc, pnra);
        }
    }

    /// Compares with what was last published: records each change, and hands the routing
    /// state to the link.
    fn publish(&mut self, drain: &Drain) {
        if !self.synced() {
            return;
        }
        let now = Instant::now();
        let unix = unix_ms_now();
        let record = self.first_sync_done;
        let mut names: BTreeSet<String> = self.slices.keys().cloned().collect();
        names.extend(self.mine.keys().cloned());
        for name in names {
            let slice = self.slices.get(&name);
            let now_c = slice.and_then(|s| self.conditions_in(s));
            let service = slice
                .and_then(|s| s.service.clone())
                .or_else(|| self.ever.get(&name).cloned().flatten());
            let before = self.mine.get(&name).copied().flatten();
            if now_c.is_some() {
                self.ever.insert(name.clone(), service.clone());
            }
            if before != now_c && record {
                let svc = service.as_deref().unwrap_or("no service label");
                let detail = match (before, now_c) {
                    (Some(a), Some(b)) => {
                        format!("service {svc}: {}", Conditions::describe_change(a, b))
                    }
                    (None, Some(b)) => format!("service {svc}: listed, {}", b.describe()),
                    (Some(_), None) if slice.is_some() => {
                        format!("service {svc}: removed from the slice")
                    }
                    (Some(_), None) => format!("service {svc}: slice deleted"),
                    (None, None) => unreachable!("only changes are recorded"),
                };
                drain.record_external(
                    EventKind::EndpointChanged,
                    Some(name.clone()),
                    detail,
                    now,
                    unix,
                );
            }
            self.mine.insert(name, now_c);
        }
        self.first_sync_done = true;

        let pnra: Vec<String> = self
            .services
            .iter()
            .filter(|(_, p)| **p)
            .map(|(s, _)| s.clone())
            .collect();
        let relevant: Vec<(&String, &Option<String>)> = self
            .ever
            .iter()
            .filter(|(_, svc)| svc.as_ref().is_none_or(|s| !pnra.contains(s)))
            .collect();
        let routed = relevant.iter().any(|(name, _)| {
            self.mine
                .get(*name)
                .copied()
                .flatten()
                .is_some_and(|c| c.ready && !(self.accepts_terminating && c.terminating))
        });
        match (routed, self.unrouted_since) {
            (false, None) if !relevant.is_empty() => self.unrouted_since = Some((now, unix)),
            (true, Some(_)) => self.unrouted_since = None,
            _ => {}
        }
        let slices = relevant
            .iter()
            .map(|(name, svc)| format!("{name} ({})", svc.as_deref().unwrap_or("no service label")))
            .collect();
        let link = drain.link();
        link.set_routing(Routing {
            slices,
            unrouted_since: self.unrouted_since,
            publish_not_ready: pnra,
            condition: if self.accepts_terminating {
                "ready=false or terminating=true"
            } else {
                "ready=false"
            },
        });
        match self.failures.values().next() {
            Some(why) => link.set_source(Source::Unavailable(why.clone()), None),
            None if !link.is_watching() => link.set_source(Source::Watching, None),
            None => {}
        }
    }
}
