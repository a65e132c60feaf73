//! The upstream's walls: its own network namespace when it gets no network, and Landlock
//! (read and execute on the read paths, everything on the workspace, TCP connect to the
//! proxy port only, abstract Unix sockets and signals scoped).

use landlock::{
    Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort, PathBeneath, PathFd,
    Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use std::path::{Path, PathBuf};

/// The newest ABI whose rights we ask for; the kernel's own, when older, is used (best
/// effort), but see [`restrict`] for what must be there. ABI 6 scopes abstract Unix sockets
/// and signals; ABI 9 (Linux 7.1) adds connecting to pathname Unix sockets (ResolveUnix),
/// then allowed in the workspace only. Before it, pathname sockets are fenced by file
/// permissions alone (the daemon's own socket is 0660 in a 0700 directory).
const ABI_WANTED: ABI = ABI::V9;
/// TCP bind and connect rules came with ABI 4.
const ABI_NET: i64 = 4;

/// A network namespace of its own (empty: only a down loopback). As root a plain
/// CLONE_NEWNET; otherwise a user namespace comes with it (mapping the caller's own ids, so
/// files keep their owner). Must run single-threaded, before the privileges are dropped.
/// Returns whether the process is now in its own namespace.
pub(super) fn isolate_network() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        // SAFETY: unshare with integer flags; this process is single-threaded.
        return unsafe { libc::unshare(libc::CLONE_NEWNET) } == 0;
    }
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    // SAFETY: as above.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNET) } != 0 {
        return false;
    }
    // Best effort: without a mapping the ids read as the overflow id, nothing more.
    let _ = std::fs::write("/proc/self/setgroups", "deny");
    let _ = std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1"));
    let _ = std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1"));
    true
}

fn read_rights() -> BitFlags<AccessFs> {
    AccessFs::from_read(ABI_WANTED)
}

/// Restricts the process (single-threaded here; execve keeps the domain). Fails when
/// Landlock is not enforced at all, when the network must be fenced by Landlock (a proxy
/// port, or no namespace of its own) and the kernel cannot, or when the workspace cannot be
/// opened. Read paths that vanished since they were listed are skipped.
pub(super) fn restrict(
    read: &[PathBuf],
    workspace: &Path,
    proxy_port: Option<u16>,
    own_netns: bool,
) -> Result<(), String> {
    let abi = crate::os::landlock::abi_version();
    if abi < 1 {
        return Err("Landlock is not available on this kernel".into());
    }
    if (proxy_port.is_some() || !own_netns) && abi < ABI_NET {
        return Err(format!(
            "Landlock ABI {abi} cannot restrict TCP (ABI {ABI_NET} needed) and the upstream \
             has no network namespace of its own"
        ));
    }
    let err = |e: landlock::RulesetError| format!("landlock: {e}");
    let mut rs = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(ABI_WANTED))
        .map_err(err)?
        .handle_access(AccessNet::from_all(ABI_WANTED))
        .map_err(err)?
        .scope(Scope::from_all(ABI_WANTED))
        .map_err(err)?
        .create()
        .map_err(err)?;
    for p in read {
        let Ok(fd) = PathFd::new(p) else { continue };
        let mut rights = read_rights();
        if !p.is_dir() {
            rights &= AccessFs::from_file(ABI_WANTED);
        }
        if p == Path::new("/dev/null") {
            rights |= AccessFs::WriteFile | AccessFs::Truncate;
        }
        rs = rs.add_rule(PathBeneath::new(fd, rights)).map_err(err)?;
    }
    // Everything on the workspace, execution included: what the upstream runs from there
    // inherits every wall of this one.
    let fd = PathFd::new(workspace)
        .map_err(|e| format!("landlock: workspace {}: {e}", workspace.display()))?;
    rs = rs
        .add_rule(PathBeneath::new(fd, AccessFs::from_all(ABI_WANTED)))
        .map_err(err)?;
    if let Some(port) = proxy_port {
        rs = rs
            .add_rule(NetPort::new(port, AccessNet::ConnectTcp))
            .map_err(err)?;
    }
    let status = rs.restrict_self().map_err(err)?;
    if status.ruleset == RulesetStatus::NotEnforced {
        return Err("Landlock is not enforced on this kernel".into());
    }
    Ok(())
}
