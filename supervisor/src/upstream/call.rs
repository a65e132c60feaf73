//! One call of a wrapped upstream tool, on the same straight line as a JS tool's: argument
//! check against the upstream's (unchanged) input schema, the approval gate, the call,
//! masking of the upstream's secrets, one audit record with the upstream id; and the seed's
//! start / done / crash events with the call's duration.

use super::expose::WrappedTool;
use super::Gateway;
use crate::approval::{Ask, Elicitor};
use crate::audit::AuditRecord;
use crate::service::{mask_value, Caller, Service, ToolReply};
use serde_json::{json, Map, Value};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use stsd_protocol::Code;

/// What the audit record says of an upstream call.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamAudit {
    pub id: String,
    pub tool: String,
    pub server_risk: String,
    pub tool_risk: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub floor_trigger: Option<String>,
    /// Whether the call reached the upstream (false: refused at stsd's door, which the audit
    /// log counts with the other refusals).
    #[serde(skip)]
    pub reached: bool,
}

/// Checks `args` against the tool's input schema (compiled when it was exposed); the error
/// names the JSON pointer.
fn check_arguments(tool: &WrappedTool, args: &Map<String, Value>) -> Result<(), String> {
    let validator = tool.validator.as_ref().map_err(Clone::clone)?;
    let instance = Value::Object(args.clone());
    let errors: Vec<String> = validator
        .iter_errors(&instance)
        .take(3)
        .map(|e| {
            let at = e.instance_path().to_string();
            format!("{} ({})", e, if at.is_empty() { "/".into() } else { at })
        })
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

pub async fn call_wrapped(
    service: &Arc<Service>,
    gw: &Gateway,
    tool: WrappedTool,
    args: Map<String, Value>,
    caller: &Caller,
    elicitor: Option<&dyn Elicitor>,
    cancel: Arc<AtomicBool>,
) -> ToolReply {
    let t0 = std::time::Instant::now();
    let call_id = service.next_call_id();
    let secrets = gw
        .upstream(&tool.upstream)
        .map(|u| u.secrets.clone())
        .unwrap_or_default();
    let mut record = AuditRecord::arrived(
        call_id,
        caller,
        tool.ledger_id.clone(),
        tool.alias.clone(),
        tool.composed.level.to_string(),
        mask_value(&Value::Object(args.clone()), &secrets),
    );
    record.upstream = Some(UpstreamAudit {
        id: tool.upstream.clone(),
        tool: tool.tool.clone(),
        server_risk: tool.server_risk.level.to_string(),
        tool_risk: tool.tool_risk.level.to_string(),
        floor_trigger: tool.composed.floor_trigger.map(|f| f.name().to_string()),
        reached: false,
    });
    if let Some(reply) = service.over_rate(caller) {
        return service.finish(record, &secrets, t0, reply);
    }
    if let Err(e) = check_arguments(&tool, &args) {
        let reply = ToolReply::error(Code::InvalidInput, &e);
        return service.finish(record, &secrets, t0, reply);
    }
    if tool.approval.required {
        let ask = Ask {
            call_id,
            tool: &tool.alias,
            arguments: &record.params,
            prompt_template: None,
            peer_uid: caller.peer_uid,
            principal: caller.principal.as_deref(),
            requirement: &tool.approval,
        };
        let decision = tokio::select! {
            d = service.gate.decide(ask, elicitor) => d,
            _ = crate::service::cancelled(&cancel) => {
                let reply = ToolReply::error(
                    Code::Cancelled,
                    "the caller went away while the call waited for approval",
                );
                return service.finish(record, &secrets, t0, reply);
            }
        };
        record.approval = Some(decision.record);
        if let Some((code, message)) = decision.refusal {
            return service.finish(record, &secrets, t0, ToolReply::error(code, &message));
        }
    }
    tracing::info!(
        target: "mcp.tool.start",
        call_id,
        upstream = %tool.upstream,
        tool = %tool.tool,
        alias = %tool.alias,
        risk = %tool.composed.level,
        "mcp.tool.start"
    );
    let started = std::time::Instant::now();
    if let Some(u) = record.upstream.as_mut() {
        u.reached = true;
    }
    let result = gw.call(&tool, args, cancel).await;
    let ms = started.elapsed().as_millis() as u64;
    let reply = match result {
        Ok(r) => {
            tracing::info!(target: "mcp.tool.done", call_id, upstream = %tool.upstream, tool = %tool.tool, ms, is_error = r.is_error.unwrap_or(false), "mcp.tool.done");
            reply_of(&r, &secrets)
        }
        Err((code, message)) => {
            tracing::warn!(target: "mcp.tool.crash", call_id, upstream = %tool.upstream, tool = %tool.tool, ms, code = %code, error = %secrets.mask(&message), "mcp.tool.crash");
            if matches!(code, Code::Timeout | Code::OutputLimit) {
                record.limits_hit.push(code.to_string());
            }
            ToolReply::error(code, &message)
        }
    };
    service.finish(record, &secrets, t0, reply)
}

/// An upstream result as stsd answers it: its content blocks as they are (masked), its
/// text parts joined for the plain-text view, its structured content.
fn reply_of(
    r: &rmcp::model::CallToolResult,
    secrets: &stsd_protocol::envvar::SecretSet,
) -> ToolReply {
    let blocks: Vec<Value> = r
        .content
        .iter()
        .filter_map(|c| serde_json::to_value(c).ok())
        .map(|v| mask_value(&v, secrets))
        .collect();
    let text: Vec<&str> = blocks
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect();
    let is_error = r.is_error.unwrap_or(false);
    let text = text.join("\n");
    ToolReply {
        is_error,
        code: is_error.then_some(Code::UpstreamError),
        text: if is_error && !text.starts_with("UPSTREAM_ERROR") {
            format!("UPSTREAM_ERROR: {text}")
        } else {
            text
        },
        structured: r
            .structured_content
            .as_ref()
            .map(|s| mask_value(s, secrets)),
        metrics: None,
        content: Some(blocks),
    }
}

/// The `_meta` a wrapped tool carries in `tools/list`.
pub fn tool_meta(t: &WrappedTool) -> Value {
    json!({
        "stsd/riskLevel": t.composed.level.as_str(),
        "stsd/upstream": {"id": t.upstream, "tool": t.tool},
        "stsd/risk": {
            "server": t.server_risk,
            "tool": t.tool_risk,
            "composed": t.composed,
        },
        "stsd/poisoning": t.hits,
        "stsd/approval": {
            "required": t.approval.required,
            "source": t.approval.source.as_str(),
            "strategy": t.approval.required.then(|| t.approval.strategy.as_str()),
        },
    })
}
