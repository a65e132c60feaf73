//! One tool as it is served: its spec, its resolved posture, the JSON Schema of its params,
//! its hints and its approval requirement.

use crate::approval::{requirement, Requirement, ToolFacts};
use serde_json::{json, Map, Value};
use stsd_profiles::{Config, Resolved};
use stsd_protocol::{NetworkMode, ToolSpec};

/// One tool as published over MCP.
#[derive(Debug, Clone)]
pub struct PublishedTool {
    pub spec: ToolSpec,
    pub tool_id: String,
    pub resolved: Resolved,
    pub read_only: bool,
    pub destructive: bool,
    pub open_world: bool,
    /// Whether a call needs approval first, why, and which strategy decides.
    pub approval: Requirement,
    /// The enforced toolSafety as JSON text, made once and shared (every call's audit record
    /// carries it): as a `Value` tree it was several KiB per served tool, and a deep copy per
    /// call.
    pub tool_safety_json: stsd_protocol::json::SharedJson,
    /// The spec's `testCases` as written (an extension field, §14), for a test run on demand
    /// (the console's Tools page); None when it has none (boxed: most have none).
    pub test_cases: Option<Box<Value>>,
}

impl PublishedTool {
    /// A tool as served: its schema and hints derived from the spec and its posture.
    pub fn new(
        spec: ToolSpec,
        tool_id: String,
        resolved: Resolved,
        approval: Requirement,
    ) -> PublishedTool {
        let caps = &resolved.tool_safety.capabilities;
        let network = caps.network.mode != NetworkMode::Blocked;
        PublishedTool {
            approval,
            tool_safety_json: stsd_protocol::json::shared_json(&resolved.tool_safety),
            read_only: !caps.file_write && !network,
            destructive: caps.destructive,
            open_world: network,
            tool_id,
            spec,
            resolved,
            test_cases: None,
        }
    }

    /// §6.2: the params lowered to a JSON Schema object, as `tools/list` serves it. Lowered
    /// when asked for (a page of the list lowers its tools' in microseconds) rather than
    /// kept: kept, it was 2 KiB per served tool of what the spec's params already say.
    pub fn input_schema(&self) -> Map<String, Value> {
        input_schema(&self.spec)
    }

    /// The tool as `stsd run`, `stsd test` and the publish gate run it: its approval decided
    /// by the spec and the config's rules (no toolsets document, not admin-published).
    pub fn of_spec(
        spec: &ToolSpec,
        tool_id: String,
        resolved: Resolved,
        config: &Config,
    ) -> PublishedTool {
        let facts = ToolFacts::of_spec(spec, &resolved, false);
        let flag = toolsets_flag(&spec.name, config);
        let approval = requirement(&facts, flag, &config.approval);
        PublishedTool::new(spec.clone(), tool_id, resolved, approval)
    }
}

/// The config's toolsets documents' `requiresApproval` for one tool, as the daemon would
/// read it: a tool run outside the daemon (`stsd run`, `stsd test`, the publish gate) is
/// gated as the daemon would gate it. A document that does not load fails closed: the tool
/// is taken to need approval, and the error is said.
fn toolsets_flag(name: &str, config: &Config) -> Option<bool> {
    let paths = &config.daemon.toolsets;
    if paths.is_empty() {
        return None;
    }
    // Other names in the documents are tools of a catalog not loaded here.
    match crate::approval::toolsets::load(paths, &|_| true) {
        Ok(t) => t.get(name).and_then(|s| s.requires_approval),
        Err(errors) => {
            tracing::warn!(
                tool = %name,
                errors = %errors.join("; "),
                "the toolsets documents do not load: the tool is taken to need approval"
            );
            Some(true)
        }
    }
}

/// §6.2 lowering: uppercase types to JSON Schema spellings, required list, no extra keys.
pub fn input_schema(spec: &ToolSpec) -> Map<String, Value> {
    let mut props = Map::new();
    for p in &spec.params {
        let mut prop = Map::new();
        prop.insert("type".into(), json!(p.ty.json_schema_name()));
        if !p.description.is_empty() {
            prop.insert("description".into(), json!(p.description));
        }
        props.insert(p.name.clone(), Value::Object(prop));
    }
    let required: Vec<&str> = spec
        .params
        .iter()
        .filter(|p| p.required)
        .map(|p| p.name.as_str())
        .collect();
    let mut schema = Map::new();
    schema.insert("type".into(), json!("object"));
    schema.insert("properties".into(), Value::Object(props));
    schema.insert("additionalProperties".into(), json!(false));
    if !required.is_empty() {
        schema.insert("required".into(), json!(required));
    }
    schema
}
