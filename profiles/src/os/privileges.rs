//! Privilege drop for a worker that starts as root: unprivileged uid/gid, no supplementary
//! groups, every capability set cleared, no_new_privs, not dumpable, resource limits.

use nix::errno::Errno;
use nix::sys::resource::{setrlimit, Resource};
use nix::unistd::{setgroups, setresgid, setresuid, Gid, Uid};

fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63)
}

fn errno(what: &str) -> String {
    format!("{what}: {}", Errno::last())
}

/// Switches to `uid`/`gid` when running as root. Bounding-set drops need CAP_SETPCAP, so they
/// come first, while still root.
pub fn switch_user(uid: u32, gid: u32) -> Result<(), String> {
    let ids = nix::unistd::getresuid().map_err(|e| format!("getresuid: {e}"))?;
    if !ids.effective.is_root() {
        // Not root now; but a root real or saved uid could be switched back to.
        if ids.real.is_root() || ids.saved.is_root() {
            return Err(
                "the real or saved uid is root while the effective one is not; refusing".into(),
            );
        }
        return Ok(());
    }
    if uid == 0 || gid == 0 {
        return Err(
            "refusing to run a tool as uid or gid 0; configure an unprivileged worker user".into(),
        );
    }
    for cap in 0..=last_cap() {
        // SAFETY: prctl with integer arguments only.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if rc != 0 && Errno::last() != Errno::EINVAL {
            return Err(errno("PR_CAPBSET_DROP"));
        }
    }
    setgroups(&[]).map_err(|e| format!("setgroups: {e}"))?;
    let g = Gid::from_raw(gid);
    setresgid(g, g, g).map_err(|e| format!("setresgid: {e}"))?;
    let u = Uid::from_raw(uid);
    setresuid(u, u, u).map_err(|e| format!("setresuid: {e}"))?;
    Ok(())
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Clears the ambient, effective, permitted and inheritable sets (the bounding set is cleared
/// in [`switch_user`] while the process still may).
pub fn clear_capabilities() -> Result<(), String> {
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    if rc != 0 {
        return Err(errno("PR_CAP_AMBIENT_CLEAR_ALL"));
    }
    let header = CapHeader {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3: two 32-bit words per set
        pid: 0,
    };
    let data = [CapData::default(); 2];
    // SAFETY: header and data are valid for the duration of the call and laid out as the
    // kernel's __user_cap_header_struct / __user_cap_data_struct[2].
    let rc = unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) };
    if rc != 0 {
        return Err(errno("capset"));
    }
    Ok(())
}

/// no_new_privs, not dumpable, and the parent-death signal (a uid change clears it).
pub fn lock_process(parent: u32) -> Result<(), String> {
    nix::sys::prctl::set_no_new_privs().map_err(|e| format!("no_new_privs: {e}"))?;
    nix::sys::prctl::set_dumpable(false).map_err(|e| format!("dumpable: {e}"))?;
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    if rc != 0 {
        return Err(errno("PR_SET_PDEATHSIG"));
    }
    // The parent may have died before the signal was armed.
    if nix::unistd::getppid().as_raw() as u32 != parent {
        return Err("supervisor went away".into());
    }
    Ok(())
}

/// Resource limits (soft = hard, so the tool cannot raise them; CPU excepted, see below).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RLimits {
    pub nofile: u64,
    pub address_space: u64,
    /// The soft CPU limit: one call's budget (SIGXCPU, classified TIMEOUT).
    pub cpu_seconds: u64,
    /// The hard CPU limit (SIGKILL): one call's budget plus a second, or with reuse the
    /// budget of every call the worker may serve. The supervisor moves the soft limit up
    /// before each reused call (RLIMIT_CPU counts the whole life of the process); the worker
    /// itself cannot (seccomp forbids setrlimit and prlimit64).
    pub cpu_hard_seconds: u64,
    /// Largest file the tool may write; 0 when it may not write.
    pub file_size: u64,
}

/// The limit that depends on no posture and leaves the process able to fork: no core dump.
/// Set by every worker before it says Ready (never by the zygote).
pub fn apply_fixed_rlimits() -> Result<(), String> {
    setrlimit(Resource::RLIMIT_CORE, 0, 0).map_err(|e| format!("setrlimit CORE: {e}"))
}

/// No new process (or thread) for this user from here on. Set as a worker is confined, not
/// before its Ready: a fresh worker may still be made a posture's template, which forks.
pub fn forbid_new_processes() -> Result<(), String> {
    setrlimit(Resource::RLIMIT_NPROC, 0, 0).map_err(|e| format!("setrlimit NPROC: {e}"))
}

/// The posture's limits (the fixed ones are in force since [`apply_fixed_rlimits`]).
pub fn apply_rlimits(l: &RLimits) -> Result<(), String> {
    let set = |r: Resource, v: u64, name: &str| {
        setrlimit(r, v, v).map_err(|e| format!("setrlimit {name}: {e}"))
    };
    set(Resource::RLIMIT_NOFILE, l.nofile, "NOFILE")?;
    set(Resource::RLIMIT_AS, l.address_space, "AS")?;
    // Soft below hard so the kernel sends SIGXCPU (classified TIMEOUT) before SIGKILL.
    setrlimit(
        Resource::RLIMIT_CPU,
        l.cpu_seconds,
        l.cpu_hard_seconds.max(l.cpu_seconds + 1),
    )
    .map_err(|e| format!("setrlimit CPU: {e}"))?;
    set(Resource::RLIMIT_FSIZE, l.file_size, "FSIZE")?;
    Ok(())
}

/// Reuse: RLIMIT_CPU counts the whole life of a process, so before each call after the first
/// a reused worker moves its soft limit to the CPU time it has used so far (rounded up to a
/// second) plus `per_call`. The hard limit, set at confinement to cover every call the worker
/// may serve, stays; without CAP_SYS_RESOURCE the worker could not raise it anyway. Fails
/// when that budget is spent. Runs under seccomp, which allows prlimit64 for this process's
/// RLIMIT_CPU only (`seccomp/base.json`).
pub fn rearm_cpu(per_call: u64) -> Result<(), String> {
    let mut used = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    if unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut used) } != 0 {
        return Err(format!(
            "clock_gettime: {}",
            std::io::Error::last_os_error()
        ));
    }
    let used_secs = (used.tv_sec.max(0) as u64) + u64::from(used.tv_nsec > 0);
    let mut cur = libc::rlimit64 {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit64 on this process (pid 0) reads the limit into a valid pointer.
    if unsafe { libc::prlimit64(0, libc::RLIMIT_CPU, std::ptr::null(), &mut cur) } != 0 {
        return Err(format!(
            "prlimit CPU (read): {}",
            std::io::Error::last_os_error()
        ));
    }
    let soft = used_secs.saturating_add(per_call);
    // Soft below hard, so the kernel sends SIGXCPU (TIMEOUT) before SIGKILL.
    if soft >= cur.rlim_max {
        return Err(format!(
            "the CPU budget of this worker's calls is spent ({used_secs} s used, hard limit {} s)",
            cur.rlim_max
        ));
    }
    let new = libc::rlimit64 {
        rlim_cur: soft,
        rlim_max: cur.rlim_max,
    };
    // SAFETY: prlimit64 on this process reads the new limit from a valid pointer.
    if unsafe { libc::prlimit64(0, libc::RLIMIT_CPU, &new, std::ptr::null_mut()) } != 0 {
        return Err(format!("prlimit CPU: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}
