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
/// The TLS client config of every outbound connection: the bundled roots and `[egress]
/// extra_ca_files` (upstreams' HTTP connections use it too).
pub use tls::client_config as tls_client_config;
