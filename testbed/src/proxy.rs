//! The kube-proxy model: which endpoints get traffic, and the rules in the structure kube-proxy
//! writes, applied atomically in the node namespace.
//!
//! - iptables mode: `KUBE-SERVICES` → `KUBE-SVC-<hash>`, whose rules pick endpoint `i` of `n`
//!   with `-m statistic --mode random --probability 1/(n-i)` (the last one unconditionally) →
//!   `KUBE-SEP-<hash>` with the DNAT. With no endpoint, a `REJECT --reject-with tcp-reset` in
//!   the filter table. The whole content goes in with one `iptables-restore --noflush`.
//! - nftables mode: `table ip lameduck-kp`, a chain per service with
//!   `numgen random mod N vmap { 0 : goto endpoint-…, … }` and a DNAT chain per endpoint; with
//!   no endpoint a reject in a forward-hook chain. Replaced with one `nft -f` transaction.
//!
//! Rules decide only new connections: conntrack keeps every established flow on the endpoint
//! it was DNATed to, also after the endpoint left the rules.

use std::fmt::Write as _;
use std::net::Ipv4Addr;

use serde::Serialize;

use crate::net::{self, NetError, POD_PORT, SERVICE_PORT, SERVICE_VIP};

/// The rule backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// iptables (nat table chains, `statistic` ladder, `iptables-restore`).
    Iptables,
    /// nftables (`numgen random` vmap, `nft -f`).
    Nftables,
}

impl Backend {
    /// `iptables` or `nftables`.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Iptables => "iptables",
            Backend::Nftables => "nftables",
        }
    }
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "iptables" => Ok(Backend::Iptables),
            "nftables" | "nft" => Ok(Backend::Nftables),
            _ => Err(format!("backend: expected iptables or nftables, got {s:?}")),
        }
    }
}

/// One endpoint of the EndpointSlice, with its conditions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Endpoint {
    /// The Pod's name.
    pub pod: String,
    /// The Pod's IP.
    pub ip: Ipv4Addr,
    /// `ready`: serving and not terminating (or always, with `publishNotReadyAddresses`).
    pub ready: bool,
    /// `serving`: the Pod's Ready condition.
    pub serving: bool,
    /// `terminating`: the Pod's deletion has started.
    pub terminating: bool,
}

/// What kube-proxy routes new connections to: the ready endpoints; when none is ready, the
/// serving terminating ones (KEP-1669); when none of those either, nothing (reject).
pub fn choose(endpoints: &[Endpoint]) -> Vec<Endpoint> {
    let ready: Vec<Endpoint> = endpoints.iter().filter(|e| e.ready).cloned().collect();
    if !ready.is_empty() {
        return ready;
    }
    endpoints
        .iter()
        .filter(|e| e.serving && e.terminating)
        .cloned()
        .collect()
}

/// A short stable hash, like kube-proxy's chain-name suffixes (FNV-1a, base32 upper).
fn hash16(s: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    (0..16)
        .map(|i| ALPHABET[((h >> (i * 4)) & 31) as usize] as char)
        .collect()
}

const SERVICE: &str = "default/lameduck:http";

fn svc_chain() -> String {
    format!("KUBE-SVC-{}", hash16(SERVICE))
}

fn sep_chain(ip: Ipv4Addr) -> String {
    format!("KUBE-SEP-{}", hash16(&format!("{SERVICE}:{ip}:{POD_PORT}")))
}

/// The `iptables-restore --noflush` input for routing to `chosen`; `stale` are endpoint
/// chains of earlier syncs to delete.
pub fn iptables_rules(chosen: &[Endpoint], stale: &[Ipv4Addr]) -> String {
    let mut s = String::new();
    let vip = format!("{SERVICE_VIP}/32");
    s.push_str("*filter\n:KUBE-SERVICES - [0:0]\n");
    if chosen.is_empty() {
        let _ = writeln!(
            s,
            "-A KUBE-SERVICES -d {vip} -p tcp -m comment --comment \"{SERVICE} has no endpoints\" \
             -m tcp --dport {SERVICE_PORT} -j REJECT --reject-with tcp-reset"
        );
    }
    s.push_str("COMMIT\n*nat\n:KUBE-SERVICES - [0:0]\n");
    let svc = svc_chain();
    let _ = writeln!(s, ":{svc} - [0:0]");
    for e in chosen {
        let _ = writeln!(s, ":{} - [0:0]", sep_chain(e.ip));
    }
    // Stale endpoint chains are flushed here and deleted at the end, as kube-proxy does: a
    // chain can only go once nothing (the flushed service chain) jumps to it.
    let stale: Vec<Ipv4Addr> = stale
        .iter()
        .copied()
        .filter(|ip| !chosen.iter().any(|e| e.ip == *ip))
        .collect();
    for ip in &stale {
        let _ = writeln!(s, ":{} - [0:0]", sep_chain(*ip));
    }
    if !chosen.is_empty() {
        let _ = writeln!(
            s,
            "-A KUBE-SERVICES -d {vip} -p tcp -m comment --comment \"{SERVICE} cluster IP\" \
             -m tcp --dport {SERVICE_PORT} -j {svc}"
        );
    }
    let n = chosen.len();
    for (i, e) in chosen.iter().enumerate() {
        let sep = sep_chain(e.ip);
        if i + 1 < n {
            let p = 1.0 / (n - i) as f64;
            let _ = writeln!(
                s,
                "-A {svc} -m comment --comment \"{SERVICE} -> {}:{POD_PORT}\" \
                 -m statistic --mode random --probability {p:.10} -j {sep}",
                e.ip
            );
        } else {
            let _ = writeln!(
                s,
                "-A {svc} -m comment --comment \"{SERVICE} -> {}:{POD_PORT}\" -j {sep}",
                e.ip
            );
        }
        let _ = writeln!(
            s,
            "-A {sep} -p tcp -m comment --comment \"{SERVICE}\" -m tcp -j DNAT --to-destination {}:{POD_PORT}",
            e.ip
        );
    }
    for ip in &stale {
        let _ = writeln!(s, "-X {}", sep_chain(*ip));
    }
    s.push_str("COMMIT\n");
    s
}

/// The `nft -f` input that replaces `table ip lameduck-kp` in one transaction.
pub fn nft_rules(chosen: &[Endpoint]) -> String {
    let mut s = String::new();
    // Create-if-missing, delete, re-create: one atomic transaction.
    s.push_str("table ip lameduck-kp {}\ndelete table ip lameduck-kp\n");
    s.push_str("table ip lameduck-kp {\n");
    let svc = "service-lameduck-http";
    let _ = writeln!(
        s,
        "  chain nat-prerouting {{\n    type nat hook prerouting priority dstnat; policy accept;\n    jump services\n  }}"
    );
    let _ = writeln!(
        s,
        "  chain filter-forward {{\n    type filter hook forward priority -110; policy accept;\n    ct state new jump service-endpoints-check\n  }}"
    );
    s.push_str("  chain service-endpoints-check {\n");
    if chosen.is_empty() {
        let _ = writeln!(
            s,
            "    ip daddr {SERVICE_VIP} tcp dport {SERVICE_PORT} reject with tcp reset"
        );
    }
    s.push_str("  }\n  chain services {\n");
    if !chosen.is_empty() {
        let _ = writeln!(
            s,
            "    ip daddr {SERVICE_VIP} tcp dport {SERVICE_PORT} goto {svc}"
        );
    }
    s.push_str("  }\n");
    let ep_chain = |ip: Ipv4Addr| format!("endpoint-{}", ip.to_string().replace('.', "-"));
    if !chosen.is_empty() {
        let map: Vec<String> = chosen
            .iter()
            .enumerate()
            .map(|(i, e)| format!("{i} : goto {}", ep_chain(e.ip)))
            .collect();
        let _ = writeln!(
            s,
            "  chain {svc} {{\n    numgen random mod {} vmap {{ {} }}\n  }}",
            chosen.len(),
            map.join(", ")
        );
        for e in chosen {
            let _ = writeln!(
                s,
                "  chain {} {{\n    meta l4proto tcp dnat to {}:{POD_PORT}\n  }}",
                ep_chain(e.ip),
                e.ip
            );
        }
    }
    s.push_str("}\n");
    s
}

/// The rules currently applied in one node namespace.
#[derive(Debug)]
pub struct Proxy {
    backend: Backend,
    node_ns: String,
    applied_ips: Vec<Ipv4Addr>,
}

impl Proxy {
    /// Installs the hooks (iptables: jumps from PREROUTING and FORWARD to `KUBE-SERVICES`)
    /// and an empty service.
    pub fn install(backend: Backend, node_ns: &str) -> Result<Proxy, NetError> {
        let mut p = Proxy {
            backend,
            node_ns: node_ns.to_owned(),
            applied_ips: Vec::new(),
        };
        if backend == Backend::Iptables {
            net::run_in(
                node_ns,
                &["iptables-restore", "--noflush"],
                Some("*filter\n:KUBE-SERVICES - [0:0]\n-A FORWARD -m conntrack --ctstate NEW -j KUBE-SERVICES\nCOMMIT\n*nat\n:KUBE-SERVICES - [0:0]\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n"),
            )?;
        }
        p.apply(&[])?;
        Ok(p)
    }

    /// Replaces the rules with routing to `chosen`, atomically; returns the rules written.
    pub fn apply(&mut self, chosen: &[Endpoint]) -> Result<String, NetError> {
        let rules = match self.backend {
            Backend::Iptables => {
                let r = iptables_rules(chosen, &self.applied_ips);
                net::run_in(&self.node_ns, &["iptables-restore", "--noflush"], Some(&r))?;
                r
            }
            Backend::Nftables => {
                let r = nft_rules(chosen);
                net::run_in(&self.node_ns, &["nft", "-f", "-"], Some(&r))?;
                r
            }
        };
        self.applied_ips = chosen.iter().map(|e| e.ip).collect();
        Ok(rules)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(n: u8, ready: bool, serving: bool, terminating: bool) -> Endpoint {
        Endpoint {
            pod: format!("pod-{n}"),
            ip: Ipv4Addr::new(198, 18, 1, n),
            ready,
            serving,
            terminating,
        }
    }

    #[test]
    fn choose_prefers_ready_then_serving_terminating_then_nothing() {
        let all = [ep(1, false, true, true), ep(2, true, true, false)];
        assert_eq!(choose(&all), vec![all[1].clone()]);
        let fallback = [ep(1, false, true, true), ep(2, false, false, false)];
        assert_eq!(choose(&fallback), vec![fallback[0].clone()]);
        let none = [ep(1, false, false, true), ep(2, false, false, false)];
        assert!(choose(&none).is_empty());
    }

    #[test]
    fn iptables_ladder_has_kube_proxy_probabilities() {
        let eps = [
            ep(1, true, true, false),
            ep(2, true, true, false),
            ep(3, true, true, false),
        ];
        let r = iptables_rules(&eps, &[Ipv4Addr::new(198, 18, 1, 9)]);
        assert!(r.contains("--probability 0.3333333333"), "{r}");
        assert!(r.contains("--probability 0.5000000000"), "{r}");
        assert_eq!(r.matches("-m statistic").count(), 2, "{r}");
        assert!(r.contains("--to-destination 198.18.1.3:8080"), "{r}");
        assert!(r.contains(&format!("-X {}", sep_chain(Ipv4Addr::new(198, 18, 1, 9)))));
        assert!(!r.contains("REJECT"));
        let empty = iptables_rules(&[], &[]);
        assert!(empty.contains("REJECT --reject-with tcp-reset"), "{empty}");
        assert!(!empty.contains("DNAT"));
    }

    #[test]
    fn nft_map_covers_every_endpoint() {
        let eps = [ep(1, true, true, false), ep(4, true, true, false)];
        let r = nft_rules(&eps);
        assert!(r.contains("numgen random mod 2 vmap { 0 : goto endpoint-198-18-1-1, 1 : goto endpoint-198-18-1-4 }"), "{r}");
        assert!(r.contains("dnat to 198.18.1.4:8080"));
        assert!(nft_rules(&[]).contains("reject with tcp reset"));
    }
}
