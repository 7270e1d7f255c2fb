//! [`EndpointWatch`]: this Pod and the EndpointSlices that list it, watched through kube's
//! `runtime::watcher`.
//!
//! The watcher, not raw `Api::watch`: it already keeps the resourceVersion from events and
//! bookmarks, pages the initial list, and re-lists on 410 Gone — the parts of the watch
//! protocol that are easy to get subtly wrong by hand. What is left here is the model: which
//! endpoints are this Pod's, what changed, and what that means for the drain.

use std::time::Duration;

use ::kube::runtime::watcher;
use ::kube::runtime::WatchStreamExt;
use ::kube::{Api, Client};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::model::{Model, Terminations};
use crate::drain::{Drain, StartupGate, WatchSeam};
use crate::propagation::link::Source;
use crate::vocab::phase::{Phase, ReadinessWhileDraining};

/// The default proxy allowance: time granted to proxies after the EndpointSlice shows this
/// endpoint not ready, before propagation may commit, when nothing was measured at startup
/// and nothing set. A floor, not proof: see [`EndpointWatch::proxy_allowance`].
///
/// 2 s: kube-proxy applies a slice change at most once per `minSyncPeriod` (1 s by default,
/// iptables and nftables modes) and its rule write takes well under a second on a cluster of
/// moderate size; the second second covers that write and the informer's delivery. Ingress
/// controllers that reload, meshes and cloud load balancers can take longer: measure yours
/// (the report's `after_flip.last_new_connection_ms`) and set
/// [`EndpointWatch::proxy_allowance`].
pub const DEFAULT_PROXY_ALLOWANCE: Duration = Duration::from_secs(2);

/// The budget planned for when the kubelet terminates this Pod for a graceful node shutdown
/// and no other was set ([`EndpointWatch::node_shutdown_grace`]): a node budget of 30 s
/// split evenly between ordinary and critical Pods (`shutdownGracePeriod: 30s`,
/// `shutdownGracePeriodCriticalPods: 15s`) gives an ordinary Pod 15 s.
pub const DEFAULT_NODE_SHUTDOWN_GRACE: Duration = Duration::from_secs(15);

/// The budget planned for when the kubelet evicts this Pod for node pressure and no other was
/// set ([`EndpointWatch::eviction_grace`]): the condition does not say whether the threshold
/// was soft (`evictionMaxPodGracePeriod`) or hard, and a hard one leaves about 2 s (the
/// kubelet's minimum grace when it kills a container).
pub const DEFAULT_EVICTION_GRACE: Duration = Duration::from_secs(2);

/// How long the first list may take before the report calls the API unreachable (the watch
/// goes on trying; a later answer still counts).
const DEFAULT_API_TIMEOUT: Duration = Duration::from_secs(5);

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
///   is an [`EventKind::EndpointChanged`](crate::EventKind::EndpointChanged) event in the timeline.
/// * Propagation does not commit before every slice shows the endpoint not ready (an endpoint
///   removed from its slice counts), plus the [proxy allowance](Self::proxy_allowance), and
///   the quiet window still holds. The report's
///   [`EvidenceReport::endpoint_slice`](crate::report::EvidenceReport::endpoint_slice) has the
///   numbers.
/// * The Pod's `deletionTimestamp` and `deletionGracePeriodSeconds` are this deletion's real
///   budget: `kubectl delete --grace-period=5` shrinks the hard and quiesce deadlines and
///   `max` ([`EventKind::BudgetTightened`](crate::EventKind::BudgetTightened), the report's `budget.deletion`).
/// * The kubelet's own terminations, which set no deletion — graceful node shutdown and
///   node-pressure eviction (condition `DisruptionTarget`, reason `TerminationByKubelet`) —
///   give the budget set with [`node_shutdown_grace`](Self::node_shutdown_grace) and
///   [`eviction_grace`](Self::eviction_grace), counted from the condition.
/// * A Service selecting the Pod with `publishNotReadyAddresses: true` keeps it `ready` in
///   its slices; it is not waited on, and the report advises about it.
///
/// When the API refuses (RBAC), cannot be reached, or no slice lists the Pod, the drain works
/// as without the feature and the report's
/// [`endpoint_slice_unused`](crate::report::EvidenceReport::endpoint_slice_unused) says why. The
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
    /// `None`: measured at startup, else the default.
    allowance: Option<Duration>,
    api_timeout: Duration,
    terminations: Terminations,
}

impl std::fmt::Debug for EndpointWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointWatch")
            .field("pod", &self.pod)
            .field("namespace", &self.namespace)
            .field("client", &self.client.as_ref().map(|_| "Client"))
            .field("allowance", &self.allowance)
            .field("api_timeout", &self.api_timeout)
            .field("terminations", &self.terminations)
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
            allowance: None,
            api_timeout: DEFAULT_API_TIMEOUT,
            terminations: Terminations {
                node_shutdown: DEFAULT_NODE_SHUTDOWN_GRACE,
                eviction: DEFAULT_EVICTION_GRACE,
            },
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
    /// drain may commit, instead of measuring it.
    ///
    /// Unset, the allowance is **measured** at startup: from the moment the watch first sees
    /// a slice list this Pod ready to the first new connection of each peer that had not
    /// connected before (the proxies starting to route here), the largest of those delays.
    /// With no such connection before the trigger, [`DEFAULT_PROXY_ALLOWANCE`] (2 s) is used
    /// as a floor only: the drain then also waits for what the arrival evidence alone would
    /// commit on (to `max` on sparse traffic), since an assumed 2 s is no proof. A measured
    /// allowance is one sample of each proxy's delay, taken when the Pod was added: proof
    /// while every path's arrivals can judge its own silence, a floor as the default is
    /// while some path's cannot. A value set here is trusted as proof: set it when you know
    /// your proxies' worst case. The report's
    /// [`EndpointSliceEvidence::allowance_source`](crate::report::EndpointSliceEvidence::allowance_source)
    /// says which it was, and `startup` has the measurement.
    pub fn proxy_allowance(mut self, d: Duration) -> Self {
        self.allowance = Some(d);
        self
    }

    /// The budget the kubelet gives this Pod when it shuts its node down gracefully (default
    /// [`DEFAULT_NODE_SHUTDOWN_GRACE`], 15 s): the node's `shutdownGracePeriod` less
    /// `shutdownGracePeriodCriticalPods` for an ordinary Pod, or its priority's share under
    /// `shutdownGracePeriodByPodPriority`. When the Pod's status shows the kubelet's own
    /// termination for a node shutdown (condition `DisruptionTarget`, reason
    /// `TerminationByKubelet`; no deletion), the drain plans for a kill this long after the
    /// condition's `lastTransitionTime`, if that is sooner than its grace period: the
    /// deadlines shrink as for a deletion with a shorter grace, and the report names the
    /// source (`budget.deletion.source` `node_shutdown`).
    pub fn node_shutdown_grace(mut self, d: Duration) -> Self {
        self.terminations.node_shutdown = d;
        self
    }

    /// The budget the kubelet gives this Pod when it evicts it for node pressure (default
    /// [`DEFAULT_EVICTION_GRACE`], 2 s, a hard threshold's): set the node's
    /// `evictionMaxPodGracePeriod` when only soft thresholds can evict it. Used as
    /// [`node_shutdown_grace`](Self::node_shutdown_grace) is, for the condition whose
    /// message says the node was low on a resource (`budget.deletion.source`
    /// `node_pressure_eviction`).
    pub fn eviction_grace(mut self, d: Duration) -> Self {
        self.terminations.eviction = d;
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
    /// Called while the drain is still starting (before
    /// [`Readiness::mark_serving`](crate::Readiness::mark_serving) or the last startup gate
    /// opens), it adds a startup gate of its own, `endpoint-watch`: `/readyz`
    /// says not ready until the watch has read the Pod and the slices once, so the slices
    /// cannot list this Pod ready before the watch sees them do it and the proxy allowance is
    /// measured from that moment. The gate also opens when the API refuses or fails, and at
    /// [`api_timeout`](Self::api_timeout) (5 s) at the latest: readiness never waits longer
    /// on the API server.
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
        let seam = WatchSeam::new(drain);
        let link = seam.link();
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
                link.set_source(Source::Unavailable(message.clone()));
                return Err(KubeError { message });
            }
        };
        link.set_allowance(
            self.allowance.unwrap_or(DEFAULT_PROXY_ALLOWANCE),
            self.allowance.is_some(),
        );
        link.set_source(Source::Connecting);
        let mut gate = FirstList(
            (drain.phase() == Phase::Starting)
                .then(|| drain.readiness().startup_gate("endpoint-watch")),
        );
        let policy = drain.readiness().policy();
        let done = drain.moments().reached(Phase::Done);
        tokio::spawn(async move {
            let watched = WatchTask {
                seam: &seam,
                policy,
                pod,
                namespace,
            };
            tokio::select! {
                () = self.run(watched, &mut gate) => {}
                () = done => {}
            }
        });
        Ok(())
    }

    async fn run(self, watched: WatchTask<'_>, gate: &mut FirstList) {
        let WatchTask {
            seam,
            policy,
            pod,
            namespace,
        } = watched;
        let link = seam.link();
        let client = match self.client {
            Some(c) => c,
            None => match tokio::time::timeout(self.api_timeout, Client::try_default()).await {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => {
                    link.set_source(Source::Unavailable(format!("no Kubernetes client: {e}")));
                    return;
                }
                Err(_) => {
                    link.set_source(Source::Unavailable(
                        "no Kubernetes client: its config timed out".to_owned(),
                    ));
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

        let mut model = Model::new(pod, policy, self.terminations);
        let api_deadline = tokio::time::sleep(self.api_timeout);
        tokio::pin!(api_deadline);
        let mut timed_out = false;
        loop {
            tokio::select! {
                e = pod_events.next() => match e {
                    Some(Ok(e)) => model.on_pod(seam, e),
                    Some(Err(e)) => {
                        model.on_error(seam, "pods", &e);
                        gate.open_if(model.failed());
                        continue;
                    }
                    None => return,
                },
                e = slice_events.next() => match e {
                    Some(Ok(e)) => model.on_slice(e),
                    Some(Err(e)) => {
                        model.on_error(seam, "endpointslices", &e);
                        gate.open_if(model.failed());
                        continue;
                    }
                    None => return,
                },
                () = &mut api_deadline, if !timed_out => {
                    timed_out = true;
                    gate.open_if(true);
                    if !model.synced() && !model.failed() {
                        link.set_source(
                            Source::Unavailable(format!(
                                "unreachable: the Kubernetes API did not answer within {} ms",
                                self.api_timeout.as_millis()
                            )),
                        );
                    }
                    continue;
                }
            }
            model.lookup_services(&services).await;
            model.publish(seam);
            // After the first publish: the watch has seen the slices as they were before
            // this Pod could be ready, so the listing it waits for is one it will see.
            gate.open_if(model.synced());
        }
    }
}

/// What the watch's task is given: the seam it writes to, the readiness policy its model
/// reads, and the Pod it watches.
struct WatchTask<'a> {
    seam: &'a WatchSeam,
    policy: ReadinessWhileDraining,
    pod: String,
    namespace: String,
}

/// The `endpoint-watch` startup gate: open once the watch has listed, failed or timed out,
/// and when the watch ends for any reason (dropped).
struct FirstList(Option<StartupGate>);

impl FirstList {
    fn open_if(&mut self, cond: bool) {
        if cond {
            if let Some(g) = self.0.take() {
                g.open();
            }
        }
    }
}

impl Drop for FirstList {
    fn drop(&mut self) {
        self.open_if(true);
    }
}
