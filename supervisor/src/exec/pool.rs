//! The worker pool: N workers exec'd and waiting (they reported Ready) before any call arrives.
//! A call takes one; a refill thread replaces it off the request path. When the pool is
//! empty (a burst), the call spawns its own worker rather than wait.
//!
//! With reuse, a worker that served a call is parked under its [`reuse_key`] and waits for
//! another call with the same key. Parked workers are bounded per key (the pool size) and in
//! all (`[worker] reuse_max_parked`, the pool size by default; parking one more lets the
//! longest-parked go), and one that waits longer than `[worker] reuse_idle_seconds` is killed
//! by the refill thread.

use super::bodies::{Bodies, PRIMED_WAIT};
use super::template::Templates;
use crate::exec::{reap_later, spawn_ready, CallError, ExecOptions, ReadyWorker};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use stsd_protocol::frames::{Bytecode, FsAccess, Job, Prime, MAX_FRAME_BYTES};

/// The key a reused worker is parked under: the tool's name and everything its worker was
/// confined to or limited by on its first job (the sandbox, the limits, the resolved
/// toolSafety), compared exactly rather than through a digest, so two postures can never
/// share a key. When SIGHUP re-reads a catalog whose posture for the tool changed, the key
/// changes: the next call gets a fresh worker, and the old-posture workers expire unused.
pub fn reuse_key(name: &str, job: &Job) -> String {
    format!(
        "{name}\n{:?}\n{:?}\n{}",
        job.sandbox, job.limits, job.tool_safety_json
    )
}

/// Whether a one-shot call may go to a primed worker: not a test probe or a syntax check,
/// arguments that fit one frame, and no file-system grant. A file-system posture is applied
/// when its call starts, so that its Landlock rules name the base path's directory as it is
/// then (one replaced between a priming and its call would leave the tool without access).
pub fn primable(job: &Job) -> bool {
    // What a prime carries, over-counted (bincode writes each BPF instruction in at most 9
    // bytes): it must fit one frame, as the call's arguments must.
    let template = job.code.len()
        + job.statics_json.len()
        + job.tool_safety_json.len()
        + job.sandbox.base_path.len()
        + job.declared.iter().map(|d| d.len() + 9).sum::<usize>()
        + 9 * (job.seccomp.enosys.len() + job.seccomp.allow.len() + job.seccomp.narrowing.len());
    job.attack.is_none()
        && !job.compile_only
        && job.sandbox.fs == FsAccess::None
        && job.args_json.len() < MAX_FRAME_BYTES / 2
        && template < MAX_FRAME_BYTES / 2
}

/// Whether a call that finds none of the workers parked under its key ready takes the
/// longest-parked of them (which has had the most time to finish) and waits for it, rather
/// than take a warm pool worker (`pool_has_one`). `full`: the key holds as many parked
/// workers as it may.
///
/// One-shot (`reuse` false): always. A worker still being primed has done most of what a pool
/// worker would do on the call path (posture, context, body), so the rest of its priming is
/// the shorter wait, and the pool worker stays for the next call. Taking the pool worker
/// instead made calls alternate between primed and not (at one call after another: trivial
/// p50 0.51 ms against 0.46, and 7% more CPU per call, six interleaved runs each).
///
/// Reuse: only when the pool has none or the key is full. With the key full, a reused worker
/// would be let go after its call, and the fork, start and teardown of a worker every few
/// calls took the CPU the parked workers needed for their contexts, so that still more calls
/// missed them (a third of 2000 back-to-back calls, in one trace; two workers now take turns).
fn waits_for_parked(reuse: bool, pool_has_one: bool, full: bool) -> bool {
    !reuse || !pool_has_one || full
}

struct Parked {
    w: ReadyWorker,
    since: Instant,
}

/// Primed workers kept per tool (one-shot): one can serve the next call while the other is
/// still being primed.
const PRIMED_PER_KEY: usize = 2;

struct State {
    ready: VecDeque<ReadyWorker>,
    /// One-shot with priming: tools whose next calls want primed workers (the refill thread
    /// primes pool workers for them), by key, with the primes still to try for each (a chain
    /// of them never outlasts that count, so primes that fail, or workers that die as they
    /// are primed, cannot loop).
    prime_wanted: HashMap<String, (Arc<Prime>, usize)>,
    /// Reuse: workers that served a call and wait for another with the same key (they are
    /// already confined to its posture), most recently parked last.
    parked: HashMap<String, Vec<Parked>>,
    parked_total: usize,
    stopping: bool,
    /// When [`State::take_expired`] last looked for parked workers that died.
    swept: Instant,
}

/// How often, at most, the refill thread looks for parked workers that died while they
/// waited (on its rounds: it is not woken for it).
const DEATH_SWEEP: Duration = Duration::from_secs(1);

impl State {
    /// The longest-waiting pool worker that is still alive; those that died while idle
    /// (killed from outside) are dropped, and replaced by the refill thread.
    fn pop_ready(&mut self) -> Option<ReadyWorker> {
        while let Some(mut w) = self.ready.pop_front() {
            if w.is_alive() {
                return Some(w);
            }
        }
        None
    }

    /// Removes the parked worker that has waited longest.
    fn evict_oldest(&mut self) -> Option<ReadyWorker> {
        let key = self
            .parked
            .iter()
            .filter_map(|(k, list)| list.first().map(|p| (p.since, k)))
            .min_by_key(|(since, _)| *since)
            .map(|(_, k)| k.clone())?;
        let list = self.parked.get_mut(&key)?;
        let p = list.remove(0);
        if list.is_empty() {
            self.parked.remove(&key);
        }
        self.parked_total -= 1;
        Some(p.w)
    }

    /// Removes parked workers that waited `idle` or longer, and, on a round at least a
    /// [`DEATH_SWEEP`] after the last such look, those that died while they waited. The
    /// refill thread comes here several times a call, and asking the kernel each time
    /// whether each parked worker lives (a `wait4` each, under the pool's lock) was 3 of the
    /// daemon's 41 syscalls a one-shot call at one call after another. A dead parked worker
    /// may stay longer (until a round after the sweep is due, or until a call that scans
    /// its key reaches it, or its idle time is up), holding its key's place meanwhile.
    fn take_expired(&mut self, now: Instant, idle: Duration) -> Vec<ReadyWorker> {
        let sweep = now.duration_since(self.swept) >= DEATH_SWEEP;
        if sweep {
            self.swept = now;
        }
        let mut out = Vec::new();
        for list in self.parked.values_mut() {
            let mut i = 0;
            while i < list.len() {
                let p = &mut list[i];
                if now.duration_since(p.since) >= idle || (sweep && !p.w.is_alive()) {
                    out.push(list.remove(i).w);
                } else {
                    i += 1;
                }
            }
        }
        self.parked.retain(|_, list| !list.is_empty());
        self.parked_total -= out.len();
        out
    }

    /// How long until the longest-parked worker expires (None: nothing is parked).
    fn next_expiry(&self, now: Instant, idle: Duration) -> Option<Duration> {
        self.parked
            .values()
            .filter_map(|list| list.first())
            .map(|p| (p.since + idle).saturating_duration_since(now))
            .min()
    }
}

pub struct Pool {
    opts: ExecOptions,
    target: usize,
    max_parked: usize,
    state: Mutex<State>,
    /// Wakes the refill thread: a worker was taken, one was parked, or the pool stops.
    wake: Condvar,
    refill: Mutex<Option<JoinHandle<()>>>,
    /// One-shot with priming: tools' bodies as bytecode, from their first primed workers.
    bodies: Bodies,
    /// One-shot with priming (`[worker] template`): the templates that fork tools' primed
    /// workers, by key.
    templates: Templates,
}

impl Pool {
    /// Starts the pool and its refill thread; returns at once (warming happens behind).
    pub fn start(opts: ExecOptions, target: usize) -> Arc<Pool> {
        let max_parked = opts.reuse_max_parked.unwrap_or(target);
        let max_forks = opts.max_forks;
        let pool = Arc::new(Pool {
            opts,
            target,
            max_parked,
            state: Mutex::new(State {
                ready: VecDeque::with_capacity(target),
                prime_wanted: HashMap::new(),
                parked: HashMap::new(),
                parked_total: 0,
                stopping: false,
                swept: Instant::now(),
            }),
            wake: Condvar::new(),
            refill: Mutex::new(None),
            bodies: Bodies::default(),
            templates: Templates::new(target, max_forks),
        });
        let p = pool.clone();
        let handle = std::thread::Builder::new()
            .name("stsd-pool-refill".into())
            .spawn(move || p.refill_loop())
            .ok();
        *pool.lock_refill() = handle;
        pool
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep serving.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_refill(&self) -> MutexGuard<'_, Option<JoinHandle<()>>> {
        self.refill.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `target` workers ready, and kills parked workers whose idle time is up.
    fn refill_loop(&self) {
        // Making workers is background work: a call in flight goes first.
        stsd_profiles::os::priority::background(0);
        let _placed = crate::exec::placement::background_thread();
        let idle = self.opts.reuse_idle;
        loop {
            let (expired, templates_expired) = {
                let mut st = self.lock();
                loop {
                    if st.stopping {
                        crate::exec::worker::refill_busy(false);
                        return;
                    }
                    let now = Instant::now();
                    let expired = st.take_expired(now, idle);
                    let templates_expired = self.templates.take_expired(now, idle);
                    if !expired.is_empty()
                        || !templates_expired.is_empty()
                        || st.ready.len() < self.target
                        || !st.prime_wanted.is_empty()
                    {
                        crate::exec::worker::refill_busy(true);
                        break (expired, templates_expired);
                    }
                    crate::exec::worker::refill_busy(false);
                    let next = [
                        st.next_expiry(now, idle),
                        self.templates.next_expiry(now, idle),
                    ];
                    st = match next.into_iter().flatten().min() {
                        Some(d) => {
                            self.wake
                                .wait_timeout(st, d)
                                .unwrap_or_else(|e| e.into_inner())
                                .0
                        }
                        None => self.wake.wait(st).unwrap_or_else(|e| e.into_inner()),
                    };
                }
            };
            if !templates_expired.is_empty() {
                tracing::debug!(count = templates_expired.len(), "templates expired");
                drop(templates_expired); // killed and reaped, outside the lock
            }
            if !expired.is_empty() {
                tracing::debug!(count = expired.len(), "parked workers expired");
                drop(expired); // killed and reaped, outside the lock
                continue;
            }
            if self.prime_one() {
                continue;
            }
            match spawn_ready(&self.opts, false) {
                Ok(w) => {
                    let mut st = self.lock();
                    if st.stopping {
                        crate::exec::worker::refill_busy(false);
                        return; // `w` is dropped: killed and reaped
                    }
                    st.ready.push_back(w);
                }
                Err(e) => {
                    tracing::error!(error = %e.message, "cannot start a pool worker; retrying in 1 s");
                    std::thread::sleep(std::time::Duration::from_secs(1));
                }
            }
        }
    }

    /// Primes one pool worker for a tool that wants one, and parks it under the tool's key.
    /// False when no tool wants one (or the one asked for has enough already).
    fn prime_one(&self) -> bool {
        let (key, prime) = {
            let mut st = self.lock();
            let Some(key) = st.prime_wanted.keys().next().cloned() else {
                return false;
            };
            let Some((prime, tries)) = st.prime_wanted.remove(&key) else {
                return false;
            };
            let have = st.parked.get(&key).map_or(0, Vec::len);
            if have >= PRIMED_PER_KEY || tries == 0 {
                return true;
            }
            if have + 1 < PRIMED_PER_KEY && tries > 1 {
                // One more after this one.
                st.prime_wanted
                    .insert(key.clone(), (prime.clone(), tries - 1));
            }
            (key, prime)
        };
        let prime = self.bodies.prime(&key, &prime);
        // A template's child, when the prime asks for no bytecode (the first prime under a
        // key does, and goes to a pool worker: only there is it taken).
        if self.opts.template && !prime.want_bytecode {
            match self.templates.fork(&key, &prime, &self.opts) {
                Ok(w) => {
                    if !self.park(&key, w) {
                        self.lock().prime_wanted.remove(&key);
                    }
                    return true;
                }
                Err(e) => tracing::debug!(error = %e, "no template child; priming a pool worker"),
            }
        }
        let w = self.lock().pop_ready();
        let mut w = match w {
            Some(w) => w,
            None => match spawn_ready(&self.opts, false) {
                Ok(w) => w,
                Err(e) => {
                    tracing::error!(error = %e.message, "cannot start a worker to prime");
                    return false;
                }
            },
        };
        let asked = prime.want_bytecode.then(|| prime.clone());
        let kept = match (w.prime(prime), asked) {
            // The one prime the refill thread waits for: the first under its key and source.
            (Ok(()), Some(asked)) => match w.await_primed(PRIMED_WAIT) {
                Ok(made) => {
                    self.bodies.keep(&key, &asked, made);
                    self.park(&key, w)
                }
                Err(e) => {
                    tracing::debug!(error = %e, "a worker primed for its bytecode failed");
                    self.bodies.failed(&key, &asked);
                    false
                }
            },
            (Ok(()), None) => self.park(&key, w),
            (Err(e), _) => {
                tracing::debug!(error = %e, "a worker was not primed");
                false
            }
        };
        if !kept {
            // Not primed, or not kept: no more tries for that tool until its next call.
            self.lock().prime_wanted.remove(&key);
        }
        true
    }

    /// One-shot with priming: a worker for `job`, primed for its template when one is
    /// (see [`Pool::take_for`]), else a pool worker; and, when `more`, the tool's next calls
    /// want primed workers (`make` builds the prime, only when one is wanted).
    pub fn take_primed(
        &self,
        key: &str,
        job: &Job,
        more: bool,
        make: impl FnOnce() -> Prime,
    ) -> Result<ReadyWorker, CallError> {
        let mut w = self.take_parked_or_spawn(key, false)?;
        if w.is_primed() && !w.is_primed_for(job) {
            // Primed for the tool as it was (its code or variables changed since): let go.
            reap_later(w);
            w = self.take()?;
        }
        self.want_primes(key, more, make);
        Ok(w)
    }

    /// Like [`Pool::take_primed`], but only a worker already made: None rather than a fork.
    pub fn take_primed_nowait(
        &self,
        key: &str,
        job: &Job,
        more: bool,
        make: impl FnOnce() -> Prime,
    ) -> Option<ReadyWorker> {
        let mut w = self.take_parked(key, false)?;
        if w.is_primed() && !w.is_primed_for(job) {
            reap_later(w);
            w = self.take_nowait()?;
        }
        self.want_primes(key, more, make);
        Some(w)
    }

    /// The bytecode kept under `key` for `job`'s body as this call wraps it (see
    /// [`Bodies::for_job`]).
    pub fn bytecode_for(&self, key: &str, job: &Job) -> Option<Bytecode> {
        self.bodies.for_job(key, job)
    }

    /// When `more`, the next calls of the tool under `key` want primed workers.
    fn want_primes(&self, key: &str, more: bool, make: impl FnOnce() -> Prime) {
        {
            let mut st = self.lock();
            let have = st.parked.get(key).map_or(0, Vec::len);
            if !more || self.max_parked == 0 || st.stopping || have >= PRIMED_PER_KEY {
                return;
            }
            let tries = PRIMED_PER_KEY - have;
            match st.prime_wanted.get_mut(key) {
                // Already wanted, for fewer than are now missing: two calls that each took
                // one before the first's replacement was primed left the key one short
                // until it ran out altogether.
                Some(wanted) => wanted.1 = wanted.1.max(tries),
                None => {
                    st.prime_wanted
                        .insert(key.to_string(), (Arc::new(make()), tries));
                }
            }
        }
        self.wake.notify_one();
    }

    /// A ready worker: a warm one when there is one, else a freshly spawned one.
    pub fn take(&self) -> Result<ReadyWorker, CallError> {
        match self.take_nowait() {
            Some(w) => Ok(w),
            None => spawn_ready(&self.opts, true),
        }
    }

    /// A worker made now for one call (the urgent path: the zygote forks at once).
    pub fn fresh(&self) -> Result<ReadyWorker, CallError> {
        spawn_ready(&self.opts, true)
    }

    /// A warm pool worker, if there is one (the refill thread replaces it).
    pub fn take_nowait(&self) -> Option<ReadyWorker> {
        let warm = self.lock().pop_ready();
        if warm.is_some() {
            self.wake.notify_one();
        }
        warm
    }

    /// A worker parked under `key` by an earlier call (reuse) whose next context is made;
    /// else, while the key has room to park one more, a warm pool worker (its first call;
    /// parked afterwards, so that at a steady rate parked workers take turns); else the
    /// longest-parked worker still making its context; else a freshly made one.
    pub fn take_for(&self, key: &str) -> Result<ReadyWorker, CallError> {
        self.take_parked_or_spawn(key, true)
    }

    /// [`Pool::take_parked`], else a freshly made worker.
    fn take_parked_or_spawn(&self, key: &str, reuse: bool) -> Result<ReadyWorker, CallError> {
        match self.take_parked(key, reuse) {
            Some(w) => Ok(w),
            None => spawn_ready(&self.opts, true),
        }
    }

    /// Like [`Pool::take_for`], but only a worker already made: None rather than a fork.
    pub fn take_for_nowait(&self, key: &str) -> Option<ReadyWorker> {
        self.take_parked(key, true)
    }

    /// A ready worker parked under `key`; else one still being primed (`reuse` false); else
    /// (reuse) one still making its next context when the pool has none warm or the key is
    /// full; else a warm pool worker; None when there is none of these.
    fn take_parked(&self, key: &str, reuse: bool) -> Option<ReadyWorker> {
        let mut unfit = Vec::new();
        let parked = {
            let mut st = self.lock();
            let mut found = None;
            let pool_has_one = !st.ready.is_empty();
            if let Some(list) = st.parked.get_mut(key) {
                let mut i = list.len();
                while i > 0 {
                    i -= 1;
                    let p = &mut list[i];
                    if !p.w.is_alive() || p.since.elapsed() >= self.opts.reuse_idle {
                        unfit.push(list.remove(i).w);
                    } else if p.w.is_warm() {
                        found = Some(list.remove(i).w);
                        break;
                    } else if !p.w.is_alive() {
                        // It said something other than Ready (a prime it refused): killed.
                        unfit.push(list.remove(i).w);
                    }
                }
                // None is ready: all left are alive and still making their contexts or
                // being primed.
                let full = list.len() >= self.target.min(self.max_parked).max(1);
                if found.is_none()
                    && !list.is_empty()
                    && waits_for_parked(reuse, pool_has_one, full)
                {
                    found = Some(list.remove(0).w);
                }
                let taken = unfit.len() + usize::from(found.is_some());
                if list.is_empty() {
                    st.parked.remove(key);
                }
                st.parked_total -= taken;
            }
            found
        };
        unfit.into_iter().for_each(reap_later); // outside the lock, and off the call path
        parked.or_else(|| self.take_nowait())
    }

    /// Parks a worker that may serve another call with `key`. Beyond the bound per key it is
    /// let go (false); beyond the bound in all, the longest-parked worker is.
    pub fn park(&self, key: &str, w: ReadyWorker) -> bool {
        let pid = w.pid();
        let (let_go, first) = {
            let mut st = self.lock();
            let first = st.parked_total == 0;
            let per_key = st.parked.get(key).map_or(0, Vec::len);
            let let_go = if st.stopping || self.max_parked == 0 || per_key >= self.target.max(1) {
                Some(w)
            } else {
                let evicted = if st.parked_total >= self.max_parked {
                    st.evict_oldest()
                } else {
                    None
                };
                st.parked.entry(key.to_string()).or_default().push(Parked {
                    w,
                    since: Instant::now(),
                });
                st.parked_total += 1;
                evicted
            };
            (let_go, first)
        };
        // The refill thread keeps time for the expiry. A newly parked worker expires after
        // every other parked one, so only the first changes when the thread must wake.
        if first {
            self.wake.notify_one();
        }
        let kept = !matches!(&let_go, Some(w) if w.pid() == pid);
        if let Some(w) = let_go {
            reap_later(w); // outside the lock, and off the call path
        }
        kept
    }

    /// Workers warm and waiting right now.
    pub fn ready_count(&self) -> usize {
        self.lock().ready.len()
    }

    pub fn ready_pids(&self) -> Vec<u32> {
        self.lock().ready.iter().map(ReadyWorker::pid).collect()
    }

    /// Each template's pid and the children it has forked (see [`super::template`]).
    pub fn templates(&self) -> Vec<(u32, u32)> {
        self.templates.list()
    }

    /// How many tools' bodies the pool holds as bytecode (`stsd status`).
    pub fn bytecode_count(&self) -> usize {
        self.bodies.count()
    }

    pub fn target(&self) -> usize {
        self.target
    }

    /// Stops refilling and kills every idle worker.
    pub fn stop(&self) {
        let idle: Vec<ReadyWorker> = {
            let mut st = self.lock();
            st.stopping = true;
            let mut all: Vec<ReadyWorker> = st.ready.drain(..).collect();
            for (_, list) in st.parked.drain() {
                all.extend(list.into_iter().map(|p| p.w));
            }
            st.parked_total = 0;
            all
        };
        self.wake.notify_all();
        drop(idle);
        if let Some(h) = self.lock_refill().take() {
            let _ = h.join();
        }
        // After the refill thread: it may have been making one.
        self.templates.clear();
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.lock().stopping = true;
        self.wake.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::{waits_for_parked, Parked, State, DEATH_SWEEP};
    use crate::exec::ReadyWorker;
    use std::collections::{HashMap, VecDeque};
    use std::time::{Duration, Instant};

    /// A parked worker that died is removed by the sweep, once a [`DEATH_SWEEP`], and not by
    /// every round of the refill thread before it (each look is a `wait4` under the pool's
    /// lock, and the refill thread comes several times a call); one whose idle time is up is
    /// removed on any round.
    #[test]
    fn a_parked_worker_that_died_goes_at_the_next_sweep_and_not_at_every_round() {
        let spawn = || {
            // Reaped by the stand-in worker's handle (as a worker is), not by `Child`.
            #[allow(clippy::zombie_processes)]
            let child = std::process::Command::new("sleep")
                .arg("60")
                .spawn()
                .unwrap_or_else(|e| panic!("sleep: {e}"));
            ReadyWorker::of_child(child.id()).unwrap_or_else(|e| panic!("socket: {e}"))
        };
        let (dead, idle_one) = (spawn(), spawn());
        let dead_pid = dead.pid();
        // On an injected clock that starts an idle time from now (no instant before the
        // process's start is needed): "b" was parked then, "a" and the last sweep now.
        let t0 = Instant::now();
        let idle = Duration::from_secs(3600);
        let now = t0 + idle;
        let mut st = State {
            ready: VecDeque::new(),
            prime_wanted: HashMap::new(),
            parked: HashMap::from([
                (
                    "a".to_string(),
                    vec![Parked {
                        w: dead,
                        since: now,
                    }],
                ),
                (
                    "b".to_string(),
                    vec![Parked {
                        w: idle_one,
                        since: t0,
                    }],
                ),
            ]),
            parked_total: 2,
            stopping: false,
            swept: now,
        };
        let idle_pid = st.parked["b"][0].w.pid();
        // SAFETY: kill(2) on a child this test spawned and has not reaped.
        unsafe { libc::kill(dead_pid as i32, libc::SIGKILL) };
        // Dead (a zombie, not reaped: only the worker's own handle reaps it).
        let zombie = || {
            std::fs::read_to_string(format!("/proc/{dead_pid}/stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')
                        .map(|(_, rest)| rest.trim_start().starts_with('Z'))
                })
                .unwrap_or(false)
        };
        while !zombie() {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the kill never landed"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // Before the sweep is due: only the worker whose idle time is up goes.
        let out = st.take_expired(now + Duration::from_millis(10), idle);
        assert_eq!(
            out.iter().map(ReadyWorker::pid).collect::<Vec<_>>(),
            [idle_pid]
        );
        assert_eq!(st.parked_total, 1, "the dead one is left for the sweep");
        drop(out);
        // At the sweep: the dead one goes.
        let out = st.take_expired(now + DEATH_SWEEP, idle);
        assert_eq!(
            out.iter().map(ReadyWorker::pid).collect::<Vec<_>>(),
            [dead_pid]
        );
        assert_eq!(st.parked_total, 0);
        assert!(st.parked.is_empty());
    }

    #[test]
    fn one_shot_waits_for_a_priming_worker_and_reuse_only_when_it_must() {
        // One-shot: a primed worker still priming beats a warm pool worker.
        assert!(waits_for_parked(false, true, false));
        assert!(waits_for_parked(false, false, false));
        // Reuse: a warm pool worker while the key has room; the parked one otherwise.
        assert!(!waits_for_parked(true, true, false));
        assert!(waits_for_parked(true, true, true));
        assert!(waits_for_parked(true, false, false));
    }
}
