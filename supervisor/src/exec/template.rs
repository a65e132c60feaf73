//! Templates per posture (one-shot priming, `[worker] template`). A primed pool worker is
//! forked by the zygote and then applies its tool's whole posture itself: the posture's
//! rlimits, a Landlock domain and the seccomp narrowing, every time. A template is a pool
//! worker made, once, the template of one tool's prime (`worker/src/template.rs`): it applies
//! the rlimits and Landlock, never runs tool code, and forks on request a child that adds only
//! `RLIMIT_NPROC` 0 and its seccomp narrowing, then primes itself and says Ready. The child is
//! the supervisor's own child (`CLONE_PARENT`) with a socket of its own, so from here on it is
//! an ordinary primed worker: [`ReadyWorker::template_child`].
//!
//! [`Templates`] keeps at most one per key (the tool's name and posture), for the prime it was
//! made with: a changed prime (the tool's code or variables, or its bytecode now known)
//! replaces it. It is also replaced after as many forks as a zygote is
//! (`[worker] zygote_max_forks`: children share its address-space layout), when it fails to
//! fork, and it goes after `[worker] reuse_idle_seconds` unused; the least recently used goes
//! when there are as many as the pool has workers.

use super::placement;
use super::worker::{spawn_ready, ReadyWorker};
use super::zygote::{fork_reply, poll_record, read_record};
use super::ExecOptions;
use nix::sys::socket::{send, MsgFlags};
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use stsd_profiles::baseline::SpawnMode;
use stsd_protocol::frames::{self, Prime, ToWorker};

/// How long a template may take to answer a fork request (a fork takes well under a
/// millisecond). Past it, it is taken for hung and replaced. As long as the zygote's
/// background forks get: a template forks as background work (`SCHED_IDLE`), for the refill
/// thread, and on CPUs that calls keep busy that may wait.
const FORK_TIMEOUT: Duration = Duration::from_secs(10);

/// One posture's template process.
pub struct Template {
    w: ReadyWorker,
    prime: Arc<Prime>,
    forks: u32,
    used: Instant,
}

impl Template {
    /// A worker forked for it by the zygote, made the template of `prime`. Zygote mode only:
    /// `spawn = "exec"` is chosen for a fresh address-space layout per worker, which
    /// children of one template would not have.
    pub fn start(opts: &ExecOptions, prime: Arc<Prime>) -> Result<Template, String> {
        if opts.spawner.mode() != SpawnMode::Zygote {
            return Err("templates are made only when the zygote forks workers".into());
        }
        let mut w = spawn_ready(opts, false).map_err(|e| e.message)?;
        w.make_template(&prime)?;
        // Its children inherit its CPUs, as the zygote's workers inherit the zygote's: it
        // keeps off a lone call's CPU as the zygote does.
        placement::zygote_started(w.pid());
        Ok(Template {
            w,
            prime,
            forks: 0,
            used: Instant::now(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.w.pid()
    }

    /// Whether it was made for `prime` (its children are primed with exactly that).
    pub fn is_for(&self, prime: &Arc<Prime>) -> bool {
        Arc::ptr_eq(&self.prime, prime) || *self.prime == **prime
    }

    /// One child, primed (or priming) for the template's prime.
    pub fn fork(&mut self) -> Result<ReadyWorker, String> {
        self.forks += 1;
        self.used = Instant::now();
        let away = placement::keeping_away();
        let frame = frames::encode(&ToWorker::Fork).map_err(|e| e.to_string())?;
        let socket = self.w.socket();
        send(socket.as_raw_fd(), &frame, MsgFlags::MSG_NOSIGNAL)
            .map_err(|e| format!("cannot ask the template to fork: {e}"))?;
        let until = Instant::now() + FORK_TIMEOUT;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err("the template did not answer in time".into());
            }
            if poll_record(socket, left).map_err(|e| format!("the template: {e}"))? {
                break;
            }
        }
        let (buf, n, fds) = read_record(socket).map_err(|e| format!("the template: {e}"))?;
        if n == 0 {
            return Err("the template exited".into());
        }
        let child = fork_reply(&buf[..n], fds).map_err(|e| format!("the template: {e}"))?;
        Ok(ReadyWorker::template_child(
            child,
            self.prime.clone(),
            away || placement::keeping_away(),
        ))
    }
}

impl Drop for Template {
    fn drop(&mut self) {
        // Before its handle kills and reaps it: no placement reaches its pid after.
        placement::zygote_gone(self.w.pid());
    }
}

/// The pool's templates, by key.
pub struct Templates {
    by_key: Mutex<HashMap<String, Template>>,
    /// Templates kept at most (the pool's size).
    max: usize,
    /// Forks a template makes before it is replaced.
    max_forks: u32,
}

impl Templates {
    pub fn new(max: usize, max_forks: u32) -> Templates {
        Templates {
            by_key: Mutex::new(HashMap::new()),
            max: max.max(1),
            max_forks: max_forks.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Template>> {
        // A panic while holding the lock leaves plain data behind; keep serving.
        self.by_key.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A child of `key`'s template for `prime`, made (or replaced) first when need be. A
    /// template that cannot fork is let go (the next call makes another). The lock is not
    /// held while a template starts or forks, nor while one is killed and reaped.
    pub fn fork(
        &self,
        key: &str,
        prime: &Arc<Prime>,
        opts: &ExecOptions,
    ) -> Result<ReadyWorker, String> {
        let (fit, gone) = {
            let mut map = self.lock();
            let (fit, mut gone) = match map.remove(key) {
                Some(t) if t.is_for(prime) && t.forks < self.max_forks => (Some(t), Vec::new()),
                other => (None, other.into_iter().collect::<Vec<Template>>()),
            };
            if fit.is_none() && map.len() >= self.max {
                let oldest = map
                    .iter()
                    .min_by_key(|(_, t)| t.used)
                    .map(|(k, _)| k.clone());
                gone.extend(oldest.and_then(|k| map.remove(&k)));
            }
            (fit, gone)
        };
        drop(gone);
        let mut t = match fit {
            Some(t) => t,
            None => {
                let t = Template::start(opts, prime.clone())?;
                tracing::debug!(pid = t.pid(), "template made");
                t
            }
        };
        let child = t.fork()?;
        // Back in the map (only the refill thread forks, so no other was made meanwhile;
        // were one, it would be let go).
        let replaced = self.lock().insert(key.to_string(), t);
        drop(replaced);
        Ok(child)
    }

    /// Takes the templates unused for `idle` or longer, for the caller to let go of (killed
    /// and reaped as they are dropped).
    pub fn take_expired(&self, now: Instant, idle: Duration) -> Vec<Template> {
        let mut map = self.lock();
        let keys: Vec<String> = map
            .iter()
            .filter(|(_, t)| now.saturating_duration_since(t.used) >= idle)
            .map(|(k, _)| k.clone())
            .collect();
        keys.iter().filter_map(|k| map.remove(k)).collect()
    }

    /// How long until the least recently used template expires (None: there is none).
    pub fn next_expiry(&self, now: Instant, idle: Duration) -> Option<Duration> {
        self.lock()
            .values()
            .map(|t| (t.used + idle).saturating_duration_since(now))
            .min()
    }

    /// Each template's pid and the children it has forked (`stsd status`), by pid.
    pub fn list(&self) -> Vec<(u32, u32)> {
        let mut v: Vec<(u32, u32)> = self.lock().values().map(|t| (t.pid(), t.forks)).collect();
        v.sort_unstable();
        v
    }

    /// Lets go of every template.
    pub fn clear(&self) {
        let all: Vec<Template> = self.lock().drain().map(|(_, t)| t).collect();
        drop(all);
    }
}
