//! The accept loop's seam (feature `http`): the part of the coordinator `serve` is handed
//! when it starts — where each connection and the loop's own timeouts are recorded.

use std::sync::Arc;

use super::Drain;
use crate::hot::guard::Core;
use crate::lifecycle::Driver;

/// What `lameduck::serve`'s accept loop writes to beyond the hot block: the report's server
/// settings and the startup measurement of the proxies' delay. Built from the handle when
/// the loop starts, owned by it.
#[derive(Clone)]
pub(crate) struct ServeSeam {
    core: &'static Core,
    driver: Arc<Driver>,
}

impl ServeSeam {
    /// The parts of `drain` the accept loop writes to.
    pub(crate) fn new(drain: &Drain) -> Self {
        Self {
            core: drain.core(),
            driver: Arc::clone(&drain.inner.driver),
        }
    }

    /// Records the accept loop's timeouts for the report (`server`).
    pub(crate) fn note_server(&self, server: crate::report::ServerReport) {
        self.driver.record().note_server(server);
    }

    /// A new connection was accepted: counts it in its path's arrival rate, and as activity
    /// while draining. Returns `true` when it came after the drain started, and the path its
    /// requests are counted on.
    pub(crate) fn note_connection(
        &self,
        peer: Option<std::net::SocketAddr>,
    ) -> (bool, crate::hot::observed::PathId) {
        let core = self.core;
        let path = core.observed().note_arrival(peer.map(|p| p.ip()));
        let draining = core.counter.is_draining();
        if draining {
            core.observed().note_connection(peer, path);
        } else {
            // The startup measurement of the proxies' delay (feature `kube`); one relaxed
            // load once it is over.
            self.driver.deadlines().link().note_startup_connection(peer);
        }
        (draining, path)
    }
}
