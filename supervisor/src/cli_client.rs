//! `stsd client setup CLIENT`: an MCP client's config pointed at `stsd mcp` (which bridges to
//! the running daemon), with everything the file already holds kept. Each client keeps its
//! servers in a JSON file of its own, under a key of its own:
//!
//! | client | file (default) | key |
//! |---|---|---|
//! | claude-desktop | `~/.config/Claude/claude_desktop_config.json` (macOS: `~/Library/Application Support/Claude/...`) | `mcpServers` |
//! | claude-code | `.mcp.json` in the current directory (the project's) | `mcpServers` |
//! | cursor | `~/.cursor/mcp.json` | `mcpServers` |
//! | vscode | `.vscode/mcp.json` in the current directory | `servers` (with `"type": "stdio"`) |
//! | windsurf | `~/.codeium/windsurf/mcp_config.json` | `mcpServers` |
//!
//! A file that is not a JSON object is refused, never replaced; the new file is written
//! whole and renamed into place.

use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};

pub const CLIENTS: &[&str] = &[
    "claude-desktop",
    "claude-code",
    "cursor",
    "vscode",
    "windsurf",
];

fn home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Where `client` keeps its MCP servers, and under which key.
pub fn location(client: &str) -> Result<(PathBuf, &'static str), String> {
    Ok(match client {
        "claude-desktop" if cfg!(target_os = "macos") => (
            home().join("Library/Application Support/Claude/claude_desktop_config.json"),
            "mcpServers",
        ),
        "claude-desktop" => (
            home().join(".config/Claude/claude_desktop_config.json"),
            "mcpServers",
        ),
        "claude-code" => (PathBuf::from(".mcp.json"), "mcpServers"),
        "cursor" => (home().join(".cursor/mcp.json"), "mcpServers"),
        "vscode" => (PathBuf::from(".vscode/mcp.json"), "servers"),
        "windsurf" => (
            home().join(".codeium/windsurf/mcp_config.json"),
            "mcpServers",
        ),
        other => {
            return Err(format!(
                "no client {other:?}: one of {}",
                CLIENTS.join(", ")
            ))
        }
    })
}

/// The server entry: `stsd mcp` on `socket`.
fn entry(client: &str, stsd: &Path, socket: &Path) -> Value {
    let mut e = json!({
        "command": stsd.display().to_string(),
        "args": ["mcp", "--socket", socket.display().to_string()],
    });
    if matches!(client, "vscode" | "claude-code") {
        e["type"] = json!("stdio");
    }
    e
}

/// The file's new content: what it held, with `name` set under the client's key.
pub fn merged(
    client: &str,
    existing: Option<&str>,
    name: &str,
    stsd: &Path,
    socket: &Path,
) -> Result<Value, String> {
    let (_, key) = location(client)?;
    let mut doc = match existing.map(str::trim).filter(|t| !t.is_empty()) {
        None => Value::Object(Map::new()),
        Some(text) => match serde_json::from_str::<Value>(text) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) => return Err("it is not a JSON object: left as it is".into()),
            Err(e) => {
                return Err(format!(
                    "it does not parse as JSON ({e}; comments are not read): left as it is"
                ))
            }
        },
    };
    let servers = doc
        .as_object_mut()
        .ok_or("not an object")?
        .entry(key)
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(servers) = servers.as_object_mut() else {
        return Err(format!("its \"{key}\" is not an object: left as it is"));
    };
    servers.insert(name.to_string(), entry(client, stsd, socket));
    Ok(doc)
}

/// Writes (or, `print`, prints) `client`'s config with stsd in it. Says what it did.
pub fn setup(
    client: &str,
    file: Option<PathBuf>,
    name: &str,
    socket: &Path,
    print: bool,
) -> Result<String, String> {
    let (default, _) = location(client)?;
    let path = file.unwrap_or(default);
    let stsd = std::env::current_exe()
        .and_then(std::fs::canonicalize)
        .map_err(|e| format!("this program's path: {e}"))?;
    let existing = match std::fs::read_to_string(&path) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let doc = merged(client, existing.as_deref(), name, &stsd, socket)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())? + "\n";
    if print {
        return Ok(text);
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    stsd::store::write_atomic(&path, text.as_bytes())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(format!(
        "{client}: {} now starts \"{name}\" as {} mcp --socket {} (restart {client} to load it)\n",
        path.display(),
        stsd.display(),
        socket.display()
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn what_the_file_held_is_kept_and_a_broken_file_is_left_alone() {
        let had = r#"{"theme": "dark", "mcpServers": {"other": {"command": "x"}}}"#;
        let (stsd, sock) = (Path::new("/usr/bin/stsd"), Path::new("/run/stsd/stsd.sock"));
        let v = merged("cursor", Some(had), "stsd", stsd, sock).unwrap();
        assert_eq!(v["theme"], "dark");
        assert_eq!(v["mcpServers"]["other"]["command"], "x");
        assert_eq!(
            v["mcpServers"]["stsd"]["args"],
            json!(["mcp", "--socket", "/run/stsd/stsd.sock"])
        );
        let v = merged("vscode", None, "stsd", stsd, sock).unwrap();
        assert_eq!(v["servers"]["stsd"]["type"], "stdio");
        assert!(merged("cursor", Some("{ // a comment\n}"), "stsd", stsd, sock).is_err());
        assert!(merged("cursor", Some("[1]"), "stsd", stsd, sock).is_err());
        assert!(merged("cursor", Some(r#"{"mcpServers": 3}"#), "stsd", stsd, sock).is_err());
        assert!(merged("emacs", None, "stsd", stsd, sock).is_err());
    }
}
