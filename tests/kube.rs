//! The `kube` feature against the Kubernetes API over real HTTP on 127.0.0.1: a small API
//! server speaks the list and watch protocol (resourceVersion, `?watch=true` chunked JSON
//! events, BOOKMARK, 410 Gone that forces a re-list, 403 Forbidden), fed by an EndpointSlice
//! model that derives each endpoint's conditions from its Pod as the EndpointSlice controller
//! does. kube's real client and watcher are exercised end to end.
#![cfg(feature = "kube")]

mod common;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use lameduck::report::{AdviceRule, AllowanceSource, BudgetSource, EvidenceKind, MaxReason};
use lameduck::AdminBuilder;
use lameduck::{
    Drain, DrainReport, EndpointWatch, EventKind, Phase, Propagation, ReadinessWhileDraining,
    Trigger,
};
use serde_json::{json, Value};
use tokio::sync::mpsc;

const NS: &str = "shop";
const POD: &str = "web-0";

type Body = BoxBody<Bytes, Infallible>;

/// One Pod of the model: what the EndpointSlice controller reads.
#[derive(Clone)]
struct PodState {
    ipv4: String,
    ipv6: String,
    ready: bool,
    /// `deletionTimestamp` (unix ms) and `deletionGracePeriodSeconds`.
    deletion: Option<(u64, i64)>,
    /// The kubelet's own termination: the `DisruptionTarget` condition's
    /// `lastTransitionTime` (unix ms), its message, and the status `reason`.
    kubelet_termination: Option<(u64, &'static str, &'static str)>,
}

/// A Service and the Pods it selects; one slice per address family, as the controller writes.
struct ServiceState {
    publish_not_ready: bool,
    pods: Vec<String>,
}

#[derive(Default)]
struct Model {
    rv: u64,
    pods: BTreeMap<String, PodState>,
    services: BTreeMap<String, ServiceState>,
    /// Published objects by kind ("pods", "endpointslices") and name.
    objects: BTreeMap<(&'static str, String), Value>,
    /// Every change, for watches that resume from a resourceVersion.
    log: Vec<(u64, &'static str, &'static str, Value)>,
    /// Watches from a resourceVersion below this get 410 Gone.
    compacted: u64,
    forbidden: bool,
    watchers: Vec<(&'static str, Option<String>, mpsc::UnboundedSender<Bytes>)>,
    /// `(kind, "list" | "watch")` of each request served.
    requests: Vec<(&'static str, &'static str)>,
}

fn line(v: &Value) -> Bytes {
    let mut s = serde_json::to_vec(v).unwrap();
    s.push(b'\n');
    Bytes::from(s)
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

impl Model {
    /// The objects the controller would write for the current Pods and Services.
    fn render(&self) -> Vec<(&'static str, String, Value)> {
        let mut out = Vec::new();
        for (name, p) in &self.pods {
            let mut meta = json!({"name": name, "namespace": NS, "uid": format!("uid-{name}")});
            if let Some((at, grace)) = p.deletion {
                let ts = chrono_like(at);
                meta["deletionTimestamp"] = json!(ts);
                meta["deletionGracePeriodSeconds"] = json!(grace);
            }
            let mut status = json!({"podIP": p.ipv4, "podIPs": [{"ip": p.ipv4}, {"ip": p.ipv6}]});
            if let Some((at, message, reason)) = p.kubelet_termination {
                // What the kubelet writes before it stops the Pod itself (no deletion).
                status["conditions"] = json!([{
                    "type": "DisruptionTarget", "status": "True",
                    "reason": "TerminationByKubelet", "message": message,
                    "lastTransitionTime": chrono_like(at),
                }]);
                status["reason"] = json!(reason);
            }
            out.push((
                "pods",
                name.clone(),
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "status": status}),
            ));
        }
        for (svc, s) in &self.services {
            for (family, v6) in [("IPv4", false), ("IPv6", true)] {
                let endpoints: Vec<Value> = s
                    .pods
                    .iter()
                    .filter_map(|n| self.pods.get(n).map(|p| (n, p)))
                    .map(|(n, p)| {
                        let terminating = p.deletion.is_some();
                        // The controller's rule: ready only when serving and not terminating,
                        // unless the Service publishes not-ready addresses.
                        let ready = s.publish_not_ready || (p.ready && !terminating);
                        let mut e = json!({
                            "addresses": [if v6 { &p.ipv6 } else { &p.ipv4 }],
                            "conditions": {"ready": ready, "serving": p.ready, "terminating": terminating},
                        });
                        // The IPv6 slice names no Pod: the watch must match the address.
                        if !v6 {
                            e["targetRef"] = json!({"kind": "Pod", "name": n, "namespace": NS});
                        }
                        e
                    })
                    .collect();
                let name = format!("{svc}-{}", family.to_lowercase());
                out.push((
                    "endpointslices",
                    name.clone(),
                    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                           "metadata": {"name": name, "namespace": NS,
                                        "labels": {"kubernetes.io/service-name": svc}},
                           "addressType": family, "endpoints": endpoints,
                           "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}),
                ));
            }
        }
        out
    }

    /// Publishes what changed since the last sync: a new resourceVersion each, to the log and
    /// to the open watches.
    fn sync(&mut self) {
        for (kind, name, mut obj) in self.render() {
            let key = (kind, name.clone());
            let prev = self.objects.get(&key).map(|o| {
                let mut o = o.clone();
                o["metadata"]
                    .as_object_mut()
                    .unwrap()
                    .remove("resourceVersion");
                o
            });
            if prev.as_ref() == Some(&obj) {
                continue;
            }
            self.rv += 1;
            obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
            let ty = if prev.is_some() { "MODIFIED" } else { "ADDED" };
            self.log.push((self.rv, kind, ty, obj.clone()));
            let ev = line(&json!({"type": ty, "object": obj}));
            self.watchers.retain(|(k, only, tx)| {
                *k != kind
                    || only.as_ref().is_some_and(|o| *o != name)
                    || tx.send(ev.clone()).is_ok()
            });
            self.objects.insert(key, obj);
        }
    }

    /// A BOOKMARK to every open watch: the watcher moves its resourceVersion on.
    fn bookmark(&mut self) {
        let rv = self.rv.to_string();
        self.watchers.retain(|(kind, _, tx)| {
            let (api, k) = if *kind == "pods" {
                ("v1", "Pod")
            } else {
                ("discovery.k8s.io/v1", "EndpointSlice")
            };
            tx.send(line(
                &json!({"type": "BOOKMARK", "object": {"apiVersion": api, "kind": k,
                "metadata": {"resourceVersion": rv}}}),
            ))
            .is_ok()
        });
    }

    /// Compacts history and ends every watch with 410 Gone: the watchers must re-list.
    fn expire(&mut self) {
        self.compacted = self.rv + 1;
        for (_, _, tx) in self.watchers.drain(..) {
            let _ = tx.send(line(&json!({"type": "ERROR",
                "object": status(410, "Expired", "too old resource version")})));
        }
    }

    fn count(&self, kind: &str, verb: &str) -> usize {
        self.requests
            .iter()
            .filter(|(k, v)| *k == kind && *v == verb)
            .count()
    }
}

/// RFC 3339 in whole seconds, rounded down, as the API server writes `deletionTimestamp`.
fn chrono_like(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[derive(Clone)]
struct Cluster {
    model: Arc<Mutex<Model>>,
    addr: SocketAddr,
}

fn full(code: StatusCode, v: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(v).unwrap())).boxed())
        .unwrap()
}

fn query(req: &Request<hyper::body::Incoming>) -> BTreeMap<String, String> {
    req.uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.replace("%3D", "=").replace("%3d", "=")))
        .collect()
}

fn handle(model: &Arc<Mutex<Model>>, req: Request<hyper::body::Incoming>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let q = query(&req);
    let pods = format!("/api/v1/namespaces/{NS}/pods");
    let slices = format!("/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices");
    let services = format!("/api/v1/namespaces/{NS}/services/");
    let mut m = model.lock().unwrap();
    if m.forbidden {
        m.requests.push(("any", "forbidden"));
        return full(
            StatusCode::FORBIDDEN,
            &status(403, "Forbidden", "endpointslices.discovery.k8s.io is forbidden: User \"system:serviceaccount:shop:default\" cannot list resource"),
        );
    }
    if let Some(svc) = path.strip_prefix(&services) {
        return match m.services.get(svc) {
            Some(s) => full(
                StatusCode::OK,
                &json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": svc, "namespace": NS},
                        "spec": {"publishNotReadyAddresses": s.publish_not_ready}}),
            ),
            None => full(
                StatusCode::NOT_FOUND,
                &status(404, "NotFound", "service not found"),
            ),
        };
    }
    let kind = if path == pods {
        "pods"
    } else if path == slices {
        "endpointslices"
    } else {
        return full(
            StatusCode::NOT_FOUND,
            &status(404, "NotFound", "no such path"),
        );
    };
    let only = q
        .get("fieldSelector")
        .and_then(|f| f.strip_prefix("metadata.name="))
        .map(str::to_owned);
    if q.get("watch").is_some_and(|w| w == "true" || w == "1") {
        m.requests.push((kind, "watch"));
        let from: u64 = q
            .get("resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let (tx, rx) = mpsc::unbounded_channel();
        if from < m.compacted {
            let _ = tx.send(line(&json!({"type": "ERROR",
                "object": status(410, "Expired", "too old resource version")})));
            drop(tx);
        } else {
            for (rv, k, ty, obj) in &m.log {
                let name = obj["metadata"]["name"].as_str().unwrap_or("");
                if *rv > from && *k == kind && only.as_deref().is_none_or(|o| o == name) {
                    let _ = tx.send(line(&json!({"type": ty, "object": obj})));
                }
            }
            m.watchers.push((kind, only, tx));
        }
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv()
                .await
                .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
        });
        return Response::builder()
            .header("content-type", "application/json")
            .body(BodyExt::boxed(StreamBody::new(stream)))
            .unwrap();
    }
    m.requests.push((kind, "list"));
    let items: Vec<Value> = m
        .objects
        .iter()
        .filter(|((k, name), _)| *k == kind && only.as_deref().is_none_or(|o| o == name))
        .map(|(_, v)| v.clone())
        .collect();
    let list_kind = if kind == "pods" {
        "PodList"
    } else {
        "EndpointSliceList"
    };
    full(
        StatusCode::OK,
        &json!({"apiVersion": "v1", "kind": list_kind,
                "metadata": {"resourceVersion": m.rv.to_string()}, "items": items}),
    )
}

impl Cluster {
    /// Pod `web-0` (ready, IPv4 and IPv6) and `web-1` behind Service `web`, served on loopback.
    async fn start() -> Self {
        let mut m = Model::default();
        for (i, name) in ["web-0", "web-1"].iter().enumerate() {
            m.pods.insert(
                (*name).to_owned(),
                PodState {
                    ipv4: format!("10.1.0.{}", i + 5),
                    ipv6: format!("fd00::{}", i + 5),
                    ready: true,
                    deletion: None,
                    kubelet_termination: None,
                },
            );
        }
        m.services.insert(
            "web".to_owned(),
            ServiceState {
                publish_not_ready: false,
                pods: vec!["web-0".to_owned(), "web-1".to_owned()],
            },
        );
        m.sync();
        let model = Arc::new(Mutex::new(m));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let served = model.clone();
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let model = served.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let r = handle(&model, req);
                        async move { Ok::<_, Infallible>(r) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(sock), svc)
                        .await;
                });
            }
        });
        Cluster { model, addr }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Model) -> R) -> R {
        f(&mut self.model.lock().unwrap())
    }

    fn client(&self) -> kube::Client {
        let uri = format!("http://{}", self.addr).parse().unwrap();
        kube::Client::try_from(kube::Config::new(uri)).unwrap()
    }

    /// Waits (bounded) until both watches are open: the watch has listed and synced.
    async fn watching(&self) {
        for _ in 0..500 {
            let open = self.with(|m| {
                let kinds: Vec<_> = m.watchers.iter().map(|(k, _, _)| *k).collect();
                kinds.contains(&"pods") && kinds.contains(&"endpointslices")
            });
            if open {
                // The watch request is in; give the client a moment to take in the stream.
                tokio::time::sleep(Duration::from_millis(50)).await;
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the watches never opened");
    }

    /// The kubelet terminates the Pod itself: the condition, no deletion.
    fn kubelet_terminates(&self, message: &'static str, reason: &'static str) {
        let at = unix_ms();
        self.with(|m| {
            m.pods.get_mut(POD).unwrap().kubelet_termination = Some((at, message, reason));
            m.sync();
        });
    }

    fn delete_pod(&self, grace_s: i64) {
        let at = unix_ms() + grace_s as u64 * 1000;
        self.with(|m| {
            m.pods.get_mut(POD).unwrap().deletion = Some((at, grace_s));
            m.sync();
        });
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn drain(grace: Duration, propagation: Propagation, readiness: ReadinessWhileDraining) -> Drain {
    common::quiet_builder()
        .grace_period(grace)
        .propagation(propagation)
        .readiness_while_draining(readiness)
        .build()
        .unwrap()
}

async fn finished(d: &Drain) -> DrainReport {
    let r = tokio::time::timeout(Duration::from_secs(20), d.drained())
        .await
        .expect("the drain finished");
    common::assert_figures_fit(&r);
    r
}

/// Waits (bounded) for the watch's own startup gate, which opens once it has listed (or
/// failed, or timed out), as kubelet's probe would wait for it.
async fn ready(d: &Drain) {
    for _ in 0..1000 {
        if !d
            .readiness()
            .answer()
            .reason
            .contains("waiting for endpoint-watch")
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never ready: {:?}", d.readiness().answer());
}

fn events(r: &DrainReport, kind: EventKind) -> Vec<&lameduck::Event> {
    r.timeline.iter().filter(|e| e.event == kind).collect()
}

#[tokio::test]
async fn propagation_waits_for_every_slice_plus_the_allowance_and_the_timeline_shows_each_change() {
    let cluster = Cluster::start().await;
    // No connection data and a 10 s max: without the slices this drain would wait to max.
    let d = drain(
        Duration::from_secs(30),
        Propagation::quiet(Duration::from_millis(100))
            .min(Duration::from_millis(100))
            .max(Duration::from_secs(10)),
        ReadinessWhileDraining::Auto,
    );
    EndpointWatch::from_env()
        .pod(POD)
        .namespace(NS)
        .client(cluster.client())
        .proxy_allowance(Duration::from_millis(400))
        .start(&d)
        .unwrap();
    cluster.watching().await;
    ready(&d).await;
    d.start(Trigger::Api);

    // A bookmark, then history compacted under the open watches: 410 Gone, re-list.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // While the slices still route here, `/status` says the drain waits on them.
    let waiting = d.status().evidence.unwrap();
    assert_eq!(waiting.kind, EvidenceKind::EndpointSlice);
    let w = waiting.endpoint_slice.as_ref().unwrap();
    assert_eq!((w.changed_at_ms, w.allowed_at_ms), (None, None), "{w:?}");
    assert_eq!(w.slices, ["web-ipv4 (web)", "web-ipv6 (web)"]);
    cluster.with(Model::bookmark);
    cluster.with(Model::expire);
    // The deletion lands while the watchers re-list: the list must carry it.
    cluster.delete_pod(30);
    let r = finished(&d).await;

    let relists = cluster.with(|m| m.count("endpointslices", "list"));
    assert!(relists >= 2, "410 Gone forced a re-list ({relists} lists)");

    let ev = r.propagation.evidence.as_ref().unwrap();
    assert_eq!(ev.kind, EvidenceKind::EndpointSlice, "{ev:?}");
    assert_eq!(ev.endpoint_slice_unused, None);
    let slice = ev.endpoint_slice.as_ref().unwrap();
    assert_eq!(slice.condition, "ready=false");
    assert_eq!(slice.allowance_ms, 400);
    // Both families: the IPv6 slice names no Pod and is matched by address.
    assert_eq!(slice.slices, ["web-ipv4 (web)", "web-ipv6 (web)"]);
    let changed = slice.changed_at_ms.unwrap();
    assert!(
        changed >= 300,
        "the slices changed after the deletion ({changed} ms)"
    );
    let done = r.event(EventKind::PropagationDone).unwrap();
    assert!(
        done.at_ms as i64 >= changed + 400,
        "propagation committed at {} ms, before the slice change ({changed} ms) + the allowance",
        done.at_ms
    );
    assert!(
        done.at_ms < 10_000,
        "the slices, not max, ended propagation"
    );
    let detail = done.detail.as_deref().unwrap();
    assert!(
        detail.starts_with("endpoint_slice: ")
            && detail.contains(&format!("EndpointSlice ready=false at {changed} ms")),
        "{detail}"
    );

    let changes = events(&r, EventKind::EndpointChanged);
    assert_eq!(changes.len(), 2, "{:#?}", r.timeline);
    for (e, name) in changes.iter().zip(["web-ipv4", "web-ipv6"]) {
        assert_eq!(e.name.as_deref(), Some(name));
        assert_eq!(
            e.detail.as_deref(),
            Some("service web: ready true→false, serving true, terminating false→true")
        );
    }
    assert!(
        r.advice.iter().any(|a| a.rule == AdviceRule::EndpointSlice),
        "{:?}",
        r.advice
    );
}

#[tokio::test]
async fn a_short_deletion_grace_shrinks_the_deadlines() {
    let cluster = Cluster::start().await;
    let d = drain(
        Duration::from_secs(30),
        Propagation::quiet(Duration::from_millis(100)).min(Duration::from_millis(100)),
        ReadinessWhileDraining::Auto,
    );
    EndpointWatch::from_env()
        .pod(POD)
        .namespace(NS)
        .client(cluster.client())
        .proxy_allowance(Duration::from_millis(100))
        .start(&d)
        .unwrap();
    cluster.watching().await;
    // A task that never ends: the quiesce deadline, not the configured 24 s, cuts it.
    d.work().spawn("stuck", std::future::pending::<()>());
    let origin = tokio::time::Instant::now();
    ready(&d).await;
    d.start(Trigger::Api);
    // Before the deletion, the configured budget: 30 s − 1 s margin.
    assert!(d.moments().hard_deadline().unwrap() >= origin + Duration::from_secs(29));
    // `kubectl delete --grace-period=3` while the drain runs: the deadlines move earlier.
    cluster.delete_pod(3);
    let mut tightened_in_time = false;
    for _ in 0..300 {
        if d.moments().hard_deadline().unwrap() <= origin + Duration::from_secs(3) {
            tightened_in_time = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        tightened_in_time,
        "the hard deadline moved within the deletion's 3 s"
    );
    let r = finished(&d).await;

    let del = r.budget.deletion.as_ref().expect("budget.deletion");
    assert_eq!(del.deletion_grace_ms, 3000);
    assert!(del.kill_at_ms <= 3000 && del.kill_at_ms >= 1000, "{del:?}");
    assert!(
        del.hard_ms < del.kill_at_ms && del.quiesce_ms < del.hard_ms,
        "{del:?}"
    );
    assert!(del.max_ms <= del.quiesce_ms, "{del:?}");
    let cut = r
        .event(EventKind::DeadlineExceeded)
        .expect("the stuck task hit the deadline");
    assert!(
        cut.at_ms <= del.quiesce_ms + 500,
        "cut at {} ms, the deletion's quiesce deadline is {} ms",
        cut.at_ms,
        del.quiesce_ms
    );
    let tightened = events(&r, EventKind::BudgetTightened);
    assert_eq!(tightened.len(), 1, "{:#?}", r.timeline);
    assert!(tightened[0]
        .detail
        .as_deref()
        .unwrap()
        .contains("deletionGracePeriodSeconds 3"));
    assert_eq!(events(&r, EventKind::EndpointChanged).len(), 2);
}

/// The kubelet's graceful node shutdown (or node-pressure eviction) sets no deletion: the
/// watch reads the `DisruptionTarget` condition, plans for the configured budget counted from
/// it, cuts the stuck work at that budget's quiesce deadline, and the report names the source.
async fn kubelet_termination(
    watch: impl FnOnce(EndpointWatch) -> EndpointWatch,
    message: &'static str,
    reason: &'static str,
) -> DrainReport {
    let cluster = Cluster::start().await;
    let d = drain(
        Duration::from_secs(30),
        Propagation::quiet(Duration::from_millis(100)).min(Duration::from_millis(100)),
        ReadinessWhileDraining::Auto,
    );
    watch(
        EndpointWatch::from_env()
            .pod(POD)
            .namespace(NS)
            .client(cluster.client())
            .proxy_allowance(Duration::from_millis(100)),
    )
    .start(&d)
    .unwrap();
    cluster.watching().await;
    d.work().spawn("stuck", std::future::pending::<()>());
    let (listener, admin) = common::bind().await;
    let router = AdminBuilder::new(&d).without_token().router();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    ready(&d).await;
    // The condition first, then the kubelet's SIGTERM.
    cluster.kubelet_terminates(message, reason);
    d.start(Trigger::Sigterm);
    // No deletion will mark the endpoint terminating: kubelet's probe must see "not ready"
    // while draining, or the slices keep routing here until the process stops accepting.
    let mut kubelet_sees = None;
    for _ in 0..100 {
        let (status, body) = readyz_as_kubelet(admin).await;
        if status == StatusCode::SERVICE_UNAVAILABLE {
            kubelet_sees = Some(body);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let body = kubelet_sees.expect("kubelet's probe saw \"not ready\" while draining");
    assert!(body.contains("without a deletion"), "{body}");
    finished(&d).await
}

async fn readyz_as_kubelet(addr: SocketAddr) -> (StatusCode, String) {
    let (mut sender, _conn) = common::h1(addr).await;
    let req = Request::builder()
        .uri("/readyz?verbose")
        .header("host", "admin")
        .header("user-agent", "kube-probe/1.36")
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    sender.ready().await.unwrap();
    let res = sender.send_request(req).await.unwrap();
    let (status, _, body) = common::text(res).await;
    (status, body)
}

fn assert_fitted(r: &DrainReport, source: BudgetSource, grace_ms: u64) {
    let b = r.budget.deletion.as_ref().expect("budget.deletion");
    assert_eq!(b.source, source, "{b:?}");
    assert_eq!(b.deletion_grace_ms, grace_ms);
    // Counted from the condition's whole second: up to a second early, never late.
    assert!(
        b.kill_at_ms <= grace_ms && b.kill_at_ms + 1_100 >= grace_ms,
        "{b:?}"
    );
    assert!(r.budget.used_ms < b.kill_at_ms, "{:?}", r.budget);
    let cut = r
        .event(EventKind::DeadlineExceeded)
        .expect("the stuck task hit the deadline");
    assert!(cut.at_ms <= b.quiesce_ms + 500, "{cut:?} {b:?}");
    assert!(
        events(r, EventKind::ReadinessFlipped).iter().any(|e| e
            .detail
            .as_deref()
            .is_some_and(|d| d.contains("sets no deletion"))),
        "{:#?}",
        r.timeline
    );
    let tightened = events(r, EventKind::BudgetTightened);
    assert_eq!(tightened.len(), 1, "{:#?}", r.timeline);
    assert!(
        tightened[0]
            .detail
            .as_deref()
            .unwrap()
            .starts_with(&format!("{source}: the kubelet terminates this Pod")),
        "{:?}",
        tightened[0]
    );
    let a = r
        .advice
        .iter()
        .find(|a| a.rule == AdviceRule::BudgetShortened)
        .unwrap_or_else(|| panic!("{:?}", r.advice));
    assert!(
        a.message.contains(source.as_str()) && a.message.contains("0 request(s) and 1 task(s)"),
        "{}",
        a.message
    );
}

#[tokio::test]
async fn a_node_shutdown_gives_the_configured_node_budget() {
    let r = kubelet_termination(
        |w| w.node_shutdown_grace(Duration::from_secs(4)),
        "Pod was terminated in response to imminent node shutdown.",
        "Terminated",
    )
    .await;
    assert_fitted(&r, BudgetSource::NodeShutdown, 4_000);
}

#[tokio::test]
async fn a_node_pressure_eviction_gives_the_eviction_budget_by_default_a_hard_thresholds() {
    let r = kubelet_termination(
        |w| w,
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi.",
        "Evicted",
    )
    .await;
    assert_fitted(&r, BudgetSource::NodePressureEviction, 2_000);
}

#[tokio::test]
async fn publish_not_ready_addresses_is_not_waited_on_and_gets_advice() {
    let cluster = Cluster::start().await;
    cluster.with(|m| {
        m.services.insert(
            "peers".to_owned(),
            ServiceState {
                publish_not_ready: true,
                pods: vec!["web-0".to_owned(), "web-1".to_owned()],
            },
        );
        m.sync();
    });
    let d = drain(
        Duration::from_secs(30),
        Propagation::quiet(Duration::from_millis(100))
            .min(Duration::from_millis(100))
            .max(Duration::from_secs(10)),
        ReadinessWhileDraining::Auto,
    );
    EndpointWatch::from_env()
        .pod(POD)
        .namespace(NS)
        .client(cluster.client())
        .proxy_allowance(Duration::from_millis(100))
        .start(&d)
        .unwrap();
    cluster.watching().await;
    // The deletion reaches the slices before the trigger (a preStop hook that does not call
    // the admin endpoint delays SIGTERM): its changes enter the timeline at 0 ms.
    cluster.delete_pod(30);
    tokio::time::sleep(Duration::from_secs(1)).await;
    ready(&d).await;
    d.start(Trigger::Api);
    let r = finished(&d).await;

    let changes = events(&r, EventKind::EndpointChanged);
    // `peers` (publishNotReadyAddresses) keeps ready=true but its slices still change:
    // terminating false→true. Four slices, four changes, all before the trigger.
    assert_eq!(changes.len(), 4, "{:#?}", r.timeline);
    for e in &changes {
        assert_eq!(e.at_ms, 0);
        assert!(
            e.detail
                .as_deref()
                .unwrap()
                .contains("ms before the trigger: service "),
            "{e:?}"
        );
    }

    let ev = r.propagation.evidence.as_ref().unwrap();
    assert_eq!(ev.kind, EvidenceKind::EndpointSlice, "{ev:?}");
    let slice = ev.endpoint_slice.as_ref().unwrap();
    assert_eq!(slice.publish_not_ready_addresses, ["peers"]);
    // `peers` keeps ready=true to the end; only `web` is waited on.
    assert_eq!(slice.slices, ["web-ipv4 (web)", "web-ipv6 (web)"]);
    let a = r
        .advice
        .iter()
        .find(|a| a.rule == AdviceRule::PublishNotReadyAddresses)
        .expect("the advice");
    assert!(
        a.message
            .contains("Service peers has publishNotReadyAddresses: true"),
        "{}",
        a.message
    );
}

#[tokio::test]
async fn a_forbidden_api_falls_back_to_the_arrival_evidence_and_says_why() {
    let cluster = Cluster::start().await;
    cluster.with(|m| m.forbidden = true);
    let d = drain(
        Duration::from_secs(30),
        Propagation::quiet(Duration::from_millis(100))
            .min(Duration::from_millis(100))
            .max(Duration::from_millis(800)),
        ReadinessWhileDraining::Auto,
    );
    EndpointWatch::from_env()
        .pod(POD)
        .namespace(NS)
        .client(cluster.client())
        .start(&d)
        .unwrap();
    for _ in 0..500 {
        if cluster.with(|m| m.count("any", "forbidden") > 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    ready(&d).await;
    d.start(Trigger::Api);
    let r = finished(&d).await;

    let ev = r.propagation.evidence.as_ref().unwrap();
    // Today's evidence: no connection data, so max, for the reason it always was.
    assert_eq!(ev.kind, EvidenceKind::Max);
    assert_eq!(ev.max_reason, Some(MaxReason::NotEnoughEvidence));
    assert_eq!(ev.endpoint_slice, None);
    let why = ev.endpoint_slice_unused.as_deref().unwrap();
    assert!(
        why.starts_with("forbidden: the service account may not list/watch"),
        "{why}"
    );
    assert!(why.contains("examples/k8s/role.yaml"), "{why}");
    assert!(
        r.advice
            .iter()
            .any(|a| a.rule == AdviceRule::EndpointSliceUnavailable),
        "{:?}",
        r.advice
    );
    assert!(events(&r, EventKind::EndpointChanged).is_empty());
}

#[tokio::test]
async fn an_unreachable_api_falls_back_and_says_so() {
    // A port nobody listens on: connection refused.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let uri = format!("http://127.0.0.1:{port}").parse().unwrap();
    let client = kube::Client::try_from(kube::Config::new(uri)).unwrap();
    let d = drain(
        Duration::from_secs(30),
        Propagation::quiet(Duration::from_millis(100))
            .min(Duration::from_millis(100))
            .max(Duration::from_millis(800)),
        ReadinessWhileDraining::Auto,
    );
    EndpointWatch::from_env()
        .pod(POD)
        .namespace(NS)
        .client(client)
        .start(&d)
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    ready(&d).await;
    d.start(Trigger::Api);
    let r = finished(&d).await;
    let ev = r.propagation.evidence.as_ref().unwrap();
    assert_eq!(ev.kind, EvidenceKind::Max);
    let why = ev.endpoint_slice_unused.as_deref().unwrap();
    assert!(why.starts_with("unreachable"), "{why}");
}

#[tokio::test]
async fn readiness_waits_for_the_watchs_first_list_and_at_most_the_api_timeout() {
    // A reachable API: not ready until the watch has read the Pod and its slices, so the
    // slices cannot list this Pod ready before the watch is there to see it.
    let cluster = Cluster::start().await;
    set_ready(&cluster, false);
    let d = drain(
        Duration::from_secs(30),
        Propagation::fixed(Duration::from_millis(50)),
        ReadinessWhileDraining::Auto,
    );
    EndpointWatch::from_env()
        .pod(POD)
        .namespace(NS)
        .client(cluster.client())
        .start(&d)
        .unwrap();
    let r = d.readiness().answer();
    assert!(!r.ready, "{r:?}");
    assert_eq!(r.reason, "starting: waiting for endpoint-watch", "{r:?}");
    ready(&d).await;
    assert!(d.readiness().is_ready(), "{:?}", d.readiness().answer());
    assert_eq!(d.phase(), Phase::Serving);
    assert!(
        cluster.with(|m| m.count("pods", "list") > 0 && m.count("endpointslices", "list") > 0),
        "ready before the watch listed"
    );

    // An API that takes the connection and never answers: ready at the api_timeout anyway.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let uri = format!("http://{}", silent.local_addr().unwrap())
        .parse()
        .unwrap();
    let client = kube::Client::try_from(kube::Config::new(uri)).unwrap();
    let d = drain(
        Duration::from_secs(30),
        Propagation::fixed(Duration::from_millis(50)),
        ReadinessWhileDraining::Auto,
    );
    let started = std::time::Instant::now();
    EndpointWatch::from_env()
        .pod(POD)
        .namespace(NS)
        .client(client)
        .api_timeout(Duration::from_millis(300))
        .start(&d)
        .unwrap();
    assert!(!d.readiness().is_ready(), "{:?}", d.readiness().answer());
    ready(&d).await;
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "ready after {:?}, before the API timeout and without an answer",
        started.elapsed()
    );
    d.start(Trigger::Api);
    let r = finished(&d).await;
    let why = r
        .propagation
        .evidence
        .unwrap()
        .endpoint_slice_unused
        .unwrap();
    assert!(why.starts_with("unreachable"), "{why}");
    drop(silent);
}

#[tokio::test]
async fn without_a_pod_name_the_watch_refuses_and_the_report_says_so() {
    let d = drain(
        Duration::from_secs(30),
        Propagation::fixed(Duration::from_millis(50)),
        ReadinessWhileDraining::Auto,
    );
    // The other tests name their Pod, so only this one reads POD_NAME (std's env functions
    // are serialised with each other).
    std::env::remove_var("POD_NAME");
    let err = EndpointWatch::from_env().namespace(NS).start(&d);
    let err = err.unwrap_err().to_string();
    assert!(err.starts_with("POD_NAME is not set"), "{err}");
    ready(&d).await;
    d.start(Trigger::Api);
    let r = finished(&d).await;
    let why = r
        .propagation
        .evidence
        .unwrap()
        .endpoint_slice_unused
        .unwrap();
    assert!(why.starts_with("POD_NAME is not set"), "{why}");
}

#[tokio::test]
async fn serving_until_stop_names_its_own_condition_and_without_a_deletion_waits_to_max() {
    let cluster = Cluster::start().await;
    let d = drain(
        Duration::from_secs(30),
        Propagation::quiet(Duration::from_millis(100))
            .min(Duration::from_millis(100))
            .max(Duration::from_millis(1500)),
        ReadinessWhileDraining::ServingUntilStop,
    );
    EndpointWatch::from_env()
        .pod(POD)
        .namespace(NS)
        .client(cluster.client())
        .proxy_allowance(Duration::from_millis(100))
        .start(&d)
        .unwrap();
    cluster.watching().await;
    // No deletion: kubelet's probe stays green under ServingUntilStop, the slices never move.
    ready(&d).await;
    d.start(Trigger::Api);
    let r = finished(&d).await;
    let ev = r.propagation.evidence.as_ref().unwrap();
    assert_eq!(ev.kind, EvidenceKind::Max);
    assert_eq!(ev.max_reason, Some(MaxReason::EndpointSliceStillRouting));
    let slice = ev.endpoint_slice.as_ref().unwrap();
    assert_eq!(slice.condition, "ready=false or terminating=true");
    assert_eq!(slice.changed_at_ms, None);
    assert!(
        r.advice
            .iter()
            .any(|a| a.rule == AdviceRule::EndpointSliceStillRouting),
        "{:?}",
        r.advice
    );
    assert!(events(&r, EventKind::EndpointChanged).is_empty());
}

/// Sets `web-0`'s readiness as kubelet's probe would, and lets the controller publish it.
fn set_ready(cluster: &Cluster, ready: bool) {
    cluster.with(|m| {
        m.pods.get_mut(POD).unwrap().ready = ready;
        m.sync();
    });
}

/// One request on a new HTTP/1.1 connection to the served port: a routing decision.
async fn one_connection(addr: SocketAddr) {
    let (mut sender, _conn) = common::h1(addr).await;
    let res = common::send1(&mut sender, "/conn").await;
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test]
async fn the_proxy_allowance_is_measured_at_startup_and_reported() {
    const MAX: Duration = Duration::from_secs(6);
    let cluster = Cluster::start().await;
    set_ready(&cluster, false);
    let d = drain(
        Duration::from_secs(30),
        Propagation::quiet(Duration::from_millis(100))
            .min(Duration::from_millis(100))
            .max(MAX),
        ReadinessWhileDraining::Auto,
    );
    let (addr, server) = common::start_serve(&d, common::Probe::default()).await;
    // No `proxy_allowance`: measured.
    EndpointWatch::from_env()
        .pod(POD)
        .namespace(NS)
        .client(cluster.client())
        .start(&d)
        .unwrap();
    cluster.watching().await;
    // Kubelet's probe passes, the controller lists the Pod ready; the first connection
    // through the proxies comes 600 ms later.
    set_ready(&cluster, true);
    tokio::time::sleep(Duration::from_millis(600)).await;
    one_connection(addr).await;
    ready(&d).await;
    d.start(Trigger::Api);
    cluster.delete_pod(30);
    let r = common::drained_clean(&d, server).await;

    let ev = r.propagation.evidence.as_ref().unwrap();
    let slice = ev.endpoint_slice.as_ref().expect("slice evidence");
    assert_eq!(
        slice.allowance_source,
        AllowanceSource::Measured,
        "{slice:?}"
    );
    assert_eq!(slice.startup.peers.len(), 1, "{slice:?}");
    let peer = &slice.startup.peers[0];
    assert_eq!(peer.peer, "127.0.0.1");
    // From when the watch saw the listing (a few ms after it) to the connection.
    assert!(
        (400..3000).contains(&peer.delay_ms),
        "measured {} ms for a 600 ms delay",
        peer.delay_ms
    );
    assert_eq!(slice.allowance_ms, peer.delay_ms);
    assert_eq!(slice.startup.unmeasured, None);
    assert!(slice.allowance_note.starts_with("measured"), "{slice:?}");
    // The note names the peer that set it and how many were measured.
    assert!(
        slice.allowance_note.contains(&format!(
            "127.0.0.1 ({} ms), the slowest of 1 peer;",
            peer.delay_ms
        )),
        "{slice:?}"
    );
    // One connection is no rate (weak evidence), and a measured allowance is one sample of
    // each proxy's delay: not proof for a path whose arrivals cannot judge its own silence.
    // The drain waits to max, as with the default allowance, and says so.
    assert!(ev.weak.is_some(), "{ev:?}");
    assert!(!slice.allowance_proof, "{slice:?}");
    assert!(
        slice
            .allowance_note
            .contains("; a floor only, as some path's arrivals"),
        "{}",
        slice.allowance_note
    );
    assert_eq!(ev.kind, EvidenceKind::Max, "{ev:?}");
    let changed = slice.changed_at_ms.unwrap();
    let done = r.event(EventKind::PropagationDone).unwrap();
    assert!(
        done.at_ms as i64 >= changed + slice.allowance_ms as i64,
        "committed at {} ms, before the slice change ({changed} ms) + {} ms",
        done.at_ms,
        slice.allowance_ms
    );
    // `max`, as this deletion's budget left it (a little under MAX).
    let max_ms = r
        .budget
        .deletion
        .as_ref()
        .map_or(MAX.as_millis() as u64, |b| b.max_ms);
    assert!(done.at_ms >= max_ms, "{r:?}");
    let json = serde_json::to_value(slice).unwrap();
    assert_eq!(json["allowance_source"], "measured");
    assert_eq!(json["allowance_proof"], false);
}

#[tokio::test]
async fn without_a_measurement_the_default_allowance_is_named_with_its_source() {
    // `web-0` is ready from the start: the watch's first list already shows it routed, so
    // nothing at startup can be measured.
    let cluster = Cluster::start().await;
    let d = drain(
        Duration::from_secs(30),
        Propagation::quiet(Duration::from_millis(100))
            .min(Duration::from_millis(100))
            .max(Duration::from_millis(2600)),
        ReadinessWhileDraining::Auto,
    );
    EndpointWatch::from_env()
        .pod(POD)
        .namespace(NS)
        .client(cluster.client())
        .start(&d)
        .unwrap();
    cluster.watching().await;
    ready(&d).await;
    d.start(Trigger::Api);
    cluster.delete_pod(30);
    let r = finished(&d).await;

    let ev = r.propagation.evidence.as_ref().unwrap();
    let slice = ev.endpoint_slice.as_ref().expect("slice evidence");
    assert_eq!(
        slice.allowance_source,
        AllowanceSource::Default,
        "{slice:?}"
    );
    assert_eq!(
        slice.allowance_ms,
        lameduck::DEFAULT_PROXY_ALLOWANCE.as_millis() as u64
    );
    assert!(
        slice
            .allowance_note
            .starts_with("default: DEFAULT_PROXY_ALLOWANCE (2000 ms: kube-proxy's minSyncPeriod"),
        "{}",
        slice.allowance_note
    );
    assert!(slice.startup.peers.is_empty());
    assert_eq!(
        slice.startup.unmeasured.as_deref(),
        Some("the slices already listed this Pod ready when the watch first read them")
    );
    let json = serde_json::to_value(slice).unwrap();
    assert_eq!(json["allowance_source"], "default");
}

#[tokio::test]
async fn sparse_traffic_and_the_default_allowance_do_not_commit_before_the_arrival_evidence() {
    let cluster = Cluster::start().await;
    set_ready(&cluster, false);
    let max = Duration::from_millis(3500);
    let d = drain(
        Duration::from_secs(30),
        Propagation::quiet(Duration::from_millis(100))
            .min(Duration::from_millis(100))
            .max(max),
        ReadinessWhileDraining::Auto,
    );
    let (addr, server) = common::start_serve(&d, common::Probe::default()).await;
    EndpointWatch::from_env()
        .pod(POD)
        .namespace(NS)
        .client(cluster.client())
        .start(&d)
        .unwrap();
    cluster.watching().await;
    // Sparse traffic from one client that reached the Pod before any slice listed it (its
    // IP, not the Service): it says nothing about the proxies, so nothing is measured.
    one_connection(addr).await;
    set_ready(&cluster, true);
    tokio::time::sleep(Duration::from_millis(300)).await;
    one_connection(addr).await;
    ready(&d).await;
    d.start(Trigger::Api);
    cluster.delete_pod(30);
    let r = common::drained_clean(&d, server).await;

    let ev = r.propagation.evidence.as_ref().unwrap();
    let slice = ev.endpoint_slice.as_ref().expect("slice evidence");
    assert_eq!(
        slice.allowance_source,
        AllowanceSource::Default,
        "{slice:?}"
    );
    assert_eq!(slice.startup.peers_left_out, 1, "{slice:?}");
    assert!(
        slice
            .startup
            .unmeasured
            .as_deref()
            .unwrap()
            .starts_with("every peer that connected after the slices listed this Pod ready"),
        "{slice:?}"
    );
    // The slices changed at once and the default 2 s passed long before max; the arrival
    // evidence alone (two connections, too little to tell) would wait to max, and so does
    // the drain: an assumed allowance is a floor, not proof.
    let changed = slice.changed_at_ms.unwrap();
    assert!(changed + 2000 < max.as_millis() as i64 - 500, "{slice:?}");
    assert!(ev.weak.is_some(), "{ev:?}");
    assert_eq!(ev.kind, EvidenceKind::Max, "{ev:?}");
    assert_eq!(ev.max_reason, Some(MaxReason::NotEnoughEvidence));
    // `max` as this deletion left it (its timestamp is in whole seconds, so a little less).
    let max_ms = r
        .budget
        .deletion
        .as_ref()
        .map_or(max.as_millis() as u64, |d| d.max_ms);
    assert!(max_ms > changed as u64 + 2500, "max {max_ms} ms");
    let done = r.event(EventKind::PropagationDone).unwrap();
    assert!(
        done.at_ms >= max_ms,
        "committed at {} ms on the default allowance (slices at {changed} ms), before max \
         ({max_ms} ms)",
        done.at_ms
    );
}
