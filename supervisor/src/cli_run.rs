//! `stsd run` and `stsd test`.

use crate::{EXIT_INVALID, EXIT_USAGE};
use serde_json::{json, Map, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use stsd::approval::terminal::Terminal;
use stsd::approval::Gate;
use stsd::call::{Door, Place, Target, ToolReply};
use stsd::exec::{job, CallTimings, CallValue, ExecOptions};
use stsd::local_pass;
use stsd::service::PublishedTool;
use stsd::store::{Catalog, Entry};
use stsd_profiles::{resolve, Config};
use stsd_protocol::envvar::EnvSource;
use stsd_protocol::{Diagnostic, ToolSpec};

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

/// `stsd run`: one call of one spec's tool through the call pipeline, reported on stdout.
pub fn run(config: &Config, a: RunArgs<'_>) -> ExitCode {
    match run_steps(config, a) {
        Ok(code) | Err(code) => code,
    }
}

/// [`run`]'s steps; `Err` is an early exit (its message already printed).
fn run_steps(config: &Config, a: RunArgs<'_>) -> Result<ExitCode, ExitCode> {
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
    let entry = choose_entry(&cat, spec_path, tool)?;
    let spec = valid_spec(entry)?;
    let resolved = resolve(spec, config).map_err(|d| input_error(&d, json_out))?;
    let args = call_arguments(spec, args_json, arg_pairs, json_out)?;
    let opts = exec_options(config).map_err(usage)?;
    let tool = PublishedTool::of_spec(spec, entry.tool_id.clone(), resolved, config);
    let (reply, ran) = call_once(config, &opts, &tool, args, answer);
    report_ran(ran.as_ref(), timings);
    Ok(report_reply(&reply, json_out))
}

/// The one spec `stsd run` calls: the file's only spec, or the one `--tool` names.
fn choose_entry<'c>(
    cat: &'c Catalog,
    spec_path: &Path,
    tool: Option<&str>,
) -> Result<&'c Entry, ExitCode> {
    if let Some(p) = cat.problems.first() {
        return Err(usage(format!("{}: {}", p.path.display(), p.diagnostic)));
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
    match candidates.as_slice() {
        [e] => Ok(*e),
        [] => Err(usage(format!(
            "no tool {:?} in {}",
            tool.unwrap_or(""),
            spec_path.display()
        ))),
        _ => Err(usage(format!(
            "{} holds {} specs; choose one with --tool NAME",
            spec_path.display(),
            candidates.len()
        ))),
    }
}

/// The entry's spec when it is valid; else its errors, on stderr.
fn valid_spec(entry: &Entry) -> Result<&ToolSpec, ExitCode> {
    let Some(spec) = entry
        .validated
        .spec
        .as_ref()
        .filter(|_| entry.validated.is_valid())
    else {
        for d in entry.validated.errors() {
            eprintln!("stsd: {d}");
        }
        return Err(ExitCode::from(EXIT_USAGE));
    };
    Ok(spec)
}

/// The call's arguments: the `--args-json` object first, then each `--arg` on top.
fn call_arguments(
    spec: &ToolSpec,
    args_json: Option<&str>,
    arg_pairs: &[String],
    json_out: bool,
) -> Result<Map<String, Value>, ExitCode> {
    let mut args = Map::new();
    if let Some(text) = args_json {
        args = args_object(text).map_err(usage)?;
    }
    for pair in arg_pairs {
        let (k, v) = job::parse_text_argument(spec, pair).map_err(|d| input_error(&d, json_out))?;
        args.insert(k, v);
    }
    Ok(args)
}

/// The one pipeline (`stsd::call`), at a door of its own: a terminal to ask, one fresh
/// worker, the configured base path, the audit log the config names. Returns the reply and
/// what the worker's run reported (timings, whether console lines were dropped).
fn call_once(
    config: &Config,
    opts: &ExecOptions,
    tool: &PublishedTool,
    args: Map<String, Value>,
    answer: Option<bool>,
) -> (ToolReply, Option<(CallTimings, bool)>) {
    let gate = Gate::new(config.approval.clone());
    let terminal = Terminal {
        answer,
        command: "stsd run",
    };
    let mut door = Door::one_shot(
        std::sync::Arc::new(config.clone()),
        &gate,
        opts,
        Some(&terminal),
        "cli",
        Place::Configured,
    );
    door.console = Some(Box::new(|level, line| {
        let _ = writeln!(std::io::stderr(), "[{}] {line}", level.as_str());
    }));
    let reply = stsd::call::run_blocking(&mut door, Target::Own(tool), args);
    (reply, door.ran.take())
}

/// On stderr: dropped console lines, and with `--timings` the worker's timings.
fn report_ran(ran: Option<&(CallTimings, bool)>, timings: bool) {
    if let Some((t, truncated)) = ran {
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
}

/// Prints the reply (stdout on success, the error as JSON or on stderr); its exit code.
fn report_reply(reply: &ToolReply, json_out: bool) -> ExitCode {
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

/// `stsd test`: loads the specs, tests each one, prints the summary, writes the passes.
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
    let mut cat = load_for_test(paths);
    let problems = report_file_problems(&cat, json_out);
    let env = stsd::secrets::spec_env(config);
    let place = pass_place(&cat, config, in_place);
    let tester = Tester {
        config,
        env: &env,
        opts: &opts,
        place,
        terminal: &terminal,
        json_out,
        only_case,
    };
    let tally = tester.test_all(&cat);
    print_summary(&tally, problems, json_out);
    if write && !tally.passed.is_empty() && only_case.is_none() {
        if let Err(code) = write_passes(&mut cat, &tally.passed, json_out) {
            return code;
        }
    }
    if tally.failed_specs == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_INVALID)
    }
}

/// The specs under `paths`, or the bundled examples when none are given.
fn load_for_test(paths: &[PathBuf]) -> Catalog {
    let extra = if paths.is_empty() {
        stsd::bundled::examples().into_iter().collect()
    } else {
        Vec::new()
    };
    Catalog::load_with(paths, extra)
}

/// Files that hold no readable spec, each a FAIL line (unless `--json`); their count.
fn report_file_problems(cat: &Catalog, json_out: bool) -> usize {
    let mut problems = 0;
    for p in &cat.problems {
        problems += 1;
        if !json_out {
            println!("FAIL {}: {}", p.path.display(), p.diagnostic);
        }
    }
    problems
}

/// Where file tools run: a scratch copy, or (`--in-place`, after a warning) the base path.
fn pass_place(cat: &Catalog, config: &Config, in_place: bool) -> local_pass::PassPlace {
    if in_place {
        warn_in_place(cat, config);
        local_pass::PassPlace::InPlace
    } else {
        local_pass::PassPlace::Scratch
    }
}

/// What `stsd test` found: every result, the specs that passed, how many failed.
struct Tally {
    results: Vec<local_pass::CaseResult>,
    /// Indexes into the catalog's entries.
    passed: Vec<usize>,
    /// Failed specs, unreadable files included.
    failed_specs: usize,
}

/// How `stsd test` runs each spec's Local Pass and cases.
struct Tester<'a> {
    config: &'a Config,
    env: &'a (dyn EnvSource + Sync),
    opts: &'a ExecOptions,
    place: local_pass::PassPlace,
    terminal: &'a Terminal,
    json_out: bool,
    only_case: Option<usize>,
}

impl Tester<'_> {
    /// Tests every entry of the catalog in turn.
    fn test_all(&self, cat: &Catalog) -> Tally {
        let mut tally = Tally {
            results: Vec::new(),
            passed: Vec::new(),
            failed_specs: cat.problems.len(),
        };
        for (i, e) in cat.entries.iter().enumerate() {
            if self.test_entry(cat, e, &mut tally.results) {
                tally.passed.push(i);
            } else {
                tally.failed_specs += 1;
            }
        }
        tally
    }

    /// One spec: its Local Pass (unless `--case`), then its test cases; whether all passed.
    fn test_entry(
        &self,
        cat: &Catalog,
        e: &Entry,
        results: &mut Vec<local_pass::CaseResult>,
    ) -> bool {
        let mut ok = true;
        let name = e
            .validated
            .spec
            .as_ref()
            .map(|s| s.name.clone())
            .unwrap_or_default();
        if self.only_case.is_none() {
            let r = self.local_pass(cat, e, &name);
            ok &= r.success;
            results.push(r);
        }
        let cases_ok = self.test_cases(cat, e, &name, results);
        ok && cases_ok
    }

    /// The entry's Local Pass with its testValues, printed (unless `--json`) as a result.
    fn local_pass(&self, cat: &Catalog, e: &Entry, name: &str) -> local_pass::CaseResult {
        let report = local_pass::run_entry(
            cat,
            e,
            self.config,
            self.env,
            self.opts,
            self.place,
            Some(self.terminal),
        );
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
        if !self.json_out {
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
        local_pass::CaseResult {
            tool: name.to_string(),
            name: "local pass (testValues)".into(),
            success,
            result,
            duration: ms,
            reason,
        }
    }

    /// The entry's `testCases` (only case N with `--case N`), each printed (unless
    /// `--json`) and added to `results`; whether all passed and the list could be read.
    fn test_cases(
        &self,
        cat: &Catalog,
        e: &Entry,
        name: &str,
        results: &mut Vec<local_pass::CaseResult>,
    ) -> bool {
        let cases = match (&e.validated.spec, local_pass::document(cat, e)) {
            (Some(_), Some(doc)) => local_pass::test_cases(doc),
            _ => Ok(Vec::new()),
        };
        let mut ok = true;
        match (cases, &e.validated.spec) {
            (Err(d), _) => {
                ok = false;
                if !self.json_out {
                    println!("FAIL {name:<28} testCases: {d}");
                }
            }
            (Ok(cases), Some(spec)) => {
                for (n, case) in cases.iter().enumerate() {
                    if self.only_case.is_some_and(|k| k != n) {
                        continue;
                    }
                    let r = self.test_case(spec, n, case);
                    ok &= r.success;
                    results.push(r);
                }
            }
            _ => {}
        }
        ok
    }

    /// Test case `n` of `spec`, printed unless `--json`.
    fn test_case(
        &self,
        spec: &ToolSpec,
        n: usize,
        case: &local_pass::TestCase,
    ) -> local_pass::CaseResult {
        let r = local_pass::run_case(
            spec,
            self.config,
            self.env,
            self.opts,
            case,
            self.place,
            Some(self.terminal),
        );
        if !self.json_out {
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
        r
    }
}

/// The summary: seed 004's JSON with `--json`, else one line of counts.
fn print_summary(tally: &Tally, problems: usize, json_out: bool) {
    let results = &tally.results;
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
        println!(
            "\n{} passed, {} failed",
            stsd::plural::n(tally.passed.len(), "spec"),
            tally.failed_specs
        );
    }
}

/// `--write`: `draft: false` into the files of the specs that passed.
fn write_passes(cat: &mut Catalog, passed: &[usize], json_out: bool) -> Result<(), ExitCode> {
    match local_pass::write_passes(cat, passed) {
        Ok(files) => {
            if !json_out {
                println!(
                    "wrote draft:false for {} in {}",
                    stsd::plural::n(passed.len(), "spec"),
                    stsd::plural::n(files, "file")
                );
            }
            Ok(())
        }
        Err(e) => {
            eprintln!("stsd: cannot write: {e}");
            Err(ExitCode::from(EXIT_INVALID))
        }
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
