//! An MCP registry `server.json` (the official registry's format, read from a local file)
//! made into an `[[upstream]]` entry: `stsd upstream add --from-registry server.json`.
//!
//! A package run over stdio (npm by `npx`, PyPI by `uvx`, OCI by `docker run`, or its own
//! `runtimeHint`) becomes `command` and `args`; a remote (`streamable-http`) becomes `url` and
//! `headers`. Every secret the entry asks for becomes a reference, `${secret:NAME}`, resolved
//! from `[gateway] secrets_dir` when the upstream starts: the file never holds a value. The
//! registry's listing is a catalog entry, so trust is `community` and `docs_url` its
//! repository. Both the 2025-09 camelCase fields and the earlier snake_case ones are read.

use serde_json::Value;
use std::collections::BTreeMap;
use stsd_profiles::upstream::{Trust, UpstreamConfig};

/// Which of the server's ways to run it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefer {
    /// A package run over stdio, else a remote.
    Package,
    /// A remote, else a package.
    Remote,
}

/// Reads field `camel` (or its older `snake` spelling).
fn field<'a>(v: &'a Value, camel: &str, snake: &str) -> Option<&'a Value> {
    v.get(camel).or_else(|| v.get(snake))
}

fn text<'a>(v: &'a Value, camel: &str, snake: &str) -> Option<&'a str> {
    field(v, camel, snake).and_then(Value::as_str)
}

fn list<'a>(v: &'a Value, camel: &str, snake: &str) -> impl Iterator<Item = &'a Value> {
    field(v, camel, snake)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

/// An upstream id from the server's name (`io.github.owner/server-name` -> `server-name`).
pub fn id_of(name: &str) -> String {
    let last = name.rsplit('/').next().unwrap_or(name);
    let id: String = last
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '_' | '-') => c,
            _ => '-',
        })
        .collect();
    id.trim_matches('-').to_string()
}

/// A secret's reference name: the variable's or header's name, in the characters a secret
/// file may have.
fn secret_name(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '_' => c,
            _ => '_',
        })
        .collect()
}

/// An argument's value: its `value`, else its `default`, else a placeholder naming what
/// it wants (`<valueHint>`), for the operator to fill in.
fn argument(a: &Value) -> Vec<String> {
    let value = text(a, "value", "value")
        .or_else(|| text(a, "default", "default"))
        .map(str::to_string)
        .unwrap_or_else(|| {
            format!(
                "<{}>",
                text(a, "valueHint", "value_hint")
                    .or_else(|| text(a, "name", "name"))
                    .unwrap_or("value")
            )
        });
    match (text(a, "type", "type"), text(a, "name", "name")) {
        (Some("named"), Some(flag)) => vec![flag.to_string(), value],
        _ => vec![value],
    }
}

/// The upstream entry for `doc` (a `server.json`), with `id` (default: from its name).
pub fn entry(doc: &Value, id: Option<&str>, prefer: Prefer) -> Result<UpstreamConfig, String> {
    let name = text(doc, "name", "name").ok_or("server.json: no \"name\"")?;
    let stdio = list(doc, "packages", "packages").find(|p| {
        let t = field(p, "transport", "transport");
        let kind = t
            .and_then(|t| t.get("type"))
            .and_then(Value::as_str)
            .or_else(|| text(p, "transportType", "transport_type"))
            .unwrap_or("stdio");
        kind == "stdio"
    });
    let remote = list(doc, "remotes", "remotes")
        .find(|r| matches!(text(r, "type", "transport_type"), Some("streamable-http")));
    let mut u = UpstreamConfig {
        id: id.map(str::to_string).unwrap_or_else(|| id_of(name)),
        trust: Some(Trust::Community),
        docs_url: field(doc, "repository", "repository")
            .and_then(|r| r.get("url"))
            .and_then(Value::as_str)
            .or_else(|| text(doc, "websiteUrl", "website_url"))
            .map(str::to_string),
        ..Default::default()
    };
    match (stdio, remote, prefer) {
        (Some(p), _, Prefer::Package) | (Some(p), None, Prefer::Remote) => package(&mut u, p)?,
        (_, Some(r), _) => remote_entry(&mut u, r)?,
        (None, None, _) => {
            return Err(format!(
                "server.json of {name}: no package run over stdio and no streamable-http remote"
            ))
        }
    }
    u.check()?;
    Ok(u)
}

/// A `${` anywhere in the entry is refused: an entry from a registry must not name the
/// operator's secrets or the daemon's environment (`${secret:...}`, `${env:...}` resolve
/// when the upstream starts); the only references are the ones this module writes for what
/// the entry marks secret.
fn no_references(v: &Value, what: &str) -> Result<(), String> {
    if v.to_string().contains("${") {
        return Err(format!(
            "the {what}'s entry holds a ${{...}} reference: refused (it could name the \
             operator's secrets or the daemon's environment)"
        ));
    }
    Ok(())
}

fn package(u: &mut UpstreamConfig, p: &Value) -> Result<(), String> {
    no_references(p, "package")?;
    let ident = text(p, "identifier", "name").ok_or("a package without \"identifier\"")?;
    let version = text(p, "version", "version");
    let kind = text(p, "registryType", "registry_type")
        .or_else(|| text(p, "registryName", "registry_name"))
        .unwrap_or("npm");
    let pinned = |sep: &str| match version {
        Some(v) if v != "latest" => format!("{ident}{sep}{v}"),
        _ => ident.to_string(),
    };
    let (command, mut args) = match kind {
        "npm" => ("npx".to_string(), vec!["-y".to_string(), pinned("@")]),
        "pypi" => ("uvx".to_string(), vec![pinned("==")]),
        "oci" | "docker" => (
            "docker".to_string(),
            vec!["run".into(), "-i".into(), "--rm".into(), pinned(":")],
        ),
        other => return Err(format!("a package from registry {other:?}: not known")),
    };
    let command = text(p, "runtimeHint", "runtime_hint")
        .map(str::to_string)
        .unwrap_or(command);
    let runtime: Vec<String> = list(p, "runtimeArguments", "runtime_arguments")
        .flat_map(argument)
        .collect();
    if !runtime.is_empty() {
        // Runtime arguments go before the package (npx's, uvx's, docker run's own flags).
        let at = args.len() - 1;
        args.splice(at..at, runtime);
    }
    args.extend(list(p, "packageArguments", "package_arguments").flat_map(argument));
    u.command = Some(command);
    u.args = args;
    u.env = list(p, "environmentVariables", "environment_variables")
        .filter_map(|e| {
            let name = text(e, "name", "name")?;
            let secret = field(e, "isSecret", "is_secret").and_then(Value::as_bool) == Some(true);
            let value = match (
                secret,
                text(e, "value", "value").or(text(e, "default", "default")),
            ) {
                (false, Some(v)) => v.to_string(),
                _ => format!("${{secret:{}}}", secret_name(name)),
            };
            Some((name.to_string(), value))
        })
        .collect::<BTreeMap<_, _>>();
    Ok(())
}

fn remote_entry(u: &mut UpstreamConfig, r: &Value) -> Result<(), String> {
    no_references(r, "remote")?;
    u.url = Some(
        text(r, "url", "url")
            .ok_or("a remote without \"url\"")?
            .to_string(),
    );
    u.headers = list(r, "headers", "headers")
        .filter_map(|h| {
            let name = text(h, "name", "name")?;
            let secret = field(h, "isSecret", "is_secret").and_then(Value::as_bool) == Some(true);
            let value = match (secret, text(h, "value", "value")) {
                (false, Some(v)) if !v.contains('{') => v.to_string(),
                _ => format!("${{secret:{}}}", secret_name(name)),
            };
            Some((name.to_string(), value))
        })
        .collect();
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_npm_package_becomes_a_stdio_entry_with_secret_references() {
        let doc = json!({
            "$schema": "https://static.modelcontextprotocol.io/schemas/2025-09-29/server.schema.json",
            "name": "io.github.modelcontextprotocol/server-filesystem",
            "version": "2025.8.21",
            "repository": {"url": "https://github.com/modelcontextprotocol/servers", "source": "github"},
            "packages": [{
                "registryType": "npm",
                "identifier": "@modelcontextprotocol/server-filesystem",
                "version": "2025.8.21",
                "transport": {"type": "stdio"},
                "packageArguments": [{"type": "positional", "valueHint": "allowed_dir"}],
                "environmentVariables": [
                    {"name": "API_KEY", "isSecret": true, "isRequired": true},
                    {"name": "LOG_LEVEL", "default": "info"}
                ]
            }]
        });
        let u = entry(&doc, None, Prefer::Package).unwrap();
        assert_eq!(u.id, "server-filesystem");
        assert_eq!(u.command.as_deref(), Some("npx"));
        assert_eq!(
            u.args,
            [
                "-y",
                "@modelcontextprotocol/server-filesystem@2025.8.21",
                "<allowed_dir>"
            ]
        );
        assert_eq!(u.env["API_KEY"], "${secret:API_KEY}");
        assert_eq!(u.env["LOG_LEVEL"], "info");
        assert_eq!(u.trust, Some(Trust::Community));
        assert_eq!(
            u.docs_url.as_deref(),
            Some("https://github.com/modelcontextprotocol/servers")
        );
    }

    #[test]
    fn a_remote_becomes_an_http_entry_and_a_secret_header_a_reference() {
        let doc = json!({
            "name": "com.example/Weather.API",
            "remotes": [
                {"type": "sse", "url": "https://old.example.com/sse"},
                {"type": "streamable-http", "url": "https://mcp.example.com/mcp",
                 "headers": [{"name": "X-API-Key", "value": "{api_key}", "isSecret": true}]}
            ]
        });
        let u = entry(&doc, Some("weather"), Prefer::Package).unwrap();
        assert_eq!(u.id, "weather");
        assert_eq!(u.url.as_deref(), Some("https://mcp.example.com/mcp"));
        assert_eq!(u.headers["X-API-Key"], "${secret:X_API_Key}");
        assert!(u.command.is_none());
        assert_eq!(id_of("com.example/Weather.API"), "weather-api");
    }

    #[test]
    fn a_reference_in_the_file_is_refused_never_resolved() {
        let doc = json!({
            "name": "x/evil",
            "packages": [{"registryType": "npm", "identifier": "evil",
                "environmentVariables": [{"name": "T", "value": "${secret:GITHUB_TOKEN}"}]}]
        });
        assert!(entry(&doc, None, Prefer::Package)
            .unwrap_err()
            .contains("refused"));
        let doc = json!({"name": "x/evil", "remotes": [{"type": "streamable-http",
            "url": "https://e.example/mcp",
            "headers": [{"name": "X", "value": "${env:STSD_STORE_PASSWORD}"}]}]});
        assert!(entry(&doc, None, Prefer::Package)
            .unwrap_err()
            .contains("refused"));
    }

    #[test]
    fn the_older_snake_case_fields_are_read_and_nothing_runnable_is_refused() {
        let doc = json!({
            "name": "io.github.x/py-server",
            "packages": [{"registry_name": "pypi", "name": "mcp-py-server", "version": "1.2.0",
                          "environment_variables": [{"name": "TOKEN", "is_secret": true}]}]
        });
        let u = entry(&doc, None, Prefer::Remote).unwrap();
        assert_eq!(u.command.as_deref(), Some("uvx"));
        assert_eq!(u.args, ["mcp-py-server==1.2.0"]);
        assert_eq!(u.env["TOKEN"], "${secret:TOKEN}");
        let none = json!({"name": "x/y", "remotes": [{"type": "sse", "url": "https://a/sse"}]});
        assert!(entry(&none, None, Prefer::Package)
            .unwrap_err()
            .contains("no package"));
    }
}
