//! The operator's secrets directory: one file per secret, named after it, mode 0600 in a
//! 0700 directory (`[gateway] secrets_dir`, else `<state dir>/secrets`). The one entry point
//! for what a spec's `${NAME}` and `${secret:NAME}` resolve to ([`spec_env`]) and for
//! `stsd secret set|rm|list` ([`set`], [`remove`], [`names`]).
//!
//! A value is read when it is used: at publish (the §11.2 requirement check) and at every
//! call, so a secret set or changed takes effect on the next call without a restart. What a
//! spec's code gets is still a placeholder (`crate::egress::secrets`), and every value is
//! masked in what comes back.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use stsd_profiles::Config;
use stsd_protocol::envvar::{secret_name, AllowedEnv, EnvSource};

/// The longest value `stsd secret set` stores (a key, a token, a webhook URL, a PEM).
pub const MAX_VALUE_BYTES: usize = 64 * 1024;

/// The secrets directory of a config.
pub fn dir(config: &Config) -> PathBuf {
    crate::state::secrets_dir(config)
}

/// What a spec's placeholders resolve against: `${secret:NAME}` from the secrets directory
/// only; `${NAME}` from the secrets directory, else the daemon's environment as
/// `[baseline] env_allow` lets specs see it.
///
/// A secret in the directory is a tool's only when the operator said so: set with `--host`
/// (kept in `.hosts/NAME`: the hosts it may be sent to), or named in the config's
/// `[secrets.NAME]`. Any other secret there (an upstream's token, the store's password) is
/// not for a spec that happens to name it.
pub struct SpecEnv<'a> {
    pub dir: PathBuf,
    pub env: AllowedEnv<'a>,
    pub config: &'a std::collections::BTreeMap<String, stsd_profiles::baseline::SecretConfig>,
}

pub fn spec_env(config: &Config) -> SpecEnv<'_> {
    SpecEnv {
        dir: dir(config),
        env: config.baseline.env(),
        config: &config.secrets,
    }
}

impl EnvSource for SpecEnv<'_> {
    fn lookup(&self, name: &str) -> Option<String> {
        let bare = secret_name(name).unwrap_or(name);
        let granted = self.config.contains_key(bare) || granted_hosts(&self.dir, bare).is_some();
        let file = if granted { read(&self.dir, bare) } else { None };
        match secret_name(name) {
            Some(_) => file,
            None => file.or_else(|| self.env.lookup(name)),
        }
    }

    fn hosts(&self, name: &str) -> Option<Vec<String>> {
        granted_hosts(&self.dir, secret_name(name).unwrap_or(name))
    }
}

impl SpecEnv<'_> {
    /// Why `name` (a placeholder name a spec holds) has no value, and what to do.
    pub fn why_missing(&self, name: &str) -> String {
        let n = secret_name(name).unwrap_or(name);
        let set = format!("stsd secret set {n} --host HOST");
        if read(&self.dir, n).is_some() {
            return format!(
                "{name} (secret {n} is set, but not for tools: {set} names the hosts it may go to)"
            );
        }
        if secret_name(name).is_some() {
            return format!("{name} (no secret {n}: {set})");
        }
        if std::env::var_os(name).is_some() && !self.env.allows(name) {
            return format!(
                "{name} (in the environment but not in [baseline] env_allow; or {set})"
            );
        }
        format!("{name} ({set}, or name it in [baseline] env_allow and set it in the environment)")
    }
}

/// Where the hosts a secret was given for are kept: a hidden directory, never a secret name.
fn hosts_file(dir: &Path, name: &str) -> PathBuf {
    dir.join(".hosts").join(name)
}

/// The hosts secret `name` was set for (`stsd secret set NAME --host H`); None when it was
/// not set for tools.
pub fn granted_hosts(dir: &Path, name: &str) -> Option<Vec<String>> {
    check_name(name).ok()?;
    let text = read_file(&hosts_file(dir, name))?;
    Some(
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect(),
    )
}

/// A host a secret may be sent to: a name or `*.apex`, never `*` alone (every host is no
/// boundary for a secret).
pub fn check_host(host: &str) -> Result<&str, String> {
    let h = host.trim();
    let ok = !h.is_empty()
        && h != "*"
        && h.len() <= 253
        && h.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '*' | ':' | '[' | ']'));
    if ok {
        Ok(h)
    } else {
        Err(format!(
            "{host:?} is not a host a secret may go to (a name or *.apex, not *)"
        ))
    }
}

/// A secret's name: letters, digits, `_`, `-` and `.`, starting with a letter, digit or `_`
/// (so no name is a path, hidden, or an option). A spec's placeholders are narrower still
/// (`[A-Z_][A-Z0-9_]*`); an upstream's `${secret:NAME}` may use the rest.
pub fn check_name(name: &str) -> Result<&str, String> {
    let mut b = name.bytes();
    let ok = matches!(b.next(), Some(c) if c.is_ascii_alphanumeric() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || b"_-.".contains(&c))
        && name.len() <= 128;
    if ok {
        Ok(name)
    } else {
        Err(format!(
            "{name:?} is not a secret name: letters, digits, _, - and ., starting with a letter, \
             digit or _ (a spec names it as ${{NAME}} or ${{secret:NAME}})"
        ))
    }
}

/// The value of secret `name`, trailing newline trimmed; None when unset or blank.
fn read(dir: &Path, name: &str) -> Option<String> {
    check_name(name).ok()?;
    let v = read_file(&dir.join(name))?;
    let v = v.trim_end_matches(['\n', '\r']).to_string();
    (!v.trim().is_empty()).then_some(v)
}

/// A small regular file's text: not through a symlink, never blocking on a FIFO, and a file
/// over [`MAX_VALUE_BYTES`] refused whole (a cut value would be a wrong one).
fn read_file(path: &Path) -> Option<String> {
    use std::io::Read;
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let meta = f.metadata().ok()?;
    if !meta.is_file() {
        return None;
    }
    if meta.len() > MAX_VALUE_BYTES as u64 {
        tracing::warn!(path = %path.display(), "a secret file over 64 KiB is not read");
        return None;
    }
    let mut v = String::new();
    f.take(MAX_VALUE_BYTES as u64).read_to_string(&mut v).ok()?;
    Some(v)
}

/// Stores secret `name` (replacing it): the directory made 0700, the file 0600 from its
/// first byte, written whole or not at all.
pub fn set(dir: &Path, name: &str, value: &str) -> Result<(), String> {
    set_for(dir, name, value, None)
}

/// [`set`]; with `hosts` the secret is also a tool's, to be sent only to those hosts (the
/// hosts given before stay when `hosts` is None).
pub fn set_for(
    dir: &Path,
    name: &str,
    value: &str,
    hosts: Option<&[String]>,
) -> Result<(), String> {
    let name = check_name(name)?;
    let hosts: Option<Vec<&str>> = hosts
        .map(|h| h.iter().map(|x| check_host(x)).collect::<Result<_, _>>())
        .transpose()?;
    if hosts.as_ref().is_some_and(Vec::is_empty) {
        return Err("--host names no host".into());
    }
    let value = value.trim_end_matches(['\n', '\r']);
    if value.trim().is_empty() {
        return Err(format!("the value of {name} is empty"));
    }
    if value.len() > MAX_VALUE_BYTES {
        return Err(format!(
            "the value of {name} is {} bytes; at most {MAX_VALUE_BYTES}",
            value.len()
        ));
    }
    private_dir(dir)?;
    write_private(&dir.join(name), value.as_bytes(), "secret-written")
        .map_err(|e| format!("{}: {e}", dir.join(name).display()))?;
    if let Some(hosts) = hosts {
        let file = hosts_file(dir, name);
        private_dir(file.parent().unwrap_or(dir))?;
        let text = format!("{}\n", hosts.join("\n"));
        write_private(&file, text.as_bytes(), "secret-hosts-written")
            .map_err(|e| format!("{}: {e}", file.display()))?;
    }
    Ok(())
}

/// Deletes secret `name` (and the hosts it was given for). Ok(false) when there was none.
pub fn remove(dir: &Path, name: &str) -> Result<bool, String> {
    let name = check_name(name)?;
    let _ = fs::remove_file(hosts_file(dir, name));
    match fs::remove_file(dir.join(name)) {
        Ok(()) => {
            let _ = fs::File::open(dir).and_then(|d| d.sync_all());
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(format!("{}: {e}", dir.join(name).display())),
    }
}

/// The names of the secrets set (never their values), sorted.
pub fn names(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| check_name(n).is_ok())
        .collect();
    out.sort();
    out
}

/// Makes `dir` (and its parents) and narrows it to 0700.
pub fn private_dir(dir: &Path) -> Result<(), String> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    // A directory made earlier with a wider mode is narrowed.
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
        .map_err(|e| format!("{}: {e}", dir.display()))
}

/// Writes `bytes` to `path` as a file only its owner reads: created 0600 (no moment at a
/// wider mode), synced, renamed over `path`, the directory synced. `crash` names the point
/// between the write and the rename for the crash tests (`crate::state::crash_point`).
pub fn write_private(path: &Path, bytes: &[u8], crash: &str) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // Unique per write: two writers never share a temp file.
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{}.{seq}.tmp", std::process::id()));
    let result = (|| {
        let _ = fs::remove_file(&tmp);
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        crate::state::crash_point(crash);
        fs::rename(&tmp, path)?;
        fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn no_config() -> &'static BTreeMap<String, stsd_profiles::baseline::SecretConfig> {
        static EMPTY: std::sync::OnceLock<BTreeMap<String, stsd_profiles::baseline::SecretConfig>> =
            std::sync::OnceLock::new();
        EMPTY.get_or_init(BTreeMap::new)
    }

    #[test]
    fn set_reads_back_private_and_names_are_never_paths() {
        let d = tempfile::tempdir().expect("test setup");
        let dir = d.path().join("secrets");
        let hosts = ["api.example.com".to_string()];
        set_for(&dir, "API_KEY", "k-123456\n", Some(&hosts)).expect("test setup");
        let meta = fs::metadata(dir.join("API_KEY")).expect("test setup");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(
            fs::metadata(&dir).expect("test setup").permissions().mode() & 0o777,
            0o700
        );
        let env = SpecEnv {
            dir: dir.clone(),
            env: AllowedEnv { allow: &[] },
            config: no_config(),
        };
        assert_eq!(env.lookup("API_KEY").as_deref(), Some("k-123456"));
        assert_eq!(env.lookup("secret:API_KEY").as_deref(), Some("k-123456"));
        assert_eq!(env.hosts("secret:API_KEY"), Some(hosts.to_vec()));
        // Changed without --host: the next lookup sees the new value, the hosts stay.
        set(&dir, "API_KEY", "k-999").expect("test setup");
        assert_eq!(env.lookup("secret:API_KEY").as_deref(), Some("k-999"));
        assert_eq!(env.hosts("API_KEY"), Some(hosts.to_vec()));
        for bad in ["../x", "X/Y", ".X", "", "-x", "a b"] {
            assert!(set(&dir, bad, "v").is_err(), "{bad}");
            assert_eq!(env.lookup(&format!("secret:{bad}")), None);
        }
        assert!(set(&dir, "EMPTY", " \n").is_err());
        assert!(set_for(&dir, "ANY", "v", Some(&["*".to_string()])).is_err());
        assert_eq!(names(&dir), ["API_KEY"]);
        assert!(remove(&dir, "API_KEY").expect("test setup"));
        assert!(!remove(&dir, "API_KEY").expect("test setup"));
        assert_eq!(env.lookup("secret:API_KEY"), None);
        assert_eq!(env.hosts("API_KEY"), None);
    }

    /// A secret set for upstreams (no --host, not in `[secrets.NAME]`) is not a spec's, even
    /// when a spec names it: an upstream's token is not for any tool that asks.
    #[test]
    fn a_secret_not_given_to_tools_is_not_a_specs() {
        let d = tempfile::tempdir().expect("test setup");
        set(d.path(), "GITHUB_TOKEN", "ghp-upstreams-only").expect("test setup");
        let env = SpecEnv {
            dir: d.path().to_path_buf(),
            env: AllowedEnv { allow: &[] },
            config: no_config(),
        };
        assert_eq!(env.lookup("GITHUB_TOKEN"), None);
        assert_eq!(env.lookup("secret:GITHUB_TOKEN"), None);
        assert!(env.why_missing("GITHUB_TOKEN").contains("not for tools"));
        // Named in the config: the operator gave it to tools.
        let mut config = BTreeMap::new();
        config.insert("GITHUB_TOKEN".to_string(), Default::default());
        let env = SpecEnv {
            dir: d.path().to_path_buf(),
            env: AllowedEnv { allow: &[] },
            config: &config,
        };
        assert_eq!(
            env.lookup("GITHUB_TOKEN").as_deref(),
            Some("ghp-upstreams-only")
        );
    }

    #[test]
    fn a_secret_name_never_reads_the_environment_and_a_symlink_or_fifo_is_not_read() {
        let d = tempfile::tempdir().expect("test setup");
        std::env::set_var("STSD_SECRETS_TEST_ONLY_ENV", "from-env");
        let all = ["*".to_string()];
        let mut config = BTreeMap::new();
        for n in ["STSD_SECRETS_TEST_ONLY_ENV", "LINKED", "PIPE", "HUGE"] {
            config.insert(n.to_string(), Default::default());
        }
        let env = SpecEnv {
            dir: d.path().to_path_buf(),
            env: AllowedEnv { allow: &all },
            config: &config,
        };
        assert_eq!(env.lookup("secret:STSD_SECRETS_TEST_ONLY_ENV"), None);
        assert_eq!(
            env.lookup("STSD_SECRETS_TEST_ONLY_ENV").as_deref(),
            Some("from-env")
        );
        fs::write(d.path().join("target"), "outside").expect("test setup");
        std::os::unix::fs::symlink(d.path().join("target"), d.path().join("LINKED"))
            .expect("test setup");
        assert_eq!(env.lookup("secret:LINKED"), None);
        // A FIFO would block a reader forever; a file over the limit would be cut.
        nix::unistd::mkfifo(&d.path().join("PIPE"), nix::sys::stat::Mode::S_IRWXU)
            .expect("test setup");
        assert_eq!(env.lookup("secret:PIPE"), None);
        fs::write(d.path().join("HUGE"), vec![b'x'; MAX_VALUE_BYTES + 1]).expect("test setup");
        assert_eq!(env.lookup("secret:HUGE"), None);
    }
}
