//! The upstream's seccomp filters. Unlike a worker's allowlist, an upstream runs arbitrary
//! runtimes (node, python) whose syscall needs are open-ended, so this is a deny-list:
//! everything is allowed except the escape-class calls (kernel attack surface, other
//! processes' memory, namespaces, mounts, keys, modules), which answer EPERM, and
//! non-TCP inet sockets (Landlock only governs TCP), netlink and packet sockets. Built with seccompiler, as the worker's.

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
};
use std::collections::BTreeMap;

#[cfg(target_arch = "x86_64")]
const ARCH: TargetArch = TargetArch::x86_64;
#[cfg(target_arch = "aarch64")]
const ARCH: TargetArch = TargetArch::aarch64;

/// Refused outright (EPERM).
const DENIED: &[(i64, &str)] = &[
    (libc::SYS_ptrace, "ptrace"),
    (libc::SYS_process_vm_readv, "process_vm_readv"),
    (libc::SYS_process_vm_writev, "process_vm_writev"),
    (libc::SYS_pidfd_getfd, "pidfd_getfd"),
    (libc::SYS_kcmp, "kcmp"),
    (libc::SYS_mount, "mount"),
    (libc::SYS_umount2, "umount2"),
    (libc::SYS_pivot_root, "pivot_root"),
    (libc::SYS_chroot, "chroot"),
    (libc::SYS_open_tree, "open_tree"),
    (libc::SYS_move_mount, "move_mount"),
    (libc::SYS_fsopen, "fsopen"),
    (libc::SYS_fsconfig, "fsconfig"),
    (libc::SYS_fsmount, "fsmount"),
    (libc::SYS_fspick, "fspick"),
    (libc::SYS_mount_setattr, "mount_setattr"),
    (libc::SYS_setns, "setns"),
    (libc::SYS_bpf, "bpf"),
    (libc::SYS_perf_event_open, "perf_event_open"),
    (libc::SYS_userfaultfd, "userfaultfd"),
    (libc::SYS_io_uring_setup, "io_uring_setup"),
    (libc::SYS_io_uring_enter, "io_uring_enter"),
    (libc::SYS_io_uring_register, "io_uring_register"),
    (libc::SYS_keyctl, "keyctl"),
    (libc::SYS_add_key, "add_key"),
    (libc::SYS_request_key, "request_key"),
    (libc::SYS_kexec_load, "kexec_load"),
    (libc::SYS_kexec_file_load, "kexec_file_load"),
    (libc::SYS_init_module, "init_module"),
    (libc::SYS_finit_module, "finit_module"),
    (libc::SYS_delete_module, "delete_module"),
    (libc::SYS_open_by_handle_at, "open_by_handle_at"),
    (libc::SYS_name_to_handle_at, "name_to_handle_at"),
    (libc::SYS_swapon, "swapon"),
    (libc::SYS_swapoff, "swapoff"),
    (libc::SYS_reboot, "reboot"),
    (libc::SYS_acct, "acct"),
    (libc::SYS_quotactl, "quotactl"),
    (libc::SYS_syslog, "syslog"),
];

/// The namespace flags of clone(2) (CLONE_NEWTIME shares its bit with the exit signal
/// there, and is only valid for unshare).
const CLONE_NS_FLAGS: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
];
const CLONE_NEWTIME: u64 = 0x80;

/// The names [`programs`] refuses unconditionally, for reports and tests.
pub fn denied_names() -> Vec<&'static str> {
    DENIED.iter().map(|(_, n)| *n).collect()
}

fn cond(index: u8, len: Len, op: Op, value: u64) -> Result<SeccompCondition, String> {
    SeccompCondition::new(index, len, op, value).map_err(|e| format!("seccomp: {e}"))
}

fn rule(conds: Vec<SeccompCondition>) -> Result<SeccompRule, String> {
    SeccompRule::new(conds).map_err(|e| format!("seccomp: {e}"))
}

/// A rule per flag: the call matches when any one of `flags` is set in argument `index`.
fn any_flag(index: u8, flags: &[u64]) -> Result<Vec<SeccompRule>, String> {
    flags
        .iter()
        .map(|f| rule(vec![cond(index, Len::Qword, Op::MaskedEq(*f), *f)?]))
        .collect()
}

/// Address families an upstream never gets a socket of: netlink (the host's interfaces,
/// routes and sockets, sock_diag included; glibc's getaddrinfo does without it) and packet
/// sockets (raw frames).
const DENIED_FAMILIES: &[u64] = &[libc::AF_NETLINK as u64, libc::AF_PACKET as u64];

/// socket(2) for AF_INET/AF_INET6 is refused unless it is a TCP stream: a type other than
/// SOCK_STREAM (UDP, raw, SCTP seqpacket...), or a protocol other than 0 and IPPROTO_TCP
/// (SCTP, MPTCP streams), which Landlock's TCP rules would not see.
fn inet_non_tcp() -> Result<Vec<SeccompRule>, String> {
    const SOCK_TYPE_MASK: u64 = 0xf;
    let mut rules = Vec::new();
    for family in [libc::AF_INET as u64, libc::AF_INET6 as u64] {
        for ty in 0..=SOCK_TYPE_MASK {
            if ty == libc::SOCK_STREAM as u64 {
                continue;
            }
            rules.push(rule(vec![
                cond(0, Len::Dword, Op::Eq, family)?,
                cond(1, Len::Dword, Op::MaskedEq(SOCK_TYPE_MASK), ty)?,
            ])?);
        }
        rules.push(rule(vec![
            cond(0, Len::Dword, Op::Eq, family)?,
            cond(2, Len::Dword, Op::Ne, 0)?,
            cond(2, Len::Dword, Op::Ne, libc::IPPROTO_TCP as u64)?,
        ])?);
    }
    for family in DENIED_FAMILIES {
        rules.push(rule(vec![cond(0, Len::Dword, Op::Eq, *family)?])?);
    }
    Ok(rules)
}

fn compile(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    action: SeccompAction,
) -> Result<BpfProgram, String> {
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, action, ARCH)
        .map_err(|e| format!("seccomp: {e}"))?;
    BpfProgram::try_from(filter).map_err(|e| format!("seccomp: {e}"))
}

/// The two filters, to be applied in order: clone3 answers ENOSYS (its flags sit in memory a
/// filter cannot read, so the C library falls back to clone, whose flags it can), then the
/// deny-list answering EPERM. Both default to allow; execve stays allowed.
pub fn programs() -> Result<[BpfProgram; 2], String> {
    let mut enosys = BTreeMap::new();
    enosys.insert(libc::SYS_clone3, Vec::new());
    let mut deny: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for (nr, _) in DENIED {
        deny.insert(*nr, Vec::new());
    }
    // x86_64 and aarch64 both take the flags as clone's first argument.
    deny.insert(libc::SYS_clone, any_flag(0, CLONE_NS_FLAGS)?);
    let mut unshare_flags = CLONE_NS_FLAGS.to_vec();
    unshare_flags.push(CLONE_NEWTIME);
    deny.insert(libc::SYS_unshare, any_flag(0, &unshare_flags)?);
    deny.insert(libc::SYS_socket, inet_non_tcp()?);
    Ok([
        compile(enosys, SeccompAction::Errno(libc::ENOSYS as u32))?,
        compile(deny, SeccompAction::Errno(libc::EPERM as u32))?,
    ])
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn compiles_and_lists_the_escape_calls() {
        let [a, b] = programs().unwrap();
        assert!(!a.is_empty() && !b.is_empty());
        for n in [
            "ptrace",
            "bpf",
            "mount",
            "io_uring_setup",
            "userfaultfd",
            "keyctl",
        ] {
            assert!(denied_names().contains(&n), "{n}");
        }
        assert!(!denied_names().contains(&"execve"));
    }
}
