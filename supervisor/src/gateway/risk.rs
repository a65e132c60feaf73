//! Seed 001's MCP risk model: the server score (four axes plus three floors), the tool
//! publish score (base action plus documentation penalty, three floors), their composition
//! and the HITL mitigation. Pure functions over facts the caller gathers; levels are
//! [`RiskLevel`] (the same enum the sandbox uses, scored independently).

use serde::{Serialize, Serializer};
use serde_json::Value;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use stsd_profiles::upstream::{AuthKind, Trust};
use stsd_profiles::RiskLevel;

/// Where a server lives, as far as the transport and auth axes care.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum HostClass {
    Stdio,
    Loopback,
    PrivateLan,
    Public,
}

impl HostClass {
    /// Remote for the floors: anything that is neither a child process nor this machine.
    pub fn is_remote(self) -> bool {
        matches!(self, HostClass::PrivateLan | HostClass::Public)
    }
}

/// Classifies a server by its URL; `None` is a stdio server. A literal IP (or `localhost`)
/// is classified by its range. A DNS name is not resolved (that would make the score depend
/// on the resolver at scoring time): it is PUBLIC unless it is `localhost` / `*.localhost`
/// (LOOPBACK) or ends in `.local`, `.internal` or `.lan` (PRIVATE_LAN, the suffixes mDNS
/// and private zones use). A URL that does not parse is PUBLIC, the class the floors treat
/// as remote.
pub fn classify(url: Option<&str>) -> HostClass {
    let Some(url) = url else {
        return HostClass::Stdio;
    };
    let Some(host) = host_of(url) else {
        return HostClass::Public;
    };
    match host {
        url::Host::Ipv4(ip) => classify_ip(IpAddr::V4(ip)),
        url::Host::Ipv6(ip) => classify_ip(IpAddr::V6(ip)),
        url::Host::Domain(d) => {
            let d = d.trim_end_matches('.').to_ascii_lowercase();
            if d == "localhost" || d.ends_with(".localhost") {
                HostClass::Loopback
            } else if [".local", ".internal", ".lan"]
                .iter()
                .any(|s| d.ends_with(s))
            {
                HostClass::PrivateLan
            } else {
                HostClass::Public
            }
        }
    }
}

/// The host of a URL; a bare `host:port/path` is read as if it had `http://` in front.
fn host_of(url: &str) -> Option<url::Host<String>> {
    let parse = |s: &str| {
        url::Url::parse(s)
            .ok()
            .and_then(|u| u.host().map(|h| h.to_owned()))
    };
    parse(url).or_else(|| parse(&format!("http://{url}")))
}

fn classify_ip(ip: IpAddr) -> HostClass {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => classify_v4(v4),
            None if v6.is_loopback() => HostClass::Loopback,
            // fc00::/7 unique local, fe80::/10 link-local.
            None if (v6.segments()[0] & 0xfe00) == 0xfc00
                || (v6.segments()[0] & 0xffc0) == 0xfe80 =>
            {
                HostClass::PrivateLan
            }
            None if v6 == Ipv6Addr::UNSPECIFIED => HostClass::Loopback,
            None => HostClass::Public,
        },
    }
}

fn classify_v4(ip: Ipv4Addr) -> HostClass {
    let o = ip.octets();
    if ip.is_loopback() || ip.is_unspecified() {
        HostClass::Loopback
    } else if ip.is_private() || ip.is_link_local() || (o[0] == 100 && (o[1] & 0xc0) == 64) {
        // RFC 1918, 169.254/16 and the 100.64/10 shared (CGNAT) range.
        HostClass::PrivateLan
    } else {
        HostClass::Public
    }
}

/// Whether a URL's host matches one of `[gateway] known_hosts`: `example.com` matches that
/// host exactly, `*.example.com` any subdomain of it (not the apex). Case-insensitive.
pub fn matches_known_host(url: &str, patterns: &[String]) -> bool {
    let Some(url::Host::Domain(host)) = host_of(url) else {
        // A literal IP matches only a pattern spelled the same way.
        return host_of(url).is_some_and(|h| {
            let h = h.to_string();
            patterns.iter().any(|p| p.eq_ignore_ascii_case(&h))
        });
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    patterns.iter().any(|p| {
        let p = p.trim().to_ascii_lowercase();
        match p.strip_prefix("*.") {
            Some(base) => host.len() > base.len() + 1 && host.ends_with(&format!(".{base}")),
            None => host == p,
        }
    })
}

/// 90 days in milliseconds: a server not used for longer earns the doc axis' staleness point.
pub const STALE_AFTER_MS: i64 = 90 * 24 * 60 * 60 * 1000;

/// Whether a server last used at `last_used_ms` (None: never) counts as used within 90 days.
pub fn used_within_90_days(last_used_ms: Option<i64>, now_ms: i64) -> bool {
    last_used_ms.is_some_and(|t| now_ms.saturating_sub(t) <= STALE_AFTER_MS)
}

/// The chip text of the floor named `name` (as reports and events carry it).
pub fn floor_chip(name: &str) -> Option<&'static str> {
    Floor::ALL
        .iter()
        .find(|f| f.name() == name)
        .map(|f| f.chip())
}

/// A floor override: a rule that sets the level's minimum regardless of the axis sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Floor {
    /// Server: remote host, no auth, and the server advertises write capability.
    NonLoopbackNoAuthWriteCapability,
    /// Server: remote host, no auth, a user-typed URL not matching any known host.
    NonLoopbackNoAuthTrustUnknown,
    /// Server: OAuth scopes contain admin, write_all, delete_*, *.all or *.admin.
    PrivilegedOauthScope,
    /// Tool: an irreversible verb (delete, drop, purge, wipe, remove, force push) in the name.
    IrreversibleVerb,
    /// Tool: destructiveHint without idempotentHint.
    DestructiveNotIdempotent,
    /// Tool: neither a description nor annotations (floor L4).
    Undocumented,
}

impl Floor {
    /// The trigger's name, as events and span tags carry it.
    pub fn name(self) -> &'static str {
        match self {
            Floor::NonLoopbackNoAuthWriteCapability => "non_loopback_no_auth_write_capability",
            Floor::NonLoopbackNoAuthTrustUnknown => "non_loopback_no_auth_trust_unknown",
            Floor::PrivilegedOauthScope => "privileged_oauth_scope",
            Floor::IrreversibleVerb => "irreversible_verb",
            Floor::DestructiveNotIdempotent => "destructive_not_idempotent",
            Floor::Undocumented => "no_description_no_annotations",
        }
    }

    /// The short text shown beside the level, e.g. `L5 (no-auth-write)`.
    pub fn chip(self) -> &'static str {
        match self {
            Floor::NonLoopbackNoAuthWriteCapability => "no-auth-write",
            Floor::NonLoopbackNoAuthTrustUnknown => "no-auth-unknown",
            Floor::PrivilegedOauthScope => "privileged-scope",
            Floor::IrreversibleVerb => "irreversible-verb",
            Floor::DestructiveNotIdempotent => "destructive",
            Floor::Undocumented => "undocumented",
        }
    }

    /// Every floor.
    pub const ALL: [Floor; 6] = [
        Floor::NonLoopbackNoAuthWriteCapability,
        Floor::NonLoopbackNoAuthTrustUnknown,
        Floor::PrivilegedOauthScope,
        Floor::IrreversibleVerb,
        Floor::DestructiveNotIdempotent,
        Floor::Undocumented,
    ];

    /// The level the floor sets as the minimum.
    pub fn level(self) -> RiskLevel {
        match self {
            Floor::Undocumented => RiskLevel::L4,
            _ => RiskLevel::L5,
        }
    }
}

impl Serialize for Floor {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// The seed's bucketing of an axis sum: <=0 L1, 1 L2, 2 L3, 3 L4, >=4 L5.
pub fn bucket(total: i32) -> RiskLevel {
    match total {
        i32::MIN..=0 => RiskLevel::L1,
        1 => RiskLevel::L2,
        2 => RiskLevel::L3,
        3 => RiskLevel::L4,
        _ => RiskLevel::L5,
    }
}

/// What the server score reads; the caller gathers it from the config, the ledger and the
/// upstream's tool list.
#[derive(Debug, Clone)]
pub struct ServerFacts<'a> {
    pub host: HostClass,
    pub auth: AuthKind,
    /// Catalog trust; None: a user-typed server.
    pub trust: Option<Trust>,
    /// The URL's host matches `[gateway] known_hosts` (see [`matches_known_host`]).
    pub known_host: bool,
    pub docs_url: bool,
    /// Absent is scored as not adequate: nobody vouched for the docs.
    pub docs_adequate: Option<bool>,
    pub used_within_90_days: bool,
    /// Some tool lacks readOnlyHint: true (see [`advertises_write`]).
    pub advertises_write: bool,
    pub oauth_scopes: &'a [String],
}

/// A server's score, axis by axis.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerRisk {
    pub transport: i32,
    pub auth: i32,
    pub trust: i32,
    pub doc: i32,
    pub total: i32,
    pub level: RiskLevel,
    pub floor: Option<Floor>,
}

/// Whether an OAuth scope is privileged: `admin`, `write_all`, `delete_*`, `*.all`,
/// `*.admin`. "Contains admin" is read per segment too (split on `:`, `.`, `/`), so GitHub's
/// `admin:org` and Google's `.../auth/admin.directory.user` count; `badminton` does not.
pub fn is_privileged_scope(scope: &str) -> bool {
    let s = scope.trim().to_ascii_lowercase();
    s == "admin"
        || s == "write_all"
        || s.starts_with("delete_")
        || s.ends_with(".all")
        || s.ends_with(".admin")
        || s.split([':', '.', '/']).any(|seg| seg == "admin")
}

/// The server score (seed 001, McpServerRiskCalculator).
pub fn server_risk(f: &ServerFacts<'_>) -> ServerRisk {
    let local = matches!(f.host, HostClass::Stdio | HostClass::Loopback);
    let transport = i32::from(f.host == HostClass::PrivateLan);
    let auth = if local {
        0
    } else {
        match f.auth {
            AuthKind::None | AuthKind::Oauth => 0,
            AuthKind::ApiKey | AuthKind::Bearer => 1,
            AuthKind::CustomOauth => 2,
        }
    };
    let trust = match f.trust {
        Some(Trust::VendorOfficial) => 0,
        Some(Trust::Community) => 1,
        // A catalog entry with no curation: seed 001's "else 2".
        Some(Trust::None) => 2,
        None if f.known_host => 1,
        None => 2,
    };
    let doc = (i32::from(!f.docs_url)
        + i32::from(f.docs_adequate != Some(true))
        + i32::from(!f.used_within_90_days))
    .min(2);
    let total = transport + auth + trust + doc;
    let no_auth_remote = f.host.is_remote() && f.auth == AuthKind::None;
    let floor = if no_auth_remote && f.advertises_write {
        Some(Floor::NonLoopbackNoAuthWriteCapability)
    } else if no_auth_remote && f.trust.is_none() && !f.known_host {
        Some(Floor::NonLoopbackNoAuthTrustUnknown)
    } else if f.oauth_scopes.iter().any(|s| is_privileged_scope(s)) {
        Some(Floor::PrivilegedOauthScope)
    } else {
        None
    };
    let level = floor.map_or(bucket(total), |fl| bucket(total).max(fl.level()));
    ServerRisk {
        transport,
        auth,
        trust,
        doc,
        total,
        level,
        floor,
    }
}

/// The MCP tool annotations the score reads (None: the hint is absent).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Annotations {
    pub read_only: Option<bool>,
    pub destructive: Option<bool>,
    pub idempotent: Option<bool>,
    pub open_world: Option<bool>,
}

impl Annotations {
    /// Reads `annotations.{readOnlyHint, destructiveHint, idempotentHint, openWorldHint}` off
    /// an MCP tool's JSON; None when the tool has no `annotations` object. A hint that is not
    /// a boolean is absent.
    pub fn from_tool_json(tool: &Value) -> Option<Annotations> {
        let a = tool.get("annotations")?.as_object()?;
        let hint = |k: &str| a.get(k).and_then(Value::as_bool);
        Some(Annotations {
            read_only: hint("readOnlyHint"),
            destructive: hint("destructiveHint"),
            idempotent: hint("idempotentHint"),
            open_world: hint("openWorldHint"),
        })
    }

    /// No hint given at all (an empty `annotations` object counts as unspecified).
    pub fn is_unspecified(&self) -> bool {
        *self == Annotations::default()
    }
}

/// For the server's no-auth-write floor: some tool does not declare readOnlyHint: true (a
/// tool without annotations counts as writing).
pub fn advertises_write<'a>(tools: impl IntoIterator<Item = Option<&'a Annotations>>) -> bool {
    tools
        .into_iter()
        .any(|a| a.and_then(|a| a.read_only) != Some(true))
}

/// The side-effect scope of a tool, when the operator or a catalog states it. Seed 001
/// scores it; nothing states it yet (no config key, no catalog field), so only the tests
/// build it: noticed in issue 32, for the gateway's issue (36) to give it a source.
#[allow(dead_code)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SideEffect {
    Local,
    RemoteRead,
    RemoteWrite,
    RemoteAdmin,
}

/// What the tool score reads.
#[derive(Debug, Clone)]
pub struct ToolFacts<'a> {
    pub name: &'a str,
    pub description: Option<&'a str>,
    pub input_schema: Option<&'a Value>,
    pub annotations: Option<Annotations>,
    pub side_effect: Option<SideEffect>,
    pub sends_user_data: bool,
    /// The server carries a trust signal (vendor-official or community): doc penalty waived.
    pub trusted_server: bool,
}

/// A tool's score.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolRisk {
    pub base: i32,
    pub doc: i32,
    pub total: i32,
    pub level: RiskLevel,
    pub floor: Option<Floor>,
}

/// Shorter than this (in characters, trimmed) a description earns the doc point.
pub const MIN_DESCRIPTION_CHARS: usize = 20;

/// Descriptions that say nothing (compared trimmed, lowercase, without a final period).
const BOILERPLATE: &[&str] = &[
    "todo",
    "tbd",
    "description",
    "no description",
    "n/a",
    "none",
    "placeholder",
    "tool",
    "...",
];

fn weak_description(name: &str, d: Option<&str>) -> bool {
    let Some(d) = d.map(str::trim).filter(|d| !d.is_empty()) else {
        return true;
    };
    let norm = d.trim_end_matches('.').to_lowercase();
    let as_words = |s: &str| s.to_lowercase().replace(['_', '-'], " ");
    d.chars().count() < MIN_DESCRIPTION_CHARS
        || BOILERPLATE.contains(&norm.as_str())
        || as_words(&norm) == as_words(name)
}

/// Fewer than half of the schema's top-level properties carry a non-empty description.
fn under_described(schema: &Value) -> bool {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return false;
    };
    let described = props
        .values()
        .filter(|p| {
            p.get("description")
                .and_then(Value::as_str)
                .is_some_and(|d| !d.trim().is_empty())
        })
        .count();
    !props.is_empty() && described * 2 < props.len()
}

/// The name split into lowercase words: snake_case, kebab-case, dots and camelCase.
fn name_words(name: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut prev_lower = false;
    for c in name.chars() {
        if !c.is_alphanumeric() {
            if !cur.is_empty() {
                words.push(std::mem::take(&mut cur));
            }
            prev_lower = false;
            continue;
        }
        if c.is_uppercase() && prev_lower && !cur.is_empty() {
            words.push(std::mem::take(&mut cur));
        }
        prev_lower = c.is_lowercase() || c.is_ascii_digit();
        cur.extend(c.to_lowercase());
    }
    if !cur.is_empty() {
        words.push(cur);
    }
    words
}

/// The seed's irreversible verbs (delete_, drop_, purge_, wipe_, remove_, force_push), read
/// as words of the name, so `deleteFile`, `repo-delete` and `delete` count and `undelete_x`
/// does not.
pub fn has_irreversible_verb(name: &str) -> bool {
    let w = name_words(name);
    w.iter()
        .any(|w| ["delete", "drop", "purge", "wipe", "remove"].contains(&w.as_str()))
        || w.windows(2).any(|p| p[0] == "force" && p[1] == "push")
        || w.iter().any(|w| w == "forcepush")
}

/// The tool publish score (seed 001, McpToolPublishRiskCalculator).
pub fn tool_risk(f: &ToolFacts<'_>) -> ToolRisk {
    let a = f.annotations.unwrap_or_default();
    let side = match f.side_effect {
        Some(SideEffect::RemoteWrite) => 1,
        Some(SideEffect::RemoteAdmin) => 2,
        _ => 0,
    };
    let base = (i32::from(a.read_only != Some(true))
        + 2 * i32::from(a.destructive == Some(true))
        + i32::from(a.open_world == Some(true))
        - i32::from(a.idempotent == Some(true))
        + side
        + i32::from(f.sends_user_data))
    .max(0);
    let schema = f.input_schema.filter(|s| !s.is_null());
    let doc = if f.trusted_server {
        0
    } else {
        (i32::from(weak_description(f.name, f.description))
            + i32::from(schema.is_none())
            + i32::from(schema.is_some_and(under_described))
            + i32::from(a.is_unspecified()))
        .min(3)
    };
    let total = base + doc;
    let no_description = f.description.is_none_or(|d| d.trim().is_empty());
    let floor = if has_irreversible_verb(f.name) {
        Some(Floor::IrreversibleVerb)
    } else if a.destructive == Some(true) && a.idempotent != Some(true) {
        Some(Floor::DestructiveNotIdempotent)
    } else if no_description && a.is_unspecified() {
        Some(Floor::Undocumented)
    } else {
        None
    };
    // A floor is a minimum: an undocumented tool whose sum already buckets to L5 stays L5.
    let level = floor.map_or(bucket(total), |fl| bucket(total).max(fl.level()));
    ToolRisk {
        base,
        doc,
        total,
        level,
        floor,
    }
}

/// A re-exposed tool's level: server and tool composed, then HITL-mitigated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Composed {
    pub level: RiskLevel,
    /// The floor that decided the level, if one tripped (the higher side's; the server's on
    /// a tie).
    pub floor_trigger: Option<Floor>,
    pub hitl: bool,
    pub level_without_hitl: RiskLevel,
}

/// Seed 001, McpToolRiskComposer: a floor on either side gives the higher of the two levels;
/// otherwise the axis totals add and re-bucket. HITL then lowers one band, floored at L1
/// (applyHitlMitigation).
pub fn compose(server: &ServerRisk, tool: &ToolRisk, hitl: bool) -> Composed {
    let (level, floor_trigger) = if server.floor.is_some() || tool.floor.is_some() {
        if tool.level > server.level {
            (tool.level, tool.floor.or(server.floor))
        } else {
            (server.level, server.floor.or(tool.floor))
        }
    } else {
        (bucket(server.total + tool.total), None)
    };
    Composed {
        level: if hitl {
            crate::approval::mitigated(level)
        } else {
            level
        },
        floor_trigger,
        hitl,
        level_without_hitl: level,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;
    use RiskLevel::*;

    fn scopes(s: &[&str]) -> &'static [String] {
        Box::leak(
            s.iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .into_boxed_slice(),
        )
    }

    /// A stdio, vendor-official, documented, recently used, read-only server: every axis 0.
    fn srv() -> ServerFacts<'static> {
        ServerFacts {
            host: HostClass::Stdio,
            auth: AuthKind::None,
            trust: Some(Trust::VendorOfficial),
            known_host: false,
            docs_url: true,
            docs_adequate: Some(true),
            used_within_90_days: true,
            advertises_write: false,
            oauth_scopes: &[],
        }
    }

    /// One #[test] per row: facts => [transport, auth, trust, doc] level floor.
    macro_rules! server_table {
        ($($name:ident: $facts:expr => [$t:expr, $a:expr, $tr:expr, $d:expr] $level:ident $floor:expr;)+) => {$(
            #[test]
            fn $name() {
                let r = server_risk(&$facts);
                assert_eq!((r.transport, r.auth, r.trust, r.doc), ($t, $a, $tr, $d), "axes");
                assert_eq!(r.total, $t + $a + $tr + $d, "total");
                assert_eq!(r.level, $level, "level");
                assert_eq!(r.floor, $floor, "floor");
            }
        )+};
    }

    server_table! {
        s01_stdio_vendor_documented_is_l1: srv() => [0, 0, 0, 0] L1 None;
        s02_loopback_bearer_auth_scores_zero: ServerFacts { host: HostClass::Loopback,
            auth: AuthKind::Bearer, ..srv() } => [0, 0, 0, 0] L1 None;
        s03_stdio_custom_oauth_scores_zero: ServerFacts { auth: AuthKind::CustomOauth, ..srv() }
            => [0, 0, 0, 0] L1 None;
        s04_private_lan_oauth_standard_is_l2: ServerFacts { host: HostClass::PrivateLan,
            auth: AuthKind::Oauth, ..srv() } => [1, 0, 0, 0] L2 None;
        s05_public_api_key_is_l2: ServerFacts { host: HostClass::Public, auth: AuthKind::ApiKey,
            ..srv() } => [0, 1, 0, 0] L2 None;
        s06_public_bearer_community_is_l3: ServerFacts { host: HostClass::Public,
            auth: AuthKind::Bearer, trust: Some(Trust::Community), ..srv() } => [0, 1, 1, 0] L3 None;
        s07_custom_oauth_community_no_docs_url_sums_to_l5: ServerFacts { host: HostClass::Public,
            auth: AuthKind::CustomOauth, trust: Some(Trust::Community), docs_url: false, ..srv() }
            => [0, 2, 1, 1] L5 None;
        s08_user_typed_known_host_trust_one: ServerFacts { host: HostClass::Public,
            auth: AuthKind::Bearer, trust: None, known_host: true, ..srv() } => [0, 1, 1, 0] L3 None;
        s09_user_typed_unknown_host_with_auth_is_l4: ServerFacts { host: HostClass::Public,
            auth: AuthKind::ApiKey, trust: None, ..srv() } => [0, 1, 2, 0] L4 None;
        s10_doc_axis_capped_at_two: ServerFacts { docs_url: false, docs_adequate: Some(false),
            used_within_90_days: false, ..srv() } => [0, 0, 0, 2] L3 None;
        s11_docs_adequate_false_one_point: ServerFacts { docs_adequate: Some(false), ..srv() }
            => [0, 0, 0, 1] L2 None;
        s12_docs_adequate_absent_counts_as_not_adequate: ServerFacts { docs_adequate: None,
            ..srv() } => [0, 0, 0, 1] L2 None;
        s13_not_used_in_90_days_one_point: ServerFacts { used_within_90_days: false, ..srv() }
            => [0, 0, 0, 1] L2 None;
        s14_floor_public_no_auth_write: ServerFacts { host: HostClass::Public,
            advertises_write: true, ..srv() }
            => [0, 0, 0, 0] L5 Some(Floor::NonLoopbackNoAuthWriteCapability);
        s15_floor_private_lan_no_auth_write: ServerFacts { host: HostClass::PrivateLan,
            advertises_write: true, ..srv() }
            => [1, 0, 0, 0] L5 Some(Floor::NonLoopbackNoAuthWriteCapability);
        s16_floor_no_auth_unknown_host: ServerFacts { host: HostClass::Public, trust: None, ..srv() }
            => [0, 0, 2, 0] L5 Some(Floor::NonLoopbackNoAuthTrustUnknown);
        s17_no_auth_known_host_read_only_no_floor: ServerFacts { host: HostClass::Public,
            trust: None, known_host: true, ..srv() } => [0, 0, 1, 0] L2 None;
        s18_stdio_no_auth_write_unknown_no_floor: ServerFacts { trust: None,
            advertises_write: true, ..srv() } => [0, 0, 2, 0] L3 None;
        s19_loopback_no_auth_unknown_no_floor: ServerFacts { host: HostClass::Loopback,
            trust: None, advertises_write: true, ..srv() } => [0, 0, 2, 0] L3 None;
        s20_bearer_write_no_floor: ServerFacts { host: HostClass::Public, auth: AuthKind::Bearer,
            advertises_write: true, ..srv() } => [0, 1, 0, 0] L2 None;
        s21_floor_privileged_scope: ServerFacts { host: HostClass::Public, auth: AuthKind::Oauth,
            oauth_scopes: scopes(&["repo", "admin:org"]), ..srv() }
            => [0, 0, 0, 0] L5 Some(Floor::PrivilegedOauthScope);
        s22_plain_scopes_no_floor: ServerFacts { host: HostClass::Public, auth: AuthKind::Oauth,
            oauth_scopes: scopes(&["read:user", "repo", "badminton"]), ..srv() }
            => [0, 0, 0, 0] L1 None;
    }

    #[test]
    fn privileged_scope_shapes() {
        for s in [
            "admin",
            "write_all",
            "delete_repo",
            "files.all",
            "Directory.Admin",
            "admin:org",
            "https://www.googleapis.com/auth/admin.directory.user",
        ] {
            assert!(is_privileged_scope(s), "{s}");
        }
        for s in [
            "read",
            "repo",
            "write",
            "files.read",
            "badminton",
            "undelete_x",
            "all",
        ] {
            assert!(!is_privileged_scope(s), "{s}");
        }
    }

    fn schema_described(n: usize, of: usize) -> &'static Value {
        let mut props = serde_json::Map::new();
        for i in 0..of {
            let p = if i < n {
                json!({"type": "string", "description": format!("argument {i}")})
            } else {
                json!({"type": "string"})
            };
            props.insert(format!("p{i}"), p);
        }
        Box::leak(Box::new(json!({"type": "object", "properties": props})))
    }

    fn ann(
        ro: Option<bool>,
        de: Option<bool>,
        id: Option<bool>,
        ow: Option<bool>,
    ) -> Option<Annotations> {
        Some(Annotations {
            read_only: ro,
            destructive: de,
            idempotent: id,
            open_world: ow,
        })
    }

    /// A read-only, well-documented tool on an untrusted server: base 0, doc 0.
    fn tool() -> ToolFacts<'static> {
        ToolFacts {
            name: "get_weather",
            description: Some("Returns the current weather for a city."),
            input_schema: Some(schema_described(1, 1)),
            annotations: ann(Some(true), Some(false), Some(false), Some(false)),
            side_effect: None,
            sends_user_data: false,
            trusted_server: false,
        }
    }

    /// One #[test] per row: facts => [base, doc] level floor.
    macro_rules! tool_table {
        ($($name:ident: $facts:expr => [$b:expr, $d:expr] $level:ident $floor:expr;)+) => {$(
            #[test]
            fn $name() {
                let r = tool_risk(&$facts);
                assert_eq!((r.base, r.doc), ($b, $d), "axes");
                assert_eq!(r.total, $b + $d, "total");
                assert_eq!(r.level, $level, "level");
                assert_eq!(r.floor, $floor, "floor");
            }
        )+};
    }

    tool_table! {
        t01_read_only_documented_is_l1: tool() => [0, 0] L1 None;
        t02_idempotent_minus_one_floored_at_zero: ToolFacts {
            annotations: ann(Some(true), None, Some(true), None), ..tool() } => [0, 0] L1 None;
        t03_read_only_absent_plus_one: ToolFacts {
            annotations: ann(None, Some(false), None, None), ..tool() } => [1, 0] L2 None;
        t04_read_only_false_and_open_world: ToolFacts {
            annotations: ann(Some(false), None, None, Some(true)), ..tool() } => [2, 0] L3 None;
        t05_destructive_idempotent_no_floor: ToolFacts {
            annotations: ann(Some(false), Some(true), Some(true), None), ..tool() } => [2, 0] L3 None;
        t06_floor_destructive_without_idempotent: ToolFacts {
            annotations: ann(Some(false), Some(true), None, None), ..tool() }
            => [3, 0] L5 Some(Floor::DestructiveNotIdempotent);
        t07_remote_write_plus_one: ToolFacts { side_effect: Some(SideEffect::RemoteWrite), ..tool() }
            => [1, 0] L2 None;
        t08_remote_admin_and_user_data_is_l4: ToolFacts {
            side_effect: Some(SideEffect::RemoteAdmin), sends_user_data: true, ..tool() }
            => [3, 0] L4 None;
        t09_remote_read_scores_zero: ToolFacts { side_effect: Some(SideEffect::RemoteRead), ..tool() }
            => [0, 0] L1 None;
        t10_short_description: ToolFacts { description: Some("Gets weather."), ..tool() }
            => [0, 1] L2 None;
        t11_boilerplate_description: ToolFacts { description: Some("TODO"), ..tool() }
            => [0, 1] L2 None;
        t12_description_same_as_name: ToolFacts { name: "fetch_the_current_weather_report",
            description: Some("Fetch the current weather report."), ..tool() } => [0, 1] L2 None;
        t13_absent_input_schema: ToolFacts { input_schema: None, ..tool() } => [0, 1] L2 None;
        t14_under_half_properties_described: ToolFacts {
            input_schema: Some(schema_described(1, 3)), ..tool() } => [0, 1] L2 None;
        t15_exactly_half_described_is_enough: ToolFacts {
            input_schema: Some(schema_described(2, 4)), ..tool() } => [0, 0] L1 None;
        t16_unspecified_annotations: ToolFacts { annotations: None, ..tool() } => [1, 1] L3 None;
        t17_empty_annotations_object_is_unspecified: ToolFacts {
            annotations: Some(Annotations::default()), ..tool() } => [1, 1] L3 None;
        t18_doc_penalty_three_sums_to_l5: ToolFacts { description: Some("tbd"), input_schema: None,
            annotations: None, ..tool() } => [1, 3] L5 None;
        t19_trusted_server_waives_doc_penalty: ToolFacts { description: Some("tbd"),
            input_schema: None, annotations: None, trusted_server: true, ..tool() } => [1, 0] L2 None;
        t20_floor_undocumented_lifts_to_l4: ToolFacts { description: None, annotations: None,
            trusted_server: true, ..tool() } => [1, 0] L4 Some(Floor::Undocumented);
        t21_floor_undocumented_does_not_lower_l5: ToolFacts { description: Some("  "),
            annotations: None, input_schema: None, ..tool() } => [1, 3] L5 Some(Floor::Undocumented);
        t22_floor_irreversible_verb: ToolFacts { name: "delete_file", description:
            Some("Deletes one file under the workspace."), ..tool() }
            => [0, 0] L5 Some(Floor::IrreversibleVerb);
        t23_floor_irreversible_camel_case: ToolFacts { name: "gitForcePush", ..tool() }
            => [0, 0] L5 Some(Floor::IrreversibleVerb);
        t24_trusted_waiver_keeps_floors: ToolFacts { name: "drop_table", trusted_server: true,
            ..tool() } => [0, 0] L5 Some(Floor::IrreversibleVerb);
    }

    #[test]
    fn irreversible_verbs_are_words_of_the_name() {
        for n in [
            "delete_file",
            "drop_table",
            "purge_cache",
            "wipe_disk",
            "remove_user",
            "force_push",
            "repo-delete",
            "deleteFile",
            "delete",
            "git.force-push",
        ] {
            assert!(has_irreversible_verb(n), "{n}");
        }
        for n in [
            "undelete_file",
            "get_weather",
            "list_drops",
            "remover",
            "push",
            "force",
        ] {
            assert!(!has_irreversible_verb(n), "{n}");
        }
    }

    fn server_at(total: i32, floor: Option<Floor>) -> ServerRisk {
        let level = floor.map_or(bucket(total), |f| f.level());
        ServerRisk {
            transport: 0,
            auth: 0,
            trust: total,
            doc: 0,
            total,
            level,
            floor,
        }
    }

    fn tool_at(total: i32, floor: Option<Floor>) -> ToolRisk {
        let level = floor.map_or(bucket(total), |f| bucket(total).max(f.level()));
        ToolRisk {
            base: total,
            doc: 0,
            total,
            level,
            floor,
        }
    }

    #[test]
    fn compose_without_floors_adds_totals_and_rebuckets() {
        let c = compose(&server_at(1, None), &tool_at(2, None), false);
        assert_eq!(
            (c.level, c.level_without_hitl, c.floor_trigger),
            (L4, L4, None)
        );
        // L2 + L2 would be L2 by the max; the sum re-buckets to L3.
        assert_eq!(
            compose(&server_at(1, None), &tool_at(1, None), false).level,
            L3
        );
    }

    #[test]
    fn compose_with_hitl_lowers_one_band() {
        let c = compose(&server_at(1, None), &tool_at(2, None), true);
        assert_eq!((c.level, c.level_without_hitl, c.hitl), (L3, L4, true));
    }

    #[test]
    fn compose_hitl_floors_at_l1() {
        let c = compose(&server_at(0, None), &tool_at(0, None), true);
        assert_eq!((c.level, c.level_without_hitl), (L1, L1));
        assert_eq!(
            compose(&server_at(0, None), &tool_at(1, None), true).level,
            L1
        );
    }

    #[test]
    fn compose_server_floor_takes_the_higher_level() {
        let c = compose(
            &server_at(0, Some(Floor::PrivilegedOauthScope)),
            &tool_at(0, None),
            false,
        );
        assert_eq!(
            (c.level, c.floor_trigger),
            (L5, Some(Floor::PrivilegedOauthScope))
        );
        let c = compose(
            &server_at(0, Some(Floor::PrivilegedOauthScope)),
            &tool_at(0, None),
            true,
        );
        assert_eq!((c.level, c.level_without_hitl), (L4, L5));
    }

    #[test]
    fn compose_tool_floor_uses_max_not_sum() {
        // Without the floor rule the sum 2 + 1 would re-bucket to L4; the max is L4 (floor).
        let c = compose(
            &server_at(2, None),
            &tool_at(1, Some(Floor::Undocumented)),
            false,
        );
        assert_eq!((c.level, c.floor_trigger), (L4, Some(Floor::Undocumented)));
        // A floor on one side: the higher side wins even if it has no floor itself.
        let c = compose(
            &server_at(4, None),
            &tool_at(0, Some(Floor::Undocumented)),
            false,
        );
        assert_eq!((c.level, c.floor_trigger), (L5, Some(Floor::Undocumented)));
        // With a floor, small totals do not add: L2 server + L4-floored tool stays L4.
        let c = compose(
            &server_at(1, None),
            &tool_at(3, Some(Floor::Undocumented)),
            false,
        );
        assert_eq!(c.level, L4);
    }

    #[test]
    fn bucket_boundaries() {
        let got: Vec<RiskLevel> = (-1..=5).map(bucket).collect();
        assert_eq!(got, [L1, L1, L2, L3, L4, L5, L5]);
    }

    #[test]
    fn classify_by_url() {
        let c = |u: &str| classify(Some(u));
        assert_eq!(classify(None), HostClass::Stdio);
        assert_eq!(c("http://127.0.0.1:8080/mcp"), HostClass::Loopback);
        assert_eq!(c("http://localhost:3000"), HostClass::Loopback);
        assert_eq!(c("http://[::1]/mcp"), HostClass::Loopback);
        assert_eq!(c("http://10.1.2.3/mcp"), HostClass::PrivateLan);
        assert_eq!(c("https://192.168.0.7"), HostClass::PrivateLan);
        assert_eq!(c("http://172.16.0.1"), HostClass::PrivateLan);
        assert_eq!(c("http://169.254.1.1"), HostClass::PrivateLan);
        assert_eq!(c("http://[fd00::1]/"), HostClass::PrivateLan);
        assert_eq!(c("http://[::ffff:10.0.0.1]/"), HostClass::PrivateLan);
        assert_eq!(c("http://printer.local/mcp"), HostClass::PrivateLan);
        assert_eq!(c("https://mcp.corp.internal"), HostClass::PrivateLan);
        assert_eq!(c("http://nas.lan:9000"), HostClass::PrivateLan);
        assert_eq!(c("https://mcp.example.com/mcp"), HostClass::Public);
        assert_eq!(c("https://8.8.8.8/"), HostClass::Public);
        assert_eq!(c("http://172.32.0.1"), HostClass::Public);
        assert_eq!(c("mcp.example.com:8080/mcp"), HostClass::Public);
        assert_eq!(c("localhost:8080"), HostClass::Loopback);
        assert_eq!(c("not a url"), HostClass::Public);
    }

    #[test]
    fn known_host_patterns() {
        let p = vec![
            "*.githubcopilot.com".to_string(),
            "mcp.example.com".to_string(),
        ];
        assert!(matches_known_host("https://api.githubcopilot.com/mcp", &p));
        assert!(matches_known_host("https://MCP.Example.com/x", &p));
        assert!(!matches_known_host("https://githubcopilot.com/mcp", &p));
        assert!(!matches_known_host("https://evilgithubcopilot.com/mcp", &p));
        assert!(!matches_known_host("https://other.example.com", &p));
    }

    #[test]
    fn annotations_from_mcp_tool_json() {
        let t = json!({"name": "x", "annotations": {"readOnlyHint": true, "destructiveHint": false,
            "openWorldHint": "yes"}});
        let a = Annotations::from_tool_json(&t).unwrap();
        assert_eq!(
            a,
            Annotations {
                read_only: Some(true),
                destructive: Some(false),
                idempotent: None,
                open_world: None
            }
        );
        assert_eq!(Annotations::from_tool_json(&json!({"name": "x"})), None);
    }

    #[test]
    fn advertises_write_unless_every_tool_is_read_only() {
        let ro = Annotations {
            read_only: Some(true),
            ..Annotations::default()
        };
        let rw = Annotations {
            read_only: Some(false),
            ..Annotations::default()
        };
        assert!(!advertises_write([Some(&ro), Some(&ro)]));
        assert!(advertises_write([Some(&ro), Some(&rw)]));
        assert!(advertises_write([Some(&ro), None]));
        assert!(!advertises_write(std::iter::empty()));
    }

    #[test]
    fn ninety_days() {
        let now = 200 * 24 * 3600 * 1000;
        assert!(used_within_90_days(Some(now - STALE_AFTER_MS), now));
        assert!(!used_within_90_days(Some(now - STALE_AFTER_MS - 1), now));
        assert!(!used_within_90_days(None, now));
    }

    #[test]
    fn serializes_camel_case_with_floor_name() {
        let r = server_risk(&ServerFacts {
            host: HostClass::Public,
            trust: None,
            ..srv()
        });
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["floor"], "non_loopback_no_auth_trust_unknown");
        assert_eq!(v["level"], "L5");
        let c = compose(&r, &tool_at(0, None), true);
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["floorTrigger"], "non_loopback_no_auth_trust_unknown");
        assert_eq!(v["levelWithoutHitl"], "L5");
        assert_eq!(
            Floor::NonLoopbackNoAuthTrustUnknown.chip(),
            "no-auth-unknown"
        );
    }
}
