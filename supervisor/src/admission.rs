//! Admission: how many tool calls run at once (one per pool slot), how many may wait, and in
//! what order waiting calls get a slot. Each session has its own queue and its own bound on
//! calls admitted at once; a freed slot goes to the next session in round-robin order, so one
//! client's burst waits behind itself, not in front of everyone else.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};
use tokio::sync::oneshot;

/// Why a call was not admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    ShuttingDown,
    /// The session already has this many calls running or waiting.
    SessionFull(usize),
    /// This many calls wait already, across all sessions.
    QueueFull(usize),
}

impl Refused {
    pub fn message(&self) -> String {
        match self {
            Refused::ShuttingDown => "the daemon is shutting down".into(),
            Refused::SessionFull(n) => format!(
                "this session already has {n} calls running or waiting \
                 (limit [daemon] max_calls_per_session); try again when one finishes"
            ),
            Refused::QueueFull(n) => format!(
                "every worker is busy and {n} calls are waiting (limit [daemon] queue_limit); \
                 try again later"
            ),
        }
    }
}

#[derive(Default)]
struct SessionQueue {
    /// Calls of this session running or waiting.
    admitted: usize,
    waiters: VecDeque<(u64, oneshot::Sender<()>)>,
}

struct State {
    free: usize,
    closed: bool,
    waiting: usize,
    next_ticket: u64,
    sessions: HashMap<u64, SessionQueue>,
    /// Sessions with waiters, in the order they are served.
    turn: VecDeque<u64>,
}

pub struct Admission {
    state: Mutex<State>,
    max_waiting: usize,
    max_per_session: usize,
}

/// A running slot, given back when dropped.
pub struct Permit<'a> {
    adm: &'a Admission,
    session: u64,
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        let mut st = self.adm.lock();
        release(&mut st, self.session);
    }
}

/// A call waiting for a slot; if it is dropped before it gets one (the caller went away),
/// it leaves the queue, and a slot handed to it in the meantime is passed on.
struct Waiter<'a> {
    adm: &'a Admission,
    session: u64,
    ticket: u64,
    granted: bool,
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        if self.granted {
            return;
        }
        let mut st = self.adm.lock();
        let q = st.sessions.entry(self.session).or_default();
        if let Some(pos) = q.waiters.iter().position(|(t, _)| *t == self.ticket) {
            q.waiters.remove(pos);
            q.admitted = q.admitted.saturating_sub(1);
            st.waiting = st.waiting.saturating_sub(1);
            forget_if_empty(&mut st, self.session);
        } else {
            // Granted just before the caller left: the slot is ours to pass on.
            release(&mut st, self.session);
        }
    }
}

fn forget_if_empty(st: &mut State, session: u64) {
    if st
        .sessions
        .get(&session)
        .is_some_and(|q| q.admitted == 0 && q.waiters.is_empty())
    {
        st.sessions.remove(&session);
    }
}

/// A call of `session` ended: its slot goes to the next session's first waiter, or back.
fn release(st: &mut State, session: u64) {
    if let Some(q) = st.sessions.get_mut(&session) {
        q.admitted = q.admitted.saturating_sub(1);
    }
    forget_if_empty(st, session);
    while let Some(next) = st.turn.pop_front() {
        let Some(q) = st.sessions.get_mut(&next) else {
            continue;
        };
        let Some((_, tx)) = q.waiters.pop_front() else {
            continue;
        };
        let more = !q.waiters.is_empty();
        st.waiting = st.waiting.saturating_sub(1);
        if more {
            st.turn.push_back(next);
        }
        if tx.send(()).is_ok() {
            return;
        }
        // The waiter is gone without having left the queue (cannot happen: it leaves under
        // the lock first); count it out and try the next.
        if let Some(q) = st.sessions.get_mut(&next) {
            q.admitted = q.admitted.saturating_sub(1);
        }
        forget_if_empty(st, next);
    }
    if !st.closed {
        st.free += 1;
    }
}

impl Admission {
    pub fn new(slots: usize, max_waiting: usize, max_per_session: usize) -> Admission {
        Admission {
            state: Mutex::new(State {
                free: slots.max(1),
                closed: false,
                waiting: 0,
                next_ticket: 0,
                sessions: HashMap::new(),
                turn: VecDeque::new(),
            }),
            max_waiting,
            max_per_session: max_per_session.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A running slot for a call of `session`, after waiting its turn if every slot is busy.
    pub async fn acquire(&self, session: u64) -> Result<Permit<'_>, Refused> {
        let (ticket, rx) = {
            let mut guard = self.lock();
            let st = &mut *guard;
            if st.closed {
                return Err(Refused::ShuttingDown);
            }
            let q = st.sessions.entry(session).or_default();
            if q.admitted >= self.max_per_session {
                return Err(Refused::SessionFull(q.admitted));
            }
            if st.free > 0 && st.waiting == 0 {
                st.free -= 1;
                q.admitted += 1;
                return Ok(Permit { adm: self, session });
            }
            if st.waiting >= self.max_waiting {
                let n = st.waiting;
                forget_if_empty(st, session);
                return Err(Refused::QueueFull(n));
            }
            st.next_ticket += 1;
            let ticket = st.next_ticket;
            let (tx, rx) = oneshot::channel();
            q.admitted += 1;
            q.waiters.push_back((ticket, tx));
            let first = q.waiters.len() == 1;
            st.waiting += 1;
            if first {
                st.turn.push_back(session);
            }
            (ticket, rx)
        };
        let mut waiter = Waiter {
            adm: self,
            session,
            ticket,
            granted: false,
        };
        match rx.await {
            Ok(()) => {
                waiter.granted = true;
                Ok(Permit { adm: self, session })
            }
            Err(_) => {
                waiter.granted = true; // closed: the queue entry is already gone
                Err(Refused::ShuttingDown)
            }
        }
    }

    /// Calls waiting for a slot.
    pub fn waiting(&self) -> usize {
        self.lock().waiting
    }

    /// Refuses new calls and wakes every waiter with a refusal.
    pub fn close(&self) {
        let mut st = self.lock();
        st.closed = true;
        st.free = 0;
        st.turn.clear();
        st.waiting = 0;
        for q in st.sessions.values_mut() {
            let n = q.waiters.len();
            q.waiters.clear();
            q.admitted = q.admitted.saturating_sub(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_freed_slot_goes_round_robin_across_sessions() {
        rt().block_on(async {
            let adm = Arc::new(Admission::new(1, 100, 100));
            let first = adm.acquire(1).await.unwrap_or_else(|e| panic!("{e:?}"));
            let order = Arc::new(Mutex::new(Vec::new()));
            let mut tasks = Vec::new();
            // Session 1 queues five calls, then session 2 queues one.
            for (i, s) in [1u64, 1, 1, 1, 1, 2].into_iter().enumerate() {
                let (adm, order) = (adm.clone(), order.clone());
                tasks.push(tokio::spawn(async move {
                    let _p = adm.acquire(s).await.unwrap_or_else(|e| panic!("{e:?}"));
                    order.lock().unwrap_or_else(|e| e.into_inner()).push((i, s));
                    tokio::task::yield_now().await;
                }));
                tokio::task::yield_now().await;
            }
            assert_eq!(adm.waiting(), 6);
            drop(first);
            for t in tasks {
                let _ = t.await;
            }
            let order = order.lock().unwrap_or_else(|e| e.into_inner()).clone();
            // Session 2's one call runs second, not sixth.
            assert_eq!(order[1], (5, 2), "{order:?}");
            assert_eq!(adm.waiting(), 0);
        });
    }

    #[test]
    fn per_session_and_global_bounds_refuse_and_a_departed_waiter_frees_its_place() {
        rt().block_on(async {
            let adm = Admission::new(1, 2, 2);
            let p = adm.acquire(1).await.unwrap_or_else(|e| panic!("{e:?}"));
            {
                let fut = adm.acquire(1);
                tokio::pin!(fut);
                assert!(futures_poll_once(fut.as_mut()).await.is_none());
                assert_eq!(adm.waiting(), 1);
                assert_eq!(adm.acquire(1).await.err(), Some(Refused::SessionFull(2)));
            } // the waiting call goes away
            assert_eq!(adm.waiting(), 0);
            let f2 = adm.acquire(2);
            let f3 = adm.acquire(3);
            tokio::pin!(f2, f3);
            assert!(futures_poll_once(f2.as_mut()).await.is_none());
            assert!(futures_poll_once(f3.as_mut()).await.is_none());
            assert_eq!(adm.acquire(4).await.err(), Some(Refused::QueueFull(2)));
            drop(p);
            assert!(f2.await.is_ok());
        });
    }

    /// Polls a future once: Some(output) if it was ready.
    async fn futures_poll_once<F: std::future::Future + Unpin>(f: F) -> Option<F::Output> {
        let mut f = f;
        std::future::poll_fn(|cx| {
            std::task::Poll::Ready(match std::pin::Pin::new(&mut f).poll(cx) {
                std::task::Poll::Ready(v) => Some(v),
                std::task::Poll::Pending => None,
            })
        })
        .await
    }
}
