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

/// Every posture, by its file-system grant.
pub const POSTURES: [FsAccess; 4] = [
    FsAccess::None,
    FsAccess::ReadOnly,
    FsAccess::WriteOnly,
    FsAccess::ReadWrite,
];

/// The rules of one data file of `profiles/seccomp/` (its `filter` list).
pub(crate) fn group_rules(group: &str) -> Result<Vec<Value>, String> {
    let v: Value = serde_json::from_str(group).map_err(|e| format!("seccomp data: {e}"))?;
    match v {
        Value::Object(mut o) => match o.remove("filter") {
            Some(Value::Array(list)) => Ok(list),
            _ => Err("seccomp data: no filter list".into()),
        },
        _ => Err("seccomp data: not an object".into()),
    }
}

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
        rules.extend(group_rules(g)?);
    }
    // abort() raises SIGABRT with tgkill; allow it for this process only, so a Rust panic
    // ends as a crash (SIGABRT) and not a sandbox violation, and no other process is reachable.
    rules.push(json!({"syscall": "tgkill", "args": [{"index": 0, "type": "dword", "op": "eq", "val": own_pid}]}));
    Ok(rules)
}

pub(crate) fn compile(doc: Value) -> Result<BpfProgram, String> {
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
    compile(json!({
        "worker": {
            "mismatch_action": "allow",
            "match_action": {"errno": libc::ENOSYS},
            "filter": group_rules(ENOSYS)?,
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
        for fs in POSTURES {
            by_posture.push((fs, program_for(fs, PID_PLACEHOLDER)?));
        }
        Ok(Templates {
            enosys: enosys_program()?,
            by_posture,
        })
    })
}

pub(crate) fn pack_one(i: &seccompiler::sock_filter) -> u64 {
    (u64::from(i.code) << 48) | (u64::from(i.jt) << 40) | (u64::from(i.jf) << 32) | u64::from(i.k)
}

pub(crate) fn pack(p: &BpfProgram) -> Vec<u64> {
    p.iter().map(pack_one).collect()
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
        // A posture whose narrowing cannot be made goes whole to every worker.
        narrowing: super::zygote_filter::narrowing_template(fs)
            .map(pack)
            .unwrap_or_default(),
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

const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
const JA: u16 = (libc::BPF_JMP | libc::BPF_JA) as u16;
pub(crate) const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
pub(crate) const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
pub(crate) const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;

fn insn(code: u32, k: u32) -> seccompiler::sock_filter {
    seccompiler::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

/// An unconditional jump at index `at` to index `to` (forward only).
fn jump(at: usize, to: usize) -> Result<seccompiler::sock_filter, String> {
    let k = to
        .checked_sub(at + 1)
        .and_then(|k| u32::try_from(k).ok())
        .ok_or("seccomp merge: backward jump")?;
    Ok(seccompiler::sock_filter {
        code: JA,
        jt: 0,
        jf: 0,
        k,
    })
}

/// One program that decides exactly what the ENOSYS program stacked before the allowlist
/// decides (the kernel takes the strictest action of stacked filters: a call the allowlist
/// kills is killed, one it allows and the ENOSYS list names answers ENOSYS, the rest run),
/// so that a worker installs one filter instead of two: each costs a BPF compilation and a
/// JIT on the call path, and a deferred free after it.
///
/// Layout: the ENOSYS program, whose `ret ALLOW` and `ret ERRNO(ENOSYS)` become jumps to two
/// trampolines that note which it was in scratch word 0; then the allowlist, whose
/// `ret ALLOW` becomes a jump to a tail that returns ERRNO(ENOSYS) or ALLOW by that word. Every
/// other return (a kill) is kept. Instruction counts do not change inside either program, so
/// their own jumps keep their targets.
pub fn merge(
    enosys: &[seccompiler::sock_filter],
    allow: &[seccompiler::sock_filter],
) -> Result<BpfProgram, String> {
    let enosys_ret = SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
    let tramp_allow = enosys.len();
    let tramp_enosys = tramp_allow + 3;
    let allow_start = tramp_enosys + 3;
    let tail = allow_start + allow.len();
    let mut out = Vec::with_capacity(tail + 4);
    for (i, f) in enosys.iter().enumerate() {
        out.push(match (f.code, f.k) {
            (RET_K, SECCOMP_RET_ALLOW) => jump(i, tramp_allow)?,
            (RET_K, k) if k == enosys_ret => jump(i, tramp_enosys)?,
            (RET_K, k) if k & 0xffff_0000 == SECCOMP_RET_ERRNO => {
                return Err(format!("seccomp merge: unexpected errno action {k:#x}"))
            }
            _ => f.clone(),
        });
    }
    for (note, at) in [(0, tramp_allow), (1, tramp_enosys)] {
        out.push(insn(libc::BPF_LD | libc::BPF_IMM, note));
        out.push(insn(libc::BPF_ST, 0));
        out.push(jump(at + 2, allow_start)?);
    }
    for (i, f) in allow.iter().enumerate() {
        out.push(match (f.code, f.k) {
            (RET_K, SECCOMP_RET_ALLOW) => jump(allow_start + i, tail)?,
            _ => f.clone(),
        });
    }
    out.push(insn(libc::BPF_LD | libc::BPF_MEM, 0));
    out.push(seccompiler::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt: 0,
        jf: 1,
        k: 1,
    });
    out.push(insn(libc::BPF_RET | libc::BPF_K, enosys_ret));
    out.push(insn(libc::BPF_RET | libc::BPF_K, SECCOMP_RET_ALLOW));
    if out.len() > 4096 {
        return Err(format!("seccomp merge: {} instructions", out.len()));
    }
    Ok(out)
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
pub(crate) mod tests {
    use super::*;

    /// A classic-BPF interpreter for what seccompiler emits and [`merge`] adds; anything else
    /// fails the test.
    pub(crate) fn run(p: &[seccompiler::sock_filter], data: &[u8; 64]) -> u32 {
        let (mut a, mut x, mut mem, mut pc) = (0u32, 0u32, [None::<u32>; 16], 0usize);
        let word = |k: u32| {
            let k = k as usize;
            u32::from_ne_bytes([data[k], data[k + 1], data[k + 2], data[k + 3]])
        };
        loop {
            let f = &p[pc];
            let code = u32::from(f.code);
            pc += 1;
            match code {
                c if c == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS => a = word(f.k),
                c if c == libc::BPF_LD | libc::BPF_IMM => a = f.k,
                c if c == libc::BPF_LD | libc::BPF_MEM => {
                    a = mem[f.k as usize].expect("scratch word read before it was set")
                }
                c if c == libc::BPF_ST => mem[f.k as usize] = Some(a),
                c if c == libc::BPF_LDX | libc::BPF_IMM => x = f.k,
                c if c == libc::BPF_ALU | libc::BPF_AND | libc::BPF_K => a &= f.k,
                c if c == libc::BPF_JMP | libc::BPF_JA => pc += f.k as usize,
                c if c & 0x07 == libc::BPF_JMP => {
                    let v = if c & 0x08 != 0 { x } else { f.k };
                    let hit = match c & 0xf0 {
                        op if op == libc::BPF_JEQ => a == v,
                        op if op == libc::BPF_JGT => a > v,
                        op if op == libc::BPF_JGE => a >= v,
                        op if op == libc::BPF_JSET => a & v != 0,
                        op => panic!("jump op {op:#x}"),
                    };
                    pc += usize::from(if hit { f.jt } else { f.jf });
                }
                c if c == libc::BPF_RET | libc::BPF_K => return f.k,
                c => panic!("opcode {c:#x} at {}", pc - 1),
            }
        }
    }

    /// The data the kernel gives a filter for syscall `nr` on architecture `arch`.
    pub(crate) fn syscall_data(nr: u32, arch: u32, args: &[u64; 6]) -> [u8; 64] {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_ne_bytes());
        data[4..8].copy_from_slice(&arch.to_ne_bytes());
        for (i, v) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&v.to_ne_bytes());
        }
        data
    }

    /// What the kernel does with two stacked filters' actions: the stricter.
    pub(crate) fn stricter(a: u32, b: u32) -> u32 {
        if strictness(a) <= strictness(b) {
            a
        } else {
            b
        }
    }

    /// The kernel's order of seccomp actions, strictest first.
    pub(crate) fn strictness(action: u32) -> u32 {
        match action & 0xffff_0000 {
            0x8000_0000 => 0, // kill process
            0x0000_0000 => 1, // kill thread
            0x0003_0000 => 2, // trap
            0x0005_0000 => 3, // errno
            0x7fc0_0000 => 4, // user notification
            0x7ff0_0000 => 5, // trace
            0x7ffc_0000 => 6, // log
            0x7fff_0000 => 7, // allow
            other => panic!("action {other:#x}"),
        }
    }

    /// The merged program decides every call as the stacked pair does: each syscall number
    /// under every posture, with arguments that do and do not match the argument rules (the
    /// worker's own pid for tgkill among them), and a foreign architecture.
    #[test]
    fn the_merged_program_decides_as_the_stacked_pair() {
        let pid = 4242u32;
        let enosys = enosys_program().expect("enosys");
        let mut kinds = std::collections::BTreeMap::new();
        for fs in POSTURES {
            let allow = program_for(fs, pid).expect("allow");
            let merged = merge(&enosys, &allow).expect("merge");
            assert_eq!(merged.len(), enosys.len() + allow.len() + 10);
            let args: [[u64; 6]; 5] = [
                [0; 6],
                [u64::from(pid), 6, 0, 0, 0, 0],
                [1, 2, 3, 4, 5, 6],
                [u64::MAX, 0x8000_0000, 1 << 40, 0x80000, 0, 0],
                [3, 0x5401, 0, 0, 0, 0],
            ];
            for arch in [0xc000_003e_u32, 0x4000_0003] {
                for nr in 0..470u32 {
                    for a in &args {
                        let data = syscall_data(nr, arch, a);
                        let stacked = stricter(run(&enosys, &data), run(&allow, &data));
                        let got = run(&merged, &data);
                        assert_eq!(got, stacked, "{fs:?} arch {arch:#x} nr {nr} args {a:?}");
                        *kinds.entry(got).or_insert(0) += 1;
                    }
                }
            }
        }
        // The check saw all three outcomes: allowed, ENOSYS, killed.
        let enosys_ret = SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
        for k in [SECCOMP_RET_ALLOW, enosys_ret, SECCOMP_RET_KILL_PROCESS] {
            assert!(kinds.contains_key(&k), "{k:#x} never decided: {kinds:?}");
        }
    }

    #[test]
    fn every_posture_compiles() {
        for fs in POSTURES {
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
        for fs in POSTURES {
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
        for fs in POSTURES {
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
