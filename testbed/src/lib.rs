//! `lameduck-testbed`: the Kubernetes Pod termination path on the real kernel datapath.
//!
//! Network namespaces for a client, a node and every Pod (each replacement on a new IP); the
//! Service as kube-proxy writes it (iptables `statistic` ladder or nftables `numgen` map, DNAT,
//! applied atomically, a sync delay late); an EndpointSlice model with `ready` / `serving` /
//! `terminating` and the KEP-1669 fallback; kubelet's readiness probes, `preStop` hook, stop
//! signal and SIGKILL; rolling updates; retry-free clients from `lameduck-probe`. Conntrack
//! keeps established flows on their Pod, as on a real node. The example service runs as the
//! real server, in lameduck mode and as the baselines (`--naive`, `--fixed-sleep`).
//!
//! See the crate's README for what it models and what it does not, and `run.sh` for the one
//! command. Needs root, `ip`, `iptables-restore`, `nft` and `conntrack`.

#![forbid(unsafe_code)]

pub mod cell;
pub mod cluster;
pub mod k8s;
pub mod matrix;
pub mod net;
pub mod proxy;
pub mod real;

pub use cell::{run_cell, CellConfig, CellResult, Rollout, Server, Shape, Stack};
pub use proxy::Backend;
