//! What a transport hands admin requests to (a leaf: the sessions and the daemon share it).

use std::future::Future;
use std::pin::Pin;

/// What an admin request comes to: its result, or a JSON-RPC error code and message.
pub type AdminReply<'a> =
    Pin<Box<dyn Future<Output = Result<serde_json::Value, (i32, String)>> + Send + 'a>>;

/// The admin channel's handler (JSON-RPC methods `stsd/...` on the daemon's socket, or
/// `POST /admin` over HTTP): the transport hands it who is asking (a peer uid, or an HTTP
/// principal with its rights), the method and the params, and writes back what it answers.
/// Ok is the result; Err a JSON-RPC error code and message.
pub trait AdminHandler: Send + Sync {
    fn handle(
        &self,
        who: crate::call::Subject,
        method: String,
        params: serde_json::Value,
    ) -> AdminReply<'_>;
}
