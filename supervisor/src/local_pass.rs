//! The Local Pass (spec §11.3): run a spec with every required param set from its testValue,
//! under its own resolved posture, in the same sandbox a published call gets.

use crate::call::{Door, Place, Target, ToolReply};
use crate::catalog::tool::PublishedTool;
use crate::exec::{job, CallValue, ExecOptions};
pub use crate::scratch::PassPlace;
use crate::store::{now_ms, Catalog, Entry};
use serde_json::{json, Value};
use std::time::Duration;
use stsd_profiles::{resolve, Config};
use stsd_protocol::envvar::EnvSource;
use stsd_protocol::{Code, Diagnostic};

#[derive(Debug, Clone)]
pub struct PassReport {
    pub name: String,
    pub location: String,
    /// Ok: the call's result. Err: LOCAL_PASS_FAILED, with the cause's code in the message.
    pub outcome: Result<CallValue, Diagnostic>,
    pub elapsed: Duration,
}

fn failed(cause: Code, message: impl AsRef<str>, pointer: &str) -> Diagnostic {
    Diagnostic::error(
        Code::LocalPassFailed,
        pointer,
        format!("{cause}: {}", message.as_ref()),
    )
}

/// Who answers for a Local Pass of a tool that needs approval (`humanInTheLoop: REQUIRED`, a
/// rule): `stsd test` a terminal or `--approve`/`--deny`; the publish gate an approver who
/// answered ahead (`stsd catalog add`), else nobody (a tool that needs approval is refused
/// there unless its file carries `stsd test`'s stamp).
pub type Approver<'a> = Option<&'a dyn crate::approval::Elicitor>;

/// The door a Local Pass comes in by: one fresh worker, a scratch copy of the base path (or
/// in place), the environment given, the audit log the config names.
fn door<'a>(
    config: &Config,
    gate: &'a crate::approval::Gate,
    opts: &'a ExecOptions,
    env: &'a (dyn EnvSource + Sync),
    place: PassPlace,
    approver: Approver<'a>,
) -> Door<'a> {
    let mut d = Door::one_shot(
        std::sync::Arc::new(config.clone()),
        gate,
        opts,
        approver,
        "local-pass",
        Place::LocalPass(place),
    );
    d.env = Some(env);
    d
}

/// Runs the Local Pass of one entry through the call pipeline (`crate::call`): argument
/// check, approval, a sandboxed worker under the spec's own posture, masking, one audit
/// record. Console output is dropped (it is not part of the pass). A tool with file access
/// runs in a scratch copy of its base path unless `place` says in place (see
/// [`crate::scratch`]).
pub fn run_entry(
    cat: &Catalog,
    e: &Entry,
    config: &Config,
    env: &(dyn EnvSource + Sync),
    opts: &ExecOptions,
    place: PassPlace,
    approver: Approver<'_>,
) -> PassReport {
    let t0 = std::time::Instant::now();
    let name = e
        .validated
        .spec
        .as_ref()
        .map(|s| s.name.clone())
        .unwrap_or_default();
    let outcome = (|| {
        let Some(spec) = e.validated.spec.as_ref().filter(|_| e.validated.is_valid()) else {
            let first = e.validated.errors().next().cloned();
            return Err(match first {
                Some(d) => failed(d.code, &d.message, &d.pointer),
                None => failed(Code::SpecParse, "the spec is invalid", ""),
            });
        };
        let resolved = resolve(spec, config).map_err(|d| failed(d.code, &d.message, &d.pointer))?;
        let args = match job::test_arguments(spec) {
            Ok(a) => a,
            Err(d) => {
                // Audited like a pass that ran (seed 000 §11.3: failed ones above all).
                crate::audit::append_configured(
                    config,
                    &crate::audit::outside_record(
                        spec,
                        e.tool_id.clone(),
                        &resolved,
                        Value::Null,
                        Some((d.code.to_string(), d.message.clone())),
                        0,
                        None,
                        "local-pass",
                    ),
                );
                return Err(failed(d.code, &d.message, &d.pointer));
            }
        };
        let tool = PublishedTool::of_spec(spec, e.tool_id.clone(), resolved, config);
        let gate = crate::approval::Gate::new(config.approval.clone());
        let mut door = door(config, &gate, opts, env, place, approver);
        let reply = crate::call::run_blocking(&mut door, Target::Own(&tool), args);
        value_of(&reply).map_err(|(code, message)| failed(code, message, "/code"))
    })();
    PassReport {
        name,
        location: cat.location(e),
        outcome,
        elapsed: t0.elapsed(),
    }
}

/// An own tool's reply as the Local Pass reads it: the value, or the code and message.
fn value_of(reply: &ToolReply) -> Result<CallValue, (Code, String)> {
    if reply.is_error {
        return Err((
            reply.code.unwrap_or(Code::WorkerCrashed),
            reply.message().to_string(),
        ));
    }
    Ok(match &reply.raw {
        Some(t) => CallValue::Json(t.clone()),
        None => CallValue::Undefined,
    })
}

/// Persists `draft: false` for every passed entry, file by file, atomically.
pub fn write_passes(cat: &mut Catalog, passed: &[usize]) -> std::io::Result<usize> {
    let now = now_ms();
    let mut touched_files = Vec::new();
    for &i in passed {
        let (file, index) = (cat.entries[i].file, cat.entries[i].index);
        let f = &mut cat.files[file];
        if f.document_mut(index).is_some() {
            f.touch(index, now);
        }
        if let Some(doc) = f.document_mut(index) {
            stamp(doc, now);
            if !touched_files.contains(&file) {
                touched_files.push(file);
            }
        }
    }
    for &file in &touched_files {
        cat.files[file].write_atomic()?;
    }
    Ok(touched_files.len())
}

/// One of a spec's `testCases` (seed 004): arguments, and what should come of them.
#[derive(Debug, Clone, PartialEq)]
pub struct TestCase {
    pub name: String,
    pub arguments: serde_json::Map<String, Value>,
    pub expected_success: bool,
    /// Deep-equal on the result, when given.
    pub expected: Option<Value>,
    /// The error code a failing case must end with, when given.
    pub expected_error_code: Option<String>,
    pub timeout_ms: Option<u64>,
}

/// A spec's `testCases` (an extension field at the top level, §14): `arguments` (or seed
/// 004's `parameters`), `expectedSuccess` (default true), `expected`, `expectedErrorCode`,
/// `timeoutMs` (or `timeout`).
pub fn test_cases(doc: &Value) -> Result<Vec<TestCase>, Diagnostic> {
    let Some(list) = doc.get("testCases") else {
        return Ok(Vec::new());
    };
    let bad = |i: usize, what: &str| {
        Diagnostic::error(
            Code::SpecInvariant,
            format!("/testCases/{i}"),
            what.to_string(),
        )
    };
    let Some(list) = list.as_array() else {
        return Err(Diagnostic::error(
            Code::SpecInvariant,
            "/testCases",
            "testCases must be an array",
        ));
    };
    list.iter()
        .enumerate()
        .map(|(i, c)| {
            let args = c.get("arguments").or_else(|| c.get("parameters"));
            let arguments = match args {
                None | Some(Value::Null) => serde_json::Map::new(),
                Some(Value::Object(m)) => m.clone(),
                Some(_) => return Err(bad(i, "arguments must be an object")),
            };
            Ok(TestCase {
                name: c
                    .get("name")
                    .and_then(Value::as_str)
                    .map(String::from)
                    .unwrap_or_else(|| format!("case {i}")),
                arguments,
                expected_success: c
                    .get("expectedSuccess")
                    .and_then(Value::as_bool)
                    .unwrap_or(true),
                expected: c.get("expected").cloned(),
                expected_error_code: c
                    .get("expectedErrorCode")
                    .and_then(Value::as_str)
                    .map(String::from),
                timeout_ms: c
                    .get("timeoutMs")
                    .or_else(|| c.get("timeout"))
                    .and_then(Value::as_u64),
            })
        })
        .collect()
}

/// The cases a test run on demand runs: the spec's `testCases`, else one made of its
/// params' `testValue`s (as the Local Pass does). Err: why there are none.
pub fn cases_of(tool: &PublishedTool) -> Result<Vec<TestCase>, String> {
    // A spec without `testCases` has none written (null is not "an array that is wrong").
    if let Some(cases) = &tool.test_cases {
        let written =
            test_cases(&serde_json::json!({"testCases": cases})).map_err(|d| d.to_string())?;
        if !written.is_empty() {
            return Ok(written);
        }
    }
    // The Local Pass's own arguments: its params' non-blank `testValue`s.
    let arguments = crate::exec::job::test_arguments(&tool.spec).map_err(|d| d.to_string())?;
    Ok(vec![TestCase {
        name: "test values".into(),
        arguments,
        expected_success: true,
        expected: None,
        expected_error_code: None,
        timeout_ms: None,
    }])
}

/// What one test case did (seed 004's result entry).
#[derive(Debug, Clone, serde::Serialize)]
pub struct CaseResult {
    pub tool: String,
    pub name: String,
    pub success: bool,
    pub result: Value,
    /// Milliseconds.
    pub duration: u64,
    /// Why it failed, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Runs one test case through the call pipeline, under the spec's own posture, in a
/// sandboxed worker (in a fresh scratch workspace unless `place` says in place).
pub fn run_case(
    spec: &stsd_protocol::ToolSpec,
    config: &Config,
    env: &(dyn EnvSource + Sync),
    opts: &ExecOptions,
    case: &TestCase,
    place: PassPlace,
    approver: Approver<'_>,
) -> CaseResult {
    let t0 = std::time::Instant::now();
    let outcome: Result<Value, (String, String)> = (|| {
        let resolved =
            resolve(spec, config).map_err(|d| (d.code.to_string(), d.message.clone()))?;
        let tool = PublishedTool::of_spec(
            spec,
            spec.tool_id
                .clone()
                .filter(|id| !id.trim().is_empty())
                .unwrap_or_else(|| stsd_protocol::ids::derive_tool_id(&spec.name)),
            resolved,
            config,
        );
        let gate = crate::approval::Gate::new(config.approval.clone());
        let mut door = door(config, &gate, opts, env, place, approver);
        door.timeout_ms = case.timeout_ms;
        let reply =
            crate::call::run_blocking(&mut door, Target::Own(&tool), case.arguments.clone());
        match value_of(&reply) {
            Ok(CallValue::Undefined) => Ok(Value::Null),
            Ok(CallValue::Json(t)) => {
                Ok(stsd_protocol::json::parse_js_json(&t).unwrap_or(Value::Null))
            }
            Err((code, message)) => Err((code.to_string(), message)),
        }
    })();
    let execution_time = t0.elapsed().as_millis() as u64;
    let (success, reason, result) = match &outcome {
        Ok(v) => {
            let matches = case.expected.as_ref().is_none_or(|e| e == v);
            let success = case.expected_success && matches;
            let reason = (!success).then(|| {
                if case.expected_success {
                    format!("the result differs from the expected one: got {v}")
                } else {
                    "expected a failure, the call succeeded".to_string()
                }
            });
            (
                success,
                reason,
                json!({"success": true, "output": v, "executionTime": execution_time}),
            )
        }
        Err((code, message)) => {
            let code_ok = case.expected_error_code.as_ref().is_none_or(|c| c == code);
            let success = !case.expected_success && code_ok;
            let reason = (!success).then(|| {
                if case.expected_success {
                    format!("{code}: {message}")
                } else {
                    format!(
                        "expected {}, got {code}",
                        case.expected_error_code.as_deref().unwrap_or("an error")
                    )
                }
            });
            (
                success,
                reason,
                json!({"success": false, "error": {"code": code, "message": message},
                       "executionTime": execution_time}),
            )
        }
    };
    CaseResult {
        tool: spec.name.clone(),
        name: case.name.clone(),
        success,
        result,
        duration: t0.elapsed().as_millis() as u64,
        reason,
    }
}

/// The raw document of an entry (for extension fields such as `testCases`).
pub fn document<'a>(cat: &'a Catalog, e: &Entry) -> Option<&'a Value> {
    cat.files[e.file]
        .documents()
        .into_iter()
        .find(|(i, _)| *i == e.index)
        .map(|(_, v)| v)
}

/// Where a spec records that it passed: `{"sha256": <digest of its content>, "at": <ms>}`, a
/// top-level extension field (§14). The daemon serves a `draft: false` spec only while the
/// digest matches the content: a spec edited after its pass is withheld until it passes again.
pub const PASS_FIELD: &str = "x-stsd-localPass";

fn canonical(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), canonical(&m[k])))
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

/// SHA-256 of a spec's content: every field but `draft`, the timestamps and the pass record.
pub fn content_digest(doc: &Value) -> String {
    let mut d = doc.clone();
    if let Some(o) = d.as_object_mut() {
        for k in ["draft", "updateTimestamp", "createTimestamp", PASS_FIELD] {
            o.remove(k);
        }
    }
    let text = serde_json::to_vec(&canonical(&d)).unwrap_or_default();
    ring::digest::digest(&ring::digest::SHA256, &text)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Whether the spec's recorded pass is for its content as it is now.
pub fn verified(doc: &Value) -> bool {
    doc.get(PASS_FIELD)
        .and_then(|p| p.get("sha256"))
        .and_then(Value::as_str)
        .is_some_and(|d| d == content_digest(doc))
}

/// Records a pass of the spec as it is now (and publishes it: `draft: false`).
pub fn stamp(doc: &mut serde_json::Map<String, Value>, now: i64) {
    doc.insert("draft".into(), Value::Bool(false));
    let digest = content_digest(&Value::Object(doc.clone()));
    doc.insert(PASS_FIELD.into(), json!({"sha256": digest, "at": now}));
}
