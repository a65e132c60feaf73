//! Running calls: building a job from a spec and arguments, and executing it in a worker.

pub mod bodies;
pub mod call;
pub mod dispatch;
mod exchange;
pub mod inline;
pub mod job;
pub mod options;
pub mod outcome;
pub mod placement;
pub mod pool;
pub mod spawn;
pub mod spawner;
pub mod template;
pub mod worker;
pub mod zygote;

pub use call::{run_job, run_keeping, run_on};
pub use options::ExecOptions;
pub use outcome::{CallError, CallOutcome, CallTimings, CallValue, Event};
pub use worker::{reap_later, spawn_ready, ReadyWorker};
