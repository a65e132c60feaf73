//! The zygote's seccomp filter and the short filter each forked worker stacks on it.
//!
//! A worker used to install its posture's whole program (the ENOSYS program merged with the
//! allowlist, about 200 instructions) as it was confined: a BPF conversion and a JIT of all of
//! it per worker, some 30 µs of CPU on the CPU that makes workers (and on a call's path when the
//! call found no primed worker). Filters are inherited across fork, and the kernel applies the
//! strictest action of all the filters a process has; so the zygote installs, once, a filter
//! that allows what any posture allows plus what it and a worker's start need
//! ([`zygote_program`]), and each worker stacks a short filter that takes back everything its
//! posture does not allow ([`narrowing_program`]: a kill for each such syscall and the
//! posture's own argument rules where they are narrower). The pair decides every call exactly
//! as the worker's whole program would (the tests run both on every syscall number under every
//! posture); the zygote itself gains a filter it never had.

use super::seccomp::{
    self, POSTURES, SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO, SECCOMP_RET_KILL_PROCESS,
};
use seccompiler::{sock_filter, BpfProgram};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use stsd_protocol::frames::{FsAccess, SeccompBpf};

pub const ZYGOTE: &str = include_str!("../../seccomp/zygote.json");

/// A syscall's rules: `None` when it is allowed whatever its arguments, else the argument
/// rules of which one must match.
type Rules = Option<Vec<Value>>;

fn by_name(rules: &[Value]) -> Result<BTreeMap<String, Rules>, String> {
    let mut map: BTreeMap<String, Rules> = BTreeMap::new();
    for r in rules {
        let name = r["syscall"]
            .as_str()
            .ok_or("seccomp data: a rule without a syscall")?
            .to_string();
        let unconditional = r.get("args").is_none();
        let entry = map
            .entry(name)
            .or_insert_with(|| (!unconditional).then(Vec::new));
        match (entry.as_mut(), unconditional) {
            // One unconditional rule makes the syscall unconditional (seccompiler would keep
            // only the conditional ones of a mixed list).
            (_, true) => *entry = None,
            (Some(list), false) => list.push(r.clone()),
            (None, false) => {}
        }
    }
    Ok(map)
}

fn flatten(map: &BTreeMap<String, Rules>) -> Vec<Value> {
    let mut out = Vec::new();
    for (name, rules) in map {
        match rules {
            None => out.push(json!({ "syscall": name })),
            Some(list) => out.extend(list.iter().cloned()),
        }
    }
    out
}

/// The zygote filter's allowlist: every posture's rules and the zygote's own, by syscall.
fn zygote_rules() -> Result<BTreeMap<String, Rules>, String> {
    let mut all = Vec::new();
    for group in [
        seccomp::BASE,
        seccomp::FILE_READ,
        seccomp::FILE_WRITE,
        ZYGOTE,
    ] {
        all.extend(seccomp::group_rules(group)?);
    }
    by_name(&all)
}

/// The zygote's filter: [`zygote_rules`] (default: kill). Not the ENOSYS program: a worker
/// sets Landlock up under this filter, and the Landlock crate checks a path's descriptor with
/// `statx`; each narrowing program answers ENOSYS for those calls instead.
pub fn zygote_program() -> Result<BpfProgram, String> {
    seccomp::compile(json!({
        "worker": {
            "mismatch_action": "kill_process",
            "match_action": "allow",
            "filter": flatten(&zygote_rules()?),
        }
    }))
}

/// The syscalls the ENOSYS program answers ENOSYS (`seccomp/enosys.json`).
fn enosys_names() -> Result<Vec<String>, String> {
    Ok(seccomp::group_rules(seccomp::ENOSYS)?
        .iter()
        .filter_map(|r| r["syscall"].as_str().map(str::to_string))
        .collect())
}

/// Syscall numbers by name, and the architecture value a program checks.
type Numbers = (BTreeMap<String, u32>, u32);

/// The number of every syscall the zygote's filter names, as seccompiler knows it for this
/// architecture (read back from a program of that one unconditional rule: its comparison
/// that is not the architecture check), and the architecture value its programs check.
fn numbers() -> &'static Result<Numbers, String> {
    static T: OnceLock<Result<Numbers, String>> = OnceLock::new();
    T.get_or_init(|| {
        let jeq = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
        let mut table = BTreeMap::new();
        let mut arch = None;
        for name in zygote_rules()?.keys() {
            let p = seccomp::compile(json!({
                "worker": {"mismatch_action": "allow", "match_action": "kill_process",
                           "filter": [{"syscall": name}]}
            }))?;
            let a = *arch.get_or_insert(p.get(1).map(|i| i.k).ok_or("seccomp: empty program")?);
            let nr = p
                .iter()
                .find(|i| i.code == jeq && i.k != a)
                .map(|i| i.k)
                .ok_or_else(|| format!("seccomp: no number for {name}"))?;
            table.insert(name.clone(), nr);
        }
        Ok((table, arch.ok_or("seccomp: no syscalls")?))
    })
}

fn stmt(code: u32, k: u32) -> sock_filter {
    sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

/// The filter a worker forked from a zygote that installed [`zygote_program`] stacks on it
/// for posture `fs`: each syscall the zygote's filter allows and the posture does not is
/// killed; each the ENOSYS program answers is answered ENOSYS; each the posture allows under
/// narrower argument rules goes to a program of just those rules (default: kill); everything
/// else is left to the zygote's filter.
///
/// Layout: the architecture check, the syscall number, one `jeq` per killed syscall (to the
/// kill), per syscall the ENOSYS program answers (to `ret ERRNO(ENOSYS)`) and per narrowed one
/// (to the rules), `ret ALLOW`, `ret KILL`, `ret ERRNO(ENOSYS)`, then seccompiler's program of
/// the narrowed rules.
pub fn narrowing_program(fs: FsAccess, own_pid: u32) -> Result<BpfProgram, String> {
    let zygote = zygote_rules()?;
    let posture = by_name(&seccomp::rules_for(fs, own_pid)?)?;
    if let Some(extra) = posture.keys().find(|n| !zygote.contains_key(*n)) {
        return Err(format!(
            "seccomp: {extra} is allowed to a posture but not by the zygote"
        ));
    }
    let enosys = enosys_names()?;
    let mut killed = Vec::new();
    let mut answered = Vec::new();
    let mut narrowed = Vec::new();
    for (name, rules) in &zygote {
        match posture.get(name) {
            None => killed.push(name),
            Some(None) if enosys.contains(name) => answered.push(name),
            Some(p) if p != rules || enosys.contains(name) => narrowed.push(name),
            Some(_) => {}
        }
    }
    if let Some(n) = narrowed.iter().find(|n| enosys.contains(n)) {
        // ENOSYS under argument rules: not expressible here; the tests would say so first.
        return Err(format!("seccomp: {n} answers ENOSYS under argument rules"));
    }
    let (table, arch) = numbers().as_ref().map_err(Clone::clone)?;
    let nr_of = |names: &[&String]| -> Result<Vec<u32>, String> {
        names
            .iter()
            .map(|n| {
                table
                    .get(*n)
                    .copied()
                    .ok_or_else(|| format!("seccomp: no number for {n}"))
            })
            .collect()
    };
    let (kill_nrs, enosys_nrs, narrow_nrs, arch) =
        (nr_of(&killed)?, nr_of(&answered)?, nr_of(&narrowed)?, *arch);
    let rules = seccomp::compile(json!({
        "worker": {
            "mismatch_action": "kill_process",
            "match_action": "allow",
            "filter": narrowed.iter().flat_map(|n| match &posture[*n] {
                None => vec![json!({ "syscall": n })],
                Some(list) => list.clone(),
            }).collect::<Vec<Value>>(),
        }
    }))?;
    let jumps = kill_nrs.len() + enosys_nrs.len() + narrow_nrs.len();
    if jumps + 3 > usize::from(u8::MAX) {
        return Err(format!("seccomp: {jumps} syscalls to narrow"));
    }
    let first = 4;
    let allow_at = first + jumps;
    let (kill_at, enosys_at, rules_at) = (allow_at + 1, allow_at + 2, allow_at + 3);
    let mut p = Vec::with_capacity(rules_at + rules.len());
    p.push(stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 4));
    p.push(sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt: 1,
        jf: 0,
        k: arch,
    });
    p.push(stmt(libc::BPF_RET | libc::BPF_K, SECCOMP_RET_KILL_PROCESS));
    p.push(stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0));
    for (nr, to) in kill_nrs
        .iter()
        .map(|n| (n, kill_at))
        .chain(enosys_nrs.iter().map(|n| (n, enosys_at)))
        .chain(narrow_nrs.iter().map(|n| (n, rules_at)))
    {
        let at = p.len();
        p.push(sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt: u8::try_from(to - at - 1).map_err(|_| "seccomp: jump too far")?,
            jf: 0,
            k: *nr,
        });
    }
    p.push(stmt(libc::BPF_RET | libc::BPF_K, SECCOMP_RET_ALLOW));
    p.push(stmt(libc::BPF_RET | libc::BPF_K, SECCOMP_RET_KILL_PROCESS));
    p.push(stmt(
        libc::BPF_RET | libc::BPF_K,
        SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
    ));
    p.extend(rules);
    Ok(p)
}

/// Set, before the first fork, in a zygote whose filter is installed: its workers stack the
/// narrowing programs on it.
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Each posture's narrowing program, the worker's pid a placeholder (see `seccomp::patch_pid`),
/// compiled once by the supervisor (it goes to the worker with each job).
pub(crate) fn narrowing_template(fs: FsAccess) -> Option<&'static BpfProgram> {
    static T: OnceLock<Result<Vec<(FsAccess, BpfProgram)>, String>> = OnceLock::new();
    let templates = T.get_or_init(|| {
        POSTURES
            .iter()
            .map(|&fs| Ok((fs, narrowing_program(fs, seccomp::PID_PLACEHOLDER)?)))
            .collect()
    });
    templates
        .as_ref()
        .ok()?
        .iter()
        .find(|(f, _)| *f == fs)
        .map(|(_, p)| p)
}

/// The zygote's filter as the supervisor passes it to each zygote it execs (`--seccomp`): the
/// packed instructions in hex, 16 digits each. The zygote compiles nothing: seccompiler's
/// garbage left holes in its heap that each worker's first allocations copied page by page
/// (about 25 more page faults per worker, which cost more than the shorter filter saved).
pub fn zygote_program_hex() -> Result<String, String> {
    static HEX: OnceLock<Result<String, String>> = OnceLock::new();
    HEX.get_or_init(|| {
        let p = zygote_program()?;
        Ok(seccomp::pack(&p)
            .iter()
            .map(|x| format!("{x:016x}"))
            .collect())
    })
    .clone()
}

/// The zygote, at its start: the filter the supervisor passed ([`zygote_program_hex`]).
pub fn parse_zygote_program(hex: &str) -> Result<BpfProgram, String> {
    if !hex.len().is_multiple_of(16) || hex.is_empty() || !hex.is_ascii() {
        return Err("seccomp: malformed zygote program".into());
    }
    let packed = (0..hex.len() / 16)
        .map(|i| u64::from_str_radix(&hex[16 * i..16 * i + 16], 16))
        .collect::<Result<Vec<u64>, _>>()
        .map_err(|e| format!("seccomp: malformed zygote program: {e}"))?;
    Ok(seccomp::unpack(&packed))
}

/// The zygote, last before its first fork: installs its filter. On an error nothing is
/// installed, and each worker installs its posture's whole program, as an exec'd worker does.
pub fn install_in_zygote(program: &BpfProgram) -> Result<(), String> {
    // SECCOMP_FILTER_FLAG_SPEC_ALLOW: this filter alone does not turn on the speculative store
    // bypass mitigation, which the kernel otherwise applies to a process with a filter: the
    // zygote ran without it before it had a filter, and each worker's own filter (installed
    // without the flag) turns it on for the worker as before.
    const SECCOMP_FILTER_FLAG_SPEC_ALLOW: libc::c_ulong = 1 << 2;
    let prog = libc::sock_fprog {
        len: u16::try_from(program.len()).map_err(|_| "seccomp: program too long")?,
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `prog` points at `program` (seccompiler's sock_filter has the kernel's layout),
    // which outlives the call; the kernel copies it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER as libc::c_ulong,
            SECCOMP_FILTER_FLAG_SPEC_ALLOW,
            &prog as *const libc::sock_fprog,
        )
    };
    if rc != 0 {
        return Err(format!("seccomp: {}", std::io::Error::last_os_error()));
    }
    INSTALLED.store(true, Ordering::SeqCst);
    Ok(())
}

/// The program a worker installs, given its job's programs (`bpf`): under an installed zygote
/// filter, the job's narrowing of it; else the job's programs merged into one.
pub fn worker_program(bpf: &SeccompBpf, pid: u32) -> Result<BpfProgram, String> {
    if INSTALLED.load(Ordering::SeqCst) && !bpf.narrowing.is_empty() {
        return seccomp::patch_pid(seccomp::unpack(&bpf.narrowing), pid);
    }
    let enosys = seccomp::unpack(&bpf.enosys);
    let allow = seccomp::patch_pid(seccomp::unpack(&bpf.allow), pid)?;
    seccomp::merge(&enosys, &allow)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::seccomp::tests::{run, stricter, syscall_data};

    /// Under every posture, the zygote's filter with the posture's narrowing stacked on it
    /// decides each syscall number, with arguments that do and do not match each argument
    /// rule, on this architecture and a foreign one, exactly as the posture's whole program
    /// does; and the narrowing is much shorter than the whole program (its point).
    #[test]
    fn the_zygote_filter_narrowed_decides_as_each_posture_s_whole_program() {
        let pid = 4242u32;
        let zygote = zygote_program().expect("zygote program");
        let enosys = seccomp::enosys_program().expect("enosys program");
        let args: [[u64; 6]; 9] = [
            [0; 6],
            [u64::from(pid), 6, 0, 0, 0, 0],
            [1, 2, 3, 4, 5, 6],
            [u64::MAX, 0x8000_0000, 1 << 40, 0x80000, 0, 0],
            [3, 0x5401, 0, 0, 0, 0],
            [0, 1, 0, 0, 0, 0],
            [3, 0, 0x20_0000, 0, 0, 0],
            [0, 4096, 4, 0x22, 0, 0],
            [u64::from(pid) + 1, 6, 0, 0, 0, 0],
        ];
        for fs in POSTURES {
            let allow = seccomp::program_for(fs, pid).expect("allowlist");
            let whole = seccomp::merge(&enosys, &allow).expect("merged");
            let narrow = narrowing_program(fs, pid).expect("narrowing");
            assert!(
                narrow.len() * 2 < whole.len(),
                "{fs:?}: narrowing {} against {}",
                narrow.len(),
                whole.len()
            );
            let mut outcomes = std::collections::BTreeSet::new();
            for arch in [0xc000_003e_u32, 0x4000_0003] {
                for nr in (0..470u32).chain([0x4000_0000, 0x4000_0001, u32::MAX]) {
                    for a in &args {
                        let data = syscall_data(nr, arch, a);
                        let stacked = stricter(run(&zygote, &data), run(&narrow, &data));
                        let expected = run(&whole, &data);
                        assert_eq!(
                            stacked, expected,
                            "{fs:?} arch {arch:#x} nr {nr} args {a:?}"
                        );
                        outcomes.insert(expected);
                    }
                }
            }
            assert!(outcomes.len() >= 3, "{fs:?}: only {outcomes:?} decided");
        }
    }

    /// What only the zygote and a worker's start need is killed in every posture's worker.
    #[test]
    fn a_narrowed_worker_cannot_fork_or_send_descriptors() {
        let (table, arch) = numbers().as_ref().expect("numbers");
        let zygote = zygote_program().expect("zygote program");
        for fs in POSTURES {
            let narrow = narrowing_program(fs, 7).expect("narrowing");
            for name in [
                "clone",
                "socketpair",
                "sendmsg",
                "seccomp",
                "prctl",
                "capset",
                "dup2",
            ] {
                let data = syscall_data(table[name], *arch, &[0; 6]);
                assert_eq!(run(&zygote, &data), SECCOMP_RET_ALLOW, "{name}");
                assert_eq!(
                    run(&narrow, &data),
                    SECCOMP_RET_KILL_PROCESS,
                    "{fs:?} {name}"
                );
            }
        }
    }
}
