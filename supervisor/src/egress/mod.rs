//! Network egress for `fetch`: the worker never holds a socket; the supervisor's broker makes
//! every request, under the guard, to addresses it checked itself.

pub mod broker;
mod conn;
pub mod dns;
pub mod guard;
pub mod secrets;
mod tls;

pub use broker::{Broker, Failure, HopRecord, Policy, Request, Response};
pub use conn::Abort;
