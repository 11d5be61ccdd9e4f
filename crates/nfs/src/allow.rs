//! Which client addresses may use the export: a list of CIDR blocks (`127.0.0.1/32,::1`).

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// One CIDR block: an address and a prefix length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether `ip` lies in this block. IPv4-mapped IPv6 clients (`::ffff:a.b.c.d`) match
    /// IPv4 blocks, since a dual-stack listener reports IPv4 clients that way.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(a)) => prefix_eq(
                u32::from(net) as u128,
                u32::from(a) as u128,
                self.prefix,
                32,
            ),
            (IpAddr::V6(net), IpAddr::V6(a)) => {
                prefix_eq(u128::from(net), u128::from(a), self.prefix, 128)
            }
            _ => false,
        }
    }
}

fn prefix_eq(net: u128, a: u128, prefix: u8, bits: u8) -> bool {
    if prefix == 0 {
        return true;
    }
    let shift = (bits - prefix) as u32;
    (net >> shift) == (a >> shift)
}

impl FromStr for Cidr {
    type Err = String;
    fn from_str(s: &str) -> Result<Cidr, String> {
        let s = s.trim();
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("bad CIDR {s:?}: {addr:?} is not an IP address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => match p.parse::<u8>() {
                Ok(n) if n <= max => n,
                _ => return Err(format!("bad CIDR {s:?}: prefix length must be 0..={max}")),
            },
        };
        Ok(Cidr { addr, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// The clients allowed to connect. Empty list: nobody.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowList(Vec<Cidr>);

impl AllowList {
    /// Loopback only (`127.0.0.0/8`, `::1`): the default.
    pub fn loopback() -> AllowList {
        "127.0.0.0/8,::1".parse().expect("valid constant")
    }

    pub fn allows(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|c| c.contains(ip))
    }
}

impl FromStr for AllowList {
    type Err = String;
    /// Comma-separated CIDR blocks; a bare address means a single host.
    fn from_str(s: &str) -> Result<AllowList, String> {
        let blocks = s
            .split(',')
            .filter(|p| !p.trim().is_empty())
            .map(str::parse)
            .collect::<Result<Vec<Cidr>, String>>()?;
        if blocks.is_empty() {
            return Err(format!("bad allow list {s:?}: no CIDR block given"));
        }
        Ok(AllowList(blocks))
    }
}

impl fmt::Display for AllowList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(Cidr::to_string).collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn host_and_network_blocks() {
        let a: AllowList = "127.0.0.1/32, 10.1.0.0/16,::1".parse().unwrap();
        assert!(a.allows(ip("127.0.0.1")));
        assert!(!a.allows(ip("127.0.0.2")));
        assert!(a.allows(ip("10.1.200.3")));
        assert!(!a.allows(ip("10.2.0.1")));
        assert!(a.allows(ip("::1")));
        assert!(!a.allows(ip("::2")));
        assert!(
            a.allows(ip("::ffff:127.0.0.1")),
            "mapped IPv4 matches IPv4 blocks"
        );
    }

    #[test]
    fn zero_prefix_and_bare_address() {
        let a: AllowList = "0.0.0.0/0".parse().unwrap();
        assert!(a.allows(ip("192.0.2.9")));
        assert!(!a.allows(ip("2001:db8::1")));
        let b: AllowList = "192.0.2.7".parse().unwrap();
        assert!(b.allows(ip("192.0.2.7")) && !b.allows(ip("192.0.2.8")));
        assert_eq!(b.to_string(), "192.0.2.7/32");
    }

    #[test]
    fn bad_input_is_named() {
        assert!(
            "10.0.0.0/33"
                .parse::<AllowList>()
                .unwrap_err()
                .contains("prefix length")
        );
        assert!(
            "nonsense/8"
                .parse::<AllowList>()
                .unwrap_err()
                .contains("not an IP address")
        );
        assert!(",".parse::<AllowList>().unwrap_err().contains("no CIDR"));
        assert!("::1/129".parse::<AllowList>().is_err());
    }

    #[test]
    fn default_is_loopback() {
        let a = AllowList::loopback();
        assert!(a.allows(ip("127.0.0.1")) && a.allows(ip("::1")) && !a.allows(ip("192.168.0.1")));
    }
}
