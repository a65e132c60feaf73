//! CLI verbs that talk to a running daemon: thin clients of its socket. `stsd call` speaks
//! MCP (2026-07-28) like any client; `stsd status`, `stsd tools ...`, `stsd approvals`,
//! `stsd approve` and `stsd deny` use the admin channel (`stsd/...`).

use crate::{EXIT_INVALID, EXIT_USAGE};
use serde_json::{json, Map, Value};
use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;
use stsd::admin::client;

fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("stsd: {e}");
    ExitCode::from(EXIT_INVALID)
}

fn meta() -> Value {
    meta_with(json!({}))
}

/// The request's `_meta`, declaring `capabilities`.
fn meta_with(capabilities: Value) -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": capabilities,
        "io.modelcontextprotocol/clientInfo": {"name": "stsd-call", "version": env!("CARGO_PKG_VERSION")},
        "io.modelcontextprotocol/logLevel": "debug",
    })
}

/// `--arg NAME=VALUE` typed by the tool's inputSchema: strings as given, numbers and
/// booleans parsed, objects and arrays as JSON.
fn typed(schema: &Value, pair: &str) -> Result<(String, Value), String> {
    let (k, v) = pair
        .split_once('=')
        .ok_or_else(|| format!("--arg {pair}: expected NAME=VALUE"))?;
    let ty = schema["properties"][k]["type"].as_str().unwrap_or("string");
    let value = match ty {
        "string" => Value::String(v.to_string()),
        "integer" => v
            .trim()
            .parse::<i64>()
            .map(Value::from)
            .map_err(|_| format!("--arg {k}: {v:?} is not an integer"))?,
        "number" => v
            .trim()
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map(Value::Number)
            .ok_or_else(|| format!("--arg {k}: {v:?} is not a number"))?,
        "boolean" => match v.trim() {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => return Err(format!("--arg {k}: {v:?} is not true or false")),
        },
        _ => serde_json::from_str(v).map_err(|e| format!("--arg {k}: not JSON: {e}"))?,
    };
    Ok((k.to_string(), value))
}

/// Every tool the daemon lists to this caller: all pages of `tools/list`, following
/// `nextCursor` (bounded, against a daemon that never ends its list).
fn served(socket: &Path) -> Result<Vec<Value>, String> {
    let mut tools = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10_000 {
        let mut params = json!({"_meta": meta()});
        if let Some(c) = &cursor {
            params["cursor"] = json!(c);
        }
        let page = client::call(socket, "tools/list", params)?;
        if let Some(t) = page["tools"].as_array() {
            tools.extend(t.iter().cloned());
        }
        match page["nextCursor"].as_str() {
            Some(c) if !c.is_empty() => cursor = Some(c.to_string()),
            _ => return Ok(tools),
        }
    }
    Err("tools/list: more than 10000 pages".into())
}

/// `stsd call TOOL`: one tools/call on the running daemon; exit codes as `stsd run` (0 the
/// tool succeeded, 1 it failed, 2 a usage error or arguments the tool refuses).
pub fn call(
    socket: &Path,
    tool: &str,
    pairs: &[String],
    args_json: Option<&str>,
    json_out: bool,
    answer: Option<bool>,
) -> ExitCode {
    let listed = match served(socket) {
        Ok(v) => v,
        Err(e) => return fail(e),
    };
    // The listed schema types `--arg` values. A tool not listed is still called: whether it
    // runs, and why not (unknown, withheld, refused), is the daemon's to say, as for any door.
    let schema = listed
        .iter()
        .find(|t| t["name"] == tool)
        .map(|t| t["inputSchema"].clone())
        .unwrap_or(Value::Null);
    let mut args = Map::new();
    if let Some(text) = args_json {
        match crate::cli_run::args_object(text) {
            Ok(m) => args = m,
            Err(e) => {
                eprintln!("stsd: {e}");
                return ExitCode::from(EXIT_USAGE);
            }
        }
    }
    for p in pairs {
        match typed(&schema, p) {
            Ok((k, v)) => {
                args.insert(k, v);
            }
            Err(e) => {
                eprintln!("stsd: {e}");
                return ExitCode::from(EXIT_USAGE);
            }
        }
    }
    // This caller can be asked for approval when it has an answer ahead or a terminal.
    let can_answer = answer.is_some() || std::io::stdin().is_terminal();
    let caps = if can_answer {
        json!({"elicitation": {}})
    } else {
        json!({})
    };
    let params = json!({"name": tool, "arguments": args, "_meta": meta_with(caps)});
    let mut console = |n: &Value| {
        if n["method"] == "notifications/message" {
            let data = &n["params"]["data"];
            let line = data
                .as_str()
                .map(String::from)
                .unwrap_or_else(|| data.to_string());
            eprintln!(
                "[{}] {line}",
                n["params"]["level"].as_str().unwrap_or("info")
            );
        }
    };
    let mut r = match client::call_with(socket, "tools/call", params.clone(), &mut console) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("stsd: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if r["resultType"] == "input_required" {
        r = match answer_and_retry(socket, params, &r, answer, &mut console) {
            Ok(r) => r,
            Err(code) => return code,
        };
    }
    let text: String = r["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["text"].as_str())
        .collect();
    if r["isError"] == true {
        let code = r["_meta"]["stsd/errorCode"].as_str().unwrap_or("ERROR");
        let message = text
            .strip_prefix(&format!("{code}: "))
            .unwrap_or(&text)
            .to_string();
        crate::cli_run::print_failure(code, &message, json_out);
        return ExitCode::from(if code == "INVALID_INPUT" {
            EXIT_USAGE
        } else {
            EXIT_INVALID
        });
    }
    if json_out {
        let result = r.get("structuredContent").cloned().unwrap_or_else(|| {
            stsd_protocol::json::parse_js_json(&text).unwrap_or(Value::String(text.clone()))
        });
        println!("{}", json!({"ok": true, "result": result}));
    } else {
        println!("{text}");
    }
    ExitCode::SUCCESS
}

/// MCP 2026-07-28: the tool asked this caller for approval (`input_required`): answer and
/// call again with the sealed state.
fn answer_and_retry(
    socket: &Path,
    mut params: Value,
    asked: &Value,
    answer: Option<bool>,
    console: &mut dyn FnMut(&Value),
) -> Result<Value, ExitCode> {
    let request = &asked["inputRequests"]["stsd-approval"];
    let message = request["params"]["message"]
        .as_str()
        .unwrap_or("approve this call?");
    let action = if ask_approval(message, answer) {
        "accept"
    } else {
        "decline"
    };
    params["inputResponses"] = json!({"stsd-approval": {"action": action}});
    params["requestState"] = asked["requestState"].clone();
    let r = client::call_with(socket, "tools/call", params, console).map_err(|e| {
        eprintln!("stsd: {e}");
        ExitCode::from(EXIT_USAGE)
    })?;
    if r["resultType"] == "input_required" {
        eprintln!("stsd: the daemon asked again after the answer; the call did not run");
        return Err(ExitCode::from(EXIT_INVALID));
    }
    Ok(r)
}

/// The answer to an approval request: given ahead, else asked at the terminal.
fn ask_approval(message: &str, answer: Option<bool>) -> bool {
    if let Some(a) = answer {
        return a;
    }
    eprint!("{message} [y/N] ");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).is_ok()
        && matches!(line.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

/// `stsd export` with no paths: what the running daemon serves (its own tools and the
/// upstream tools it wraps, as its `tools/list` gives them). None when no daemon answers (the
/// caller exports the bundled catalog instead, and says so).
pub fn export_served(socket: &Path, format: &str) -> Option<ExitCode> {
    let tools = match served(socket) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("stsd: {e}: exporting the bundled catalog instead");
            return None;
        }
    };
    eprintln!(
        "stsd: {} the daemon on {} serves",
        stsd::plural::n(tools.len(), "tool"),
        socket.display()
    );
    let doc = match format {
        "mcp" => json!({ "tools": tools }),
        "openai" => Value::Array(
            tools
                .iter()
                .map(|t| {
                    json!({"type": "function", "function": {
                        "name": t["name"], "description": t["description"],
                        "parameters": t["inputSchema"]}})
                })
                .collect(),
        ),
        _ => {
            let export: Vec<stsd::approval::toolsets::ExportTool> = tools
                .iter()
                .map(|t| stsd::approval::toolsets::ExportTool {
                    name: t["name"].as_str().unwrap_or_default(),
                    summary: t["description"].as_str().unwrap_or_default(),
                    args_schema: &t["inputSchema"],
                    enabled: true,
                    requires_approval: t["_meta"]["stsd/approval"]["required"] == true,
                })
                .collect();
            stsd::approval::toolsets::export(&export)
        }
    };
    println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    Some(ExitCode::SUCCESS)
}

/// `stsd status`: what a health check needs.
pub fn status(socket: &Path, json_out: bool) -> ExitCode {
    match client::call(socket, "stsd/status", json!({})) {
        Ok(v) if json_out => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Ok(v) => {
            println!(
                "stsd {} up {} s; pool {} ({} ready, {}); calls in flight {}, waiting {}; tools served {}, withheld {}; approvals pending {}; Landlock ABI {}, seccomp {}",
                v["version"].as_str().unwrap_or("?"),
                v["uptimeSeconds"],
                v["pool"]["size"],
                v["pool"]["ready"],
                match v["pool"]["zygotePid"].as_u64() {
                    Some(pid) => format!("forked by zygote pid {pid}"),
                    None => format!("spawn {}", v["pool"]["spawn"].as_str().unwrap_or("?")),
                },
                v["calls"]["inFlight"],
                v["calls"]["waiting"],
                v["catalog"]["served"],
                v["catalog"]["withheld"],
                v["approvalsPending"],
                v["sandbox"]["landlockAbi"],
                v["sandbox"]["seccomp"],
            );
            let g = &v["gateway"];
            if !g.is_null() {
                println!(
                    "gateway: {} of {} upstreams connected; upstream tools served {}, withheld {}",
                    g["connected"], g["upstreams"], g["toolsServed"], g["toolsWithheld"]
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

/// `stsd metrics`: the admin channel's `stsd/metrics`, as JSON.
pub fn metrics(socket: &Path, json_out: bool) -> ExitCode {
    let v = match client::call(socket, "stsd/metrics", json!({})) {
        Ok(v) => v,
        Err(e) => return fail(e),
    };
    if json_out {
        println!("{v}");
        return ExitCode::SUCCESS;
    }
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    println!(
        "tools served: {} own, {} upstream",
        n(&v["toolsServed"]),
        n(&v["upstreamToolsServed"])
    );
    println!(
        "pool: {} workers, {} ready; calls in flight {}, waiting {}; approvals pending {}",
        n(&v["pool"]["size"]),
        n(&v["pool"]["ready"]),
        n(&v["inFlight"]),
        n(&v["waiting"]),
        n(&v["approvalsPending"])
    );
    println!(
        "store: {}, {} operations; audit log: {} bytes, {} rotations, {} failures, {} refused",
        if v["storeUp"] == true { "up" } else { "DOWN" },
        n(&v["storeOps"]),
        n(&v["audit"]["bytes"]),
        n(&v["audit"]["rotations"]),
        n(&v["audit"]["failures"]),
        n(&v["audit"]["refused"])
    );
    let calls = v["calls"].as_array().cloned().unwrap_or_default();
    println!(
        "calls: {}",
        calls.iter().map(|c| n(&c["count"])).sum::<u64>()
    );
    for c in &calls {
        println!(
            "  {:<28} {:<22} {}",
            c["tool"].as_str().unwrap_or("-"),
            c["outcome"].as_str().unwrap_or("-"),
            n(&c["count"])
        );
    }
    ExitCode::SUCCESS
}

/// `stsd tools show NAME` as text: its state, posture and parameters.
fn print_tool(v: &Value) {
    let s = |v: &Value| v.as_str().unwrap_or("-").to_string();
    println!(
        "{}  {}  {}",
        s(&v["name"]),
        s(&v["state"]),
        s(&v["riskLevel"])
    );
    if let Some(why) = v["reason"].as_str() {
        println!("  withheld: {why}");
        return;
    }
    if let Some(d) = v["description"].as_str() {
        println!("  {d}");
    }
    let a = &v["approval"];
    if a["required"] == true {
        println!(
            "  approval: required ({}, {})",
            s(&a["strategy"]),
            s(&a["source"])
        );
    } else {
        println!("  approval: none");
    }
    let caps = &v["toolSafety"]["capabilities"];
    let hosts: Vec<String> = caps["network"]["hosts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|h| h.as_str().map(String::from))
        .collect();
    println!(
        "  network: {}{}; files: read {}, write {}",
        s(&caps["network"]["mode"]),
        if hosts.is_empty() {
            String::new()
        } else {
            format!(" ({})", hosts.join(", "))
        },
        caps["fileRead"] == true,
        caps["fileWrite"] == true
    );
    let schema = &v["inputSchema"];
    let required: Vec<&str> = schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for (name, p) in schema["properties"].as_object().into_iter().flatten() {
        println!(
            "  param {name}: {}{}{}",
            s(&p["type"]),
            if required.contains(&name.as_str()) {
                ", required"
            } else {
                ""
            },
            p["description"]
                .as_str()
                .filter(|d| !d.is_empty())
                .map(|d| format!(": {d}"))
                .unwrap_or_default()
        );
    }
}

/// `stsd tools list` / `stsd tools show NAME`.
pub fn tools(socket: &Path, show: Option<&str>, json_out: bool) -> ExitCode {
    let (method, params) = match show {
        Some(n) => ("stsd/tools/show", json!({"name": n})),
        None => ("stsd/tools/list", json!({})),
    };
    let v = match client::call(socket, method, params) {
        Ok(v) => v,
        Err(e) => return fail(e),
    };
    if json_out {
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return ExitCode::SUCCESS;
    }
    if show.is_some() {
        print_tool(&v);
        return ExitCode::SUCCESS;
    }
    for t in v["tools"].as_array().into_iter().flatten() {
        let approval = if t["approval"]["required"] == true {
            format!(
                "approval {} ({})",
                t["approval"]["strategy"].as_str().unwrap_or("-"),
                t["approval"]["source"].as_str().unwrap_or("-")
            )
        } else if t["state"] == "ACTIVE" {
            "no approval".into()
        } else {
            t["reason"].as_str().unwrap_or_default().to_string()
        };
        println!(
            "{:<28} {:<9} {:<3} {approval}",
            t["name"].as_str().unwrap_or_default(),
            t["state"].as_str().unwrap_or_default(),
            t["riskLevel"].as_str().unwrap_or("-"),
        );
    }
    ExitCode::SUCCESS
}

/// The `stsd tools` verbs that change the managed catalog.
pub enum ToolsWrite {
    Add(std::path::PathBuf),
    Update(String, std::path::PathBuf),
    Rollback(String),
    Remove(String),
    Enable(String),
    Disable(String),
    None,
}

/// One spec from a file (a single spec, or an array or bundle holding exactly one).
fn one_spec(file: &Path) -> Result<Value, String> {
    let text = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let v: Value =
        serde_json::from_slice(&text).map_err(|e| format!("{}: not JSON: {e}", file.display()))?;
    let list = match &v {
        Value::Array(a) => a.clone(),
        Value::Object(o) if o.contains_key("toolSpecs") => {
            o["toolSpecs"].as_array().cloned().unwrap_or_default()
        }
        _ => return Ok(v),
    };
    match list.as_slice() {
        [one] => Ok(one.clone()),
        _ => Err(format!(
            "{} holds {} specs; give one spec per file",
            file.display(),
            list.len()
        )),
    }
}

pub fn tools_write(socket: &Path, w: ToolsWrite, json_out: bool) -> ExitCode {
    let (method, params) = match w {
        ToolsWrite::Add(f) => match one_spec(&f) {
            Ok(spec) => ("stsd/tools/add", json!({"spec": spec})),
            Err(e) => return fail(e),
        },
        ToolsWrite::Update(name, f) => match one_spec(&f) {
            Ok(spec) => ("stsd/tools/update", json!({"name": name, "spec": spec})),
            Err(e) => return fail(e),
        },
        ToolsWrite::Rollback(n) => ("stsd/tools/rollback", json!({"name": n})),
        ToolsWrite::Remove(n) => ("stsd/tools/remove", json!({"name": n})),
        ToolsWrite::Enable(n) => ("stsd/tools/enable", json!({"name": n})),
        ToolsWrite::Disable(n) => ("stsd/tools/disable", json!({"name": n})),
        ToolsWrite::None => return ExitCode::from(EXIT_USAGE),
    };
    match client::call(socket, method, params) {
        Ok(v) if json_out => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Ok(v) => {
            let name = v["name"].as_str().unwrap_or("-");
            let done = match method {
                "stsd/tools/add" => "published",
                "stsd/tools/update" => "updated (the new version is served)",
                "stsd/tools/rollback" => "rolled back (the previous version is served)",
                "stsd/tools/remove" => "removed (rollback brings it back)",
                "stsd/tools/enable" => "enabled",
                _ => "disabled (stsd tools enable brings it back)",
            };
            println!("{name}: {done}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}
