//! Addresses another device can use: a server listening on every interface (`0.0.0.0`) is printed
//! with this machine's LAN address rather than one no other device can reach.

use std::net::{IpAddr, SocketAddr};

/// The address to print for a server bound to `bound`: itself, unless it is unspecified, then the
/// first non-loopback address of this machine's interfaces of the same family (loopback when none).
pub(crate) fn reachable(bound: SocketAddr) -> SocketAddr {
    if !bound.ip().is_unspecified() {
        return bound;
    }
    let v4 = bound.is_ipv4();
    let lan = if_addrs::get_if_addrs().ok().and_then(|list| {
        list.into_iter()
            .map(|i| i.ip())
            .find(|ip| !ip.is_loopback() && ip.is_ipv4() == v4 && !is_link_local(ip))
    });
    let loopback: IpAddr = if v4 {
        IpAddr::from([127, 0, 0, 1])
    } else {
        IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1])
    };
    SocketAddr::new(lan.unwrap_or(loopback), bound.port())
}

fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_specific_address_is_printed_as_it_is_and_an_unspecified_one_never() {
        let bound: SocketAddr = "127.0.0.1:8788".parse().unwrap();
        assert_eq!(reachable(bound), bound);
        let any: SocketAddr = "0.0.0.0:8788".parse().unwrap();
        let shown = reachable(any);
        assert!(!shown.ip().is_unspecified(), "{shown}");
        assert_eq!(shown.port(), 8788);
    }
}
