//! The cells: the whole matrix, and the subset CI runs.

use std::time::Duration;

use crate::cell::{CellConfig, ClientSpec, NodeSpec, Rollout, Server, Shape};
use crate::proxy::Backend;

/// Dense and sparse new-connection rates (per second).
pub const DENSE: f64 = 50.0;
/// Sparse: well under one per second.
pub const SPARSE: f64 = 0.5;

/// sync delay × new-connection rate × client shape × backend × server, then the single
/// replica eviction for every server (iptables, 1 s sync, pool, dense), then the
/// [`bursty`] cells on both backends.
pub fn full() -> Vec<CellConfig> {
    let mut cells = Vec::new();
    // 1 s first, then the slow proxy, then the fast one: a cut-short run keeps the most telling.
    for sync in [1000u64, 4000, 300] {
        for rate in [DENSE, SPARSE] {
            for shape in [Shape::Pool, Shape::Fresh] {
                for backend in [Backend::Iptables, Backend::Nftables] {
                    for server in [Server::Lameduck, Server::Naive, Server::Sleep5] {
                        let mut c = CellConfig::new(server);
                        c.sync_delay = Duration::from_millis(sync);
                        c.new_conn_rate = rate;
                        c.shape = shape;
                        c.backend = backend;
                        cells.push(c);
                    }
                }
            }
        }
    }
    cells.extend(eviction());
    for backend in [Backend::Iptables, Backend::Nftables] {
        cells.extend(bursty_on(backend));
    }
    cells
}

/// A kube-proxy slower than the estimator's typical silence: 6 s behind the slice change.
pub const SLOW_SYNC_MS: u64 = 6000;

/// Clients whose silences come while routing is unchanged — on/off (5 s on, 5 s off) and
/// periodic bursts (20 connections in 200 ms every 3 s), fresh connections only — behind
/// kube-proxy 6 s and 1 s behind the slice change, rolling update and single-replica
/// eviction, every server but `graceful`, iptables.
///
/// The warm-up ends where a pause begins, so the eviction's deletion comes at the worst
/// phase: the silence that follows is the client's own, and the next send phase starts while
/// kube-proxy still routes to the old Pod. (In a rolling update the old Pod is deleted once
/// its replacement is ready, so the phase is wherever that lands, and its removal may ride
/// along a sync already pending for the replacement.)
pub fn bursty() -> Vec<CellConfig> {
    bursty_on(Backend::Iptables)
}

fn bursty_on(backend: Backend) -> Vec<CellConfig> {
    let mut cells = Vec::new();
    for sync in [SLOW_SYNC_MS, 1000] {
        for shape in [Shape::OnOff, Shape::Bursts] {
            for rollout in [Rollout::Evict, Rollout::Rolling] {
                for server in [Server::Lameduck, Server::Naive, Server::Sleep5] {
                    let mut c = CellConfig::new(server);
                    c.backend = backend;
                    c.sync_delay = Duration::from_millis(sync);
                    c.shape = shape;
                    c.new_conn_rate = shape.default_rate();
                    c.rollout = rollout;
                    cells.push(c);
                }
            }
        }
    }
    cells
}

/// The single-replica eviction for every server.
pub fn eviction() -> Vec<CellConfig> {
    Server::ALL
        .into_iter()
        .map(|server| {
            let mut c = CellConfig::new(server);
            c.rollout = Rollout::Evict;
            c
        })
        .collect()
}

/// What the table shows: every server, iptables, 1 s sync, pool, dense.
pub fn baseline_table() -> Vec<CellConfig> {
    Server::ALL.into_iter().map(CellConfig::new).collect()
}

/// A node's spec: its kube-proxy `sync_ms` behind (a slow node, whose syncs take that long,
/// from 2 s on), its clients.
fn node(sync_ms: u64, shape: Shape, rate: f64) -> NodeSpec {
    NodeSpec {
        sync_delay: Duration::from_millis(sync_ms),
        slow: sync_ms >= 2000,
        clients: Some(ClientSpec::new(shape, rate)),
    }
}

/// The layouts of [`nodes`]: two nodes, dense fresh connections through the fast one (1 s)
/// and a trickle (0.7/s) through the slow one (6 s); the same with a kept-alive pool (and its
/// trickle of fresh connections) behind the slow one; three nodes, two fast (1 s, 1.5 s) with
/// dense traffic and one straggler (8 s) with a trickle.
pub fn node_layouts() -> Vec<Vec<NodeSpec>> {
    vec![
        vec![
            node(1000, Shape::Fresh, DENSE),
            node(SLOW_SYNC_MS, Shape::Fresh, 0.7),
        ],
        vec![
            node(1000, Shape::Fresh, DENSE),
            node(SLOW_SYNC_MS, Shape::Pool, 0.7),
        ],
        vec![
            node(1000, Shape::Fresh, 30.0),
            node(1500, Shape::Fresh, 30.0),
            node(8000, Shape::Fresh, 1.0),
        ],
    ]
}

/// Several nodes whose kube-proxies converge at different times ([`node_layouts`]), every
/// server, and lameduck once more with the `kube` feature watching the real EndpointSlices
/// (a real-stack cell only: [`CellConfig::runs_on_its_stack`]); iptables, rolling update,
/// grace 30 s (the straggler is 8 s behind), Pods warm past the whole evidence window
/// ([`crate::cell::WARM`]).
pub fn nodes() -> Vec<CellConfig> {
    let mut cells = Vec::new();
    for layout in node_layouts() {
        let servers = Server::ALL.into_iter().map(|s| (s, false));
        for (server, kube) in servers.chain([(Server::Lameduck, true)]) {
            let mut c = CellConfig::new(server);
            c.nodes = layout.clone();
            c.grace = Duration::from_secs(30);
            c.kube = kube;
            cells.push(c);
        }
    }
    cells
}
