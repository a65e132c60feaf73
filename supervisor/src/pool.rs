//! The worker pool: N workers exec'd and waiting (they reported Ready) before any call arrives.
//! A call takes one; a refill thread replaces it off the request path. When the pool is
//! empty (a burst), the call spawns its own worker rather than wait.

use crate::exec::{spawn_ready, CallError, ExecOptions, ReadyWorker};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

struct State {
    ready: VecDeque<ReadyWorker>,
    /// Reuse: workers that served a call and wait for another of the same tool (they are
    /// already confined to its posture). Bounded per tool by the pool size.
    parked: HashMap<String, Vec<ReadyWorker>>,
    stopping: bool,
}

pub struct Pool {
    opts: ExecOptions,
    target: usize,
    state: Mutex<State>,
    wake: Condvar,
    refill: Mutex<Option<JoinHandle<()>>>,
}

impl Pool {
    /// Starts the pool and its refill thread; returns at once (warming happens behind).
    pub fn start(opts: ExecOptions, target: usize) -> Arc<Pool> {
        let pool = Arc::new(Pool {
            opts,
            target,
            state: Mutex::new(State {
                ready: VecDeque::with_capacity(target),
                parked: HashMap::new(),
                stopping: false,
            }),
            wake: Condvar::new(),
            refill: Mutex::new(None),
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

    fn refill_loop(&self) {
        loop {
            {
                let mut st = self.lock();
                while !st.stopping && st.ready.len() >= self.target {
                    st = self.wake.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                if st.stopping {
                    return;
                }
            }
            match spawn_ready(&self.opts) {
                Ok(w) => {
                    let mut st = self.lock();
                    if st.stopping {
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

    /// A ready worker: a warm one when there is one, else a freshly spawned one.
    pub fn take(&self) -> Result<ReadyWorker, CallError> {
        let warm = {
            let mut st = self.lock();
            let mut found = None;
            while let Some(mut w) = st.ready.pop_front() {
                if w.is_alive() {
                    found = Some(w);
                    break;
                }
                // Died while idle (killed from outside): dropped, and replaced below.
            }
            found
        };
        self.wake.notify_one();
        match warm {
            Some(w) => Ok(w),
            None => spawn_ready(&self.opts),
        }
    }

    /// A worker parked by an earlier call of `key` (reuse), else [`Pool::take`].
    pub fn take_for(&self, key: &str) -> Result<ReadyWorker, CallError> {
        let parked = {
            let mut st = self.lock();
            let mut found = None;
            if let Some(list) = st.parked.get_mut(key) {
                while let Some(mut w) = list.pop() {
                    if w.is_alive() {
                        found = Some(w);
                        break;
                    }
                }
            }
            found
        };
        match parked {
            Some(w) => Ok(w),
            None => self.take(),
        }
    }

    /// Parks a worker that may serve another call of `key`; beyond the bound it is let go.
    pub fn park(&self, key: &str, w: ReadyWorker) {
        let mut st = self.lock();
        if st.stopping {
            return;
        }
        let list = st.parked.entry(key.to_string()).or_default();
        if list.len() < self.target.max(1) {
            list.push(w);
        }
    }

    /// Workers warm and waiting right now.
    pub fn ready_count(&self) -> usize {
        self.lock().ready.len()
    }

    pub fn ready_pids(&self) -> Vec<u32> {
        self.lock().ready.iter().map(ReadyWorker::pid).collect()
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
                all.extend(list);
            }
            all
        };
        self.wake.notify_all();
        drop(idle);
        if let Some(h) = self.lock_refill().take() {
            let _ = h.join();
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.lock().stopping = true;
        self.wake.notify_all();
    }
}
