//! `stsd run` and `stsd test`.

use crate::{EXIT_INVALID, EXIT_USAGE};
use serde_json::{json, Map, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use stsd::approval::terminal::Terminal;
use stsd::approval::Gate;
use stsd::call::{Door, Place, Target};
use stsd::exec::{job, CallValue, ExecOptions};
use stsd::local_pass;
use stsd::service::PublishedTool;
use stsd::store::Catalog;
use stsd_profiles::{resolve, Config};
use stsd_protocol::Diagnostic;

fn exec_options(config: &Config) -> Result<ExecOptions, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the stsd binary: {e}"))?;
    // One call (or one tool's tests): the zygote's huge pages would cost more than they save.
    let mut config = config.clone();
    config.worker.huge_code = false;
    ExecOptions::new(exe, &config)
}

fn usage(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("stsd: {msg}");
    ExitCode::from(EXIT_USAGE)
}

fn input_error(d: &Diagnostic, json_out: bool) -> ExitCode {
    if json_out {
        println!("{}", json!({"ok": false, "error": d}));
    } else {
        eprintln!("stsd: {d}");
    }
    ExitCode::from(EXIT_USAGE)
}

/// What `stsd run` was asked.
pub struct RunArgs<'a> {
    pub spec_path: &'a Path,
    pub tool: Option<&'a str>,
    pub arg_pairs: &'a [String],
    pub args_json: Option<&'a str>,
    pub json_out: bool,
    pub timings: bool,
    /// --approve (true) or --deny (false), for a tool that needs approval.
    pub answer: Option<bool>,
}

/// `--args-json`: a JSON object, given inline, as `@FILE`, or as `@-` (stdin) for arguments
/// too large for a command line. Shared by `stsd run` and `stsd call`.
pub fn args_object(text: &str) -> Result<Map<String, Value>, String> {
    let owned;
    let json = match text.strip_prefix('@') {
        Some(src) => {
            let read = if src == "-" {
                let mut s = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).map(|_| s)
            } else {
                std::fs::read_to_string(src)
            };
            owned = read.map_err(|e| format!("--args-json {text}: {e}"))?;
            owned.as_str()
        }
        None => text,
    };
    match serde_json::from_str::<Value>(json) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err("--args-json must be a JSON object".into()),
        Err(e) => Err(format!("--args-json is not JSON: {e}")),
    }
}

/// A failed call as `stsd run` and `stsd call` report it: one JSON object with `--json`,
/// else `stsd: CODE: message` on stderr.
pub fn print_failure(code: &str, message: &str, json_out: bool) {
    if json_out {
        println!(
            "{}",
            json!({"ok": false, "error": {"code": code, "message": message}})
        );
    } else {
        eprintln!("stsd: {code}: {message}");
    }
}

pub fn run(config: &Config, a: RunArgs<'_>) -> ExitCode {
    let RunArgs {
        spec_path,
        tool,
        arg_pairs,
        args_json,
        json_out,
        timings,
        answer,
    } = a;
    let cat = Catalog::load(&[spec_path.to_path_buf()]);
    if let Some(p) = cat.problems.first() {
        return usage(format!("{}: {}", p.path.display(), p.diagnostic));
    }
    let candidates: Vec<_> = cat
        .entries
        .iter()
        .filter(|e| match (tool, &e.validated.spec) {
            (Some(t), Some(s)) => s.name == t,
            (None, _) => true,
            _ => false,
        })
        .collect();
    let entry = match candidates.as_slice() {
        [e] => *e,
        [] => {
            return usage(format!(
                "no tool {:?} in {}",
                tool.unwrap_or(""),
                spec_path.display()
            ))
        }
        _ => {
            return usage(format!(
                "{} holds {} specs; choose one with --tool NAME",
                spec_path.display(),
                candidates.len()
            ))
        }
    };
    let Some(spec) = entry
        .validated
        .spec
        .as_ref()
        .filter(|_| entry.validated.is_valid())
    else {
        for d in entry.validated.errors() {
            eprintln!("stsd: {d}");
        }
        return ExitCode::from(EXIT_USAGE);
    };
    let resolved = match resolve(spec, config) {
        Ok(r) => r,
        Err(d) => return input_error(&d, json_out),
    };
    // Arguments: the JSON object first, then each --arg on top.
    let mut args = Map::new();
    if let Some(text) = args_json {
        match args_object(text) {
            Ok(m) => args = m,
            Err(e) => return usage(e),
        }
    }
    for pair in arg_pairs {
        match job::parse_text_argument(spec, pair) {
            Ok((k, v)) => {
                args.insert(k, v);
            }
            Err(d) => return input_error(&d, json_out),
        }
    }
    let opts = match exec_options(config) {
        Ok(o) => o,
        Err(e) => return usage(e),
    };
    // The one pipeline (`stsd::call`), at a door of its own: a terminal to ask, one fresh
    // worker, the configured base path, the audit log the config names.
    let tool = PublishedTool::of_spec(spec, entry.tool_id.clone(), resolved, config);
    let gate = Gate::new(config.approval.clone());
    let terminal = Terminal {
        answer,
        command: "stsd run",
    };
    let mut door = Door::one_shot(
        std::sync::Arc::new(config.clone()),
        &gate,
        &opts,
        Some(&terminal),
        "cli",
        Place::Configured,
    );
    door.console = Some(Box::new(|level, line| {
        let _ = writeln!(std::io::stderr(), "[{}] {line}", level.as_str());
    }));
    let reply = stsd::call::run_blocking(&mut door, Target::Own(&tool), args);
    if let Some((t, truncated)) = &door.ran {
        if *truncated {
            eprintln!("[stsd] console output went over its caps; later lines were dropped");
        }
        if timings {
            eprintln!(
                "[stsd] timings: spawn {} us, profile {} us, context {} us, body {} us, total {} us; worker peak RSS {} KiB; page faults: profile {}, context {}, body {}; records from the worker {}",
                t.spawn_us, t.worker.profile_us, t.worker.context_us, t.worker.run_us, t.total_us, t.worker.max_rss_kib,
                t.worker.faults[0], t.worker.faults[1], t.worker.faults[2], t.records
            );
        }
    }
    if !reply.is_error {
        if json_out {
            println!("{}", json_reply(reply.raw.as_deref()));
        } else {
            println!("{}", reply.text);
        }
        return ExitCode::SUCCESS;
    }
    let code = reply.code.map(|c| c.as_str()).unwrap_or("ERROR");
    if json_out {
        println!(
            "{}",
            json!({"ok": false, "error": {"code": code, "message": reply.message(),
                                          "pointer": reply.pointer, "stack": reply.stack}})
        );
    } else {
        eprintln!("stsd: {}", reply.text);
        if let Some(s) = &reply.stack {
            eprintln!("{s}");
        }
    }
    // Arguments the tool's params refuse are a usage error, as before any worker ran.
    ExitCode::from(if reply.code == Some(stsd_protocol::Code::InvalidInput) {
        EXIT_USAGE
    } else {
        EXIT_INVALID
    })
}

/// `stsd test`: each spec's Local Pass, then its `testCases`; a spec passes when all do.
/// `--case N` runs only case N of each spec; `--json` prints seed 004's shape.
/// What `stsd test` was asked.
pub struct TestArgs {
    pub write: bool,
    pub json_out: bool,
    pub only_case: Option<usize>,
    pub in_place: bool,
    /// --approve (true) or --deny (false), for the tools that need approval.
    pub answer: Option<bool>,
}

pub fn test(config: &Config, paths: &[PathBuf], a: TestArgs) -> ExitCode {
    let TestArgs {
        write,
        json_out,
        only_case,
        in_place,
        answer,
    } = a;
    let terminal = Terminal {
        answer,
        command: "stsd test",
    };
    if let Some(missing) = paths.iter().find(|p| !p.exists()) {
        return usage(format!("no such file or directory: {}", missing.display()));
    }
    let opts = match exec_options(config) {
        Ok(o) => o,
        Err(e) => return usage(e),
    };
    let extra = if paths.is_empty() {
        stsd::bundled::examples().into_iter().collect()
    } else {
        Vec::new()
    };
    let mut cat = Catalog::load_with(paths, extra);
    let mut results: Vec<local_pass::CaseResult> = Vec::new();
    let mut problems = 0;
    for p in &cat.problems {
        problems += 1;
        if !json_out {
            println!("FAIL {}: {}", p.path.display(), p.diagnostic);
        }
    }
    let env = config.baseline.env();
    let place = if in_place {
        warn_in_place(&cat, config);
        local_pass::PassPlace::InPlace
    } else {
        local_pass::PassPlace::Scratch
    };
    let mut passed = Vec::new();
    let mut failed_specs = cat.problems.len();
    for (i, e) in cat.entries.iter().enumerate() {
        let mut ok = true;
        let name = e
            .validated
            .spec
            .as_ref()
            .map(|s| s.name.clone())
            .unwrap_or_default();
        if only_case.is_none() {
            let report =
                local_pass::run_entry(&cat, e, config, &env, &opts, place, Some(&terminal));
            let ms = report.elapsed.as_millis() as u64;
            let (success, result, reason) = match &report.outcome {
                Ok(v) => (
                    true,
                    json!({"success": true, "output": render_value(v), "executionTime": ms}),
                    None,
                ),
                Err(d) => (
                    false,
                    json!({"success": false, "error": d, "executionTime": ms}),
                    Some(d.to_string()),
                ),
            };
            if !json_out {
                println!(
                    "{} {:<28} {ms:>5} ms  {}",
                    if success { "PASS" } else { "FAIL" },
                    report.name,
                    report.location
                );
                if let Some(r) = &reason {
                    println!("     {r}");
                }
            }
            ok &= success;
            results.push(local_pass::CaseResult {
                tool: name.clone(),
                name: "local pass (testValues)".into(),
                success,
                result,
                duration: ms,
                reason,
            });
        }
        let cases = match (&e.validated.spec, local_pass::document(&cat, e)) {
            (Some(_), Some(doc)) => local_pass::test_cases(doc),
            _ => Ok(Vec::new()),
        };
        match (cases, &e.validated.spec) {
            (Err(d), _) => {
                ok = false;
                if !json_out {
                    println!("FAIL {name:<28} testCases: {d}");
                }
            }
            (Ok(cases), Some(spec)) => {
                for (n, case) in cases.iter().enumerate() {
                    if only_case.is_some_and(|k| k != n) {
                        continue;
                    }
                    let r = local_pass::run_case(
                        spec,
                        config,
                        &env,
                        &opts,
                        case,
                        place,
                        Some(&terminal),
                    );
                    if !json_out {
                        println!(
                            "{}   case {n} {:<22} {:>5} ms",
                            if r.success { "PASS" } else { "FAIL" },
                            r.name,
                            r.duration
                        );
                        if let Some(why) = &r.reason {
                            println!("     {why}");
                        }
                    }
                    ok &= r.success;
                    results.push(r);
                }
            }
            _ => {}
        }
        if ok {
            passed.push(i);
        } else {
            failed_specs += 1;
        }
    }
    let total = results.len();
    let ok_count = results.iter().filter(|r| r.success).count();
    if json_out {
        let rate = if total == 0 {
            100.0
        } else {
            (ok_count as f64) * 100.0 / total as f64
        };
        println!(
            "{}",
            json!({
                "results": results,
                "summary": {"total": total, "passed": ok_count, "failed": total - ok_count,
                            "successRate": (rate * 100.0).round() / 100.0},
                "fileProblems": problems,
            })
        );
    } else {
        println!("\n{} specs passed, {} failed", passed.len(), failed_specs);
    }
    if write && !passed.is_empty() && only_case.is_none() {
        match local_pass::write_passes(&mut cat, &passed) {
            Ok(files) => {
                if !json_out {
                    println!(
                        "wrote draft:false for {} specs in {files} files",
                        passed.len()
                    );
                }
            }
            Err(e) => {
                eprintln!("stsd: cannot write: {e}");
                return ExitCode::from(EXIT_INVALID);
            }
        }
    }
    if failed_specs == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_INVALID)
    }
}

/// `--in-place`: says, before anything runs, which specs will write where.
fn warn_in_place(cat: &Catalog, config: &Config) {
    let mut writers = Vec::new();
    let mut paths = std::collections::BTreeSet::new();
    for spec in cat.entries.iter().filter_map(|e| e.validated.spec.as_ref()) {
        let Ok(r) = resolve(spec, config) else {
            continue;
        };
        let safety = &r.tool_safety.capabilities;
        if safety.file_read || safety.file_write {
            paths.insert(r.fs_base_path.display().to_string());
        }
        if safety.file_write {
            writers.push(spec.name.as_str());
        }
    }
    eprintln!(
        "stsd: --in-place: file tools run against {} itself, not a scratch copy; {} can create, overwrite, move or delete files there: {}",
        if paths.is_empty() { "their base path".to_string() } else { paths.into_iter().collect::<Vec<_>>().join(", ") },
        if writers.is_empty() { "no spec here".to_string() } else { format!("{} specs with write access", writers.len()) },
        if writers.is_empty() { "-".to_string() } else { writers.join(", ") }
    );
}

/// A call's value as JSON for reports.
fn render_value(v: &CallValue) -> Value {
    v.to_value()
}

/// `stsd run --json`'s success line. The result goes out as the tool's own JSON text (masked)
/// once it is known to be JSON, so a lone surrogate stays the `\ud83d` escape
/// JSON.stringify wrote (a serde_json value cannot hold one).
fn json_reply(raw: Option<&str>) -> String {
    if let Some(t) = raw {
        if stsd_protocol::json::parse_js_json(t).is_ok() {
            return format!("{{\"ok\":true,\"result\":{}}}", t.trim());
        }
    }
    json!({"ok": true, "result": Value::Null}).to_string()
}
