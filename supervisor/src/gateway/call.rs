//! The parts of a wrapped upstream tool's call the pipeline (`crate::call`) uses: the
//! argument check against the upstream's (unchanged) input schema, the reply as stsd
//! answers it, the `_meta` it is listed with.

use super::expose::WrappedTool;
use crate::call::vocab::{mask_value, ToolReply};
use serde_json::{json, Map, Value};
use stsd_protocol::Code;

/// Checks `args` against the tool's input schema (compiled when it was exposed); the error
/// names the JSON pointer.
pub(crate) fn check_against_input_schema(
    tool: &WrappedTool,
    args: &Map<String, Value>,
) -> Result<(), String> {
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

/// An upstream result as stsd answers it: its content blocks as they are (masked), its
/// text parts joined for the plain-text view, its structured content.
pub(crate) fn reply_of(
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
        raw: None,
        stack: None,
        pointer: None,
        retry_after_ms: None,
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
