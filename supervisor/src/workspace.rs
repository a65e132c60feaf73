//! The base path a file posture is confined to, made ready for a worker.
//!
//! The resolver already checked the path lexically against the operator's roots. Here the path
//! is resolved on disk (symlinks followed) and checked again against the resolved roots, so a
//! symlink inside an allowed root cannot hand Landlock a directory outside it. Directories are
//! created only inside stsd's own workspace.

use std::path::{Path, PathBuf};
use stsd_profiles::Config;
use stsd_protocol::frames::{FsAccess, SandboxSpec};

/// Creates (when it is ours), resolves and checks the base path of a job, and writes the
/// resolved path back into it. An error means the tool must not run (SANDBOX_UNAVAILABLE).
pub fn prepare_base_path(sandbox: &mut SandboxSpec, config: &Config) -> Result<(), String> {
    if sandbox.fs == FsAccess::None {
        return Ok(());
    }
    let path = PathBuf::from(&sandbox.base_path);
    let workspace = config.baseline.fs_base_path();
    if !path.exists() && path.starts_with(&workspace) {
        create_owned(&workspace, &path, config)?;
    }
    if path == workspace {
        seed_readme(&workspace, config)?;
    }
    let real = checked_real_path(&path, config)?;
    sandbox.base_path = real.display().to_string();
    Ok(())
}

/// `path` resolved on disk (symlinks followed): a directory under one of the allowed roots.
pub fn checked_real_path(path: &Path, config: &Config) -> Result<PathBuf, String> {
    let real = path
        .canonicalize()
        .map_err(|e| format!("base path {}: {e}", path.display()))?;
    if !real.is_dir() {
        return Err(format!("base path {} is not a directory", real.display()));
    }
    let roots: Vec<PathBuf> = config
        .baseline
        .base_roots()
        .iter()
        .filter_map(|r| r.canonicalize().ok())
        .collect();
    if !roots.iter().any(|r| real.starts_with(r)) {
        return Err(format!(
            "base path {} resolves to {}, outside every allowed root",
            path.display(),
            real.display()
        ));
    }
    Ok(real)
}

/// An empty workspace gets a short README on first use, as the reference runtime seeds its
/// own, so the file tools have something to read.
pub const WORKSPACE_README: &str = include_str!("../assets/workspace-README.md");

fn chown_to_worker(f: &std::fs::File, config: &Config) -> Result<(), String> {
    if nix::unistd::Uid::effective().is_root() {
        let (u, g) = (config.worker.uid, config.worker.gid);
        std::os::unix::fs::fchown(f, Some(u), Some(g)).map_err(|e| format!("fchown: {e}"))?;
    }
    Ok(())
}

/// Writes README.md into an empty workspace. Created new and never through a symlink: this
/// runs as root, in a directory the worker user owns.
fn seed_readme(workspace: &Path, config: &Config) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let empty = std::fs::read_dir(workspace)
        .map(|mut d| d.next().is_none())
        .unwrap_or(false);
    if !empty {
        return Ok(());
    }
    let readme = workspace.join("README.md");
    let mut f = match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&readme)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(format!("cannot seed {}: {e}", readme.display())),
    };
    f.write_all(WORKSPACE_README.as_bytes())
        .map_err(|e| format!("cannot seed {}: {e}", readme.display()))?;
    chown_to_worker(&f, config)
}

/// Creates `path` inside stsd's workspace, one directory at a time, as root, without following
/// a symlink anywhere on the way (a process running as the worker user could have planted
/// one), handing each new directory to the worker user.
fn create_owned(workspace: &Path, path: &Path, config: &Config) -> Result<(), String> {
    let create = |dir: &Path| -> Result<(), String> {
        std::fs::create_dir(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        chown_to_worker(&f, config)
    };
    use std::os::unix::fs::OpenOptionsExt;
    if !workspace.exists() {
        // The workspace itself is the operator's configured path; its parents are theirs too.
        if let Some(parent) = workspace.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        }
        create(workspace)?;
    }
    let rel = path
        .strip_prefix(workspace)
        .map_err(|_| format!("{} is not inside the workspace", path.display()))?;
    let mut cur = workspace.to_path_buf();
    for comp in rel.components() {
        cur.push(comp);
        match std::fs::symlink_metadata(&cur) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(format!(
                    "refusing to create a base path through the symlink {}",
                    cur.display()
                ))
            }
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(format!("{} is not a directory", cur.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => create(&cur)?,
            Err(e) => return Err(format!("{}: {e}", cur.display())),
        }
    }
    Ok(())
}

/// Which layer refused a file operation the worker reported as denied
/// (`stsd_protocol::fs_denial`): the file system's own permissions for the worker's uid and
/// gid (the operator's fix: the owner or the mode), or Landlock. Ok(code, message) for the
/// caller; None when `message` is no such report. The base path is the one the call ran in;
/// a path that resolves outside it is Landlock's refusal, and nothing about what lies outside
/// is said.
pub fn explain_denial(
    message: &str,
    base: &Path,
    uid: u32,
    gid: u32,
) -> Option<(stsd_protocol::Code, String)> {
    use std::os::unix::fs::MetadataExt;
    use stsd_protocol::fs_denial::{parse, Need};
    let (rel, need) = parse(message)?;
    // A daemon that is not root cannot change a worker's uid: its workers run as it does.
    let (uid, gid) = if nix::unistd::geteuid().is_root() {
        (uid, gid)
    } else {
        (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        )
    };
    let landlock = || {
        Some((
            stsd_protocol::Code::Security,
            format!(
                "access denied by the sandbox (Landlock): {rel} resolves outside what this \
                 tool's toolSafety grants"
            ),
        ))
    };
    let base = std::fs::canonicalize(base).ok()?;
    let at = base.join(rel);
    let parent = at.parent().unwrap_or(&base).to_path_buf();
    // The file itself (read it; write it when it exists), else its directory: search to
    // reach a name, search and write to add or remove one.
    let (target, bits) = match (need, at.exists()) {
        (Need::Read, true) => (at.clone(), 0o4),
        (Need::Write, true) => (at.clone(), 0o2),
        (Need::Read, false) => (parent, 0o1),
        _ => (parent, 0o3),
    };
    // A target that is not there (a directory to create under it): its nearest existing
    // ancestor is the one that must let an entry be added.
    let (target, bits) = match std::fs::canonicalize(&target) {
        Ok(_) => (target, bits),
        Err(_) => match target.ancestors().skip(1).find(|a| a.exists()) {
            Some(a) => (a.to_path_buf(), 0o3),
            None => return landlock(),
        },
    };
    let Ok(real) = std::fs::canonicalize(&target) else {
        return landlock();
    };
    if !real.starts_with(&base) {
        return landlock();
    }
    // Every directory from the base down must be searchable, then the target grant `bits`.
    let grants = |p: &Path, want: u32| uid == 0 || permitted(p, uid, gid, want);
    let mut refused = None;
    for dir in real.ancestors().skip(1).filter(|d| d.starts_with(&base)) {
        if !grants(dir, 0o1) {
            refused = Some(dir.to_path_buf());
        }
    }
    if refused.is_none() && !grants(&real, bits) {
        refused = Some(real.clone());
    }
    let Some(refused) = refused else {
        return landlock();
    };
    let meta = std::fs::metadata(&refused).ok()?;
    let shown = match refused.strip_prefix(&base) {
        Ok(r) if r.as_os_str().is_empty() => "the workspace".to_string(),
        Ok(r) => r.display().to_string(),
        Err(_) => refused.display().to_string(),
    };
    Some((
        stsd_protocol::Code::HelperRuntime,
        format!(
            "permission denied by the file system, not the sandbox: {rel}: {shown} is owned by \
             uid {} gid {} with mode {:03o}, and tools run as uid {uid} gid {gid}: give them \
             access (chown -R {uid}:{gid} on the workspace, as stsd does for the one it makes), \
             or set [worker] uid",
            meta.uid(),
            meta.gid(),
            meta.mode() & 0o777
        ),
    ))
}

/// Whether the class of `path`'s mode that applies to `uid`/`gid` has `bits` (0o4 read,
/// 0o2 write, 0o1 execute or search). Symlinks are followed.
pub fn permitted(path: &Path, uid: u32, gid: u32, bits: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::metadata(path) else {
        return false;
    };
    let mode = m.mode();
    let class = if m.uid() == uid {
        mode >> 6
    } else if m.gid() == gid {
        mode >> 3
    } else {
        mode
    };
    class & bits == bits
}
