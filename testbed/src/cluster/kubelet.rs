//! The model's kubelet: Pods created in their own namespaces, probed, deleted and finished.

use super::*;

impl Cluster {
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

    pub(in crate::cluster) fn start_process(
        &self,
        name: &str,
        ns: &str,
    ) -> Result<tokio::process::Child, NetError> {
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

    pub(in crate::cluster) fn set_ready(&self, name: &str, ready: bool) {
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
    pub(in crate::cluster) async fn kubelet_pod(
        self: Arc<Self>,
        name: String,
        ns: String,
        ip: Ipv4Addr,
        mut child: tokio::process::Child,
        mut deleted: watch::Receiver<bool>,
    ) {
        let admin = SocketAddr::from((ip, ADMIN_PORT));
        let (exit_tx, exit_rx) = watch::channel(false);
        let prober = tokio::spawn(self.clone().readiness_probes(name.clone(), admin, exit_rx));
        // Deletion, or an exit on its own.
        tokio::select! {
            _ = async { let _ = deleted.wait_for(|d| *d).await; } => {}
            status = child.wait() => {
                self.finish(&name, &format!("exited before deletion: {status:?}"), &exit_tx);
                let _ = prober.await;
                return;
            }
        }
        let kill_at = tokio::time::Instant::now() + self.kubelet.grace;
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

        let hook_result = tokio::select! {
            r = self.pre_stop(&ns, admin) => r,
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

    /// Readiness probes of one Pod's admin port, until `exit`: each verdict past its
    /// threshold set on the Pod.
    async fn readiness_probes(
        self: Arc<Self>,
        name: String,
        admin: SocketAddr,
        mut exit: watch::Receiver<bool>,
    ) {
        let k = &self.kubelet;
        let (mut ok_run, mut fail_run) = (0u32, 0u32);
        let mut tick = tokio::time::interval(k.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first probe comes a moment after the start, like kubelet's.
        tokio::time::sleep(Duration::from_millis(200)).await;
        loop {
            tokio::select! {
                _ = async { let _ = exit.wait_for(|e| *e).await; } => return,
                _ = tick.tick() => {}
            }
            let ok = matches!(http_get(admin, "/readyz", k.timeout).await, Ok(200));
            if ok {
                ok_run += 1;
                fail_run = 0;
                if ok_run >= k.success_threshold {
                    self.set_ready(&name, true);
                }
            } else {
                fail_run += 1;
                ok_run = 0;
                if fail_run >= k.failure_threshold {
                    self.set_ready(&name, false);
                }
            }
        }
    }

    /// The configured `preStop` hook against the Pod's admin port, and what it returned.
    async fn pre_stop(&self, ns: &str, admin: SocketAddr) -> Option<String> {
        match &self.kubelet.pre_stop {
            PreStop::None => None,
            PreStop::HttpGet(path) => Some(match http_get(admin, path, self.kubelet.grace).await {
                Ok(code) => format!("httpGet {path}: {code}"),
                Err(e) => format!("httpGet {path}: {e}"),
            }),
            PreStop::Exec => {
                let out = tokio::process::Command::new("ip")
                    .args(["netns", "exec", ns])
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
    }

    pub(in crate::cluster) fn finish(
        &self,
        name: &str,
        detail: &str,
        exit_tx: &watch::Sender<bool>,
    ) {
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
}
