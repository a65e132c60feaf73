//! Where a call runs: its worker from the pool (parked, primed or warm), and the driver of the
//! exchange. A call whose worker is at hand and whose posture has no network is driven on the
//! runtime thread that holds the request ([`super::inline`]); any other (the pool is empty
//! and a worker must be made, or a fetch may need the broker) on a blocking thread.

use super::call::run_keeping;
use super::inline;
use super::options::ExecOptions;
use super::outcome::{CallError, CallOutcome, Event};
use super::worker::{reap_later, ReadyWorker};
use crate::exec::pool::Pool;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use stsd_protocol::frames::{Job, Prime};
use stsd_protocol::Code;

/// How a call gets its worker.
#[derive(Clone, Copy)]
pub enum Take {
    /// Reuse: a worker parked under the call's key, else a pool worker.
    Parked,
    /// One-shot with priming: a worker primed for the tool, else a pool worker; `more`: the
    /// tool's next calls want primed workers.
    Primed { more: bool },
    /// A pool worker.
    Plain,
    /// A worker made now: the call's first worker died before it got the job, and the pool's
    /// may have died with it (killed together, say).
    Fresh,
}

/// One call: the pool, the reuse bound, the key its workers are parked under, and how it gets
/// its worker.
pub struct Dispatch {
    pub pool: Arc<Pool>,
    pub reuse: u32,
    pub key: String,
    pub take: Take,
}

impl Dispatch {
    /// Runs `job` to its outcome. A reused worker that ends up kept is parked again.
    pub async fn run(
        self,
        mut job: Job,
        opts: ExecOptions,
        cancel: Arc<AtomicBool>,
        mut on_event: impl FnMut(Event<'_>) + Send + 'static,
    ) -> Result<CallOutcome, CallError> {
        let at_hand = if inline::usable(&job) {
            match self.take {
                Take::Parked => self.pool.take_for_nowait(&self.key),
                Take::Primed { more } => {
                    self.pool
                        .take_primed_nowait(&self.key, &job, more, || prime_of(&job))
                }
                Take::Plain => self.pool.take_nowait(),
                Take::Fresh => None,
            }
        } else {
            None
        };
        let Some(w) = at_hand else {
            return self
                .blocking(job, opts, cancel, on_event, None, false)
                .await;
        };
        let reused = w.served > 0;
        self.prepare(&mut job, &w);
        let (out, kept) = match inline::run_keeping(w, &job, &opts, &cancel, &mut on_event).await {
            Ok(done) => done,
            // Not registered with the runtime: the blocking driver takes it as it is.
            Err(w) => {
                return self
                    .blocking(job, opts, cancel, on_event, Some(w), false)
                    .await
            }
        };
        if let Some(take) = retry(&out, reused) {
            if let Some(w) = kept {
                reap_later(w);
            }
            // Replaced, once, by another worker.
            let again = Dispatch { take, ..self };
            return again
                .blocking(job, opts, cancel, on_event, None, true)
                .await;
        }
        if let Some(w) = kept {
            let _ = self.pool.park(&self.key, w);
        }
        Ok(out)
    }

    /// Reuse: the worker waits for another call with the same key after this one. One-shot
    /// with priming, on a worker that was not primed: the body's bytecode when the tool's
    /// primed workers made it.
    fn prepare(&self, job: &mut Job, w: &ReadyWorker) {
        job.keep_alive = w.served + 1 < self.reuse;
        job.reuse_calls = self.reuse;
        job.bytecode = match self.take {
            Take::Primed { .. } if !w.is_primed() => self.pool.bytecode_for(&self.key, job),
            _ => None,
        };
    }

    /// The call on a blocking thread: its worker taken there (it may have to be made), or
    /// `given`. `retried`: this is the call's second worker, which is not replaced again.
    async fn blocking(
        self,
        mut job: Job,
        opts: ExecOptions,
        cancel: Arc<AtomicBool>,
        mut on_event: impl FnMut(Event<'_>) + Send + 'static,
        given: Option<ReadyWorker>,
        retried: bool,
    ) -> Result<CallOutcome, CallError> {
        // The call's trace span follows it onto the blocking thread (its fetch hops are
        // children of it).
        let span = tracing::Span::current();
        let ran = tokio::task::spawn_blocking(move || {
            let _span = span.enter();
            let worker = match (given, self.take) {
                (Some(w), _) => w,
                (None, Take::Parked) => self.pool.take_for(&self.key)?,
                (None, Take::Primed { more }) => {
                    self.pool
                        .take_primed(&self.key, &job, more, || prime_of(&job))?
                }
                (None, Take::Plain) => self.pool.take()?,
                (None, Take::Fresh) => self.pool.fresh()?,
            };
            let reused = worker.served > 0;
            self.prepare(&mut job, &worker);
            let (mut out, mut kept) =
                run_keeping(worker, &job, &opts, Some(&cancel), &mut on_event);
            // Replaced, once, by another worker when none of the tool's code ran.
            let again = if retried { None } else { retry(&out, reused) };
            if let Some(take) = again {
                if let Some(w) = kept.take() {
                    reap_later(w);
                }
                let other = match take {
                    Take::Fresh => self.pool.fresh()?,
                    _ => self.pool.take()?,
                };
                self.prepare(&mut job, &other);
                (out, kept) = run_keeping(other, &job, &opts, Some(&cancel), &mut on_event);
            }
            if let Some(w) = kept {
                let _ = self.pool.park(&self.key, w);
            }
            Ok(out)
        })
        .await;
        ran.unwrap_or_else(|join| {
            Err(CallError::new(
                Code::WorkerCrashed,
                format!("call task failed: {join}"),
            ))
        })
    }
}

/// What a worker is primed with for calls of `job`'s tool: the job without its arguments, and
/// the names (never the values) of the arguments this call gave.
fn prime_of(job: &Job) -> Prime {
    Prime {
        job: job.template(),
        expect_args: job.arg_names(),
        want_bytecode: false,
    }
}

/// Whether a call goes to another worker, and how that one is taken: never when any of the
/// tool's code may have run (and the caller asks only once per call).
///
/// - The job never reached the worker (it died while parked, or while making its next
///   context or being primed, or the send failed): a worker made now, since the pool's
///   workers may have died with it. Without this, a worker killed while idle (by the OOM
///   killer, or an operator) failed the next call with WORKER_CRASHED.
/// - A reused worker refused the job before running any of it (confined to another posture,
///   which the key should prevent, or its CPU budget for all its calls spent): a pool worker.
fn retry(out: &CallOutcome, reused: bool) -> Option<Take> {
    if out.undelivered {
        tracing::warn!(
            pid = out.worker_pid,
            "a worker died before it got its job; the call goes to a new worker"
        );
        return Some(Take::Fresh);
    }
    let refused = matches!(&out.result, Err(e) if e.code == Code::SandboxUnavailable);
    (reused && refused).then_some(Take::Plain)
}
