//! Where the config comes from: `--config FILE` (or `STSD_CONFIG`), else the first that
//! exists of `/etc/stsd/stsd.toml` (root) or `$XDG_CONFIG_HOME/stsd/stsd.toml` (else
//! `~/.config/stsd/stsd.toml`), else the built-in defaults. A named file that is missing is
//! an error; a looked-up file that is missing is not. A file that exists but does not parse
//! is always an error: stsd never falls back to defaults over an operator's broken file.

use std::path::{Path, PathBuf};
use stsd_profiles::Config;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigSource {
    Explicit(PathBuf),
    Lookup,
}

/// The file the lookup would read for this user, whether or not it exists.
pub fn default_path() -> Option<PathBuf> {
    if nix::unistd::Uid::effective().is_root() {
        return Some(PathBuf::from("/etc/stsd/stsd.toml"));
    }
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    env("XDG_CONFIG_HOME")
        .or_else(|| env("HOME").map(|h| h.join(".config")))
        .map(|d| d.join("stsd/stsd.toml"))
}

impl ConfigSource {
    pub fn new(explicit: Option<PathBuf>) -> ConfigSource {
        explicit.map_or(ConfigSource::Lookup, ConfigSource::Explicit)
    }

    /// The file to read now, if any.
    pub fn path(&self) -> Option<PathBuf> {
        match self {
            ConfigSource::Explicit(p) => Some(p.clone()),
            ConfigSource::Lookup => default_path().filter(|p| p.exists()),
        }
    }

    /// The config and the file it came from (None: the built-in defaults).
    pub fn load(&self) -> Result<(Config, Option<PathBuf>), String> {
        match self.path() {
            Some(p) => load_file(&p).map(|c| (c, Some(p))),
            None => Ok((Config::default(), None)),
        }
    }

    /// [`ConfigSource::load`] for a reload (SIGHUP): a file that holds no setting at all is
    /// refused, not taken as "all defaults". An editor or a deploy tool rewriting the file in
    /// place leaves it empty for a moment, and a daemon reading it then would move its audit
    /// log and drop every rule. (Replace config files atomically: write beside, then rename.)
    pub fn reload(&self) -> Result<(Config, Option<PathBuf>), String> {
        if let Some(p) = self.path() {
            let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
            if holds_no_setting(&text) {
                return Err(format!(
                    "{}: the file holds no setting (empty, or being rewritten): refused; \
                     replace config files atomically (write beside, then rename)",
                    p.display()
                ));
            }
        }
        self.load()
    }
}

/// Nothing but blank lines and comments.
fn holds_no_setting(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .all(|l| l.is_empty() || l.starts_with('#'))
}

fn load_file(p: &Path) -> Result<Config, String> {
    Config::load(p).map_err(|e| e.to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Issue 33 item 8: a reload of an empty (or comment-only) file is refused; a start
    /// takes it as the defaults, as before.
    #[test]
    fn a_reload_refuses_a_file_with_no_setting() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("stsd.toml");
        let src = ConfigSource::Explicit(p.clone());
        for empty in ["", "\n\n", "# being rewritten\n  \n"] {
            std::fs::write(&p, empty).unwrap();
            assert!(src.load().is_ok());
            let e = src.reload().unwrap_err();
            assert!(e.contains("holds no setting"), "{e}");
        }
        std::fs::write(&p, "[daemon]\naudit_log = \"/tmp/x.jsonl\"\n").unwrap();
        let (c, _) = src.reload().unwrap();
        assert_eq!(c.daemon.audit_log, Some(PathBuf::from("/tmp/x.jsonl")));
    }
}
