//! The operator strategy's queue: calls wait here until an operator answers over the admin
//! channel (`stsd approve ID`, `stsd deny ID --reason TEXT`), the wait times out, or the
//! caller goes away. Bounded: past `max_pending` a call fails closed.

use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;
use tokio::sync::oneshot;

/// An operator's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub approved: bool,
    pub reason: String,
    /// "uid N" or "principal NAME".
    pub by: String,
}

/// A waiting call as `stsd approvals` shows it (arguments masked).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingView {
    pub id: u64,
    pub tool: String,
    pub arguments: Value,
    pub prompt: String,
    pub peer_uid: Option<u32>,
    /// The HTTP principal making the call, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
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
    pub rx: oneshot::Receiver<Answer>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.queue.lock().remove(&self.id);
        if let Some(j) = self.queue.journal.get() {
            if let Err(e) = j.store.waiting_del(&j.instance, self.id as i64) {
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
    pub fn enter(&self, view: PendingView) -> Result<Waiting<'_>, String> {
        if let Some(j) = self.journal.get() {
            let text = serde_json::to_string(&view).map_err(|e| e.to_string())?;
            j.store
                .waiting_put(&j.instance, view.id as i64, &text)
                .map_err(|e| format!("the waiting call cannot be recorded: {e}"))?;
        }
        let mut q = self.lock();
        if q.len() >= self.max {
            return Err(format!(
                "{} calls already wait for an operator (limit [approval] max_pending)",
                q.len()
            ));
        }
        let (tx, rx) = oneshot::channel();
        let id = view.id;
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
            rx,
        })
    }

    pub fn list(&self) -> Vec<PendingView> {
        self.lock()
            .values()
            .map(|e| PendingView {
                age_ms: e.since.elapsed().as_millis() as u64,
                ..e.view.clone()
            })
            .collect()
    }

    /// Delivers an operator's answer to call `id`.
    pub fn answer(&self, id: u64, answer: Answer) -> Result<(), String> {
        let entry = self
            .lock()
            .remove(&id)
            .ok_or_else(|| format!("no call {id} is waiting for approval"))?;
        entry
            .tx
            .send(answer)
            .map_err(|_| format!("call {id} stopped waiting before the answer arrived"))
    }
}
