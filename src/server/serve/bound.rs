//! The bound on open connections under [`serve`](super::serve): one semaphore permit per open
//! connection, held by its task; by default derived from the process's descriptor limit.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::MaxConnections;

/// The accept loop's connection bound.
pub(super) struct ConnectionBound {
    permits: Arc<Semaphore>,
    max: usize,
    /// At the bound since the last permit taken without waiting: warn once per episode.
    at_bound: bool,
}

impl ConnectionBound {
    /// The bound `max` asks for; `None` when there is none (the descriptor limit cannot be
    /// read, or is unlimited).
    pub(super) fn new(max: MaxConnections) -> Option<Self> {
        let max = match max {
            MaxConnections::Given(n) => n,
            MaxConnections::FromLimit => bound_for_limit(descriptor_limit()?),
        };
        Some(Self {
            permits: Arc::new(Semaphore::new(max)),
            max,
            at_bound: false,
        })
    }

    /// A permit for the next connection, waiting at the bound until a connection closes; `None`
    /// once `closes` resolves first.
    pub(super) async fn permit<F>(&mut self, closes: Pin<&mut F>) -> Option<OwnedSemaphorePermit>
    where
        F: Future<Output = ()>,
    {
        if let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() {
            self.at_bound = false;
            return Some(permit);
        }
        // Once per episode at the bound, not once per connection.
        if !self.at_bound {
            self.at_bound = true;
            tracing::warn!(
                max_connections = self.max,
                "lameduck: connection bound reached; not accepting until a connection closes"
            );
        }
        tokio::select! {
            biased;
            () = closes => None,
            permit = Arc::clone(&self.permits).acquire_owned() => {
                Some(permit.expect("the semaphore is never closed"))
            }
        }
    }
}

/// The process's soft limit on open file descriptors, when it can be read and is not unlimited.
fn descriptor_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    soft_nofile(&limits)
}

/// The soft value of the `Max open files` line of a `/proc/<pid>/limits` text.
fn soft_nofile(limits: &str) -> Option<usize> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The default connection bound for a descriptor limit: the limit less a reserve of a quarter
/// of it, at least 128, at most half of it.
fn bound_for_limit(limit: usize) -> usize {
    let reserve = (limit / 4).max(128).min(limit / 2);
    (limit - reserve).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_descriptor_limit_is_read() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max processes             63448                63448                processes \n\
                      Max open files            1024                 1048576              files     \n";
        assert_eq!(soft_nofile(limits), Some(1024));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(soft_nofile(unlimited), None);
        assert_eq!(soft_nofile(""), None);
    }

    #[test]
    fn the_default_bound_keeps_a_reserve() {
        assert_eq!(bound_for_limit(1024), 768);
        assert_eq!(bound_for_limit(1 << 20), 786_432);
        assert_eq!(bound_for_limit(256), 128);
        assert_eq!(bound_for_limit(100), 50);
        assert_eq!(bound_for_limit(1), 1);
    }
}
