//! The profile of a stdio upstream (an external MCP server: an arbitrary program, node or
//! python), applied by `stsd upstream-exec` (a fresh exec of stsd, single-threaded, never a
//! hook in the daemon) right before it execs the program:
//!
//! 1. the program is resolved on the PATH of the environment it was given, and its read
//!    paths derived ([`derive_read_paths`]);
//! 2. every fd but stdio closed;
//! 3. a network namespace of its own; with network, its loopback holds the proxy's listener,
//!    behind which a forwarder hands each connection to the supervisor's egress proxy
//!    ([`forward`]): the only way out;
//! 4. when root: the worker user, no capability; always no_new_privs, not dumpable, the
//!    parent-death signal;
//! 5. rlimits ([`ProcessLimits`]);
//! 6. Landlock: read and execute on the read paths, everything on the workspace, TCP connect
//!    to the proxy port only (bind never), abstract Unix sockets and signals scoped;
//! 7. seccomp: the escape-class deny-list ([`filter`]);
//! 8. execve, with the environment `upstream-exec` itself was given (the supervisor clears
//!    its own and passes exactly the upstream's).
//!
//! Any failure before the exec is reported as `SANDBOX_UNAVAILABLE: ...` on stderr, exit 126:
//! the upstream never runs unconfined.

mod fence;
pub mod filter;
mod forward;
mod paths;

pub use paths::derive_read_paths;

use super::SandboxUnavailable;
use nix::sys::resource::{getrlimit, setrlimit, Resource};
use serde::{Deserialize, Serialize};
use std::convert::Infallible;
use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The exit code of `upstream-exec` when the profile cannot be applied (as a shell's
/// "cannot execute").
pub const EXIT_SANDBOX_UNAVAILABLE: i32 = 126;

/// What `stsd upstream-exec --profile <JSON>` applies. It carries no secret (secrets travel
/// in the environment, never in argv, which any local user can read).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessProfile {
    /// The user the upstream runs as when stsd runs as root (the worker user).
    pub uid: u32,
    pub gid: u32,
    /// The only directory it may write (must exist; see the supervisor's
    /// `upstream::spawn::prepare_workspace`).
    pub workspace: PathBuf,
    /// Paths it may read besides the derived ones (the config's `read_paths`).
    #[serde(default)]
    pub read_paths: Vec<PathBuf>,
    /// With a port: the upstream's own network namespace holds one listener,
    /// 127.0.0.1:port, behind which the forwarder hands each connection to the supervisor's
    /// egress proxy over `proxy_channel_fd` (see `forward`); Landlock allows TCP connect to
    /// that port and nothing else. Without: no network at all.
    #[serde(default)]
    pub proxy_port: Option<u16>,
    /// The descriptor (inherited) of the channel to the supervisor's egress proxy; required
    /// with `proxy_port`.
    #[serde(default)]
    pub proxy_channel_fd: Option<i32>,
    #[serde(default)]
    pub limits: ProcessLimits,
}

/// Resource limits (soft = hard). Lowered to the current hard limit when that is lower (an
/// unprivileged stsd cannot raise them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProcessLimits {
    /// RLIMIT_NPROC: processes and threads of the user, counted across all its processes
    /// (workers of the same user included). Node needs about 12 to start (its V8 and libuv
    /// threads; it hangs or aborts below that), so this is a fork-bomb stop, not a budget.
    pub nproc: u64,
    /// RLIMIT_DATA (writable private memory). Not RLIMIT_AS: V8 reserves large address
    /// ranges it never touches (WebAssembly.Memory fails under a 4 GiB RLIMIT_AS).
    pub data_bytes: u64,
    /// RLIMIT_FSIZE: the largest file it may write.
    pub file_size: u64,
    /// RLIMIT_NOFILE.
    pub nofile: u64,
}

impl Default for ProcessLimits {
    fn default() -> Self {
        ProcessLimits {
            nproc: 512,
            data_bytes: 4 << 30,
            file_size: 1 << 30,
            nofile: 1024,
        }
    }
}

impl ProcessProfile {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn from_json(text: &str) -> Result<ProcessProfile, String> {
        serde_json::from_str(text).map_err(|e| format!("profile: {e}"))
    }
}

/// `program` as execve needs it: a name without `/` is looked up in `path_var` (the
/// upstream's PATH, not the daemon's), the first executable regular file wins; a name with
/// `/` is taken as is. The result is absolute.
pub fn resolve_program(program: &str, path_var: Option<&OsStr>) -> Result<PathBuf, String> {
    let is_exec = |p: &Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.is_empty() {
        return Err("the upstream command is empty".into());
    }
    if program.contains('/') {
        let p = std::path::absolute(program).map_err(|e| format!("{program}: {e}"))?;
        return if is_exec(&p) {
            Ok(p)
        } else {
            Err(format!("{}: not an executable file", p.display()))
        };
    }
    let path_var = path_var.unwrap_or(OsStr::new("/usr/local/bin:/usr/bin:/bin"));
    std::env::split_paths(path_var)
        .filter(|d| d.is_absolute())
        .map(|d| d.join(program))
        .find(|p| is_exec(p))
        .ok_or_else(|| format!("{program}: not found on PATH"))
}

/// Applies the profile and execs `program` with `args` and this process's environment.
/// Returns only on failure (the upstream then must not run).
pub fn exec(profile: &ProcessProfile, program: &str, args: &[String]) -> SandboxUnavailable {
    match confine_and_exec(profile, program, args) {
        Ok(never) => match never {},
        Err(e) => SandboxUnavailable(e),
    }
}

fn cstring(b: &[u8]) -> Result<CString, String> {
    CString::new(b).map_err(|_| "a NUL byte in an argument or the environment".to_string())
}

fn confine_and_exec(
    profile: &ProcessProfile,
    program: &str,
    args: &[String],
) -> Result<Infallible, String> {
    let parent = nix::unistd::getppid().as_raw() as u32;
    // Everything that allocates or reads the filesystem happens before the walls go up.
    let env: Vec<CString> = std::env::vars_os()
        .map(|(k, v)| cstring(&[k.as_bytes(), b"=", v.as_bytes()].concat()))
        .collect::<Result<_, _>>()?;
    let resolved = resolve_program(program, std::env::var_os("PATH").as_deref())?;
    let read = derive_read_paths(&resolved, args, &profile.read_paths);
    let workspace = std::fs::canonicalize(&profile.workspace)
        .map_err(|e| format!("workspace {}: {e}", profile.workspace.display()))?;
    if !workspace.is_dir() {
        return Err(format!(
            "workspace {} is not a directory",
            workspace.display()
        ));
    }
    let path = cstring(resolved.as_os_str().as_bytes())?;
    let argv: Vec<CString> = std::iter::once(program)
        .chain(args.iter().map(String::as_str))
        .map(|a| cstring(a.as_bytes()))
        .collect::<Result<_, _>>()?;
    let [enosys, deny] = filter::programs()?;
    let proxy = match (profile.proxy_port, profile.proxy_channel_fd) {
        (Some(port), Some(fd)) if fd > 2 => Some((port, fd)),
        (Some(_), _) => {
            return Err(
                "a networked upstream needs its proxy channel (proxy_channel_fd > 2)".into(),
            )
        }
        (None, _) => None,
    };

    close_all_but_stdio(proxy.map(|p| p.1))?;
    let own_netns = fence::isolate_network();
    if let Some((port, channel)) = proxy {
        // Fail closed: without a namespace of its own, a port on the host's loopback would
        // be a way past the proxy.
        if !own_netns {
            return Err(
                "no network namespace of its own: a networked upstream's only way \
                        out must be its proxy"
                    .into(),
            );
        }
        forward::start(port, channel, profile.uid, profile.gid)?;
    }
    super::privileges::switch_user(profile.uid, profile.gid)?;
    super::privileges::clear_capabilities()?;
    super::privileges::lock_process(parent)?;
    apply_limits(&profile.limits)?;
    fence::restrict(&read, &workspace, profile.proxy_port, own_netns)?;
    seccompiler::apply_filter(&enosys).map_err(|e| format!("seccomp: {e}"))?;
    seccompiler::apply_filter(&deny).map_err(|e| format!("seccomp: {e}"))?;
    nix::unistd::execve(&path, &argv, &env).map_err(|e| format!("execve {program}: {e}"))
}

/// Nothing of stsd's may reach the upstream but the three pipes it speaks MCP over (and,
/// until the forwarder takes it, the proxy channel `keep`).
fn close_all_but_stdio(keep: Option<i32>) -> Result<(), String> {
    let close = |from: u32, to: u32| {
        // SAFETY: close_range with plain integer arguments; no Rust object owns these fds.
        if from <= to && unsafe { libc::close_range(from, to, 0) } != 0 {
            return Err(format!("close_range: {}", std::io::Error::last_os_error()));
        }
        Ok(())
    };
    match keep.and_then(|k| u32::try_from(k).ok()).filter(|k| *k > 2) {
        Some(k) => {
            close(3, k - 1)?;
            close(k + 1, u32::MAX)
        }
        None => close(3, u32::MAX),
    }
}

fn apply_limits(l: &ProcessLimits) -> Result<(), String> {
    let set = |r: Resource, v: u64, name: &str| {
        let (_, hard) = getrlimit(r).map_err(|e| format!("getrlimit {name}: {e}"))?;
        let v = v.min(hard);
        setrlimit(r, v, v).map_err(|e| format!("setrlimit {name}: {e}"))
    };
    set(Resource::RLIMIT_CORE, 0, "CORE")?;
    set(Resource::RLIMIT_NPROC, l.nproc, "NPROC")?;
    set(Resource::RLIMIT_DATA, l.data_bytes, "DATA")?;
    set(Resource::RLIMIT_FSIZE, l.file_size, "FSIZE")?;
    set(Resource::RLIMIT_NOFILE, l.nofile, "NOFILE")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn profile_round_trips_and_defaults_apply() {
        let p = ProcessProfile::from_json(r#"{"uid":1,"gid":2,"workspace":"/w"}"#).unwrap();
        assert_eq!(p.limits, ProcessLimits::default());
        assert_eq!(p.proxy_port, None);
        assert_eq!(ProcessProfile::from_json(&p.to_json()).unwrap(), p);
        assert!(ProcessProfile::from_json(r#"{"uid":1,"gid":2,"workspace":"/w","x":1}"#).is_err());
    }

    #[test]
    fn programs_resolve_on_the_given_path_only() {
        let sh = resolve_program("sh", Some(OsStr::new("/nonexistent:/usr/bin"))).unwrap();
        assert_eq!(sh, PathBuf::from("/usr/bin/sh"));
        assert!(resolve_program("sh", Some(OsStr::new("/nonexistent"))).is_err());
        // Relative PATH entries are ignored (they would depend on the cwd).
        assert!(resolve_program("sh", Some(OsStr::new("usr/bin"))).is_err());
        assert!(resolve_program("/proc/self/status", None).is_err());
        assert!(resolve_program("", None).is_err());
    }
}
