//! The model's data plane: the EndpointSlice controller and each node's kube-proxy loop.

use super::*;

impl Cluster {
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

    pub(in crate::cluster) fn record_node(&self, what: &str, node: Option<&str>, detail: String) {
        self.events.lock().unwrap().push(Event {
            unix_ms: unix_ms(),
            what: what.to_owned(),
            pod: None,
            node: node.map(str::to_owned),
            detail,
        });
    }

    /// Established TCP flows conntrack holds towards `ip` in node `k`'s namespace.
    pub(in crate::cluster) fn pinned_flows(&self, k: usize, ip: Ipv4Addr) -> Option<usize> {
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
}
