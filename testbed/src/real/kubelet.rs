//! The kubelet: the Node's registration, the loop that runs this node's Pods, their status,
//! ServiceAccount files and environment.

use super::*;

mod pod;

impl Real {
    /// Registers node `k`'s Node (Ready, its InternalIP the node's client-side address):
    /// node 1 as its kubelet, the others (which run no Pods here, only their kube-proxy) as
    /// the controller, since NodeRestriction lets a kubelet write only its own Node.
    pub(in crate::real) async fn register_node(&self, k: usize) -> Result<(), NetError> {
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
    pub(in crate::real) async fn kubelet_loop(self: Arc<Self>) {
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

    /// Terminates Pod `name` on the kubelet's own account, as graceful node shutdown and
    /// node-pressure eviction do: the `DisruptionTarget` condition (reason
    /// `TerminationByKubelet`) and the status reason through the API, no deletion; then the
    /// Pod's termination with `stop`'s budget: `preStop`, SIGTERM, SIGKILL at the budget,
    /// the terminal phase.
    pub(crate) async fn kubelet_terminate(
        &self,
        name: &str,
        stop: crate::rollout::KubeletStop,
    ) -> Result<(), NetError> {
        let tx = self
            .deleters
            .lock()
            .unwrap()
            .get(name)
            .cloned()
            .ok_or_else(|| NetError(format!("no Pod {name} runs on this node")))?;
        self.kubelet_stops
            .lock()
            .unwrap()
            .insert(name.to_owned(), (stop, rfc3339_now()));
        let budget = stop.budget();
        self.record(
            "deleted",
            Some(name),
            format!(
                "by the kubelet ({}): DisruptionTarget TerminationByKubelet, no deletion, budget {} ms",
                stop.name(),
                budget.as_millis()
            ),
        );
        let last = self.last_status.lock().unwrap().get(name).cloned();
        if let Some(status) = last {
            self.patch_pod_status(name, status).await;
        }
        tx.send_replace(Some(budget));
        Ok(())
    }

    pub(in crate::real) async fn patch_pod_status(
        &self,
        name: &str,
        mut status: serde_json::Value,
    ) {
        self.last_status
            .lock()
            .unwrap()
            .insert(name.to_owned(), status.clone());
        let stop = self.kubelet_stops.lock().unwrap().get(name).cloned();
        if let Some((stop, since)) = stop {
            // A merge patch replaces the whole list: every write carries the condition.
            let (message, reason) = stop.status();
            if let Some(c) = status["conditions"].as_array_mut() {
                c.push(json!({"type": "DisruptionTarget", "status": "True",
                              "reason": "TerminationByKubelet", "message": message,
                              "lastTransitionTime": since}));
            }
            status["reason"] = json!(reason);
            status["message"] = json!(message);
        }
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

    pub(in crate::real) fn status_json(
        ip: Ipv4Addr,
        started: &str,
        ready: bool,
        running: bool,
    ) -> serde_json::Value {
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

    /// The projected ServiceAccount volume (the one the ServiceAccount admission adds): a
    /// token requested through the API bound to this Pod, `ca.crt` from the `kube-root-ca.crt`
    /// ConfigMap, `namespace`; written under `<cell>/<pod>.run/secrets/…`, the directory that
    /// becomes the Pod's `/run`. `None` when the Pod has no such volume mounted.
    pub(in crate::real) async fn service_account_files(
        &self,
        pod: &Pod,
        c: &Container,
    ) -> Result<Option<PathBuf>, NetError> {
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
            self.project_source(pod, &sa, src, &target).await?;
        }
        self.record(
            "volume",
            Some(&name),
            format!("{mount}: token, ca.crt, namespace"),
        );
        Ok(Some(run))
    }

    /// One source of a projected ServiceAccount volume written under `target`: the token,
    /// the CA ConfigMap's items, the namespace.
    async fn project_source(
        &self,
        pod: &Pod,
        sa: &str,
        src: &k8s_openapi::api::core::v1::VolumeProjection,
        target: &Path,
    ) -> Result<(), NetError> {
        use k8s_openapi::api::authentication::v1::TokenRequest;
        use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
        let name = pod.metadata.name.clone().unwrap_or_default();
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
                .create_token_request(sa, &PostParams::default(), &req)
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
        Ok(())
    }

    /// The container's environment as kubelet builds it: literal values, downward-API fields,
    /// the `kubernetes` Service's variables.
    pub(in crate::real) async fn container_env(
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
