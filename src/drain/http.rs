//! What the accept loop and the layers (feature `http`) tell the handle: each connection,
//! and the accept loop's own timeouts.

use super::Drain;

impl Drain {
    /// Records the accept loop's timeouts for the report (`server`).
    pub(crate) fn note_server(&self, server: crate::report::ServerReport) {
        self.inner.driver.record().note_server(server);
    }

    /// A new connection was accepted: counts it in its path's arrival rate, and as activity
    /// while draining. Returns `true` when it came after the drain started, and the path its
    /// requests are counted on.
    pub(crate) fn note_connection(
        &self,
        peer: Option<std::net::SocketAddr>,
    ) -> (bool, crate::hot::observed::PathId) {
        let core = self.core();
        let path = core.observed().note_arrival(peer.map(|p| p.ip()));
        let draining = core.counter.is_draining();
        if draining {
            core.observed().note_connection(peer, path);
        } else {
            // The startup measurement of the proxies' delay (feature `kube`); one relaxed
            // load once it is over.
            self.inner
                .driver
                .deadlines()
                .link()
                .note_startup_connection(peer);
        }
        (draining, path)
    }
}
