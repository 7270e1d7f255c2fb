//! The Deployment controller's rolling update, written once for the model
//! ([`Cluster::rollout`](crate::cluster::Cluster::rollout)) and the real stack
//! ([`Real::rollout`](crate::real::Real::rollout)): each says how it creates, deletes and
//! watches Pods.

use std::time::Duration;

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
