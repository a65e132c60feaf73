//! `${env:NAME}` and `${secret:NAME}` references in configuration values (an upstream's
//! env, args and headers; the state store's password), resolved when they are used: a
//! secret from a file in the secrets directory (`crate::secrets::dir`), else the environment. A leaf: the gateway
//! and the state store both read it.

use std::path::Path;

/// Values resolved from `${env:NAME}` / `${secret:NAME}` references, and the secret values
/// among them (every referenced value counts as a secret: it came from outside the file).
#[derive(Debug, Default, Clone)]
pub struct Resolved {
    pub secrets: Vec<String>,
}

/// Replaces every `${env:NAME}` and `${secret:NAME}` in `text`. A secret is read from
/// `secrets_dir/NAME` (trailing newline trimmed), else the environment variable NAME. An
/// unresolvable reference is an error that names the reference, never a value.
pub fn resolve_refs(
    text: &str,
    secrets_dir: Option<&Path>,
    found: &mut Resolved,
) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[i..]);
            return Ok(out);
        };
        let inner = &after[..end];
        let value = if let Some(name) = inner.strip_prefix("env:") {
            std::env::var(name).map_err(|_| format!("${{env:{name}}} is not set"))?
        } else if let Some(name) = inner.strip_prefix("secret:") {
            read_secret(name, secrets_dir)?
        } else {
            // Not a reference of ours: kept as written.
            out.push_str(&rest[i..i + 3 + end]);
            rest = &after[end + 1..];
            continue;
        };
        if !value.is_empty() {
            found.secrets.push(value.clone());
        }
        out.push_str(&value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn read_secret(name: &str, dir: Option<&Path>) -> Result<String, String> {
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        return Err(format!("${{secret:{name}}}: not a secret name"));
    }
    if let Some(dir) = dir {
        match std::fs::read_to_string(dir.join(name)) {
            Ok(v) => return Ok(v.trim_end_matches(['\n', '\r']).to_string()),
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(format!(
                    "${{secret:{name}}}: cannot read {}: {e}",
                    dir.join(name).display()
                ))
            }
            Err(_) => {}
        }
    }
    std::env::var(name).map_err(|_| {
        format!(
            "${{secret:{name}}}: no secret {name} (stsd secret set {name}) and no environment \
             variable {name}"
        )
    })
}
