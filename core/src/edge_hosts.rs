//! `EDGE_HOSTNAMES` (SPEC §2, §6): the host names this edge answers
//! node-signed requests for, so that a signature made for another edge (a
//! staging deployment, say) is refused here even when the node's key is
//! registered in both.
//!
//! A request's `Host` is matched by its name, lowercased, without a port:
//! the port does not tell one deployment from another, and an agent
//! reaching the edge through a proxy on another port signs the same name.

use std::collections::BTreeSet;

/// Most names in `EDGE_HOSTNAMES`.
pub const MAX_EDGE_HOSTS: usize = 32;
/// Longest name, in bytes (a DNS name's limit).
pub const MAX_HOST_NAME_BYTES: usize = 253;

/// The configured host names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EdgeHosts(BTreeSet<String>);

/// `EDGE_HOSTNAMES` is malformed: an empty entry, a port, a character a
/// host name cannot have, or too many names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadEdgeHosts;

impl EdgeHosts {
    /// Parses a comma-separated list of host names (DNS names, IPv4
    /// addresses, or bracketed IPv6 addresses), each without a port.
    pub fn parse(csv: &str) -> Result<EdgeHosts, BadEdgeHosts> {
        let mut names = BTreeSet::new();
        for name in csv.split(',').map(str::trim) {
            let name = name.to_ascii_lowercase();
            let bracketed = name.strip_prefix('[').and_then(|n| n.strip_suffix(']'));
            let valid = match bracketed {
                Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
                None => {
                    !name.is_empty()
                        && name.len() <= MAX_HOST_NAME_BYTES
                        && name
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
                }
            };
            if !valid {
                return Err(BadEdgeHosts);
            }
            names.insert(name);
        }
        if names.len() > MAX_EDGE_HOSTS {
            return Err(BadEdgeHosts);
        }
        Ok(EdgeHosts(names))
    }

    /// True when the name in `host` (a `Host` header: `name[:port]`, an
    /// IPv6 name in brackets) is one of the configured names.
    pub fn allows(&self, host: &str) -> bool {
        let name = if host.starts_with('[') {
            host.find(']').map_or(host, |end| &host[..=end])
        } else {
            host.split_once(':').map_or(host, |(name, _)| name)
        };
        self.0.contains(&name.to_ascii_lowercase())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_case_blind_with_any_port() {
        let hosts = EdgeHosts::parse(" Callfence.Example.NET ,127.0.0.1,[::1]").unwrap();
        for host in [
            "callfence.example.net",
            "CALLFENCE.example.net",
            "callfence.example.net:8443",
            "127.0.0.1:8787",
            "[::1]:8787",
            "[::1]",
        ] {
            assert!(hosts.allows(host), "{host}");
        }
        for host in [
            "staging-callfence.example.net",
            "callfence.example.net.evil",
            "evil.callfence.example.net",
            "callfence.example.net.",
            "",
            "[::2]",
            "127.0.0.2",
        ] {
            assert!(!hosts.allows(host), "{host}");
        }
    }

    #[test]
    fn malformed_lists_are_refused() {
        for csv in [
            "",
            "a.example,",
            "a.example:443",
            "a example",
            "a/b",
            "[::1",
            "[zz::1]",
            &"a.".repeat(200),
            &(0..=MAX_EDGE_HOSTS)
                .map(|i| format!("h{i}.example"))
                .collect::<Vec<_>>()
                .join(","),
        ] {
            assert_eq!(EdgeHosts::parse(csv), Err(BadEdgeHosts), "{csv}");
        }
    }
}
