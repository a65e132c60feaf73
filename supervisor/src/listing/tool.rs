//! One served tool as MCP's `Tool`: an own tool from its published spec, a wrapped upstream
//! tool from what the gateway exposes.

use crate::approval::mitigated;
use crate::catalog::tool::PublishedTool;
use rmcp::model::{JsonObject, MetaObject, Tool, ToolAnnotations};
use serde_json::{json, Value};
use std::sync::Arc;

/// A published tool as `tools/list` serves it, as JSON (for `stsd export --format mcp`).
pub fn tool_json(t: &PublishedTool) -> Value {
    serde_json::to_value(own(t)).unwrap_or(Value::Null)
}

/// One of stsd's own tools: its schema, annotations, and stsd's risk and approval in `_meta`.
pub fn own(t: &PublishedTool) -> Tool {
    let mut meta = MetaObject::new();
    meta.0
        .insert("stsd/riskLevel".into(), json!(t.resolved.risk.as_str()));
    meta.0.insert("stsd/toolId".into(), json!(t.tool_id));
    let a = &t.approval;
    meta.0.insert(
        "stsd/approval".into(),
        json!({
            "required": a.required,
            "source": a.source.as_str(),
            "strategy": a.required.then(|| a.strategy.as_str()),
            "riskLevelWithApproval": a.required.then(|| mitigated(t.resolved.risk).as_str()),
        }),
    );
    let mut ann = ToolAnnotations::new()
        .read_only(t.read_only)
        .open_world(t.open_world);
    if !t.read_only {
        ann = ann.destructive(t.destructive);
    }
    Tool::new(
        t.spec.name.clone(),
        t.spec.description.clone(),
        Arc::new(t.input_schema()),
    )
    .with_annotations(ann)
    .with_meta(meta)
}

/// A wrapped upstream tool as `tools/list` serves it: its alias, its (possibly overridden)
/// description, its input schema unchanged, its annotations, and stsd's scores in `_meta`.
pub fn wrapped(t: &crate::gateway::WrappedTool) -> Tool {
    let schema: JsonObject = match &t.input_schema {
        Value::Object(m) => m.clone(),
        _ => JsonObject::new(),
    };
    let mut tool = Tool::new(t.alias.clone(), t.description.clone(), Arc::new(schema));
    if let Some(a) = t
        .annotations
        .as_ref()
        .and_then(|a| serde_json::from_value::<ToolAnnotations>(a.clone()).ok())
    {
        tool = tool.with_annotations(a);
    }
    if let Some(Value::Object(o)) = &t.output_schema {
        tool.output_schema = Some(Arc::new(o.clone()));
    }
    let mut meta = MetaObject::new();
    if let Value::Object(m) = crate::gateway::tool_meta(t) {
        meta.0.extend(m);
    }
    tool.with_meta(meta)
}
