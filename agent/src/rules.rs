//! The node's Service rules, parsed once per change into a lookup: which Pod addresses kube-proxy's
//! rules still send new connections to, and through which Services.
//!
//! Two dumps are read:
//!
//! * iptables mode (`iptables-save -t nat`, and `ip6tables-save -t nat`): a Service's
//!   `KUBE-SVC-…` (or `KUBE-SVL-…`, `KUBE-EXT-…`, `KUBE-FW-…`) chain jumps to one `KUBE-SEP-…`
//!   chain per endpoint, whose rule DNATs to the endpoint (`-j DNAT --to-destination
//!   10.1.2.3:8080`) and names the Service in its comment.
//! * nftables mode (`nft list ruleset`): a Service's chain picks an endpoint chain with a
//!   verdict map (`numgen random mod 2 vmap { 0 : goto endpoint-…, 1 : goto endpoint-… }`), and
//!   the endpoint chain DNATs (`meta l4proto tcp dnat to 10.1.2.3:8080`).
//!
//! In both, an endpoint is routed only while some other chain still jumps (or goes) to its
//! chain: kube-proxy may leave the chain of a removed endpoint in place, unreferenced, until a
//! later full sync. What this does not read: IPVS mode, and eBPF dataplanes (Cilium's
//! kube-proxy replacement, Calico's eBPF mode) whose Service maps are not in these tables.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

/// Which datapath a dump came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// kube-proxy's iptables mode.
    Iptables,
    /// kube-proxy's nftables mode.
    Nftables,
}

/// One Service route to an endpoint: the Service (as the rules name it) and the endpoint.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct Route {
    /// `namespace/name:port` (iptables' comment) or `namespace/name/protocol/port` (nftables'
    /// chain name); the chain when the rules name no Service.
    pub service: String,
    /// The endpoint the rule DNATs to.
    pub endpoint: SocketAddr,
    /// How many other endpoints the same Service's rules still pick among: 0 means this is its
    /// last one — routed only as kube-proxy's fallback when every endpoint is terminating
    /// (KEP-1669), or because it is the only replica.
    pub others: usize,
}

/// The routes of one dump, by endpoint address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Routes {
    by_ip: BTreeMap<IpAddr, Vec<Route>>,
}

impl Routes {
    /// The routes that send new connections to `ip` (any port).
    pub fn to(&self, ip: IpAddr) -> &[Route] {
        self.by_ip
            .get(&ip.to_canonical())
            .map_or(&[], Vec::as_slice)
    }

    /// Adds `other`'s routes (another datapath's, or the other address family's).
    pub fn merge(&mut self, other: Routes) {
        for (ip, routes) in other.by_ip {
            let mine = self.by_ip.entry(ip).or_default();
            for r in routes {
                if !mine.contains(&r) {
                    mine.push(r);
                }
            }
            mine.sort();
        }
    }

    /// How many endpoint addresses the rules route to.
    pub fn endpoints(&self) -> usize {
        self.by_ip.len()
    }

    fn from_edges(edges: Vec<(String, String, String, SocketAddr)>) -> Routes {
        // (service chain, endpoint chain, service name, endpoint)
        let mut per_service: BTreeMap<String, BTreeSet<SocketAddr>> = BTreeMap::new();
        for (svc, _, _, ep) in &edges {
            per_service.entry(svc.clone()).or_default().insert(*ep);
        }
        let mut by_ip: BTreeMap<IpAddr, Vec<Route>> = BTreeMap::new();
        for (svc, _, name, ep) in edges {
            let others = per_service[&svc].len() - 1;
            let route = Route {
                service: name,
                endpoint: ep,
                others,
            };
            let routes = by_ip.entry(ep.ip().to_canonical()).or_default();
            if !routes.contains(&route) {
                routes.push(route);
            }
        }
        for routes in by_ip.values_mut() {
            routes.sort();
        }
        Routes { by_ip }
    }
}

/// Parses `iptables-save -t nat` output (one or more tables, IPv4 and IPv6 concatenated).
pub fn parse_iptables(text: &str) -> Routes {
    // Endpoint chains: their DNAT target and the Service their comment names.
    let mut dnat: BTreeMap<&str, (SocketAddr, String)> = BTreeMap::new();
    // Jumps between chains: (from, to).
    let mut jumps: Vec<(&str, &str)> = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("-A ") else {
            continue;
        };
        let Some((chain, rule)) = rest.split_once(' ') else {
            continue;
        };
        if let Some(to) = word_after(rule, "-j ").or_else(|| word_after(rule, "-g ")) {
            if to == "DNAT" {
                if let Some(ep) = word_after(rule, "--to-destination ").and_then(parse_endpoint) {
                    let name = comment(rule).unwrap_or_else(|| chain.to_owned());
                    dnat.insert(chain, (ep, name));
                }
            } else {
                jumps.push((chain, to));
            }
        }
    }
    let mut edges = Vec::new();
    for (from, to) in jumps {
        if let Some((ep, name)) = dnat.get(to) {
            edges.push((from.to_owned(), to.to_owned(), name.clone(), *ep));
        }
    }
    Routes::from_edges(edges)
}

/// Parses `nft list ruleset` (or `nft list table …`) output.
pub fn parse_nftables(text: &str) -> Routes {
    let mut dnat: BTreeMap<String, SocketAddr> = BTreeMap::new();
    let mut jumps: Vec<(String, String)> = Vec::new();
    let mut table = String::new();
    let mut chain: Option<String> = None;
    for line in text.lines() {
        let l = line.trim();
        if let Some(rest) = l.strip_prefix("table ") {
            table = rest.trim_end_matches('{').trim().to_owned();
            chain = None;
            continue;
        }
        if let Some(rest) = l.strip_prefix("chain ") {
            let name = rest.trim_end_matches('{').trim().trim_matches('"');
            chain = Some(format!("{table}\u{0}{name}"));
            continue;
        }
        let Some(current) = &chain else {
            continue;
        };
        if let Some(ep) = word_after(l, "dnat to ")
            .or_else(|| word_after(l, "dnat ip to "))
            .or_else(|| word_after(l, "dnat ip6 to "))
            .and_then(parse_endpoint)
        {
            dnat.insert(current.clone(), ep);
        }
        for verb in ["goto ", "jump "] {
            let mut rest = l;
            while let Some(at) = rest.find(verb) {
                rest = &rest[at + verb.len()..];
                let to: String = rest
                    .chars()
                    .take_while(|c| !c.is_whitespace() && *c != ',' && *c != '}')
                    .collect();
                let to = to.trim_matches('"');
                jumps.push((current.clone(), format!("{table}\u{0}{to}")));
            }
        }
    }
    let mut edges = Vec::new();
    for (from, to) in jumps {
        if let Some(ep) = dnat.get(&to) {
            let name = to.split('\u{0}').nth(1).unwrap_or(&to);
            edges.push((from, to.clone(), nft_service(name), *ep));
        }
    }
    Routes::from_edges(edges)
}

/// The Service a kube-proxy nftables endpoint chain names
/// (`endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80` → `ns1/svc1/tcp/p80`), else the chain.
fn nft_service(chain: &str) -> String {
    chain
        .strip_prefix("endpoint-")
        .and_then(|rest| rest.split_once('-'))
        .and_then(|(_, rest)| rest.split_once("__"))
        .map_or_else(|| chain.to_owned(), |(svc, _)| svc.to_owned())
}

/// The whitespace-delimited word after `marker` in `s`.
fn word_after<'a>(s: &'a str, marker: &str) -> Option<&'a str> {
    let at = s.find(marker)?;
    s[at + marker.len()..].split_whitespace().next()
}

/// The text of `--comment "…"` (or an unquoted one-word comment).
fn comment(rule: &str) -> Option<String> {
    let at = rule.find("--comment ")?;
    let rest = &rule[at + "--comment ".len()..];
    if let Some(quoted) = rest.strip_prefix('"') {
        let end = quoted.find('"')?;
        Some(quoted[..end].to_owned())
    } else {
        rest.split_whitespace().next().map(str::to_owned)
    }
}

/// `10.1.2.3:8080`, `[fd00::1]:8080`, or an address alone (port 0).
fn parse_endpoint(s: &str) -> Option<SocketAddr> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Some(a);
    }
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(SocketAddr::new(ip, 0));
    }
    // nftables writes an IPv6 endpoint as `[fd00::1]:8080` too; a bare `fd00::1:8080` is
    // ambiguous and not written by kube-proxy.
    None
}

#[cfg(test)]
mod tests;
