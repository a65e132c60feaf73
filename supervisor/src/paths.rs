//! Default locations: the socket and the audit log.

use std::path::PathBuf;

fn env_dir(key: &str) -> Option<PathBuf> {
    std::env::var_os(key)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

/// `$XDG_RUNTIME_DIR/stsd.sock`; else `/run/stsd/stsd.sock` for root; else
/// `/tmp/stsd-<uid>/stsd.sock` (a private directory).
pub fn default_socket() -> PathBuf {
    if let Some(d) = env_dir("XDG_RUNTIME_DIR") {
        return d.join("stsd.sock");
    }
    if is_root() {
        return PathBuf::from("/run/stsd/stsd.sock");
    }
    PathBuf::from(format!(
        "/tmp/stsd-{}/stsd.sock",
        nix::unistd::Uid::effective().as_raw()
    ))
}

/// `/var/log/stsd/audit.jsonl` for root; else `$XDG_STATE_HOME/stsd/audit.jsonl`, else
/// `~/.local/state/stsd/audit.jsonl`.
pub fn default_audit_log() -> PathBuf {
    if is_root() {
        return PathBuf::from("/var/log/stsd/audit.jsonl");
    }
    if let Some(d) = env_dir("XDG_STATE_HOME") {
        return d.join("stsd/audit.jsonl");
    }
    if let Some(h) = env_dir("HOME") {
        return h.join(".local/state/stsd/audit.jsonl");
    }
    PathBuf::from(format!(
        "/tmp/stsd-{}/audit.jsonl",
        nix::unistd::Uid::effective().as_raw()
    ))
}

/// The daemon's state (the fingerprint ledger, upstream workspaces): `/var/lib/stsd` for
/// root; else `$XDG_STATE_HOME/stsd`, else `~/.local/state/stsd`.
pub fn default_state_dir() -> PathBuf {
    if is_root() {
        return PathBuf::from("/var/lib/stsd");
    }
    if let Some(d) = env_dir("XDG_STATE_HOME") {
        return d.join("stsd");
    }
    if let Some(h) = env_dir("HOME") {
        return h.join(".local/state/stsd");
    }
    PathBuf::from(format!(
        "/tmp/stsd-{}/state",
        nix::unistd::Uid::effective().as_raw()
    ))
}
