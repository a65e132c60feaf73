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
