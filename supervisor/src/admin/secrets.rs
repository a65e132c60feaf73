//! `stsd/secrets/*`: the operator's secrets directory (`crate::secrets`) over the admin
//! channel, admins only. A value arrives in a request and goes to its file; no reply, log
//! line or error carries it. A set or a removal re-publishes at once: a tool that waited
//! for the secret is served, one that lost it is withheld.

use super::codes::{GATE_FAILED, NO_SUCH};
use crate::catalog::Published;
use serde_json::{json, Value};
use stsd_protocol::envvar::{placeholders, secret_name};

pub const METHODS: &[&str] = &[
    "stsd/secrets/list",
    "stsd/secrets/set",
    "stsd/secrets/remove",
];

/// Whether `method` changes the directory (and so the catalog is re-published after it).
pub fn changes(method: &str) -> bool {
    method != "stsd/secrets/list"
}

fn name_param(params: &Value) -> Result<&str, (i32, String)> {
    let name = params
        .get("name")
        .and_then(Value::as_str)
        .ok_or((-32602, "params: {\"name\": <secret>}".to_string()))?;
    crate::secrets::check_name(name).map_err(|e| (-32602, e))
}

/// Does the change; the reply is completed by [`tools_using`] once re-published.
pub fn call(
    config: &stsd_profiles::Config,
    method: &str,
    params: &Value,
) -> Result<Value, (i32, String)> {
    let dir = crate::secrets::dir(config);
    match method {
        "stsd/secrets/list" => {
            let names = crate::secrets::names(&dir);
            // The hosts each was given for (tools may use it), or null (upstreams only).
            let hosts: serde_json::Map<String, Value> = names
                .iter()
                .map(|n| (n.clone(), json!(crate::secrets::granted_hosts(&dir, n))))
                .collect();
            Ok(json!({"dir": dir.display().to_string(), "secrets": names, "hosts": hosts}))
        }
        "stsd/secrets/set" => {
            let name = name_param(params)?;
            let value = params.get("value").and_then(Value::as_str).ok_or((
                -32602,
                "params: {\"name\": .., \"value\": <string>}".to_string(),
            ))?;
            let hosts: Option<Vec<String>> = match params.get("hosts") {
                None | Some(Value::Null) => None,
                Some(v) => Some(
                    serde_json::from_value(v.clone())
                        .map_err(|_| (-32602, "params.hosts: a list of host names".to_string()))?,
                ),
            };
            crate::secrets::set_for(&dir, name, value, hosts.as_deref())
                .map_err(|e| (GATE_FAILED, e))?;
            let hosts = crate::secrets::granted_hosts(&dir, name);
            tracing::info!(secret = name, hosts = ?hosts, "secret set by an admin");
            Ok(json!({"name": name, "set": true, "hosts": hosts}))
        }
        "stsd/secrets/remove" => {
            let name = name_param(params)?;
            if !crate::secrets::remove(&dir, name).map_err(|e| (GATE_FAILED, e))? {
                return Err((NO_SUCH, format!("no secret named {name}")));
            }
            tracing::info!(secret = name, "secret removed by an admin");
            Ok(json!({"name": name, "removed": true}))
        }
        other => Err((-32601, format!("no admin method {other}"))),
    }
}

/// The tools that name secret `name` (as `${NAME}` or `${secret:NAME}`): those served, and
/// those withheld with why (a missing requirement names it).
pub fn tools_using(published: &Published, name: &str) -> Value {
    let served: Vec<&str> = published
        .tools
        .iter()
        .filter(|t| {
            t.spec.static_variables.iter().any(|s| {
                placeholders(&s.value)
                    .iter()
                    .any(|p| secret_name(p.name).unwrap_or(p.name) == name)
            })
        })
        .map(|t| t.spec.name.as_str())
        .collect();
    let withheld: Vec<Value> = published
        .withheld
        .iter()
        .filter(|(_, why)| names_missing(why, name))
        .map(|(tool, why)| json!({"name": tool, "why": why}))
        .collect();
    json!({"served": served, "withheld": withheld})
}

/// Whether a withheld tool's reason names `name` as a missing requirement (`NAME (` or
/// `secret:NAME (` after a space or a colon, not the tail of a longer name).
fn names_missing(why: &str, name: &str) -> bool {
    let needle = format!("{name} (");
    why.match_indices(&needle)
        .any(|(at, _)| at > 0 && matches!(why.as_bytes()[at - 1], b' ' | b':'))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_reason_names_a_secret_only_whole() {
        let why = "MISSING_REQUIREMENTS: secret:API_KEY (no secret API_KEY: ..), MY_TOKEN (..)";
        assert!(super::names_missing(why, "API_KEY"));
        assert!(super::names_missing(why, "MY_TOKEN"));
        assert!(!super::names_missing(why, "TOKEN"));
        assert!(!super::names_missing(why, "KEY"));
    }
}
