//! The daemon's managed catalog: the directory that `stsd tools add|update|rollback|rm|
//! enable|disable` write to, on the admin channel. Layout:
//!
//! - `specs/NAME.json`: the served version of each managed tool (a catalog source);
//! - `history/NAME/TIMESTAMP.json`: earlier versions, newest last (rollback takes the newest);
//! - `toolsets.json`: a CJSON toolsets document with the operator's enable/disable switches.
//!
//! Every file operation goes through a directory handle that cannot be left (`beneath.rs`:
//! no `..`, no symlink, whoever planted it), with file names built only from names that
//! follow the tool-name grammar. Every write is atomic (a temporary file renamed into place), so a crash leaves either the
//! old or the new version, and the state survives a restart because the daemon reads the
//! directory like any other catalog.

use crate::beneath::Beneath;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use stsd_protocol::ToolName;

const TOOLSETS: &str = "toolsets.json";

/// Every file operation goes through a directory handle that cannot be left
/// ([`Beneath`]), and every file name is built from a checked [`ToolName`].
pub struct Managed {
    /// The directory's path, for messages and for the daemon's catalog sources.
    dir: PathBuf,
    root: Beneath,
    specs: Beneath,
    history: Beneath,
}

/// Default location: `$STATE_DIRECTORY/catalog` (systemd's), else `/var/lib/stsd/catalog` for root, else `$XDG_DATA_HOME/stsd/catalog` or
/// `~/.local/share/stsd/catalog`.
pub fn default_dir() -> PathBuf {
    if let Some(d) = crate::paths::systemd_dir("STATE_DIRECTORY") {
        return d.join("catalog");
    }
    if nix::unistd::Uid::effective().is_root() {
        return PathBuf::from("/var/lib/stsd/catalog");
    }
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = env("XDG_DATA_HOME") {
        return d.join("stsd/catalog");
    }
    if let Some(h) = env("HOME") {
        return h.join(".local/share/stsd/catalog");
    }
    PathBuf::from(format!(
        "/tmp/stsd-{}/catalog",
        nix::unistd::Uid::effective().as_raw()
    ))
}

fn write(dir: &Beneath, name: &str, v: &Value) -> Result<(), String> {
    let mut text = serde_json::to_vec_pretty(v).map_err(|e| e.to_string())?;
    text.push(b'\n');
    dir.write_atomic(name, &text)
        .map_err(|e| format!("{}: {e}", dir.path().join(name).display()))
}

/// The file a tool's current version is kept in. A [`ToolName`] is one plain path component
/// (see `stsd_protocol::names`), so this cannot name another directory.
fn spec_file(name: &ToolName) -> String {
    format!("{name}.json")
}

impl Managed {
    /// Opens (creating) the directory and an empty toolsets document.
    pub fn open(dir: &Path) -> Result<Managed, String> {
        let at = |e: std::io::Error| format!("{}: {e}", dir.display());
        let root = Beneath::open(dir).map_err(at)?;
        let specs = root.dir("specs", true).map_err(at)?;
        let history = root.dir("history", true).map_err(at)?;
        let m = Managed {
            dir: dir.to_path_buf(),
            root,
            specs,
            history,
        };
        if !m.root.exists(TOOLSETS) {
            m.write_toolsets(&[])?;
        }
        Ok(m)
    }

    /// The directory of served versions (a catalog source the daemon reads).
    pub fn specs_dir(&self) -> PathBuf {
        self.dir.join("specs")
    }

    pub fn toolsets_path(&self) -> PathBuf {
        self.dir.join(TOOLSETS)
    }

    /// Whether the managed catalog holds `name`.
    pub fn has(&self, name: &ToolName) -> bool {
        self.specs.exists(&spec_file(name))
    }

    /// Saves the current version (if any) to the history, then writes `doc` as current.
    pub fn install(&self, name: &ToolName, doc: &Value) -> Result<(), String> {
        self.keep_current(name)?;
        write(&self.specs, &spec_file(name), doc)
    }

    fn keep_current(&self, name: &ToolName) -> Result<(), String> {
        let cur = spec_file(name);
        if !self.specs.exists(&cur) {
            return Ok(());
        }
        let h = self
            .history
            .dir(name.as_str(), true)
            .map_err(|e| e.to_string())?;
        let stamp = format!("{:020}.json", crate::store::now_ms().max(0));
        // Two writes in one millisecond must not overwrite each other's history.
        let mut target = stamp.clone();
        let mut n = 0;
        while h.exists(&target) {
            n += 1;
            target = format!("{stamp}.{n}");
        }
        self.specs
            .rename(&cur, &h, &target)
            .map_err(|e| e.to_string())
    }

    /// Puts the newest earlier version back in place; the current one is dropped.
    pub fn rollback(&self, name: &ToolName) -> Result<(), String> {
        let none = || format!("{name} has no earlier version to roll back to");
        let h = self.history.dir(name.as_str(), false).map_err(|_| none())?;
        let mut all = h.entries().map_err(|_| none())?;
        all.retain(|n| !n.starts_with('.'));
        all.sort();
        let prev = all.pop().ok_or_else(none)?;
        h.rename(&prev, &self.specs, &spec_file(name))
            .map_err(|e| e.to_string())
    }

    /// Retires a tool: its current version goes to the history (so `rollback` restores it).
    pub fn remove(&self, name: &ToolName) -> Result<(), String> {
        if !self.has(name) {
            return Err(format!("{name} is not in the managed catalog"));
        }
        self.keep_current(name)?;
        self.set_enabled(name, true)
    }

    fn disabled(&self) -> Vec<String> {
        self.root
            .read(TOOLSETS)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|v| {
                v["toolsets"][0]["tools"].as_array().map(|t| {
                    t.iter()
                        .filter(|x| x["enabled"] == false)
                        .filter_map(|x| x["name"].as_str().map(String::from))
                        .collect()
                })
            })
            .unwrap_or_default()
    }

    fn write_toolsets(&self, disabled: &[String]) -> Result<(), String> {
        let tools: Vec<Value> = disabled
            .iter()
            .map(|n| json!({"name": n, "enabled": false}))
            .collect();
        write(
            &self.root,
            TOOLSETS,
            &json!({
                "mediaType": crate::approval::toolsets::MEDIA_TYPE,
                "schema": crate::approval::toolsets::SCHEMA_ID,
                "toolsets": [{"id": "stsd-operator", "kind": "builtin", "tools": tools}],
            }),
        )
    }

    /// The operator's switch for a tool (any tool of the catalog, managed or not).
    pub fn set_enabled(&self, name: &ToolName, enabled: bool) -> Result<(), String> {
        let mut d = self.disabled();
        d.retain(|n| n != name.as_str());
        if !enabled {
            d.push(name.to_string());
        }
        d.sort();
        self.write_toolsets(&d)
    }
}
