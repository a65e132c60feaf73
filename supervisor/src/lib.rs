//! The stsd supervisor as a library: spec store, lifecycle, and the `check` report. The `stsd`
//! binary is a thin CLI over it; integration tests in `tests/` use it directly.

pub mod check;
pub mod exec;
pub mod lifecycle;
pub mod local_pass;
pub mod store;
pub mod workspace;
