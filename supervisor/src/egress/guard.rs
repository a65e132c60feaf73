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
    /// The refused address, when an address rule refused.
    pub ip: Option<IpAddr>,
}

impl Refusal {
    fn with_ip(mut self, ip: IpAddr) -> Refusal {
        self.ip = Some(ip);
        self
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[fetch] denied: {}: {}", self.rule, self.detail)
    }
}

pub fn refuse(rule: &'static str, detail: impl Into<String>) -> Refusal {
    Refusal {
        rule,
        detail: detail.into(),
        ip: None,
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
    if input.len() > 8 * 1024 {
        return Err(refuse(
            "url-too-long",
            format!("{} bytes; the limit is 8192", input.len()),
        ));
    }
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
    let raw = entry.trim().to_ascii_lowercase();
    let (wild, rest) = match raw.strip_prefix("*.") {
        Some(r) => (true, r.trim_end_matches('.').to_string()),
        None => (false, raw.trim_end_matches('.').to_string()),
    };
    if wild && rest.trim_matches('.').is_empty() {
        return "*.".into(); // names no domain; matches nothing
    }
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
            // `*.` alone (or `*..`) names no domain: it matches nothing.
            Some(apex) if apex.trim_matches('.').is_empty() => false,
            Some(apex) => host == apex || host.ends_with(&format!(".{apex}")),
            None => !e.is_empty() && host == e,
        }
    })
}

/// A refused range: the rule's name (stable, in the SECURITY error) and the range itself.
type Range = (&'static str, &'static str);

fn v4_rule(a: Ipv4Addr) -> Option<Range> {
    let o = a.octets();
    Some(match o {
        [0, 0, 0, 0] => ("unspecified", "0.0.0.0"),
        [0, ..] => ("this-network", "0.0.0.0/8"),
        [10, ..] => ("private", "10.0.0.0/8"),
        [100, b, ..] if (64..128).contains(&b) => ("cgnat", "100.64.0.0/10"),
        [127, ..] => ("loopback", "127.0.0.0/8"),
        [169, 254, ..] => ("link-local", "169.254.0.0/16"),
        [172, b, ..] if (16..32).contains(&b) => ("private", "172.16.0.0/12"),
        [192, 0, 0, _] => ("ietf-protocol", "192.0.0.0/24"),
        [192, 0, 2, _] => ("documentation", "192.0.2.0/24"),
        [198, 51, 100, _] => ("documentation", "198.51.100.0/24"),
        [203, 0, 113, _] => ("documentation", "203.0.113.0/24"),
        [192, 88, 99, _] => ("6to4-relay", "192.88.99.0/24"),
        [192, 168, ..] => ("private", "192.168.0.0/16"),
        [198, 18 | 19, ..] => ("benchmarking", "198.18.0.0/15"),
        [255, 255, 255, 255] => ("broadcast", "255.255.255.255"),
        [224..=239, ..] => ("multicast", "224.0.0.0/4"),
        [240..=255, ..] => ("reserved", "240.0.0.0/4"),
        _ => return None,
    })
}

fn v4_of(hi: u16, lo: u16) -> Ipv4Addr {
    Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8)
}

fn v6_rule(a: Ipv6Addr) -> Option<Range> {
    let s = a.segments();
    if a.is_unspecified() {
        return Some(("unspecified", "::"));
    }
    if a.is_loopback() {
        return Some(("loopback", "::1"));
    }
    // Forms that embed an IPv4 address are judged by that address: the rule is the embedded
    // address's, the range names the form.
    if let Some(v4) = a.to_ipv4_mapped() {
        return v4_rule(v4).map(|(rule, _)| (rule, "IPv4-mapped ::ffff:0:0/96"));
    }
    if s[0..6] == [0, 0, 0, 0, 0, 0] {
        return Some(
            v4_rule(v4_of(s[6], s[7]))
                .map(|(rule, _)| (rule, "IPv4-compatible ::/96"))
                .unwrap_or(("ipv4-compatible", "::/96 (deprecated)")),
        );
    }
    // 64:ff9b::/96 (well-known) and 64:ff9b:1::/48 (local use) translate to IPv4 anywhere.
    if s[0] == 0x64 && s[1] == 0xff9b {
        return Some(("nat64", "64:ff9b::/32 NAT64 prefixes"));
    }
    if s[0] == 0x2002 {
        if let Some((rule, _)) = v4_rule(v4_of(s[1], s[2])) {
            return Some((rule, "6to4 2002::/16"));
        }
    }
    Some(match s[0] {
        x if x & 0xfe00 == 0xfc00 => ("unique-local", "fc00::/7"),
        x if x & 0xffc0 == 0xfe80 => ("link-local", "fe80::/10"),
        x if x & 0xffc0 == 0xfec0 => ("site-local", "fec0::/10 (deprecated)"),
        x if x & 0xff00 == 0xff00 => ("multicast", "ff00::/8"),
        0x2001 if s[1] == 0 => ("teredo", "2001::/32"),
        0x2001 if s[1] == 0xdb8 => ("documentation", "2001:db8::/32"),
        0x0100 if s[1..4] == [0, 0, 0] => ("discard", "100::/64"),
        _ => return None,
    })
}

/// The rule and range that refuse `ip` in strict and allowlist modes, or None for a public
/// address.
pub fn address_rule(ip: IpAddr) -> Option<Range> {
    match ip {
        IpAddr::V4(a) => v4_rule(a),
        IpAddr::V6(a) => v6_rule(a),
    }
}

/// The operator-trusted range `ip` falls in, if any.
pub fn trusted_range(ip: IpAddr, trusted: &[ipnet_lite::Net]) -> Option<ipnet_lite::Net> {
    trusted.iter().copied().find(|n| n.contains(ip))
}

fn refuse_address(what: String, ip: IpAddr, (rule, range): Range) -> Refusal {
    refuse(rule, format!("{what} ({range})")).with_ip(ip)
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
        if trusted_range(ip, trusted).is_none() {
            if let Some(r) = address_rule(ip) {
                return Err(refuse_address(ip.to_string(), ip, r));
            }
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
    for &ip in addrs {
        if trusted_range(ip, trusted).is_some() {
            continue;
        }
        if let Some(r) = address_rule(ip) {
            return Err(refuse_address(format!("{host} resolves to {ip}"), ip, r));
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

    impl std::fmt::Display for Net {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{}/{}", self.addr, self.prefix)
        }
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
            // An IPv4-mapped IPv6 address is the IPv4 address it maps.
            let ip = match ip {
                IpAddr::V6(a) => a.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
                v4 => v4,
            };
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
        for (url, want) in [
            ("http://127.0.0.1/", "loopback"),
            ("http://127.1.2.3:8080/", "loopback"),
            ("http://0.0.0.0/", "unspecified"),
            ("http://0/", "unspecified"),
            ("http://0.1.2.3/", "this-network"),
            ("http://[::1]/", "loopback"),
            ("http://[::]/", "unspecified"),
            ("http://[::ffff:127.0.0.1]/", "loopback"),
            ("http://[::ffff:10.0.0.1]/", "private"),
            ("http://2130706433/", "loopback"),
            ("http://0x7f.1/", "loopback"),
            ("http://017700000001/", "loopback"),
            ("http://169.254.169.254/latest/meta-data", "link-local"),
            ("http://10.1.2.3/", "private"),
            ("http://172.16.0.1/", "private"),
            ("http://192.168.1.1/", "private"),
            ("http://100.64.0.1/", "cgnat"),
            ("http://192.0.0.8/", "ietf-protocol"),
            ("http://198.18.0.1/", "benchmarking"),
            ("http://240.0.0.1/", "reserved"),
            ("http://255.255.255.255/", "broadcast"),
            ("http://224.0.0.1/", "multicast"),
            ("http://[fd00::1]/", "unique-local"),
            ("http://[fe80::1]/", "link-local"),
            ("http://[64:ff9b::7f00:1]/", "nat64"),
            ("http://[64:ff9b::808:808]/", "nat64"),
            ("http://[::127.0.0.1]/", "loopback"),
            ("http://[2002:7f00:1::]/", "loopback"),
            ("http://[ff02::1]/", "multicast"),
            ("http://api.example.com@127.0.0.1/", "loopback"),
        ] {
            assert_eq!(rule(url), want, "{url}");
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
        for nothing in ["*.", "*..", "", "."] {
            assert!(
                !host_allowed("anything", &[nothing.to_string()]),
                "{nothing:?}"
            );
        }
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
        assert_eq!(r.err().map(|r| r.rule), Some("private"));
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
