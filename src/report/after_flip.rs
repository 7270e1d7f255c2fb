//! What arrived after the drain started: the observed propagation, as counted by the core.

use serde::{Deserialize, Serialize};

/// New connections from one peer address after the drain started.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerCount {
    /// The peer's IP address.
    pub peer: String,
    /// How many new connections it opened after the drain started.
    pub new_connections: u64,
}

/// What arrived after the drain started (the readiness flip, under the default policy). This is
/// the observed propagation: it says what reached *this* process, through whatever paths
/// reached it, and nothing about other proxies.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AfterFlipReport {
    /// Connections accepted after the drain started.
    pub new_connections: u64,
    /// Requests that arrived on those new connections.
    pub requests_on_new_connections: u64,
    /// Requests that arrived on connections opened before the drain (pooled keep-alive).
    pub requests_on_reused_connections: u64,
    /// When the last new connection arrived, in milliseconds after the drain started; `None` if
    /// none arrived.
    pub last_new_connection_ms: Option<u64>,
    /// Peers by number of new connections, most first (at most 10).
    pub peers: Vec<PeerCount>,
    /// The same requests by the route they took, from the `x-traffic-path` request header
    /// (the rollout probe sets it; a proxy can too): which path still sent work after the
    /// drain started. The 16 most frequent labels over the drain, most requests first, then
    /// `other` (a client sending many labels cannot push the busy ones out: a label with more
    /// than 1/16 of the labelled requests is always kept, counted exactly from when it was
    /// kept); empty when no request carried the header.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<PathCount>,
}

/// Requests after the drain started that came by one route (`x-traffic-path`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathCount {
    /// The label, or `other` for the labels not kept (and what they had before they were
    /// dropped).
    pub path: String,
    /// Requests on connections opened after the drain started: this route still routed here.
    pub requests_on_new_connections: u64,
    /// Requests on connections opened before it.
    pub requests_on_reused_connections: u64,
}
