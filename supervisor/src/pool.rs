//! The worker pool: N workers exec'd and waiting (they reported Ready) before any call arrives.
//! A call takes one; a refill thread replaces it off the request path. When the pool is
//! empty (a burst), the call spawns its own worker rather than wait.

use crate::exec::{spawn_ready, CallError, ReadyWorker};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

struct State {
    ready: VecDeque<ReadyWorker>,
    stopping: bool,
}

pub struct Pool {
    exe: PathBuf,
    target: usize,
    state: Mutex<State>,
    wake: Condvar,
    refill: Mutex<Option<JoinHandle<()>>>,
}

impl Pool {
    /// Starts the pool and its refill thread; returns at once (warming happens behind).
    pub fn start(exe: PathBuf, target: usize) -> Arc<Pool> {
        let pool = Arc::new(Pool {
            exe,
            target,
            state: Mutex::new(State {
                ready: VecDeque::with_capacity(target),
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
            match spawn_ready(&self.exe) {
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
            None => spawn_ready(&self.exe),
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
            st.ready.drain(..).collect()
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
