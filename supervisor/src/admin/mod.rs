//! The admin channel: JSON-RPC methods named `stsd/...` on the daemon's own socket, beside MCP.
//! Every method checks the caller's uid (SO_PEERCRED, from the transport): reading needs
//! `[daemon] admin_uids` (default: the daemon's own uid and root) or `[approval]
//! operator_uids`; answering an approval needs `operator_uids`. The CLI verbs that talk to a
//! running daemon (`stsd approvals`, `stsd approve`, `stsd deny`) are thin clients of it
//! ([`client`]).
//!
//! | method | params | result |
//! |---|---|---|
//! | `stsd/status` | none | version, uptime, pool, queue, catalog counts, sandbox support |
//! | `stsd/metrics` | none | calls by tool and outcome, pool, in flight, waiting, approvals |
//! | `stsd/tools/list` | none | `{"tools": [{name, state, riskLevel, approval, ...}]}`, withheld ones too |
//! | `stsd/tools/show` | `{name}` | one tool: the list entry plus its spec and inputSchema |
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
    started: std::time::Instant,
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
            started: std::time::Instant::now(),
        })
    }

    fn may_read(&self, uid: u32) -> bool {
        self.admin_uids.contains(&uid) || self.service.gate.config().operator_uids.contains(&uid)
    }

    fn tool_entry(t: &crate::service::PublishedTool) -> Value {
        let a = &t.approval;
        json!({
            "name": t.spec.name,
            "state": "ACTIVE",
            "riskLevel": t.resolved.risk.as_str(),
            "toolId": t.tool_id,
            "approval": {
                "required": a.required,
                "source": a.source.as_str(),
                "strategy": a.required.then(|| a.strategy.as_str()),
                "riskLevelWithApproval": a.required.then(|| crate::approval::mitigated(t.resolved.risk).as_str()),
            },
        })
    }

    fn status(&self) -> Value {
        let p = self.service.published();
        let sandbox = stsd_profiles::os::landlock::abi_version();
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "uptimeSeconds": self.started.elapsed().as_secs(),
            "pool": {"size": self.service.pool.target(), "ready": self.service.pool.ready_count()},
            "calls": {"inFlight": self.service.in_flight(), "waiting": self.service.waiting()},
            "catalog": {"served": p.tools.len(), "withheld": p.withheld.len()},
            "approvalsPending": self.service.gate.pending().len(),
            "sandbox": {"landlockAbi": sandbox, "seccomp": true},
        })
    }

    fn call(&self, uid: u32, method: &str, params: &Value) -> Result<Value, (i32, String)> {
        let admin_only = |what: &str| {
            if self.admin_uids.contains(&uid) {
                Ok(())
            } else {
                Err((
                    NOT_ALLOWED,
                    format!("uid {uid} may not {what} (it is not in [daemon] admin_uids)"),
                ))
            }
        };
        match method {
            "stsd/status" => {
                admin_only("read the status")?;
                Ok(self.status())
            }
            "stsd/metrics" => {
                admin_only("read metrics")?;
                Ok(self.service.metrics.json(&self.service.gauges()))
            }
            "stsd/tools/list" => {
                admin_only("list tools")?;
                let p = self.service.published();
                let mut tools: Vec<Value> = p.tools.iter().map(Self::tool_entry).collect();
                for (name, why) in &p.withheld {
                    tools.push(json!({"name": name, "state": "WITHHELD", "reason": why}));
                }
                Ok(json!({"tools": tools}))
            }
            "stsd/tools/show" => {
                admin_only("show tools")?;
                let name = params
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or((-32602, "params: {\"name\": <tool>}".to_string()))?;
                let p = self.service.published();
                match p.get(name) {
                    Some(t) => {
                        let mut v = Self::tool_entry(t);
                        v["inputSchema"] = t.input_schema.clone();
                        v["description"] = json!(t.spec.description);
                        v["toolSafety"] =
                            serde_json::to_value(&t.resolved.tool_safety).unwrap_or(Value::Null);
                        Ok(v)
                    }
                    None => match p.withheld.iter().find(|(n, _)| n == name) {
                        Some((n, why)) => {
                            Ok(json!({"name": n, "state": "WITHHELD", "reason": why}))
                        }
                        None => Err((NO_SUCH, format!("no tool named {name}"))),
                    },
                }
            }
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
