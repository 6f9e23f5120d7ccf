//! An origin URL's host as the runtime's URL parser reads it, and whether
//! it names the edge's own network (SPEC §4, v1.4).
//!
//! The Worker forwards to a registry `origin_url` with the runtime's
//! `fetch`, whose WHATWG URL parser turns many spellings into one address:
//! `2130706433`, `0x7f.1`, `0177.0.0.1` and `127.1` are all `127.0.0.1`, and
//! `[::ffff:7f00:1]` is that address mapped into IPv6. Judging the text
//! would let those through, so [`parse`] applies the WHATWG host parser's
//! rules (for the ASCII hosts the registry admits) and [`internal`] judges
//! the address or name that comes out.
//!
//! A DNS name that resolves to an internal address cannot be judged here
//! (no DNS in the core); the runtime's own egress rules are the guard there.

use std::net::{Ipv4Addr, Ipv6Addr};

/// A parsed host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// A DNS name, lowercased, without a trailing dot.
    Domain(String),
    /// An IPv4 address, in any of the WHATWG number forms.
    V4(Ipv4Addr),
    /// A bracketed IPv6 address.
    V6(Ipv6Addr),
}

/// Parses `host` (no port, IPv6 in brackets) as the WHATWG URL host parser
/// does for an ASCII special-scheme host; `None` where that parser fails
/// (`256.0.0.1`, `09.1`, five parts, a bad IPv6 literal).
pub fn parse(host: &str) -> Option<Host> {
    if let Some(v6) = host.strip_prefix('[') {
        return v6.strip_suffix(']')?.parse().ok().map(Host::V6);
    }
    let lower = host.to_ascii_lowercase();
    if ends_in_number(&lower) {
        return ipv4(&lower).map(Host::V4);
    }
    let name = lower.strip_suffix('.').unwrap_or(&lower);
    Some(Host::Domain(name.to_owned()))
}

/// Why `host` is inside the edge's network, or `None` for a public host:
/// `localhost` (and `*.localhost`), `*.internal`, `*.local`, and loopback,
/// unspecified, link-local, RFC 1918, RFC 6598 and unique-local addresses,
/// including IPv4 addresses mapped into IPv6.
pub fn internal(host: &Host) -> Option<&'static str> {
    match host {
        Host::Domain(name) => {
            let under =
                |suffix: &str| name == suffix.trim_start_matches('.') || name.ends_with(suffix);
            if under(".localhost") {
                Some("a loopback name")
            } else if under(".internal") || under(".local") {
                Some("a private DNS name")
            } else {
                None
            }
        }
        Host::V4(addr) => internal_v4(*addr),
        Host::V6(addr) => internal_v6(*addr),
    }
}

fn internal_v4(addr: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = addr.octets();
    if addr.is_loopback() {
        Some("a loopback address")
    } else if a == 0 {
        Some("an unspecified (this-host) address")
    } else if addr.is_link_local() {
        Some("a link-local address")
    } else if addr.is_private() {
        Some("an RFC 1918 private address")
    } else if a == 100 && (64..128).contains(&b) {
        Some("an RFC 6598 shared address")
    } else {
        None
    }
}

fn internal_v6(addr: Ipv6Addr) -> Option<&'static str> {
    let segments = addr.segments();
    // ::ffff:a.b.c.d (mapped), ::a.b.c.d (compatible, deprecated) and
    // 64:ff9b::a.b.c.d (NAT64) all reach an IPv4 address.
    let embeds_v4 = matches!(segments, [0, 0, 0, 0, 0, 0xffff, _, _])
        || matches!(segments, [0, 0, 0, 0, 0, 0, hi, _] if hi != 0)
        || matches!(segments, [0x64, 0xff9b, 0, 0, 0, 0, _, _]);
    if embeds_v4 {
        let [.., a, b, c, d] = addr.octets();
        return internal_v4(Ipv4Addr::new(a, b, c, d));
    }
    if addr.is_loopback() {
        Some("a loopback address")
    } else if addr.is_unspecified() {
        Some("an unspecified (this-host) address")
    } else if segments[0] & 0xffc0 == 0xfe80 || segments[0] & 0xffc0 == 0xfec0 {
        Some("a link-local address")
    } else if segments[0] & 0xfe00 == 0xfc00 {
        Some("a unique-local address")
    } else {
        None
    }
}

/// The WHATWG "ends in a number" check: the last label (after one trailing
/// dot) is decimal digits, or parses as a `0x` hex number.
fn ends_in_number(host: &str) -> bool {
    let mut labels: Vec<&str> = host.split('.').collect();
    if labels.len() > 1 && labels.last() == Some(&"") {
        labels.pop();
    }
    let last = labels.last().copied().unwrap_or_default();
    (!last.is_empty() && last.bytes().all(|b| b.is_ascii_digit())) || number(last).is_some()
}

/// The WHATWG IPv4 parser: one to four dot-separated numbers (decimal,
/// `0`-prefixed octal or `0x`-prefixed hex); the last fills the remaining
/// bytes.
fn ipv4(host: &str) -> Option<Ipv4Addr> {
    let mut parts: Vec<&str> = host.split('.').collect();
    if parts.len() > 1 && parts.last() == Some(&"") {
        parts.pop();
    }
    if parts.len() > 4 {
        return None;
    }
    let numbers = parts
        .iter()
        .map(|p| number(p))
        .collect::<Option<Vec<u64>>>()?;
    let (last, leading) = numbers.split_last()?;
    if leading.iter().any(|n| *n > 255) || *last >= 256u64.pow(5 - numbers.len() as u32) {
        return None;
    }
    let address = leading
        .iter()
        .enumerate()
        .fold(*last, |acc, (i, n)| acc + n * 256u64.pow(3 - i as u32));
    u32::try_from(address).ok().map(Ipv4Addr::from)
}

/// One WHATWG IPv4 number: `0x..` hex (empty digits are 0), `0..` octal,
/// else decimal. `None` for an empty or malformed part.
fn number(part: &str) -> Option<u64> {
    let (digits, radix) = if let Some(hex) = part.strip_prefix("0x") {
        (hex, 16)
    } else if part.len() > 1 && part.starts_with('0') {
        (&part[1..], 8)
    } else {
        (part, 10)
    };
    if digits.is_empty() {
        return (radix != 10).then_some(0);
    }
    // Bounded: anything longer is over 2^32 whatever the radix.
    if digits.len() > 32 || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u64::from_str_radix(digits, radix).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(text: &str) -> Option<Host> {
        Some(Host::V4(text.parse().unwrap()))
    }

    #[test]
    fn ipv4_number_forms_parse_as_the_runtime_reads_them() {
        for (host, address) in [
            ("127.0.0.1", "127.0.0.1"),
            ("2130706433", "127.0.0.1"),
            ("0x7f.1", "127.0.0.1"),
            ("0X7F.0.0.1", "127.0.0.1"),
            ("127.1", "127.0.0.1"),
            ("0177.0.0.1", "127.0.0.1"),
            ("0x7f000001", "127.0.0.1"),
            ("10.1", "10.0.0.1"),
            ("169.254.43518", "169.254.169.254"),
            ("0", "0.0.0.0"),
            ("0x", "0.0.0.0"),
            ("8.8.8.8.", "8.8.8.8"),
        ] {
            assert_eq!(parse(host), v4(address), "{host}");
        }
    }

    #[test]
    fn malformed_numeric_hosts_fail_as_the_runtime_fails_them() {
        for host in [
            "256.0.0.1",
            "1.2.3.4.5",
            "09.1",
            "1.2.3.09",
            "4294967296",
            "1.256.1",
        ] {
            assert_eq!(parse(host), None, "{host}");
        }
    }

    #[test]
    fn names_are_lowercased_and_lose_one_trailing_dot() {
        assert_eq!(parse("LocalHost."), Some(Host::Domain("localhost".into())));
        assert_eq!(parse("1a.example"), Some(Host::Domain("1a.example".into())));
        assert_eq!(parse("a.0x1g"), Some(Host::Domain("a.0x1g".into())));
    }

    #[test]
    fn ipv6_literals_parse_mapped_forms_to_one_address() {
        assert_eq!(parse("[::ffff:127.0.0.1]"), parse("[::ffff:7f00:1]"));
        assert_eq!(parse("[::1"), None);
        assert_eq!(parse("[::g]"), None);
    }

    #[test]
    fn internal_hosts_are_named_and_public_ones_are_not() {
        for host in [
            "localhost",
            "LOCALHOST.",
            "api.localhost",
            "metadata.google.internal",
            "printer.local",
            "127.0.0.1",
            "2130706433",
            "0x7f.1",
            "127.1",
            "0.0.0.0",
            "0",
            "10.0.0.1",
            "172.16.5.4",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.254",
            "[::1]",
            "[::]",
            "[fe80::1]",
            "[fc00::1]",
            "[fd12:3456::1]",
            "[::ffff:127.0.0.1]",
            "[::ffff:7f00:1]",
            "[::ffff:a9fe:a9fe]",
            "[::10.0.0.1]",
            "[64:ff9b::a00:1]",
        ] {
            let parsed = parse(host).unwrap_or_else(|| panic!("{host} parses"));
            assert!(internal(&parsed).is_some(), "{host} is internal");
        }
        for host in [
            "m1.example.com",
            "localhost.example.com",
            "internal.example.com",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "[2606:4700::1111]",
            "[::ffff:8.8.8.8]",
        ] {
            let parsed = parse(host).unwrap_or_else(|| panic!("{host} parses"));
            assert_eq!(internal(&parsed), None, "{host} is public");
        }
    }
}
