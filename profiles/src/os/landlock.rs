//! Landlock: every fs right the kernel knows is handled, and only the base path is granted
//! (read-only, write-only or read-write); TCP bind and connect are handled with no rule
//! (denied); abstract Unix sockets and signals are scoped to the sandbox.

use landlock::{
    Access, AccessFs, AccessNet, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use std::path::Path;
use stsd_protocol::frames::FsAccess;

/// ABI 6 is the first with scoping (abstract Unix sockets, signals); fs rights are the same
/// from ABI 5 on. Anything older cannot enforce the profile and the tool is refused.
const ABI_REQUIRED: ABI = ABI::V6;

fn read_rights() -> landlock::BitFlags<AccessFs> {
    AccessFs::ReadFile | AccessFs::ReadDir
}

fn write_rights() -> landlock::BitFlags<AccessFs> {
    AccessFs::WriteFile
        | AccessFs::RemoveDir
        | AccessFs::RemoveFile
        | AccessFs::MakeDir
        | AccessFs::MakeReg
        | AccessFs::Refer
        | AccessFs::Truncate
}

/// The Landlock ABI version the running kernel offers (0: none), for health checks.
pub fn abi_version() -> i64 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a null attribute, size 0 and the VERSION flag the call only returns the
    // ABI version; it touches no memory and creates nothing.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    v.max(0)
}

/// Restricts the calling thread (the worker is single-threaded). Refuses rather than degrades:
/// any error, or a status other than fully enforced, is returned as an error.
pub fn restrict(fs: FsAccess, base: &Path) -> Result<(), String> {
    let granted = match fs {
        FsAccess::None => None,
        FsAccess::ReadOnly => Some(read_rights()),
        FsAccess::WriteOnly => Some(write_rights()),
        FsAccess::ReadWrite => Some(read_rights() | write_rights()),
    };
    let mut created = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(ABI_REQUIRED))
        .and_then(|r| r.handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp))
        .and_then(|r| r.scope(Scope::AbstractUnixSocket | Scope::Signal))
        .and_then(|r| r.create())
        .map_err(|e| format!("landlock ruleset: {e}"))?;
    if let Some(rights) = granted {
        // Opened by path once; Landlock then follows the inode, so later renames, symlinks
        // and `..` inside the tool resolve against real inodes.
        let fd =
            PathFd::new(base).map_err(|e| format!("landlock base path {}: {e}", base.display()))?;
        created = created
            .add_rule(PathBeneath::new(fd, rights))
            .map_err(|e| format!("landlock rule: {e}"))?;
    }
    let status = created
        .restrict_self()
        .map_err(|e| format!("landlock restrict: {e}"))?;
    if status.ruleset != RulesetStatus::FullyEnforced {
        return Err(format!(
            "landlock is only {:?} on this kernel",
            status.ruleset
        ));
    }
    Ok(())
}
