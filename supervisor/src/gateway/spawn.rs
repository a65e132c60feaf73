//! How a stdio upstream is started: never as a child configured inside this multi-threaded
//! daemon, but as `stsd upstream-exec --profile <JSON> -- <program> <args..>`, a fresh exec
//! of stsd's own single-threaded binary that applies the profile and then execs the program
//! (see `stsd_profiles::os::process`). Its environment is built here from nothing: the
//! daemon's own never reaches an upstream.

use crate::cgroup::Group;
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use stsd_profiles::baseline::WorkerConfig;
use stsd_profiles::os::process::{ProcessLimits, ProcessProfile, EXIT_SANDBOX_UNAVAILABLE};
use stsd_profiles::upstream::UpstreamConfig;

/// PATH when the config gives none.
pub const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// A networked upstream's way to its egress proxy: the port its `HTTP_PROXY` names inside
/// its own network namespace, and the child's end of the channel the forwarder there hands
/// connections to the proxy over (see `stsd_profiles::os::process`, `forward`).
#[derive(Debug)]
pub struct ProxyEnd {
    pub port: u16,
    pub channel: OwnedFd,
}

impl ProxyEnd {
    /// A channel pair: the proxy's end (for `EgressProxy::attach`) and this, the child's.
    pub fn pair(port: u16) -> std::io::Result<(OwnedFd, ProxyEnd)> {
        use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
        let (mine, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(std::io::Error::from)?;
        Ok((
            mine,
            ProxyEnd {
                port,
                channel: theirs,
            },
        ))
    }
}

/// Who a stdio upstream runs as: `uid:gid` when stsd runs as root, in `group` (its control
/// group, joined between fork and exec) when it has one.
#[derive(Debug, Clone)]
pub struct Ids {
    pub uid: u32,
    pub gid: u32,
    pub group: Option<Arc<Group>>,
}

impl Default for Ids {
    /// The default worker user (65534:65534), no group.
    fn default() -> Self {
        let w = WorkerConfig::default();
        Ids {
            uid: w.uid,
            gid: w.gid,
            group: None,
        }
    }
}

/// Lets the child inherit `fd` (close-on-exec everywhere else: a concurrent spawn of another
/// upstream never gets it). Runs between fork and exec.
fn inherit(fd: &OwnedFd) -> impl FnMut() -> std::io::Result<()> + Send + Sync + 'static {
    let raw = fd.as_raw_fd();
    move || {
        // SAFETY: fcntl on a descriptor this (forked) process holds; async-signal-safe.
        if unsafe { libc::fcntl(raw, libc::F_SETFD, 0) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

/// The command that starts the stdio upstream `cfg` confined, as `ids`. `env` is the config's environment, already resolved (secrets
/// included: they travel in the environment, never in argv). The upstream's environment is
/// exactly: PATH, HOME=`workspace`, TMPDIR=`workspace/tmp`, LANG=C.UTF-8, then `env` (which
/// may override those), then, with `proxy`, the proxy variables pointing at
/// 127.0.0.1:`port` in the upstream's own network namespace (set last: the config cannot
/// route around the proxy), whose forwarder hands connections over `proxy`'s channel.
///
/// stdin, stdout and stderr are piped; the child is killed when the handle is dropped, and it
/// leads a process group of its own, so `client::pipes::kill` also reaches what it spawned.
/// `stsd_exe` is the stsd binary (the daemon's held exe path).
///
/// Spawn it with `client::pipes::spawn_kept`, from a thread that lives as long as the daemon:
/// the parent-death signal `upstream-exec` arms follows the thread that forked it, and any
/// other thread (a blocking-pool thread, a runtime worker that lent itself to blocking work)
/// may retire and kill the upstream.
pub fn command_as(
    cfg: &UpstreamConfig,
    env: BTreeMap<String, String>,
    workspace: &Path,
    proxy: Option<ProxyEnd>,
    stsd_exe: &Path,
    ids: Ids,
) -> Result<tokio::process::Command, String> {
    let Ids { uid, gid, group } = ids;
    let proxy_port = proxy.as_ref().map(|p| p.port);
    let program = cfg
        .command
        .as_deref()
        .filter(|c| !c.trim().is_empty())
        .ok_or_else(|| format!("upstream {}: not a stdio upstream", cfg.id))?;
    let profile = ProcessProfile {
        uid,
        gid,
        workspace: workspace.to_path_buf(),
        read_paths: cfg.read_paths.clone(),
        proxy_port,
        proxy_channel_fd: proxy.as_ref().map(|p| p.channel.as_raw_fd()),
        limits: ProcessLimits::default(),
    };
    let mut cmd = tokio::process::Command::new(stsd_exe);
    cmd.arg("upstream-exec")
        .arg("--profile")
        .arg(profile.to_json())
        .arg("--")
        .arg(program)
        .args(&cfg.args)
        .env_clear()
        .envs(environment(env, workspace, proxy_port))
        .current_dir(workspace)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    if let Some(g) = group {
        // SAFETY: the hook only calls write(2) (async-signal-safe) between fork and exec.
        unsafe {
            cmd.pre_exec(g.join_hook());
        }
    }
    if let Some(p) = proxy {
        let mut hook = inherit(&p.channel);
        // SAFETY: the hook only calls fcntl (async-signal-safe) between fork and exec. The
        // channel is moved in with it, so it stays open until the command is dropped.
        unsafe {
            cmd.pre_exec(move || {
                let _held = &p.channel;
                hook()
            });
        }
    }
    Ok(cmd)
}

/// The upstream's whole environment (see [`command_as`]).
pub fn environment(
    env: BTreeMap<String, String>,
    workspace: &Path,
    proxy_port: Option<u16>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    out.insert("PATH".into(), DEFAULT_PATH.into());
    out.insert("HOME".into(), workspace.display().to_string());
    out.insert("TMPDIR".into(), workspace.join("tmp").display().to_string());
    out.insert("LANG".into(), "C.UTF-8".into());
    out.extend(env);
    if let Some(port) = proxy_port {
        let url = format!("http://127.0.0.1:{port}");
        for k in [
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "ALL_PROXY",
            "http_proxy",
            "https_proxy",
            "all_proxy",
        ] {
            out.insert(k.into(), url.clone());
        }
        // Nothing bypasses the proxy (the sandbox refuses every other port anyway).
        out.insert("NO_PROXY".into(), String::new());
        out.insert("no_proxy".into(), String::new());
        // Node >= 24 honours the variables above in fetch and http only with this.
        out.insert("NODE_USE_ENV_PROXY".into(), "1".into());
    }
    out
}

/// `stsd upstream-exec --profile <JSON> -- <program> <args..>`: applies the profile and
/// execs the program. Returns only when that failed, after saying why on stderr
/// (`SANDBOX_UNAVAILABLE: ...`), with the exit code to end with (126).
pub fn exec_main(profile_json: &str, program: &str, args: &[String]) -> i32 {
    let why = match ProcessProfile::from_json(profile_json) {
        Ok(p) => stsd_profiles::os::process::exec(&p, program, args).0,
        Err(e) => e,
    };
    eprintln!("SANDBOX_UNAVAILABLE: {why}");
    EXIT_SANDBOX_UNAVAILABLE
}

/// Whether `code` is `upstream-exec`'s "the sandbox could not be applied" (stderr then
/// starts with `SANDBOX_UNAVAILABLE:`).
pub fn is_sandbox_unavailable(code: Option<i32>) -> bool {
    code == Some(EXIT_SANDBOX_UNAVAILABLE)
}

/// Creates the upstream's workspace `path` and `path/tmp` (mode 0700; owned by `uid:gid`
/// when stsd runs as root). Missing parents are created with the default mode. Fails when
/// `path` is not a directory (or is a symlink), or when, running as root, the worker user
/// could not reach it through its parents.
pub fn prepare_workspace(path: &Path, uid: u32, gid: u32) -> Result<(), String> {
    let fail = |p: &Path, e: std::io::Error| format!("workspace {}: {e}", p.display());
    if !path.is_absolute() {
        return Err(format!(
            "workspace {}: not an absolute path",
            path.display()
        ));
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| fail(parent, e))?;
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    // An upstream whose uid changed (`identity`: a new range, a collision) takes what it left
    // in its workspace along.
    if root {
        if let Ok(m) = std::fs::symlink_metadata(path) {
            if m.is_dir() && (m.uid(), m.gid()) != (uid, gid) {
                chown_tree(path, m.dev(), uid, gid).map_err(|e| fail(path, e))?;
            }
        }
    }
    for dir in [path.to_path_buf(), path.join("tmp")] {
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(fail(&dir, e)),
        }
        let meta = std::fs::symlink_metadata(&dir).map_err(|e| fail(&dir, e))?;
        if !meta.is_dir() {
            return Err(format!("workspace {}: not a directory", dir.display()));
        }
        if root {
            std::os::unix::fs::lchown(&dir, Some(uid), Some(gid)).map_err(|e| fail(&dir, e))?;
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| fail(&dir, e))?;
    }
    if root {
        if let Some(blocked) = path.ancestors().skip(1).find(|a| !traversable(a, uid, gid)) {
            return Err(format!(
                "workspace {}: user {uid} cannot reach it, {} is not searchable for it",
                path.display(),
                blocked.display()
            ));
        }
    }
    Ok(())
}

/// lchown of `dir` and everything beneath it on the same filesystem: symlinks are changed,
/// never followed.
fn chown_tree(dir: &Path, dev: u64, uid: u32, gid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(dir, Some(uid), Some(gid))?;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let m = std::fs::symlink_metadata(e.path())?;
        if m.dev() != dev {
            continue;
        }
        if m.is_dir() {
            chown_tree(&e.path(), dev, uid, gid)?;
        } else {
            std::os::unix::fs::lchown(e.path(), Some(uid), Some(gid))?;
        }
    }
    Ok(())
}

/// Whether `uid:gid` (no supplementary groups: the upstream has none) may search `dir`.
/// Whether user `uid` (group `gid`) can run a stdio upstream's program, checked before it is
/// started as that uid (a venv made under `/root`, mode 0700, fails with a bare EACCES at
/// execve otherwise): every directory above the program and above where its links lead
/// searchable, the program executable, and the paths derived for it to read (its install
/// tree, `read_paths`) reachable. Only when stsd is root (otherwise the upstream runs as
/// stsd's own user). Err: what blocks it and what to do.
pub fn program_reachable(cfg: &UpstreamConfig, uid: u32, gid: u32) -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    let Some(cmd) = cfg.command.as_deref() else {
        return Ok(());
    };
    // A program that is not there at all is the confined start's to report (it fails
    // closed, SANDBOX_UNAVAILABLE, naming it).
    let Ok(program) =
        stsd_profiles::os::process::resolve_program(cmd, Some(std::ffi::OsStr::new(DEFAULT_PATH)))
    else {
        return Ok(());
    };
    let fix = "a confined upstream runs as an unprivileged uid of its own: install it where \
               any user can read it (for example under /opt or /usr/local), or open the \
               directory's search bit (chmod o+x)";
    let target = std::fs::canonicalize(&program).unwrap_or_else(|_| program.clone());
    for p in [&program, &target] {
        if let Some(blocked) = p.ancestors().skip(1).find(|a| !traversable(a, uid, gid)) {
            return Err(format!(
                "program {}: user {uid} cannot reach it, {} is not searchable for it; {fix}",
                p.display(),
                blocked.display()
            ));
        }
    }
    if !crate::workspace::permitted(&target, uid, gid, 0o1) {
        return Err(format!(
            "program {}: not executable for user {uid}; {fix}",
            target.display()
        ));
    }
    let reads = stsd_profiles::os::process::derive_read_paths(&program, &cfg.args, &cfg.read_paths);
    for r in reads.iter().filter(|r| r.exists()) {
        if let Some(blocked) = r.ancestors().skip(1).find(|a| !traversable(a, uid, gid)) {
            return Err(format!(
                "{} (which the upstream reads): user {uid} cannot reach it, {} is not \
                 searchable for it; {fix}",
                r.display(),
                blocked.display()
            ));
        }
    }
    Ok(())
}

fn traversable(dir: &Path, uid: u32, gid: u32) -> bool {
    let Ok(m) = std::fs::metadata(dir) else {
        return false;
    };
    m.is_dir() && crate::workspace::permitted(dir, uid, gid, 0o1)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn stdio(cmd: &str, args: &[&str]) -> UpstreamConfig {
        UpstreamConfig {
            id: "t".into(),
            command: Some(cmd.into()),
            args: args.iter().map(|s| s.to_string()).collect(),
            read_paths: vec!["/srv/data".into()],
            ..Default::default()
        }
    }

    #[test]
    fn argv_carries_the_profile_and_the_program_and_no_secret() {
        let mut env = BTreeMap::new();
        env.insert("API_KEY".to_string(), "s3cret".to_string());
        let cmd = command_as(
            &stdio("node", &["server.js", "--x"]),
            env,
            Path::new("/w"),
            Some(ProxyEnd::pair(3128).unwrap().1),
            Path::new("/usr/bin/stsd"),
            Ids {
                uid: 1000,
                gid: 1001,
                group: None,
            },
        )
        .unwrap();
        let std = cmd.as_std();
        let args: Vec<String> = std
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(args[0], "upstream-exec");
        assert_eq!(args[1], "--profile");
        let p = ProcessProfile::from_json(&args[2]).unwrap();
        assert_eq!((p.uid, p.gid, p.proxy_port), (1000, 1001, Some(3128)));
        assert!(p.proxy_channel_fd.is_some_and(|fd| fd > 2));
        assert_eq!(p.workspace, Path::new("/w"));
        assert_eq!(p.read_paths, vec![std::path::PathBuf::from("/srv/data")]);
        assert_eq!(&args[3..], ["--", "node", "server.js", "--x"]);
        assert!(!args.iter().any(|a| a.contains("s3cret")));
        assert_eq!(std.get_current_dir(), Some(Path::new("/w")));
    }

    #[test]
    fn environment_is_built_from_nothing_and_the_proxy_cannot_be_bypassed() {
        let mut env = BTreeMap::new();
        env.insert("API_KEY".to_string(), "k".to_string());
        env.insert("HTTPS_PROXY".to_string(), "http://evil:1".to_string());
        env.insert("PATH".to_string(), "/opt/bin".to_string());
        let e = environment(env.clone(), Path::new("/w"), Some(9000));
        assert_eq!(e["HOME"], "/w");
        assert_eq!(e["TMPDIR"], "/w/tmp");
        assert_eq!(e["LANG"], "C.UTF-8");
        assert_eq!(e["PATH"], "/opt/bin");
        assert_eq!(e["API_KEY"], "k");
        assert_eq!(e["HTTPS_PROXY"], "http://127.0.0.1:9000");
        assert_eq!(e["https_proxy"], "http://127.0.0.1:9000");
        assert_eq!(e["NO_PROXY"], "");
        // Nothing of this process's own environment.
        assert!(!e.contains_key("CARGO_PKG_NAME") && !e.contains_key("USER"));
        let e = environment(BTreeMap::new(), Path::new("/w"), None);
        assert_eq!(e["PATH"], DEFAULT_PATH);
        assert!(!e.contains_key("HTTP_PROXY"));
    }

    #[test]
    fn a_url_upstream_has_no_command() {
        let cfg = UpstreamConfig {
            id: "h".into(),
            url: Some("https://x".into()),
            ..Default::default()
        };
        assert!(command_as(
            &cfg,
            BTreeMap::new(),
            Path::new("/w"),
            None,
            Path::new("/s"),
            Ids::default()
        )
        .is_err());
    }

    #[test]
    fn workspace_is_made_private_and_a_file_is_refused() {
        let d = tempfile::tempdir().unwrap();
        // The temporary directory is 0700: open it for the worker user to reach into.
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let ws = d.path().join("a/b/ws");
        prepare_workspace(&ws, 65534, 65534).unwrap();
        for p in [&ws, &ws.join("tmp")] {
            let m = std::fs::metadata(p).unwrap();
            assert_eq!(m.mode() & 0o777, 0o700);
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } == 0 {
                assert_eq!((m.uid(), m.gid()), (65534, 65534));
            }
        }
        // Idempotent.
        prepare_workspace(&ws, 65534, 65534).unwrap();
        let file = d.path().join("f");
        std::fs::write(&file, b"").unwrap();
        assert!(prepare_workspace(&file, 65534, 65534).is_err());
        assert!(prepare_workspace(Path::new("rel"), 65534, 65534).is_err());
    }

    #[test]
    fn a_workspace_follows_its_upstreams_new_uid_without_following_links() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let ws = d.path().join("ws");
        prepare_workspace(&ws, 65534, 65534).unwrap();
        std::fs::create_dir(ws.join("cache")).unwrap();
        std::fs::write(ws.join("cache/f"), b"x").unwrap();
        let outside = d.path().join("outside");
        std::fs::write(&outside, b"root's").unwrap();
        std::os::unix::fs::symlink(&outside, ws.join("link")).unwrap();
        prepare_workspace(&ws, 61200, 61200).unwrap();
        for p in [&ws, &ws.join("tmp"), &ws.join("cache"), &ws.join("cache/f")] {
            let m = std::fs::symlink_metadata(p).unwrap();
            assert_eq!((m.uid(), m.gid()), (61200, 61200), "{}", p.display());
        }
        assert_eq!(
            std::fs::symlink_metadata(ws.join("link")).unwrap().uid(),
            61200
        );
        assert_eq!(std::fs::metadata(&outside).unwrap().uid(), 0);
    }

    #[test]
    fn unreachable_workspace_is_reported_as_root() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let locked = d.path().join("locked");
        std::fs::create_dir(&locked).unwrap();
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).unwrap();
        let e = prepare_workspace(&locked.join("ws"), 65534, 65534).unwrap_err();
        assert!(e.contains("cannot reach"), "{e}");
    }
}
