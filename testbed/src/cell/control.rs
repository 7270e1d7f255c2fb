//! The control side of a cell: the rollout on the model stack, on the real stack, and through
//! the real Deployment controller.

use super::*;
use crate::rollout::{rolling_update, Pods, Stack};

/// What the control side tells the clients: `go` when the first Pods are created (none ready
/// yet), `count` (unix ms) once every node routes them, `stop` at the end (also when the
/// control side fails: dropping it stops the clients).
pub(super) struct Signals {
    pub go: tokio::sync::watch::Sender<bool>,
    pub count: tokio::sync::watch::Sender<Option<f64>>,
    pub stop: tokio::sync::watch::Sender<bool>,
}

impl Signals {
    /// The clients start: `started` is when, to align the rollout with an on/off client's
    /// phases.
    fn go(&self) -> std::time::Instant {
        let started = std::time::Instant::now();
        self.go.send_replace(true);
        started
    }

    /// From now on the clients' requests count.
    fn count(&self) {
        self.count.send_replace(Some(unix_ms() as f64));
    }
}

impl Drop for Signals {
    /// Whatever happens, the clients stop.
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

/// The warm-up after every node routes the first Pods, then, for an on/off client, on to the
/// start of its next pause (its phases run from `started`), so the rollout begins where the
/// traffic pauses.
async fn warm_up(config: &CellConfig, started: std::time::Instant) {
    tokio::time::sleep(config.warmup).await;
    let Some(o) = config
        .node_specs()
        .iter()
        .find_map(|n| n.clients.and_then(|c| c.shape.on_off()))
    else {
        return;
    };
    let period = (o.on + o.off).as_nanos();
    if period == 0 {
        return;
    }
    let into = started.elapsed().as_nanos() % period;
    let on = o.on.as_nanos();
    let wait = if into <= on {
        on - into
    } else {
        period - into + on
    };
    tokio::time::sleep(Duration::from_nanos(u64::try_from(wait).unwrap_or(0))).await;
}

/// The steps of a cell around the rolling update, on either stack: the first Pods, Ready and
/// routed on every node (the clients start before, so the proxies' startup is measured on
/// traffic), the count from then on, the warm-up, the rolling update (or the eviction) and the
/// wait until the old Pods are gone and the rules route to the new ones. Returns the old Pods.
async fn rollout_steps<S: Stack>(
    stack: &S,
    config: &CellConfig,
    signals: &Signals,
) -> Result<Vec<String>, NetError> {
    let replicas = match config.rollout {
        Rollout::Rolling | Rollout::Kubelet(_) => config.replicas.max(1),
        Rollout::Evict => 1,
    };
    let creator = stack.pods(1);
    let mut first = Vec::new();
    for i in 0..replicas {
        first.push(creator.create(i).await?);
    }
    let started = signals.go();
    stack.record("client_started", None, "before the first Pods are ready");
    let settle = S::SETTLE;
    tokio::time::timeout(settle, async {
        while !first.iter().all(|p| creator.available(p)) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stack.wait_applied(&first).await;
    })
    .await
    .map_err(|_| {
        NetError(format!(
            "the first Pods did not become ready and routed in {settle:?}: {}",
            stack.logs_hint()
        ))
    })?;
    stack.forget_unrouted()?;
    signals.count();
    stack.record("client_counted", None, "every node routes the first Pods");
    warm_up(config, started).await;
    let (surge, unavailable) = match config.rollout {
        Rollout::Rolling => (1, 0),
        Rollout::Evict => (1, 1),
        Rollout::Kubelet(stop) => {
            // The kubelet stops the first Pod on its own; the others go on serving.
            let victim = first[0].clone();
            stack.kubelet_terminate(&victim, stop).await?;
            let rest: Vec<String> = first[1..].to_vec();
            tokio::time::timeout(stop.budget() + S::TAIL, async {
                while !stack.gone(&victim) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                stack.wait_applied(&rest).await;
            })
            .await
            .map_err(|_| {
                NetError("the terminated Pod was not gone, or the rules did not settle".into())
            })?;
            tokio::time::sleep(Duration::from_secs(1)).await;
            stack.record("client_stopped", None, "");
            return Ok(vec![victim]);
        }
    };
    let deadline = config.grace * 4 + settle;
    let new = rolling_update(
        &stack.pods(replicas + 1),
        &first,
        surge,
        unavailable,
        deadline,
    )
    .await?;
    // Every old Pod gone, the rules on the new ones, then a tail of traffic.
    tokio::time::timeout(config.grace + S::TAIL, async {
        while !first.iter().all(|p| stack.gone(p)) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stack.wait_applied(&new).await;
    })
    .await
    .map_err(|_| NetError("old Pods were not gone, or the rules did not settle".into()))?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stack.record("client_stopped", None, "");
    Ok(first)
}

/// The node side: pods, control plane, rollout. Returns the deleted Pods.
pub(super) async fn control(
    cluster: Arc<Cluster>,
    config: CellConfig,
    proxies: Vec<Proxy>,
    signals: Signals,
) -> Result<Vec<String>, NetError> {
    let slices = tokio::spawn(cluster.clone().slice_controller());
    let syncs: Vec<_> = proxies
        .into_iter()
        .enumerate()
        .map(|(i, p)| tokio::spawn(cluster.clone().proxy_loop(i + 1, p)))
        .collect();
    let result = rollout_steps(&cluster, &config, &signals).await;
    slices.abort();
    for s in syncs {
        s.abort();
    }
    result
}

/// The node side on the real stack: control plane, kubelet, the Pods and the rollout through
/// the API. Returns the deleted Pods and every recorded step.
pub(super) async fn control_real(
    netns: Netns,
    config: CellConfig,
    service_bin: PathBuf,
    dir: PathBuf,
    signals: Signals,
) -> (Result<Vec<String>, NetError>, Vec<Event>) {
    let bins = match crate::k8s::Binaries::find(&crate::k8s::default_bin_dir()) {
        Ok(b) => b,
        Err(e) => return (Err(e), Vec::new()),
    };
    let proxies: Vec<crate::k8s::ProxySettings> = config
        .node_specs()
        .iter()
        .map(|n| crate::k8s::ProxySettings {
            backend: config.backend,
            min_sync_period: n.sync_delay,
            sync_period: Duration::from_secs(30),
            cpu_share: n.slow.then_some(SLOW_NODE_CPU),
        })
        .collect();
    let load = if proxies.iter().any(|p| p.cpu_share.is_some()) {
        SLOW_NODE_SERVICES
    } else {
        0
    };
    let options = real::StartOptions {
        proxies: &proxies,
        load_services: load,
        service_bin: &service_bin,
        start_delay: config.start_delay,
        kube: config.kube,
        publish_not_ready: config.publish_not_ready,
        dir: &dir,
    };
    let run = match real::start(netns, &bins, &options).await {
        Ok(r) => r,
        Err(e) => return (Err(e), Vec::new()),
    };
    let r = run.real.clone();
    let template = config.pod_template();
    if config.deployment {
        let result = deployment_rollout(&r, &config, &template, &dir, &signals).await;
        let events = r.events();
        drop(run);
        return (result, events);
    }
    let stack = real::RealStack::new(&r, &template, &dir);
    let result = rollout_steps(&stack, &config, &signals).await;
    let events = r.events();
    drop(run);
    (result, events)
}

/// The rollout by the real Deployment controller: the Deployment, its Pods Ready and routed,
/// the clients, then a new template revision (or the eviction of the one Pod) and the wait
/// until the old Pods are gone and the rules route to the new ones. Returns the old Pods.
pub(super) async fn deployment_rollout(
    r: &Arc<real::Real>,
    config: &CellConfig,
    template: &real::PodTemplate,
    dir: &Path,
    signals: &Signals,
) -> Result<Vec<String>, NetError> {
    let replicas = match config.rollout {
        Rollout::Rolling => config.replicas.max(1),
        Rollout::Evict => 1,
        Rollout::Kubelet(stop) => {
            return Err(NetError(format!(
                "a termination by the kubelet ({}) is a cell of bare Pods: drop --deployment",
                stop.name()
            )))
        }
    };
    r.create_deployment(replicas, template).await?;
    let started = signals.go();
    r.record("client_started", None, "before the first Pods are ready");
    let settle = Duration::from_secs(60);
    let first = tokio::time::timeout(settle, async {
        loop {
            let live = r.live_pods();
            if live.len() == replicas && live.iter().all(|p| r.available(p)) {
                r.wait_applied(&live).await;
                return live;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .map_err(|_| {
        NetError(format!(
            "the Deployment's Pods did not become ready and routed in {settle:?}: see the logs in {}",
            dir.display()
        ))
    })?;
    r.forget_unrouted()?;
    signals.count();
    r.record("client_counted", None, "every node routes the first Pods");
    warm_up(config, started).await;
    match config.rollout {
        Rollout::Rolling => r.roll_deployment(2).await?,
        Rollout::Evict | Rollout::Kubelet(_) => r.evict(&first[0]).await?,
    }
    tokio::time::timeout(config.grace * 4 + settle, async {
        loop {
            let live: Vec<String> = r
                .live_pods()
                .into_iter()
                .filter(|p| !first.contains(p))
                .collect();
            if first.iter().all(|p| r.removed(p))
                && live.len() == replicas
                && live.iter().all(|p| r.available(p))
            {
                r.wait_applied(&live).await;
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .map_err(|_| {
        NetError("the rollout did not finish: old Pods left or new ones not ready".into())
    })?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    r.record("client_stopped", None, "");
    Ok(first)
}
