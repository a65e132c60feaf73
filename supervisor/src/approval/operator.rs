//! The operator strategy's queue: calls wait here until an operator answers over the admin
//! channel (`stsd approve ID`, `stsd deny ID --reason TEXT`), the wait times out, or the
//! caller goes away. Bounded: past `max_pending` a call fails closed.
//!
//! With a state store each waiting call is kept there too. On a shared store (replicas) the
//! id an operator answers is the store's ticket, unique across the replicas; `stsd approvals`
//! on any replica lists every replica's waiting calls, and a decision made on one that does
//! not hold the call is written to the store, which tells the one that does.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;
use tokio::sync::oneshot;

/// An operator's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    pub approved: bool,
    pub reason: String,
    /// "uid N" or "principal NAME".
    pub by: String,
}

/// A waiting call as `stsd approvals` shows it (arguments masked).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingView {
    /// The id to answer (`stsd approve ID`).
    pub id: u64,
    /// The call's id in the daemon holding it (its audit record's `callId`).
    pub call_id: u64,
    pub tool: String,
    pub arguments: Value,
    pub prompt: String,
    pub peer_uid: Option<u32>,
    /// The HTTP principal making the call, if any.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub principal: Option<String>,
    /// How it authenticated: "token", "certificate" or "oauth".
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub principal_kind: Option<String>,
    pub age_ms: u64,
}

struct Entry {
    view: PendingView,
    since: Instant,
    tx: oneshot::Sender<Answer>,
}

pub struct Queue {
    max: usize,
    inner: Mutex<BTreeMap<u64, Entry>>,
    /// The state store keeps each waiting call (as `stsd approvals` shows it) until it leaves,
    /// so a daemon that dies leaves a trace the next start records as expired.
    journal: std::sync::OnceLock<Journal>,
}

/// Where waiting calls are kept: the store, under this daemon's instance.
pub struct Journal {
    pub store: std::sync::Arc<crate::state::Store>,
    pub instance: String,
}

/// A place in the queue; leaving it (answered, timed out, caller gone) removes the entry.
pub struct Waiting<'a> {
    queue: &'a Queue,
    id: u64,
    call_id: u64,
    pub rx: oneshot::Receiver<Answer>,
}

impl Waiting<'_> {
    /// The id an operator answers.
    pub fn id(&self) -> u64 {
        self.id
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.queue.lock().remove(&self.id);
        if let Some(j) = self.queue.journal.get() {
            if let Err(e) = j.store.waiting_del(&j.instance, self.call_id as i64) {
                tracing::warn!(id = self.id, error = %e, "a call that stopped waiting is still in the state store");
            }
        }
    }
}

impl Queue {
    pub fn new(max: usize) -> Queue {
        Queue {
            max: max.max(1),
            inner: Mutex::new(BTreeMap::new()),
            journal: std::sync::OnceLock::new(),
        }
    }

    /// Keeps waiting calls in the store from now on (set once, at start).
    pub fn keep_in(&self, journal: Journal) {
        let _ = self.journal.set(journal);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Entry>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Enqueues a call; Err when the queue is full, or the store cannot keep it (a waiting
    /// call is never left unrecorded).
    pub fn enter(&self, mut view: PendingView) -> Result<Waiting<'_>, String> {
        let full = |n: usize| {
            format!("{n} calls already wait for an operator (limit [approval] max_pending)")
        };
        let n = self.lock().len();
        if n >= self.max {
            return Err(full(n));
        }
        let call_id = view.call_id;
        if let Some(j) = self.journal.get() {
            let text = serde_json::to_string(&view).map_err(|e| e.to_string())?;
            let ticket = j
                .store
                .waiting_put(&j.instance, call_id as i64, &text)
                .map_err(|e| format!("the waiting call cannot be recorded: {e}"))?;
            view.id = ticket as u64;
        }
        let (tx, rx) = oneshot::channel();
        let id = view.id;
        let mut q = self.lock();
        if q.len() >= self.max {
            let n = q.len();
            drop(q);
            if let Some(j) = self.journal.get() {
                let _ = j.store.waiting_del(&j.instance, call_id as i64);
            }
            return Err(full(n));
        }
        q.insert(
            id,
            Entry {
                view,
                since: Instant::now(),
                tx,
            },
        );
        Ok(Waiting {
            queue: self,
            id,
            call_id,
            rx,
        })
    }

    /// The shared store, when replicas share one (else the queue is this daemon's alone).
    fn shared(&self) -> Option<&Journal> {
        self.journal.get().filter(|j| j.store.shared())
    }

    /// The calls waiting for an operator: on a shared store, every replica's.
    pub fn list(&self) -> Vec<PendingView> {
        if let Some(j) = self.shared() {
            match j.store.waiting_list() {
                Ok(rows) => {
                    let now = crate::store::now_ms();
                    return rows
                        .into_iter()
                        .filter_map(|w| {
                            let v: PendingView = serde_json::from_str(&w.view).ok()?;
                            Some(PendingView {
                                id: w.ticket as u64,
                                age_ms: (now - w.since_ms).max(0) as u64,
                                ..v
                            })
                        })
                        .collect();
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the replicas' waiting calls cannot be read: listing this one's")
                }
            }
        }
        self.lock()
            .values()
            .map(|e| PendingView {
                age_ms: e.since.elapsed().as_millis() as u64,
                ..e.view.clone()
            })
            .collect()
    }

    /// Delivers an operator's answer to call `id`: here if it waits here, else (a shared
    /// store) through the store to the replica holding it.
    pub fn answer(&self, id: u64, answer: Answer) -> Result<(), String> {
        let entry = self.lock().remove(&id);
        match entry {
            Some(entry) => entry
                .tx
                .send(answer)
                .map_err(|_| format!("call {id} stopped waiting before the answer arrived")),
            None => {
                let missing = || format!("no call {id} is waiting for approval");
                let Some(j) = self.shared() else {
                    return Err(missing());
                };
                let text = serde_json::to_string(&answer).map_err(|e| e.to_string())?;
                match j.store.waiting_decide(id as i64, &text)? {
                    true => Ok(()),
                    false => Err(missing()),
                }
            }
        }
    }

    /// Takes in the decisions other replicas wrote for calls waiting here.
    pub fn collect(&self) {
        let Some(j) = self.shared() else {
            return;
        };
        if self.lock().is_empty() {
            return;
        }
        let decided = match j.store.waiting_decided(&j.instance) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "another replica's approval decisions cannot be read");
                return;
            }
        };
        for (ticket, text) in decided {
            let Ok(answer) = serde_json::from_str::<Answer>(&text) else {
                tracing::warn!(ticket, "an approval decision in the store does not parse");
                continue;
            };
            if let Some(entry) = self.lock().remove(&(ticket as u64)) {
                let _ = entry.tx.send(answer);
            }
        }
    }

    /// This daemon is alive; the waiting calls of replicas gone for `stale_ms` are returned
    /// (taken out of the store) for their records.
    pub fn heartbeat(&self, stale_ms: i64) -> Vec<crate::state::Waiting> {
        let Some(j) = self.shared() else {
            return Vec::new();
        };
        j.store.seen(&j.instance, stale_ms).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "the replica heartbeat did not reach the state store");
            Vec::new()
        })
    }
}
