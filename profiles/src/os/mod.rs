//! The OS profile of a posture, applied in one irreversible step before the tool's code is
//! parsed: close every other fd, switch user and clear capabilities (when root), lock the
//! process, set rlimits, Landlock, then seccomp (last, because it forbids the calls above).

pub mod landlock;
pub mod priority;
pub mod privileges;
pub mod process;
pub mod seccomp;
pub mod zygote_filter;

use privileges::RLimits;
use std::path::Path;
use stsd_protocol::frames::{FsAccess, JobLimits, SandboxSpec};

/// The fd the worker's socket sits on; every other fd above stderr is closed.
pub const WORKER_SOCKET_FD: i32 = 3;
/// RLIMIT_AS above the call's memory budget (see `rlimits_for`).
pub const ADDRESS_SPACE_MARGIN: u64 = 320 << 20;
/// Largest file a write posture may create.
pub const MAX_WRITE_FILE_BYTES: u64 = 64 * 1024 * 1024;

/// Why the profile could not be applied. The tool is refused (SANDBOX_UNAVAILABLE).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxUnavailable(pub String);

/// The rlimits of a worker confined to `spec` that may serve `calls` calls (reuse; 1
/// without). Only the hard CPU limit depends on `calls`.
pub fn rlimits_for(spec: &SandboxSpec, limits: &JobLimits, calls: u32) -> RLimits {
    let cpu_seconds = cpu_seconds_per_call(limits);
    RLimits {
        // The socket, stdio, and a few files for fs helpers.
        nofile: if spec.fs == stsd_protocol::frames::FsAccess::None {
            8
        } else {
            32
        },
        // The QuickJS heap limit is the real memory wall, and host helpers charge what they
        // build to it; this backstop sits just above: the budget plus room for the mapped
        // binary and libraries (about 40 MiB), the stack, one transient host copy and
        // allocator slack.
        address_space: limits.memory_bytes.saturating_add(ADDRESS_SPACE_MARGIN),
        cpu_seconds,
        cpu_hard_seconds: cpu_hard_seconds(cpu_seconds, calls),
        file_size: if spec.fs.can_write() {
            MAX_WRITE_FILE_BYTES.min(limits.max_write_bytes.max(1))
        } else {
            0
        },
    }
}

/// One call's CPU budget: the deadline, rounded up, plus 2 s (the wall-clock deadline and
/// the supervisor's SIGKILL come first for a single-threaded worker; this is the backstop).
pub fn cpu_seconds_per_call(limits: &JobLimits) -> u64 {
    limits.timeout_ms.div_ceil(1000) + 2
}

/// The hard CPU limit of a worker serving up to `calls` calls of `per_call` seconds each:
/// one second of slack per call covers [`rearm_cpu`] rounding the CPU time used up to whole
/// seconds.
pub fn cpu_hard_seconds(per_call: u64, calls: u32) -> u64 {
    per_call
        .saturating_add(1)
        .saturating_mul(u64::from(calls.max(1)))
}

/// Reuse: before each call after the first, a fresh CPU budget for this call (see
/// [`privileges::rearm_cpu`]). A worker that cannot renew it refuses the job
/// (SANDBOX_UNAVAILABLE); the supervisor then runs the call on a fresh worker.
pub fn rearm_cpu(limits: &JobLimits) -> Result<(), SandboxUnavailable> {
    privileges::rearm_cpu(cpu_seconds_per_call(limits)).map_err(SandboxUnavailable)
}

/// CPU time on `clock` (CLOCK_PROCESS_CPUTIME_ID, CLOCK_THREAD_CPUTIME_ID), nanoseconds; 0
/// when it cannot be read.
pub fn cpu_time_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return 0;
    }
    (ts.tv_sec.max(0) as u64) * 1_000_000_000 + ts.tv_nsec.max(0) as u64
}

/// Closes every fd above stderr except the worker socket. Stdio stays open on /dev/null (the
/// supervisor spawns the worker that way) so nothing the tool opens can land on fd 0 to 2.
pub fn close_other_fds() -> Result<(), SandboxUnavailable> {
    // SAFETY: close_range with plain integer arguments; no Rust object owns these fds.
    let rc = unsafe { libc::close_range((WORKER_SOCKET_FD + 1) as u32, u32::MAX, 0) };
    if rc != 0 {
        return Err(SandboxUnavailable(format!(
            "close_range: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// The posture-independent half of the profile, done before the worker reports Ready (no
/// tool is known yet, and none of its code has been seen): every other fd closed, the worker
/// user and no capabilities, no_new_privs, not dumpable, the parent-death signal. The seccomp
/// programs come compiled with the job (the supervisor compiles them once, not every worker).
pub struct Prepared {
    uid: u32,
    gid: u32,
}

pub fn prepare(uid: u32, gid: u32, parent_pid: u32) -> Result<Prepared, SandboxUnavailable> {
    let fail = |e: String| SandboxUnavailable(e);
    close_other_fds()?;
    privileges::switch_user(uid, gid).map_err(fail)?;
    privileges::clear_capabilities().map_err(fail)?;
    privileges::lock_process(parent_pid).map_err(fail)?;
    Ok(Prepared { uid, gid })
}

/// [`prepare`] plus the rlimit that depends on no posture and leaves the process able to fork
/// (no core dump): a worker's posture-independent half, applied before it says Ready. (The
/// zygote applies only [`prepare`]. `RLIMIT_NPROC` goes to 0 as a worker is confined: a fresh
/// worker may still become a posture's template, which forks.)
pub fn prepare_worker(uid: u32, gid: u32, parent_pid: u32) -> Result<Prepared, SandboxUnavailable> {
    let p = prepare(uid, gid, parent_pid)?;
    privileges::apply_fixed_rlimits().map_err(SandboxUnavailable)?;
    Ok(p)
}

/// The posture's half, applied when the job arrives and before its code is parsed: rlimits,
/// Landlock, then seccomp. After this returns Ok, the process can never regain anything.
pub fn confine(
    prep: &Prepared,
    spec: &SandboxSpec,
    limits: &JobLimits,
    bpf: &stsd_protocol::frames::SeccompBpf,
    calls: u32,
) -> Result<(), SandboxUnavailable> {
    let program = checked_program(prep, spec, bpf)?;
    confine_posture(spec, limits, calls)?;
    privileges::forbid_new_processes().map_err(SandboxUnavailable)?;
    stack(&program)
}

/// A posture's template (`worker/src/template.rs`), once: the posture's rlimits (for one
/// call: every child it forks inherits them, with a CPU clock of its own) and Landlock; not
/// `RLIMIT_NPROC` and not the seccomp narrowing, for it must still fork. What its children
/// add is [`confine_from_template`].
pub fn confine_template(
    prep: &Prepared,
    spec: &SandboxSpec,
    limits: &JobLimits,
) -> Result<(), SandboxUnavailable> {
    check_user(prep, spec)?;
    confine_posture(spec, limits, 1)
}

/// A child forked by a template confined by [`confine_template`] to `spec`: what [`confine`]
/// adds to it, no new process and the seccomp filter. Together they are [`confine`] with one
/// call, in its order: rlimits, Landlock, then seccomp.
pub fn confine_from_template(
    prep: &Prepared,
    spec: &SandboxSpec,
    bpf: &stsd_protocol::frames::SeccompBpf,
) -> Result<(), SandboxUnavailable> {
    let program = checked_program(prep, spec, bpf)?;
    privileges::forbid_new_processes().map_err(SandboxUnavailable)?;
    stack(&program)
}

/// The posture's seccomp program for this process, for a job of this worker's user (checked
/// here, first). Made before anything is applied: nothing after Landlock may allocate in ways
/// the filters could refuse. One filter that decides as the ENOSYS program stacked before the
/// allowlist would, or, stacked on a zygote's filter, the posture's narrowing of it.
fn checked_program(
    prep: &Prepared,
    spec: &SandboxSpec,
    bpf: &stsd_protocol::frames::SeccompBpf,
) -> Result<seccompiler::BpfProgram, SandboxUnavailable> {
    let fail = |e: String| SandboxUnavailable(e);
    check_user(prep, spec)?;
    if bpf.allow.is_empty() || bpf.enosys.is_empty() {
        return Err(fail("the job carries no seccomp program".into()));
    }
    zygote_filter::worker_program(bpf, std::process::id()).map_err(fail)
}

/// The posture's rlimits and Landlock (the job's user is checked by the caller).
fn confine_posture(
    spec: &SandboxSpec,
    limits: &JobLimits,
    calls: u32,
) -> Result<(), SandboxUnavailable> {
    let fail = |e: String| SandboxUnavailable(e);
    let base = Path::new(&spec.base_path);
    if spec.fs != FsAccess::None && !base.is_absolute() {
        return Err(fail(format!(
            "base path {} is not absolute",
            spec.base_path
        )));
    }
    privileges::apply_rlimits(&rlimits_for(spec, limits, calls)).map_err(fail)?;
    landlock::restrict(spec.fs, base).map_err(fail)
}

/// A job for another user than the one this worker runs as is refused.
fn check_user(prep: &Prepared, spec: &SandboxSpec) -> Result<(), SandboxUnavailable> {
    if (spec.uid, spec.gid) != (prep.uid, prep.gid) {
        return Err(SandboxUnavailable(format!(
            "the job asks for uid/gid {}/{} but this worker runs as {}/{}",
            spec.uid, spec.gid, prep.uid, prep.gid
        )));
    }
    Ok(())
}

fn stack(program: &seccompiler::BpfProgram) -> Result<(), SandboxUnavailable> {
    seccompiler::apply_filter(program).map_err(|e| SandboxUnavailable(format!("seccomp: {e}")))
}
