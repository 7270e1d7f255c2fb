//! The watchers: every EndpointSlice change of the Service, and each node's kube-proxy
//! metrics, scraped into the timeline.

use super::*;

impl Real {
    /// Every EndpointSlice change of the Service, as the watch delivers it.
    pub(in crate::real) async fn watch_slices(self: Arc<Self>) {
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
    pub(in crate::real) async fn scrape_proxy(self: Arc<Self>, k: usize) {
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
}
