//! The first start on a state directory in the older layout (loose files) brings them into
//! the store in one transaction, checks what it wrote against what it read, and keeps the old
//! files renamed (`*.imported`), never deleted:
//!
//! - the managed catalog directory: `specs/NAME.json` (served versions), `history/NAME/*`
//!   (earlier versions, oldest first), `toolsets.json` (the operator's switches);
//! - the fingerprint ledger, `ledger.json`.
//!
//! A store that has imported once (its `meta` says so) is never imported into again.

use super::rows::{Old, DONE};
use super::Store;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// What an import brought in.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Imported {
    pub tools: usize,
    pub history: usize,
    pub switches: usize,
    pub ledger: usize,
    /// The files and directories kept, renamed.
    pub kept: Vec<PathBuf>,
}

fn json_files(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.is_file()
                && !p
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .collect();
    out.sort();
    out
}

/// When a history file's version was retired: its name's timestamp (milliseconds since the
/// epoch, zero-padded; seconds in the oldest layout), else its modification time.
fn retired_at(path: &Path) -> Option<i64> {
    let stem = path.file_stem()?.to_string_lossy().to_string();
    let digits: String = stem.chars().take_while(char::is_ascii_digit).collect();
    match digits.parse::<i64>() {
        Ok(n) if n >= 100_000_000_000 => Some(n),
        Ok(n) if n >= 100_000_000 => Some(n * 1000),
        _ => {
            let m = std::fs::metadata(path).ok()?.modified().ok()?;
            let d = m.duration_since(std::time::UNIX_EPOCH).ok()?;
            i64::try_from(d.as_millis()).ok()
        }
    }
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("import {}: {e}", path.display()))
}

/// Reads the older layout's files (none of them is required).
fn read_old(catalog_dir: &Path, ledger: &Path) -> Result<Old, String> {
    let mut old = Old::default();
    for p in json_files(&catalog_dir.join("specs")) {
        let Some(name) = p.file_stem().map(|s| s.to_string_lossy().to_string()) else {
            continue;
        };
        old.tools.push((name, read(&p)?));
    }
    let mut tools: Vec<PathBuf> = std::fs::read_dir(catalog_dir.join("history"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    tools.sort();
    for dir in tools {
        let name = dir
            .file_name()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_default();
        // Zero-padded timestamps: the names sort oldest first.
        for p in json_files(&dir) {
            old.history.push((name.clone(), read(&p)?, retired_at(&p)));
        }
    }
    let toolsets = catalog_dir.join("toolsets.json");
    if toolsets.is_file() {
        let v: Value = serde_json::from_slice(&read(&toolsets)?)
            .map_err(|e| format!("import {}: {e}", toolsets.display()))?;
        for set in v["toolsets"].as_array().into_iter().flatten() {
            for t in set["tools"].as_array().into_iter().flatten() {
                if t["enabled"] == false {
                    if let Some(n) = t["name"].as_str() {
                        old.disabled.push(n.to_string());
                    }
                }
            }
        }
    }
    if ledger.is_file() {
        let v: Value = serde_json::from_slice(&read(ledger)?)
            .map_err(|e| format!("import {}: not a ledger: {e}", ledger.display()))?;
        for (id, e) in v["tools"].as_object().into_iter().flatten() {
            old.ledger.push((id.clone(), e.to_string()));
        }
        for (id, s) in v["servers"].as_object().into_iter().flatten() {
            if let Some(ms) = s["lastUsedMs"].as_i64() {
                old.servers.push((id.clone(), ms));
            }
        }
    }
    Ok(old)
}

/// Imports the older layout into `store` once. Returns None when the store has imported
/// before (or there was nothing to import and that is now recorded).
pub fn once(store: &Store, catalog_dir: &Path, ledger: &Path) -> Result<Option<Imported>, String> {
    if store.meta(DONE)?.is_some() {
        return Ok(None);
    }
    let old = read_old(catalog_dir, ledger)?;
    let mut got = Imported {
        tools: old.tools.len(),
        history: old.history.len(),
        switches: old.disabled.len(),
        ledger: old.ledger.len(),
        kept: Vec::new(),
    };
    let imported = store.import(&old)?;
    if !imported {
        return Ok(None);
    }
    // Kept, out of the way: a later reader of the old layout sees no stale catalog.
    for p in [
        catalog_dir.join("specs"),
        catalog_dir.join("history"),
        catalog_dir.join("toolsets.json"),
        ledger.to_path_buf(),
    ] {
        if p.exists() {
            let mut to = p.as_os_str().to_os_string();
            to.push(".imported");
            let to = PathBuf::from(to);
            std::fs::rename(&p, &to)
                .map_err(|e| format!("import: keep {} as {}: {e}", p.display(), to.display()))?;
            got.kept.push(to);
        }
    }
    Ok(Some(got))
}
