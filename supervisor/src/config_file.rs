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
}

fn load_file(p: &Path) -> Result<Config, String> {
    Config::load(p).map_err(|e| e.to_string())
}
