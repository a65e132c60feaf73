//! Open connections, bounded in total and per uid. When a bound is reached, a new client does
//! not wait behind sessions that do nothing: the one idle the longest (a connection that never
//! sent a message first, then an initialized session with no request in flight) is closed to
//! make room. Only when every session is busy is the new client refused, with a reason.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio_util::sync::CancellationToken;

/// What the registry knows of a session's activity; the session's transport keeps it current.
#[derive(Debug)]
pub struct Activity {
    epoch: Instant,
    last_ms: AtomicU64,
    pending: AtomicUsize,
    spoke: AtomicBool,
}

impl Activity {
    fn new(epoch: Instant) -> Activity {
        Activity {
            epoch,
            last_ms: AtomicU64::new(epoch.elapsed().as_millis() as u64),
            pending: AtomicUsize::new(0),
            spoke: AtomicBool::new(false),
        }
    }

    /// A message arrived or left; `pending` requests are unanswered.
    pub fn touch(&self, pending: usize, spoke: bool) {
        self.last_ms
            .store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
        self.pending.store(pending, Ordering::Relaxed);
        if spoke {
            self.spoke.store(true, Ordering::Relaxed);
        }
    }

    /// Eviction order: silent connections first, then the longest idle; None when busy.
    fn idle_rank(&self) -> Option<(bool, u64)> {
        if self.pending.load(Ordering::Relaxed) > 0 {
            return None;
        }
        Some((
            self.spoke.load(Ordering::Relaxed),
            self.last_ms.load(Ordering::Relaxed),
        ))
    }
}

struct Entry {
    uid: u32,
    activity: Arc<Activity>,
    closed: CancellationToken,
}

pub struct Registry {
    max_total: usize,
    max_per_uid: usize,
    epoch: Instant,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    next: u64,
    conns: HashMap<u64, Entry>,
}

/// A place in the registry, held for as long as the connection lives.
pub struct Ticket {
    id: u64,
    registry: Arc<Registry>,
    pub activity: Arc<Activity>,
    /// Cancelled when the session is evicted (or ends for any other reason).
    pub closed: CancellationToken,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.registry.lock().conns.remove(&self.id);
    }
}

impl Registry {
    pub fn new(max_total: usize, max_per_uid: usize) -> Arc<Registry> {
        Arc::new(Registry {
            max_total: max_total.max(1),
            max_per_uid: max_per_uid.max(1),
            epoch: Instant::now(),
            inner: Mutex::new(Inner::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Open connections.
    pub fn len(&self) -> usize {
        self.lock().conns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A place for a new connection of `uid`, making room by closing an idle session when a
    /// bound is reached; Err says which bound when every candidate is busy.
    pub fn admit(self: &Arc<Self>, uid: u32) -> Result<Ticket, String> {
        let mut inner = self.lock();
        let of_uid = inner.conns.values().filter(|e| e.uid == uid).count();
        if of_uid >= self.max_per_uid {
            if !evict(&mut inner, Some(uid)) {
                return Err(format!(
                    "uid {uid} already has {of_uid} connections, all busy \
                     (limit [daemon] max_connections_per_uid = {})",
                    self.max_per_uid
                ));
            }
        } else if inner.conns.len() >= self.max_total && !evict(&mut inner, None) {
            return Err(format!(
                "{} connections are open, all busy (limit [daemon] max_connections = {})",
                inner.conns.len(),
                self.max_total
            ));
        }
        inner.next += 1;
        let id = inner.next;
        let activity = Arc::new(Activity::new(self.epoch));
        let closed = CancellationToken::new();
        inner.conns.insert(
            id,
            Entry {
                uid,
                activity: activity.clone(),
                closed: closed.clone(),
            },
        );
        Ok(Ticket {
            id,
            registry: self.clone(),
            activity,
            closed,
        })
    }

    /// Closes the longest-idle session (used when the process is out of descriptors).
    pub fn evict_one(&self) -> bool {
        evict(&mut self.lock(), None)
    }
}

/// Closes the best eviction candidate (of `uid`, or of anyone); false when all are busy.
fn evict(inner: &mut Inner, uid: Option<u32>) -> bool {
    let victim = inner
        .conns
        .iter()
        .filter(|(_, e)| uid.is_none_or(|u| e.uid == u))
        .filter_map(|(id, e)| e.activity.idle_rank().map(|r| (r, *id)))
        .min()
        .map(|(_, id)| id);
    match victim.and_then(|id| inner.conns.remove(&id)) {
        Some(e) => {
            tracing::info!(
                uid = e.uid,
                "closing an idle session to make room for a new connection"
            );
            e.closed.cancel();
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_uid_evicts_its_silent_connection_first_and_refuses_when_all_are_busy() {
        let r = Registry::new(100, 2);
        let a = r.admit(1).unwrap_or_else(|e| panic!("{e}"));
        let b = r.admit(1).unwrap_or_else(|e| panic!("{e}"));
        a.activity.touch(0, true); // a has spoken; b never has
        let c = r.admit(1).unwrap_or_else(|e| panic!("{e}"));
        assert!(b.closed.is_cancelled() && !a.closed.is_cancelled());
        // Another uid is not affected by uid 1's bound.
        let _other = r.admit(2).unwrap_or_else(|e| panic!("{e}"));
        a.activity.touch(1, true);
        c.activity.touch(3, true);
        let refused = r.admit(1).err().unwrap_or_default();
        assert!(refused.contains("max_connections_per_uid"), "{refused}");
        drop(b);
        assert_eq!(r.len(), 3);
    }

    #[test]
    fn the_total_bound_evicts_the_longest_idle_of_anyone() {
        let r = Registry::new(2, 10);
        let a = r.admit(1).unwrap_or_else(|e| panic!("{e}"));
        a.activity.touch(0, true);
        std::thread::sleep(std::time::Duration::from_millis(5));
        let b = r.admit(2).unwrap_or_else(|e| panic!("{e}"));
        b.activity.touch(0, true);
        let _c = r.admit(3).unwrap_or_else(|e| panic!("{e}"));
        assert!(a.closed.is_cancelled() && !b.closed.is_cancelled());
    }
}
