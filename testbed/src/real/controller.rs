//! The controller's side of the real stack: the Service, the Deployment or the testbed as its
//! controller, the scheduler, Pod creation and deletion, the rollout.

use super::*;

impl Real {
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
    pub(in crate::real) fn pod_spec(t: &PodTemplate) -> serde_json::Value {
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
    pub(in crate::real) async fn scheduler_loop(self: Arc<Self>) {
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
            "../../../examples/k8s/serviceaccount.yaml"
        ))?)
        .map_err(err("serviceaccount.yaml"))?;
        Api::<ServiceAccount>::namespaced(self.admin.clone(), NAMESPACE)
            .create(&pp, &sa)
            .await
            .map_err(err("apply serviceaccount.yaml"))?;
        let role: Role =
            serde_json::from_value(yaml(include_str!("../../../examples/k8s/role.yaml"))?)
                .map_err(err("role.yaml"))?;
        Api::<Role>::namespaced(self.admin.clone(), NAMESPACE)
            .create(&pp, &role)
            .await
            .map_err(err("apply role.yaml"))?;
        let rb: RoleBinding = serde_json::from_value(yaml(include_str!(
            "../../../examples/k8s/rolebinding.yaml"
        ))?)
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

    /// Checks `examples/k8s/` against this real kube-apiserver, by server-side dry runs that
    /// leave nothing behind: `deployment.yaml` and `service.yaml` are accepted as written; a
    /// Pod of the Deployment's template, as the ReplicaSet would create it, is admitted as
    /// written (it names no ServiceAccount, so it needs none); the same Pod naming the
    /// example's account is refused before `serviceaccount.yaml` is applied (the trap the
    /// manifest's comment warns of: the check can fail) and admitted after. With the RBAC
    /// applied (`rbac_applied`), the account may do what the `kube` feature does — get and
    /// watch Pods, list and watch EndpointSlices, get Services, in its namespace — and
    /// nothing else asked here: no Secrets, no writes, no other namespace.
    pub async fn check_example_manifests(&self, rbac_applied: bool) -> Result<(), NetError> {
        use k8s_openapi::api::apps::v1::Deployment;
        const ACCOUNT: &str = "lameduck-example";
        let dry = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        let yaml = |text: &str| -> Result<serde_json::Value, NetError> {
            serde_yaml::from_str(text).map_err(err("examples/k8s"))
        };
        let dep: Deployment =
            serde_json::from_value(yaml(include_str!("../../../examples/k8s/deployment.yaml"))?)
                .map_err(err("deployment.yaml"))?;
        Api::<Deployment>::namespaced(self.admin.clone(), NAMESPACE)
            .create(&dry, &dep)
            .await
            .map_err(err("deployment.yaml, a server-side dry run"))?;
        let svc: Service =
            serde_json::from_value(yaml(include_str!("../../../examples/k8s/service.yaml"))?)
                .map_err(err("service.yaml"))?;
        Api::<Service>::namespaced(self.admin.clone(), NAMESPACE)
            .create(&dry, &svc)
            .await
            .map_err(err("service.yaml, a server-side dry run"))?;
        let template = dep
            .spec
            .as_ref()
            .map(|s| s.template.clone())
            .ok_or_else(|| NetError("deployment.yaml has no template".into()))?;
        let pod = |account: Option<&str>| {
            let mut spec = template.spec.clone().unwrap_or_default();
            spec.service_account_name = account.map(str::to_owned);
            Pod {
                metadata: kube::api::ObjectMeta {
                    generate_name: Some("lameduck-example-".into()),
                    labels: template.metadata.as_ref().and_then(|m| m.labels.clone()),
                    ..Default::default()
                },
                spec: Some(spec),
                status: None,
            }
        };
        let pods = Api::<Pod>::namespaced(self.admin.clone(), NAMESPACE);
        pods.create(&dry, &pod(None)).await.map_err(err(
            "a Pod of deployment.yaml's template as written (no ServiceAccount named), a dry run",
        ))?;
        match (rbac_applied, pods.create(&dry, &pod(Some(ACCOUNT))).await) {
            (true, Err(e)) => {
                return Err(NetError(format!(
                    "a Pod naming {ACCOUNT} after serviceaccount.yaml was applied was refused: {e}"
                )))
            }
            (false, Ok(_)) => {
                return Err(NetError(format!(
                    "a Pod naming {ACCOUNT} was admitted before serviceaccount.yaml was applied:                      this check cannot tell a missing account"
                )))
            }
            _ => {}
        }
        if rbac_applied {
            self.check_example_access(ACCOUNT).await?;
        }
        self.record(
            "manifests_checked",
            None,
            if rbac_applied {
                "examples/k8s/: deployment and service accepted; a Pod of the template admitted \
                 with and without the account; the Role allows the feature's reads and nothing \
                 else asked"
            } else {
                "examples/k8s/: deployment and service accepted; a Pod of the template admitted \
                 as written, and refused naming the account before it exists"
            },
        );
        Ok(())
    }

    /// What `role.yaml` lets the example's account do, as the real authorizer says: the
    /// `kube` feature's reads in its namespace, and none of the others asked.
    async fn check_example_access(&self, account: &str) -> Result<(), NetError> {
        let may = |verb: &str, group: &str, resource: &str, ns: &str| {
            (
                verb.to_owned(),
                group.to_owned(),
                resource.to_owned(),
                ns.to_owned(),
            )
        };
        let checks = [
            (may("get", "", "pods", NAMESPACE), true),
            (may("watch", "", "pods", NAMESPACE), true),
            (
                may("list", "discovery.k8s.io", "endpointslices", NAMESPACE),
                true,
            ),
            (
                may("watch", "discovery.k8s.io", "endpointslices", NAMESPACE),
                true,
            ),
            (may("get", "", "services", NAMESPACE), true),
            (may("list", "", "secrets", NAMESPACE), false),
            (may("update", "", "pods", NAMESPACE), false),
            (
                may("patch", "discovery.k8s.io", "endpointslices", NAMESPACE),
                false,
            ),
            (may("get", "", "pods", "kube-system"), false),
        ];
        for ((verb, group, resource, ns), want) in checks {
            let got = self.may(account, &verb, &group, &resource, &ns).await?;
            if got != want {
                return Err(NetError(format!(
                    "role.yaml: the example's account {} {verb} {resource} in {ns}",
                    if got { "may" } else { "may not" }
                )));
            }
        }
        Ok(())
    }

    /// Whether ServiceAccount `account` of the cell's namespace may `verb` `resource` of
    /// `group` in namespace `ns`, as the real authorizer (RBAC) says.
    async fn may(
        &self,
        account: &str,
        verb: &str,
        group: &str,
        resource: &str,
        ns: &str,
    ) -> Result<bool, NetError> {
        use k8s_openapi::api::authorization::v1::{
            ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
        };
        let review = SubjectAccessReview {
            metadata: Default::default(),
            spec: SubjectAccessReviewSpec {
                user: Some(format!("system:serviceaccount:{NAMESPACE}:{account}")),
                groups: Some(vec![
                    "system:serviceaccounts".into(),
                    format!("system:serviceaccounts:{NAMESPACE}"),
                    "system:authenticated".into(),
                ]),
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some(ns.to_owned()),
                    verb: Some(verb.to_owned()),
                    group: Some(group.to_owned()),
                    resource: Some(resource.to_owned()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            status: None,
        };
        let answer = Api::<SubjectAccessReview>::all(self.admin.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(err("a SubjectAccessReview"))?;
        Ok(answer.status.is_some_and(|s| s.allowed))
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
}

/// The real stack as a cell's rollout sees it: Pods from `template`, logs under `dir`.
pub(crate) struct RealStack<'a> {
    real: &'a Real,
    template: &'a PodTemplate,
    dir: &'a std::path::Path,
}

impl<'a> RealStack<'a> {
    pub(crate) fn new(real: &'a Real, template: &'a PodTemplate, dir: &'a std::path::Path) -> Self {
        Self {
            real,
            template,
            dir,
        }
    }
}

impl crate::rollout::Stack for RealStack<'_> {
    const SETTLE: Duration = Duration::from_secs(60);
    const TAIL: Duration = Duration::from_secs(10);

    fn pods(&self, first_new: usize) -> impl crate::rollout::Pods + '_ {
        RealPods {
            real: self.real,
            template: self.template,
            first_new,
        }
    }

    fn gone(&self, name: &str) -> bool {
        self.real.removed(name)
    }

    async fn wait_applied(&self, pods: &[String]) {
        self.real.wait_applied(pods).await
    }

    fn forget_unrouted(&self) -> Result<(), NetError> {
        self.real.forget_unrouted()
    }

    fn record(&self, what: &str, pod: Option<&str>, detail: &str) {
        self.real.record(what, pod, detail)
    }

    fn logs_hint(&self) -> String {
        format!("see the logs in {}", self.dir.display())
    }

    async fn kubelet_terminate(
        &self,
        name: &str,
        stop: crate::rollout::KubeletStop,
    ) -> Result<(), NetError> {
        self.real.kubelet_terminate(name, stop).await
    }
}

/// The real stack's Pods for a rolling update: created from `template` as `pod-<first_new>`,
/// `pod-<first_new + 1>`, …, deleted through the API, changes seen through the watch.
struct RealPods<'a> {
    real: &'a Real,
    template: &'a PodTemplate,
    first_new: usize,
}

impl crate::rollout::Pods for RealPods<'_> {
    fn available(&self, name: &str) -> bool {
        self.real.available(name)
    }

    async fn create(&self, index: usize) -> Result<String, NetError> {
        let name = format!("pod-{}", self.first_new + index);
        self.real.create_pod(&name, self.template).await?;
        Ok(name)
    }

    async fn delete(&self, name: &str) -> Result<(), NetError> {
        self.real.delete_pod(name).await
    }

    async fn changed(&self) {
        tokio::select! {
            () = self.real.pods_changed.notified() => {}
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}
