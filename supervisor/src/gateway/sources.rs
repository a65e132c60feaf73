//! Where upstreams are declared: `[[upstream]]` tables, and CJSON toolsets documents whose
//! toolset `kind` is `mcp` (seed 003), lowered to the same [`UpstreamConfig`]. And the
//! `${env:NAME}` / `${secret:NAME}` references in their values, resolved at connect time into
//! values that are never written anywhere and masked everywhere.

use crate::refs::{resolve_refs, Resolved};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use stsd_profiles::upstream::{AuthKind, UpstreamConfig};
use stsd_profiles::Config;

/// Every upstream the config and the toolsets documents declare. Errors name the file and a
/// JSON pointer; an id declared twice is an error.
pub fn declared(config: &Config, toolsets: &[PathBuf]) -> Result<Vec<UpstreamConfig>, Vec<String>> {
    let mut out = config.upstream.clone();
    let mut errors = Vec::new();
    for path in toolsets {
        let Ok(bytes) = std::fs::read(path) else {
            // The toolsets loader reports unreadable files.
            continue;
        };
        let Ok(doc) = stsd_protocol::json::parse_bounded(&bytes) else {
            continue;
        };
        for (i, set) in doc
            .get("toolsets")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            if set.get("kind").and_then(Value::as_str) != Some("mcp") {
                continue;
            }
            match from_toolset(set) {
                Ok(u) => out.push(u),
                Err(e) => errors.push(format!("{}: /toolsets/{i}{e}", path.display())),
            }
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for u in &out {
        if let Err(e) = u.check() {
            errors.push(e);
        }
        if !seen.insert(u.id.clone()) {
            errors.push(format!("upstream id {:?} is declared twice", u.id));
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// The declared upstreams and those added at run time (the state store's rows: id, entry as
/// JSON). The config wins: a stored entry whose id it also declares is skipped, and one that
/// no longer parses or checks is skipped; each with a warning, so a config edit or a newer
/// stsd never stops a start.
pub fn with_added(
    mut declared: Vec<UpstreamConfig>,
    rows: Vec<(String, String)>,
) -> Vec<UpstreamConfig> {
    for (id, text) in rows {
        if declared.iter().any(|d| d.id == id) {
            tracing::warn!(upstream = %id, "an upstream added at run time has the id of one the config declares: the config's is used");
            continue;
        }
        match serde_json::from_str::<UpstreamConfig>(&text)
            .map_err(|e| e.to_string())
            .and_then(|u| u.check().map(|_| u))
        {
            Ok(u) if u.id == id => declared.push(u),
            Ok(u) => {
                tracing::warn!(upstream = %id, inner = %u.id, "a stored upstream's entry names another id: skipped")
            }
            Err(e) => {
                tracing::warn!(upstream = %id, error = %e, "a stored upstream's entry is not valid: skipped")
            }
        }
    }
    declared
}

fn strings(v: Option<&Value>, at: &str) -> Result<Vec<String>, String> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| format!("{at}: strings only"))
            })
            .collect(),
        Some(_) => Err(format!("{at}: an array of strings")),
    }
}

fn string_map(v: Option<&Value>, at: &str) -> Result<BTreeMap<String, String>, String> {
    match v {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, x)| {
                x.as_str()
                    .map(|s| (k.clone(), s.to_string()))
                    .ok_or_else(|| format!("{at}/{k}: a string"))
            })
            .collect(),
        Some(_) => Err(format!("{at}: an object of strings")),
    }
}

fn parse<T: serde::de::DeserializeOwned>(k: &str, v: &str) -> Result<T, String> {
    serde_json::from_value(Value::String(v.to_string()))
        .map_err(|_| format!("/server/{k}: {v:?} is not a known value"))
}

/// A toolset of kind `mcp`: `server` holds `command`/`args`/`env` or `url` (and stsd's
/// gateway keys: `trust`, `docsUrl`, `docsAdequate`, `workspace`, `readPaths`, `network`,
/// `maxRisk`, `timeoutMs`, `auth`); `headers` the HTTP headers; `tools[]` the tools to
/// expose with `enabled`, `requiresApproval` and (in `extensions`) `alias` / `description`.
/// Errors are JSON pointers relative to the toolset.
fn from_toolset(set: &Value) -> Result<UpstreamConfig, String> {
    let id = set
        .get("id")
        .and_then(Value::as_str)
        .ok_or("/id: an mcp toolset needs an id (it names the upstream)")?;
    let server = set.get("server").cloned().unwrap_or(Value::Null);
    let s = |k: &str| server.get(k).and_then(Value::as_str).map(str::to_string);
    let mut u = UpstreamConfig {
        id: id.to_string(),
        command: s("command"),
        args: strings(server.get("args"), "/server/args")?,
        env: string_map(server.get("env"), "/server/env")?,
        url: s("url"),
        headers: string_map(set.get("headers"), "/headers")?,
        docs_url: s("docsUrl"),
        docs_adequate: server.get("docsAdequate").and_then(Value::as_bool),
        workspace: s("workspace").map(PathBuf::from),
        read_paths: strings(server.get("readPaths"), "/server/readPaths")?
            .into_iter()
            .map(PathBuf::from)
            .collect(),
        network: strings(server.get("network"), "/server/network")?,
        timeout_ms: server.get("timeoutMs").and_then(Value::as_u64),
        ..UpstreamConfig::default()
    };
    if let Some(t) = s("trust") {
        u.trust = Some(parse("trust", &t)?);
    }
    if let Some(a) = s("auth") {
        u.auth = Some(parse("auth", &a)?);
    }
    if let Some(r) = s("maxRisk") {
        u.max_risk = Some(parse("maxRisk", &r)?);
    }
    let defaults = set.get("toolsetDefaults");
    let flag = |tool: &Value, key: &str| {
        tool.get(key)
            .or_else(|| defaults.and_then(|d| d.get(key)))
            .and_then(Value::as_bool)
    };
    if let Some(tools) = set.get("tools").and_then(Value::as_array) {
        let mut expose = Vec::new();
        for (j, tool) in tools.iter().enumerate() {
            let name = tool
                .get("name")
                .and_then(Value::as_str)
                .ok_or(format!("/tools/{j}/name: missing"))?;
            if flag(tool, "enabled").unwrap_or(true) {
                expose.push(name.to_string());
            }
            if let Some(r) = flag(tool, "requiresApproval") {
                u.approval.insert(name.to_string(), r);
            }
            let ext = tool.get("extensions");
            if let Some(a) = ext.and_then(|e| e.get("alias")).and_then(Value::as_str) {
                u.aliases.insert(name.to_string(), a.to_string());
            }
            if let Some(d) = ext
                .and_then(|e| e.get("description"))
                .and_then(Value::as_str)
            {
                u.descriptions.insert(name.to_string(), d.to_string());
            }
        }
        u.tools = Some(expose);
    }
    if u.approval_default.is_none() {
        u.approval_default = defaults
            .and_then(|d| d.get("requiresApproval"))
            .and_then(Value::as_bool);
    }
    Ok(u)
}

/// An upstream's env, args and headers with every reference resolved.
#[derive(Debug, Clone, Default)]
pub struct Connect {
    pub env: BTreeMap<String, String>,
    pub args: Vec<String>,
    pub headers: BTreeMap<String, String>,
    pub secrets: Vec<String>,
}

pub fn resolve_upstream(u: &UpstreamConfig, secrets_dir: Option<&Path>) -> Result<Connect, String> {
    let mut found = Resolved::default();
    let ctx = |what: &str, e: String| format!("upstream {}: {what}: {e}", u.id);
    let mut c = Connect::default();
    for (k, v) in &u.env {
        let r =
            resolve_refs(v, secrets_dir, &mut found).map_err(|e| ctx(&format!("env {k}"), e))?;
        c.env.insert(k.clone(), r);
    }
    for (i, a) in u.args.iter().enumerate() {
        c.args.push(
            resolve_refs(a, secrets_dir, &mut found).map_err(|e| ctx(&format!("args[{i}]"), e))?,
        );
    }
    for (k, v) in &u.headers {
        let r =
            resolve_refs(v, secrets_dir, &mut found).map_err(|e| ctx(&format!("header {k}"), e))?;
        c.headers.insert(k.clone(), r);
    }
    c.secrets = found.secrets;
    Ok(c)
}

/// The auth axis: as configured, else read off the headers.
pub fn auth_kind(u: &UpstreamConfig) -> AuthKind {
    if let Some(a) = u.auth {
        return a;
    }
    for (k, v) in &u.headers {
        let k = k.to_ascii_lowercase();
        if k == "authorization" && v.trim_start().to_ascii_lowercase().starts_with("bearer ") {
            return AuthKind::Bearer;
        }
        if k == "authorization" || k.contains("api-key") || k.contains("apikey") || k == "x-token" {
            return AuthKind::ApiKey;
        }
    }
    AuthKind::None
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn references_resolve_and_are_collected_as_secrets() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("TOKEN"), "s3cr3t-value\n").unwrap();
        std::env::set_var("STSD_SOURCES_TEST_VAR", "from-env");
        let mut r = Resolved::default();
        let v = resolve_refs(
            "Bearer ${secret:TOKEN} ${env:STSD_SOURCES_TEST_VAR} ${other}",
            Some(dir.path()),
            &mut r,
        )
        .unwrap();
        assert_eq!(v, "Bearer s3cr3t-value from-env ${other}");
        assert_eq!(r.secrets, vec!["s3cr3t-value", "from-env"]);
    }

    #[test]
    fn a_missing_reference_names_it_and_no_value() {
        let mut r = Resolved::default();
        let e = resolve_refs("${secret:NOPE_NOT_SET_ANYWHERE}", None, &mut r).unwrap_err();
        assert!(e.contains("NOPE_NOT_SET_ANYWHERE"), "{e}");
        let e = resolve_refs("${secret:../etc/passwd}", None, &mut r).unwrap_err();
        assert!(e.contains("not a secret name"), "{e}");
    }

    #[test]
    fn an_mcp_toolset_lowers_to_an_upstream() {
        let set = json!({
            "id": "files", "kind": "mcp",
            "server": {"command": "node", "args": ["server.js", "/"], "trust": "community",
                       "docsUrl": "https://example.org", "network": ["api.example.org"]},
            "headers": {"Authorization": "Bearer ${secret:T}"},
            "toolsetDefaults": {"requiresApproval": true},
            "tools": [
                {"name": "read_file"},
                {"name": "write_file", "enabled": false},
                {"name": "list", "requiresApproval": false,
                 "extensions": {"alias": "fs_list", "description": "List a directory."}}
            ]
        });
        let u = from_toolset(&set).unwrap();
        assert_eq!(u.id, "files");
        assert_eq!(u.command.as_deref(), Some("node"));
        assert_eq!(u.trust, Some(stsd_profiles::upstream::Trust::Community));
        assert_eq!(u.tools, Some(vec!["read_file".into(), "list".into()]));
        assert_eq!(u.approval.get("read_file"), Some(&true));
        assert_eq!(u.approval.get("list"), Some(&false));
        assert_eq!(u.aliases.get("list").map(String::as_str), Some("fs_list"));
        assert_eq!(u.network, vec!["api.example.org"]);
        assert_eq!(auth_kind(&u), AuthKind::Bearer);
        let bad = json!({"id": "x", "kind": "mcp", "server": {"trust": "bogus"}});
        assert!(from_toolset(&bad).unwrap_err().contains("/server/trust"));
    }
}
