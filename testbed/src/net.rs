//! Network namespaces, veth pairs and addresses, and the guard that removes them.
//!
//! Layout (all in 198.18.0.0/15, the range set aside for network test hosts):
//!
//! ```text
//!  client ns                node ns (ip_forward=1, kube-proxy rules)          pod ns (one per Pod)
//!  eth0 198.18.0.2/24 ───── cli 198.18.0.1/24
//!                           pod<N> 198.18.1.254/32, route 198.18.1.N ──────── eth0 198.18.1.N/32
//!  default via 198.18.0.1   198.18.96.0/20 (Service VIPs) dev cli              default via 198.18.1.254
//! ```
//!
//! The Service VIP has no interface: it exists only as kube-proxy's DNAT rules in the node
//! namespace; when no rule matches, the node forwards it towards the client side where the
//! reject rule (no endpoints) sits on the path. Nothing is routed out of these namespaces.

use std::fs::File;
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

mod host;

pub use host::*;

/// The node's address on the client link, the client's default gateway.
pub const NODE_CLIENT_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// The client's address.
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
/// The node's address on every Pod link, each Pod's default gateway.
pub const NODE_POD_GW: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 254);
/// The Service VIP.
pub const SERVICE_VIP: Ipv4Addr = Ipv4Addr::new(198, 18, 100, 10);
/// The Service port (on the VIP).
pub const SERVICE_PORT: u16 = 80;
/// The Pod's service port (`--listen`).
pub const POD_PORT: u16 = 8080;
/// The Pod's admin port (`--admin`: probes, `/drain`).
pub const ADMIN_PORT: u16 = 9901;

/// The node agents' port, on each node (cells that ask the proxies).
pub const AGENT_PORT: u16 = 9902;

/// Where a Pod reaches the agent of node `k` (1-based) of a cell with `nodes` nodes: its own
/// node's Pod gateway with one node, the node's fabric address with several.
pub fn agent_addr(k: usize, nodes: usize) -> std::net::SocketAddr {
    let ip = if nodes <= 1 {
        NODE_POD_GW
    } else {
        Netns::fabric_ip(k)
    };
    (ip, AGENT_PORT).into()
}

/// Every namespace name starts with this, then the creating process id.
pub const PREFIX: &str = "ldtb";

/// An error from a command or a system call, with what to change.
#[derive(Debug)]
pub struct NetError(pub String);

impl std::fmt::Display for NetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NetError {}

/// One cell's namespaces: per node a node and a client namespace, the fabric that joins the
/// nodes (with two or more), and the Pods. Dropping it removes them all (also when unwinding
/// from a panic); [`remove_all_live`] does the same from a signal handler.
///
/// With more than one node (`Netns::create_nodes`):
///
/// ```text
///  client<k> ns                node<k> ns                     fabric ns
///  eth0 198.18.1x.2/24 ──────  cli 198.18.1x.1/24
///                              fab 198.18.9.k/24 ──────────── br0 (a bridge, every node's fab)
///                              pod<N> …  (the Pods hosted here, as above)
///                              198.18.1.N/32 via 198.18.9.j   (Pod N hosted on node j)
///                              client j's /24 via 198.18.9.j
/// ```
///
/// Node 1 keeps the single-node names and addresses (`-node`, `-client`, 198.18.0.0/24); node
/// `k` ≥ 2 is `-node<k>` / `-client<k>` on 198.18.(9+k).0/24. A client's connection to the VIP
/// is DNATed by its own node's rules and routed across the fabric to the Pod's node; the answer
/// comes back the same way, so conntrack on the client's node undoes the DNAT.
#[derive(Debug)]
pub struct Netns {
    /// `ldtb<pid>-<set>`: the prefix of every name here.
    pub base: String,
    owned: Vec<String>,
    nodes: usize,
    /// Per Pod number: its node (1-based), for routes added later.
    pods: Vec<(u8, usize)>,
}

/// The fabric subnet's prefix: node `k` is 198.18.9.`k`.
const FABRIC: [u8; 3] = [198, 18, 9];

/// Node `k`'s (1-based) client link: the node's and the client's address.
pub fn client_link(k: usize) -> (Ipv4Addr, Ipv4Addr) {
    if k <= 1 {
        (NODE_CLIENT_IP, CLIENT_IP)
    } else {
        let third = 9 + k as u8;
        (
            Ipv4Addr::new(198, 18, third, 1),
            Ipv4Addr::new(198, 18, third, 2),
        )
    }
}

/// Node `k`'s (1-based) client Pod `i` (0-based): the client address, then the next ones.
pub fn client_pod_ip(k: usize, i: u32) -> Ipv4Addr {
    let (_, first) = client_link(k);
    Ipv4Addr::from(u32::from(first) + i)
}

/// The most nodes a cell can have.
pub const MAX_NODES: usize = 8;

impl Netns {
    /// Creates the client and node namespaces of one node, their link, forwarding and routes.
    pub fn create() -> Result<Netns, NetError> {
        Netns::create_nodes(1)
    }

    /// Creates `nodes` nodes (1 to [`MAX_NODES`]), each with its client namespace, joined by a
    /// bridge in a fabric namespace when there are two or more.
    pub fn create_nodes(nodes: usize) -> Result<Netns, NetError> {
        if !(1..=MAX_NODES).contains(&nodes) {
            return Err(NetError(format!("nodes: {nodes} out of 1..={MAX_NODES}")));
        }
        let set = NEXT_SET.fetch_add(1, Ordering::Relaxed);
        let mut n = Netns {
            base: format!("{PREFIX}{}-{set}", std::process::id()),
            owned: Vec::new(),
            nodes,
            pods: Vec::new(),
        };
        let ip = |args: &[&str]| run("ip", args).map(drop);
        let fabric = n.fabric();
        if nodes > 1 {
            n.add(&fabric)?;
            ip(&["-n", &fabric, "link", "add", "br0", "type", "bridge"])?;
            ip(&["-n", &fabric, "link", "set", "br0", "up"])?;
        }
        for k in 1..=nodes {
            n.add_node(k)?;
        }
        // Every node reaches every other node's clients across the fabric.
        for k in 1..=nodes {
            for j in (1..=nodes).filter(|j| *j != k) {
                let (_, client_ip) = client_link(j);
                let o = client_ip.octets();
                ip(&[
                    "-n",
                    &n.node_of(k),
                    "route",
                    "add",
                    &format!("{}.{}.{}.0/24", o[0], o[1], o[2]),
                    "via",
                    &Netns::fabric_ip(j).to_string(),
                ])?;
            }
        }
        Ok(n)
    }

    /// Node `k`'s (1-based) namespaces: its client namespace and the link to it, forwarding,
    /// routes, and its port on the fabric's bridge when there are several nodes.
    fn add_node(&mut self, k: usize) -> Result<(), NetError> {
        let ip = |args: &[&str]| run("ip", args).map(drop);
        let fabric = self.fabric();
        let client = self.client_of(k);
        let node = self.node_of(k);
        self.add(&client)?;
        self.add(&node)?;
        let (node_ip, client_ip) = client_link(k);
        let subnet = |a: Ipv4Addr| format!("{a}/24");
        ip(&[
            "-n", &node, "link", "add", "cli", "type", "veth", "peer", "name", "eth0", "netns",
            &client,
        ])?;
        ip(&["-n", &node, "addr", "add", &subnet(node_ip), "dev", "cli"])?;
        ip(&["-n", &node, "link", "set", "cli", "up"])?;
        ip(&[
            "-n",
            &client,
            "addr",
            "add",
            &subnet(client_ip),
            "dev",
            "eth0",
        ])?;
        ip(&["-n", &client, "link", "set", "eth0", "up"])?;
        ip(&[
            "-n",
            &client,
            "route",
            "add",
            "default",
            "via",
            &node_ip.to_string(),
        ])?;
        // Unmatched VIP traffic goes towards the client link, through FORWARD, where the
        // no-endpoints reject sits, as on a node whose default route leads off the node.
        ip(&["-n", &node, "route", "add", "198.18.96.0/20", "dev", "cli"])?;
        run_in(&node, &["sysctl", "-qw", "net.ipv4.ip_forward=1"], None)?;
        if self.nodes > 1 {
            let port = format!("n{k}");
            ip(&[
                "-n", &node, "link", "add", "fab", "type", "veth", "peer", "name", &port, "netns",
                &fabric,
            ])?;
            ip(&["-n", &fabric, "link", "set", &port, "master", "br0"])?;
            ip(&["-n", &fabric, "link", "set", &port, "up"])?;
            let fab = Netns::fabric_ip(k);
            ip(&[
                "-n",
                &node,
                "addr",
                "add",
                &format!("{fab}/24"),
                "dev",
                "fab",
            ])?;
            ip(&["-n", &node, "link", "set", "fab", "up"])?;
        }
        Ok(())
    }

    /// Gives node `k`'s (1-based) client namespace `pods` addresses in all (its client
    /// address and the next `pods − 1`): one per client Pod, see [`client_pod_ip`].
    pub fn add_client_pods(&self, k: usize, pods: u32) -> Result<(), NetError> {
        let client = self.client_of(k);
        for i in 1..pods {
            let addr = client_pod_ip(k, i);
            run(
                "ip",
                &[
                    "-n",
                    &client,
                    "addr",
                    "add",
                    &format!("{addr}/24"),
                    "dev",
                    "eth0",
                ],
            )?;
        }
        Ok(())
    }

    /// Node `k`'s (1-based) address on the fabric.
    pub fn fabric_ip(k: usize) -> Ipv4Addr {
        Ipv4Addr::new(FABRIC[0], FABRIC[1], FABRIC[2], k as u8)
    }

    /// How many nodes.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// The (first) client namespace's name.
    pub fn client(&self) -> String {
        self.client_of(1)
    }

    /// The (first) node namespace's name.
    pub fn node(&self) -> String {
        self.node_of(1)
    }

    /// Node `k`'s (1-based) namespace name.
    pub fn node_of(&self, k: usize) -> String {
        if k <= 1 {
            format!("{}-node", self.base)
        } else {
            format!("{}-node{k}", self.base)
        }
    }

    /// Node `k`'s (1-based) client namespace name.
    pub fn client_of(&self, k: usize) -> String {
        if k <= 1 {
            format!("{}-client", self.base)
        } else {
            format!("{}-client{k}", self.base)
        }
    }

    fn fabric(&self) -> String {
        format!("{}-fabric", self.base)
    }

    /// Pod `n`'s namespace name.
    pub fn pod(&self, n: u8) -> String {
        format!("{}-pod{n}", self.base)
    }

    fn add(&mut self, name: &str) -> Result<(), NetError> {
        run("ip", &["netns", "add", name])?;
        self.owned.push(name.to_owned());
        LIVE.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(name.to_owned());
        run("ip", &["-n", name, "link", "set", "lo", "up"])?;
        Ok(())
    }

    /// Creates Pod `n`'s namespace with address 198.18.1.`n`, linked to the (first) node.
    pub fn add_pod(&mut self, n: u8) -> Result<(String, Ipv4Addr), NetError> {
        self.add_pod_on(n, 1)
    }

    /// Creates Pod `n`'s namespace with address 198.18.1.`n`, linked to node `node`
    /// (1-based); every other node routes to it across the fabric.
    pub fn add_pod_on(&mut self, n: u8, node_k: usize) -> Result<(String, Ipv4Addr), NetError> {
        if n == 0 || n >= 254 {
            return Err(NetError(format!("pod number {n} out of 1..=253")));
        }
        if !(1..=self.nodes).contains(&node_k) {
            return Err(NetError(format!("node {node_k} out of 1..={}", self.nodes)));
        }
        let pod = self.pod(n);
        let node = self.node_of(node_k);
        let ip4 = Ipv4Addr::new(198, 18, 1, n);
        let dev = format!("pod{n}");
        self.add(&pod)?;
        self.pods.push((n, node_k));
        let ip = |args: &[&str]| run("ip", args).map(drop);
        ip(&[
            "-n", &node, "link", "add", &dev, "type", "veth", "peer", "name", "eth0", "netns", &pod,
        ])?;
        ip(&["-n", &node, "addr", "add", "198.18.1.254/32", "dev", &dev])?;
        ip(&["-n", &node, "link", "set", &dev, "up"])?;
        ip(&[
            "-n",
            &node,
            "route",
            "add",
            &format!("{ip4}/32"),
            "dev",
            &dev,
        ])?;
        for j in (1..=self.nodes).filter(|j| *j != node_k) {
            ip(&[
                "-n",
                &self.node_of(j),
                "route",
                "add",
                &format!("{ip4}/32"),
                "via",
                &Netns::fabric_ip(node_k).to_string(),
            ])?;
        }
        ip(&[
            "-n",
            &pod,
            "addr",
            "add",
            &format!("{ip4}/32"),
            "dev",
            "eth0",
        ])?;
        ip(&["-n", &pod, "link", "set", "eth0", "up"])?;
        ip(&["-n", &pod, "route", "add", "198.18.1.254", "dev", "eth0"])?;
        ip(&["-n", &pod, "route", "add", "default", "via", "198.18.1.254"])?;
        Ok((pod, ip4))
    }

    /// [`forget_unrouted`] on every node: the Service's flows that were never DNATed.
    pub fn forget_unrouted(&self) -> Result<u64, NetError> {
        (1..=self.nodes).try_fold(0, |sum, k| {
            Ok(sum + forget_unrouted(&self.node_of(k), SERVICE_VIP)?)
        })
    }

    /// The node (1-based) Pod `n` was placed on.
    pub fn node_of_pod(&self, n: u8) -> Option<usize> {
        self.pods.iter().find(|(p, _)| *p == n).map(|(_, k)| *k)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        // Pods first, then node and client (deleting a namespace removes its veth ends).
        for name in self.owned.iter().rev() {
            let _ = run("ip", &["netns", "delete", name]);
            live.retain(|n| n != name);
        }
    }
}

/// Spawns a thread whose sockets live in namespace `ns`: it joins the namespace (setns), then
/// runs `make()` to completion on a current-thread tokio runtime of its own.
pub fn spawn_in<T, F, Fut>(ns: &str, make: F) -> std::thread::JoinHandle<Result<T, NetError>>
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T>,
{
    let path = format!("/run/netns/{ns}");
    let name = ns.rsplit('-').next().unwrap_or("ns").to_owned();
    std::thread::Builder::new()
        .name(format!("netns-{name}"))
        .spawn(move || {
            let file = File::open(&path).map_err(|e| NetError(format!("open {path}: {e}")))?;
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| NetError(format!("setns {path}: {e}")))?;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| NetError(format!("runtime: {e}")))?;
            Ok(rt.block_on(make()))
        })
        .expect("spawn namespace thread")
}
