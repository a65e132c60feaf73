//! The call pipeline for what upstreams serve besides tools: a resource read, a prompt, a
//! completion. The same steps a tool call takes where they apply: authorise (the policy's
//! `call` on the item, as a read-only thing of its upstream), then the gateway (routed,
//! bounded, masked), then one audit record with the reply's size. Nothing runs in a worker
//! and nothing needs approval: reading is what an upstream's listing already offers.

use super::vocab::Caller;
use crate::audit::{AuditError, AuditRecord, UpstreamAudit};
use crate::service::Service;
use rmcp::model::CompleteRequestParams;
use serde_json::{json, Map, Value};
use std::time::Instant;
use stsd_protocol::Code;

/// One request.
pub enum ItemRequest {
    Read {
        uri: String,
    },
    Prompt {
        name: String,
        arguments: Option<Map<String, Value>>,
    },
    Complete(Box<CompleteRequestParams>),
}

impl ItemRequest {
    /// The method, for the record.
    fn method(&self) -> &'static str {
        match self {
            ItemRequest::Read { .. } => "resources/read",
            ItemRequest::Prompt { .. } => "prompts/get",
            ItemRequest::Complete(_) => "completion/complete",
        }
    }

    /// What it names (a URI, a served prompt, a completion's reference), and its parameters
    /// as recorded.
    fn target(&self) -> (String, Value) {
        match self {
            ItemRequest::Read { uri } => (uri.clone(), json!({"uri": uri})),
            ItemRequest::Prompt { name, arguments } => {
                (name.clone(), json!({"name": name, "arguments": arguments}))
            }
            ItemRequest::Complete(p) => {
                let target = match &p.r#ref {
                    rmcp::model::Reference::Prompt(r) => r.name.clone(),
                    rmcp::model::Reference::Resource(r) => r.uri.clone(),
                    _ => String::new(),
                };
                let params = json!({"ref": target, "argument": p.argument.name});
                (target, params)
            }
        }
    }
}

/// Serves one request for `caller`: the reply (masked), or a classified failure.
pub async fn serve(
    service: &Service,
    caller: &Caller,
    req: ItemRequest,
) -> Result<Value, (Code, String)> {
    let t0 = Instant::now();
    let (target, params) = req.target();
    let method = req.method();
    let Some(gw) = service.gateway() else {
        return Err((Code::InvalidInput, format!("no upstream serves {target}")));
    };
    let exposed = gw.exposed();
    let upstream = match &req {
        ItemRequest::Read { uri } => exposed.items.route(uri).ok().map(str::to_string),
        ItemRequest::Prompt { name, .. } => exposed.items.prompt(name).map(|p| p.upstream.clone()),
        ItemRequest::Complete(p) => gw.completion_upstream(&p.r#ref),
    };
    let server_risk = server_level(&exposed, upstream.as_deref());
    // Arguments are recorded with the upstream's secrets masked, as a tool call's are.
    let params = match upstream.as_ref().and_then(|u| gw.upstream(u)) {
        Some(u) => crate::call::vocab::mask_value(&params, &u.masks()),
        None => params,
    };
    let mut record = AuditRecord::arrived(
        service.next_call_id(),
        caller,
        upstream
            .as_ref()
            .map(|u| format!("{u}/{target}"))
            .unwrap_or_default(),
        method.to_string(),
        server_risk.clone(),
        params,
    );
    record.upstream = upstream.as_ref().map(|id| UpstreamAudit {
        id: id.clone(),
        tool: target.clone(),
        server_risk: server_risk.clone(),
        tool_risk: String::new(),
        floor_trigger: None,
        reached: false,
    });
    let result = match authorise(service, caller, &target, upstream.as_deref(), &server_risk) {
        Err(policies) => {
            record.policy = Some(policies);
            Err((
                Code::Forbidden,
                format!("{} may not read {target}", who(caller)),
            ))
        }
        Ok(()) => {
            let read = match req {
                ItemRequest::Read { uri } => gw.read_resource(&uri).await,
                ItemRequest::Prompt { name, arguments } => gw.get_prompt(&name, arguments).await,
                ItemRequest::Complete(p) => gw.complete(*p).await,
            };
            read.map(|r| {
                if let Some(u) = record.upstream.as_mut() {
                    u.id = r.upstream;
                    u.reached = true;
                }
                record.bytes = Some(r.bytes as u64);
                r.value
            })
        }
    };
    record.elapsed_ms = t0.elapsed().as_millis() as u64;
    match &result {
        Ok(_) => record.outcome = "OK",
        Err((code, message)) => {
            record.error = Some(AuditError {
                code: code.to_string(),
                message: message.clone(),
            })
        }
    }
    service.audit_item(&record);
    result
}

/// Whether `caller` may subscribe to `uri`: the policy's `call` on it, as for a read (the
/// upstream that serves it named). Err: the refusal.
pub fn may_subscribe(service: &Service, caller: &Caller, uri: &str) -> Result<(), (Code, String)> {
    let gw = service
        .gateway()
        .ok_or_else(|| (Code::InvalidInput, format!("no upstream serves {uri}")))?;
    let exposed = gw.exposed();
    let upstream = exposed.items.route(uri).ok().map(str::to_string);
    let server_risk = server_level(&exposed, upstream.as_deref());
    authorise(service, caller, uri, upstream.as_deref(), &server_risk).map_err(|_| {
        (
            Code::Forbidden,
            format!("{} may not read {uri}", who(caller)),
        )
    })
}

/// The server risk level of `upstream` in the exposure ("" when it has none yet).
fn server_level(exposed: &crate::gateway::Exposed, upstream: Option<&str>) -> String {
    upstream
        .and_then(|u| exposed.servers.iter().find(|(s, _)| s == u))
        .and_then(|(_, r)| r.as_ref())
        .map(|r| r.level.to_string())
        .unwrap_or_default()
}

fn who(caller: &Caller) -> String {
    crate::policy::Who::of_caller(caller).id
}

/// The policy's `call` on the item, described as a read-only thing of its upstream. Err: the
/// policies that refused it.
fn authorise(
    service: &Service,
    caller: &Caller,
    target: &str,
    upstream: Option<&str>,
    server_risk: &str,
) -> Result<(), Vec<String>> {
    let policy = service.policy();
    let risk = server_risk
        .trim_start_matches('L')
        .parse::<i64>()
        .unwrap_or(5);
    let attrs = crate::policy::ToolAttrs {
        name: target.to_string(),
        category: String::new(),
        tags: Vec::new(),
        risk_level: risk,
        file_read: true,
        file_write: false,
        destructive: false,
        network_mode: "upstream".into(),
        hosts: Vec::new(),
        upstream: upstream.unwrap_or_default().to_string(),
        server_risk: risk,
        requires_approval: false,
    };
    let d = policy.decide(
        &crate::policy::Who::of_caller(caller),
        crate::policy::Action::Call,
        Some(&attrs),
    );
    if d.allowed {
        Ok(())
    } else {
        Err(d.policies)
    }
}
