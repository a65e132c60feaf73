//! `stsd upstream check|list` and `stsd ledger list|approve|revoke`. `check` is a preview
//! that needs no daemon (it connects to the upstreams itself, confined as the daemon would);
//! the others are thin clients of the running daemon's admin channel.

use crate::cli::LedgerCmd;
use crate::{EXIT_INVALID, EXIT_USAGE};
use serde_json::{json, Value};
use std::path::Path;
use std::process::ExitCode;
use stsd::admin::client;

fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("stsd: {e}");
    ExitCode::from(EXIT_INVALID)
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn print_hits(t: &Value) {
    for h in t["poisoning"].as_array().into_iter().flatten() {
        println!(
            "      POISONING {} in {}: {}",
            s(&h["pattern"]),
            s(&h["field"]),
            s(&h["excerpt"])
        );
    }
}

/// One upstream's report as text: the server's axes and floor, then each tool's.
fn print_upstream(u: &Value) {
    let r = &u["serverRisk"];
    println!(
        "upstream {} ({}){}",
        s(&u["id"]),
        s(&u["transport"]),
        u["error"]
            .as_str()
            .map(|e| format!(": NOT CONNECTED: {e}"))
            .unwrap_or_default()
    );
    let (r, whence) = if r.is_null() {
        (
            &u["configRisk"],
            " (from the config alone: the tool list was not seen)",
        )
    } else {
        (r, "")
    };
    if !r.is_null() {
        println!(
            "  server risk {}  transport {} auth {} trust {} doc {} = {}{}{whence}",
            s(&r["level"]),
            r["transport"],
            r["auth"],
            r["trust"],
            r["doc"],
            r["total"],
            r["floor"]
                .as_str()
                .map(|f| format!("  floor: {f}"))
                .unwrap_or_default()
        );
    }
    if let Some(paths) = u["readPaths"].as_array() {
        println!(
            "  confined: read {}; write {}; network {}",
            paths.iter().map(s).collect::<Vec<_>>().join(", "),
            s(&u["workspace"]),
            s(&u["network"])
        );
        let g = &u["cgroup"];
        println!(
            "  runs as uid {}; cgroup: {}; workspace budget: {}",
            u["uid"],
            g["none"].as_str().map_or_else(
                || format!(
                    "{} (memory {} MiB, pids {}, cpu {}%)",
                    s(&g["name"]),
                    g["memoryMax"].as_u64().unwrap_or(0) >> 20,
                    g["pidsMax"],
                    g["cpuPercent"]
                ),
                |why| format!("none: {why}")
            ),
            u["workspaceBudget"]["bytes"].as_u64().map_or_else(
                || format!("none: {}", s(&u["workspaceBudget"]["none"])),
                |b| format!("{} MiB (tmpfs)", b >> 20)
            ),
        );
    }
    for t in u["tools"].as_array().into_iter().flatten() {
        let c = &t["risk"];
        println!(
            "  tool {} -> {}  risk {}{}  (tool {}: base {} doc {}){}  ledger {}",
            s(&t["tool"]),
            s(&t["alias"]),
            s(&c["level"]),
            if c["hitl"] == json!(true) {
                " (HITL -1)"
            } else {
                ""
            },
            s(&t["toolRisk"]["level"]),
            t["toolRisk"]["base"],
            t["toolRisk"]["doc"],
            c["floorTrigger"]
                .as_str()
                .map(|f| format!("  floor: {f}"))
                .unwrap_or_default(),
            s(&t["ledgerState"]),
        );
        print_hits(t);
    }
    for w in u["withheld"].as_array().into_iter().flatten() {
        println!(
            "  withheld {} -> {}: {}",
            s(&w["tool"]),
            s(&w["alias"]),
            s(&w["why"])
        );
        print_hits(w);
    }
}

pub fn check(
    config: &stsd_profiles::Config,
    only: Option<&str>,
    json_out: bool,
    timeout_seconds: u64,
    catalog: Vec<std::path::PathBuf>,
) -> ExitCode {
    let sources = if catalog.is_empty() {
        vec![stsd::service::Source::Bundled]
    } else {
        catalog
            .into_iter()
            .map(stsd::service::Source::Path)
            .collect()
    };
    let own: Vec<String> = stsd::service::publish(&sources, config)
        .tools
        .iter()
        .map(|t| t.spec.name.clone())
        .collect();
    let report = match stsd::gateway::preview(
        config,
        only,
        &own,
        std::time::Duration::from_secs(timeout_seconds),
    ) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    if json_out {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        let ups = report["upstreams"].as_array().cloned().unwrap_or_default();
        if ups.is_empty() {
            println!("no upstream is declared ([[upstream]] in the config, or an mcp toolset)");
        }
        for u in &ups {
            print_upstream(u);
        }
    }
    check_exit(&report)
}

/// `stsd upstream check`'s exit code: 1 when an upstream did not get to serve (set-up failed,
/// or it was still restarting at the deadline), else 2 when a policy withheld a tool
/// (poisoning with `block_on_poisoning`, a ledger MISMATCH, a name collision), else 0.
fn check_exit(report: &Value) -> ExitCode {
    let ups = report["upstreams"].as_array().cloned().unwrap_or_default();
    if ups
        .iter()
        .any(|u| !u["error"].is_null() || u["state"] != "ready")
    {
        return ExitCode::from(EXIT_INVALID);
    }
    if ups
        .iter()
        .any(|u| u["withheld"].as_array().is_some_and(|w| !w.is_empty()))
    {
        return ExitCode::from(EXIT_USAGE);
    }
    ExitCode::SUCCESS
}

pub fn list(socket: &Path, json_out: bool) -> ExitCode {
    match client::call(socket, "stsd/upstream/list", json!({})) {
        Ok(v) => {
            if json_out {
                println!("{v}");
            } else {
                for u in v["upstreams"].as_array().into_iter().flatten() {
                    print_upstream(u);
                    println!("  state {}  pid {}", s(&u["state"]), s(&u["pid"]));
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

pub fn ledger(socket: &Path, what: LedgerCmd) -> ExitCode {
    let (method, params) = match &what {
        LedgerCmd::List { .. } => ("stsd/ledger/list", json!({})),
        LedgerCmd::Approve { id } => ("stsd/ledger/approve", json!({"id": id})),
        LedgerCmd::Revoke { id } => ("stsd/ledger/revoke", json!({"id": id})),
    };
    match client::call(socket, method, params) {
        Ok(v) => {
            match what {
                LedgerCmd::List { json: true } => println!("{v}"),
                LedgerCmd::List { json: false } => {
                    for e in v["entries"].as_array().into_iter().flatten() {
                        println!(
                            "{}  {}  {}{}",
                            s(&e["id"]),
                            s(&e["state"]),
                            s(&e["approved"]).chars().take(16).collect::<String>(),
                            e["pending"]
                                .as_str()
                                .map(|p| format!("  pending {}", &p[..p.len().min(16)]))
                                .unwrap_or_default()
                        );
                    }
                }
                _ => println!("{}: {}", s(&v["id"]), s(&v["state"])),
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

/// Where `upstream add` reads its entry from.
pub struct AddFrom {
    /// The file is an MCP registry server.json.
    pub registry: bool,
    pub id: Option<String>,
    /// From a registry entry: its remote rather than its package.
    pub remote: bool,
    /// Print the entry, add nothing.
    pub dry_run: bool,
}

/// One `[[upstream]]` entry from `file`: JSON (an object), or TOML (the entry's keys, or an
/// `[[upstream]]` array holding one).
fn entry_file(file: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let at = |e: &dyn std::fmt::Display| format!("{}: {e}", file.display());
    let v: Value = if text.trim_start().starts_with('{') {
        serde_json::from_str(&text).map_err(|e| at(&e))?
    } else {
        let t: toml::Table = toml::from_str(&text).map_err(|e| at(&e))?;
        serde_json::to_value(t).map_err(|e| at(&e))?
    };
    match v.get("upstream") {
        Some(Value::Array(a)) if a.len() == 1 => Ok(a[0].clone()),
        Some(Value::Array(a)) => Err(at(&format!(
            "{} [[upstream]] entries: give one per command",
            a.len()
        ))),
        _ => Ok(v),
    }
}

/// Prints a change's answer: the upstream as `upstream list` shows it.
fn print_change(v: &Value, json_out: bool) {
    if json_out {
        println!("{v}");
        return;
    }
    let u = &v["upstream"];
    if u.is_null() {
        println!("upstream {}", s(&v["id"]));
        return;
    }
    print_upstream(u);
    println!("  state {}  pid {}", s(&u["state"]), s(&u["pid"]));
}

pub fn add(socket: &Path, file: &Path, from: AddFrom, json_out: bool) -> ExitCode {
    let entry = match from.registry {
        true => std::fs::read(file)
            .map_err(|e| format!("{}: {e}", file.display()))
            .and_then(|b| {
                serde_json::from_slice::<Value>(&b).map_err(|e| format!("{}: {e}", file.display()))
            })
            .and_then(|doc| {
                let prefer = match from.remote {
                    true => stsd::gateway::RegistryPrefer::Remote,
                    false => stsd::gateway::RegistryPrefer::Package,
                };
                stsd::gateway::registry_entry(&doc, from.id.as_deref(), prefer)
            })
            .and_then(|u| serde_json::to_value(u).map_err(|e| e.to_string())),
        false => entry_file(file),
    };
    let entry = match entry {
        Ok(e) => e,
        Err(e) => return fail(e),
    };
    if from.dry_run {
        return match toml::to_string(&json!({"upstream": [entry]})) {
            Ok(t) => {
                print!("{t}");
                ExitCode::SUCCESS
            }
            Err(e) => fail(e),
        };
    }
    match client::call(socket, "stsd/upstream/add", json!({"upstream": entry})) {
        Ok(v) => {
            print_change(&v, json_out);
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

pub fn update(socket: &Path, file: &Path, json_out: bool) -> ExitCode {
    let entry = match entry_file(file) {
        Ok(e) => e,
        Err(e) => return fail(e),
    };
    match client::call(socket, "stsd/upstream/update", json!({"upstream": entry})) {
        Ok(v) => {
            print_change(&v, json_out);
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

pub fn remove(socket: &Path, id: &str) -> ExitCode {
    match client::call(socket, "stsd/upstream/remove", json!({"id": id})) {
        Ok(_) => {
            println!("upstream {id} removed");
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

pub fn restart(socket: &Path, id: &str, json_out: bool) -> ExitCode {
    match client::call(socket, "stsd/upstream/restart", json!({"id": id})) {
        Ok(v) => {
            print_change(&v, json_out);
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}
