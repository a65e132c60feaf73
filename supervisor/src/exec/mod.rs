//! Running calls: building a job from a spec and arguments, and executing it in a worker.

pub mod call;
pub mod job;
pub mod spawn;

pub use call::{run_job, CallError, CallOutcome, CallValue, Event, ExecOptions};
