//! The cells: the whole matrix, and the subset CI runs.

use std::time::Duration;

use crate::cell::{CellConfig, Rollout, Server, Shape};
use crate::proxy::Backend;

/// Dense and sparse new-connection rates (per second).
pub const DENSE: f64 = 50.0;
/// Sparse: well under one per second.
pub const SPARSE: f64 = 0.5;

/// sync delay × new-connection rate × client shape × backend × server, then the single
/// replica eviction for every server (iptables, 1 s sync, pool, dense).
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
