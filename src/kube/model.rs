//! The watch's model: which endpoints are this Pod's, what changed in its slices and its
//! deletion, and what that means for the drain (written to the coordinator's link).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ::kube::runtime::watcher::{self, Event as WatchEvent};
use ::kube::Api;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use tokio::time::Instant;

use crate::drain::WatchSeam;
use crate::propagation::link::{Kill, Routing, Source};
use crate::report::BudgetSource;
use crate::vocab::phase::unix_ms_now;
use crate::vocab::phase::EventKind;
use crate::vocab::phase::ReadinessWhileDraining;

/// The label that names an EndpointSlice's Service.
const LABEL_SERVICE: &str = "kubernetes.io/service-name";

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

/// The budgets the kubelet's own terminations give, as configured on the watch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Terminations {
    pub(crate) node_shutdown: Duration,
    pub(crate) eviction: Duration,
}

impl Terminations {
    /// The kubelet's own termination of this Pod, if its status shows one: the source, the
    /// budget it gives, when it began (unix ms, the condition's `lastTransitionTime`) and the
    /// condition's message. `None` for a termination of another kind (a deletion carries its
    /// own grace) and for a message of neither known kind.
    fn of(self, p: &Pod) -> Option<(BudgetSource, Duration, i64, String)> {
        let status = p.status.as_ref()?;
        let c = status.conditions.iter().flatten().find(|c| {
            c.type_ == "DisruptionTarget"
                && c.status == "True"
                && c.reason.as_deref() == Some("TerminationByKubelet")
        })?;
        let message = c.message.clone().unwrap_or_default();
        let reason = status.reason.as_deref();
        let (source, grace) = if message.contains("node shutdown") || reason == Some("Terminated") {
            (BudgetSource::NodeShutdown, self.node_shutdown)
        } else if message.contains("low on resource") || reason == Some("Evicted") {
            (BudgetSource::NodePressureEviction, self.eviction)
        } else {
            return None;
        };
        let since = c.last_transition_time.as_ref()?.0.timestamp_millis();
        Some((source, grace, since, message))
    }
}

pub(super) struct Model {
    pod: String,
    terminations: Terminations,
    /// The last kill planned for (its source and unix ms), so a repeat is not a new one.
    kill_seen: Option<(BudgetSource, i64)>,
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
    unrouted_since: Option<Instant>,
    /// Per watched kind, why its last list failed (cleared by its next complete list).
    failures: BTreeMap<&'static str, String>,
    first_sync_done: bool,
    /// A slice listed this Pod ready at some point.
    listed_seen: bool,
}

impl Model {
    pub(super) fn new(
        pod: String,
        readiness: ReadinessWhileDraining,
        terminations: Terminations,
    ) -> Self {
        Self {
            pod,
            terminations,
            kill_seen: None,
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
            listed_seen: false,
        }
    }

    /// A list failed and has not succeeded since (its reason is the link's source).
    pub(super) fn failed(&self) -> bool {
        !self.failures.is_empty()
    }

    pub(super) fn synced(&self) -> bool {
        self.pod_synced && self.slices_synced
    }

    pub(super) fn on_pod(&mut self, seam: &WatchSeam, e: WatchEvent<Pod>) {
        match e {
            WatchEvent::Init => self.pods_listing = true,
            WatchEvent::InitDone => {
                self.pods_listing = false;
                self.pod_synced = true;
                self.failures.remove("pods");
            }
            WatchEvent::InitApply(p) | WatchEvent::Apply(p) => self.apply_pod(seam, &p),
            WatchEvent::Delete(_) => {}
        }
    }

    fn apply_pod(&mut self, seam: &WatchSeam, p: &Pod) {
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
            let kill_unix = ts.0.timestamp_millis();
            let grace = Duration::from_secs(grace.max(0) as u64);
            let detail = format!(
                "deletionGracePeriodSeconds {}: kubelet may kill at unix {kill_unix} ms; \
                 deadlines shrink to fit (report budget.deletion)",
                grace.as_secs()
            );
            self.tighten_to(seam, kill_unix, grace, BudgetSource::Deletion, detail);
        } else if let Some((source, grace, since, message)) = self.terminations.of(p) {
            // The kubelet's own termination sets no deletion: its budget is the configured
            // one, counted from the condition (whole seconds, so the kill is planned up to a
            // second early, never late).
            let kill_unix = since.saturating_add(grace.as_millis() as i64);
            let detail = format!(
                "{source}: the kubelet terminates this Pod ({message:?}) with a budget of {} ms \
                 from unix {since} ms, so it may kill at unix {kill_unix} ms; deadlines shrink to \
                 fit (report budget.deletion)",
                grace.as_millis()
            );
            self.tighten_to(seam, kill_unix, grace, source, detail);
            if seam.kubelet_terminates() {
                seam.record_external(
                    EventKind::ReadinessFlipped,
                    None,
                    format!(
                        "for kubelet's probe while draining: {source} sets no deletion, so no \
                         `terminating` condition takes this Pod out of its EndpointSlices; only \
                         its readiness probe can"
                    ),
                    Instant::now(),
                    unix_ms_now(),
                );
            }
        }
    }

    /// Plans for a kill at `kill_unix` (the API server's clock, mapped onto ours; never later
    /// than `grace` counted from now, in case the clocks disagree): the deadlines shrink if
    /// that is sooner than they allow, and the timeline says why. The same kill seen again (every
    /// later write of the Pod carries it) changes nothing: mapped anew it would land a
    /// millisecond off and read as a new one.
    fn tighten_to(
        &mut self,
        seam: &WatchSeam,
        kill_unix: i64,
        grace: Duration,
        source: BudgetSource,
        detail: String,
    ) {
        if self.kill_seen == Some((source, kill_unix)) {
            return;
        }
        self.kill_seen = Some((source, kill_unix));
        let now = Instant::now();
        let now_unix = unix_ms_now() as i64;
        let by_clock = now + Duration::from_millis((kill_unix - now_unix).max(0) as u64);
        let at = by_clock.min(now + grace);
        if seam.tighten(Kill { at, grace, source }) {
            seam.record_external(
                EventKind::BudgetTightened,
                None,
                detail,
                now,
                now_unix as u64,
            );
        }
    }

    pub(super) fn on_slice(&mut self, e: WatchEvent<EndpointSlice>) {
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

    pub(super) fn on_error(&mut self, seam: &WatchSeam, what: &'static str, e: &watcher::Error) {
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
        seam.link().set_source(Source::Unavailable(reason));
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
    pub(super) async fn lookup_services(&mut self, api: &Api<Service>) {
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
    pub(super) fn publish(&mut self, seam: &WatchSeam) {
        if !self.synced() {
            return;
        }
        let now = Instant::now();
        let unix = unix_ms_now();
        let first_sync = !self.first_sync_done;
        self.record_changes(seam, now, unix);
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
        // The startup measurement starts when a slice first lists this Pod ready; a Pod
        // already listed at the first sync (a restarted container, a late watch) has no start.
        if routed && !self.listed_seen {
            self.listed_seen = true;
            if first_sync {
                seam.link().startup().unmeasurable(
                    "the slices already listed this Pod ready when the watch first read them"
                        .to_owned(),
                );
            } else {
                seam.link().startup().listed(now);
            }
        }
        match (routed, self.unrouted_since) {
            (false, None) if !relevant.is_empty() => self.unrouted_since = Some(now),
            (true, Some(_)) => self.unrouted_since = None,
            _ => {}
        }
        let slices = relevant
            .iter()
            .map(|(name, svc)| format!("{name} ({})", svc.as_deref().unwrap_or("no service label")))
            .collect();
        let link = seam.link();
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
            Some(why) => link.set_source(Source::Unavailable(why.clone())),
            None if !link.is_watching() => link.set_source(Source::Watching),
            None => {}
        }
    }

    /// Each slice's conditions for this Pod against what was last published: a change is an
    /// event (from the second sync on: the first only learns the state).
    fn record_changes(&mut self, seam: &WatchSeam, now: Instant, unix: u64) {
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
                seam.record_external(
                    EventKind::EndpointChanged,
                    Some(name.clone()),
                    detail,
                    now,
                    unix,
                );
            }
            self.mine.insert(name, now_c);
        }
    }
}
