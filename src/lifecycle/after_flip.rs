//! What arrived after the drain started, as the report shows it: the hot path's plain counts
//! (`Observed`), turned into report types here, above it.

use tokio::time::Instant;

use crate::hot::observed::Observed;
use crate::report::{AfterFlipReport, PathCount, PeerCount};

/// What `observed` counted after the drain started at `origin`, as the report shows it: the
/// ten peers with the most new connections, and the traffic-path labels.
pub(super) fn after_flip_report(observed: &Observed, origin: Instant) -> AfterFlipReport {
    let mut peers: Vec<PeerCount> = observed
        .peers()
        .into_iter()
        .map(|(ip, n)| PeerCount {
            peer: ip.to_string(),
            new_connections: n,
        })
        .collect();
    peers.sort_by(|a, b| {
        b.new_connections
            .cmp(&a.new_connections)
            .then(a.peer.cmp(&b.peer))
    });
    peers.truncate(10);
    let counts = observed.after_flip();
    AfterFlipReport {
        new_connections: counts.new_connections,
        requests_on_new_connections: counts.requests_on_new,
        requests_on_reused_connections: counts.requests_on_reused,
        last_new_connection_ms: counts
            .last_new_connection
            .map(|t| t.saturating_duration_since(origin).as_millis() as u64),
        peers,
        paths: observed
            .paths()
            .into_iter()
            .map(|(path, on_new, on_reused)| PathCount {
                path,
                requests_on_new_connections: on_new,
                requests_on_reused_connections: on_reused,
            })
            .collect(),
    }
}
