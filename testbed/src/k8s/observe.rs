//! Reading what the components did: their metrics over plain HTTP, and the endpoints in
//! kube-proxy's rules.

use super::*;

/// `GET path` over plain HTTP/1.1 to `addr` in the current namespace; the body.
pub async fn http_text(addr: &str, path: &str) -> Result<String, String> {
    let work = async {
        let mut s = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf)
            .await
            .map_err(|e| format!("read: {e}"))?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        if !head.starts_with("HTTP/1.1 200") {
            return Err(head.lines().next().unwrap_or("").to_owned());
        }
        if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            return Ok(dechunk(body));
        }
        Ok(body.to_owned())
    };
    tokio::time::timeout(Duration::from_secs(5), work)
        .await
        .unwrap_or_else(|_| Err(format!("{addr}{path}: timeout")))
}

pub(super) fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
    }
    out
}

/// kube-proxy's metrics that the table uses, from one scrape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProxyMetrics {
    /// `kubeproxy_sync_proxy_rules_last_timestamp_seconds`: when the last sync finished.
    pub last_sync: f64,
    /// `kubeproxy_sync_proxy_rules_duration_seconds`: count and sum.
    pub sync_count: u64,
    /// Sum of the sync durations, seconds.
    pub sync_sum: f64,
    /// `kubeproxy_network_programming_duration_seconds`: count and sum (from the endpoint
    /// change's trigger time to the rules that apply it).
    pub programming_count: u64,
    /// Sum of the programming latencies, seconds.
    pub programming_sum: f64,
}

impl ProxyMetrics {
    /// Parses the Prometheus text format.
    pub fn parse(text: &str) -> ProxyMetrics {
        let mut m = ProxyMetrics::default();
        for line in text.lines() {
            // kube-proxy runs an IPv6 proxier too; the testbed's Service is IPv4.
            if line.starts_with('#') || line.contains("ip_family=\"IPv6\"") {
                continue;
            }
            let Some((name, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let v: f64 = value.trim().parse().unwrap_or(0.0);
            let base = name.split('{').next().unwrap_or(name);
            match base {
                "kubeproxy_sync_proxy_rules_last_timestamp_seconds" => m.last_sync = v,
                "kubeproxy_sync_proxy_rules_duration_seconds_count" => m.sync_count = v as u64,
                "kubeproxy_sync_proxy_rules_duration_seconds_sum" => m.sync_sum = v,
                "kubeproxy_network_programming_duration_seconds_count" => {
                    m.programming_count = v as u64
                }
                "kubeproxy_network_programming_duration_seconds_sum" => m.programming_sum = v,
                _ => {}
            }
        }
        m
    }
}

/// The Pod IPs (198.18.1.x) that kube-proxy's rules in namespace `node_ns` DNAT to now.
pub fn rule_endpoints(
    node_ns: &str,
    backend: Backend,
) -> Result<(Vec<Ipv4Addr>, String), NetError> {
    let text = match backend {
        Backend::Iptables => net::run_in(node_ns, &["iptables-save", "-t", "nat"], None)?,
        Backend::Nftables => {
            net::run_in(node_ns, &["nft", "list", "table", "ip", "kube-proxy"], None)?
        }
    };
    let mut ips: Vec<Ipv4Addr> = match backend {
        Backend::Iptables => iptables_service_endpoints(&text),
        Backend::Nftables => Vec::new(),
    };
    for line in text
        .lines()
        .filter(|l| backend == Backend::Nftables && (l.contains("dnat") || l.contains("DNAT")))
    {
        for word in line.split(|c: char| !(c.is_ascii_digit() || c == '.')) {
            if let Ok(ip) = word.parse::<Ipv4Addr>() {
                if ip.octets()[..3] == [198, 18, 1] && !ips.contains(&ip) {
                    ips.push(ip);
                }
            }
        }
    }
    ips.sort();
    Ok((ips, text))
}

/// The Pod IPs the Service's chain jumps to in `iptables-save -t nat` output: `KUBE-SERVICES`
/// → the VIP's `KUBE-SVC-…` → its `KUBE-SEP-…` → their DNAT. Following the jumps, not every
/// DNAT in the table: with more than 1,000 endpoints in the cluster kube-proxy leaves the
/// chains of removed endpoints in place until a full sync, unreferenced.
pub(super) fn iptables_service_endpoints(text: &str) -> Vec<Ipv4Addr> {
    let target = |line: &str, prefix: &str| -> Option<String> {
        let rest = line.split(" -j ").nth(1)?;
        let chain = rest.split_whitespace().next()?;
        chain.starts_with(prefix).then(|| chain.to_owned())
    };
    let vip = format!("-d {}/32", crate::net::SERVICE_VIP);
    let svcs: Vec<String> = text
        .lines()
        .filter(|l| l.starts_with("-A KUBE-SERVICES ") && l.contains(&vip))
        .filter_map(|l| target(l, "KUBE-SVC-"))
        .collect();
    let seps: Vec<String> = text
        .lines()
        .filter(|l| svcs.iter().any(|s| l.starts_with(&format!("-A {s} "))))
        .filter_map(|l| target(l, "KUBE-SEP-"))
        .collect();
    let mut ips = Vec::new();
    for line in text
        .lines()
        .filter(|l| l.contains("DNAT") && seps.iter().any(|s| l.starts_with(&format!("-A {s} "))))
    {
        let Some(dest) = line.split("--to-destination ").nth(1) else {
            continue;
        };
        let ip = dest.split(':').next().unwrap_or("");
        if let Ok(ip) = ip.parse::<Ipv4Addr>() {
            if !ips.contains(&ip) {
                ips.push(ip);
            }
        }
    }
    ips
}
