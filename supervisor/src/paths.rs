//! Default locations: the socket, the audit log and the state directory.
//!
//! Each first honours the directory systemd gives a service (`RUNTIME_DIRECTORY`,
//! `LOGS_DIRECTORY`, `STATE_DIRECTORY`, set by the unit's `RuntimeDirectory=`,
//! `LogsDirectory=`, `StateDirectory=`), which the packaged unit sets to the same
//! `/run/stsd`, `/var/log/stsd` and `/var/lib/stsd`. `scripts/test` points them at a scratch
//! directory, so that no test writes the machine's own.

use std::path::PathBuf;

fn env_dir(key: &str) -> Option<PathBuf> {
    std::env::var_os(key)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// A directory systemd gave the service: the first of its colon-separated list.
pub fn systemd_dir(key: &str) -> Option<PathBuf> {
    let v = std::env::var(key).ok()?;
    let first = v.split(':').next().filter(|d| d.starts_with('/'))?;
    Some(PathBuf::from(first))
}

fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

/// `$XDG_RUNTIME_DIR/stsd.sock`; else `/run/stsd/stsd.sock` for root; else
/// `/tmp/stsd-<uid>/stsd.sock` (a private directory).
pub fn default_socket() -> PathBuf {
    if let Some(d) = systemd_dir("RUNTIME_DIRECTORY") {
        return d.join("stsd.sock");
    }
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
    if let Some(d) = systemd_dir("LOGS_DIRECTORY") {
        return d.join("audit.jsonl");
    }
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
    if let Some(d) = systemd_dir("STATE_DIRECTORY") {
        return d;
    }
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
