//! The Deployment controller's rolling update and the steps of a cell around it, written once
//! for the model ([`Cluster`](crate::cluster::Cluster)) and the real stack (`RealStack`, the
//! testbed's own controller through the API): each stack says how it creates, deletes and
//! watches Pods ([`Pods`]) and what the steps need of it ([`Stack`]). The real Deployment
//! controller's rollout (`cell::control::deployment_rollout`) has steps of its own.

use std::time::Duration;

use serde::Serialize;

use crate::net::NetError;

/// What a rolling update does to Pods.
pub(crate) trait Pods {
    /// Whether the Pod is Ready (available).
    fn available(&self, name: &str) -> bool;
    /// Creates the `index`-th new Pod (from 0); its name.
    async fn create(&self, index: usize) -> Result<String, NetError>;
    /// Deletes an old Pod.
    async fn delete(&self, name: &str) -> Result<(), NetError>;
    /// Waits until something may have changed (a poll interval, or a change seen).
    async fn changed(&self);
}

/// Replaces `old` with as many new Pods: creates replacements while at most `max_surge` above
/// `old.len()`, deletes old Pods (oldest first) while at least `old.len() - max_unavailable`
/// stay available, until every old Pod is deleted and the new ones are Ready. Returns the new
/// Pods' names; an error when `deadline` passes first.
pub(crate) async fn rolling_update(
    pods: &impl Pods,
    old: &[String],
    max_surge: usize,
    max_unavailable: usize,
    deadline: Duration,
) -> Result<Vec<String>, NetError> {
    let replicas = old.len();
    let mut remaining: Vec<String> = old.to_vec();
    let mut new: Vec<String> = Vec::new();
    let give_up = tokio::time::Instant::now() + deadline;
    loop {
        let new_ready = new.iter().filter(|n| pods.available(n)).count();
        if remaining.is_empty() && new_ready == replicas {
            return Ok(new);
        }
        if tokio::time::Instant::now() > give_up {
            return Err(NetError(format!(
                "rollout did not finish in {deadline:?}: {new_ready} of {replicas} new Pods ready"
            )));
        }
        while new.len() < replicas && new.len() + remaining.len() < replicas + max_surge {
            new.push(pods.create(new.len()).await?);
        }
        let mut available = new_ready + remaining.iter().filter(|n| pods.available(n)).count();
        while !remaining.is_empty() && available + max_unavailable > replicas {
            let victim = remaining.remove(0);
            if pods.available(&victim) {
                available -= 1;
            }
            pods.delete(&victim).await?;
        }
        pods.changed().await;
    }
}

/// A stack a cell's rollout runs on (the model's [`Cluster`](crate::cluster::Cluster), the
/// real stack through the API): what the cell's steps around the rolling update need of it.
pub(crate) trait Stack {
    /// How long the first Pods may take to be Ready and routed on every node.
    const SETTLE: Duration;
    /// How long after the grace period the old Pods may take to be gone.
    const TAIL: Duration;
    /// The Pods a rolling update creates, named from the `first_new`-th Pod on (from 1).
    fn pods(&self, first_new: usize) -> impl Pods + '_;
    /// Whether an old Pod is gone: the model's process exited, the real stack's object removed.
    fn gone(&self, name: &str) -> bool;
    /// Waits until every node's proxy routes to exactly `pods`.
    async fn wait_applied(&self, pods: &[String]);
    /// Forgets the conntrack entries that were never DNATed (the clients count from here).
    fn forget_unrouted(&self) -> Result<(), NetError>;
    /// Records a step in the cell's timeline.
    fn record(&self, what: &str, pod: Option<&str>, detail: &str);
    /// Where to look when the first Pods do not come up.
    fn logs_hint(&self) -> String;
    /// Terminates Pod `name` the way the kubelet does on its own (node shutdown, node-pressure
    /// eviction): only the real stack, whose kubelet this testbed plays, can.
    async fn kubelet_terminate(&self, name: &str, stop: KubeletStop) -> Result<(), NetError> {
        let _ = name;
        Err(NetError(format!(
            "a termination by the kubelet ({}) needs --stack real",
            stop.name()
        )))
    }
}

/// A termination by the kubelet itself, and the budget it gives the Pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KubeletStop {
    /// Graceful node shutdown, with the node's budget for the Pod.
    NodeShutdown(Duration),
    /// Node-pressure eviction at a soft threshold (`evictionMaxPodGracePeriod`).
    SoftEviction(Duration),
    /// Node-pressure eviction at a hard threshold: the kubelet's minimum, 2 s.
    HardEviction,
}

impl KubeletStop {
    /// The budget the Pod gets.
    pub fn budget(self) -> Duration {
        match self {
            Self::NodeShutdown(d) | Self::SoftEviction(d) => d,
            Self::HardEviction => Duration::from_secs(2),
        }
    }

    /// The condition's message and the status `reason` the kubelet writes.
    pub fn status(self) -> (&'static str, &'static str) {
        match self {
            Self::NodeShutdown(_) => (
                "Pod was terminated in response to imminent node shutdown.",
                "Terminated",
            ),
            Self::SoftEviction(_) | Self::HardEviction => (
                "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi.",
                "Evicted",
            ),
        }
    }

    /// `node-shutdown:15s`, `soft-eviction:10s`, `hard-eviction`.
    pub fn name(self) -> String {
        match self {
            Self::NodeShutdown(d) => format!("node-shutdown:{}s", d.as_secs()),
            Self::SoftEviction(d) => format!("soft-eviction:{}s", d.as_secs()),
            Self::HardEviction => "hard-eviction".to_owned(),
        }
    }
}

impl std::str::FromStr for KubeletStop {
    type Err = String;

    /// `node-shutdown:15s`, `soft-eviction:10s`, `hard-eviction`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (kind, raw) = s.split_once(':').unwrap_or((s, ""));
        let budget = || {
            lameduck_probe::flags::parse_duration(raw)
                .map_err(|e| format!("--kubelet-stop {s:?}: the budget: {e}"))
        };
        match kind {
            "node-shutdown" => Ok(Self::NodeShutdown(budget()?)),
            "soft-eviction" => Ok(Self::SoftEviction(budget()?)),
            "hard-eviction" if raw.is_empty() => Ok(Self::HardEviction),
            _ => Err(format!(
                "--kubelet-stop: expected node-shutdown:DUR, soft-eviction:DUR or hard-eviction, got {s:?}"
            )),
        }
    }
}
