//! The admin channel: JSON-RPC methods named `stsd/...` on the daemon's own socket, beside MCP.
//! Every method checks the caller's uid (SO_PEERCRED, from the transport): reading needs
//! `[daemon] admin_uids` (default: the daemon's own uid and root) or `[approval]
//! operator_uids`; answering an approval needs `operator_uids`. The CLI verbs that talk to a
//! running daemon (`stsd approvals`, `stsd approve`, `stsd deny`) are thin clients of it
//! ([`client`]).
//!
//! | method | params | result |
//! |---|---|---|
//! | `stsd/approvals/list` | none | `{"pending": [{id, tool, arguments, prompt, peerUid, ageMs}]}` |
//! | `stsd/approvals/decide` | `{id, approve: bool, reason?}` | `{"id": id, "approved": bool}` |

pub mod client;

use crate::service::Service;
use crate::transport::{AdminHandler, AdminReply};
use serde_json::{json, Value};
use std::sync::Arc;

/// JSON-RPC error codes of the admin channel.
pub const NOT_ALLOWED: i32 = -32001;
pub const NO_SUCH: i32 = -32002;

pub struct Admin {
    service: Arc<Service>,
    admin_uids: Vec<u32>,
}

impl Admin {
    pub fn new(service: Arc<Service>) -> Arc<Admin> {
        let own = nix::unistd::Uid::effective().as_raw();
        let mut admin_uids = service.config.daemon.admin_uids.clone();
        if admin_uids.is_empty() {
            admin_uids = vec![own, 0];
        }
        Arc::new(Admin {
            service,
            admin_uids,
        })
    }

    fn may_read(&self, uid: u32) -> bool {
        self.admin_uids.contains(&uid) || self.service.gate.config().operator_uids.contains(&uid)
    }

    fn call(&self, uid: u32, method: &str, params: &Value) -> Result<Value, (i32, String)> {
        match method {
            "stsd/approvals/list" => {
                if !self.may_read(uid) {
                    return Err((NOT_ALLOWED, format!("uid {uid} may not list approvals")));
                }
                Ok(json!({"pending": self.service.gate.pending()}))
            }
            "stsd/approvals/decide" => {
                let id = params.get("id").and_then(Value::as_u64).ok_or((
                    -32602,
                    "params: {\"id\": <number>, \"approve\": <bool>, \"reason\": <string>}".into(),
                ))?;
                let approve = params.get("approve").and_then(Value::as_bool).ok_or((
                    -32602,
                    "params: \"approve\" must be true or false".to_string(),
                ))?;
                let reason = params
                    .get("reason")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .chars()
                    .take(1024)
                    .collect::<String>();
                let reason = if reason.is_empty() && !approve {
                    "denied by the operator".to_string()
                } else {
                    reason
                };
                self.service
                    .gate
                    .answer(id, approve, reason, uid)
                    .map_err(|e| {
                        let code = if e.contains("operator_uids") {
                            NOT_ALLOWED
                        } else {
                            NO_SUCH
                        };
                        (code, e)
                    })?;
                Ok(json!({"id": id, "approved": approve}))
            }
            other => Err((-32601, format!("no admin method {other}"))),
        }
    }
}

impl AdminHandler for Admin {
    fn handle(&self, uid: u32, method: String, params: Value) -> AdminReply<'_> {
        let r = self.call(uid, &method, &params);
        if let Err((code, why)) = &r {
            tracing::info!(uid, method, code, why, "admin request refused");
        }
        Box::pin(std::future::ready(r))
    }
}
