//! `lameduck-agent`: a node agent that tells a draining Pod whether this node's Service
//! datapath still sends it new connections.
//!
//! Only the component that routes knows when it stopped: on a node that is kube-proxy's
//! rules. The agent reads them (iptables mode, nftables mode; see [`rules`] for what it does not
//! read), parses them once per change, and answers one question over HTTP — `GET /v1/routes`:
//! *does this node still send new connections to me, and through which Services?* — where "me"
//! is the caller's own address, so it tells nobody anything about anybody else and needs no
//! token. A draining Pod asks every node's agent and commits once each has said it no longer
//! routes there (`lameduck::Propagation::node_agents`).
//!
//! It runs as a DaemonSet with the host's network namespace (the rules are the node's),
//! read-only, with `NET_ADMIN` only (reading the rules needs it) and nothing else; see
//! `examples/k8s/node-agent.yaml`.

#![forbid(unsafe_code)]

pub mod rules;
pub mod server;
pub mod source;
pub mod state;
