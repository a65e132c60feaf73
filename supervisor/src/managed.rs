//! The daemon's managed catalog: the tools that `stsd tools add|update|rollback|rm|enable|
//! disable` publish on the admin channel, kept in the state store (`crate::state`): each
//! tool's served version, its history, and the operator's enable/disable switches. Every
//! change is one transaction, so a kill at any moment leaves the old state or the new one.
//!
//! The catalog reads the served versions as spec files named `<catalog_dir>/specs/NAME.json`
//! (the directory of the older layout, which `state::import` brings in once): that name
//! marks them as admin-published (`approval::policy::gated_by_default`).

use crate::state::{LedgerRow, Store};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use stsd_protocol::ToolName;

/// The managed catalog, on the state store.
pub struct Managed {
    store: Arc<Store>,
    /// `<catalog_dir>/specs`: where its spec files are said to be.
    prefix: PathBuf,
}

impl std::fmt::Debug for Managed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Managed")
            .field("store", &self.store.path())
            .field("prefix", &self.prefix)
            .finish()
    }
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

impl Managed {
    /// The managed catalog kept in `store`, its spec files named under `catalog_dir`.
    pub fn new(store: Arc<Store>, catalog_dir: &Path) -> Managed {
        Managed {
            store,
            prefix: catalog_dir.join("specs"),
        }
    }

    /// The store it is kept in (the ledger is kept there too).
    pub fn store(&self) -> Arc<Store> {
        self.store.clone()
    }

    /// The directory its spec files are named under (nothing is read from it).
    pub fn specs_dir(&self) -> PathBuf {
        self.prefix.clone()
    }

    /// The served versions, as the catalog reads spec files. A document that no longer
    /// parses (it passed the publish gate when it was stored) is said and skipped.
    /// Err when the store cannot be read: the caller keeps the catalog in force (an empty
    /// list would withdraw every managed tool while the store is away).
    pub fn spec_files(&self) -> Result<Vec<crate::store::SpecFile>, String> {
        let rows = self
            .store
            .tools()
            .map_err(|e| format!("the managed catalog cannot be read: {e}"))?;
        Ok(rows
            .into_iter()
            .filter_map(|(name, doc)| {
                let path = self.prefix.join(format!("{name}.json"));
                match crate::store::SpecFile::parse(&path, &doc, true) {
                    Ok(f) => f,
                    Err(d) => {
                        tracing::error!(tool = %name, error = %d, "a managed tool does not parse");
                        None
                    }
                }
            })
            .collect())
    }

    /// The tools the operator disabled (Err as [`Managed::spec_files`]: an empty list would
    /// serve every disabled tool again).
    pub fn disabled(&self) -> Result<Vec<String>, String> {
        self.store
            .disabled()
            .map_err(|e| format!("the operator's switches cannot be read: {e}"))
    }

    /// Whether the managed catalog holds `name`.
    pub fn has(&self, name: &ToolName) -> bool {
        self.store.has_tool(name.as_str()).unwrap_or(false)
    }

    /// Installs `doc` as `name`'s served version (the current one to the history), with the
    /// ledger's approval of it: one transaction.
    pub fn install(
        &self,
        name: &ToolName,
        doc: &Value,
        ledger: Option<LedgerRow<'_>>,
    ) -> Result<(), String> {
        let mut text = serde_json::to_vec_pretty(doc).map_err(|e| e.to_string())?;
        text.push(b'\n');
        self.store.install(name.as_str(), &text, ledger)
    }

    /// Puts the newest earlier version back (the current one is dropped), with the ledger
    /// row `ledger` makes of the restored document: one transaction.
    pub fn rollback(
        &self,
        name: &ToolName,
        ledger: impl FnOnce(&[u8]) -> Option<(String, String)>,
    ) -> Result<(), String> {
        self.store.rollback(name.as_str(), ledger).map(|_| ())
    }

    /// Retires a tool: its current version goes to the history (so `rollback` restores it).
    pub fn remove(&self, name: &ToolName) -> Result<(), String> {
        self.store.remove(name.as_str())
    }

    /// The operator's switch for a tool (any tool of the catalog, managed or not).
    pub fn set_enabled(&self, name: &ToolName, enabled: bool) -> Result<(), String> {
        self.store.set_enabled(name.as_str(), enabled)
    }
}
