//! One Pod's life on this node: its process, its probes, its termination.

use super::*;

impl Real {
    /// One Pod's life on this node.
    pub(in crate::real) async fn run_pod(
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
        let mut child = self.start_container(&pod, &container, &ns, ip).await?;
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
        let kill_at = tokio::time::Instant::now() + grace;
        let hook_result = tokio::select! {
            r = self.pre_stop(&container, &ns, ip, grace) => r,
            () = tokio::time::sleep_until(kill_at) => Some("hook cut at the grace period".to_owned()),
        };
        if let Some(r) = hook_result {
            self.record("prestop_returned", Some(&name), r);
        }
        let code = self.stop_container(&name, &mut child, kill_at).await;
        exit_tx.send_replace(true);
        let _ = prober.await;
        self.pod_terminated(&name, uid, ip, &started, code).await;
        Ok(())
    }

    /// The container's process in the Pod's namespace, its output to the Pod's log.
    async fn start_container(
        &self,
        pod: &Pod,
        container: &Container,
        ns: &str,
        ip: Ipv4Addr,
    ) -> Result<tokio::process::Child, NetError> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let env = self.container_env(pod, container, ip).await?;
        let run_dir = self.service_account_files(pod, container).await?;
        let report = self.dir.join(format!("{name}.report.json"));
        let log =
            std::fs::File::create(self.dir.join(format!("{name}.log"))).map_err(err("pod log"))?;
        let log2 = log.try_clone().map_err(err("pod log"))?;
        let mut cmd = tokio::process::Command::new("ip");
        cmd.args(["netns", "exec", ns]);
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
        let child = cmd.spawn().map_err(err("start the container"))?;
        if let Some(pid) = child.id() {
            net::pid_started(pid);
        }
        Ok(child)
    }

    /// The container's `preStop` hook (httpGet, exec or sleep), and what it returned; `None`
    /// without one.
    async fn pre_stop(
        &self,
        container: &Container,
        ns: &str,
        ip: Ipv4Addr,
        grace: Duration,
    ) -> Option<String> {
        let pre = container.lifecycle.as_ref()?.pre_stop.as_ref()?;
        if let Some(h) = &pre.http_get {
            let port = resolve_port(container, &h.port);
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
            c.args(["netns", "exec", ns]);
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
    }

    /// SIGTERM, then SIGKILL at `kill_at` if the process is still there; its exit code.
    async fn stop_container(
        &self,
        name: &str,
        child: &mut tokio::process::Child,
        kill_at: tokio::time::Instant,
    ) -> Option<i32> {
        if let Some(pid) = child.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            self.record("signal", Some(name), "SIGTERM");
        }
        let status = tokio::select! {
            s = child.wait() => s,
            () = tokio::time::sleep_until(kill_at) => {
                let _ = child.start_kill();
                self.record("killed", Some(name), "SIGKILL at the grace period");
                child.wait().await
            }
        };
        if let Some(pid) = child.id() {
            net::pid_exited(pid);
        }
        self.record(
            "exit",
            Some(name),
            match &status {
                Ok(s) => match s.code() {
                    Some(c) => format!("code {c}"),
                    None => format!("{s}"),
                },
                Err(e) => e.to_string(),
            },
        );
        status.as_ref().ok().and_then(|s| s.code())
    }

    /// The terminal status, then the object's removal (kubelet's status manager).
    async fn pod_terminated(
        &self,
        name: &str,
        uid: String,
        ip: Ipv4Addr,
        started: &str,
        code: Option<i32>,
    ) {
        let now = rfc3339_now();
        let code = code.unwrap_or(137);
        let mut st = Self::status_json(ip, started, false, false);
        st["phase"] = json!(if code == 0 { "Succeeded" } else { "Failed" });
        st["containerStatuses"][0]["started"] = json!(false);
        st["containerStatuses"][0]["state"] = json!({"terminated": {
            "exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" },
            "startedAt": started, "finishedAt": now}});
        self.patch_pod_status(name, st).await;
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        if let Err(e) = Api::<Pod>::namespaced(self.kubelet.clone(), NAMESPACE)
            .delete(name, &dp)
            .await
        {
            self.record("remove_failed", Some(name), e.to_string());
        }
    }

    pub(in crate::real) async fn probe_loop(
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
}
