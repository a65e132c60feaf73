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

/// Process `id` (a worker about to be given its job) back to the normal policy.
pub fn foreground(id: u32) {
    if can_restore() {
        let _ = set_policy(id, libc::SCHED_OTHER);
    }
}
