//! Layer 2 of spec §15: the cross-field invariants of §4 to §10, on top of the shape checks the
//! reader already made. Layer 3 (resolver, Local Pass) lives in `stsd-profiles` and the worker.

use crate::diag::{pointer, Code, Diagnostic};
use crate::envvar;
use crate::spec::{read_spec, ToolSpec};
use serde_json::Value;

/// The one accepted `codeType` today (§8.1).
pub const CODE_TYPE_JAVASCRIPT: &str = "Javascript";
/// §9.2.
pub const MAX_TAGS: usize = 2;

/// A spec read and checked: the typed view (when the document is an object) and every finding.
#[derive(Debug, Clone)]
pub struct Validated {
    pub spec: Option<ToolSpec>,
    pub diagnostics: Vec<Diagnostic>,
}

impl Validated {
    pub fn is_valid(&self) -> bool {
        self.spec.is_some() && !self.diagnostics.iter().any(Diagnostic::is_error)
    }

    pub fn errors(&self) -> impl Iterator<Item = &Diagnostic> {
        self.diagnostics.iter().filter(|d| d.is_error())
    }
}

/// Layers 1 and 2 for one spec document.
pub fn validate_document(doc: &Value) -> Validated {
    let (spec, mut diagnostics) = read_spec(doc);
    if let Some(spec) = &spec {
        check_invariants(spec, &mut diagnostics);
    }
    Validated { spec, diagnostics }
}

/// §4.2 slug: lowercase alphanumerics plus `-` or `_`.
pub fn is_slug(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_'))
}

/// Params and static variables are bound as top-level identifiers (§8.2); a name that is not an
/// ASCII JavaScript identifier can only be reached through `globalThis[...]`.
pub fn is_js_identifier(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z' | b'A'..=b'Z' | b'_' | b'$'))
        && bytes.all(|b| matches!(b, b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'$'))
}

fn check_invariants(spec: &ToolSpec, out: &mut Vec<Diagnostic>) {
    let inv = |at: String, msg: String| Diagnostic::error(Code::SpecInvariant, at, msg);
    let warn = |at: String, msg: String| Diagnostic::warning(Code::SpecInvariant, at, msg);
    let already = |out: &Vec<Diagnostic>, at: &str| out.iter().any(|d| d.pointer == at);

    // §4.2 name.
    if spec.name.trim().is_empty() {
        if !already(out, "/name") {
            out.push(inv(
                "/name".into(),
                "`name` must be a non-empty string (§4.2)".into(),
            ));
        }
    } else if let Err(e) = crate::names::check_tool_name(&spec.name) {
        // Not a name MCP can carry, nor a safe file name: refused, not warned.
        out.push(inv("/name".into(), format!("{e} (§4.2)")));
    } else if !is_slug(&spec.name) {
        out.push(warn(
            "/name".into(),
            format!(
                "name {:?} is not a slug (lowercase letters, digits, `-`, `_`; §4.2); accepted, as the spec requires",
                spec.name
            ),
        ));
    }

    // §4.1 toolId.
    if let Some(id) = &spec.tool_id {
        if id.trim().is_empty() {
            out.push(inv(
                "/toolId".into(),
                "`toolId` must not be empty; remove it to have one derived from the name (§4.1)"
                    .into(),
            ));
        } else if uuid::Uuid::parse_str(id).is_err() {
            out.push(warn(
                "/toolId".into(),
                format!("toolId {id:?} is not a UUID; accepted as an opaque identifier (§4.1)"),
            ));
        }
    }

    // §8 code and codeType.
    if spec.code.trim().is_empty() && !already(out, "/code") {
        out.push(inv(
            "/code".into(),
            "`code` must be a non-empty JavaScript body (§8)".into(),
        ));
    }
    if !spec.code_type.is_empty() && spec.code_type != CODE_TYPE_JAVASCRIPT {
        out.push(inv(
            "/codeType".into(),
            format!(
                "codeType {:?} is not supported: the only accepted value is \"Javascript\" (§8.1)",
                spec.code_type
            ),
        ));
    }

    // §9.2 tags.
    if spec.tags.len() > MAX_TAGS {
        out.push(inv(
            "/tags".into(),
            format!(
                "a spec carries at most {MAX_TAGS} tags (§9.2), this one has {}: {:?}",
                spec.tags.len(),
                spec.tags
            ),
        ));
    }

    check_params(spec, out);
    check_static_variables(spec, out);
    check_overrides(spec, out);
}

fn check_params(spec: &ToolSpec, out: &mut Vec<Diagnostic>) {
    for (n, p) in spec.params.iter().enumerate() {
        let at = pointer("/params", p.index);
        let name_at = pointer(&at, "name");
        if p.name.trim().is_empty() {
            if !out.iter().any(|d| d.pointer == name_at) {
                out.push(Diagnostic::error(
                    Code::SpecInvariant,
                    name_at,
                    "a param `name` must be non-empty (§6.1)",
                ));
            }
        } else if let Some(first) = spec.params[..n].iter().find(|q| q.name == p.name) {
            out.push(Diagnostic::error(
                Code::SpecInvariant,
                name_at,
                format!(
                    "duplicate param name {:?} (first declared at /params/{}); param names must be unique",
                    p.name, first.index
                ),
            ));
        } else if !is_js_identifier(&p.name) {
            out.push(Diagnostic::warning(
                Code::SpecInvariant,
                name_at,
                format!(
                    "param name {:?} is not a JavaScript identifier, so the body cannot refer to it by name (§8.2)",
                    p.name
                ),
            ));
        }

        let tv_at = pointer(&at, "testValue");
        match (&p.test_value, p.required) {
            (None, true) => out.push(Diagnostic::error(
                Code::SpecInvariant,
                tv_at,
                format!(
                    "required param {:?} has no testValue; the Local Pass runs the tool with it (§6.3). Add a representative {} value",
                    p.name,
                    p.ty.spec_name()
                ),
            )),
            (Some(tv), true) if tv.trim().is_empty() => out.push(Diagnostic::error(
                Code::SpecInvariant,
                tv_at,
                format!(
                    "required param {:?} has a blank testValue; the Local Pass would run it with a blank string, which is not a representative sample (§6.3)",
                    p.name
                ),
            )),
            (Some(tv), required) if !tv.trim().is_empty() => {
                if let Err(why) = p.ty.parse_text(tv) {
                    let msg = format!(
                        "testValue of {} param {:?} does not parse to its type: {why}",
                        p.ty.spec_name(),
                        p.name
                    );
                    out.push(if required {
                        Diagnostic::error(Code::SpecInvariant, tv_at, msg)
                    } else {
                        Diagnostic::warning(Code::SpecInvariant, tv_at, msg)
                    });
                }
            }
            _ => {}
        }
    }
}

fn check_static_variables(spec: &ToolSpec, out: &mut Vec<Diagnostic>) {
    for sv in &spec.static_variables {
        let at = pointer(&pointer("/staticVariables", sv.index), &sv.key);
        if sv.key.trim().is_empty() {
            out.push(Diagnostic::error(
                Code::SpecInvariant,
                at.clone(),
                "a static variable needs a non-empty key (§7.1)",
            ));
        } else if !is_js_identifier(&sv.key) {
            out.push(Diagnostic::warning(
                Code::SpecInvariant,
                at.clone(),
                format!(
                    "static variable key {:?} is not a JavaScript identifier, so the body cannot refer to it by name",
                    sv.key
                ),
            ));
        }
        if spec.param(&sv.key).is_some() {
            out.push(Diagnostic::warning(
                Code::SpecInvariant,
                at.clone(),
                format!(
                    "static variable {:?} has the name of a param; the static value wins and the model's argument is ignored",
                    sv.key
                ),
            ));
        }
        for look in envvar::lookalikes(&sv.value) {
            out.push(Diagnostic::warning(
                Code::SpecInvariant,
                at.clone(),
                format!(
                    "{look} is not an environment placeholder (names match [A-Z_][A-Z0-9_]*, §7.2), so it is passed to the tool literally; write it in uppercase if it should be resolved"
                ),
            ));
        }
    }
}

/// A hostsAllow entry is a host name or address (optionally `*` or `*.domain`): never a URL,
/// a scheme, a port or a network range, each of which would match no request at run time.
/// The problem says what to write instead.
pub fn host_entry_problem(host: &str) -> Option<String> {
    if host.trim().is_empty() {
        return Some("is empty".into());
    }
    if let Some((scheme, rest)) = host.split_once("://") {
        let name = rest
            .split(['/', '?', '#'])
            .next()
            .unwrap_or_default()
            .rsplit('@')
            .next()
            .unwrap_or_default();
        let name = strip_port(name).unwrap_or(name);
        return Some(format!(
            "is a URL with the scheme {scheme:?}; hostsAllow matches host names for http and https alike, so write only the host: {name:?}"
        ));
    }
    if let Some((net, bits)) = host.split_once('/') {
        if net.parse::<std::net::IpAddr>().is_ok() && bits.bytes().all(|b| b.is_ascii_digit()) {
            return Some(format!(
                "is a network range (CIDR); hostsAllow matches host names and single addresses only: list each host the tool calls (e.g. \"api.example.com\" or \"{net}\"), and for private services the operator sets [egress] trusted_ranges"
            ));
        }
    }
    if host.contains(['/', '?', '#', '@']) {
        return Some("holds a path, query or user part; write only the host name".into());
    }
    if host.chars().any(char::is_whitespace) {
        return Some("contains whitespace".into());
    }
    if let Some(name) = strip_port(host) {
        return Some(format!(
            "has a port; hostsAllow matches host names on any port, so write {name:?}"
        ));
    }
    if let Some(scheme) = ["http:", "https:"].iter().find(|s| host.starts_with(**s)) {
        return Some(format!(
            "starts with the scheme {scheme:?}; write only the host name: {:?}",
            &host[scheme.len()..]
        ));
    }
    if host != "*" && host.trim_start_matches("*.").contains('*') {
        return Some("has a `*` other than a leading `*.` label".into());
    }
    None
}

/// `host:port` or `[v6]:port` without its port; None when there is no port (a bare IPv6
/// address has colons but no port).
fn strip_port(host: &str) -> Option<&str> {
    if let Some(rest) = host.strip_prefix('[') {
        let (addr, tail) = rest.split_once(']')?;
        let port = tail.strip_prefix(':')?;
        return (!port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()))
            .then_some(&host[..addr.len() + 2]);
    }
    let (name, port) = host.rsplit_once(':')?;
    (!name.contains(':') && !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()))
        .then_some(name)
}

fn check_overrides(spec: &ToolSpec, out: &mut Vec<Diagnostic>) {
    let o = &spec.sandbox_overrides;
    for (i, host) in o.hosts_allow.iter().enumerate() {
        if let Some(problem) = host_entry_problem(host) {
            out.push(Diagnostic::error(
                Code::SpecInvariant,
                pointer("/sandboxOverrides/hostsAllow", i),
                format!("hostsAllow entry {host:?} {problem}"),
            ));
        }
    }
    if let Some(mode) = o.network_mode.value() {
        if !o.hosts_allow.is_empty() && *mode != crate::spec::NetworkMode::Allowlist {
            out.push(Diagnostic::warning(
                Code::SpecInvariant,
                "/sandboxOverrides/hostsAllow",
                format!(
                    "hostsAllow is ignored when networkMode is {:?}; it applies only to allowlist (§10.2 step 5)",
                    mode.as_str()
                ),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn codes_at(doc: Value) -> Vec<(Code, String, bool)> {
        validate_document(&doc)
            .diagnostics
            .into_iter()
            .map(|d| (d.code, d.pointer.clone(), d.is_error()))
            .collect()
    }

    #[test]
    fn minimal_spec_is_valid() {
        let v =
            validate_document(&json!({"name": "a", "code": "return 1", "codeType": "Javascript"}));
        assert!(v.is_valid(), "{:?}", v.diagnostics);
        assert!(v.diagnostics.is_empty());
    }

    #[test]
    fn non_slug_name_is_a_warning_not_an_error() {
        let d = codes_at(json!({"name": "getUpbitTicker", "code": "x", "codeType": "Javascript"}));
        assert_eq!(d, vec![(Code::SpecInvariant, "/name".into(), false)]);
    }

    #[test]
    fn a_name_outside_the_tool_name_grammar_is_an_error() {
        for name in ["../../tmp/x/PWNED", "a b", ".hidden", "a\u{2215}b"] {
            let d = codes_at(json!({"name": name, "code": "x", "codeType": "Javascript"}));
            assert_eq!(
                d,
                vec![(Code::SpecInvariant, "/name".into(), true)],
                "{name:?}"
            );
        }
    }

    #[test]
    fn identifiers_and_slugs() {
        assert!(is_slug("url-encode_2"));
        assert!(!is_slug("Url"));
        assert!(is_js_identifier("$x_1"));
        assert!(!is_js_identifier("1x"));
        assert!(!is_js_identifier("a-b"));
    }

    #[test]
    fn host_entries() {
        assert_eq!(host_entry_problem("api.github.com"), None);
        assert_eq!(host_entry_problem("*.example.com"), None);
        assert_eq!(host_entry_problem("*"), None);
        assert!(host_entry_problem("https://api.github.com").is_some());
        assert!(host_entry_problem("api.*.com").is_some());
        assert!(host_entry_problem("").is_some());
        // Each wrong form says what to write instead.
        let said = |h: &str| host_entry_problem(h).unwrap_or_default();
        assert!(
            said("example.com:443").contains("write \"example.com\""),
            "{}",
            said("example.com:443")
        );
        assert!(
            said("[::1]:8443").contains("write \"[::1]\""),
            "{}",
            said("[::1]:8443")
        );
        assert_eq!(
            host_entry_problem("2001:db8::1"),
            None,
            "a bare IPv6 address has no port"
        );
        assert!(
            said("10.0.0.0/8").contains("CIDR") && said("10.0.0.0/8").contains("trusted_ranges")
        );
        assert!(said("https://api.github.com:443/repos").contains("\"api.github.com\""));
        assert!(said("http:example.com").contains("\"example.com\""));
    }
}
