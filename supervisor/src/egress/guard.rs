//! The egress guard (network-egress issue): which URLs, hosts and addresses a tool's `fetch`
//! may reach, as pure functions. The broker applies them to every hop and connects only to an
//! address that was checked (no second resolution). Every refusal names its rule.
//!
//! URLs are parsed as WHATWG does (the `url` crate), so `2130706433`, `0x7f.1`,
//! `017700000001` and `user@127.0.0.1` all arrive here as the IPv4 address they mean, and
//! internationalised names as punycode.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use stsd_protocol::NetworkMode;

/// Why a request was refused. `rule` is stable and appears in the SECURITY error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub rule: &'static str,
    pub detail: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[fetch] denied: {}: {}", self.rule, self.detail)
    }
}

fn refuse(rule: &'static str, detail: impl Into<String>) -> Refusal {
    Refusal {
        rule,
        detail: detail.into(),
    }
}

/// A request target after parsing: scheme, ASCII host (lowercase, no trailing dot), port, and
/// the address when the host is an IP literal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub url: url::Url,
    pub host: String,
    pub port: u16,
    pub ip: Option<IpAddr>,
}

pub fn parse_target(input: &str) -> Result<Target, Refusal> {
    let url = url::Url::parse(input).map_err(|e| refuse("invalid-url", format!("{input}: {e}")))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(refuse(
            "unsupported-scheme",
            format!("{}: only http and https", url.scheme()),
        ));
    }
    let (host, ip) = match url.host() {
        Some(url::Host::Domain(d)) => (d.trim_end_matches('.').to_ascii_lowercase(), None),
        Some(url::Host::Ipv4(a)) => (a.to_string(), Some(IpAddr::V4(a))),
        Some(url::Host::Ipv6(a)) => (a.to_string(), Some(IpAddr::V6(a))),
        None => return Err(refuse("invalid-url", format!("{input}: no host"))),
    };
    let port = url
        .port_or_known_default()
        .unwrap_or(if url.scheme() == "https" { 443 } else { 80 });
    Ok(Target {
        url,
        host,
        port,
        ip,
    })
}

/// An allowlist entry in the same form as a parsed host (IDNA to ASCII, lowercase, no
/// trailing dot), keeping a leading `*.`.
fn normalise_entry(entry: &str) -> String {
    let e = entry.trim().trim_end_matches('.').to_ascii_lowercase();
    let (wild, rest) = match e.strip_prefix("*.") {
        Some(r) => (true, r.to_string()),
        None => (false, e.clone()),
    };
    let ascii = match url::Host::parse(&rest) {
        Ok(url::Host::Domain(d)) => d,
        Ok(other) => other.to_string(),
        Err(_) => rest,
    };
    if wild {
        format!("*.{ascii}")
    } else {
        ascii
    }
}

/// allowlist mode: exact host (case-insensitive, trailing dot ignored), `*.example.com` for the
/// apex and every subdomain, `*` for any host; an empty list allows nothing.
pub fn host_allowed(host: &str, allowlist: &[String]) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    allowlist.iter().map(|e| normalise_entry(e)).any(|e| {
        if e == "*" {
            return true;
        }
        match e.strip_prefix("*.") {
            Some(apex) => host == apex || host.ends_with(&format!(".{apex}")),
            None => host == e,
        }
    })
}

fn v4_rule(a: Ipv4Addr) -> Option<&'static str> {
    let o = a.octets();
    Some(match o {
        [0, ..] => "this-network 0.0.0.0/8",
        [10, ..] => "private 10.0.0.0/8",
        [100, b, ..] if (64..128).contains(&b) => "cgnat 100.64.0.0/10",
        [127, ..] => "loopback 127.0.0.0/8",
        [169, 254, ..] => "link-local 169.254.0.0/16",
        [172, b, ..] if (16..32).contains(&b) => "private 172.16.0.0/12",
        [192, 0, 0, _] => "ietf-protocol 192.0.0.0/24",
        [192, 0, 2, _] | [198, 51, 100, _] | [203, 0, 113, _] => "documentation (TEST-NET)",
        [192, 88, 99, _] => "6to4-relay 192.88.99.0/24",
        [192, 168, ..] => "private 192.168.0.0/16",
        [198, b, ..] if b == 18 || b == 19 => "benchmarking 198.18.0.0/15",
        [255, 255, 255, 255] => "broadcast 255.255.255.255",
        [a0, ..] if (224..240).contains(&a0) => "multicast 224.0.0.0/4",
        [a0, ..] if a0 >= 240 => "reserved 240.0.0.0/4",
        _ => return None,
    })
}

fn v6_rule(a: Ipv6Addr) -> Option<&'static str> {
    let s = a.segments();
    if a.is_unspecified() {
        return Some("unspecified ::");
    }
    if a.is_loopback() {
        return Some("loopback ::1");
    }
    // Forms that embed an IPv4 address are judged by that address.
    if let Some(v4) = a.to_ipv4_mapped() {
        return v4_rule(v4)
            .map(|_| "ipv4-mapped form of a refused address")
            .or(None);
    }
    if s[0..6] == [0, 0, 0, 0, 0, 0] {
        let v4 = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
        return Some(
            v4_rule(v4)
                .map(|_| "ipv4-compatible form of a refused address")
                .unwrap_or("ipv4-compatible ::/96 (deprecated)"),
        );
    }
    if s[0] == 0x64 && s[1] == 0xff9b {
        return Some("nat64 64:ff9b::/96");
    }
    if s[0] == 0x2002 {
        let v4 = Ipv4Addr::new((s[1] >> 8) as u8, s[1] as u8, (s[2] >> 8) as u8, s[2] as u8);
        if v4_rule(v4).is_some() {
            return Some("6to4 form of a refused address");
        }
    }
    Some(match s[0] {
        x if x & 0xfe00 == 0xfc00 => "unique-local fc00::/7",
        x if x & 0xffc0 == 0xfe80 => "link-local fe80::/10",
        x if x & 0xffc0 == 0xfec0 => "site-local fec0::/10 (deprecated)",
        x if x & 0xff00 == 0xff00 => "multicast ff00::/8",
        0x2001 if s[1] == 0 => "teredo 2001::/32",
        0x2001 if s[1] == 0xdb8 => "documentation 2001:db8::/32",
        0x0100 if s[1..4] == [0, 0, 0] => "discard 100::/64",
        _ => return None,
    })
}

/// The rule that refuses `ip` in strict and allowlist modes, or None when it is a public
/// address. `trusted` are operator-configured ranges allowed anyway (private services).
pub fn address_rule(ip: IpAddr, trusted: &[ipnet_lite::Net]) -> Option<&'static str> {
    if trusted.iter().any(|n| n.contains(ip)) {
        return None;
    }
    match ip {
        IpAddr::V4(a) => v4_rule(a),
        IpAddr::V6(a) => v6_rule(a),
    }
}

/// Checks a target before any connection: scheme (already by parsing), the host against the
/// mode, and an IP literal against the address rules.
pub fn check_target(
    t: &Target,
    mode: NetworkMode,
    hosts: &[String],
    trusted: &[ipnet_lite::Net],
) -> Result<(), Refusal> {
    match mode {
        NetworkMode::Blocked => {
            return Err(refuse(
                "network-blocked",
                "this tool's posture grants no network",
            ))
        }
        NetworkMode::Open => return Ok(()),
        NetworkMode::Allowlist => {
            if !host_allowed(&t.host, hosts) {
                return Err(refuse("host-not-in-allowlist", t.host.clone()));
            }
        }
        NetworkMode::Strict => {}
    }
    if let Some(ip) = t.ip {
        if let Some(rule) = address_rule(ip, trusted) {
            return Err(refuse("private-address", format!("{ip} ({rule})")));
        }
    }
    Ok(())
}

/// Checks every address a name resolved to: one refused address refuses the request (a name
/// that resolves to a public and a private address is not half-allowed).
pub fn check_resolved(
    host: &str,
    addrs: &[IpAddr],
    mode: NetworkMode,
    trusted: &[ipnet_lite::Net],
) -> Result<(), Refusal> {
    if addrs.is_empty() {
        return Err(refuse("dns", format!("{host} has no address")));
    }
    if mode == NetworkMode::Open {
        return Ok(());
    }
    for ip in addrs {
        if let Some(rule) = address_rule(*ip, trusted) {
            return Err(refuse(
                "private-address",
                format!("{host} resolves to {ip} ({rule})"),
            ));
        }
    }
    Ok(())
}

/// CIDR ranges for the operator's trusted list, small enough to keep here.
pub mod ipnet_lite {
    use std::net::IpAddr;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Net {
        addr: IpAddr,
        prefix: u8,
    }

    impl Net {
        pub fn parse(s: &str) -> Option<Net> {
            let (a, p) = s.split_once('/').unwrap_or((s, ""));
            let addr: IpAddr = a.parse().ok()?;
            let max = if addr.is_ipv4() { 32 } else { 128 };
            let prefix = if p.is_empty() { max } else { p.parse().ok()? };
            (prefix <= max).then_some(Net { addr, prefix })
        }

        pub fn contains(&self, ip: IpAddr) -> bool {
            match (self.addr, ip) {
                (IpAddr::V4(n), IpAddr::V4(a)) => {
                    let mask = if self.prefix == 0 {
                        0
                    } else {
                        u32::MAX << (32 - self.prefix)
                    };
                    u32::from(n) & mask == u32::from(a) & mask
                }
                (IpAddr::V6(n), IpAddr::V6(a)) => {
                    let mask = if self.prefix == 0 {
                        0
                    } else {
                        u128::MAX << (128 - self.prefix)
                    };
                    u128::from(n) & mask == u128::from(a) & mask
                }
                _ => false,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strict(url: &str) -> Result<(), Refusal> {
        let t = parse_target(url)?;
        check_target(&t, NetworkMode::Strict, &[], &[])
    }

    fn rule(url: &str) -> &'static str {
        strict(url).err().map(|r| r.rule).unwrap_or("allowed")
    }

    #[test]
    fn literal_private_addresses_in_every_spelling_are_refused() {
        for url in [
            "http://127.0.0.1/",
            "http://0.0.0.0/",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://2130706433/",
            "http://0x7f.1/",
            "http://017700000001/",
            "http://169.254.169.254/latest/meta-data",
            "http://10.1.2.3/",
            "http://172.16.0.1/",
            "http://192.168.1.1/",
            "http://100.64.0.1/",
            "http://192.0.0.8/",
            "http://198.18.0.1/",
            "http://240.0.0.1/",
            "http://255.255.255.255/",
            "http://224.0.0.1/",
            "http://[fd00::1]/",
            "http://[fe80::1]/",
            "http://[64:ff9b::7f00:1]/",
            "http://[::127.0.0.1]/",
            "http://[2002:7f00:1::]/",
            "http://[ff02::1]/",
            "http://api.example.com@127.0.0.1/",
            "http://0/",
        ] {
            assert_eq!(rule(url), "private-address", "{url}");
        }
        assert_eq!(rule("http://93.184.215.14/"), "allowed");
        assert_eq!(rule("http://[2606:4700::1111]/"), "allowed");
    }

    #[test]
    fn only_http_and_https() {
        for url in [
            "file:///etc/passwd",
            "ftp://example.com/",
            "data:text/plain,hi",
            "gopher://x/",
            "javascript:alert(1)",
        ] {
            assert_eq!(rule(url), "unsupported-scheme", "{url}");
        }
        assert_eq!(rule("not a url"), "invalid-url");
    }

    #[test]
    fn allowlist_matching() {
        let list = vec!["api.github.com".to_string(), "*.example.org".to_string()];
        assert!(host_allowed("api.github.com", &list));
        assert!(
            host_allowed("API.GitHub.com.", &list),
            "case and a trailing dot are ignored"
        );
        assert!(host_allowed("example.org", &list), "*. matches the apex");
        assert!(host_allowed("a.b.example.org", &list));
        assert!(!host_allowed("evilexample.org", &list));
        assert!(!host_allowed("github.com", &list));
        assert!(!host_allowed("api.github.com.evil.net", &list));
        assert!(
            !host_allowed("anything", &[]),
            "an empty list allows nothing"
        );
        assert!(host_allowed("anything", &["*".to_string()]));
        // An internationalised name that merely looks like an allowed one does not match.
        let t = parse_target("https://аpi.github.com/").unwrap_or_else(|e| panic!("{e}"));
        assert!(t.host.starts_with("xn--"), "{}", t.host);
        assert!(!host_allowed(&t.host, &list));
        let refusal = check_target(&t, NetworkMode::Allowlist, &list, &[]).err();
        assert_eq!(refusal.map(|r| r.rule), Some("host-not-in-allowlist"));
    }

    #[test]
    fn a_name_with_any_private_address_is_refused() {
        let public: IpAddr = "93.184.215.14"
            .parse()
            .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        let private: IpAddr = "10.0.0.5"
            .parse()
            .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        assert!(check_resolved("h", &[public], NetworkMode::Strict, &[]).is_ok());
        let r = check_resolved("h", &[public, private], NetworkMode::Strict, &[]);
        assert_eq!(r.err().map(|r| r.rule), Some("private-address"));
        assert!(
            check_resolved("h", &[private], NetworkMode::Open, &[]).is_ok(),
            "open mode reaches private ranges"
        );
        assert_eq!(
            check_resolved("h", &[], NetworkMode::Strict, &[])
                .err()
                .map(|r| r.rule),
            Some("dns")
        );
        let trusted = [ipnet_lite::Net::parse("10.0.0.0/24").unwrap_or_else(|| unreachable!())];
        assert!(
            check_resolved("h", &[private], NetworkMode::Strict, &trusted).is_ok(),
            "an operator-trusted range"
        );
    }

    #[test]
    fn blocked_and_open_modes() {
        let t = parse_target("http://127.0.0.1/").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            check_target(&t, NetworkMode::Blocked, &[], &[])
                .err()
                .map(|r| r.rule),
            Some("network-blocked")
        );
        assert!(check_target(&t, NetworkMode::Open, &[], &[]).is_ok());
    }
}
