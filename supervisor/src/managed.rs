//! The daemon's managed catalog: the directory that `stsd tools add|update|rollback|rm|
//! enable|disable` write to, on the admin channel. Layout:
//!
//! - `specs/NAME.json`: the served version of each managed tool (a catalog source);
//! - `history/NAME/TIMESTAMP.json`: earlier versions, newest last (rollback takes the newest);
//! - `toolsets.json`: a CJSON toolsets document with the operator's enable/disable switches.
//!
//! Every write is atomic (a temporary file renamed into place), so a crash leaves either the
//! old or the new version, and the state survives a restart because the daemon reads the
//! directory like any other catalog.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};

pub struct Managed {
    dir: PathBuf,
}

/// Default location: `/var/lib/stsd/catalog` for root, else `$XDG_DATA_HOME/stsd/catalog` or
/// `~/.local/share/stsd/catalog`.
pub fn default_dir() -> PathBuf {
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

fn write(path: &Path, v: &Value) -> Result<(), String> {
    let mut text = serde_json::to_vec_pretty(v).map_err(|e| e.to_string())?;
    text.push(b'\n');
    crate::store::write_atomic(path, &text).map_err(|e| format!("{}: {e}", path.display()))
}

impl Managed {
    /// Opens (creating) the directory and an empty toolsets document.
    pub fn open(dir: &Path) -> Result<Managed, String> {
        let m = Managed {
            dir: dir.to_path_buf(),
        };
        for d in [m.specs_dir(), m.dir.join("history")] {
            std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        }
        if !m.toolsets_path().exists() {
            m.write_toolsets(&[])?;
        }
        Ok(m)
    }

    pub fn specs_dir(&self) -> PathBuf {
        self.dir.join("specs")
    }

    pub fn toolsets_path(&self) -> PathBuf {
        self.dir.join("toolsets.json")
    }

    fn spec_path(&self, name: &str) -> PathBuf {
        self.specs_dir().join(format!("{name}.json"))
    }

    fn history_dir(&self, name: &str) -> PathBuf {
        self.dir.join("history").join(name)
    }

    /// Whether the managed catalog holds `name`.
    pub fn has(&self, name: &str) -> bool {
        self.spec_path(name).exists()
    }

    /// Saves the current version (if any) to the history, then writes `doc` as current.
    pub fn install(&self, name: &str, doc: &Value) -> Result<(), String> {
        self.keep_current(name)?;
        write(&self.spec_path(name), doc)
    }

    fn keep_current(&self, name: &str) -> Result<(), String> {
        let cur = self.spec_path(name);
        if !cur.exists() {
            return Ok(());
        }
        let h = self.history_dir(name);
        std::fs::create_dir_all(&h).map_err(|e| e.to_string())?;
        let stamp = format!("{:020}.json", crate::store::now_ms().max(0));
        // Two writes in one millisecond must not overwrite each other's history.
        let mut target = h.join(&stamp);
        let mut n = 0;
        while target.exists() {
            n += 1;
            target = h.join(format!("{stamp}.{n}"));
        }
        std::fs::rename(&cur, &target).map_err(|e| e.to_string())
    }

    fn newest_in_history(&self, name: &str) -> Option<PathBuf> {
        let mut all: Vec<PathBuf> = std::fs::read_dir(self.history_dir(name))
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        all.sort();
        all.pop()
    }

    /// Puts the newest earlier version back in place; the current one is dropped.
    pub fn rollback(&self, name: &str) -> Result<(), String> {
        let prev = self
            .newest_in_history(name)
            .ok_or_else(|| format!("{name} has no earlier version to roll back to"))?;
        std::fs::rename(&prev, self.spec_path(name)).map_err(|e| e.to_string())
    }

    /// Retires a tool: its current version goes to the history (so `rollback` restores it).
    pub fn remove(&self, name: &str) -> Result<(), String> {
        if !self.has(name) {
            return Err(format!("{name} is not in the managed catalog"));
        }
        self.keep_current(name)?;
        self.set_enabled(name, true)
    }

    fn disabled(&self) -> Vec<String> {
        std::fs::read(self.toolsets_path())
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
            &self.toolsets_path(),
            &json!({
                "mediaType": crate::approval::toolsets::MEDIA_TYPE,
                "schema": crate::approval::toolsets::SCHEMA_ID,
                "toolsets": [{"id": "stsd-operator", "kind": "builtin", "tools": tools}],
            }),
        )
    }

    /// The operator's switch for a tool (any tool of the catalog, managed or not).
    pub fn set_enabled(&self, name: &str, enabled: bool) -> Result<(), String> {
        let mut d = self.disabled();
        d.retain(|n| n != name);
        if !enabled {
            d.push(name.to_string());
        }
        d.sort();
        self.write_toolsets(&d)
    }
}
