//! Running calls: building a job from a spec and arguments, and executing it in a worker.

pub mod call;
pub mod dispatch;
mod exchange;
pub mod inline;
pub mod job;
pub mod placement;
pub mod spawn;
pub mod zygote;

pub use call::{
    reap_later, run_job, run_keeping, run_on, spawn_ready, CallError, CallOutcome, CallValue,
    Event, ExecOptions, ReadyWorker,
};
