//! Where the background runs while calls come one at a time: the zygote, the pool's refill
//! thread, the zygote's manager and the reaper (and so the workers the zygote forks, which
//! inherit its CPUs until their call places them, and the workers being torn down) stay off the
//! CPU the lone call runs on. Under SCHED_IDLE they still woke on that CPU, beside the call
//! that had just woken them, and each fork, start and teardown there delayed the call by
//! preemption and wake-ups: one-shot p50 0.42 ms with the background free against 0.35-0.39
//! kept off the calls' CPU (one daemon, 800 calls alternating the two, three rounds). When
//! calls overlap, the background may run anywhere again.
//!
//! [`lone_call_here`] and [`calls_overlap`] are called as a call's exchange begins; each
//! changes placements only when the calls' CPU changes (one atomic read otherwise). A call
//! counts as lone only once no calls have overlapped for a while ([`alone_for_a_while`],
//! [`overlap_ended`]), so that concurrent load, whose calls are often alone for a moment, does
//! not move the background back and forth.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};
use stsd_profiles::os::priority;

/// The CPU the background keeps off, or [`ANYWHERE`].
static AWAY_FROM: AtomicUsize = AtomicUsize::new(ANYWHERE);
const ANYWHERE: usize = usize::MAX;

/// The background's threads (tids) and zygotes (pids), under one lock with every change of
/// placement, so that a zygote's pid is never placed after it is gone.
static BACKGROUND: Mutex<Background> = Mutex::new(Background {
    threads: Vec::new(),
    zygotes: Vec::new(),
});

struct Background {
    threads: Vec<u32>,
    zygotes: Vec<u32>,
}

fn lock() -> std::sync::MutexGuard<'static, Background> {
    BACKGROUND.lock().unwrap_or_else(|e| e.into_inner())
}

fn place(id: u32, away: usize) {
    if away == ANYWHERE {
        priority::anywhere(id);
    } else {
        priority::away_from(id, away);
    }
}

/// Moves the whole background to `away` (or anywhere).
fn move_to(away: usize) {
    let bg = lock();
    if AWAY_FROM.swap(away, Ordering::SeqCst) == away {
        return;
    }
    for &id in bg.threads.iter().chain(&bg.zygotes) {
        place(id, away);
    }
}

/// When calls last overlapped: one more than the milliseconds since [`epoch`], 0 if never.
static LAST_OVERLAP: AtomicU64 = AtomicU64::new(0);
/// How long after calls last overlapped a call alone in flight is still taken as one of
/// overlapping calls (see [`alone_for_a_while`]).
const SETTLE: Duration = Duration::from_millis(50);

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    epoch().elapsed().as_millis() as u64
}

/// Whether a call that finds itself alone in flight (`alone`) is one of calls that come one at
/// a time: alone, and no calls have overlapped for [`SETTLE`] (calls overlap from the start of
/// one beside another until one of them ends with the other still in flight). Under
/// concurrent load a call often finds itself alone for a moment (the others between their
/// calls); taken as lone, each such call moved the whole background away from its CPU and
/// pinned its worker, and the next overlapping call moved them all back: 5.5
/// `sched_setaffinity` calls per one-shot call at c=8, 1.0 since (c=1 keeps its 3: the lone
/// call's own placement).
pub fn alone_for_a_while(alone: bool) -> bool {
    settled(alone, &LAST_OVERLAP, now_ms())
}

/// A call ended with others still in flight: they overlapped until now.
pub fn overlap_ended() {
    overlapped(&LAST_OVERLAP, now_ms());
}

fn overlapped(last_overlap: &AtomicU64, now: u64) {
    // The latest wins: two threads may record out of order.
    last_overlap.fetch_max(now + 1, Ordering::Relaxed);
}

fn settled(alone: bool, last_overlap: &AtomicU64, now: u64) -> bool {
    if !alone {
        overlapped(last_overlap, now);
        return false;
    }
    let last = last_overlap.load(Ordering::Relaxed);
    last == 0 || (now + 1).saturating_sub(last) >= SETTLE.as_millis() as u64
}

/// A call alone in flight runs its exchange on this thread's CPU: the background keeps off it.
pub fn lone_call_here() {
    if let Some(cpu) = priority::current_cpu() {
        if AWAY_FROM.load(Ordering::Relaxed) != cpu {
            move_to(cpu);
        }
    }
}

/// Calls overlap: the background may run on any CPU.
pub fn calls_overlap() {
    if AWAY_FROM.load(Ordering::Relaxed) != ANYWHERE {
        move_to(ANYWHERE);
    }
}

/// Whether the background keeps off a CPU now (a worker forked now inherits that).
pub fn keeping_away() -> bool {
    AWAY_FROM.load(Ordering::Relaxed) != ANYWHERE
}

/// Process `pid` (a worker being torn down, or making its next context) runs where the
/// background does; true when that is not every CPU.
pub fn with_background(pid: u32) -> bool {
    let away = AWAY_FROM.load(Ordering::Relaxed);
    place(pid, away);
    away != ANYWHERE
}

/// The calling thread is background work while the guard lives.
pub fn background_thread() -> BackgroundThread {
    let tid = nix::unistd::gettid().as_raw() as u32;
    let mut bg = lock();
    bg.threads.push(tid);
    place(tid, AWAY_FROM.load(Ordering::SeqCst));
    BackgroundThread(tid)
}

/// A background thread, counted until it ends (no placement reaches its tid after).
pub struct BackgroundThread(u32);

impl Drop for BackgroundThread {
    fn drop(&mut self) {
        lock().threads.retain(|&t| t != self.0);
    }
}

/// A zygote (or a posture's template, `exec::template`, whose children inherit its CPUs as a
/// zygote's workers do) started: it is background work.
pub fn zygote_started(pid: u32) {
    let mut bg = lock();
    bg.zygotes.push(pid);
    place(pid, AWAY_FROM.load(Ordering::SeqCst));
}

/// A zygote (or a template) is being retired: no placement reaches its pid any more.
pub fn zygote_gone(pid: u32) {
    lock().zygotes.retain(|&z| z != pid);
}

#[cfg(test)]
mod tests {
    use super::{overlapped, settled, SETTLE};
    use std::sync::atomic::AtomicU64;

    #[test]
    fn a_lone_call_counts_as_lone_only_once_calls_have_not_overlapped_for_a_while() {
        let settle = SETTLE.as_millis() as u64;
        let last = AtomicU64::new(0);
        // Calls have never overlapped: alone is lone, even at the clock's start.
        assert!(settled(true, &last, 0));
        // A call starts beside another at 1000 ms: not lone, and nor is a call alone soon after.
        assert!(!settled(false, &last, 1000));
        assert!(!settled(true, &last, 1001));
        assert!(!settled(true, &last, 1000 + settle - 1));
        // Alone for the settling time: lone again.
        assert!(settled(true, &last, 1000 + settle));
        // Calls that overlap until 2500 ms (one ends with the other in flight): the wait runs
        // from there, and an earlier time recorded late does not shorten it.
        assert!(!settled(false, &last, 2000));
        overlapped(&last, 2500);
        overlapped(&last, 2100);
        assert!(!settled(true, &last, 2000 + settle));
        assert!(!settled(true, &last, 2500 + settle - 1));
        assert!(settled(true, &last, 2500 + settle));
    }
}
