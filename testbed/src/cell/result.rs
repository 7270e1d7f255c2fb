//! A cell's result: every request counted, per deleted Pod its timeline and steps, and the
//! table row.

use super::*;

/// The clients' counts.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Counts {
    /// Requests sent.
    pub requests: u64,
    /// Succeeded.
    pub ok: u64,
    /// Failed (no retries anywhere).
    pub failed: u64,
    /// Still running when the client gave up waiting.
    pub unfinished: u64,
    /// Moved to another connection before anything was sent (counted as lost too: a client
    /// without that logic would have failed them).
    pub rerouted: u64,
    /// Not sent: the client's in-flight cap was reached.
    pub not_sent: u64,
    /// The first failure, `at_unix_ms error`.
    pub first_failure: Option<String>,
    /// Requests sent before the first Pods were routed on every node (the clients run from
    /// before the first Pod is ready, so the drains measure their proxies on traffic, not on
    /// the harness): the Service had no endpoint yet, so they are not counted above.
    pub before_routing: u64,
    /// Every counted request that found no connection (refused, timed out): the new
    /// connections that a proxy sent to a Pod that no longer accepted, among others.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub connect_failures: Vec<ConnectFailure>,
}

impl Counts {
    /// Counts the requests that started at or after `counted_from` (unix ms; every request
    /// when `None`). `not_sent_before` is what the in-flight cap refused until then.
    pub fn add(&mut self, r: &ProbeResult, counted_from: Option<f64>, not_sent_before: u64) {
        let started = r.summary.started_unix_ms as f64;
        for rec in &r.records {
            let at = rec.start_unix_ms.unwrap_or(started + rec.start_ms);
            if counted_from.is_some_and(|from| at < from) {
                self.before_routing += 1;
                continue;
            }
            self.requests += 1;
            match rec.outcome {
                Outcome::Ok => self.ok += 1,
                Outcome::Failed => {
                    self.failed += 1;
                    let end = rec.end_ms.map_or(at, |e| started + e);
                    let line = format!(
                        "{end:.0} [{}] {} {}",
                        rec.label,
                        rec.failure.map_or("failed", |f| f.as_str()),
                        rec.error.as_deref().unwrap_or("")
                    );
                    if self.first_failure.as_ref().is_none_or(|old| *old > line) {
                        self.first_failure = Some(line);
                    }
                    if rec.failure == Some(Failure::Connect) {
                        self.connect_failures.push(ConnectFailure {
                            at_unix_ms: at,
                            label: rec.label.clone(),
                            error: rec.error.clone().unwrap_or_default(),
                        });
                    }
                }
                Outcome::Unfinished => self.unfinished += 1,
            }
            self.rerouted += u64::from(rec.rerouted > 0);
        }
        self.not_sent += r.summary.not_sent.saturating_sub(not_sent_before);
    }

    /// Failed plus rerouted plus not sent: every request that a retry-free client lost.
    pub fn lost(&self) -> u64 {
        self.failed + self.rerouted + self.not_sent
    }
}

/// Per deleted Pod: deletion → exit, and the timeline.
#[derive(Debug, Clone, Serialize)]
pub struct PodTimeline {
    /// The Pod.
    pub pod: String,
    /// Deletion, unix ms.
    pub deleted_unix_ms: u64,
    /// Deletion → exit, ms.
    pub drain_ms: Option<u64>,
    /// The four steps, ms from the deletion: the endpoint change (the first EndpointSlice
    /// without this Pod ready), the proxy update (the first sync whose rules leave it out),
    /// the exit. On the real stack the slice comes from the API's watch and the sync time
    /// from kube-proxy's own metric.
    pub steps: Steps,
    /// Lines: `+ms  source  what  detail`.
    pub lines: Vec<String>,
    /// What the drain's commit went on, from its report (`propagation.evidence.kind`:
    /// `confidence`, `endpoint_slice`, `max`, …), when the report was read.
    pub evidence: Option<String>,
    /// The path that held the commit (`propagation.evidence.held_by`).
    pub held_by: Option<String>,
}

impl PodTimeline {
    /// The drain committed on evidence (`confidence` or `endpoint_slice`), not at `max`, a
    /// fallback or a fixed delay.
    pub fn on_evidence(&self) -> bool {
        matches!(
            self.evidence.as_deref(),
            Some("confidence" | "endpoint_slice")
        )
    }

    /// Every node agent said its rules no longer routed to the Pod (`confirmed`).
    pub fn confirmed(&self) -> bool {
        self.evidence.as_deref() == Some("confirmed")
    }

    /// The drain waited to `max`.
    pub fn at_max(&self) -> bool {
        self.evidence.as_deref() == Some("max")
    }
}

/// A deleted Pod's steps, ms from its deletion (`None`: not seen).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Steps {
    /// The first EndpointSlice that no longer shows the Pod ready.
    pub endpoint_change_ms: Option<i64>,
    /// The first kube-proxy sync whose rules no longer send new connections to it; with
    /// several nodes, the slowest node's (`None` while any node had not updated).
    pub proxy_update_ms: Option<i64>,
    /// With several nodes: each node's first such sync (`node1`, `node2`, …).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub per_node: Vec<(String, Option<i64>)>,
    /// The process's exit.
    pub exit_ms: Option<i64>,
    /// The drain's commit: its listeners closed (`stopped_accepting` in its report), so a
    /// new connection from then on is refused.
    pub commit_ms: Option<i64>,
}

impl Steps {
    pub(super) fn from_events(pod: &str, deleted: u64, events: &[Event]) -> Steps {
        let rel = |e: &Event| e.unix_ms as i64 - deleted as i64;
        let tag = format!("{pod}(");
        let mut nodes: Vec<String> = Vec::new();
        for e in events.iter().filter(|e| e.what == "sync") {
            if let Some(n) = &e.node {
                if !nodes.contains(n) {
                    nodes.push(n.clone());
                }
            }
        }
        nodes.sort();
        let mut per_node: Vec<(String, Option<i64>)> =
            nodes.iter().map(|n| (n.clone(), None)).collect();
        let after = events.iter().filter(|e| e.unix_ms >= deleted);
        let mut s = Steps::default();
        let mut single: Option<i64> = None;
        for e in after {
            match e.what.as_str() {
                "slice" if s.endpoint_change_ms.is_none() => {
                    let shown_ready = e
                        .detail
                        .split(") ")
                        .any(|ep| ep.starts_with(&tag) && ep.contains(" r=1"));
                    if !shown_ready {
                        s.endpoint_change_ms = Some(rel(e));
                    }
                }
                "sync" => {
                    let routed = e.detail.split(';').next().unwrap_or("");
                    if routed.split_whitespace().any(|w| w == pod) {
                        continue;
                    }
                    match &e.node {
                        Some(n) => {
                            if let Some(slot) = per_node.iter_mut().find(|(m, _)| m == n) {
                                slot.1.get_or_insert(rel(e));
                            }
                        }
                        None => {
                            single.get_or_insert(rel(e));
                        }
                    }
                }
                "exit" if e.pod.as_deref() == Some(pod) && s.exit_ms.is_none() => {
                    s.exit_ms = Some(rel(e));
                }
                _ => {}
            }
        }
        if per_node.is_empty() {
            s.proxy_update_ms = single;
        } else {
            s.proxy_update_ms = per_node
                .iter()
                .map(|(_, at)| *at)
                .collect::<Option<Vec<i64>>>()
                .and_then(|all| all.into_iter().max());
            s.per_node = per_node;
        }
        s
    }

    /// Exit minus the (slowest) proxy update, ms: below zero, the process was gone while a
    /// kube-proxy still sent new connections to it.
    pub fn exit_after_proxy_ms(&self) -> Option<i64> {
        Some(self.exit_ms? - self.proxy_update_ms?)
    }

    /// `deletion 0, endpoint change +120 ms, proxy update +1.1 s, exit +1.5 s`; with several
    /// nodes each node's update, and how far the exit beat or trailed the slowest.
    pub fn line(&self) -> String {
        let f = |v: Option<i64>| v.map_or("-".to_owned(), |ms| format!("+{ms} ms"));
        let proxy = if self.per_node.is_empty() {
            f(self.proxy_update_ms)
        } else {
            let each: Vec<String> = self
                .per_node
                .iter()
                .map(|(n, at)| format!("{n} {}", f(*at)))
                .collect();
            each.join(", ")
        };
        let mut line = format!(
            "deletion 0, endpoint change {}, proxy update {proxy}, commit {}, exit {}",
            f(self.endpoint_change_ms),
            f(self.commit_ms),
            f(self.exit_ms)
        );
        if let (false, Some(d)) = (self.per_node.is_empty(), self.exit_after_proxy_ms()) {
            if d >= 0 {
                let _ = write!(line, " ({d} ms after the slowest proxy)");
            } else {
                let _ = write!(line, " ({} ms BEFORE the slowest proxy)", -d);
            }
        }
        line
    }
}

/// One cell's result.
#[derive(Debug, Clone, Serialize)]
pub struct CellResult {
    /// The cell.
    pub name: String,
    /// Its config.
    pub config: CellConfig,
    /// The counts.
    pub counts: Counts,
    /// Per deleted Pod.
    pub pods: Vec<PodTimeline>,
    /// Everything the model recorded.
    pub events: Vec<Event>,
    /// Where its files are.
    pub dir: PathBuf,
}

impl CellResult {
    /// `true` when no request was lost or left unfinished.
    pub fn clean(&self) -> bool {
        self.counts.lost() == 0 && self.counts.unfinished == 0
    }

    /// The per-Pod timelines as text.
    pub fn timelines(&self) -> String {
        let mut s = String::new();
        for p in &self.pods {
            let _ = writeln!(
                s,
                "  {} deleted at unix {} ms (drain {}):",
                p.pod,
                p.deleted_unix_ms,
                p.drain_ms.map_or("not exited".to_owned(), |d| format!(
                    "{:.1} s",
                    d as f64 / 1000.0
                ))
            );
            let _ = writeln!(s, "    {}", p.steps.line());
            for l in &p.lines {
                let _ = writeln!(s, "    {l}");
            }
        }
        s
    }
}

/// The table header.
pub fn table_header() -> String {
    format!(
        "{:<48} {:>8} {:>5} {:>10} {:>8} {:>15}  {}\n",
        "cell",
        "requests",
        "lost",
        "unfinished",
        "rerouted",
        "conf / ev / max",
        "drain (deletion → exit) per Pod"
    )
}

/// One table row.
pub fn table_row(r: &CellResult) -> String {
    let drains: Vec<String> = r
        .pods
        .iter()
        .map(|p| {
            p.drain_ms
                .map_or("-".to_owned(), |d| format!("{:.1}s", d as f64 / 1000.0))
        })
        .collect();
    let confirmed = r.pods.iter().filter(|p| p.confirmed()).count();
    let evidence = r.pods.iter().filter(|p| p.on_evidence()).count();
    let max = r.pods.iter().filter(|p| p.at_max()).count();
    // A name longer than its column (several nodes) gets a line of its own.
    let name = if r.name.len() > 48 {
        format!("{}\n{:<48}", r.name, "")
    } else {
        r.name.clone()
    };
    format!(
        "{:<48} {:>8} {:>5} {:>10} {:>8} {:>15}  {}{}\n",
        name,
        r.counts.requests,
        r.counts.lost(),
        r.counts.unfinished,
        r.counts.rerouted,
        format!("{confirmed} / {evidence} / {max}"),
        drains.join(" "),
        if r.clean() { "" } else { "   FAIL" }
    )
}

/// Lines up, for one deleted Pod, the model's events (deletion, slice, sync, hook, signal,
/// exit) and the drain report's own events, relative to the deletion.
pub(super) fn pod_timeline(pod: &str, events: &[Event], dir: &Path, source: &str) -> PodTimeline {
    let deleted = events
        .iter()
        .find(|e| e.what == "deleted" && e.pod.as_deref() == Some(pod))
        .map_or(0, |e| e.unix_ms);
    let exit = events
        .iter()
        .find(|e| e.what == "exit" && e.pod.as_deref() == Some(pod))
        .map(|e| e.unix_ms);
    let end = exit.unwrap_or(u64::MAX).saturating_add(1);
    let mut rows: Vec<(u64, String, String, String)> = Vec::new();
    // Per node (None: the one node), whether its first sync after the exit is in already.
    let mut after_exit_sync: Vec<Option<String>> = Vec::new();
    for e in events {
        if e.unix_ms < deleted {
            continue;
        }
        let mine = e.pod.as_deref() == Some(pod);
        let global = matches!(e.what.as_str(), "slice" | "sync");
        let first_after = e.what == "sync" && !after_exit_sync.contains(&e.node);
        if mine || (global && e.unix_ms <= end) || first_after {
            if e.what == "sync" && e.unix_ms > end {
                after_exit_sync.push(e.node.clone());
            }
            let what = match &e.node {
                Some(n) => format!("{} {n}", e.what),
                None => e.what.clone(),
            };
            rows.push((e.unix_ms, source.into(), what, e.detail.clone()));
        }
    }
    let (evidence, held_by, stopped) = report_rows(
        &dir.join(format!("{pod}.report.json")),
        exit.unwrap_or(deleted),
        &mut rows,
    );
    let mut steps = Steps::from_events(pod, deleted, events);
    steps.commit_ms = stopped.map(|at| at as i64 - deleted as i64);
    rows.sort_by_key(|r| r.0);
    let lines = rows
        .into_iter()
        .map(|(at, src, what, detail)| {
            let rel = at as i64 - deleted as i64;
            format!("{:>+7} ms  {src:<6} {what:<20} {detail}", rel)
        })
        .collect();
    PodTimeline {
        pod: pod.to_owned(),
        deleted_unix_ms: deleted,
        drain_ms: exit.map(|x| x.saturating_sub(deleted)),
        steps,
        lines,
        evidence,
        held_by,
    }
}

/// The drain report's timeline as rows, and a summary row at `summary_at`; the report's
/// evidence kind, the path that held it, and when it stopped accepting (unix ms). Nothing
/// without a readable report.
fn report_rows(
    path: &Path,
    summary_at: u64,
    rows: &mut Vec<(u64, String, String, String)>,
) -> (Option<String>, Option<String>, Option<u64>) {
    let Some(v) = std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
    else {
        return (None, None, None);
    };
    let mut stopped = None;
    let ev = &v["propagation"]["evidence"];
    let evidence = ev["kind"].as_str().map(str::to_owned);
    let held_by = ev["held_by"].as_str().map(str::to_owned);
    for ev in v["timeline"].as_array().into_iter().flatten() {
        if let (Some(what), Some(at)) = (ev["event"].as_str(), ev["unix_ms"].as_u64()) {
            if what == "stopped_accepting" {
                stopped.get_or_insert(at);
            }
            let mut detail = String::new();
            if let Some(obj) = ev.as_object() {
                for (k, val) in obj {
                    if !matches!(k.as_str(), "event" | "at_ms" | "unix_ms") {
                        let _ = write!(detail, "{k}={val} ");
                    }
                }
            }
            rows.push((
                at,
                "report".into(),
                what.to_owned(),
                detail.trim().to_owned(),
            ));
        }
    }
    let kind = v["propagation"]["kind"].as_str().unwrap_or("?");
    rows.push((
        summary_at,
        "report".into(),
        "summary".into(),
        format!(
            "outcome={} propagation={kind} evidence={} held_by={}",
            v["outcome"],
            evidence.as_deref().unwrap_or("-"),
            held_by.as_deref().unwrap_or("-")
        ),
    ));
    (evidence, held_by, stopped)
}
