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

/// Stands in for the worker's pid in compiled programs; [`patch_pid`] replaces it.
pub const PID_PLACEHOLDER: u32 = 0x7eed_5eed;

struct Templates {
    enosys: BpfProgram,
    by_posture: Vec<(FsAccess, BpfProgram)>,
}

fn templates() -> &'static Result<Templates, String> {
    static T: std::sync::OnceLock<Result<Templates, String>> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        let mut by_posture = Vec::new();
        for fs in [
            FsAccess::None,
            FsAccess::ReadOnly,
            FsAccess::WriteOnly,
            FsAccess::ReadWrite,
        ] {
            by_posture.push((fs, program_for(fs, PID_PLACEHOLDER)?));
        }
        Ok(Templates {
            enosys: enosys_program()?,
            by_posture,
        })
    })
}

fn pack(p: &BpfProgram) -> Vec<u64> {
    p.iter()
        .map(|i| {
            (u64::from(i.code) << 48)
                | (u64::from(i.jt) << 40)
                | (u64::from(i.jf) << 32)
                | u64::from(i.k)
        })
        .collect()
}

pub fn unpack(v: &[u64]) -> BpfProgram {
    v.iter()
        .map(|x| seccompiler::sock_filter {
            code: (x >> 48) as u16,
            jt: (x >> 40) as u8,
            jf: (x >> 32) as u8,
            k: *x as u32,
        })
        .collect()
}

/// A posture's programs, compiled once per process (the supervisor's) and packed for a job.
pub fn bpf_for(fs: FsAccess) -> Result<stsd_protocol::frames::SeccompBpf, String> {
    let t = templates().as_ref().map_err(Clone::clone)?;
    let allow = t
        .by_posture
        .iter()
        .find(|(f, _)| *f == fs)
        .map(|(_, p)| pack(p))
        .ok_or("no seccomp program for this posture")?;
    Ok(stsd_protocol::frames::SeccompBpf {
        enosys: pack(&t.enosys),
        allow,
    })
}

/// Writes the worker's pid into the one comparison that holds the placeholder. Anything but
/// exactly one occurrence means the program is not what was compiled, and it is refused.
pub fn patch_pid(mut p: BpfProgram, pid: u32) -> Result<BpfProgram, String> {
    let hits = p.iter().filter(|i| i.k == PID_PLACEHOLDER).count();
    if hits != 1 {
        return Err(format!(
            "seccomp program has {hits} pid placeholders, expected 1"
        ));
    }
    for i in p.iter_mut().filter(|i| i.k == PID_PLACEHOLDER) {
        i.k = pid;
    }
    Ok(p)
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
    fn prlimit64_is_limited_to_the_workers_own_cpu_limit() {
        for fs in [FsAccess::None, FsAccess::ReadWrite] {
            let rules = rules_for(fs, 1).unwrap_or_default();
            let prlimit: Vec<&Value> = rules
                .iter()
                .filter(|r| r["syscall"] == "prlimit64")
                .collect();
            assert_eq!(prlimit.len(), 1);
            // pid 0 (this process) and resource 0 (RLIMIT_CPU), nothing else.
            assert_eq!(libc::RLIMIT_CPU, 0);
            assert_eq!(
                prlimit[0]["args"],
                json!([{"index": 0, "type": "dword", "op": "eq", "val": 0},
                       {"index": 1, "type": "dword", "op": "eq", "val": 0}])
            );
        }
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

    #[test]
    fn compiled_once_then_patched_per_worker_equals_compiling_for_that_pid() {
        for fs in [
            FsAccess::None,
            FsAccess::ReadOnly,
            FsAccess::WriteOnly,
            FsAccess::ReadWrite,
        ] {
            let packed = bpf_for(fs).unwrap_or_default();
            let patched = patch_pid(unpack(&packed.allow), 4242);
            assert_eq!(patched.ok(), program_for(fs, 4242).ok(), "{fs:?}");
            assert_eq!(Some(unpack(&packed.enosys)), enosys_program().ok());
        }
        // A program without exactly one placeholder is refused.
        let direct = program_for(FsAccess::None, 7).unwrap_or_default();
        assert!(patch_pid(direct, 8).is_err());
    }
}
