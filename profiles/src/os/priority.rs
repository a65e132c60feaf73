//! CPU priority of the work that is off the request path. On a small machine, a fork by the
//! zygote, a new worker's start and a finished worker's teardown land on the CPU where a call
//! is about to run (the scheduler places a woken task beside its waker), and the call waits
//! for them. So that work runs under SCHED_IDLE (it gets a CPU only when no call wants it): the
//! zygote while it forks for the pool, every worker it forks until the worker is given a job,
//! the pool's refill thread, and a reused worker making its next context. Each of those
//! falls back to the normal policy when a call waits for it (the supervisor puts a worker
//! back before it sends the job; a call that needs a fork now promotes the zygote), so
//! starving the background under load only makes calls take the urgent path. A finished
//! worker is torn down under SCHED_IDLE too, while few are (its memory must come back under
//! load as well: see the supervisor's reaper).
//!
//! A lone call's worker (no other call in flight) also runs on the CPU of the thread that
//! drives its exchange while the call is short ([`beside_caller`], [`anywhere`]): on a VM
//! without halt polling, a wake-up sent to another CPU costs tens of microseconds. A worker
//! kept for another call makes its next context away from that CPU ([`away_from`]), where the
//! next call will run.
//!
//! Putting a process back needs CAP_SYS_NICE (a root supervisor) or an RLIMIT_NICE that allows
//! nice 0. A supervisor that has neither leaves every priority as it is.

use std::sync::OnceLock;

fn set_policy(id: u32, policy: libc::c_int) -> bool {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler reads the param we own; `id` 0 is the calling thread.
    unsafe { libc::sched_setscheduler(id as libc::pid_t, policy, &param) == 0 }
}

/// Whether this process may put a process back to the normal policy (tried once, on a
/// throwaway thread, so no real thread's priority is touched).
pub fn can_restore() -> bool {
    static CAN: OnceLock<bool> = OnceLock::new();
    *CAN.get_or_init(|| {
        std::thread::Builder::new()
            .name("stsd-sched-probe".into())
            .spawn(|| set_policy(0, libc::SCHED_IDLE) && set_policy(0, libc::SCHED_OTHER))
            .ok()
            .and_then(|h| h.join().ok())
            .unwrap_or(false)
    })
}

/// Thread or process `id` (0: the calling thread) does background work from now on. Only
/// where workers can be put back, so that the background is consistently below the calls.
pub fn background(id: u32) {
    if can_restore() {
        let _ = set_policy(id, libc::SCHED_IDLE);
    }
}

/// Whether the calling thread runs as background work (SCHED_IDLE) now.
pub fn is_background() -> bool {
    // SAFETY: sched_getscheduler(0) reads the calling thread's policy.
    unsafe { libc::sched_getscheduler(0) == libc::SCHED_IDLE }
}

/// Process `id` (a worker about to be given its job) back to the normal policy.
pub fn foreground(id: u32) {
    if can_restore() {
        let _ = set_policy(id, libc::SCHED_OTHER);
    }
}

/// The CPUs this process was given at start (the mask [`anywhere`] puts a worker back to).
fn start_mask() -> Option<libc::cpu_set_t> {
    static MASK: OnceLock<Option<libc::cpu_set_t>> = OnceLock::new();
    *MASK.get_or_init(|| {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity fills the one
        // we own.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            (libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0)
                .then_some(set)
        }
    })
}

fn set_mask(id: u32, set: &libc::cpu_set_t) -> bool {
    // SAFETY: sched_setaffinity reads the set we own.
    unsafe {
        libc::sched_setaffinity(
            id as libc::pid_t,
            std::mem::size_of::<libc::cpu_set_t>(),
            set,
        ) == 0
    }
}

/// Process `id` (a worker about to be given its job) runs on the CPU of the calling thread,
/// which waits for its answer: each wake-up between them is then local, not an interrupt to
/// another CPU (on a VM, tens of microseconds each way).
pub fn beside_caller(id: u32) {
    // SAFETY: sched_getcpu has no preconditions.
    let cpu = unsafe { libc::sched_getcpu() };
    if cpu < 0 {
        return;
    }
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes one bit of it, and
    // sched_getcpu's answer is below CPU_SETSIZE.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        set
    };
    let _ = set_mask(id, &set);
}

/// Process `id` may run on any of the supervisor's CPUs again.
pub fn anywhere(id: u32) {
    if start_mask().is_some_and(|set| set_mask(id, &set)) {
        return;
    }
    // The start's CPUs are no longer all allowed (the cgroup's cpuset changed since, say):
    // every CPU, which the kernel narrows to those the cpuset allows. A worker is never left
    // on one CPU.
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes bits below
    // CPU_SETSIZE.
    let all = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for cpu in 0..libc::CPU_SETSIZE as usize {
            libc::CPU_SET(cpu, &mut set);
        }
        set
    };
    set_mask(id, &all);
}

/// The CPU the calling thread runs on.
pub fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu has no preconditions.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).ok()
}

/// Process or thread `id` runs on any of the supervisor's CPUs but `cpu` (all of them when
/// that leaves none).
pub fn away_from(id: u32, cpu: usize) {
    if let Some(mut set) = start_mask() {
        // SAFETY: CPU_CLR and CPU_COUNT touch the set we own; `cpu` came from sched_getcpu,
        // below CPU_SETSIZE.
        let left = unsafe {
            libc::CPU_CLR(cpu, &mut set);
            libc::CPU_COUNT(&set)
        };
        if left > 0 && set_mask(id, &set) {
            return;
        }
    }
    anywhere(id);
}
