//! The seccomp allowlists, kept as data per posture (`profiles/seccomp/*.json`, Firecracker's
//! style) and compiled with seccompiler. Default action: kill the process; seccompiler adds the
//! architecture check. A posture's list is the base list plus the file groups it grants.

use seccompiler::{BpfProgram, TargetArch};
use serde_json::{json, Value};
use stsd_protocol::frames::FsAccess;

pub const BASE: &str = include_str!("../../seccomp/base.json");
pub const FILE_READ: &str = include_str!("../../seccomp/file_read.json");
pub const FILE_WRITE: &str = include_str!("../../seccomp/file_write.json");
pub const ENOSYS: &str = include_str!("../../seccomp/enosys.json");

#[cfg(target_arch = "x86_64")]
const ARCH: TargetArch = TargetArch::x86_64;
#[cfg(target_arch = "aarch64")]
const ARCH: TargetArch = TargetArch::aarch64;

/// The syscall rules of a posture, in seccompiler's JSON form (before compilation).
pub fn rules_for(fs: FsAccess, own_pid: u32) -> Result<Vec<Value>, String> {
    let mut groups = vec![BASE];
    if fs != FsAccess::None {
        groups.push(FILE_READ);
    }
    if fs.can_write() {
        groups.push(FILE_WRITE);
    }
    let mut rules = Vec::new();
    for g in groups {
        let v: Value = serde_json::from_str(g).map_err(|e| format!("seccomp data: {e}"))?;
        let list = v["filter"]
            .as_array()
            .ok_or("seccomp data: no filter list")?;
        rules.extend(list.iter().cloned());
    }
    // abort() raises SIGABRT with tgkill; allow it for this process only, so a Rust panic
    // ends as a crash (SIGABRT) and not a sandbox violation, and no other process is reachable.
    rules.push(json!({"syscall": "tgkill", "args": [{"index": 0, "type": "dword", "op": "eq", "val": own_pid}]}));
    Ok(rules)
}

fn compile(doc: Value) -> Result<BpfProgram, String> {
    let text = doc.to_string();
    let mut map = seccompiler::compile_from_json(text.as_bytes(), ARCH)
        .map_err(|e| format!("seccomp compile: {e}"))?;
    map.remove("worker")
        .ok_or_else(|| "seccomp compile: filter missing".to_string())
}

/// Compiles the allowlist of a posture to BPF (default: kill the process).
pub fn program_for(fs: FsAccess, own_pid: u32) -> Result<BpfProgram, String> {
    compile(json!({
        "worker": {
            "mismatch_action": "kill_process",
            "match_action": "allow",
            "filter": rules_for(fs, own_pid)?,
        }
    }))
}

/// The filter stacked before the allowlist: the calls in `enosys.json` answer ENOSYS. The
/// kernel applies the strictest action of all filters, so under a posture whose allowlist
/// omits them they still kill.
pub fn enosys_program() -> Result<BpfProgram, String> {
    let v: Value = serde_json::from_str(ENOSYS).map_err(|e| format!("seccomp data: {e}"))?;
    compile(json!({
        "worker": {
            "mismatch_action": "allow",
            "match_action": {"errno": libc::ENOSYS},
            "filter": v["filter"],
        }
    }))
}

/// Syscall names a posture allows (for tests and `--explain` output).
pub fn allowed_names(fs: FsAccess) -> Vec<String> {
    rules_for(fs, 1)
        .unwrap_or_default()
        .iter()
        .filter_map(|r| r["syscall"].as_str().map(str::to_string))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_posture_compiles() {
        for fs in [
            FsAccess::None,
            FsAccess::ReadOnly,
            FsAccess::WriteOnly,
            FsAccess::ReadWrite,
        ] {
            let p = program_for(fs, 4242);
            assert!(p.as_ref().is_ok_and(|p| p.len() > 20), "{fs:?}: {p:?}");
        }
        assert!(enosys_program().is_ok_and(|p| p.len() > 5));
    }

    #[test]
    fn dangerous_syscalls_are_never_listed() {
        let forbidden = [
            "socket",
            "socketpair",
            "connect",
            "bind",
            "listen",
            "accept",
            "accept4",
            "execve",
            "execveat",
            "fork",
            "vfork",
            "clone",
            "clone3",
            "ptrace",
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
            "process_vm_readv",
            "process_vm_writev",
            "mount",
            "umount2",
            "unshare",
            "setns",
            "bpf",
            "perf_event_open",
            "keyctl",
            "add_key",
            "request_key",
            "userfaultfd",
            "seccomp",
            "prctl",
            "kill",
            "tkill",
            "chmod",
            "fchmodat",
            "fchmod",
            "chown",
            "fchownat",
            "mknod",
            "mknodat",
            "symlinkat",
            "linkat",
            "ioctl",
            "landlock_create_ruleset",
            "landlock_restrict_self",
            "pidfd_open",
            "memfd_create",
            "sendmsg",
            "recvmsg",
            "open",
            "openat2",
            "prlimit64",
            "setrlimit",
            "setuid",
            "setgid",
            "execve",
        ];
        for fs in [
            FsAccess::None,
            FsAccess::ReadOnly,
            FsAccess::WriteOnly,
            FsAccess::ReadWrite,
        ] {
            let names = allowed_names(fs);
            for f in forbidden {
                assert!(!names.iter().any(|n| n == f), "{f} allowed under {fs:?}");
            }
        }
    }

    #[test]
    fn file_opening_calls_only_with_file_access() {
        assert!(!allowed_names(FsAccess::None).iter().any(|n| n == "openat"));
        assert!(allowed_names(FsAccess::ReadOnly)
            .iter()
            .any(|n| n == "openat"));
        assert!(!allowed_names(FsAccess::ReadOnly)
            .iter()
            .any(|n| n == "unlinkat"));
        assert!(allowed_names(FsAccess::ReadWrite)
            .iter()
            .any(|n| n == "unlinkat"));
    }

    #[test]
    fn fcntl_is_limited_to_f_getfd() {
        for fs in [FsAccess::None, FsAccess::ReadWrite] {
            let rules = rules_for(fs, 1).unwrap_or_default();
            let fcntl: Vec<&Value> = rules.iter().filter(|r| r["syscall"] == "fcntl").collect();
            assert_eq!(fcntl.len(), 1);
            assert_eq!(
                fcntl[0]["args"],
                json!([{"index": 1, "type": "dword", "op": "eq", "val": 1}])
            );
        }
    }
}
