//! Peers declared to choose an endpoint per request (an L7 proxy, a gateway, a mesh sidecar):
//! addresses and CIDR blocks, matched once per path, never per request.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

/// The environment variable that declares per-request peers when the code sets none
/// ([`Propagation::per_request_peers`](crate::Propagation::per_request_peers)): addresses and
/// CIDR blocks separated by commas, e.g. `10.0.3.17,10.1.0.0/16`.
pub const PER_REQUEST_PEERS_ENV: &str = "LAMEDUCK_PER_REQUEST_PEERS";

/// An address block: an address and how many of its leading bits must match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Block {
    addr: IpAddr,
    bits: u8,
}

impl Block {
    fn parse(s: &str) -> Result<Block, String> {
        let (addr, bits) = match s.split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| {
            format!("{s:?} is not an address or a CIDR block (10.0.3.17, 10.1.0.0/16, fd00::/8)")
        })?;
        let addr = addr.to_canonical();
        let width = if addr.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            None => width,
            Some(b) => match b.parse::<u8>() {
                Ok(n) if n <= width => n,
                _ => return Err(format!("{s:?}: the prefix length must be 0 to {width}")),
            },
        };
        Ok(Block { addr, bits })
    }

    fn contains(&self, ip: IpAddr) -> bool {
        let prefix = |a: u128, width: u32| {
            let shift = width - u32::from(self.bits);
            a.checked_shr(shift).unwrap_or(0)
        };
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                prefix(u32::from(net).into(), 32) == prefix(u32::from(ip).into(), 32)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => prefix(net.into(), 128) == prefix(ip.into(), 128),
            _ => false,
        }
    }
}

impl fmt::Display for Block {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = if self.addr.is_ipv4() { 32 } else { 128 };
        if self.bits == width {
            write!(f, "{}", self.addr)
        } else {
            write!(f, "{}/{}", self.addr, self.bits)
        }
    }
}

/// The declared per-request peers: cheap to clone, empty by default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PeerSet(Arc<[Block]>);

impl PeerSet {
    /// Parses `items` (addresses or CIDR blocks, surrounding spaces ignored, empty items
    /// skipped); the error names the first bad one.
    pub(crate) fn parse<'a>(items: impl IntoIterator<Item = &'a str>) -> Result<PeerSet, String> {
        let blocks = items
            .into_iter()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(Block::parse)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(PeerSet(blocks.into()))
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `ip` is a declared peer.
    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|b| b.contains(ip))
    }

    /// The blocks as written back (`10.0.3.17`, `10.1.0.0/16`), for the report.
    pub(crate) fn describe(&self) -> Vec<String> {
        self.0.iter().map(ToString::to_string).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::PeerSet;

    fn ip(s: &str) -> std::net::IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn addresses_and_blocks_match_what_they_say() {
        let set = PeerSet::parse(["10.0.3.17", " 10.1.0.0/16 ", "", "fd00::/8", "0.0.0.0/0"]);
        let set = set.unwrap();
        assert!(set.contains(ip("10.0.3.17")));
        assert!(set.contains(ip("10.1.255.1")));
        assert!(
            set.contains(ip("::ffff:10.1.2.3")),
            "IPv4-mapped is the IPv4 peer"
        );
        assert!(set.contains(ip("fd12::1")));
        assert!(!set.contains(ip("fe80::1")));
        assert_eq!(
            set.describe(),
            ["10.0.3.17", "10.1.0.0/16", "fd00::/8", "0.0.0.0/0"]
        );
        let one = PeerSet::parse(["127.0.0.6"]).unwrap();
        assert!(one.contains(ip("127.0.0.6")) && !one.contains(ip("127.0.0.1")));
        assert!(PeerSet::parse([]).unwrap().is_empty());
    }

    #[test]
    fn a_bad_item_is_named() {
        for (bad, says) in [
            ("10.0.0.256", "not an address"),
            ("10.0.0.0/33", "0 to 32"),
            ("fd00::/129", "0 to 128"),
            ("ingress", "not an address"),
            ("10.0.0.0/x", "0 to 32"),
        ] {
            let e = PeerSet::parse(["10.0.0.1", bad]).unwrap_err();
            assert!(e.contains(bad) && e.contains(says), "{bad}: {e}");
        }
    }
}
