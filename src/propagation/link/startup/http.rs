//! What `lameduck::serve`'s accept loop tells the startup measurement: each connection
//! accepted before the trigger.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::{Startup, WINDOW};
use crate::propagation::link::Link;

/// Peers remembered before the listing (to leave them out after it).
const BEFORE_LIMIT: usize = 64;
/// Peers measured at most.
const PEER_LIMIT: usize = 16;

impl Startup {
    /// A new connection was accepted before the trigger.
    #[inline]
    pub(crate) fn note(&self, peer: Option<SocketAddr>) {
        if !self.measuring.load(Ordering::Relaxed) {
            return;
        }
        self.note_slow(peer);
    }

    #[cold]
    fn note_slow(&self, peer: Option<SocketAddr>) {
        let Some(ip) = peer.map(|p| p.ip()) else {
            return;
        };
        let now = Instant::now();
        let mut st = self.lock();
        match st.listed_at {
            None => {
                if st.before.len() < BEFORE_LIMIT && !st.before.contains(&ip) {
                    st.before.push(ip);
                }
            }
            Some(at) => {
                let delay = now.saturating_duration_since(at);
                if delay > WINDOW {
                    self.measuring.store(false, Ordering::Relaxed);
                } else if st.before.contains(&ip) {
                    if !st.left_out.contains(&ip) {
                        st.left_out.push(ip);
                    }
                } else if !st.delays.iter().any(|(p, _)| *p == ip) {
                    st.delays.push((ip, delay));
                    if st.delays.len() == PEER_LIMIT {
                        self.measuring.store(false, Ordering::Relaxed);
                    }
                }
            }
        }
    }
}

impl Link {
    /// A new connection accepted before the trigger: a sample of the proxies' delay while
    /// the startup measurement runs, one relaxed load otherwise.
    #[inline]
    pub(crate) fn note_startup_connection(&self, peer: Option<SocketAddr>) {
        self.startup.note(peer);
    }
}
