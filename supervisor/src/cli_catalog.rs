//! `stsd catalog add|presets`: publish a catalog's specs through the running daemon's publish
//! gate (`stsd/tools/add`: its Local Pass and test cases, in scratch), one by one, and say
//! for each one that did not pass why, in the words of what to do about it.

use crate::cli::CatalogCmd;
use crate::{EXIT_INVALID, EXIT_USAGE};
use serde_json::{json, Value};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use stsd::admin::client;

fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("stsd: {e}");
    ExitCode::from(EXIT_INVALID)
}

pub fn run(socket: &Path, what: CatalogCmd) -> ExitCode {
    match what {
        CatalogCmd::Presets { paths, json } => presets(&paths, json),
        CatalogCmd::Add {
            paths,
            preset,
            approve_required,
            json,
        } => add(socket, &paths, preset.as_deref(), approve_required, json),
    }
}

/// Why a spec was not published, in classes an operator acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Published,
    AlreadyServed,
    MissingSecret,
    Network,
    NeedsApproval,
    FailingCase,
    Invalid,
    /// A tool of that name is there but not served (disabled, awaiting re-review, ...).
    Withheld,
}

impl Class {
    fn word(self) -> &'static str {
        match self {
            Class::Published => "published",
            Class::AlreadyServed => "already served",
            Class::MissingSecret => "missing secret",
            Class::Network => "network",
            Class::NeedsApproval => "needs approval",
            Class::FailingCase => "failing case",
            Class::Invalid => "invalid",
            Class::Withheld => "withheld",
        }
    }

    /// The gate's refusal, classified: its own prefixes first (a tool's thrown message, which
    /// a refusal may quote, comes after them).
    fn of(why: &str) -> Class {
        let has = |s: &str| why.contains(s);
        if why.starts_with(stsd::admin::NEEDS_APPROVAL) {
            Class::NeedsApproval
        } else if has("exists already") {
            Class::AlreadyServed
        } else if why.starts_with("invalid:")
            || why.starts_with("the code does not parse")
            || why.starts_with("the description needs")
        {
            Class::Invalid
        } else if has("MISSING_REQUIREMENTS: ") {
            Class::MissingSecret
        } else if has("HELPER_RUNTIME: [fetch] ") || has("EGRESS") {
            Class::Network
        } else {
            Class::FailingCase
        }
    }
}

/// What to do about a refusal, in one line (the gate's full words are in `--json`).
fn advice(class: Class, why: &str, doc: &Value) -> String {
    let after = |tag: &str| {
        why.rfind(tag)
            .map(|i| why[i + tag.len()..].trim().to_string())
    };
    match class {
        Class::MissingSecret => {
            let names = after("MISSING_REQUIREMENTS: ")
                .and_then(|t| t.split(" not set").next().map(str::to_string))
                .unwrap_or_else(|| why.to_string());
            let first = names.split(", ").next().unwrap_or("NAME");
            let first = first.strip_prefix("secret:").unwrap_or(first);
            // The hosts the spec may reach: where the secret would go, said before it is set.
            let caps = &doc["toolSafety"]["capabilities"]["network"]["hosts"];
            let hosts: Vec<&str> = caps
                .as_array()
                .or_else(|| doc["sandboxOverrides"]["hostsAllow"].as_array())
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .filter(|h| *h != "*")
                .collect();
            let flags: String = hosts.iter().map(|h| format!(" --host {h}")).collect();
            format!("needs {names}: stsd secret set {first}{flags}, then run this again")
        }
        Class::Network => format!(
            "{} (its Local Pass calls the real service: run this again where it is reachable)",
            after("HELPER_RUNTIME: ")
                .or_else(|| after("Local Pass: "))
                .unwrap_or_else(|| why.to_string())
        ),
        Class::NeedsApproval => "it needs approval to run: run this at a terminal to be asked, \
                                 or pass --approve-required (file writes go to scratch; network \
                                 calls are real)"
            .to_string(),
        _ => after("LOCAL_PASS_FAILED at /code: ").unwrap_or_else(|| why.to_string()),
    }
}

/// The presets document beside the first path (a directory, or a file's directory).
fn presets_file(paths: &[PathBuf]) -> Result<PathBuf, String> {
    let first = paths
        .first()
        .ok_or("give the catalog: a directory holding default-tool-presets.json")?;
    let dir = if first.is_dir() {
        first.clone()
    } else {
        first.parent().map(Path::to_path_buf).unwrap_or_default()
    };
    let f = dir.join("default-tool-presets.json");
    if f.exists() {
        Ok(f)
    } else {
        Err(format!("{}: no presets file here", f.display()))
    }
}

fn read_presets(paths: &[PathBuf]) -> Result<Vec<Value>, String> {
    let f = presets_file(paths)?;
    let doc: Value = std::fs::read(&f)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| format!("{}: not a presets document", f.display()))?;
    Ok(doc.as_array().cloned().unwrap_or_default())
}

fn presets(paths: &[PathBuf], json: bool) -> ExitCode {
    let list = match read_presets(paths) {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    if json {
        println!("{}", Value::Array(list));
        return ExitCode::SUCCESS;
    }
    for p in &list {
        let tools = match p["tools"].as_array().map(Vec::len).unwrap_or(0) {
            0 => "all tools".to_string(),
            n => stsd::plural::n(n, "tool"),
        };
        println!(
            "{:<20} {:<9} {}",
            p["id"].as_str().unwrap_or("-"),
            tools,
            p["description"].as_str().unwrap_or("")
        );
    }
    ExitCode::SUCCESS
}

/// The tools of preset `id`.
fn preset_names(paths: &[PathBuf], id: &str) -> Result<Option<Vec<String>>, String> {
    let list = read_presets(paths)?;
    let p = list.iter().find(|p| p["id"] == id).ok_or_else(|| {
        let ids: Vec<&str> = list.iter().filter_map(|p| p["id"].as_str()).collect();
        format!("no preset {id:?}; there are {}", ids.join(", "))
    })?;
    let tools: Vec<String> = p["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t.as_str().map(String::from))
        .collect();
    // A preset that lists no tool (the reference's "everything") is every tool.
    Ok((!tools.is_empty()).then_some(tools))
}

/// Every spec document of `paths` (in order), with its name, restricted to `only`.
fn specs_of(paths: &[PathBuf], only: Option<&[String]>) -> (Vec<(String, Value)>, Vec<String>) {
    let cat = stsd::store::Catalog::load(paths);
    let mut out: Vec<(String, Value)> = Vec::new();
    let mut problems: Vec<String> = cat
        .problems
        .iter()
        .map(|p| format!("{}: {}", p.path.display(), p.diagnostic))
        .collect();
    for e in &cat.entries {
        let Some(doc) = stsd::local_pass::document(&cat, e) else {
            continue;
        };
        let name = doc["name"].as_str().unwrap_or_default().to_string();
        if only.is_some_and(|o| !o.contains(&name)) {
            continue;
        }
        out.push((name, doc.clone()));
    }
    if let Some(o) = only {
        for n in o {
            if !out.iter().any(|(m, _)| m == n) {
                problems.push(format!("the preset names {n}, which no spec here holds"));
            }
        }
    }
    (out, problems)
}

fn add(
    socket: &Path,
    paths: &[PathBuf],
    preset: Option<&str>,
    approve_required: bool,
    json: bool,
) -> ExitCode {
    if paths.is_empty() {
        eprintln!("stsd: give the catalog's files or directory (with --preset: its directory)");
        return ExitCode::from(EXIT_USAGE);
    }
    let only = match preset.map(|id| preset_names(paths, id)).transpose() {
        Ok(o) => o.flatten(),
        Err(e) => return fail(e),
    };
    let (specs, problems) = specs_of(paths, only.as_deref());
    for p in &problems {
        eprintln!("stsd: {p}");
    }
    if specs.is_empty() {
        return fail("no spec to publish");
    }
    let mut results: Vec<(String, Class, String)> = Vec::new();
    for (name, doc) in &specs {
        let mut reply = client::call(socket, "stsd/tools/add", json!({"spec": doc}));
        if let Err(why) = &reply {
            if why.starts_with("cannot reach the daemon") {
                return fail(why);
            }
            if Class::of(why) == Class::NeedsApproval && answer_for(name, approve_required) {
                reply = client::call(
                    socket,
                    "stsd/tools/add",
                    json!({"spec": doc, "approve": true}),
                );
            }
        }
        let (mut class, mut why) = match reply {
            Ok(_) => (Class::Published, String::new()),
            Err(why) => (Class::of(&why), why),
        };
        // "Exists already" is served only when the daemon serves it now.
        if class == Class::AlreadyServed {
            let shown = client::call(socket, "stsd/tools/show", json!({"name": name}));
            if let Some(t) = shown.ok().filter(|t| t["state"] != "ACTIVE") {
                class = Class::Withheld;
                why = t["reason"].as_str().unwrap_or("not served").to_string();
            }
        }
        if !json {
            match class {
                Class::Published | Class::AlreadyServed => {
                    println!("  {name}: {}", class.word())
                }
                _ => println!(
                    "  {name}: not published ({}): {}",
                    class.word(),
                    advice(class, &why, doc)
                ),
            }
        }
        results.push((name.clone(), class, why));
    }
    summarise(&results, json);
    let bad = results
        .iter()
        .filter(|(_, c, _)| !matches!(c, Class::Published | Class::AlreadyServed))
        .count();
    if bad == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_INVALID)
    }
}

/// Whether the operator answers for a tool that needs approval: `--approve-required`, else
/// asked at a terminal; never without one.
fn answer_for(name: &str, approve_required: bool) -> bool {
    if approve_required {
        return true;
    }
    if !std::io::stdin().is_terminal() {
        return false;
    }
    eprint!(
        "{name} needs approval to run. Run its Local Pass now? Its file writes go to a scratch \
         copy of its workspace; its network calls are real. [y/N] "
    );
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).is_ok()
        && matches!(line.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

fn summarise(results: &[(String, Class, String)], json: bool) {
    if json {
        let list: Vec<Value> = results
            .iter()
            .map(|(n, c, why)| {
                json!({
                    "name": n,
                    "result": c.word(),
                    "why": (!why.is_empty()).then_some(why),
                })
            })
            .collect();
        println!("{}", json!({ "results": list }));
        return;
    }
    let count = |c: Class| results.iter().filter(|(_, k, _)| *k == c).count();
    let served = count(Class::Published) + count(Class::AlreadyServed);
    let mut parts = Vec::new();
    for c in [
        Class::MissingSecret,
        Class::Network,
        Class::NeedsApproval,
        Class::FailingCase,
        Class::Invalid,
        Class::Withheld,
    ] {
        let k = count(c);
        if k > 0 {
            parts.push(format!("{k} {}", c.word()));
        }
    }
    println!(
        "{} of {} served{}",
        served,
        stsd::plural::n(results.len(), "spec"),
        if parts.is_empty() {
            String::new()
        } else {
            format!("; not published: {}", parts.join(", "))
        }
    );
}
